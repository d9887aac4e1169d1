"""Hand-written statements for the engine's hot verbs: claim_next, renew and complete.

The ORM builds each of these moves in Python on every call (most of their cost), reads the row
before the compare-and-swap and needs a third statement for the history. Here each move is ONE
conditional UPDATE with RETURNING: its WHERE is the compare-and-swap (the expected stage, the
lease token's hash for a holder, the live lease for renew), the new version and fence are
computed by the statement from the row it locked, and the row as written comes back to build
the Task the caller gets. The TaskEvent goes in with it, in the same transaction:

- PostgreSQL: one statement. The UPDATE and the history INSERT are one data-modifying WITH,
  so one round trip is the whole move, and outside a caller's transaction (autocommit) it
  commits by itself: no BEGIN, no COMMIT.
- SQLite (>= 3.35 for RETURNING): two statements inside `board.engine.db.statement_transaction`
  (write_transaction's writers' locks, then BEGIN IMMEDIATE sent on the driver's connection),
  so the pair is serialised with every writer.

Nothing is re-read on success. When the statement matches no row, `board.engine.transitions` reloads
the row and raises the same precise error as its ORM path (or tries again when the move has
become legal): only the failure path reads.

Each statement can also check the caller's agent key (`key_hash`; NULL: no check): the move
matches only while a live key with that hash and the agent's name exists. The API passes it
for a key this process verified in the last minute instead of looking the key up again
(board.agent_keys.authenticate_deferred), so a revoke is still refused at the next move.

"Now" is the store's clock (board.engine.clock): on SQLite this process's, read by the store under the
write lock; on PostgreSQL the database's, which the statements read themselves
(`statement_timestamp()`: one reading per statement, when it starts), so that a lease's expiry
is the database's time + the TTL whatever the server process's clock says.

Values are stored exactly as Django's fields store them: datetimes as the backend's
`adapt_datetimefield_value` writes them (SQLite: naive UTC text, produced directly for the UTC
datetimes of timezone.now(); PostgreSQL: aware timestamptz), JSON through the JSONField's own
`get_db_prep_value` (the same encoder). Rows are turned back into a Task through the converters
the ORM itself applies (columns the statement wrote from a Python value take that value), so
an ORM read of a row written here is equal to one written by the ORM path, and the Task a verb
returns is equal to a fresh read (tests/test_hot_path.py, tests/test_contract.py). On PostgreSQL
its times are parsed by psycopg's own (compiled) timestamptz loader when the session's time zone is
Django's, which makes the same datetimes as Django's Python loader, faster.

Statements go to the driver's cursor rather than Django's (see SQLiteStore._executor and
PostgresStore._one for why), inside Django's error translation; whenever Django is logging
queries or has an execute_wrapper installed they go through Django's cursor instead.

Which path runs is chosen per database alias by `store(using)`: these statements for SQLite and
PostgreSQL, None (the ORM path in board.engine.transitions) for any other backend, or everywhere when
settings.TASKFLOW["HOT_PATH"] (env TASKFLOW_HOT_PATH when the setting is absent) is "orm".
"""
from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, NamedTuple

from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections
from django.utils import timezone

from board.engine.db import in_statements, statement_transaction
from board.engine.scopes import as_glob, as_like
from board.models import AgentKey, Task, TaskEvent

TASK = Task._meta.db_table
EVENT = TaskEvent._meta.db_table
_FIELDS = Task._meta.concrete_fields
_ATTNAMES = [f.attname for f in _FIELDS]
# Every column of a task, in the model's field order: what RETURNING gives back.
_COLUMNS = ", ".join(f.column for f in _FIELDS)
_T_COLUMNS = ", ".join(f"t.{f.column}" for f in _FIELDS)
_ID, _VERSION, _FENCE, _OWNER = (_ATTNAMES.index(name) for name in ("id", "version", "fence", "owner"))
_EVENT_COLUMNS = "task_id, verb, from_stage, to_stage, version, fence, actor, at, detail"
KEY = AgentKey._meta.db_table

# The caller's agent key, when the verb is given one to check (key_hash: see
# board.agent_keys.authenticate_deferred): the move matches only while a live key with this
# hash and this agent's name exists, checked by the move's own statement, so a key revoked (or
# deleted) before the move is refused by it without a separate lookup. NULL: no key to check.
# A key is live while its end (revoked_at) is unset or ahead: a rotated key's end, set ahead of
# time, is honoured by the move from that moment (board.agent_keys).
# SQLite params: key_hash, key_hash, agent, now.
_SQLITE_KEY_IS_LIVE = (f"(? IS NULL OR EXISTS (SELECT 1 FROM {KEY} WHERE key_hash = ? AND name = ?"
                       " AND (revoked_at IS NULL OR revoked_at > ?)))").replace("?", "%s")
_PG_KEY_IS_LIVE = (f"(%(key_hash)s::text IS NULL OR EXISTS (SELECT 1 FROM {KEY} AS k"
                   " WHERE k.key_hash = %(key_hash)s AND k.name = %(agent)s"
                   " AND (k.revoked_at IS NULL OR k.revoked_at > statement_timestamp())))")

SQLITE_MIN_VERSION = (3, 35, 0)  # RETURNING
MODES = ("auto", "orm")


# =============================================================================================
# SQLite. Parameters are positional (%s, as Django's cursor takes them). Every statement runs
# inside statement_transaction: BEGIN IMMEDIATE holds the database's only write lock, so the WHERE
# of each UPDATE and the row it changes are the same row state.

# claim_next: QUEUED -> RUNNING. The inner SELECT picks the best ready task (QUEUED, past any
# retry backoff; highest priority, then oldest, then id, as selectors.ready_tasks orders them)
# and the outer WHERE is the CAS on that task's (id, version) and stage. Sets a new lease (owner,
# token hash, expiry, and the claim request when there is one, else NULL), raises fence and
# attempts by one, clears the backoff, version + 1.
# Params: agent, token_hash, lease_expires_at, claim_request_hash, claim_token_seed, updated_at,
# stage_changed_at, now (the backoff bound) [, queue], then the key check's (key_hash, key_hash,
# agent, now).
_SQLITE_CLAIM_NEXT = f"""
UPDATE {TASK}
SET stage = 'RUNNING', version = version + 1, owner = %s, lease_token_hash = %s,
    fence = fence + 1, lease_expires_at = %s, claim_request_hash = %s, claim_token_seed = %s,
    not_before = NULL, attempts = attempts + 1, updated_at = %s, stage_changed_at = %s
WHERE (id, version) = (
        SELECT id, version FROM {TASK}
        WHERE stage = 'QUEUED' AND (not_before IS NULL OR not_before <= %s){{queue}}
        ORDER BY priority DESC, created_at, id
        LIMIT 1)
  AND stage = 'QUEUED' AND {_SQLITE_KEY_IS_LIVE}
RETURNING {_COLUMNS}
"""
SQLITE_CLAIM_NEXT = _SQLITE_CLAIM_NEXT.format(queue="")
SQLITE_CLAIM_NEXT_IN_QUEUE = _SQLITE_CLAIM_NEXT.format(queue=" AND queue = %s")
# A scoped key's claim (issue 27; board.engine.scopes): only tasks whose queue matches one of
# the key's patterns, in the pick itself. The param is the patterns as a JSON array of GLOB
# patterns (case-sensitive, unlike SQLite's LIKE).
SQLITE_CLAIM_NEXT_IN_SCOPE = _SQLITE_CLAIM_NEXT.format(
    queue=" AND EXISTS (SELECT 1 FROM json_each(%s) AS scope WHERE queue GLOB scope.value)")

# renew: RUNNING -> RUNNING. The WHERE is the CAS: still RUNNING, the same lease (token hash),
# that lease still live (expiry after now: an expired lease is never extended), and, when the
# caller names its agent, minted for that agent (owner = COALESCE(agent, owner)). Extends the
# expiry, keeps token and fence, saves checkpoint/progress when given (NULL keeps them),
# version + 1.
# Params: lease_expires_at, checkpoint, progress, updated_at, id, token_hash, now, agent, then
# the key check's (key_hash, key_hash, agent, now).
SQLITE_RENEW = f"""
UPDATE {TASK}
SET version = version + 1, lease_expires_at = %s, checkpoint = COALESCE(%s, checkpoint),
    progress = COALESCE(%s, progress), updated_at = %s
WHERE id = %s AND stage = 'RUNNING' AND lease_token_hash = %s AND lease_expires_at > %s
  AND owner = COALESCE(%s, owner) AND {_SQLITE_KEY_IS_LIVE}
RETURNING {_COLUMNS}
"""

# complete, step 1 of 2: the history row, written from the task as it is, only where the CAS
# of step 2 will hold (RUNNING, this lease's token hash, and the agent when named). The event
# needs the holder's name, which step 2 clears, and SQLite's RETURNING shows only new values:
# so the history goes first. Under the write lock, step 2 then matches exactly when this
# inserted a row (checked: otherwise the transaction is rolled back). The caller's key, when
# given, is checked here, so step 2 runs only for a live key.
# Params: at, id, token_hash, agent, then the key check's (key_hash, key_hash, agent, now).
SQLITE_COMPLETE_HISTORY = f"""
INSERT INTO {EVENT} ({_EVENT_COLUMNS})
SELECT id, 'complete', 'RUNNING', 'COMPLETED', version + 1, fence, owner, %s, NULL
FROM {TASK}
WHERE id = %s AND stage = 'RUNNING' AND lease_token_hash = %s AND owner = COALESCE(%s, owner)
  AND {_SQLITE_KEY_IS_LIVE}
"""

# complete, step 2 of 2: RUNNING -> COMPLETED. The CAS: still RUNNING with this lease's token
# hash (a lease that expired but was not taken over still completes: the token proves nobody
# else holds the task). Stores the result, ends the lease (owner, hash, expiry, claim request
# cleared; fence kept), version + 1.
# Params: result, updated_at, stage_changed_at, id, token_hash.
SQLITE_COMPLETE = f"""
UPDATE {TASK}
SET stage = 'COMPLETED', version = version + 1, owner = '', lease_token_hash = NULL,
    lease_expires_at = NULL, claim_request_hash = NULL, claim_token_seed = NULL, result = %s,
    updated_at = %s, stage_changed_at = %s
WHERE id = %s AND stage = 'RUNNING' AND lease_token_hash = %s
RETURNING {_COLUMNS}
"""

# The history row of a move whose values the caller already has (claim_next, renew).
# Params: task_id, verb, from_stage, to_stage, version, fence, actor, at.
SQLITE_HISTORY = f"INSERT INTO {EVENT} ({_EVENT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL)"

# The same statements in sqlite3's own placeholder style, for the driver's cursor (below).
_QMARK = {
    statement: statement.replace("%s", "?")
    for statement in (SQLITE_CLAIM_NEXT, SQLITE_CLAIM_NEXT_IN_QUEUE, SQLITE_CLAIM_NEXT_IN_SCOPE, SQLITE_RENEW,
                      SQLITE_COMPLETE_HISTORY, SQLITE_COMPLETE, SQLITE_HISTORY)
}


# =============================================================================================
# PostgreSQL. Parameters are named. Each verb is one statement: the UPDATE (the CAS) and the
# history INSERT fed by its RETURNING, in one WITH. Under READ COMMITTED a row another
# transaction has just changed is re-checked against the WHERE after that transaction ends, so
# the guards hold on the row as it is when written. "Now" is the database's
# statement_timestamp() (board.engine.clock): one value for the whole statement, so the expiry is
# exactly the write's time + the TTL and the history row's time is the task's updated_at.

# claim_next: QUEUED -> RUNNING. `picked` locks the best ready task (QUEUED, past any backoff;
# priority, age, id) with FOR UPDATE SKIP LOCKED, so concurrent claimers take different tasks
# instead of queueing on one row; the UPDATE is the CAS on that task's id, stage and version.
# Sets a new lease (owner, token hash, expiry = the database's clock + ttl, the claim request
# or NULL), fence + 1, attempts + 1, clears the backoff, version + 1; `history` records it.
_PG_CLAIM_NEXT = f"""
WITH picked AS MATERIALIZED (
    SELECT id, version FROM {TASK}
    WHERE stage = 'QUEUED' AND (not_before IS NULL OR not_before <= statement_timestamp()){{queue}}
      AND {_PG_KEY_IS_LIVE}
    ORDER BY priority DESC, created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE {TASK} AS t
    SET stage = 'RUNNING', version = t.version + 1, owner = %(agent)s,
        lease_token_hash = %(token_hash)s, fence = t.fence + 1,
        lease_expires_at = statement_timestamp() + %(ttl)s, claim_request_hash = %(request_hash)s,
        claim_token_seed = %(seed)s, not_before = NULL, attempts = t.attempts + 1,
        updated_at = statement_timestamp(), stage_changed_at = statement_timestamp()
    FROM picked
    WHERE t.id = picked.id AND t.stage = 'QUEUED' AND t.version = picked.version
    RETURNING {_T_COLUMNS}
), history AS (
    INSERT INTO {EVENT} ({_EVENT_COLUMNS})
    SELECT id, 'claim', 'QUEUED', 'RUNNING', version, fence, owner, updated_at, NULL FROM moved
)
SELECT {_COLUMNS} FROM moved
"""
PG_CLAIM_NEXT = _PG_CLAIM_NEXT.format(queue="")
PG_CLAIM_NEXT_IN_QUEUE = _PG_CLAIM_NEXT.format(queue=" AND queue = %(queue)s")
# A scoped key's claim (issue 27; board.engine.scopes): the key's patterns as LIKE patterns (a
# text array: `_` escaped, `*` -> `%`), in the pick itself.
PG_CLAIM_NEXT_IN_SCOPE = _PG_CLAIM_NEXT.format(queue=" AND queue LIKE ANY(%(scope)s::text[])")

# renew: RUNNING -> RUNNING. The CAS: still RUNNING, the same lease (token hash), that lease
# still live (expiry after the database's clock as the statement starts), and minted for the
# agent when one is named. Extends the expiry to the database's clock + ttl, keeps token,
# fence and claim request, saves checkpoint/progress when given (NULL keeps them), version + 1;
# `history` records it (the holder, unchanged, is the actor).
PG_RENEW = f"""
WITH moved AS (
    UPDATE {TASK}
    SET version = version + 1, lease_expires_at = statement_timestamp() + %(ttl)s,
        checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint),
        progress = COALESCE(%(progress)s::double precision, progress), updated_at = statement_timestamp()
    WHERE id = %(id)s AND stage = 'RUNNING' AND lease_token_hash = %(token_hash)s
      AND lease_expires_at > statement_timestamp() AND owner = COALESCE(%(agent)s, owner)
      AND {_PG_KEY_IS_LIVE}
    RETURNING {_COLUMNS}
), history AS (
    INSERT INTO {EVENT} ({_EVENT_COLUMNS})
    SELECT id, 'renew', 'RUNNING', 'RUNNING', version, fence, owner, updated_at, NULL FROM moved
)
SELECT {_COLUMNS} FROM moved
"""

# complete: RUNNING -> COMPLETED. `held` locks the task only while it is RUNNING under this
# lease (token hash; the agent when named) and keeps the holder's name for the history, since
# the UPDATE clears it. The UPDATE is the CAS on the same guard: stores the result, ends the
# lease (owner, hash, expiry, claim request cleared; fence kept), version + 1. A lease that
# expired but was not taken over still completes: the token proves nobody else holds the task.
PG_COMPLETE = f"""
WITH held AS MATERIALIZED (
    SELECT id, owner FROM {TASK}
    WHERE id = %(id)s AND stage = 'RUNNING' AND lease_token_hash = %(token_hash)s
      AND owner = COALESCE(%(agent)s, owner) AND {_PG_KEY_IS_LIVE}
    FOR UPDATE
), moved AS (
    UPDATE {TASK} AS t
    SET stage = 'COMPLETED', version = t.version + 1, owner = '', lease_token_hash = NULL,
        lease_expires_at = NULL, claim_request_hash = NULL, claim_token_seed = NULL,
        result = %(result)s::jsonb, updated_at = statement_timestamp(),
        stage_changed_at = statement_timestamp()
    FROM held
    WHERE t.id = held.id AND t.stage = 'RUNNING' AND t.lease_token_hash = %(token_hash)s
    RETURNING {_T_COLUMNS}, held.owner AS held_by
), history AS (
    INSERT INTO {EVENT} ({_EVENT_COLUMNS})
    SELECT id, 'complete', 'RUNNING', 'COMPLETED', version, fence, held_by, updated_at, NULL FROM moved
)
SELECT {_COLUMNS} FROM moved
"""


# =============================================================================================
# The stores

_LEASE_EXPIRES_AT, _NOT_BEFORE, _UPDATED_AT, _STAGE_CHANGED_AT = (
    _ATTNAMES.index(name) for name in ("lease_expires_at", "not_before", "updated_at", "stage_changed_at"))


class Written(NamedTuple):
    """A task row as a hot statement returned it, with the columns written from Python values
    (`known`: (index, value) pairs) and the converters the other columns need."""

    row: tuple
    known: tuple
    converters: tuple


class HotStore:
    """The hot verbs for one database alias. Each returns what it wrote (`task()` makes it a
    Task), or None when the statement matched no row (nothing was written).

    The Task is built by the caller after the move's transaction: on SQLite that transaction
    holds the process's writer lock, and whatever a holder does in Python delays every thread
    queued behind it."""

    vendor = ""
    # The columns each verb writes from a Python value the store holds: read back, they are
    # equal to it, so the task is built from the value instead of converting the stored form.
    known_columns: dict[str, tuple[int, ...]] = {}

    def __init__(self, using: str):
        self.using = using
        connection = connections[using]
        ops = connection.ops
        self._adapt_dt = ops.adapt_datetimefield_value
        self._result_field = Task._meta.get_field("result")
        self._checkpoint_field = Task._meta.get_field("checkpoint")
        # The converters the ORM applies to each column it reads (SQLite: text -> aware
        # datetime, 0/1 -> bool; JSON text -> value on both), per verb without the columns it
        # knows. Bound to this alias's first connection's operations, which only read settings
        # shared by every connection of the alias.
        converters = []
        for index, field in enumerate(_FIELDS):
            column = field.get_col(TASK)
            funcs = ops.get_db_converters(column) + field.get_db_converters(connection)
            converters += [(index, func, column) for func in funcs]
        self._converters = {
            verb: tuple(c for c in converters if c[0] not in known) for verb, known in self.known_columns.items()
        }

    def transaction(self) -> Any:
        raise NotImplementedError

    def task(self, written: Written) -> Task:
        """The Task a written row stands for, equal to what an ORM read of it builds."""
        connection = connections[self.using]
        values = list(written.row[: len(_FIELDS)])
        for index, value in written.known:
            values[index] = value
        for index, convert, column in written.converters:
            values[index] = convert(values[index], column, connection)
        return Task.from_db(self.using, _ATTNAMES, values)

    def _json(self, field, value: Any, connection) -> Any:
        return None if value is None else field.get_db_prep_value(value, connection)


class SQLiteStore(HotStore):
    vendor = "sqlite"
    known_columns = {
        "claim": (_LEASE_EXPIRES_AT, _NOT_BEFORE, _UPDATED_AT, _STAGE_CHANGED_AT),
        "renew": (_LEASE_EXPIRES_AT, _UPDATED_AT),
        "complete": (_LEASE_EXPIRES_AT, _UPDATED_AT, _STAGE_CHANGED_AT),
    }

    def __init__(self, using: str):
        super().__init__(using)
        settings_dict = connections[using].settings_dict
        # Django stores an aware datetime as str() of it made naive in the connection's time
        # zone; for the UTC datetimes of timezone.now() on a UTC connection (the default), that
        # is str() of it without its tzinfo. Anything else goes through Django's adapter.
        self._utc_connection = settings.USE_TZ and settings_dict.get("TIME_ZONE") in (None, "UTC")

    def _dt(self, value: datetime) -> str:
        if self._utc_connection and value.tzinfo is dt_timezone.utc:
            return str(value.replace(tzinfo=None))
        return self._adapt_dt(value)

    def transaction(self):
        return statement_transaction(self.using)

    @staticmethod
    def _executor(connection):
        """How to run this verb's statements: (execute(statement, params) -> cursor, the
        context that translates driver errors). Django's cursor costs several times the
        statement itself here (placeholders rewritten by a regex on every call, four wrapper
        layers), so the driver's cursor runs them, inside Django's error translation and
        after its broken-transaction check. When queries are being logged (DEBUG,
        CaptureQueriesContext) or an execute_wrapper is installed, Django's cursor runs them,
        so that both still see every statement. Always inside statement_transaction: the
        connection is open and this thread's own."""
        if in_statements(connection):
            cursor = connection.cursor()

            def execute(statement, params):
                cursor.execute(statement, params)
                return cursor

            return execute, nullcontext()
        connection.validate_no_broken_transaction()
        run = connection.connection.execute
        return (lambda statement, params: run(_QMARK[statement], params)), connection.wrap_database_errors

    # SQLite's clock is this process's (one machine: see board.engine.clock), read under the write lock.

    def claim_next(self, agent: str, token_hash: str, ttl: timedelta, queue: str | None,
                   request_hash: str | None, seed: str | None, key_hash: str | None = None,
                   scope: tuple[str, ...] | None = None) -> Written | None:
        connection = connections[self.using]
        now = timezone.now()
        until = now + ttl
        at = self._dt(now)
        params = (agent, token_hash, self._dt(until), request_hash, seed, at, at, at)
        if queue is not None:
            statement, params = SQLITE_CLAIM_NEXT_IN_QUEUE, (*params, queue)
        elif scope is not None:
            statement, params = SQLITE_CLAIM_NEXT_IN_SCOPE, (*params, json.dumps([as_glob(p) for p in scope]))
        else:
            statement = SQLITE_CLAIM_NEXT
        params = (*params, key_hash, key_hash, agent, at)
        execute, translated = self._executor(connection)
        with translated:
            rows = execute(statement, params).fetchall()  # to the end: the statement is done
            if not rows:
                return None
            row = rows[0]
            execute(SQLITE_HISTORY, (row[_ID], "claim", "QUEUED", "RUNNING", row[_VERSION], row[_FENCE], agent, at))
        return Written(row, ((_LEASE_EXPIRES_AT, until), (_NOT_BEFORE, None), (_UPDATED_AT, now),
                             (_STAGE_CHANGED_AT, now)), self._converters["claim"])

    def renew(self, task_id: str, token_hash: str, agent: str | None, ttl: timedelta,
              checkpoint: Any, progress: float | None, key_hash: str | None = None) -> Written | None:
        connection = connections[self.using]
        now = timezone.now()
        until = now + ttl
        at = self._dt(now)
        params = (self._dt(until), self._json(self._checkpoint_field, checkpoint, connection), progress, at,
                  task_id, token_hash, at, agent, key_hash, key_hash, agent, at)
        execute, translated = self._executor(connection)
        with translated:
            rows = execute(SQLITE_RENEW, params).fetchall()
            if not rows:
                return None
            row = rows[0]
            execute(SQLITE_HISTORY, (row[_ID], "renew", "RUNNING", "RUNNING", row[_VERSION], row[_FENCE],
                                     row[_OWNER], at))
        return Written(row, ((_LEASE_EXPIRES_AT, until), (_UPDATED_AT, now)), self._converters["renew"])

    def complete(self, task_id: str, token_hash: str, agent: str | None, result: Any,
                 key_hash: str | None = None) -> Written | None:
        connection = connections[self.using]
        now = timezone.now()
        at = self._dt(now)
        result = self._json(self._result_field, result, connection)
        execute, translated = self._executor(connection)
        with translated:
            history = (at, task_id, token_hash, agent, key_hash, key_hash, agent, at)
            if execute(SQLITE_COMPLETE_HISTORY, history).rowcount != 1:
                return None
            rows = execute(SQLITE_COMPLETE, (result, at, at, task_id, token_hash)).fetchall()
        if not rows:  # cannot happen under the write lock; never leave the history row alone
            raise RuntimeError(f"complete of {task_id}: history written but the task did not match")
        return Written(rows[0], ((_LEASE_EXPIRES_AT, None), (_UPDATED_AT, now), (_STAGE_CHANGED_AT, now)),
                       self._converters["complete"])


class PostgresStore(HotStore):
    vendor = "postgresql"
    # Times come from the database's clock: only what the statements write as constants.
    known_columns = {
        "claim": (_NOT_BEFORE,),
        "renew": (),
        "complete": (_LEASE_EXPIRES_AT,),
    }

    def __init__(self, using: str):
        super().__init__(using)
        import psycopg
        from django.db.backends.postgresql.base import (
            TIMESTAMPTZ_OID,
            register_tzloader,
        )

        self._server_binding_cursor = psycopg.Cursor
        self._tz_loader = (TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT, register_tzloader)
        # psycopg's own timestamptz loader (compiled, with psycopg-binary), from its defaults:
        # Django's connection loader is a Python subclass of psycopg's Python one.
        self._fast_tz_loader = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)
        # Prepared statements live in a server session: only where the sessions are this
        # process's own, i.e. behind Django's pool (the project's default). Without it
        # (DATABASE_POOL=0, e.g. behind PgBouncer in transaction mode) nothing is prepared.
        self._prepare = bool(connections[using].settings_dict.get("OPTIONS", {}).get("pool"))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        # Each hot verb is one statement: outside a caller's transaction it commits by itself
        # (on_commit callbacks then run at once, after that commit); inside one, it joins it.
        yield

    def _one(self, statement: str, params: dict) -> tuple | None:
        """Run one statement; the row it returns, or None. Django's cursors bind parameters
        on the client, and Django turns psycopg's preparing off (prepare_threshold None, for
        PgBouncer), so the server would parse and plan each of these WITHs anew on every
        call. Here a server-binding cursor of the same connection prepares each statement
        once per connection (what a plain psycopg program gets by default), with Django's
        error translation and broken-transaction check. When queries are being logged or an
        execute_wrapper is installed, Django's own cursor runs it, so both still see it."""
        connection = connections[self.using]
        if not self._prepare or in_statements(connection):
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                return cursor.fetchone()
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        driver = connection.connection
        threshold = driver.prepare_threshold
        cursor = self._cursor(connection)
        with connection.wrap_database_errors:
            # psycopg ignores prepare=True while the connection's prepare_threshold is None
            # (Django's setting): turned on for this one call only, so Django's own queries
            # stay unprepared. psycopg records what it prepared on the connection; its
            # rollback() forgets that record and deallocates them on the server, and the
            # server keeps them through anything else the board sends (ROLLBACK TO SAVEPOINT,
            # DDL). Nothing here may send DISCARD ALL or DEALLOCATE through a Django cursor
            # (psycopg would not notice, and the next hot call would name a statement the
            # server no longer has); Django's pool resets no connection that way.
            driver.prepare_threshold = 0 if threshold is None else threshold
            try:
                cursor.execute(statement, params, prepare=True)
            finally:
                driver.prepare_threshold = threshold
            return cursor.fetchone()

    # Where a driver connection keeps its cursor for the hot statements: on the connection
    # itself, so that it goes with it. (A registry keyed by connection would keep every
    # connection the pool ever dropped alive: its cursor refers to it.)
    _KEPT = "_taskflow_hot_cursor"

    def _cursor(self, connection):
        """This driver connection's cursor for the hot statements: made on its first one and
        kept while the connection lives (the pool lends a connection to one thread at a time).
        Making a cursor, its adapters map and its loaders for every statement was about 5% of
        a hot request's CPU. Kept with the zones it reads in: a change of Django's zone for the
        connection, or of the session's, makes a new one."""
        driver = connection.connection
        zones = (connection.timezone, driver.info.timezone)
        kept = getattr(driver, self._KEPT, None)
        if kept is not None and not kept[0].closed and kept[1] == zones:
            return kept[0]
        cursor = self._new_cursor(driver, zones)
        setattr(driver, self._KEPT, (cursor, zones))
        return cursor

    def _new_cursor(self, driver, zones: tuple) -> Any:
        """A server-binding cursor of `driver` reading times in Django's zone, `zones` being
        (Django's zone for the connection, the session's)."""
        cursor = self._server_binding_cursor(driver)
        # As Django's own cursors do: times in the connection's time zone.
        oid, text, register_tzloader = self._tz_loader
        django_zone, session_zone = zones
        if django_zone is session_zone:
            # The session's time zone is Django's (the usual case: UTC both): psycopg's own loader
            # makes the very datetimes Django's would, several times faster.
            cursor.adapters.register_loader(oid, self._fast_tz_loader)
        elif django_zone != driver.adapters.get_loader(oid, text).timezone:
            register_tzloader(django_zone, cursor)
        return cursor

    def claim_next(self, agent: str, token_hash: str, ttl: timedelta, queue: str | None,
                   request_hash: str | None, seed: str | None, key_hash: str | None = None,
                   scope: tuple[str, ...] | None = None) -> Written | None:
        params = {"agent": agent, "token_hash": token_hash, "ttl": ttl, "request_hash": request_hash,
                  "seed": seed, "key_hash": key_hash}
        if queue is not None:
            params["queue"] = queue
            row = self._one(PG_CLAIM_NEXT_IN_QUEUE, params)
        elif scope is not None:
            params["scope"] = [as_like(p) for p in scope]
            row = self._one(PG_CLAIM_NEXT_IN_SCOPE, params)
        else:
            row = self._one(PG_CLAIM_NEXT, params)
        if row is None:
            return None
        return Written(row, ((_NOT_BEFORE, None),), self._converters["claim"])

    def renew(self, task_id: str, token_hash: str, agent: str | None, ttl: timedelta,
              checkpoint: Any, progress: float | None, key_hash: str | None = None) -> Written | None:
        connection = connections[self.using]
        row = self._one(PG_RENEW, {
            "id": task_id, "token_hash": token_hash, "agent": agent, "ttl": ttl, "key_hash": key_hash,
            "checkpoint": self._json(self._checkpoint_field, checkpoint, connection),
            "progress": progress,
        })
        if row is None:
            return None
        return Written(row, (), self._converters["renew"])

    def complete(self, task_id: str, token_hash: str, agent: str | None, result: Any,
                 key_hash: str | None = None) -> Written | None:
        connection = connections[self.using]
        row = self._one(PG_COMPLETE, {
            "id": task_id, "token_hash": token_hash, "agent": agent, "key_hash": key_hash,
            "result": self._json(self._result_field, result, connection),
        })
        if row is None:
            return None
        return Written(row, ((_LEASE_EXPIRES_AT, None),), self._converters["complete"])


# =============================================================================================
# Choosing the path

_stores: dict[str, HotStore | None] = {}


def mode() -> str:
    """"auto" (these statements where the backend has them) or "orm" (the ORM path always)."""
    value = getattr(settings, "TASKFLOW", {}).get("HOT_PATH") or os.environ.get("TASKFLOW_HOT_PATH") or "auto"
    if value not in MODES:
        raise ValueError(f"TASKFLOW HOT_PATH must be one of {', '.join(MODES)}, not {value!r}")
    return value


def store(using: str) -> HotStore | None:
    """The hot statements for this alias, or None: use the ORM path."""
    try:
        return _stores[using]
    except KeyError:
        pass
    found: HotStore | None = None
    if mode() == "auto":
        vendor = connections[using].vendor  # from the settings: connects to nothing
        if vendor == "postgresql":
            found = PostgresStore(using)
        elif vendor == "sqlite" and sqlite3.sqlite_version_info >= SQLITE_MIN_VERSION:
            found = SQLiteStore(using)
    _stores[using] = found
    return found


def _forget(*, setting: str, **_kwargs: Any) -> None:
    if setting in ("TASKFLOW", "DATABASES"):
        _stores.clear()


setting_changed.connect(_forget)
