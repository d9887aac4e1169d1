"""One store object per database alias: `store(using)`. It carries what differs between the
databases (transactions, clock, row numbering, read strategies, the hot statements); nothing
outside this package tests a vendor (tests/test_stores.py enforces it).

    base.py        Store: the generic store (Django's ORM and transactions), and what all share
    sqlite.py      SQLiteStore: the embedded default (one writer, writers' locks, statements)
    postgresql.py  PostgresStore: the production store (its clock, SKIP LOCKED, statements)
    mongodb/       MongoDBStore and everything MongoDB: backend, settings, apps, migrations
    statements.py  what the SQL stores' hot statements share
    rows.py        how rows are keyed and numbered (asked by board.models)

Why each store does what it does: docs/stores.md.
"""
from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.signals import setting_changed
from django.db import DatabaseError, connections

from board.engine.stores.base import Store, TransactionConflict

__all__ = ["CONFLICT_RETRIES", "Store", "TransactionConflict", "drivers", "retry_conflicts", "store"]

log = logging.getLogger("board.engine.stores")

_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def store(using: str = "default") -> Store:
    """The store of a database alias, chosen once (from the settings: connects to nothing)."""
    try:
        return _stores[using]
    except KeyError:
        pass
    vendor = connections[using].vendor
    kind: type[Store]
    if vendor == "sqlite":
        from board.engine.stores.sqlite import SQLiteStore as kind
    elif vendor == "postgresql":
        from board.engine.stores.postgresql import PostgresStore as kind
    elif vendor == "mongodb":
        from board.engine.stores.mongodb.store import MongoDBStore as kind
    else:
        kind = Store
    made = kind(using)
    with _stores_lock:
        return _stores.setdefault(using, made)


def drivers() -> set[str]:
    """The database drivers the settings' aliases use ("psycopg", "sqlite3", "pymongo"; "" for
    another backend), read from the settings alone: loads no backend and no model, so the
    process's setup may ask before Django starts (tracing instruments psycopg only if used)."""
    from django.conf import settings

    from board.engine.stores.mongodb.settings import ENGINE as MONGODB

    known = {"django.db.backends.postgresql": "psycopg", "django.db.backends.sqlite3": "sqlite3", MONGODB: "pymongo"}
    return {known.get(database.get("ENGINE"), "") for database in settings.DATABASES.values()}


def _forget(*, setting: str, **_kwargs: Any) -> None:
    if setting in ("TASKFLOW", "DATABASES"):
        with _stores_lock:
            _stores.clear()


setting_changed.connect(_forget)


# Attempts of a verb whose transaction keeps conflicting (each conflict means another writer
# committed, so this bounds work, not correctness), and the pause between them: random, so
# that writers which collided do not collide again in step.
CONFLICT_RETRIES = 100
CONFLICT_PAUSE_SECONDS = (0.0005, 0.05)

F = TypeVar("F", bound=Callable)


def retry_conflicts(verb: F) -> F:
    """Run `verb` (which takes `using=`) again when its transaction lost a TransactionConflict
    or a race for row locks (`Store.lost_a_lock_race`), up to CONFLICT_RETRIES times. Inside a caller's transaction the conflict goes up to the
    caller: that transaction is aborted as a whole, so only its outermost verb can run again.
    After the last attempt: errors.VersionConflict, as when a verb keeps losing its
    compare-and-swap (the API answers 409 version_conflict; nothing was written).

    Every write verb wears this decorator, so it is also where a verb enters the store: through
    the store's `verb_gate` (SQLite: one verb at a time per process)."""

    @functools.wraps(verb)
    def run(*args, **kwargs):
        the_store = store(kwargs.get("using", "default"))
        with the_store.verb_gate():
            return _run(the_store, args, kwargs)

    def _run(the_store, args, kwargs):
        for attempt in range(CONFLICT_RETRIES):
            try:
                return verb(*args, **kwargs)
            except DatabaseError as conflict:
                # A lost race for row locks (PostgreSQL's deadlock detector) ended the whole
                # transaction, as a conflict does: any verb may be its victim, a lone claim too
                # (waiting first in line for a queue's row that two moves sharing a transaction
                # lock in opposite orders: tests/test_deadlock_victims.py).
                if not (isinstance(conflict, TransactionConflict) or the_store.lost_a_lock_race(conflict)):
                    raise
                if the_store.in_transaction():
                    raise
                log.debug("%s: transaction conflict (attempt %d): %s", verb.__name__, attempt + 1, conflict)
                last = conflict
            low, high = CONFLICT_PAUSE_SECONDS
            time.sleep(random.uniform(low, min(high, low * 2 ** attempt)))
        from board.engine.errors import VersionConflict

        raise VersionConflict(f"{verb.__name__}: the store kept aborting this move for conflicting writes "
                              f"({CONFLICT_RETRIES} attempts); try again") from last

    return run  # type: ignore[return-value]
