"""Transactions: the board's writes, and reads that must see one consistent state.

On SQLite only one connection writes at a time (BEGIN IMMEDIATE takes the write lock up front).
A writer that finds the lock taken waits in SQLite's busy handler, which sleeps 1, 2, 5, 10, ...
ms between tries: under contention the lock is handed over slowly, and a writer can keep losing
to newcomers. So SQLite writers queue first on locks that wake the next one the moment the
current one ends:

- threads of one process on a process-local lock per database;
- processes (several server workers, the reaper, a command) on an exclusive `flock` of a file
  beside the database (`<name>-writers`), which the kernel hands to the next waiter at once.

A writer that takes neither (another program, a migration) still meets SQLite's busy timeout,
which stays correct. On other databases this is plain `transaction.atomic`.

Reads never go through any of this (`read_transaction`): on SQLite in WAL mode a reader works on
the snapshot it started with while one writer commits beside it, so a read, however long, neither
waits for a writer nor holds one up. Only a read that needs several queries to agree (check(), the
live board's snapshot) opens a transaction, a DEFERRED one, which takes no lock but the WAL
snapshot; a single query needs none.
"""
from __future__ import annotations

import fcntl
import os
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from django.db import connections, transaction

_sqlite_writers: defaultdict[str, threading.RLock] = defaultdict(threading.RLock)
_lock_files: dict[tuple[int, str], int | None] = {}
_registry_lock = threading.Lock()


def _writer_lock(using: str) -> threading.RLock:
    with _registry_lock:
        return _sqlite_writers[using]


def _lock_file(using: str) -> int | None:
    """This process's descriptor of the database's writers' lock file (None: an in-memory or
    unwritable database, where only the process lock and SQLite's own apply). Opened once per
    process (a forked child opens its own: a shared descriptor would share the lock); the
    process lock serialises its use among threads."""
    key = (os.getpid(), using)
    with _registry_lock:
        if key not in _lock_files:
            name = str(connections[using].settings_dict["NAME"])
            fd = None
            if name and ":memory:" not in name and not name.startswith("file:"):
                try:
                    fd = os.open(f"{name}-writers", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                except OSError:
                    fd = None
            _lock_files[key] = fd
        return _lock_files[key]


_READ_ONLY_FLAG = "board_read_transaction"


@contextmanager
def read_transaction(using: str) -> Iterator[None]:
    """One consistent read of several queries, holding no write lock and waiting for none.

    SQLite: `BEGIN DEFERRED` (the settings' IMMEDIATE would take the write lock and queue behind
    writers; a deferred transaction that only reads never asks for it). PostgreSQL: a REPEATABLE
    READ, READ ONLY transaction (one snapshot for every query; MVCC readers take no row locks),
    without JIT.
    Inside a write transaction the caller already reads a consistent state: nothing is opened.
    Nothing may write inside it (write_transaction refuses)."""
    connection = connections[using]
    if connection.in_atomic_block:
        yield
        return
    with ExitStack() as stack:
        if connection.vendor == "sqlite":
            connection.ensure_connection()  # connecting resets transaction_mode from the settings
            mode = connection.transaction_mode
            connection.transaction_mode = "DEFERRED"
            try:
                stack.enter_context(transaction.atomic(using=using))
            finally:
                connection.transaction_mode = mode
        else:
            stack.enter_context(transaction.atomic(using=using))
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    # These reads scan the whole board: PostgreSQL's JIT then compiles for over
                    # a second (measured at 100,000 tasks) to save milliseconds.
                    cursor.execute("SET LOCAL jit = off")
        setattr(connection, _READ_ONLY_FLAG, True)
        try:
            yield
        finally:
            setattr(connection, _READ_ONLY_FLAG, False)


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    connection = connections[using]
    if getattr(connection, _READ_ONLY_FLAG, False):
        raise RuntimeError("a write inside read_transaction: it would need the write lock it does not hold")
    # Inside a caller's own transaction the write lock is already held (IMMEDIATE): taking the
    # locks now could wait on a thread that waits on us.
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
        return
    with _writer_lock(using):
        fd = _lock_file(using)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with transaction.atomic(using=using):
                yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
