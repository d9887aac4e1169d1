"""SQLite's WAL checkpoints, run beside the writers instead of inside one of their commits.

In WAL mode a commit appends the pages it changed to the `-wal` file; a *checkpoint* copies them
back into the database file and syncs both (with synchronous=NORMAL, the only syncs there are).
By default SQLite runs one inside the commit that takes the WAL past 1,000 pages. Timing every
commit of bench/claims.py's engine loop on SQLite (an instrumented run, 1 and 8 threads of claim
+ complete), about 1 commit in 100 was such a commit: the median commit took 0.12 ms, the 99th
percentile 13.9 ms, and the slowest 1% were 43% of all the time spent committing. All of it ran
under the writers' locks (board.engine.stores.sqlite), so every other writer, of every process, waited for
the sync.

So the project's connections raise SQLite's threshold out of the way (`PRAGMA
wal_autocheckpoint=10000` in taskflow_site.settings.sqlite_options), and each process runs
checkpoints from a thread of its own,
on a connection of its own: a PASSIVE checkpoint, which takes none of the writers' locks, so
writers go on while it syncs. It runs after CHECKPOINT_EVERY write transactions of this
process, or CHECKPOINT_AFTER seconds after the first one it has not checkpointed yet, whichever
comes first. A claim writes about 15 pages, so 100 transactions are about 1,500 pages (SQLite's
own threshold is 1,000); the time limit bounds how long a quiet board's last commits wait in the WAL (with
synchronous=NORMAL a power cut, not a crash of the process, may lose commits not yet
checkpointed: SQLite's documented trade-off, which the time limit keeps short).

One step still holds the writers: starting the WAL over, which needs it wholly copied back
while no writer appends (Checkpointer._checkpoint). It runs once the WAL holds
RESTART_AT_FRAMES pages, so the WAL file stays near 16 MiB (SQLite's own default keeps it
near 4 MiB).

Writes that bypass the store's transactions (Django's sessions, the admin's log, a migration, a short
`manage.py` command that exits before its thread's turn) are not counted: the next checkpoint of
any process takes their pages too, SQLite checkpoints when the last connection to a database
closes, and its own checkpoint at WAL_BACKSTOP_PAGES bounds the WAL whatever happens to the
thread.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from urllib.parse import quote

log = logging.getLogger("board.engine.checkpoints")

CHECKPOINT_EVERY = 100  # write transactions of this process
# SQLite's own automatic checkpoint stays on, far above where the thread starts the WAL over
# (taskflow_site.settings.sqlite_options): a backstop for writes this process does not count.
WAL_BACKSTOP_PAGES = 10_000
CHECKPOINT_AFTER = 5.0  # seconds after the first transaction not yet checkpointed
RESTART_AT_FRAMES = 4_000  # pages in the WAL (16 MiB at SQLite's 4 KiB) past which it is started over


class Checkpointer:
    """One per process: the databases with commits not yet checkpointed, and the thread that
    checkpoints them."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._changed = threading.Condition()
        self._pending: dict[str, int] = {}  # database file -> its transactions not yet checkpointed
        self._since: dict[str, float] = {}  # database file -> when the first of them committed
        self._due: set[str] = set()
        self._writers: dict[str, Callable[[], ContextManager]] = {}  # database file -> its writers' locks
        self.checkpoints = 0  # checkpoints run (or tried) so far; tests wait on it
        self.last: dict[str, tuple[int, int, int] | None] = {}  # database file -> its last checkpoint's result
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoints", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def stop(self) -> None:
        """End the thread (tests: a checkpointer of their own); pending work is dropped."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._thread.join(timeout=30)

    def committed(self, path: str, holding_writers: Callable[[], ContextManager]) -> None:
        """A write transaction on the database file `path` has committed; `holding_writers()`
        holds the database's writers' locks of this process (board.engine.stores.sqlite)."""
        with self._changed:
            # The first writer to tell is the database's (bench/claims.py's raw loop, which
            # takes none of the board's locks, tells too, sharing the file).
            self._writers.setdefault(path, holding_writers)
            count = self._pending.get(path, 0) + 1
            self._pending[path] = count
            if count == 1:
                self._since[path] = time.monotonic()
                self._changed.notify_all()  # the thread now has a deadline to wait for
            if count >= CHECKPOINT_EVERY and path not in self._due:
                self._due.add(path)
                self._changed.notify_all()  # all: a test in wait_for must not take the thread's wake-up

    def wait_for(self, checkpoints: int, timeout: float) -> bool:
        """Until at least `checkpoints` have run in all (tests); False after `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self.checkpoints >= checkpoints, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    if self._stopped:
                        return
                    now = time.monotonic()
                    self._due.update(path for path, since in self._since.items() if now - since >= CHECKPOINT_AFTER)
                    if self._due:
                        break
                    deadline = min(self._since.values(), default=None)
                    self._changed.wait(None if deadline is None else deadline + CHECKPOINT_AFTER - now)
                due, self._due = self._due, set()
                for path in due:
                    self._pending.pop(path, None)
                    self._since.pop(path, None)
            results = {path: self._checkpoint_logged(path) for path in due}
            with self._changed:
                self.last.update(results)
                self.checkpoints += len(due)
                self._changed.notify_all()

    def _checkpoint_logged(self, path: str) -> tuple[int, int, int] | None:
        """_checkpoint, its failure logged: the thread must outlive any one checkpoint (SQLite's
        own checkpoint, at WAL_BACKSTOP_PAGES, covers the time until the next one works)."""
        try:
            return self._checkpoint(path)
        except Exception:  # noqa: BLE001
            log.exception("WAL checkpoint of %s failed", path)
            return None

    def _checkpoint(self, path: str) -> tuple[int, int, int] | None:
        """Copy the WAL back: first without any lock, the bulk and its syncs, while the writers
        go on. SQLite starts the WAL over from its beginning only when a writer begins with the
        whole WAL copied back, which the writers' own pages, appended meanwhile, prevent: a
        busy board's WAL would grow without end. So once it holds RESTART_AT_FRAMES pages, a
        second checkpoint runs holding the writers' locks: it copies what they wrote during
        the first (a few hundred pages, but two syncs: about as long as SQLite's own
        checkpoint took, every few checkpoints instead of every one), and the next writer
        starts the WAL over."""
        bulk = checkpoint(path)
        if bulk is None or bulk[1] < RESTART_AT_FRAMES:
            return bulk
        with self._writers[path]():
            return checkpoint(path)


def checkpoint(path: str) -> tuple[int, int, int] | None:
    """A PASSIVE checkpoint of the database file `path`: (busy, frames in the WAL, frames
    copied back), as `PRAGMA wal_checkpoint` says; None when it could not run. A database
    that is gone (a test's, deleted) is not created again (mode=rw)."""
    if not os.path.exists(path):
        return None
    try:
        connection = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=5, isolation_level=None)
        try:
            return connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            connection.close()
    except sqlite3.Error as exc:
        log.warning("WAL checkpoint of %s failed: %s", path, exc)
        return None


_checkpointer: Checkpointer | None = None
_checkpointer_lock = threading.Lock()


def checkpointer() -> Checkpointer:
    """This process's checkpointer, started on first use (a forked child starts its own: the
    parent's thread did not come with it)."""
    global _checkpointer
    current = _checkpointer
    if current is not None and current.pid == os.getpid() and current.running:
        return current
    with _checkpointer_lock:
        if _checkpointer is None or _checkpointer.pid != os.getpid() or not _checkpointer.running:
            _checkpointer = Checkpointer()
        return _checkpointer
