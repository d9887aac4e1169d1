"""A claim the deadlock detector ends runs again (PostgreSQL).

Two finishing moves with `next` (complete-and-claim across two limited queues) each hold one
queue's row and lock the other's; a lone claim waiting first in line for one of those rows holds
that row's tuple lock, so it is part of the circle, and PostgreSQL may end it rather than either
of them. CI's race (test_contract's eight workers completing and claiming across two queues) saw
the lone claim get the "deadlock detected" error itself: only the moves sharing a transaction were
run again. Nothing of a transaction the detector ended was written, so every verb may run again,
from the start, outside a caller's transaction (stores.retry_conflicts).

Shown with another session standing in for the circle: it holds the queue's row, the claim picks
a task and waits for that row, then the session waits for the claim's task row; PostgreSQL's
detector runs in the claim's session first (the other's deadlock_timeout is long), and ends it.
The claim must run again and take the other ready task once the session is gone."""
from __future__ import annotations

import threading
import time

import psycopg
from django.db import connections

from board.engine import flow, transitions
from board.engine.transitions import TaskSpec
from board.models import Task
from tests.support import database_url, postgres_db_mark

pytestmark = postgres_db_mark()
ALIAS = "postgres"


def claim_waiting(watcher: psycopg.Connection, after=None) -> tuple | None:
    """(pid, xact_start) of a session of this database waiting on a lock in a transaction begun
    after `after` (any, when None), or None. `watcher` is in autocommit: every read is fresh
    (PostgreSQL keeps one snapshot of pg_stat_activity per transaction)."""
    return watcher.execute(
        "SELECT pid, xact_start FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        " AND (%(after)s::timestamptz IS NULL OR xact_start > %(after)s::timestamptz)", {"after": after}).fetchone()


def until(found, deadline: float):
    """`found()`'s first truthy answer, asked until `deadline` (a condition polled)."""
    while time.monotonic() < deadline:
        if answer := found():
            return answer
        time.sleep(0.01)
    return None


def test_a_lone_claim_ended_by_the_deadlock_detector_runs_again():
    flow.change_queue("left", concurrency=3, actor="op", using=ALIAS)
    transitions.create([TaskSpec(id="x", title="x", queue="left"), TaskSpec(id="y", title="y", queue="left")],
                       using=ALIAS)
    outcome: dict = {}

    def claim() -> None:
        try:
            outcome["claim"] = transitions.claim_next("agent", 60, using=ALIAS)
        except Exception as exc:  # noqa: BLE001  (the test reads it below)
            outcome["error"] = exc
        finally:
            connections[ALIAS].close()

    url = database_url(connections[ALIAS].settings_dict)
    with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as watcher:
        locker.execute("SET deadlock_timeout = '30s'")  # the claim's session detects the circle first
        # Every shard of the queue's limit held: the claim skips none it could take, so it waits
        # for the first (board.engine.flow; PG_CLAIM_NEXT's `run_shard`).
        locker.execute("SELECT 1 FROM board_queueshard WHERE queue = 'left' AND kind = 'run' FOR UPDATE")
        claimer = threading.Thread(target=claim)
        claimer.start()
        try:
            first = until(lambda: claim_waiting(watcher), time.monotonic() + 10)
            assert first, "the claim never waited on the queue's shard"
            locker.execute("SET lock_timeout = '20s'")
            # The circle: this session now waits for the task row the claim picked (x, first in
            # line); the detector ends the claim's transaction, which frees it.
            locker.execute("SELECT 1 FROM board_task WHERE id = 'x' FOR UPDATE")
            # The claim ran again (waits for the shard in a new transaction), or it ended.
            assert until(lambda: not claimer.is_alive() or claim_waiting(watcher, first[1]), time.monotonic() + 10)
            locker.rollback()
        finally:
            claimer.join(30)
    assert "error" not in outcome, outcome
    assert outcome["claim"].task.pk == "y"  # x was locked by the other session when it ran again
    assert Task.objects.using(ALIAS).get(pk="y").stage == "RUNNING"
    assert Task.objects.using(ALIAS).get(pk="x").stage == "QUEUED"
