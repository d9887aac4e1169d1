"""The SQLite store: the embedded default. One writer at a time, this process's clock, the hot
verbs as hand-written statements (SQLite >= 3.35 for RETURNING).

SQLite writers queue on locks that wake the next one the moment the current one ends, instead
of SQLite's busy handler (which sleeps 1, 2, 5, 10, ... ms between tries and lets newcomers win):
threads of one process on a process lock held for the whole verb (`verb_gate`), processes on an
exclusive `flock` of `<database>-writers`. How long writers wait and hold it goes to the
observers (`observe_sqlite_writes`: the metrics); the WAL is checkpointed out of the locks
(board.engine.checkpoints). Reads take no lock (WAL). Why, measured: docs/stores.md.
"""
from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from board.engine import checkpoints
from board.engine.capabilities import PREFER_WINDOW, as_json
from board.engine.limits import AGING_SECONDS
from board.engine.scopes import as_glob
from board.engine.stores.base import DirectCommitHooks, Store, in_statements, process_lock
from board.engine.stores.statements import (
    COLUMNS,
    CONCURRENCY_KEY,
    CONCURRENCY_KEY_NAME,
    RATE_KEY,
    RATE_KEY_NAME,
    RESOURCE,
    RESOURCES,
    TASK_RESOURCE,
    open_for_claims,
    QUEUE_NAME,
    QUEUE_SHARD,
    SLOT,
    EVENT,
    EVENT_COLUMNS,
    FENCE,
    ID,
    KEY,
    KEY_LOOKUP,
    LEASE_EXPIRES_AT,
    NOT_BEFORE,
    OWNER,
    STAGE_CHANGED_AT,
    TASK,
    UPDATED_AT,
    VERSION,
    Statements,
    Written,
    key_from_row,
    mode,
)

log = logging.getLogger("board.engine.stores")

MIN_VERSION = (3, 35, 0)  # RETURNING


class SQLiteStore(DirectCommitHooks, Store):
    speaks_sql = True
    joins_cheaply = True
    json_search = "text"
    # julianday() of Django's stored text (naive UTC), in days since -4713: to the millisecond.
    epoch_of_column = "(julianday({column}) - 2440587.5) * 86400.0"
    # One writer commits before the next takes an id.
    ids_follow_commit_order = True

    def __init__(self, using: str):
        super().__init__(using)
        if mode() == "auto" and sqlite3.sqlite_version_info >= MIN_VERSION:
            self.statements = SQLiteStatements(self)

    # An embedded SQLite store lives on one machine: every process that opens its file reads
    # the same clock, this process's (Store.now).

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        self._refuse_in_read()
        connection = self.connection
        # Inside a caller's own transaction the write lock is already held (IMMEDIATE): taking
        # the locks now could wait on a thread that waits on us.
        if connection.in_atomic_block:
            with transaction.atomic(using=self.using):
                yield
            return
        _refuse_inside_a_driver_transaction(connection)
        with _sqlite_writers_lock(self.using, transaction.atomic(using=self.using)):
            yield

    @contextmanager
    def statement_transaction(self) -> Iterator[None]:
        """A write transaction for hand-written statements only: the writers' locks of
        write_transaction, with BEGIN IMMEDIATE and COMMIT sent on the driver's connection
        instead of through Django's `transaction.atomic`, whose bookkeeping (autocommit switched
        off and on again, savepoint ids, on-commit hooks) cost about as much as the claim's own
        statement. Django's connection stays in autocommit all along, so nothing inside may use
        Django's transaction API (`atomic`, `on_commit`: the hot verbs tell their commit after
        the block). Inside a caller's transaction it is write_transaction."""
        connection = self.connection
        if not connection.in_atomic_block:
            connection.ensure_connection()
            _refuse_inside_a_driver_transaction(connection)
            if connection.autocommit:  # else someone turned it off: Django's way, then
                with _sqlite_writers_lock(self.using, _driver_transaction(connection)):
                    yield
                return
        with self.write_transaction():
            yield

    @contextmanager
    def _read_transaction(self, *, give_way: bool = False) -> Iterator[None]:
        # BEGIN DEFERRED: the settings' IMMEDIATE would take the write lock and queue behind
        # writers; a deferred transaction that only reads takes no lock but the WAL snapshot.
        connection = self.connection
        connection.ensure_connection()  # connecting resets transaction_mode from the settings
        with ExitStack() as stack:
            mode_ = connection.transaction_mode
            connection.transaction_mode = "DEFERRED"
            try:
                stack.enter_context(transaction.atomic(using=self.using))
            finally:
                connection.transaction_mode = mode_
            yield

    def verb_gate(self):
        """The whole verb runs holding this process's writer lock (the one write_transaction
        takes first; reentrant), not only its transaction: threads of a process gain nothing by
        running verbs side by side on one writer, and the Python around a verb's transaction
        only competes for the GIL with the thread that holds the lock (bench/claims.py, 8
        threads: 1,100 / 1,149 cycles/s without it, 1,502 / 1,533 with it). Other processes
        wait only for the transaction (the flock). Inside a caller's transaction: nothing."""
        if self.connection.in_atomic_block:
            return nullcontext()
        return process_lock(self.using)

    def takeable(self, rows, capabilities: tuple[str, ...]):
        """Store.takeable in the query: every required label among the claimer's (json_each,
        as the claim statement's _SQLITE_FITS: _lacks_none)."""
        if not capabilities:
            return rows.filter(has_requires=False)
        fits = RawSQL(_lacks_none(f'"{TASK}"."requires"', "SELECT value FROM json_each(%s)"),
                      (as_json(capabilities),), output_field=BooleanField())
        return rows.filter(Q(requires__isnull=True) | Q(fits))

    def find_live_key(self, key_hash: str):
        connection = self.connection
        with connection.cursor() as cursor:
            cursor.execute(_KEY_LOOKUP, (key_hash, connection.ops.adapt_datetimefield_value(timezone.now())))
            found = cursor.fetchone()
        return None if found is None else key_from_row(self.using, found)


_KEY_LOOKUP = KEY_LOOKUP.format(now="%s")


# ---------------------------------------------------------------------------------------------
# The hot statements. Parameters are positional (%s, as Django's cursor takes them). Every statement runs
# inside statement_transaction: BEGIN IMMEDIATE holds the database's only write lock, so the WHERE
# of each UPDATE and the row it changes are the same row state.

# The caller's agent key, when the verb is given one to check (key_hash: see
# board.agent_keys.authenticate_deferred): the move matches only while a live key with this
# hash and this agent's name exists, checked by the move's own statement, so a key revoked (or
# deleted) before the move is refused by it without a separate lookup. NULL: no key to check.
# A key is live while its end (revoked_at) is unset or ahead: a rotated key's end, set ahead of
# time, is honoured by the move from that moment (board.agent_keys).
# Params: key_hash, key_hash, agent, now.
_KEY_IS_LIVE = (f"(? IS NULL OR EXISTS (SELECT 1 FROM {KEY} WHERE key_hash = ? AND name = ?"
                " AND (revoked_at IS NULL OR revoked_at > ?)))").replace("?", "%s")

# claim_next: QUEUED -> RUNNING. The inner SELECT picks the best ready task (QUEUED, past any
# retry backoff; lowest claim_rank, then id, as selectors.ready_tasks orders them: the line of
# board.engine.fairness)
# and the outer WHERE is the CAS on that task's (id, version) and stage. Sets a new lease (owner,
# token hash, expiry, and the claim request when there is one, else NULL), raises fence and
# attempts by one, clears the backoff, version + 1. Flow control: the pick leaves out tasks whose
# queue is paused, full or waiting for its rate, or whose concurrency key is full
# (open_for_claims); the claimed task's slots are then taken by SQLITE_TAKE_SLOTS in the same
# transaction, under the only write lock, so the rows the pick read are the rows it updates.
# A rate key's rate likewise: left out of the pick, its opening taken by SQLITE_TAKE_RATE_KEY.
# A task's resources likewise: left out while one is not free, taken by SQLITE_TAKE_RESOURCES.
# Params: agent, token_hash, lease_expires_at, claim_request_hash, claim_token_seed, updated_at,
# stage_changed_at, now (the backoff bound) [, queue], now in Unix seconds four times (the bounds of the
# queue's rate and budget, of the rate key's rate, of the fairness key's budget),
# then the key check's (key_hash, key_hash, agent, now).
# Capabilities (board.engine.capabilities): a claimer without any takes only tasks requiring
# none (NOT has_requires: the partial index task_line_unrequired, named with INDEXED BY when no
# queue is named, so that requiring tasks ahead in line cost it nothing; a named queue's line,
# task_line_in_queue, holds both); a claimer with some (`caps`, the statement's first param as a JSON array) takes tasks
# whose every required label is among them, and re-ranks the first PREFER_WINDOW of those by
# the labels they prefer that it holds (one weight = one priority level, AGING_SECONDS).
_SQLITE_CAPS = "WITH caps(label) AS (SELECT value FROM json_each(%s))"
def _lacks_none(requires: str, labels: str) -> str:
    """SQL: no label of the JSON array `requires` is missing from the labels `labels` selects
    (the claim statement's pick, and SQLiteStore.takeable's filter)."""
    return f"NOT EXISTS (SELECT 1 FROM json_each({requires}) AS need WHERE need.value NOT IN ({labels}))"


_SQLITE_FITS = f" AND (t.requires IS NULL OR {_lacks_none('t.requires', 'SELECT label FROM caps')})"
_SQLITE_PICK = f"""SELECT id, version FROM {TASK} AS t{{indexed}}
        WHERE stage = 'QUEUED' AND (not_before IS NULL OR not_before <= %s){{queue}} AND NOT t.has_requires
          AND {open_for_claims("%s")}
        ORDER BY claim_rank, id
        LIMIT 1"""
_SQLITE_PICK_CAPABLE = f"""SELECT id, version FROM (
          SELECT id, version, claim_rank, prefers FROM {TASK} AS t
          WHERE stage = 'QUEUED' AND (not_before IS NULL OR not_before <= %s){{queue}}{_SQLITE_FITS}
            AND {open_for_claims("%s")}
          ORDER BY claim_rank, id
          LIMIT {PREFER_WINDOW}) AS head
        ORDER BY head.claim_rank - COALESCE((SELECT SUM(p.value) FROM json_each(head.prefers) AS p
                                            WHERE p.key IN (SELECT label FROM caps)), 0) * {AGING_SECONDS},
                 head.claim_rank, head.id
        LIMIT 1"""
_SQLITE_CLAIM_NEXT = f"""{{caps}}
UPDATE {TASK}
SET stage = 'RUNNING', version = version + 1, owner = %s, lease_token_hash = %s,
    fence = fence + 1, lease_expires_at = %s, claim_request_hash = %s, claim_token_seed = %s,
    not_before = NULL, attempts = attempts + 1, updated_at = %s, stage_changed_at = %s
WHERE (id, version) = (
        {{pick}})
  AND stage = 'QUEUED' AND {_KEY_IS_LIVE}
RETURNING {COLUMNS}
"""
# The queue filters: none, one queue, or a scoped key's (issue 27; board.engine.scopes): only
# tasks whose queue matches one of the key's patterns, in the pick itself. The scope's param is
# the patterns as a JSON array of GLOB patterns (case-sensitive, unlike SQLite's LIKE).
_SQLITE_QUEUE_FILTERS = {
    "any": "",
    "queue": " AND queue = %s",
    "scope": " AND EXISTS (SELECT 1 FROM json_each(%s) AS scope WHERE queue GLOB scope.value)",
}
# claim_next's statements by (queue filter, whether the claimer holds capabilities).
SQLITE_CLAIM_NEXT = {
    (kind, capable): _SQLITE_CLAIM_NEXT.format(
        caps=_SQLITE_CAPS if capable else "",
        pick=(_SQLITE_PICK_CAPABLE if capable else _SQLITE_PICK).format(
            queue=queue, indexed=" INDEXED BY task_line_unrequired" if kind == "any" else ""))
    for kind, queue in _SQLITE_QUEUE_FILTERS.items() for capable in (False, True)
}

# renew: RUNNING -> RUNNING. The WHERE is the CAS: still RUNNING, the same lease (token hash),
# that lease still live (expiry after now: an expired lease is never extended), and, when the
# caller names its agent, minted for that agent (owner = COALESCE(agent, owner)). Extends the
# expiry, keeps token and fence, saves checkpoint/progress when given (NULL keeps them),
# version + 1. progress_changed_at (the progress deadline's clock, board.engine.deadlines) becomes
# now when a checkpoint is given or the progress given differs from the stored one (a SET's
# right-hand sides read the row as it was before the UPDATE).
# Params: lease_expires_at, checkpoint, progress, checkpoint, progress, now, updated_at, id,
# token_hash, now, agent, then the key check's (key_hash, key_hash, agent, now).
SQLITE_RENEW = f"""
UPDATE {TASK}
SET version = version + 1, lease_expires_at = %s, checkpoint = COALESCE(%s, checkpoint),
    progress = COALESCE(%s, progress),
    progress_changed_at = CASE WHEN %s IS NOT NULL OR progress IS NOT COALESCE(%s, progress) THEN %s
                               ELSE progress_changed_at END,
    updated_at = %s
WHERE id = %s AND stage = 'RUNNING' AND lease_token_hash = %s AND lease_expires_at > %s
  AND owner = COALESCE(%s, owner) AND {_KEY_IS_LIVE}
RETURNING {COLUMNS}
"""

# complete, step 1 of 2: the history row, written from the task as it is, only where the CAS
# of step 2 will hold (RUNNING, this lease's token hash, and the agent when named). The event
# needs the holder's name, which step 2 clears, and SQLite's RETURNING shows only new values:
# so the history goes first. Under the write lock, step 2 then matches exactly when this
# inserted a row (checked: otherwise the transaction is rolled back). The caller's key, when
# given, is checked here, so step 2 runs only for a live key.
# Params: at, id, token_hash, agent, then the key check's (key_hash, key_hash, agent, now).
SQLITE_COMPLETE_HISTORY = f"""
INSERT INTO {EVENT} ({EVENT_COLUMNS})
SELECT id, 'complete', 'RUNNING', 'COMPLETED', version + 1, fence, owner, %s, NULL
FROM {TASK}
WHERE id = %s AND stage = 'RUNNING' AND lease_token_hash = %s AND owner = COALESCE(%s, owner)
  AND {_KEY_IS_LIVE}
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
RETURNING {COLUMNS}
"""

# Flow control (board.engine.flow): the claimed task takes a slot of a shard of its queue's limit
# with room (answering its number, which the task keeps: `slot`) and moves a shard of its rate
# that is open (the pick saw both under the same write lock: open_for_claims), and a slot of its
# concurrency key; the completed task gives back its shard's slot (or its share of the queue's
# debt, holding none), and the key's. A queue without a limit (a rate) has no such shard:
# nothing matches. Params: queue [, now (Unix seconds), the claim's time, twice, for the rate],
# concurrency_key.
SQLITE_TAKE_SLOTS = (
    f"UPDATE {QUEUE_SHARD} SET running = running + (kind = 'run'),"
    " open_at = CASE WHEN kind = 'rate' THEN %s + spacing ELSE open_at END"
    f" WHERE id IN (SELECT id FROM {QUEUE_SHARD} WHERE queue = %s AND kind = 'run' AND running < capacity"
    " ORDER BY number LIMIT 1)"
    f" OR id IN (SELECT id FROM {QUEUE_SHARD} WHERE queue = %s AND kind = 'rate'"
    " AND (open_at IS NULL OR open_at <= %s) ORDER BY number LIMIT 1)"
    " RETURNING kind, number",
    f"UPDATE {CONCURRENCY_KEY} SET running = running + 1 WHERE name = %s")
# A rate key's rate (board.engine.flow), as the queue's: the claim moves the key's next opening one
# interval past its own time; a key without a rate is not written. Params: now (Unix seconds), rate_key.
SQLITE_TAKE_RATE_KEY = (f"UPDATE {RATE_KEY} SET rate_open_at = %s + rate_interval"
                        " WHERE name = %s AND rate_interval IS NOT NULL")
SQLITE_GIVE_BACK_SLOTS = (
    f"UPDATE {QUEUE_SHARD} SET running = running - 1 WHERE queue = %s AND kind = 'debt' AND running > 0",
    f"UPDATE {QUEUE_SHARD} SET running = running - 1 WHERE queue = %s AND kind = 'run' AND number = %s"
    " AND running > 0",
    f"UPDATE {CONCURRENCY_KEY} SET running = running - 1 WHERE name = %s AND running > 0")
# The claimed task keeps the number of its shard (NULL: its queue is not counted). Params: slot, id.
SQLITE_SET_SLOT = f"UPDATE {TASK} SET slot = %s WHERE id = %s"

# Resource leases (board.engine.resources): the claimed task takes every node it needs (the pick
# saw each free for its need, under the same write lock), the completed one gives them back.
# Only for a task that declares resources (its row says so). Param: the task's id.
SQLITE_TAKE_RESOURCES = (f"UPDATE {RESOURCE} SET held = held + n.units, intents = intents + (n.units = 0)"
                         f" FROM {TASK_RESOURCE} AS n WHERE n.task_id = %s AND {RESOURCE}.name = n.name")
SQLITE_GIVE_BACK_RESOURCES = (f"UPDATE {RESOURCE} SET held = held - n.units, intents = intents - (n.units = 0)"
                              f" FROM {TASK_RESOURCE} AS n WHERE n.task_id = %s AND {RESOURCE}.name = n.name")
# A COMPLETED task's needs go (resources.forget_needs says why). Param: the task's id.
SQLITE_FORGET_NEEDS = f"DELETE FROM {TASK_RESOURCE} WHERE task_id = %s"

# The history row of a move whose values the caller already has (claim_next, renew).
# Params: task_id, verb, from_stage, to_stage, version, fence, actor, at.
SQLITE_HISTORY = f"INSERT INTO {EVENT} ({EVENT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL)"

# The same statements in sqlite3's own placeholder style, for the driver's cursor (below).
_QMARK = {
    statement: statement.replace("%s", "?")
    for statement in (*SQLITE_CLAIM_NEXT.values(), SQLITE_RENEW,
                      SQLITE_COMPLETE_HISTORY, SQLITE_COMPLETE, SQLITE_HISTORY,
                      *SQLITE_TAKE_SLOTS, *SQLITE_GIVE_BACK_SLOTS, SQLITE_SET_SLOT, SQLITE_TAKE_RATE_KEY,
                      SQLITE_TAKE_RESOURCES, SQLITE_GIVE_BACK_RESOURCES, SQLITE_FORGET_NEEDS)
}


class SQLiteStatements(Statements):
    known_columns = {
        "claim": (LEASE_EXPIRES_AT, NOT_BEFORE, UPDATED_AT, STAGE_CHANGED_AT, SLOT),
        "renew": (LEASE_EXPIRES_AT, UPDATED_AT),
        "complete": (LEASE_EXPIRES_AT, UPDATED_AT, STAGE_CHANGED_AT),
    }
    completions_share_a_transaction = True

    def __init__(self, store):
        super().__init__(store)
        settings_dict = connections[self.using].settings_dict
        # Django stores an aware datetime as str() of it made naive in the connection's time
        # zone; for the UTC datetimes of timezone.now() on a UTC connection (the default), that
        # is str() of it without its tzinfo. Anything else goes through Django's adapter.
        self._utc_connection = settings.USE_TZ and settings_dict.get("TIME_ZONE") in (None, "UTC")

    def _dt(self, value: datetime) -> str:
        if self._utc_connection and value.tzinfo is dt_timezone.utc:
            return str(value.replace(tzinfo=None))
        return self._adapt_dt(value)

    def transaction(self):
        return self.store.statement_transaction()

    def several(self):
        # BEGIN IMMEDIATE ... COMMIT under the writers' locks, as for one statement: several
        # statements in it are one transaction all the same.
        return self.store.statement_transaction()

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

    # SQLite's clock is this process's (one machine: see SQLiteStore.now), read under the write lock.

    def claim_next(self, agent: str, token_hash: str, ttl: timedelta, queue: str | None,
                   request_hash: str | None, seed: str | None, key_hash: str | None = None,
                   scope: tuple[str, ...] | None = None, capabilities: tuple[str, ...] = (),
                   waits: bool = True) -> Written | None:
        connection = connections[self.using]
        now = timezone.now()
        until = now + ttl
        at = self._dt(now)
        params = (agent, token_hash, self._dt(until), request_hash, seed, at, at, at)
        if capabilities:
            params = (as_json(capabilities), *params)
        if queue is not None:
            kind, params = "queue", (*params, queue)
        elif scope is not None:
            kind, params = "scope", (*params, json.dumps([as_glob(p) for p in scope]))
        else:
            kind = "any"
        statement = SQLITE_CLAIM_NEXT[kind, bool(capabilities)]
        params = (*params, *(now.timestamp(),) * 4, key_hash, key_hash, agent, at)
        execute, translated = self._executor(connection)
        with translated:
            rows = execute(statement, params).fetchall()  # to the end: the statement is done
            if not rows:
                return None
            row = rows[0]
            execute(SQLITE_HISTORY, (row[ID], "claim", "QUEUED", "RUNNING", row[VERSION], row[FENCE], agent, at))
            slot = _take_slots(execute, row, now.timestamp())
            if slot != row[SLOT]:
                execute(SQLITE_SET_SLOT, (slot, row[ID]))
            if row[RATE_KEY_NAME] is not None:
                execute(SQLITE_TAKE_RATE_KEY, (now.timestamp(), row[RATE_KEY_NAME]))
            if row[RESOURCES] is not None:
                execute(SQLITE_TAKE_RESOURCES, (row[ID],))
        return Written(row, ((LEASE_EXPIRES_AT, until), (NOT_BEFORE, None), (UPDATED_AT, now),
                             (STAGE_CHANGED_AT, now), (SLOT, slot)), self._converters["claim"])

    def renew(self, task_id: str, token_hash: str, agent: str | None, ttl: timedelta,
              checkpoint: Any, progress: float | None, key_hash: str | None = None) -> Written | None:
        connection = connections[self.using]
        now = timezone.now()
        until = now + ttl
        at = self._dt(now)
        checkpoint = self._json(self._checkpoint_field, checkpoint, connection)
        params = (self._dt(until), checkpoint, progress, checkpoint, progress, at, at,
                  task_id, token_hash, at, agent, key_hash, key_hash, agent, at)
        execute, translated = self._executor(connection)
        with translated:
            rows = execute(SQLITE_RENEW, params).fetchall()
            if not rows:
                return None
            row = rows[0]
            execute(SQLITE_HISTORY, (row[ID], "renew", "RUNNING", "RUNNING", row[VERSION], row[FENCE],
                                     row[OWNER], at))
        return Written(row, ((LEASE_EXPIRES_AT, until), (UPDATED_AT, now)), self._converters["renew"])

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
            _give_back_slots(execute, rows[0])
            if rows[0][RESOURCES] is not None:
                execute(SQLITE_GIVE_BACK_RESOURCES, (task_id,))
                execute(SQLITE_FORGET_NEEDS, (task_id,))
        return Written(rows[0], ((LEASE_EXPIRES_AT, None), (UPDATED_AT, now), (STAGE_CHANGED_AT, now)),
                       self._converters["complete"])


def _take_slots(execute, row: tuple, claimed_at: float) -> int | None:
    """Take the slots of a claimed task's queue (its limit's and its rate's shards) and key;
    answer the number of the limit's shard (None: the queue is not counted)."""
    shards, key = SQLITE_TAKE_SLOTS
    taken = dict(execute(shards, (claimed_at, row[QUEUE_NAME], row[QUEUE_NAME], claimed_at)).fetchall())
    if row[CONCURRENCY_KEY_NAME] is not None:
        execute(key, (row[CONCURRENCY_KEY_NAME],))
    return taken.get("run")


def _give_back_slots(execute, row: tuple) -> None:
    """Give back the slots of a task that left RUNNING: its shard's (its share of the queue's
    debt, holding none) and its key's."""
    debt, run, key = SQLITE_GIVE_BACK_SLOTS
    if row[SLOT] is None:
        execute(debt, (row[QUEUE_NAME],))
    else:
        execute(run, (row[QUEUE_NAME], row[SLOT]))
    if row[CONCURRENCY_KEY_NAME] is not None:
        execute(key, (row[CONCURRENCY_KEY_NAME],))


# ---------------------------------------------------------------------------------------------
# The writers' locks


def _refuse_inside_a_driver_transaction(connection) -> None:
    """A transaction statement_transaction opened is not Django's: a transaction opened inside it
    would send a second BEGIN (and release the writers' flock the outer one holds)."""
    if not connection.in_atomic_block and connection.connection is not None and connection.connection.in_transaction:
        raise RuntimeError("a transaction inside statement_transaction: only its statements may run there")


# Told (waited, held) in seconds after every outermost SQLite write transaction: see the module.
_sqlite_write_observers: list[Callable[[float, float], None]] = []
_timing = threading.local()  # `active` while this thread is inside a timed write transaction


def observe_sqlite_writes(observer: Callable[[float, float], None]) -> None:
    """Call `observer(waited, held)` after every outermost SQLite write transaction: the seconds
    it waited for the writers' locks (other processes'; and this process's threads' unless a
    verb already waited for them at its start, `SQLiteStore.verb_gate`), and the
    seconds it held them (its statements and its commit, or its rollback). Called in the
    writer's thread after the locks are released; it must return at once and never raise."""
    if observer not in _sqlite_write_observers:
        _sqlite_write_observers.append(observer)


_sqlite_files: dict[tuple[int, str], tuple[str | None, int | None]] = {}
_files_lock = threading.Lock()


def _sqlite_file(using: str) -> tuple[str | None, int | None]:
    """This process's (database file, descriptor of its writers' lock file), None for either:
    an in-memory database has no file (only the process lock and SQLite's own apply), an
    unwritable folder no lock file. Opened once per process (a forked child opens its own: a
    shared descriptor would share the lock); the process lock serialises its use among
    threads."""
    key = (os.getpid(), using)
    with _files_lock:
        if key not in _sqlite_files:
            name = str(connections[using].settings_dict["NAME"])
            path = fd = None
            if name and ":memory:" not in name and not name.startswith("file:"):
                path = name
                try:
                    fd = os.open(f"{name}-writers", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                except OSError:
                    fd = None
            _sqlite_files[key] = (path, fd)
        return _sqlite_files[key]


@contextmanager
def _holding_sqlite_writers(using: str, fd: int | None) -> Iterator[None]:
    """This process's writers' lock, then the database's flock (`fd`, when it has one)."""
    with process_lock(using):
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)


@contextmanager
def _driver_transaction(connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on the driver's connection, errors translated as Django's
    are; rolled back when the block (or the commit) raises. When queries are being logged
    (DEBUG, CaptureQueriesContext) or an execute_wrapper is installed, Django's cursor sends
    both, so that they see them."""
    if in_statements(connection):
        def execute(statement: str) -> None:
            with connection.cursor() as cursor:
                cursor.execute(statement)
    else:
        execute = connection.connection.execute
    with connection.wrap_database_errors:
        execute("BEGIN IMMEDIATE")
    try:
        yield
        with connection.wrap_database_errors:
            execute("COMMIT")
    except BaseException:
        _roll_back_driver(connection)
        raise


def _roll_back_driver(connection) -> None:
    """Roll back what _driver_transaction opened. A connection that cannot even roll back is
    closed, as Django's atomic does: the next use opens a fresh one."""
    try:
        if connection.connection.in_transaction:
            connection.connection.execute("ROLLBACK")
    except Exception:  # noqa: BLE001  (the block's own error is the one raised)
        log.exception("rolling back a hot write failed; closing the connection")
        connection.close()


@contextmanager
def _sqlite_writers_lock(using: str, inner) -> Iterator[None]:
    """Run the transaction context `inner` holding SQLite's writers' locks (see the module):
    this process's, then the database's flock. Tells the observers how long it waited and
    held them, and the checkpointer of its commit."""
    # A write opened by an on-commit hook of this one (admitting a completed task's dependents)
    # runs while the locks are still held: it is part of this hold, not a write of its own.
    timed = not getattr(_timing, "active", False)
    asked = time.perf_counter()
    taken = released = 0.0
    path, fd = _sqlite_file(using)
    committed = False
    try:
        _timing.active = True
        try:
            with _holding_sqlite_writers(using, fd), inner:
                # After BEGIN IMMEDIATE: a writer that bypassed the locks (a migration) is waited for.
                taken = time.perf_counter()
                yield
            committed = True
        finally:
            released = time.perf_counter()
    finally:
        if timed:
            _timing.active = False
            if taken and released:
                _tell_sqlite_write(taken - asked, released - taken)
    if committed and path is not None:
        # Its pages are copied back into the database by another thread (board.engine.checkpoints),
        # out of the writers' locks.
        checkpoints.checkpointer().committed(path, functools.partial(_holding_sqlite_writers, using, fd))


def _tell_sqlite_write(waited: float, held: float) -> None:
    for observer in tuple(_sqlite_write_observers):
        try:
            observer(waited, held)
        except Exception:  # a histogram's failure is not the writer's
            log.exception("an SQLite write observer failed: %r", observer)
