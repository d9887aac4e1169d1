"""Batches (issue 34, item 2): POST /api/claim with max_tasks answers {"leases": [...]}, and
POST /api/complete completes several tasks with per-item outcomes. Through the whole HTTP stack
on SQLite; the engine's rules and races on every store are in the contract suite
(tests/test_contract.py, "several moves in one call")."""
from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from board.engine import flow, selectors, transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import db_state, sqlite_db_mark
from tests.test_api import TASK_FIELDS, agent, agent_b, assert_error, create, get, http, post  # noqa: F401 (fixtures)

pytestmark = sqlite_db_mark()


def batch(http, key, n: int, **fields):  # noqa: F811
    return post(http, "/claim", {"ttl_seconds": 60, "max_tasks": n, **fields}, key)


def test_a_batch_claim_answers_its_leases_in_claim_order(http, agent):  # noqa: F811
    for n in range(5):
        create(http, agent, id=f"b{n}", priority=10 - n)
    response = batch(http, agent, 3)
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"leases"}
    leases = body["leases"]
    assert [c["task"]["id"] for c in leases] == ["b0", "b1", "b2"]
    for c in leases:
        assert set(c) == {"task", "lease"} and set(c["task"]) == TASK_FIELDS
        assert (c["task"]["stage"], c["task"]["owner"], c["lease"]["fence"]) == ("RUNNING", "agent-a", 1)
        assert c["lease"]["expires_at"] == c["task"]["lease_expires_at"]
    assert len({c["lease"]["token"] for c in leases}) == 3
    # Fewer ready than asked: what there is; none: 204, as a claim.
    rest = batch(http, agent, 10).json()["leases"]
    assert [c["task"]["id"] for c in rest] == ["b3", "b4"]
    assert batch(http, agent, 10).status_code == 204
    # Each lease is its own: complete them in one batch.
    items = [{"id": c["task"]["id"], "token": c["lease"]["token"], "result": {"i": i}} for i, c in enumerate(leases + rest)]
    done = post(http, "/complete", {"items": items}, agent)
    assert done.status_code == 200, done.content
    assert [(i["id"], i["ok"], i["task"]["stage"]) for i in done.json()["items"]] == [
        (f"b{n}", True, "COMPLETED") for n in range(5)]


def test_a_claim_without_max_tasks_answers_as_it_always_did(http, agent):  # noqa: F811
    create(http, agent, id="one")
    response = post(http, "/claim", {"ttl_seconds": 60}, agent)
    assert set(response.json()) == {"task", "lease"}


def test_a_batch_never_takes_more_than_a_queue_limit(http, agent):  # noqa: F811
    flow.change_queue("capped", concurrency=3, actor="op")
    for n in range(6):
        create(http, agent, id=f"c{n}", queue="capped")
    leases = batch(http, agent, 10).json()["leases"]
    assert len(leases) == 3 and Task.objects.filter(stage="RUNNING").count() == 3
    assert batch(http, agent, 10).status_code == 204


def test_a_batch_claim_retried_with_its_request_id_gets_the_same_leases(http, agent, agent_b):  # noqa: F811
    for n in range(4):
        create(http, agent, id=f"r{n}", priority=10 - n)
    first = batch(http, agent, 2, request_id="batch-7").json()
    before = db_state()
    again = batch(http, agent, 2, request_id="batch-7").json()
    assert again == first and db_state() == before
    # Another agent's request with that id is its own.
    theirs = batch(http, agent_b, 5, request_id="batch-7").json()["leases"]
    assert [c["task"]["id"] for c in theirs] == ["r2", "r3"]
    assert TaskEvent.objects.filter(verb="claim").count() == 4


def test_a_waiting_batch_claim_gets_a_task_created_meanwhile(http, agent, monkeypatch):  # noqa: F811
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
            transitions.create([TaskSpec(id="late-1", title="l"), TaskSpec(id="late-2", title="l")])
        except BaseException as exc:  # reported to the test
            seen["fault"] = exc
        finally:
            connections["default"].close()

    thread = threading.Thread(target=producer)
    thread.start()
    response = batch(http, agent, 5, wait_seconds=10)
    thread.join(30)
    assert "fault" not in seen, seen
    assert response.status_code == 200, response.content
    assert sorted(c["task"]["id"] for c in response.json()["leases"]) == ["late-1", "late-2"]


def test_a_batch_complete_reports_each_item_in_order(http, agent, agent_b):  # noqa: F811
    for n in range(4):
        create(http, agent, id=f"d{n}")
    leases = batch(http, agent, 4).json()["leases"]
    items = [{"id": c["task"]["id"], "token": c["lease"]["token"], "result": {"n": n}} for n, c in enumerate(leases)]
    items[1]["token"] = "stale"
    items.append({"id": "absent", "token": "x", "result": {}})
    response = post(http, "/complete", {"items": items}, agent)
    assert response.status_code == 200, response.content
    answer = response.json()["items"]
    assert [(i["id"], i["ok"]) for i in answer] == [("d0", True), ("d1", False), ("d2", True), ("d3", True),
                                                    ("absent", False)]
    assert set(answer[0]) == {"id", "ok", "task"} and set(answer[0]["task"]) == TASK_FIELDS
    assert answer[0]["task"]["result"] == {"n": 0} and answer[0]["task"]["stage"] == "COMPLETED"
    assert answer[1] == {"id": "d1", "ok": False, "error": {"code": "lease_lost", "message": answer[1]["error"]["message"]}}
    assert answer[4]["error"]["code"] == "not_found"
    assert Task.objects.get(pk="d1").stage == "RUNNING"
    # Another agent's lease: forbidden, and it stays held.
    other = post(http, "/complete", {"items": [{"id": "d1", "token": leases[1]["lease"]["token"], "result": {}}]}, agent_b)
    assert other.json()["items"][0]["error"]["code"] == "forbidden"
    assert Task.objects.get(pk="d1").stage == "RUNNING"


def test_a_batch_complete_writes_each_accepted_items_usage(http, agent):  # noqa: F811
    for n in range(3):
        create(http, agent, id=f"u{n}")
    leases = batch(http, agent, 3).json()["leases"]
    items = [{"id": c["task"]["id"], "token": c["lease"]["token"], "result": {},
              "usage": {"model": "opus", "input_tokens": 100 * (n + 1), "output_tokens": 10, "cost_usd": 0.01}}
             for n, c in enumerate(leases)]
    items[1]["token"] = "stale"  # refused: its report is not written
    del items[2]["usage"]  # no report: usage stays missing, never zero
    response = post(http, "/complete", {"items": items}, agent)
    assert [i["ok"] for i in response.json()["items"]] == [True, False, True]
    got = {task_id: get(http, f"/tasks/{task_id}/usage", agent).json()["total"] for task_id in ("u0", "u1", "u2")}
    assert (got["u0"]["input_tokens"], got["u0"]["reports"], got["u0"]["cost_usd"]) == (100, 1, 0.01)
    assert got["u1"]["reports"] == 0 and got["u2"]["reports"] == 0


def test_a_scoped_key_completing_a_task_outside_its_queues_gets_not_found_for_it(http, agent):  # noqa: F811
    from board import agent_keys

    _, key = agent_keys.create_key("scoped", queues="ci-*")
    create(http, agent, id="ours", queue="ci-1")
    create(http, agent, id="theirs", queue="docs")
    ours = post(http, "/claim", {"ttl_seconds": 60}, key).json()
    theirs = post(http, "/claim", {"ttl_seconds": 60}, agent).json()
    response = post(http, "/complete", {"items": [
        {"id": "theirs", "token": theirs["lease"]["token"], "result": {}},
        {"id": "ours", "token": ours["lease"]["token"], "result": {}}]}, key)
    assert [(i["id"], i["ok"]) for i in response.json()["items"]] == [("theirs", False), ("ours", True)]
    assert response.json()["items"][0]["error"]["code"] == "not_found"
    assert Task.objects.get(pk="theirs").stage == "RUNNING"


ITEM = {"id": "x", "token": "t", "result": {}}


@pytest.mark.parametrize("body", [
    {"items": []},
    {"items": [dict(ITEM, id=f"x{i}") for i in range(101)]},
    {"items": [ITEM, ITEM]},
    {"items": [dict(ITEM, result=None)]},
    {"items": [{"id": "x", "token": "t"}]},
    {"items": [dict(ITEM, id="not an id")]},
    {"items": [dict(ITEM, extra=1)]},
    {"items": ITEM},
    {},
    {"items": [dict(ITEM, usage={"input_tokens": -1})]},
], ids=["empty", "101", "duplicate", "null-result", "no-result", "bad-id", "unknown-field", "not-a-list", "no-items",
        "bad-usage"])
def test_a_bad_batch_complete_is_422_and_writes_nothing(http, agent, body):  # noqa: F811
    create(http, agent, id="x")
    held = post(http, "/claim", {"ttl_seconds": 60}, agent).json()
    body = json.loads(json.dumps(body).replace('"t"', json.dumps(held["lease"]["token"])))
    before = db_state()
    assert_error(post(http, "/complete", body, agent), 422, "validation_error")
    assert db_state() == before


@pytest.mark.parametrize("max_tasks", [0, 101, -1, "3", 2.5, True, None])
def test_a_bad_max_tasks_is_422_and_claims_nothing(http, agent, max_tasks):  # noqa: F811
    create(http, agent, id="x")
    before = db_state()
    response = post(http, "/claim", {"ttl_seconds": 60, "max_tasks": max_tasks}, agent)
    if max_tasks is None:  # null is "not given": one claim, as ever
        assert set(response.json()) == {"task", "lease"}
        return
    assert_error(response, 422, "validation_error")
    assert db_state() == before


def test_a_revoked_key_completing_a_batch_is_401_and_writes_nothing(http, agent):  # noqa: F811
    from django.utils import timezone

    from board.models import AgentKey

    create(http, agent, id="k1")
    held = post(http, "/claim", {"ttl_seconds": 60}, agent).json()
    # Revoked behind this process's back: the hot verbs' auth still trusts the key it verified a
    # moment ago (board.agent_keys.authenticate_deferred), so the batch itself must refuse it.
    AgentKey.objects.filter(name="agent-a").update(revoked_at=timezone.now())
    before = db_state()
    response = post(http, "/complete", {"items": [{"id": "k1", "token": held["lease"]["token"], "result": {}}]}, agent)
    assert_error(response, 401, "unauthorized")
    assert db_state() == before
