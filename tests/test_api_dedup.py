"""Dedup keys over the API (issue 29, item 5): a create whose `dedup_key` a live task holds
answers that task (200, `"deduplicated": true`) and creates nothing; in a batch, the batch's
dependencies on it depend on that task. What every store does is tests/test_contract.py's
dedup section; this is the HTTP side: status codes, the answer's shape, scopes, bad input."""
from __future__ import annotations

import pytest

from board import agent_keys
from board.engine import transitions
from board.models import Task
from tests.support import db_state, sqlite_db_mark
from tests.test_api import (  # noqa: F401
    TASK_FIELDS, assert_error, claim, current, get, http, operator, post, used_key,
)

pytestmark = sqlite_db_mark()


def test_a_second_create_with_a_live_key_answers_200_with_the_task_and_creates_nothing(http):
    agent = used_key("agent-d")
    first = post(http, "/tasks", {"title": "nightly report", "dedup_key": "nightly:2026-12-04"}, agent)
    assert first.status_code == 201
    made = first.json()
    assert set(made) == TASK_FIELDS | {"deduplicated"}
    assert (made["deduplicated"], made["dedup_key"]) == (False, "nightly:2026-12-04")
    before = db_state()
    again = post(http, "/tasks", {"title": "nightly report, again", "dedup_key": "nightly:2026-12-04"}, agent)
    assert again.status_code == 200
    assert again.json() == {**made, "deduplicated": True}
    assert db_state() == before
    assert current(http, agent, made["id"])["dedup_key"] == "nightly:2026-12-04"


def test_a_finished_task_frees_its_key(http):
    agent = used_key("agent-f")
    made = post(http, "/tasks", {"title": "once", "dedup_key": "k"}, agent).json()
    _, token = claim(http, agent, made["id"])
    assert post(http, f"/tasks/{made['id']}/complete", {"token": token, "result": {}}, agent).status_code == 200
    fresh = post(http, "/tasks", {"title": "once more", "dedup_key": "k"}, agent)
    assert fresh.status_code == 201
    assert fresh.json()["id"] != made["id"] and fresh.json()["deduplicated"] is False


def test_a_batch_answers_201_with_the_stand_in_marked_and_dependencies_pointing_at_it(http):
    agent = used_key("agent-b")
    live = post(http, "/tasks", {"id": "build-1", "title": "build", "dedup_key": "build:abc"}, agent).json()
    response = post(http, "/tasks", [{"id": "build-2", "title": "build", "dedup_key": "build:abc"},
                                     {"id": "test-2", "title": "test", "deps": ["build-2"]}], agent)
    assert response.status_code == 201
    items = response.json()["items"]
    assert [(i["id"], i["deduplicated"], i["deps"]) for i in items] == [
        ("build-1", True, []), ("test-2", False, ["build-1"])]
    assert items[0] == {**live, "deduplicated": True}
    assert current(http, agent, "test-2")["deps"] == ["build-1"]
    assert not Task.objects.filter(pk="build-2").exists()
    every = post(http, "/tasks", [{"title": "b", "dedup_key": "build:abc"}], agent)
    assert every.status_code == 200 and [i["id"] for i in every.json()["items"]] == ["build-1"]


def test_an_identical_retry_of_a_keyed_create_is_the_same_task_not_deduplicated(http):
    agent = used_key("agent-r")
    body = {"id": "r1", "title": "retried", "dedup_key": "r"}
    assert post(http, "/tasks", body, agent).status_code == 201
    # The same id is found first here: the live task holding the key is this very task.
    again = post(http, "/tasks", body, agent)
    assert again.status_code == 200 and again.json()["id"] == "r1"


def test_a_scoped_key_is_not_shown_a_task_of_another_queue_holding_the_key(http, operator):
    post(http, "/tasks", {"id": "secret", "title": "hidden", "queue": "billing", "dedup_key": "shared"}, operator)
    _, scoped = agent_keys.create_key("ci-agent", queues="ci-*")
    before = db_state()
    error = assert_error(post(http, "/tasks", {"title": "mine", "queue": "ci-web", "dedup_key": "shared"}, scoped),
                         409, "duplicate_id")
    assert "task" not in error and "secret" not in error["message"]
    assert db_state() == before


@pytest.mark.parametrize("key", ["", "x" * 201, 5, "line\nbreak"])
def test_a_bad_dedup_key_is_422_and_writes_nothing(http, key):
    agent = used_key("agent-bad")
    before = db_state()
    assert_error(post(http, "/tasks", {"title": "t", "dedup_key": key}, agent), 422, "validation_error")
    assert db_state() == before


def test_one_key_twice_in_a_batch_is_422_and_writes_nothing(http):
    agent = used_key("agent-twice")
    before = db_state()
    error = assert_error(post(http, "/tasks", [{"title": "a", "dedup_key": "same"},
                                               {"title": "b", "dedup_key": "same"}], agent), 422, "validation_error")
    assert "twice" in error["message"]
    assert db_state() == before


def test_requeue_of_a_failed_task_whose_key_is_taken_is_409_and_names_the_holder(http, operator):
    agent = used_key("agent-q")
    old = post(http, "/tasks", {"id": "old", "title": "o", "dedup_key": "report", "max_retries": 0}, agent).json()
    _, token = claim(http, agent, old["id"])
    post(http, "/tasks/old/fail", {"token": token, "error": "boom", "retryable": False}, agent)
    post(http, "/tasks", {"id": "new", "title": "n", "dedup_key": "report"}, agent)
    before = db_state()
    error = assert_error(post(http, "/tasks/old/requeue", {"reset_attempts": True}, operator),
                         409, "invalid_transition")
    assert error["details"]["held_by"] == "new"
    assert db_state() == before
    transitions.cancel("new", actor="op")
    assert post(http, "/tasks/old/requeue", {"reset_attempts": True}, operator).json()["stage"] == "QUEUED"
