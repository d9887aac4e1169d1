"""Error bodies name a task only to a caller who may read it (issue 27, item 9), against the real
server (`manage.py serve`) on the real SQLite database, each person logged in through the
admin's login form as a browser does.

An error's `task` member is the task's whole public view (title, payload, result, holder...).
A caller who may not read tasks (a session without board.view_task), or a key whose queue scope
does not cover the task, gets the error without it: the code and message say what happened,
nothing shows what the task holds. Without it the refusal is the same refusal, and the
database is untouched.
"""
from __future__ import annotations

import pytest

from board import agent_keys
from tests.live_server import api_call, board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark
from tests.test_access_api import Browser, person

pytestmark = sqlite_db_mark()

SECRET = {"secret": "only readers see this"}


@pytest.fixture
def board(board_server):  # noqa: F811
    """Task 'held', RUNNING under an agent's lease, with a payload to keep private; task
    'foreign' in a queue a scoped key does not cover."""
    _, key = agent_keys.create_key("agent-a")
    for body in ({"id": "held", "title": "private work", "payload": SECRET},
                 {"id": "foreign", "title": "elsewhere", "queue": "secret", "payload": SECRET}):
        assert api_call(board_server, "POST", "/api/tasks", key, body)[0] == 201
    assert api_call(board_server, "POST", "/api/tasks/held/claim", key, {"ttl_seconds": 600})[0] == 200
    return board_server


def refused_without_task(answer, status: int, code: str) -> dict:
    got_status, body = answer
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), answer
    assert (got_status, body["error"]["code"]) == (status, code), answer
    assert "task" not in body["error"], body
    assert "only readers see this" not in str(body)
    return body["error"]


def test_an_intervene_only_user_gets_the_refusal_without_the_task(board):
    browser = Browser(board).login(person("fixer", ["board.intervene"]))
    before = db_state()
    assert browser.api("GET", "/tasks/held")[0] == 403
    refused_without_task(browser.api("POST", "/tasks/held/admit", {}), 409, "invalid_transition")
    refused_without_task(browser.api("POST", "/tasks/held/force-pause", {"version": 99}), 409, "version_conflict")
    refused_without_task(browser.api("POST", "/tasks/held/cancel", {"version": 99}), 409, "version_conflict")
    assert db_state() == before


def test_an_add_only_user_gets_duplicate_id_without_the_task(board):
    browser = Browser(board).login(person("adder", ["board.add_task"]))
    before = db_state()
    refused_without_task(browser.api("POST", "/tasks", {"id": "held", "title": "mine now"}), 409, "duplicate_id")
    # Sending the very body of the existing task does not show it either.
    refused_without_task(browser.api("POST", "/tasks", {"id": "held", "title": "private work", "payload": SECRET}),
                         409, "duplicate_id")
    assert db_state() == before


def test_a_reader_still_gets_the_task_in_the_error(board):
    browser = Browser(board).login(person("lead", ["board.view_task", "board.intervene", "board.add_task"]))
    status, body = browser.api("POST", "/tasks/held/admit", {})
    assert (status, body["error"]["task"]["payload"]) == (409, SECRET), body
    status, body = browser.api("POST", "/tasks", {"id": "held", "title": "other"})
    assert (status, body["error"]["code"], body["error"]["task"]["id"]) == (409, "duplicate_id", "held")


def test_a_scoped_key_gets_duplicate_id_without_a_foreign_task(board):
    _, key = agent_keys.create_key("ci-agent", queues="ci-*")
    before = db_state()
    refused_without_task(api_call(board, "POST", "/api/tasks", key, {"id": "foreign", "title": "x", "queue": "ci-a"}),
                         409, "duplicate_id")
    assert db_state() == before
    _, plain = agent_keys.create_key("agent-b")
    status, body = api_call(board, "POST", "/api/tasks", plain, {"id": "foreign", "title": "x"})
    assert (status, body["error"]["task"]["id"]) == (409, "foreign")
