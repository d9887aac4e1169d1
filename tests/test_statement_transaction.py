"""On SQLite the hot verbs' transaction is sent on the driver's connection, not through Django's
`transaction.atomic` (the SQLite store's statement_transaction): what Django's atomic gave them
must still hold. A failed statement rolls the whole move back and leaves the connection usable;
the move is told to the board and the counters only once it has committed; inside a caller's
transaction it joins that one; a BEGIN that cannot get the lock fails with Django's error and
leaves the writers' locks free."""
from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, OperationalError, connections, transaction

from board.engine import commits, outcomes, transitions
from board.engine.stores import base, store
from board.engine.transitions import TaskSpec
from tests.support import database_file, db_state, sqlite_db_mark

pytestmark = sqlite_db_mark()
TTL = 60



def stage_seen_by_another_connection(task_id: str) -> str:
    """The task's stage as committed: read on a plain connection of its own."""
    other = sqlite3.connect(database_file())
    try:
        return other.execute("SELECT stage FROM board_task WHERE id = ?", [task_id]).fetchone()[0]
    finally:
        other.close()


@contextmanager
def told_moves():
    """The `won` outcomes told while inside, each with the task's stage as committed then and
    whether the driver's connection was still in a transaction."""
    told: list[tuple[str, str, bool]] = []

    def observer(verb, outcome, code, count):
        if outcome == outcomes.WON:
            told.append((str(verb), stage_seen_by_another_connection("hot"),
                         connections["default"].connection.in_transaction))

    outcomes.subscribe(observer)
    try:
        yield told
    finally:
        outcomes._observers.remove(observer)


@contextmanager
def refusing_history(verb: str):
    """The history INSERT of `verb` fails (a trigger), after the move's UPDATE has run."""
    with connections["default"].cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER refuse_{verb} BEFORE INSERT ON board_taskevent "
                       f"WHEN NEW.verb = '{verb}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    try:
        yield
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(f"DROP TRIGGER refuse_{verb}")


def test_django_stays_in_autocommit_while_the_driver_holds_the_transaction():
    connection = connections["default"]
    with store().statement_transaction():
        assert connection.connection.in_transaction
        assert not connection.in_atomic_block and connection.get_autocommit()
    assert not connection.connection.in_transaction


def test_a_failed_statement_rolls_the_whole_move_back_and_the_connection_goes_on():
    transitions.create(TaskSpec(id="hot", title="hot"))
    before = db_state()
    with told_moves() as told, refusing_history("claim"), pytest.raises(Exception, match="refused by the test"):
        transitions.claim_next("agent", TTL)
    assert db_state() == before  # the UPDATE that ran before the INSERT is undone too
    assert told == []
    assert not connections["default"].connection.in_transaction
    claim = transitions.claim_next("agent", TTL)  # same connection, same locks: free again
    assert claim.task.pk == "hot"


def test_a_failed_holder_move_writes_nothing_and_keeps_the_lease():
    transitions.create(TaskSpec(id="hot", title="hot"))
    claim = transitions.claim_next("agent", TTL)
    before = db_state()
    with refusing_history("renew"), pytest.raises(Exception, match="refused by the test"):
        transitions.renew("hot", claim.lease.token, TTL)
    assert db_state() == before
    assert transitions.complete("hot", claim.lease.token, {"ok": True}).stage == "COMPLETED"


def test_the_move_is_told_only_after_its_commit():
    transitions.create(TaskSpec(id="hot", title="hot"))
    with told_moves() as told:
        claim = transitions.claim_next("agent", TTL)
        transitions.complete("hot", claim.lease.token, {"ok": True})
    assert told == [("claim", "RUNNING", False), ("complete", "COMPLETED", False)]


def test_inside_a_callers_transaction_the_move_joins_it_and_is_told_at_its_commit():
    transitions.create([TaskSpec(id="hot", title="hot"), TaskSpec(id="kept", title="kept")])
    rings: list[str] = []
    commits.subscribe(ring := lambda: rings.append("ring"))
    try:
        with told_moves() as told:
            with pytest.raises(LookupError), transaction.atomic():
                assert transitions.claim_next("agent", TTL).task.stage == "RUNNING"
                raise LookupError("the caller rolls back")
            assert stage_seen_by_another_connection("hot") == "QUEUED" and told == [] and rings == []
            with transaction.atomic():
                claim = transitions.claim_next("agent", TTL)
                assert told == [] and rings == []
            assert told == [("claim", "RUNNING", False)] and rings == ["ring"]
    finally:
        commits._subscribers.remove(ring)
    assert claim.task.pk == "hot"


def test_a_begin_that_cannot_get_the_lock_fails_with_djangos_error_and_frees_the_locks():
    transitions.create(TaskSpec(id="hot", title="hot"))
    connection = connections["default"]
    connection.ensure_connection()
    connection.connection.execute("PRAGMA busy_timeout = 50")
    # A writer that bypasses the board's locks (as a migration would) holds SQLite's.
    other = sqlite3.connect(database_file(), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        before = db_state()
        with pytest.raises(OperationalError, match="locked"):
            transitions.claim_next("agent", TTL)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert db_state() == before
    assert_the_writers_locks_are_free()
    connection.connection.execute("PRAGMA busy_timeout = 30000")
    assert transitions.claim_next("agent", TTL).task.pk == "hot"


def assert_the_writers_locks_are_free() -> None:
    """Both writers' locks, tried from elsewhere: the process's lock from another thread (it is
    reentrant, so this thread would get it even if it still held it), the flock through a
    descriptor of its own."""
    taken: list[bool] = []

    def try_the_process_lock():
        lock = base.process_lock("default")
        taken.append(lock.acquire(blocking=False))
        if taken[-1]:
            lock.release()

    other = threading.Thread(target=try_the_process_lock)
    other.start()
    other.join()
    assert taken == [True]
    fd = os.open(f"{database_file()}-writers", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if held
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def test_a_commit_that_fails_rolls_the_move_back_and_frees_the_locks():
    """A deferred foreign key (Django's, on SQLite) is checked at COMMIT: a trigger makes the
    claim's transaction break one, so its COMMIT fails."""
    transitions.create(TaskSpec(id="hot", title="hot"))
    before = db_state()
    with connections["default"].cursor() as cursor:
        cursor.execute("CREATE TRIGGER break_a_key AFTER INSERT ON board_taskevent WHEN NEW.verb = 'claim' BEGIN "
                       "INSERT INTO board_dependency (task_id, depends_on_id) VALUES (NEW.task_id, 'nowhere'); END")
    try:
        with pytest.raises(IntegrityError, match="FOREIGN KEY"):
            transitions.claim_next("agent", TTL)
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("DROP TRIGGER break_a_key")
    assert db_state() == before
    assert not connections["default"].connection.in_transaction
    assert_the_writers_locks_are_free()
    assert transitions.claim_next("agent", TTL).task.pk == "hot"


def test_no_transaction_may_open_inside_one():
    with store().statement_transaction():
        with pytest.raises(RuntimeError, match="inside statement_transaction"):
            with store().write_transaction():
                pass
        with pytest.raises(RuntimeError, match="inside statement_transaction"):
            with store().statement_transaction():
                pass
    assert_the_writers_locks_are_free()
