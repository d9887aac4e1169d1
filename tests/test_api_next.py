"""Complete and claim in one request (issue 34, item 1): POST /api/tasks/{id}/complete, /fail
and /release with `next` answer the task as they always did plus `next`, the next {task,
lease} or null. Through the whole HTTP stack on SQLite; the engine's rules on every store are in
the contract suite (tests/test_contract.py, "several moves in one call")."""
from __future__ import annotations

import threading

import pytest
from django.db import connections

from board.engine import selectors, transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import db_state, sqlite_db_mark
from tests.test_api import TASK_FIELDS, agent, agent_b, assert_error, create, http, post  # noqa: F401 (fixtures)

pytestmark = sqlite_db_mark()

CLAIM_FIELDS = {"task", "lease"}
LEASE_FIELDS = {"token", "fence", "expires_at"}


def claim_next(http, key, **fields) -> dict:  # noqa: F811
    response = post(http, "/claim", {"ttl_seconds": 60, **fields}, key)
    assert response.status_code == 200, response.content
    return response.json()


def test_complete_with_next_answers_the_task_and_the_next_lease(http, agent):  # noqa: F811
    create(http, agent, id="one", priority=5)
    create(http, agent, id="two")
    held = claim_next(http, agent)
    assert held["task"]["id"] == "one"
    response = post(http, "/tasks/one/complete",
                    {"token": held["lease"]["token"], "result": {"ok": 1}, "next": {"ttl_seconds": 30}}, agent)
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == TASK_FIELDS | {"next"}
    assert (body["id"], body["stage"], body["result"]) == ("one", "COMPLETED", {"ok": 1})
    nxt = body["next"]
    assert set(nxt) == CLAIM_FIELDS and set(nxt["lease"]) == LEASE_FIELDS
    assert (nxt["task"]["id"], nxt["task"]["stage"], nxt["task"]["owner"], nxt["lease"]["fence"]) == (
        "two", "RUNNING", "agent-a", 1)
    # The lease is the holder's: it renews and completes with it.
    renewed = post(http, "/tasks/two/renew", {"token": nxt["lease"]["token"], "ttl_seconds": 60}, agent)
    assert renewed.status_code == 200, renewed.content
    # Nothing ready: next is null, and the completion stands.
    response = post(http, "/tasks/two/complete", {"token": nxt["lease"]["token"], "result": {}, "next": {"ttl_seconds": 30}},
                    agent)
    assert response.status_code == 200, response.content
    assert (response.json()["stage"], response.json()["next"]) == ("COMPLETED", None)
    # Without next the answer is what it always was (no `next` field).
    create(http, agent, id="three")
    held = claim_next(http, agent)
    plain = post(http, "/tasks/three/complete", {"token": held["lease"]["token"], "result": {}}, agent)
    assert set(plain.json()) == TASK_FIELDS


def test_a_refused_completion_claims_nothing(http, agent, agent_b):  # noqa: F811
    create(http, agent, id="held")
    create(http, agent, id="ready")
    held = claim_next(http, agent)
    before = db_state()
    stale = post(http, "/tasks/held/complete", {"token": "stale", "result": {}, "next": {"ttl_seconds": 30}}, agent)
    assert_error(stale, 409, "lease_lost")
    other = post(http, "/tasks/held/complete",
                 {"token": held["lease"]["token"], "result": {}, "next": {"ttl_seconds": 30}}, agent_b)
    assert_error(other, 403, "forbidden")
    # A bad next is refused before anything moves (422), the task still held.
    for bad in ({"ttl_seconds": 0}, {}, {"ttl_seconds": 30, "queue": "no spaces"}, {"ttl_seconds": 30, "max_tasks": 2},
                {"ttl_seconds": 30, "wait_seconds": 31}, {"ttl_seconds": 30, "request_id": "a b"}, "soon"):
        response = post(http, "/tasks/held/complete", {"token": held["lease"]["token"], "result": {}, "next": bad}, agent)
        assert_error(response, 422, "validation_error")
    assert db_state() == before


def test_fail_and_release_with_next(http, agent):  # noqa: F811
    create(http, agent, id="f", priority=9, max_retries=0)
    create(http, agent, id="r", priority=5)
    create(http, agent, id="n")
    held = claim_next(http, agent)
    response = post(http, "/tasks/f/fail", {"token": held["lease"]["token"], "error": "boom", "next": {"ttl_seconds": 30}},
                    agent)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["stage"], body["next"]["task"]["id"]) == ("f", "FAILED", "r")
    response = post(http, "/tasks/r/release", {"token": body["next"]["lease"]["token"], "retry_after_seconds": 60,
                                               "next": {"ttl_seconds": 30}}, agent)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["stage"], body["next"]["task"]["id"]) == ("r", "QUEUED", "n")
    assert set(body) == TASK_FIELDS | {"next"}


def test_a_next_with_wait_waits_after_the_completion_has_committed(http, agent, monkeypatch):  # noqa: F811
    """Nothing ready: the request waits, and claims a task created meanwhile by another thread.
    That thread is let go when the wait's first look for work begins, and first reads the
    completed task from its own connection and creates a task, which on SQLite needs the write
    lock: both would hang if the completion's transaction were still open."""
    create(http, agent, id="only")
    held = claim_next(http, agent)
    waiting = threading.Event()
    seen: dict = {}
    real_has_ready_task = selectors.has_ready_task

    def has_ready_task(*args, **kwargs):
        waiting.set()
        return real_has_ready_task(*args, **kwargs)

    monkeypatch.setattr(selectors, "has_ready_task", has_ready_task)

    def producer():
        try:
            assert waiting.wait(30), "the request never began to wait"
            seen["stage"] = Task.objects.get(pk="only").stage
            transitions.create(TaskSpec(id="late", title="made while it waited"))
        except BaseException as exc:  # reported to the test
            seen["fault"] = exc
        finally:
            connections["default"].close()

    thread = threading.Thread(target=producer)
    thread.start()
    response = post(http, "/tasks/only/complete",
                    {"token": held["lease"]["token"], "result": {}, "next": {"ttl_seconds": 30, "wait_seconds": 10}},
                    agent)
    thread.join(30)
    assert "fault" not in seen, seen
    assert seen["stage"] == "COMPLETED"
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["stage"], body["next"]["task"]["id"], body["next"]["task"]["stage"]) == ("COMPLETED", "late", "RUNNING")


def test_a_next_with_wait_answers_at_once_when_no_waiting_slot_is_free(http, agent, settings):  # noqa: F811
    """The completion has committed: a full waiters' cap never turns it into an error."""
    settings.TASKFLOW = {**settings.TASKFLOW, "WSGI_MAX_WAITERS": 0}
    create(http, agent, id="only")
    held = claim_next(http, agent)
    response = post(http, "/tasks/only/complete",
                    {"token": held["lease"]["token"], "result": {}, "next": {"ttl_seconds": 30, "wait_seconds": 30}},
                    agent)
    assert response.status_code == 200, response.content
    assert (response.json()["stage"], response.json()["next"]) == ("COMPLETED", None)


def test_a_next_with_a_request_id_is_idempotent(http, agent):  # noqa: F811
    for n in range(3):
        create(http, agent, id=f"t{n}", priority=9 - n)
    held = claim_next(http, agent)
    response = post(http, "/tasks/t0/complete", {"token": held["lease"]["token"], "result": {},
                                                 "next": {"ttl_seconds": 30, "request_id": "req-1"}}, agent)
    nxt = response.json()["next"]
    # The answer was lost: a plain claim with the same request id returns that lease.
    again = claim_next(http, agent, request_id="req-1")
    assert again == nxt
    assert TaskEvent.objects.filter(verb="claim").count() == 2


@pytest.mark.parametrize("verb", ["complete", "fail", "release"])
def test_a_queue_outside_a_scoped_keys_queues_has_no_next(http, verb):  # noqa: F811
    from tests.test_api import used_key

    from board import agent_keys

    _, key = agent_keys.create_key("scoped", queues="ci-*")
    assert agent_keys.authenticate(key) is not None
    create(http, used_key("creator"), id="mine", queue="ci-1")
    create(http, used_key("creator2"), id="theirs", queue="docs")
    held = claim_next(http, key)
    body = {"token": held["lease"]["token"], "next": {"ttl_seconds": 30, "queue": "docs"},
            **({"result": {}} if verb == "complete" else {"error": "x"} if verb == "fail" else {})}
    response = post(http, f"/tasks/mine/{verb}", body, key)
    assert response.status_code == 200, response.content
    assert response.json()["next"] is None
    assert Task.objects.get(pk="theirs").stage == "QUEUED"


def test_fail_and_release_without_next_answer_as_they_always_did(http, agent):  # noqa: F811
    create(http, agent, id="f")
    create(http, agent, id="r")
    for verb, extra in (("fail", {"error": "boom"}), ("release", {})):
        held = claim_next(http, agent)
        response = post(http, f"/tasks/{held['task']['id']}/{verb}", {"token": held["lease"]["token"], **extra}, agent)
        assert response.status_code == 200, response.content
        assert set(response.json()) == TASK_FIELDS
