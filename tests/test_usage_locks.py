"""A usage report and a claim never wait for each other in a circle (PostgreSQL).

A claim's statement locks a task row before its queue's row (the pick, then `queue_budget`); a
row it locked while scanning past a task that was claimed and completed meanwhile stays locked
until it commits (PostgreSQL keeps the lock of a row whose re-check failed). A usage report
inserts its row, which references the task, and adds to its queue's budget. Django's foreign
keys are checked at COMMIT on PostgreSQL (deferred): the report then took the queue's row
first and the task's key-share lock last, the claim the other way round, and the two deadlocked
(seen in the budget race of tests/test_contract.py). The report now checks its references before
it touches the queue, so it waits for the task's row holding nothing else.

Shown with another session standing in for the claim: it holds the task's row, the report is
started and waits, then that session updates the queue's row: it must get it at once."""
from __future__ import annotations

import threading
import time

import psycopg
from django.db import connections

from board.engine import flow, transitions, usage
from board.engine.transitions import TaskSpec
from board.models import Queue, Task
from tests.support import database_url, postgres_db_mark

pytestmark = postgres_db_mark()
ALIAS = "postgres"


def waiting_on_a_lock(locker: psycopg.Connection, deadline: float) -> bool:
    """Whether another session of this database waits on a lock, looked at until `deadline`
    (a condition polled, not a pause hoped long enough)."""
    while time.monotonic() < deadline:
        found = locker.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'").fetchone()[0]
        if found:
            return True
        time.sleep(0.01)
    return False


def test_a_report_waiting_on_its_tasks_row_holds_no_queue_row():
    flow.change_queue("llm", budget={"tokens": 1000, "per": "total"}, actor="op", using=ALIAS)
    transitions.create([TaskSpec(id="x", title="x", queue="llm")], using=ALIAS)
    claim = transitions.claim_next("agent", 60, using=ALIAS)
    transitions.complete("x", claim.lease.token, {}, using=ALIAS)
    task = Task.objects.using(ALIAS).get(pk="x")
    outcome: dict = {}

    def report() -> None:
        try:
            usage.record(task, claim.lease.fence, "agent",
                         usage.checked({"model": "m", "input_tokens": 10, "output_tokens": 0}), using=ALIAS)
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001  (the test reads it below)
            outcome["error"] = exc
        finally:
            connections[ALIAS].close()

    with psycopg.connect(database_url(connections[ALIAS].settings_dict)) as locker:
        locker.execute("SET deadlock_timeout = '100ms'")
        locker.execute("SELECT 1 FROM board_task WHERE id = 'x' FOR UPDATE")  # as a claim's scan may keep it
        reporter = threading.Thread(target=report)
        reporter.start()
        try:
            assert waiting_on_a_lock(locker, time.monotonic() + 10), "the report never waited on the task's row"
            locker.execute("SET lock_timeout = '5s'")
            # The claim's next step: its queue's row (locked for a queue with a budget:
            # `queue_budget`). The report must not hold it.
            locker.execute("SELECT 1 FROM board_queue WHERE name = 'llm' FOR UPDATE")
            locker.commit()
        finally:
            reporter.join(30)
    assert outcome == {"ok": True}, outcome
    assert Queue.objects.using(ALIAS).get(name="llm").spent_tokens == 10
