"""Every failure keeps its own error (and traceback) in its history row, not only in the task's
`last_error` that the next failure overwrites: through the real server's API, on SQLite and
PostgreSQL; the traceback's cap refused with the JSON error shape and nothing written; the
reaper's expiry says why; the Python client sends the traceback of a block that raised."""
from __future__ import annotations

import json

import pytest
from django.conf import settings

from board import agent_keys
from board.engine import errors, transitions
from board.engine.limits import MAX_TRACEBACK_CHARS
from board.engine.transitions import TaskSpec
from taskflow_client import Client
from tests.live_server import api_call, server_for_sessions
from tests.support import (
    db_state,
    end_backoff,
    expire_lease,
    sql_stores,
)

STORES = sql_stores()


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker):
    """One real server per store, started when a test first asks for it."""
    started: dict = {}

    def get(alias: str):
        if alias not in started:
            if alias == "postgres" and not settings.POSTGRES_AVAILABLE:
                pytest.skip("NOT RUN: PostgreSQL tests (no server)")
            with django_db_blocker.unblock():
                started[alias] = server_for_sessions(alias)
        return started[alias]

    yield get
    for server in started.values():
        server.close()


def key_in(alias: str, name: str) -> str:
    return agent_keys.create_key(name, using=alias)[1]


def history(server, key: str, task_id: str) -> list[dict]:
    status, page = api_call(server, "GET", f"/api/tasks/{task_id}/events?limit=500", key)
    assert status == 200, page
    return page["items"]


def claim(server, key: str, task_id: str) -> str:
    status, answer = api_call(server, "POST", f"/api/tasks/{task_id}/claim", key, {"ttl_seconds": 60})
    assert status == 200, answer
    return answer["lease"]["token"]


@pytest.mark.parametrize("alias", STORES)
def test_fail_twice_then_complete_keeps_three_attempts_each_with_its_own_error(alias, servers):
    server = servers(alias)
    key = key_in(alias, "worker-1")
    transitions.create(TaskSpec(id="flaky", title="flaky", max_retries=3), using=alias)

    token = claim(server, key, "flaky")
    tokens = [token]
    status, answer = api_call(server, "POST", "/api/tasks/flaky/fail", key,
                              {"token": token, "error": "first: timeout", "traceback": "Traceback 1\n  line a"})
    assert status == 200 and answer["stage"] == "QUEUED", answer
    end_backoff("flaky", alias)
    token = claim(server, key, "flaky")
    tokens.append(token)
    status, answer = api_call(server, "POST", "/api/tasks/flaky/fail", key,
                              {"token": token, "error": "second: refused", "retryable": True})
    assert status == 200 and answer["error"] == "second: refused", answer
    end_backoff("flaky", alias)
    token = claim(server, key, "flaky")
    tokens.append(token)
    status, answer = api_call(server, "POST", "/api/tasks/flaky/complete", key, {"token": token, "result": {"ok": 1}})
    assert status == 200 and answer["stage"] == "COMPLETED", answer

    events = history(server, key, "flaky")
    ends = [(e["verb"], e["fence"], e["detail"]) for e in events if e["verb"] in ("fail", "complete")]
    assert ends == [
        ("fail", 1, {"error": "first: timeout", "traceback": "Traceback 1\n  line a", "retryable": True}),
        ("fail", 2, {"error": "second: refused", "retryable": True}),
        ("complete", 3, None),
    ]
    assert [e["verb"] for e in events].count("claim") == 3
    history_text = json.dumps(events)
    assert not [t for t in tokens if t in history_text] and "token" not in history_text


@pytest.mark.parametrize("alias", STORES)
def test_a_traceback_over_its_cap_is_422_and_writes_nothing(alias, servers):
    server = servers(alias)
    key = key_in(alias, "worker-2")
    transitions.create(TaskSpec(id="big-tb", title="big traceback"), using=alias)
    token = claim(server, key, "big-tb")
    before = db_state(alias)
    status, answer = api_call(server, "POST", "/api/tasks/big-tb/fail", key,
                              {"token": token, "error": "boom", "traceback": "t" * (MAX_TRACEBACK_CHARS + 1)})
    assert status == 422, answer
    assert answer["error"]["code"] == "validation_error" and str(MAX_TRACEBACK_CHARS) in answer["error"]["message"]
    assert db_state(alias) == before
    status, answer = api_call(server, "POST", "/api/tasks/big-tb/fail", key,
                              {"token": token, "error": "boom", "traceback": "t" * MAX_TRACEBACK_CHARS})
    assert status == 200, answer
    assert history(server, key, "big-tb")[-2]["detail"]["traceback"] == "t" * MAX_TRACEBACK_CHARS


@pytest.mark.parametrize("alias", STORES)
def test_the_engine_refuses_a_traceback_over_its_cap_for_every_caller(alias):
    transitions.create(TaskSpec(id="e1", title="engine"), using=alias)
    token = transitions.claim("e1", "agent", 60, using=alias).lease.token
    before = db_state(alias)
    with pytest.raises(errors.InvalidRequest, match=str(MAX_TRACEBACK_CHARS)):
        transitions.fail("e1", token, "boom", traceback="t" * (MAX_TRACEBACK_CHARS + 1), using=alias)
    with pytest.raises(errors.InvalidRequest, match="traceback"):
        transitions.fail("e1", token, "boom", traceback="nul \x00 inside", using=alias)
    assert db_state(alias) == before


@pytest.mark.parametrize("alias", STORES)
def test_the_reapers_expiries_say_why_the_attempt_ended(alias):
    transitions.create([TaskSpec(id="again", title="retried", max_retries=1),
                        TaskSpec(id="last", title="last attempt", max_retries=0)], using=alias)
    for task_id in ("again", "last"):
        transitions.claim(task_id, "sleepy", 60, using=alias)
        expire_lease(task_id, alias)
    moved = transitions.reclaim_expired(using=alias)
    assert sorted((m.task_id, m.to_stage) for m in moved) == [("again", "QUEUED"), ("last", "FAILED")]
    from board.models import TaskEvent

    reclaim = TaskEvent.objects.using(alias).get(task_id="again", verb="reclaim").detail
    assert (reclaim["reason"], reclaim["previous_owner"]) == ("lease expired", "sleepy")
    failed = TaskEvent.objects.using(alias).get(task_id="last", verb="fail").detail
    assert (failed["reason"], failed["error"], failed["retryable"]) == (
        "lease expired", "lease expired on the last attempt", False)


@pytest.mark.parametrize("alias", STORES[:1])
def test_the_client_sends_the_traceback_of_a_block_that_raised(alias, servers):
    server = servers(alias)
    client = Client(server.url, key_in(alias, "worker-3"), timeout=30)
    client.create({"id": "crash", "title": "crashes"})

    def deep_inside(n):
        if n == 0:
            raise KeyError("missing-field")
        deep_inside(n - 1)

    with pytest.raises(KeyError), client.hold_task("crash", ttl_seconds=30):
        deep_inside(3)
    detail = next(e for e in client.events("crash") if e["verb"] == "fail")["detail"]
    assert detail["error"].startswith("KeyError: 'missing-field'")
    assert detail["traceback"].startswith("Traceback (most recent call last):")
    assert detail["traceback"].count("in deep_inside") == 4
    assert detail["traceback"].rstrip().endswith("KeyError: 'missing-field'")
