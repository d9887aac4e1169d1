"""Where the engine's "now" comes from: the store's clock, so that lease expiries mean the same
thing to every process that reads them.

- PostgreSQL: the database server's clock. Server processes on several hosts then need no
  synchronised clocks: every expiry is written and compared by one clock. Read as
  `statement_timestamp()`, the time the current statement started: one value for everything a
  statement writes and compares (an expiry is exactly its write's time + the TTL), and fresh
  for every statement. Not `now()`: that is the start of the transaction, which lags when a
  statement runs inside a longer one (a claim with a request id, a caller's transaction), so
  renew could extend a lease that had expired meanwhile. Not `clock_timestamp()`: it changes
  within a statement, giving one move's columns different times.
  board.engine.hot_sql's statements read it themselves; the ORM path reads it once at the start of
  each write transaction (`now`), and its compare-and-swap pins the version, so a row that
  changed after that reading is not written with it.
- MongoDB: the primary's clock, read with the `hello` command (`localTime`, to the millisecond,
  which is what MongoDB stores), also for query filters (`in_query`). Like PostgreSQL's, one
  clock for every server process, on any host.
- SQLite (and any other store): this process's clock. An embedded SQLite store lives on one
  machine: every process that opens its file reads the same clock.
"""
from __future__ import annotations

from datetime import UTC, datetime

from django.db import connections
from django.db.models.functions import Now
from django.utils import timezone

from board.engine import db

POSTGRES_NOW = "statement_timestamp()"


def in_query(using: str = "default") -> datetime | Now:
    """"Now" for an ORM filter, read by the query itself where the clock is the database's:
    Django's Now() is statement_timestamp() on PostgreSQL (no round trip of its own). On
    MongoDB, the primary's clock read first (`now`): Now() would be `$$NOW`, which the test
    server (SecantusDB 0.7.0b3) compares wrongly in `$expr` ($gt of a later date and $$NOW is
    false), so the board does not depend on it."""
    if db.has_own_clock(using) and db.speaks_sql(using):  # PostgreSQL
        return Now()
    return now(using) if db.has_own_clock(using) else timezone.now()


def now(using: str = "default") -> datetime:
    """The store's current time (aware, UTC on SQLite; the connection's time zone on PostgreSQL)."""
    if not db.has_own_clock(using):
        return timezone.now()
    connection = connections[using]
    if not db.speaks_sql(using):  # MongoDB
        connection.ensure_connection()
        # Not part of any transaction (no session): `hello` is not allowed in one.
        return connection.connection.admin.command("hello")["localTime"].replace(tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {POSTGRES_NOW}")
        return cursor.fetchone()[0]
