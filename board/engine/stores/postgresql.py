"""The PostgreSQL store: the production one. The database's clock for every process, row locks
skipped by claimers, advisory locks, and the hot verbs as one statement each.

"Now" is `statement_timestamp()`, the time the current statement started: one value for all a
statement writes and compares (an expiry is exactly its write's time + the TTL), fresh for every
statement. Not `now()` (the transaction's start: renew could extend a lease that had expired
meanwhile) nor `clock_timestamp()` (it changes within a statement). The ORM path reads it once
per write transaction, and its compare-and-swap pins the version. Why, measured: docs/stores.md.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Q
from django.db.models.functions import Now

from board.engine.capabilities import PREFER_WINDOW, as_json
from board.engine.limits import AGING_SECONDS
from board.engine.scopes import as_like
from board.engine.stores.base import DirectCommitHooks, Store, in_statements
from board.engine.stores.statements import (
    LIMIT_FILLED,
    COLUMNS,
    CONCURRENCY_KEY,
    FAIRNESS_KEY,
    open_for_claims,
    QUEUE,
    QUEUE_SHARD,
    RATE_KEY,
    RESOURCE,
    RESOURCE_FREE,
    TASK_RESOURCE,
    EVENT,
    EVENT_COLUMNS,
    KEY,
    KEY_LOOKUP,
    LEASE_EXPIRES_AT,
    NOT_BEFORE,
    T_COLUMNS,
    TASK,
    Statements,
    Written,
    key_from_row,
    mode,
)

NOW = "statement_timestamp()"
M_COLUMNS = ", ".join(f"m.{column}" for column in COLUMNS.split(", "))
_KEY_LOOKUP = KEY_LOOKUP.format(now=NOW)


class PostgresStore(DirectCommitHooks, Store):
    speaks_sql = True
    joins_cheaply = True
    json_search = "containment"
    epoch_of_column = "extract(epoch from {column})::double precision"
    # ids_follow_commit_order stays False: a sequence hands ids out at insert time, and
    # transactions commit in any order (board/live/outbox.py keeps holes for that).
    has_own_clock = True
    # Claims and completions of a limited queue run side by side: each holds the shard it wrote
    # until its commit (the WAL flush), so one row would make them take turns (docs/stores.md).
    queue_shards = 8
    skips_locked_rows = True

    def __init__(self, using: str):
        super().__init__(using)
        if mode() == "auto":
            self.statements = PostgresStatements(self)

    def now(self) -> datetime:
        """The database server's clock (in the connection's time zone)."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {NOW}")
            return cursor.fetchone()[0]

    def now_in_query(self) -> Any:
        # Django's Now() is statement_timestamp() on PostgreSQL: no round trip of its own.
        return Now()

    @contextmanager
    def _read_transaction(self, *, give_way: bool = False) -> Iterator[None]:
        # REPEATABLE READ, READ ONLY: one snapshot for every query; MVCC readers take no locks.
        with transaction.atomic(using=self.using):
            with self.connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if give_way:  # well under deadlock_timeout (1 s): this read fails, not the other
                    cursor.execute("SET LOCAL lock_timeout = '200ms'")
                # These reads scan the whole board: PostgreSQL's JIT then compiles for over a
                # second (measured at 100,000 tasks) to save milliseconds.
                cursor.execute("SET LOCAL jit = off")
            yield

    def serialise_on(self, key: str) -> None:
        """A transaction-level advisory lock on the key (released at commit or rollback)."""
        lock = int.from_bytes(bytes.fromhex(key[:16]), "big", signed=True)
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock])

    def hold_off_task_writers(self) -> None:
        """SHARE ROW EXCLUSIVE on the task table: it waits for every transaction holding ROW
        EXCLUSIVE (any that wrote a task) and keeps new writers waiting; readers go on. A writer
        kept waiting takes its statement's snapshot after the lock (READ COMMITTED), so it sees
        what this transaction committed."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {TASK} IN SHARE ROW EXCLUSIVE MODE")

    def lost_a_lock_race(self, exc: BaseException) -> bool:
        """A deadlock (40P01) or a serialization failure (40001): PostgreSQL rolled the whole
        transaction back. Moves sharing a transaction (a completion and the next claim, a batch)
        lock queue and key rows in the order of their tasks, which two such transactions may
        cross; the deadlock detector then ends one of them (after deadlock_timeout, 1 s)."""
        return getattr(getattr(exc, "__cause__", None), "sqlstate", None) in ("40P01", "40001")

    def transactions_open_before(self, moment: datetime) -> int:
        """pg_stat_activity (the sessions of other roles show no start time and are not counted:
        the board's own connections share one role)."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND xact_start < %s", [moment])
            return cursor.fetchone()[0]

    def check_references_now(self) -> None:
        # Django's foreign keys are DEFERRABLE INITIALLY DEFERRED: checked (a key-share lock on
        # each referenced row) at COMMIT unless asked before. SET CONSTRAINTS ... IMMEDIATE checks
        # what is pending at once; DEFERRED again for the rest of the transaction.
        self.connection.check_constraints()

    def takeable(self, rows, capabilities: tuple[str, ...]):
        """Store.takeable in the query: `requires` contained in the claimer's labels (jsonb <@,
        as the claim statement's)."""
        if not capabilities:
            return rows.filter(has_requires=False)
        return rows.filter(Q(requires__isnull=True) | Q(requires__contained_by=list(capabilities)))

    def find_live_key(self, key_hash: str):
        with self.connection.cursor() as cursor:
            cursor.execute(_KEY_LOOKUP, (key_hash,))
            found = cursor.fetchone()
        return None if found is None else key_from_row(self.using, found)


# ---------------------------------------------------------------------------------------------
# The hot statements. Parameters are named. Each verb is one statement: the UPDATE (the CAS) and the
# history INSERT fed by its RETURNING, in one WITH. Under READ COMMITTED a row another
# transaction has just changed is re-checked against the WHERE after that transaction ends, so
# the guards hold on the row as it is when written. "Now" is the database's
# statement_timestamp() (PostgresStore.now): one value for the whole statement, so the expiry is
# exactly the write's time + the TTL and the history row's time is the task's updated_at.

# The statement's time in Unix seconds: what a queue's rate shards' open_at is compared with and moved
# from (board.engine.flow).
PG_NOW_EPOCH = "extract(epoch from statement_timestamp())::double precision"

# The caller's agent key, when the verb is given one to check (as in stores.sqlite).
_KEY_IS_LIVE = (f"(%(key_hash)s::text IS NULL OR EXISTS (SELECT 1 FROM {KEY} AS k"
                " WHERE k.key_hash = %(key_hash)s AND k.name = %(agent)s"
                " AND (k.revoked_at IS NULL OR k.revoked_at > statement_timestamp())))")

# claim_next: QUEUED -> RUNNING. `picked` locks the best ready task (QUEUED, past any backoff,
# its queue and concurrency key open as the rows read: open_for_claims; the line's order,
# claim_rank then id: board.engine.fairness) with
# FOR UPDATE SKIP LOCKED, so concurrent claimers take different tasks instead of queueing on one
# row. Flow control (board.engine.flow): `queue_open` reads the task's queue row (never locked:
# a pause or a change of a limit holds the task writers off, so this statement's snapshot is
# taken after it); `run_shard` and `rate_shard` lock one shard of its limit with room and one of
# its rate open, skipping those other claimers and completions hold (SKIP LOCKED: a row changed
# by a transaction that committed meanwhile is checked again as it now is), so that the claims
# of one queue do not take turns on one row; `key_slot` locks the key row while it still has
# room (a row another claimer holds is waited for, then its WHERE is checked again: READ
# COMMITTED's re-check). The task is `allowed` when each has room (or the queue has no setting,
# no row), and only then are the slots taken and the task moved. A pick refused by a limit that
# filled meanwhile (or whose free shards others held) writes nothing and answers its row with
# `picks.n` = 1 and no task: the caller runs it again, and the pick then leaves a full queue
# out. Locks are always taken task, queue, key, as every other move takes them.
# Rate keys: `rate_slot` locks the task's rate key row (after those) only when the key has a rate
# and is open; a key without one is neither locked nor written. `allowed` needs it as it needs
# the others, and `rate_taken` moves the key's next opening one interval past the statement's
# time, as `queue_rate_taken` moves the queue's rate shard. A queue with a budget
# (board.engine.budgets) is locked by `queue_budget`, while its budget is open: a usage report
# that closes it writes that row, so the two are serialised (a claim that waited re-reads it
# closed); a fairness key with a budget likewise by `fairness_slot`, after the queue (the order
# a usage report takes them). Resources (board.engine.resources): `resource_slot`
# locks, in name order, the rows of the task's `need`s that are free for them (RESOURCE_FREE,
# checked again on a row another claimer changed); the task is allowed only when all are, and
# `resource_taken` takes them. Name order everywhere (complete's `resource_locked`, the ORM
# path's take): two claimers never wait for each other in a circle.
# The UPDATE is the CAS on the task's id, stage and version. Sets a new lease (owner, token hash,
# expiry = the database's clock + ttl, the claim request or NULL), fence + 1, attempts + 1,
# clears the backoff, version + 1; `history` records it.
_PG_PICKED_COLUMNS = ("t.id, t.version, t.queue, t.concurrency_key, t.rate_key, t.fairness_key,"
                      " t.resources IS NOT NULL AS has_resources")
_PG_PICK = f"""picked AS MATERIALIZED (
    SELECT {_PG_PICKED_COLUMNS}
    FROM {TASK} AS t
    WHERE t.stage = 'QUEUED' AND (t.not_before IS NULL OR t.not_before <= statement_timestamp()){{queue}}
      AND NOT t.has_requires AND {open_for_claims(PG_NOW_EPOCH)} AND {_KEY_IS_LIVE}
    ORDER BY t.claim_rank, t.id
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
)"""
# Capabilities (board.engine.capabilities): a claimer holding none takes only tasks requiring
# none (NOT has_requires: the partial index task_line_unrequired). A claimer holding some (`caps`, a jsonb array, and
# `cap_list`, the same as text[]) takes tasks whose `requires` is contained in them. `head` reads
# the first PREFER_WINDOW of those (no lock: a snapshot), and `picked` locks, skipping others'
# locks, the one whose preferred labels the claimer holds weigh most (one weight = one priority
# level), re-checking that it is still QUEUED (a row claimed meanwhile is re-read as it now is).
# Every head row locked or taken by other claimers: nothing moved while `head` counted some,
# so the caller runs the statement again (LIMIT_FILLED), with a fresh snapshot.
_PG_PICK_CAPABLE = f"""head AS MATERIALIZED (
    SELECT t.id, t.claim_rank, t.prefers
    FROM {TASK} AS t
    WHERE t.stage = 'QUEUED' AND (t.not_before IS NULL OR t.not_before <= statement_timestamp()){{queue}}
      AND (t.requires IS NULL OR t.requires <@ %(caps)s::jsonb)
      AND {open_for_claims(PG_NOW_EPOCH)} AND {_KEY_IS_LIVE}
    ORDER BY t.claim_rank, t.id
    LIMIT {PREFER_WINDOW}
), picked AS MATERIALIZED (
    SELECT {_PG_PICKED_COLUMNS}
    FROM {TASK} AS t JOIN head AS h ON t.id = h.id
    WHERE t.stage = 'QUEUED'
    ORDER BY h.claim_rank - COALESCE((SELECT sum(p.value::numeric) FROM jsonb_each_text(h.prefers) AS p
                                      WHERE p.key = ANY(%(cap_list)s::text[])), 0) * {AGING_SECONDS},
             h.claim_rank, h.id
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
)"""
# A shard of the picked task's queue with room (`_RUN_SHARD`), or open by its rate
# (`_RATE_SHARD`), locked: first one no other transaction holds (SKIP LOCKED), else (a claim that
# holds no shard yet: `waits`) the first, waiting for its holder (READ COMMITTED then checks it
# again as that holder left it, and goes on to the next when it is full). A claim of a batch
# after its first holds a shard already: it never waits, so two batches never wait for each
# other's shards in a circle (it answers LIMIT_FILLED, and the batch ends there).
_RUN_SHARD = f"""(SELECT s.id FROM {QUEUE_SHARD} AS s JOIN queue_open AS o ON s.queue = o.name
     WHERE o.concurrency IS NOT NULL AND s.kind = 'run' AND s.running < s.capacity
     ORDER BY s.number LIMIT 1 FOR UPDATE OF s"""
_RATE_SHARD = f"""(SELECT s.id FROM {QUEUE_SHARD} AS s JOIN queue_open AS o ON s.queue = o.name
     WHERE o.rate_count IS NOT NULL AND s.kind = 'rate' AND (s.open_at IS NULL OR s.open_at <= {PG_NOW_EPOCH})
     ORDER BY s.number LIMIT 1 FOR UPDATE OF s"""
_PG_CLAIM_NEXT = f"""
WITH {{pick}}, queue_open AS MATERIALIZED (
    SELECT q.name, q.concurrency, q.rate_count, q.budget_per FROM {QUEUE} AS q JOIN picked ON q.name = picked.queue
    WHERE NOT q.paused AND (q.concurrency IS NOT NULL OR q.rate_count IS NOT NULL OR q.budget_per IS NOT NULL)
      AND (q.budget_closed_until IS NULL OR q.budget_closed_until <= {PG_NOW_EPOCH})
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_SHARD} AS d WHERE d.queue = q.name AND d.kind = 'debt' AND d.running > 0)
), queue_budget AS MATERIALIZED (
    SELECT q.name FROM {QUEUE} AS q JOIN queue_open AS o ON q.name = o.name
    WHERE o.budget_per IS NOT NULL AND NOT q.paused
      AND (q.budget_closed_until IS NULL OR q.budget_closed_until <= {PG_NOW_EPOCH})
    FOR UPDATE OF q
), run_shard AS MATERIALIZED (
    SELECT s.id, s.number FROM {QUEUE_SHARD} AS s WHERE s.id = COALESCE({_RUN_SHARD} SKIP LOCKED){{wait_run}})
), rate_shard AS MATERIALIZED (
    SELECT COALESCE({_RATE_SHARD} SKIP LOCKED){{wait_rate}}) AS id
), fairness_slot AS MATERIALIZED (
    SELECT f.name FROM {FAIRNESS_KEY} AS f JOIN picked ON f.name = picked.fairness_key
    WHERE f.budget_per IS NOT NULL
      AND (f.budget_closed_until IS NULL OR f.budget_closed_until <= {PG_NOW_EPOCH})
    FOR UPDATE OF f
), key_slot AS MATERIALIZED (
    SELECT k.name FROM {CONCURRENCY_KEY} AS k JOIN picked ON k.name = picked.concurrency_key
    WHERE k.running < k.concurrency
    FOR UPDATE OF k
), rate_slot AS MATERIALIZED (
    SELECT r.name FROM {RATE_KEY} AS r JOIN picked ON r.name = picked.rate_key
    WHERE r.rate_interval IS NOT NULL AND (r.rate_open_at IS NULL OR r.rate_open_at <= {PG_NOW_EPOCH})
    FOR UPDATE OF r
), need AS MATERIALIZED (
    SELECT n.name, n.units FROM {TASK_RESOURCE} AS n JOIN picked ON n.task_id = picked.id
    WHERE picked.has_resources
), resource_slot AS MATERIALIZED (
    SELECT r.name FROM {RESOURCE} AS r JOIN need AS n ON r.name = n.name
    WHERE {RESOURCE_FREE}
    ORDER BY r.name
    FOR UPDATE OF r
), allowed AS MATERIALIZED (
    SELECT picked.* FROM picked
    WHERE (EXISTS (SELECT 1 FROM queue_open AS o
                   WHERE (o.budget_per IS NULL OR EXISTS (SELECT 1 FROM queue_budget))
                     AND (o.concurrency IS NULL OR EXISTS (SELECT 1 FROM run_shard))
                     AND (o.rate_count IS NULL OR EXISTS (SELECT 1 FROM rate_shard WHERE id IS NOT NULL)))
           OR NOT EXISTS (SELECT 1 FROM {QUEUE} AS q WHERE q.name = picked.queue
                          AND (q.paused OR q.concurrency IS NOT NULL OR q.rate_count IS NOT NULL
                               OR q.budget_per IS NOT NULL)))
      AND (picked.fairness_key IS NULL OR EXISTS (SELECT 1 FROM fairness_slot)
           OR NOT EXISTS (SELECT 1 FROM {FAIRNESS_KEY} AS f WHERE f.name = picked.fairness_key
                          AND f.budget_per IS NOT NULL))
      AND (picked.concurrency_key IS NULL OR EXISTS (SELECT 1 FROM key_slot)
           OR NOT EXISTS (SELECT 1 FROM {CONCURRENCY_KEY} AS k WHERE k.name = picked.concurrency_key))
      AND (picked.rate_key IS NULL OR EXISTS (SELECT 1 FROM rate_slot)
           OR NOT EXISTS (SELECT 1 FROM {RATE_KEY} AS r WHERE r.name = picked.rate_key AND r.rate_interval IS NOT NULL))
      AND (NOT picked.has_resources OR (SELECT count(*) FROM resource_slot) = (SELECT count(*) FROM need))
), run_taken AS (
    UPDATE {QUEUE_SHARD} AS s SET running = s.running + 1 FROM run_shard AS r
    WHERE s.id = r.id AND EXISTS (SELECT 1 FROM allowed)
), queue_rate_taken AS (
    UPDATE {QUEUE_SHARD} AS s SET open_at = {PG_NOW_EPOCH} + s.spacing FROM rate_shard AS r
    WHERE s.id = r.id AND EXISTS (SELECT 1 FROM allowed)
), key_taken AS (
    UPDATE {CONCURRENCY_KEY} AS k SET running = k.running + 1 FROM allowed WHERE k.name = allowed.concurrency_key
), rate_taken AS (
    UPDATE {RATE_KEY} AS r SET rate_open_at = {PG_NOW_EPOCH} + r.rate_interval
    FROM allowed WHERE r.name = allowed.rate_key AND r.rate_interval IS NOT NULL
), resource_taken AS (
    UPDATE {RESOURCE} AS r SET held = r.held + n.units, intents = r.intents + (n.units = 0)::int
    FROM need AS n WHERE r.name = n.name AND EXISTS (SELECT 1 FROM allowed)
), moved AS (
    UPDATE {TASK} AS t
    SET stage = 'RUNNING', version = t.version + 1, owner = %(agent)s,
        lease_token_hash = %(token_hash)s, fence = t.fence + 1,
        lease_expires_at = statement_timestamp() + %(ttl)s, claim_request_hash = %(request_hash)s,
        claim_token_seed = %(seed)s, not_before = NULL, attempts = t.attempts + 1,
        slot = (SELECT number FROM run_shard),
        updated_at = statement_timestamp(), stage_changed_at = statement_timestamp()
    FROM allowed
    WHERE t.id = allowed.id AND t.stage = 'QUEUED' AND t.version = allowed.version
    RETURNING {T_COLUMNS}
), history AS (
    INSERT INTO {EVENT} ({EVENT_COLUMNS})
    SELECT id, 'claim', 'QUEUED', 'RUNNING', version, fence, owner, updated_at, NULL FROM moved
)
SELECT {M_COLUMNS}, picks.n FROM (SELECT count(*) AS n FROM {{counted}}) AS picks LEFT JOIN moved AS m ON true
"""
# The queue filters: none, one queue, or a scoped key's (issue 27; board.engine.scopes): the
# key's patterns as LIKE patterns (a text array: `_` escaped, `*` -> `%`), in the pick itself.
_PG_QUEUE_FILTERS = {
    "any": "",
    "queue": " AND queue = %(queue)s",
    "scope": " AND queue LIKE ANY(%(scope)s::text[])",
}
# claim_next's statements by (queue filter, whether the claimer holds capabilities, whether it
# waits for a shard others hold).
PG_CLAIM_NEXT = {
    (kind, capable, waits): _PG_CLAIM_NEXT.format(
        pick=(_PG_PICK_CAPABLE if capable else _PG_PICK).format(queue=queue),
        counted="head" if capable else "picked",
        wait_run=f", {_RUN_SHARD})" if waits else "", wait_rate=f", {_RATE_SHARD})" if waits else "")
    for kind, queue in _PG_QUEUE_FILTERS.items() for capable in (False, True) for waits in (False, True)
}

# renew: RUNNING -> RUNNING. The CAS: still RUNNING, the same lease (token hash), that lease
# still live (expiry after the database's clock as the statement starts), and minted for the
# agent when one is named. Extends the expiry to the database's clock + ttl, keeps token,
# fence and claim request, saves checkpoint/progress when given (NULL keeps them), version + 1;
# progress_changed_at (the progress deadline's clock, board.engine.deadlines) becomes the
# statement's time when a checkpoint is given or the progress given differs from the stored one
# (the SET reads the row as it was); `history` records it (the holder, unchanged, is the actor).
PG_RENEW = f"""
WITH moved AS (
    UPDATE {TASK}
    SET version = version + 1, lease_expires_at = statement_timestamp() + %(ttl)s,
        checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint),
        progress = COALESCE(%(progress)s::double precision, progress),
        progress_changed_at = CASE WHEN %(checkpoint)s::jsonb IS NOT NULL
                                     OR progress IS DISTINCT FROM COALESCE(%(progress)s::double precision, progress)
                                   THEN statement_timestamp() ELSE progress_changed_at END,
        updated_at = statement_timestamp()
    WHERE id = %(id)s AND stage = 'RUNNING' AND lease_token_hash = %(token_hash)s
      AND lease_expires_at > statement_timestamp() AND owner = COALESCE(%(agent)s, owner)
      AND {_KEY_IS_LIVE}
    RETURNING {COLUMNS}
), history AS (
    INSERT INTO {EVENT} ({EVENT_COLUMNS})
    SELECT id, 'renew', 'RUNNING', 'RUNNING', version, fence, owner, updated_at, NULL FROM moved
)
SELECT {COLUMNS} FROM moved
"""

# complete: RUNNING -> COMPLETED. `held` locks the task only while it is RUNNING under this
# lease (token hash; the agent when named) and keeps the holder's name for the history, since
# the UPDATE clears it. The UPDATE is the CAS on the same guard: stores the result, ends the
# lease (owner, hash, expiry, claim request cleared; fence kept), version + 1. A lease that
# expired but was not taken over still completes: the token proves nobody else holds the task.
# The task's queue (the shard whose slot it holds, or its debt for a task over a lowered limit:
# `slot_given`) and concurrency key get their slots back (board.engine.flow), and its
# resources theirs (locked in name order first: `resource_locked`); its needs go
# (`needs_forgotten`: every part of one statement reads the rows as they were before it).
_PG_COMPLETE = f"""
WITH held AS MATERIALIZED (
    SELECT id, owner FROM {TASK}
    WHERE id = %(id)s AND stage = 'RUNNING' AND lease_token_hash = %(token_hash)s
      AND owner = COALESCE(%(agent)s, owner) AND {_KEY_IS_LIVE}{{holding_nothing}}
    FOR UPDATE
), moved AS (
    UPDATE {TASK} AS t
    SET stage = 'COMPLETED', version = t.version + 1, owner = '', lease_token_hash = NULL,
        lease_expires_at = NULL, claim_request_hash = NULL, claim_token_seed = NULL,
        result = %(result)s::jsonb, updated_at = statement_timestamp(),
        stage_changed_at = statement_timestamp()
    FROM held
    WHERE t.id = held.id AND t.stage = 'RUNNING' AND t.lease_token_hash = %(token_hash)s
    RETURNING {T_COLUMNS}, held.owner AS held_by
), history AS (
    INSERT INTO {EVENT} ({EVENT_COLUMNS})
    SELECT id, 'complete', 'RUNNING', 'COMPLETED', version, fence, held_by, updated_at, NULL FROM moved
), slot_given AS (
    UPDATE {QUEUE_SHARD} AS s SET running = s.running - 1 FROM moved
    WHERE s.queue = moved.queue AND s.running > 0
      AND (s.kind = 'run' AND s.number = moved.slot OR s.kind = 'debt' AND moved.slot IS NULL)
), key_given AS (
    UPDATE {CONCURRENCY_KEY} AS k SET running = k.running - 1 FROM moved
    WHERE k.name = moved.concurrency_key AND k.running > 0
), resource_locked AS MATERIALIZED (
    SELECT r.name FROM {RESOURCE} AS r JOIN {TASK_RESOURCE} AS n ON r.name = n.name
    JOIN moved ON n.task_id = moved.id AND moved.resources IS NOT NULL
    ORDER BY r.name
    FOR UPDATE OF r
), resource_given AS (
    UPDATE {RESOURCE} AS r SET held = r.held - n.units, intents = r.intents - (n.units = 0)::int
    FROM {TASK_RESOURCE} AS n, moved
    WHERE n.task_id = moved.id AND r.name = n.name AND r.name IN (SELECT name FROM resource_locked)
), needs_forgotten AS (
    DELETE FROM {TASK_RESOURCE} AS n USING moved WHERE n.task_id = moved.id AND moved.resources IS NOT NULL
)
SELECT {COLUMNS} FROM moved
"""
PG_COMPLETE = _PG_COMPLETE.format(holding_nothing="")
# The same, only for a task that holds nothing a completion gives back: no slot (nor a share of a
# debt: its queue has no shard at all, i.e. no limit and no rate), no concurrency key, no
# resource. It writes the task and its history row only, so several of them can share one
# transaction without holding what other transactions wait for (a batch of completions:
# transitions.leases._StatementPath.complete_batch). Judged under the row's lock; a limit set
# meanwhile (flow.change_queue holds off every task writer while it counts) is seen by it.
PG_COMPLETE_HOLDING_NOTHING = _PG_COMPLETE.format(holding_nothing=(
    f"\n      AND slot IS NULL AND concurrency_key IS NULL AND resources IS NULL"
    f"\n      AND NOT EXISTS (SELECT 1 FROM {QUEUE_SHARD} AS s WHERE s.queue = {TASK}.queue)"))


def _cache_the_statements_conversion() -> None:
    """psycopg rewrites a query's %(name)s placeholders into $1, $2... with a regex on every
    execute, unless the query is at most MAX_CACHED_STATEMENT_LENGTH bytes (4096), which it then
    converts once (an LRU of 128). The claim statements are ~10 KB: each claim paid that
    rewrite, and the prepared-statement lookup then hashed a fresh copy of the result. Raised
    past the longest of them (tests/test_hot_path.py checks that a claim's conversion is a
    cache hit). Only the cache's length bound changes: what a query converts to does not."""
    from psycopg import _queries

    longest = max(len(statement.encode())
                  for statement in (*PG_CLAIM_NEXT.values(), PG_RENEW, PG_COMPLETE, PG_COMPLETE_HOLDING_NOTHING))
    _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, longest)


_cache_the_statements_conversion()


class PostgresStatements(Statements):
    # Times come from the database's clock: only what the statements write as constants.
    known_columns = {
        "claim": (NOT_BEFORE,),
        "renew": (),
        "complete": (LEASE_EXPIRES_AT,),
    }

    def __init__(self, store):
        super().__init__(store)
        using = self.using
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
                   scope: tuple[str, ...] | None = None, capabilities: tuple[str, ...] = (),
                   waits: bool = True) -> Written | None:
        params = {"agent": agent, "token_hash": token_hash, "ttl": ttl, "request_hash": request_hash,
                  "seed": seed, "key_hash": key_hash}
        if capabilities:
            params["caps"], params["cap_list"] = as_json(capabilities), list(capabilities)
        if queue is not None:
            kind, params["queue"] = "queue", queue
        elif scope is not None:
            kind, params["scope"] = "scope", [as_like(p) for p in scope]
        else:
            kind = "any"
        row = self._one(PG_CLAIM_NEXT[kind, bool(capabilities), waits], params)
        if row[0] is None:  # no task moved: none ready (picks 0), or a limit filled meanwhile
            return None if row[-1] == 0 else LIMIT_FILLED
        return Written(row[:-1], ((NOT_BEFORE, None),), self._converters["claim"])

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
                 key_hash: str | None = None, holding_nothing: bool = False) -> Written | None:
        connection = connections[self.using]
        row = self._one(PG_COMPLETE_HOLDING_NOTHING if holding_nothing else PG_COMPLETE, {
            "id": task_id, "token_hash": token_hash, "agent": agent, "key_hash": key_hash,
            "result": self._json(self._result_field, result, connection),
        })
        if row is None:
            return None
        return Written(row, ((LEASE_EXPIRES_AT, None),), self._converters["complete"])
