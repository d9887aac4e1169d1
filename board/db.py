"""Transactions for the board's writes.

On SQLite only one connection writes at a time (BEGIN IMMEDIATE takes the write lock up front).
Threads that wait for it in SQLite's busy handler sleep 1, 2, 5, 10, ... ms between tries, so
under contention they hand the lock over slowly. Threads of one process therefore queue on a
process-local lock per database first and get the write slot the moment it frees; other
processes (the reaper, a second server) still meet SQLite's busy timeout, which stays correct.
On other databases this is plain `transaction.atomic`.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction

_sqlite_writers: defaultdict[str, threading.RLock] = defaultdict(threading.RLock)
_registry_lock = threading.Lock()


def _writer_lock(using: str) -> threading.RLock:
    with _registry_lock:
        return _sqlite_writers[using]


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    connection = connections[using]
    # Inside a caller's own transaction the write lock is already held (IMMEDIATE): taking the
    # process lock now could wait on a thread that waits on us.
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
        return
    with _writer_lock(using), transaction.atomic(using=using):
        yield
