"""Run again as new (issue 33, item 5) through the whole HTTP stack on SQLite:
POST /api/tasks/{id}/replay, the copy's `replay_of`, and the search that finds a task's replays.
The engine's rules on every store are in the contract suite (tests/test_contract.py, "run again
as new"); the task page's button in tests/test_browser_task_page.py."""
from __future__ import annotations

import pytest

from tests.support import db_state, sqlite_db_mark
from tests.test_api import agent, assert_error, create, get, http, operator, post  # noqa: F401 (fixtures)

pytestmark = sqlite_db_mark()


def failed(http, key, task_id: str) -> None:  # noqa: F811
    held = post(http, f"/tasks/{task_id}/claim", {"ttl_seconds": 60}, key).json()
    response = post(http, f"/tasks/{task_id}/fail", {"token": held["lease"]["token"], "error": "boom",
                                                     "retryable": False}, key)
    assert response.json()["stage"] == "FAILED", response.content


def test_an_operator_runs_a_failed_task_again_as_new(http, agent, operator):  # noqa: F811
    create(http, agent, id="orig", payload={"url": "x"}, tags=["nightly"], max_retries=0)
    failed(http, agent, "orig")
    response = post(http, "/tasks/orig/replay", {"id": "orig-2"}, operator)
    assert response.status_code == 201, response.content
    copy = response.json()
    assert (copy["id"], copy["stage"], copy["replay_of"], copy["payload"], copy["tags"]) == (
        "orig-2", "QUEUED", "orig", {"url": "x"}, ["nightly"])
    assert get(http, "/tasks/orig", agent).json()["replay_of"] is None
    edited = post(http, "/tasks/orig/replay", {"payload": {"url": "y"}}, operator).json()
    assert (edited["payload"], edited["replay_of"]) == ({"url": "y"}, "orig")
    listed = get(http, "/tasks?search=replay_of:orig", agent).json()["items"]
    assert sorted(t["id"] for t in listed) == sorted(["orig-2", edited["id"]])
    events = get(http, "/tasks/orig-2/events", agent).json()["items"]
    assert [(e["verb"], e["actor"], e["detail"]) for e in events] == [("create", "operator-1", {"replay_of": "orig"})]


@pytest.mark.parametrize("body, status, code", [
    ({"payload": {"deep": [[[[]]]]}, "bogus": 1}, 422, "validation_error"),
    ({"id": "no spaces"}, 422, "validation_error"),
    ({"payload": "x" * 300_000}, 413, "too_large"),
    ({"id": "other"}, 409, "duplicate_id"),
])
def test_a_bad_replay_is_refused_and_writes_nothing(http, agent, operator, body, status, code):  # noqa: F811
    create(http, agent, id="orig", max_retries=0)
    create(http, agent, id="other")
    failed(http, agent, "orig")
    before = db_state()
    assert_error(post(http, "/tasks/orig/replay", body, operator), status, code)
    assert db_state() == before


def test_who_may_run_a_task_again_and_which_tasks(http, agent, operator):  # noqa: F811
    create(http, agent, id="queued")
    before = db_state()
    assert_error(post(http, "/tasks/queued/replay", {}, agent), 403, "forbidden")  # operators only
    assert_error(post(http, "/tasks/queued/replay", {}, operator), 409, "invalid_transition")
    assert_error(post(http, "/tasks/nope/replay", {}, operator), 404, "not_found")
    assert db_state() == before
