"""The hot verbs (claim_next, renew, complete) as hand-written statements: what the SQL stores
share. Each store's statements and dialect live in its own module (stores/sqlite.py,
stores/postgresql.py); a store without them (MongoDB, the generic one) runs the engine's ORM path.

Each move is ONE conditional UPDATE with RETURNING: its WHERE is the compare-and-swap (the
expected stage, the lease token's hash for a holder, the live lease for renew), the new version
and fence are computed by the statement, the TaskEvent goes in with it in the same transaction,
and nothing is re-read on success. When it matches no row, board.engine.transitions reloads the
row and raises the same precise error as its ORM path. Each statement can also check the
caller's agent key (`key_hash`; NULL: no check). Rows come back through the converters the ORM
applies, so a Task built here equals a fresh ORM read (tests/test_hot_path.py). The reasons,
measured: docs/stores.md.

settings.TASKFLOW["HOT_PATH"] (env TASKFLOW_HOT_PATH when the setting is absent) "orm" turns them
off everywhere (`mode`).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connections
from django.db.models import signals
from django.db.models.base import ModelState

from board.engine.limits import RESOURCE_EXCLUSIVE_UNITS as EXCLUSIVE
from board.models import (
    AgentKey,
    ConcurrencyKey,
    FairnessKey,
    Queue,
    QueueShard,
    RateKey,
    Resource,
    Task,
    TaskEvent,
    TaskResource,
)

TASK = Task._meta.db_table
EVENT = TaskEvent._meta.db_table
KEY = AgentKey._meta.db_table
QUEUE = Queue._meta.db_table
QUEUE_SHARD = QueueShard._meta.db_table
CONCURRENCY_KEY = ConcurrencyKey._meta.db_table
RATE_KEY = RateKey._meta.db_table
FAIRNESS_KEY = FairnessKey._meta.db_table
RESOURCE = Resource._meta.db_table
TASK_RESOURCE = TaskResource._meta.db_table
_FIELDS = Task._meta.concrete_fields
_ATTNAMES = [f.attname for f in _FIELDS]
# Every column of a task, in the model's field order: what RETURNING gives back.
COLUMNS = ", ".join(f.column for f in _FIELDS)
T_COLUMNS = ", ".join(f"t.{f.column}" for f in _FIELDS)
ID, VERSION, FENCE, OWNER = (_ATTNAMES.index(name) for name in ("id", "version", "fence", "owner"))
QUEUE_NAME, CONCURRENCY_KEY_NAME, RATE_KEY_NAME, RESOURCES, SLOT = (
    _ATTNAMES.index(name) for name in ("queue", "concurrency_key", "rate_key", "resources", "slot"))
LEASE_EXPIRES_AT, NOT_BEFORE, UPDATED_AT, STAGE_CHANGED_AT = (
    _ATTNAMES.index(name) for name in ("lease_expires_at", "not_before", "updated_at", "stage_changed_at"))
EVENT_COLUMNS = "task_id, verb, from_stage, to_stage, version, fence, actor, at, detail"

# What a request needs of its agent key (board.agent_keys.authenticate), in the model's field
# order as Model.from_db takes them; the live key with a hash is one index lookup on key_hash.
KEY_LOOKUP_FIELDS = ("id", "name", "is_operator", "last_used_at", "queues", "capabilities")
KEY_LOOKUP = (f"SELECT {', '.join(AgentKey._meta.get_field(f).column for f in KEY_LOOKUP_FIELDS)} "
              f"FROM {KEY} WHERE key_hash = %s AND (revoked_at IS NULL OR revoked_at > {{now}})")

_LAST_USED = AgentKey._meta.get_field("last_used_at").get_col(KEY)


def open_for_claims(now_epoch: str) -> str:
    """Flow control (board.engine.flow), in the pick of claim_next: a task is a candidate only
    when its queue is not paused, has room in a shard of its limit and no debt, a shard of its
    rate open and its budget open
    (board.engine.budgets) (`now_epoch`: the store's
    SQL for the statement's time in Unix seconds), and its concurrency key (if any) below its
    limit, and its rate key (if any) open by its rate, and its fairness key (if any) open by its
    budget, and every resource it declares free for
    its need (RESOURCE_FREE), as the rows read. `t` is the task table's name in the pick."""
    return (f"NOT EXISTS (SELECT 1 FROM {QUEUE} AS q WHERE q.name = t.queue"
            f" AND (q.paused OR q.budget_closed_until > {now_epoch}"
            f" OR q.concurrency IS NOT NULL AND (NOT EXISTS (SELECT 1 FROM {QUEUE_SHARD} AS s"
            " WHERE s.queue = q.name AND s.kind = 'run' AND s.running < s.capacity)"
            f" OR EXISTS (SELECT 1 FROM {QUEUE_SHARD} AS s"
            " WHERE s.queue = q.name AND s.kind = 'debt' AND s.running > 0))"
            f" OR q.rate_count IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {QUEUE_SHARD} AS s"
            f" WHERE s.queue = q.name AND s.kind = 'rate' AND (s.open_at IS NULL OR s.open_at <= {now_epoch}))))"
            f" AND (t.concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM {CONCURRENCY_KEY} AS k"
            " WHERE k.name = t.concurrency_key AND k.running >= k.concurrency))"
            f" AND (t.rate_key IS NULL OR NOT EXISTS (SELECT 1 FROM {RATE_KEY} AS r"
            f" WHERE r.name = t.rate_key AND r.rate_open_at > {now_epoch}))"
            f" AND (t.fairness_key IS NULL OR NOT EXISTS (SELECT 1 FROM {FAIRNESS_KEY} AS f"
            f" WHERE f.name = t.fairness_key AND f.budget_closed_until > {now_epoch}))"
            f" AND (t.resources IS NULL OR NOT EXISTS (SELECT 1 FROM {TASK_RESOURCE} AS n"
            f" JOIN {RESOURCE} AS r ON r.name = n.name WHERE n.task_id = t.id AND NOT ({RESOURCE_FREE})"
            # LIMIT 1 OFFSET 0: run for each candidate the pick walks (an index lookup of its
            # needs), never as one hashed read of every unfinished task's needs, which
            # PostgreSQL's planner chose (it costs the pick's walk at all its ready tasks).
            " LIMIT 1 OFFSET 0))")


# Resource leases (board.engine.resources, whose take() says the same with the ORM): a need `n`
# (units: EXCLUSIVE, shared units, or 0 for an intent on a node above the one held) may take its
# node's row `r` now. An exclusive need's sum can fit only in an empty node (no capacity reaches
# EXCLUSIVE).
RESOURCE_FREE = (f"CASE WHEN n.units = 0 THEN r.held = 0"
                 f" ELSE r.intents = 0 AND r.held + n.units <= CASE WHEN n.units >= {EXCLUSIVE}"
                 f" THEN {EXCLUSIVE} ELSE r.capacity END END")

MODES = ("auto", "orm")


def mode() -> str:
    """"auto" (the statements where the store has them) or "orm" (the ORM path always)."""
    value = getattr(settings, "TASKFLOW", {}).get("HOT_PATH") or os.environ.get("TASKFLOW_HOT_PATH") or "auto"
    if value not in MODES:
        raise ValueError(f"TASKFLOW HOT_PATH must be one of {', '.join(MODES)}, not {value!r}")
    return value

# What claim_next answers when it picked a task but a limit filled before it could take its
# slot (PostgreSQL, where claimers run side by side): nothing was written; run it again.
LIMIT_FILLED: Any = type("LimitFilled", (), {"__repr__": lambda self: "LIMIT_FILLED"})()


class Written(NamedTuple):
    """A task row as a hot statement returned it, with the columns written from Python values
    (`known`: (index, value) pairs) and the converters the other columns need."""

    row: tuple
    known: tuple
    converters: tuple


class Statements:
    """The hot verbs of one database alias as hand-written statements (the SQL stores'). Each
    returns what it wrote (`task()` makes it a Task), or None when the statement matched no row
    (nothing was written).

    The Task is built by the caller after the move's transaction: on SQLite that transaction
    holds the process's writer lock, and whatever a holder does in Python delays every thread
    queued behind it."""

    # The columns each verb writes from a Python value the store holds: read back, they are
    # equal to it, so the task is built from the value instead of converting the stored form.
    known_columns: dict[str, tuple[int, ...]] = {}

    # Whether a batch of completions runs its statements in one transaction (several()): where a
    # transaction of its own costs each statement more than the statement (SQLite's BEGIN
    # IMMEDIATE and COMMIT under the writers' locks). Not where a statement commits by itself
    # (PostgreSQL's autocommit): one transaction would hold the slots of limited queues given
    # back by its first items while its later ones wait for other batches' (deadlocks:
    # tests/test_contract.py's race of 8 batch workers over two limited queues ran 52.6 s so,
    # 12.8 s with a transaction per statement). There, the items whose task holds nothing to give
    # back share one transaction (complete(..., holding_nothing=True), which matches only those:
    # it writes nothing others wait for), and each other item has its own.
    completions_share_a_transaction = False

    def __init__(self, store):
        self.store = store  # the store these statements are the hot verbs of
        self.using = using = store.using
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

    def several(self) -> Any:
        """One transaction for several of these statements (a completion and the next claim, a
        batch of claims: board.engine.transitions.batches); inside a caller's transaction, that
        one. The generic one: the store's write transaction."""
        return self.store.write_transaction()

    def task(self, written: Written) -> Task:
        """The Task a written row stands for, equal to what an ORM read of it builds."""
        connection = connections[self.using]
        values = list(written.row[: len(_FIELDS)])
        for index, value in written.known:
            values[index] = value
        for index, convert, column in written.converters:
            values[index] = convert(values[index], column, connection)
        return task_from_db(self.using, values)

    def _json(self, field, value: Any, connection) -> Any:
        return None if value is None else field.get_db_prep_value(value, connection)


def task_from_db(using: str, values: list) -> Task:
    """`Task.from_db(using, <every field>, values)`, without Model.__init__'s walk of the fields
    and its two signals when nothing listens to them for Task (the hot verbs build one or two
    Tasks per request, each of ~45 fields). The instance is the same:
    its fields' values in its __dict__ (Task has no field with a descriptor of its own), a
    ModelState saying it came from `using`."""
    if signals.pre_init.has_listeners(Task) or signals.post_init.has_listeners(Task):
        return Task.from_db(using, _ATTNAMES, values)
    task = Task.__new__(Task)
    state = ModelState()
    state.adding = False
    state.db = using
    attributes = task.__dict__
    attributes["_state"] = state
    attributes.update(zip(_ATTNAMES, values))
    return task


def key_from_row(using: str, found: tuple) -> AgentKey:
    """The AgentKey a KEY_LOOKUP row stands for, its values as the ORM would read them (SQLite:
    text and 0/1); the other columns stay deferred."""
    connection = connections[using]
    key_id, name, is_operator, last_used_at, queues, capabilities = found
    for convert in connection.ops.get_db_converters(_LAST_USED):
        last_used_at = convert(last_used_at, _LAST_USED, connection)
    return AgentKey.from_db(using, KEY_LOOKUP_FIELDS,
                            (key_id, name, bool(is_operator), last_used_at, queues, capabilities))
