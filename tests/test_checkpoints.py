"""SQLite's WAL checkpoints run beside the writers, never inside a commit
(board.engine.checkpoints): a commit leaves the database file alone, and the process's
checkpointer copies the WAL back after CHECKPOINT_EVERY transactions or CHECKPOINT_AFTER seconds."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
from django.db import connections

from board.engine import checkpoints, flow, transitions
from board.engine.stores import store
from board.engine.transitions import TaskSpec
from tests.support import database_file, sqlite_db_mark

pytestmark = sqlite_db_mark()
WAIT = 30



def contents(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def create(count: int, prefix: str) -> None:
    """`count` write transactions (one task each)."""
    for n in range(count):
        transitions.create([TaskSpec(id=f"{prefix}-{n}", title="t")])


@pytest.fixture
def own_checkpointer(monkeypatch):
    """make(every=..., after=...): a checkpointer of the test's own, with these limits (the
    defaults: never), as the process's; the process's own is stopped first (it could checkpoint
    the same database file mid-test), and the database's WAL checkpointed (what earlier tests
    left in it). Each one made is stopped at the end; the next user starts a fresh one."""
    made: list[checkpoints.Checkpointer] = []

    def make(every: int = 10**9, after: float = 3600.0) -> checkpoints.Checkpointer:
        # The queue's row first (the first create into a new queue makes it in a transaction of
        # its own, board.engine.flow.ensure_rows): each create() below is then one transaction.
        flow.ensure_rows("default", ["default"], [])
        if checkpoints._checkpointer is not None:
            checkpoints._checkpointer.stop()
        monkeypatch.setattr(checkpoints, "CHECKPOINT_EVERY", every)
        monkeypatch.setattr(checkpoints, "CHECKPOINT_AFTER", after)
        runner = checkpoints.Checkpointer()
        made.append(runner)
        monkeypatch.setattr(checkpoints, "_checkpointer", runner)
        checkpoints.checkpoint(database_file())
        return runner

    yield make
    for runner in made:
        runner.stop()


def test_the_projects_sqlite_connections_checkpoint_in_a_commit_only_as_a_backstop():
    with connections["default"].cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone()[0] == checkpoints.WAL_BACKSTOP_PAGES > 4 * checkpoints.RESTART_AT_FRAMES / 2


def test_commits_past_sqlites_own_threshold_leave_the_database_file_untouched(own_checkpointer):
    own_checkpointer()
    path = database_file()
    before = contents(path)
    # Each transaction changes several pages (the task, its indexes, its history row): 400 of
    # them pass SQLite's default threshold of 1,000 pages, where a commit would checkpoint.
    create(400, "quiet")
    assert contents(path) == before, "a commit copied the WAL back into the database file"
    busy, in_wal, copied = checkpoints.checkpoint(path)
    assert (busy, copied) == (0, in_wal) and in_wal > 1000
    assert contents(path) != before


def test_the_checkpointer_copies_the_wal_back_after_a_number_of_transactions(own_checkpointer):
    runner = own_checkpointer(every=5)
    path = database_file()
    before = contents(path)
    create(4, "counted")
    assert runner.checkpoints == 0 and runner._pending == {path: 4}
    create(1, "fifth")
    assert runner.wait_for(1, WAIT), "no checkpoint after CHECKPOINT_EVERY transactions"
    assert_copied_back(runner, path, before)


def test_the_checkpointer_copies_a_quiet_boards_last_commit_back_after_a_while(own_checkpointer):
    runner = own_checkpointer(after=0.05)
    path = database_file()
    before = contents(path)
    create(1, "lone")
    assert runner.wait_for(1, WAIT), "the lone commit was never checkpointed"
    assert_copied_back(runner, path, before)


def assert_copied_back(runner: checkpoints.Checkpointer, path: str, before: str) -> None:
    """The runner's last checkpoint copied the whole WAL back: the database file changed."""
    busy, in_wal, copied = runner.last[path]
    assert busy == 0 and copied == in_wal > 0
    assert contents(path) != before


def copy_with_a_writer_meanwhile(monkeypatch) -> list:
    """Make the checkpointer's first copy meet a writer, as the board's writers go on while it
    copies: another thread's write transaction has begun before the copy, and commits right
    after it. Returns the copies' results."""
    real = checkpoints.checkpoint
    inside, go = threading.Event(), threading.Event()
    copies: list = []

    def write():
        try:
            with store("default").write_transaction():
                create(1, "meanwhile")
                inside.set()
                assert go.wait(WAIT)
        finally:
            connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    assert inside.wait(WAIT)

    def copy(path):
        result = real(path)
        if not copies:
            go.set()
            writer.join(WAIT)
        copies.append(result)
        return result

    monkeypatch.setattr(checkpoints, "checkpoint", copy)
    return copies


def test_a_wal_past_the_limit_is_started_over_though_a_writer_appended_during_the_copy(own_checkpointer, monkeypatch):
    runner = own_checkpointer()
    monkeypatch.setattr(checkpoints, "RESTART_AT_FRAMES", 1)
    path = database_file()
    create(20, "before")
    copies = copy_with_a_writer_meanwhile(monkeypatch)
    runner._checkpoint(path)
    monkeypatch.undo()
    # The second copy, holding the writers' locks, took the page the writer appended.
    assert len(copies) == 2 and copies[1][1] == copies[1][2] > copies[0][1]
    create(1, "after")
    busy, in_wal, copied = checkpoints.checkpoint(path)
    assert in_wal < copies[0][1]  # started over: the WAL holds only the last transaction's pages


def test_below_the_limit_the_wal_goes_on_growing(own_checkpointer, monkeypatch):
    """The other side of the limit: without the locked copy, the page appended during the copy
    keeps the WAL from starting over."""
    runner = own_checkpointer()
    path = database_file()
    create(20, "before")
    copies = copy_with_a_writer_meanwhile(monkeypatch)
    runner._checkpoint(path)
    monkeypatch.undo()
    assert len(copies) == 1
    create(1, "after")
    busy, in_wal, copied = checkpoints.checkpoint(path)
    assert in_wal > copies[0][1]


def test_a_rolled_back_transaction_is_not_counted(own_checkpointer):
    runner = own_checkpointer()
    path = database_file()
    create(1, "seen")

    try:
        with store("default").write_transaction():
            transitions.create([TaskSpec(id="undone", title="t")])
            raise LookupError("roll back")
    except LookupError:
        pass
    assert runner._pending == {path: 1}


def test_a_database_that_is_gone_is_not_made_again(tmp_path):
    gone = tmp_path / "gone.sqlite3"
    assert checkpoints.checkpoint(str(gone)) is None
    assert not gone.exists()


def test_a_checkpointer_whose_thread_ended_is_replaced(own_checkpointer):
    runner = own_checkpointer()
    runner.stop()
    replacement = checkpoints.checkpointer()
    try:
        assert replacement is not runner and replacement.running
    finally:
        replacement.stop()


def test_a_failing_checkpoint_does_not_end_the_thread(own_checkpointer, monkeypatch):
    runner = own_checkpointer(every=1)

    def broken(path):
        raise OSError("the lock file is gone")

    monkeypatch.setattr(runner, "_checkpoint", broken)
    create(1, "first")
    assert runner.wait_for(1, WAIT) and runner.running
