"""Lease times on PostgreSQL come from the database's clock, not the server process's (issue 9,
item 16).

Real server processes on the PostgreSQL test database: one with a true clock, and ones whose
`timezone.now()` is an hour ahead or an hour behind (tests/skewed_clock_settings.py, as a host
whose clock has drifted). A lease claimed for 60 s through the true server is neither taken
over, reaped, reported expired nor refused its renew by the process an hour ahead; a lease that
has expired by the database's clock is refused its renew and taken over by the process an hour
behind; and the expiry every process writes is the database's clock + the TTL. The last test
does the same in-process on both engine paths (hot statements and ORM), reaper and check().
"""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.db import connections

from board import agent_keys
from board.models import Task, TaskEvent
from tests.live_server import ROOT, BoardServer, api_call, server_env
from tests.support import database_url, expire_lease, postgres_db_mark

pytestmark = postgres_db_mark()

PG = "postgres"
TTL = 60
HOUR = 3600


def skewed(seconds: int) -> dict:
    return {"DJANGO_SETTINGS_MODULE": "tests.skewed_clock_settings",
            "TASKFLOW_TEST_CLOCK_SKEW_SECONDS": str(seconds)}


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker):
    """{"true": ..., "ahead": ..., "behind": ...}: one-process servers on the PostgreSQL test
    database, sharing one SECRET_KEY."""
    with django_db_blocker.unblock():
        url = database_url(connections[PG].settings_dict)
    started = {}
    try:
        for name, env in (("true", {}), ("ahead", skewed(HOUR)), ("behind", skewed(-HOUR))):
            started[name] = BoardServer(url, env=env, args=["--workers", "1"]).start()
        yield started
    finally:
        for server in started.values():
            server.close()


@pytest.fixture
def keys(servers):
    return {name: agent_keys.create_key(name, using=PG)[1] for name in ("alice", "bob")}


call = api_call


def database_clock():
    with connections[PG].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def lease_of(task_id: str) -> tuple:
    task = Task.objects.using(PG).get(pk=task_id)
    return task.stage, task.owner, task.fence, task.lease_expires_at


def skewed_process_clock(seconds: int):
    """What timezone.now() says in a process started with these settings (the skew is real)."""
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from django.utils import timezone; print(timezone.now().isoformat())"],
        cwd=ROOT, env=server_env("sqlite:///unused.sqlite3", "k", **skewed(seconds)),
        capture_output=True, text=True, timeout=60, check=True)
    return datetime.fromisoformat(out.stdout.strip().splitlines()[-1])


def test_the_skewed_settings_really_move_the_process_clock():
    before = database_clock()
    ahead = skewed_process_clock(HOUR)
    assert timedelta(minutes=59) < ahead - before < timedelta(minutes=61)


def test_a_process_an_hour_ahead_neither_takes_over_reaps_nor_refuses_a_live_lease(servers, keys):
    true, ahead = servers["true"], servers["ahead"]
    assert call(true, "POST", "/api/tasks", keys["alice"], {"id": "live", "title": "live"})[0] == 201
    status, claim = call(true, "POST", "/api/tasks/live/claim", keys["alice"], {"ttl_seconds": TTL})
    assert status == 200, claim
    token = claim["lease"]["token"]

    status, body = call(ahead, "POST", "/api/tasks/live/claim", keys["bob"], {"ttl_seconds": TTL})
    assert (status, body["error"]["code"]) == (409, "taken"), body
    assert call(ahead, "POST", "/api/claim", keys["bob"], {"ttl_seconds": TTL})[0] == 204
    status, body = call(ahead, "GET", "/api/check", keys["bob"])
    assert (status, body) == (200, {"problems": []})
    reaper = subprocess.run([sys.executable, "manage.py", "reap", "--database", "default"], cwd=ROOT,
                            env=server_env(ahead.database_url, ahead.secret_key, **skewed(HOUR)),
                            capture_output=True, text=True, timeout=60)
    assert reaper.returncode == 0 and "reclaimed" not in reaper.stdout, reaper.stdout + reaper.stderr
    assert lease_of("live")[:3] == ("RUNNING", "alice", 1)

    status, renewed = call(ahead, "POST", "/api/tasks/live/renew", keys["alice"], {"token": token, "ttl_seconds": TTL})
    assert status == 200, renewed
    assert renewed["lease"]["fence"] == 1 and renewed["lease"]["token"] == token
    status, done = call(ahead, "POST", "/api/tasks/live/complete", keys["alice"], {"token": token, "result": {}})
    assert (status, done["stage"]) == (200, "COMPLETED")
    assert list(TaskEvent.objects.using(PG).filter(task_id="live").values_list("verb", flat=True)) == [
        "create", "claim", "renew", "complete"]


def test_a_process_an_hour_behind_refuses_to_renew_an_expired_lease_and_takes_it_over(servers, keys):
    true, behind = servers["true"], servers["behind"]
    assert call(true, "POST", "/api/tasks", keys["alice"], {"id": "gone", "title": "gone"})[0] == 201
    status, claim = call(true, "POST", "/api/tasks/gone/claim", keys["alice"], {"ttl_seconds": TTL})
    assert status == 200, claim
    expire_lease("gone", using=PG, ago=timedelta(seconds=5))  # expired 5 s ago by the database's clock

    status, body = call(behind, "POST", "/api/tasks/gone/renew", keys["alice"],
                        {"token": claim["lease"]["token"], "ttl_seconds": TTL})
    assert (status, body["error"]["code"]) == (409, "lease_lost"), body
    status, body = call(behind, "GET", "/api/check", keys["bob"])
    assert [p["code"] for p in body["problems"]] == ["lease_expired"]
    status, taken = call(behind, "POST", "/api/tasks/gone/claim", keys["bob"], {"ttl_seconds": TTL})
    assert status == 200, taken
    assert lease_of("gone")[:3] == ("RUNNING", "bob", 2)


def same_instant(api_time: str, stored: datetime) -> bool:
    """The API writes times to the millisecond."""
    return timedelta(0) <= stored - datetime.fromisoformat(api_time) < timedelta(milliseconds=1)


def assert_database_clock_plus_ttl(expires_at: datetime, before: datetime, after: datetime, ttl: int, what: str):
    assert before + timedelta(seconds=ttl) <= expires_at <= after + timedelta(seconds=ttl), (
        f"{what}: {expires_at} is not the database's clock + {ttl} s ({before} .. {after})")


@pytest.mark.parametrize("name", ["true", "ahead", "behind"])
def test_the_expiry_written_is_the_database_clock_plus_the_ttl(servers, keys, name):
    server = servers[name]
    task_id = f"exp-{name}"
    assert call(server, "POST", "/api/tasks", keys["alice"], {"id": task_id, "title": "t"})[0] == 201
    before = database_clock()
    status, claim = call(server, "POST", f"/api/tasks/{task_id}/claim", keys["alice"], {"ttl_seconds": TTL})
    after = database_clock()
    assert status == 200, claim
    assert_database_clock_plus_ttl(lease_of(task_id)[3], before, after, TTL, f"{name}: claim")
    before = database_clock()
    status, renewed = call(server, "POST", f"/api/tasks/{task_id}/renew", keys["alice"],
                           {"token": claim["lease"]["token"], "ttl_seconds": 2 * TTL})
    after = database_clock()
    assert status == 200, renewed
    assert_database_clock_plus_ttl(lease_of(task_id)[3], before, after, 2 * TTL, f"{name}: renew")
    assert same_instant(renewed["lease"]["expires_at"], lease_of(task_id)[3])


def test_claim_next_through_a_skewed_process_writes_the_database_clock_too(servers, keys):
    for name in ("ahead", "behind"):
        server = servers[name]
        assert call(server, "POST", "/api/tasks", keys["alice"], {"id": f"next-{name}", "title": "t"})[0] == 201
        before = database_clock()
        status, answer = call(server, "POST", "/api/claim", keys["alice"], {"ttl_seconds": TTL})
        after = database_clock()
        assert status == 200 and answer["task"]["id"] == f"next-{name}", answer
        assert_database_clock_plus_ttl(lease_of(f"next-{name}")[3], before, after, TTL, f"{name}: claim-next")
        assert same_instant(answer["lease"]["expires_at"], lease_of(f"next-{name}")[3])


@pytest.mark.parametrize("hot_path", ["auto", "orm"])
def test_in_a_process_an_hour_ahead_every_verb_judges_leases_by_the_database_clock(settings, monkeypatch, hot_path):
    """The same in-process, on both engine paths (the store's statements and the ORM path):
    with this process's clock an hour ahead, a 60 s lease is live to claim, claim-next, renew,
    the reaper's pass and check(); once expired by the database's clock, renew refuses it and
    the reaper takes it back."""
    from django.utils import timezone

    from board.engine import errors, selectors, stores, transitions
    from board.engine.transitions import TaskSpec

    settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": hot_path}
    assert (stores.store(PG).statements is None) == (hot_path == "orm")
    true_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: true_now() + timedelta(seconds=HOUR))
    transitions.create([TaskSpec(id="held", title="t"), TaskSpec(id="spare", title="t")], using=PG)
    before = database_clock()
    lease = transitions.claim_next("alice", TTL, using=PG).lease
    assert_database_clock_plus_ttl(lease.expires_at, before, database_clock(), TTL, f"{hot_path}: claim-next")
    with pytest.raises(errors.Taken):
        transitions.claim("held", "bob", TTL, using=PG)
    assert transitions.reclaim_expired(using=PG) == []
    assert selectors.problems(using=PG) == []
    renewed = transitions.renew("held", lease.token, TTL, agent="alice", using=PG)
    assert renewed.lease.fence == 1

    monkeypatch.setattr(timezone, "now", true_now)
    expire_lease("held", using=PG)  # 5 s ago by the true clock, the database's too
    monkeypatch.setattr(timezone, "now", lambda: true_now() + timedelta(seconds=HOUR))
    with pytest.raises(errors.LeaseLost):
        transitions.renew("held", lease.token, TTL, agent="alice", using=PG)
    assert [p.code for p in selectors.problems(using=PG)] == ["lease_expired"]
    assert [(m.task_id, m.to_stage) for m in transitions.reclaim_expired(using=PG)] == [("held", "QUEUED")]
