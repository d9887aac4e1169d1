"""MongoDB's write conflicts: a move whose transaction meets another transaction's write is
aborted by the store (WriteConflict, a TransientTransactionError), and the engine runs it again
(board.engine.stores.retry_conflicts), a bounded number of times, never answering 500.

The other writer is a real transaction on its own pymongo session, held open (uncommitted)
while the engine's move runs, then committed or aborted by the test: no timing is involved."""
import json
import logging
import multiprocessing
from collections import Counter

import pytest
from django.db import connections
from django.test import Client

from board import agent_keys
from board.engine import errors, stores, transitions
from board.engine.stores import TransactionConflict, store
from board.engine.stores.mongodb.store import COUNTERS
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests import process_racer
from tests.support import database_url, row

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def open_transaction(collection: str, query: dict, update: dict):
    """Another writer: a transaction that has written one document and not committed."""
    connection = connections["default"]
    connection.ensure_connection()
    session = connection.connection.start_session()
    session.start_transaction()
    result = connection.database[collection].update_one(query, update, session=session)
    assert result.matched_count == 1
    return session


def held_task(task_id: str = "t"):
    transitions.create(TaskSpec(id=task_id, title=task_id))
    return transitions.claim(task_id, "agent-1", 60)


class ConflictLog(logging.Handler):
    """Counts the engine's conflict retries (board.engine.stores logs each at DEBUG) and runs `then` at
    the first one: what the other writer does once the engine has met its write."""

    def __init__(self, then=None):
        super().__init__(logging.DEBUG)
        self.conflicts, self.then = 0, then

    def emit(self, record):
        if "transaction conflict" in record.getMessage():
            self.conflicts += 1
            if self.conflicts == 1 and self.then:
                self.then()


@pytest.fixture
def conflict_log():
    logger = logging.getLogger("board.engine.stores")
    handlers = []

    def attach(then=None) -> ConflictLog:
        handler = ConflictLog(then)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler

    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield attach
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_move_meeting_an_uncommitted_write_to_its_task_runs_again_after_the_commit(conflict_log):
    c = held_task()
    before = row("t")
    other = open_transaction("board_task", {"_id": "t"}, {"$inc": {"version": 1}})
    log = conflict_log(then=other.commit_transaction)
    renewed = transitions.renew("t", c.lease.token, 120, agent="agent-1")
    other.end_session()
    assert log.conflicts == 1  # met the write once; after its commit, the second attempt moved
    # The second attempt read the other writer's version (v+1) and moved from it.
    assert renewed.task.version == before["version"] + 2 == row("t")["version"]
    assert TaskEvent.objects.filter(task_id="t", verb="renew").count() == 1


def test_conflicts_are_retried_a_bounded_number_of_times_then_refused_and_nothing_is_written(
        conflict_log, monkeypatch):
    c = held_task()
    before = row("t")
    events = TaskEvent.objects.count()
    # The other writer holds the history's counter: every move of every task meets it.
    other = open_transaction(COUNTERS, {"_id": "board_taskevent"}, {"$set": {"held": True}})
    monkeypatch.setattr(stores, "CONFLICT_RETRIES", 4)
    log = conflict_log()
    try:
        with pytest.raises(errors.VersionConflict, match="kept aborting"):
            transitions.renew("t", c.lease.token, 120, agent="agent-1")
        assert log.conflicts == 4
        assert row("t") == before and TaskEvent.objects.count() == events
    finally:
        other.abort_transaction()
        other.end_session()
    # Once the other writer is gone the same move goes through.
    assert transitions.renew("t", c.lease.token, 120, agent="agent-1").task.version == before["version"] + 1


def test_the_api_answers_409_version_conflict_when_conflicts_outlast_the_retries(monkeypatch):
    _, key = agent_keys.create_key("agent-1")
    c = held_task()
    before = row("t")
    other = open_transaction(COUNTERS, {"_id": "board_taskevent"}, {"$set": {"held": True}})
    monkeypatch.setattr(stores, "CONFLICT_RETRIES", 3)
    try:
        response = Client().post("/api/tasks/t/renew", json.dumps({"token": c.lease.token, "ttl_seconds": 60}),
                                 content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    finally:
        other.abort_transaction()
        other.end_session()
    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "version_conflict"
    assert row("t") == before


def test_a_conflict_inside_a_callers_transaction_goes_up_to_that_transaction():
    """Only the outermost transaction can run again: an inner verb passes the conflict up."""
    c = held_task()
    other = open_transaction(COUNTERS, {"_id": "board_taskevent"}, {"$set": {"held": True}})
    try:
        with pytest.raises(TransactionConflict):
            with store().write_transaction():
                transitions.renew("t", c.lease.token, 120, agent="agent-1")
    finally:
        other.abort_transaction()
        other.end_session()
    assert not connections["default"].in_atomic_block_mongo and connections["default"].session is None


def test_processes_creating_the_same_id_at_once_make_one_task_and_get_duplicate_id():
    """Processes, not threads (threads of one process queue on its writer lock): their
    transactions meet in MongoDB (a WriteConflict on the new task or the history's counter: 115
    conflicts over 30 rounds in one run with LOG_LEVEL=DEBUG), and the losing creator runs again
    and finds the task taken. Exactly one creator per round; no other outcome."""
    processes, rounds = 4, 30
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    url = database_url(connections["default"].settings_dict)
    racers = [ctx.Process(target=process_racer.race, args=(i, url, rounds, barrier, results, "create"))
              for i in range(processes)]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=120) for _ in range(processes * rounds)]
    for racer in racers:
        racer.join(timeout=60)
    faults = [o for o in outcomes if o[2] == "fault"]
    assert not faults, faults[:3]
    winners = Counter(n for n, _, outcome, _ in outcomes if outcome == "won")
    assert winners == Counter(range(rounds)), "every round must have exactly one creator"
    ids = [f"new-{n}" for n in range(rounds)]
    assert Task.objects.filter(pk__in=ids).count() == rounds
    assert TaskEvent.objects.filter(verb="create", task_id__in=ids).count() == rounds
