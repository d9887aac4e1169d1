"""The store base: what every store object offers, done the generic way (Django's ORM and its
`transaction.atomic`), which is what a backend other than SQLite, PostgreSQL and MongoDB gets.

A store is one object per database alias (`board.engine.stores.store(using)`). It carries how
that database runs a transaction, tells the time, numbers rows, reads, and makes the hot moves;
the engine asks it instead of testing a vendor. Each store's differences live in its own
module: sqlite.py, postgresql.py, mongodb/. Why each difference exists: docs/stores.md.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

if TYPE_CHECKING:
    from board.engine.stores.statements import Statements

log = logging.getLogger("board.engine.stores")


class TransactionConflict(DatabaseError):
    """The store aborted the transaction because another one wrote the same document first
    (MongoDB's WriteConflict, or any error labelled TransientTransactionError). Nothing the
    transaction wrote was kept: running it again from the start is safe."""


# On the connection while a read_transaction is open: a write inside it is refused.
_READ_ONLY_FLAG = "board_read_transaction"

# One lock per alias for the threads of this process: SQLite's writers queue on it (the whole
# verb: stores.sqlite), and so do MongoDB's (stores.mongodb: every writer increments one
# counter document, so two writers of one process would only conflict).
_process_locks: defaultdict[str, threading.RLock] = defaultdict(threading.RLock)
_registry_lock = threading.Lock()


def process_lock(using: str) -> threading.RLock:
    with _registry_lock:
        return _process_locks[using]


def in_statements(connection) -> bool:
    """Whether the SQL a connection runs is being watched (DEBUG or CaptureQueriesContext's query
    log, an execute_wrapper): then Django's cursor must run it, not the driver's."""
    return connection.queries_logged or bool(connection.execute_wrappers)


class Store:
    """The generic store: Django's transactions, this process's clock, the ORM's reads, no
    hand-written statements (`statements` is None: the engine's ORM path)."""

    # The board's hand-written SQL runs here (hot statements, the key lookup, cursors).
    speaks_sql = False
    # How a JSON column is searched (board.engine.search): "containment" (PostgreSQL's jsonb @>,
    # which its GIN indexes serve), "text" (SQLite keeps JSON as text), or "document" (a query on
    # an array field matches any element, a key path reaches into it: MongoDB, the default).
    json_search = "document"
    # A query may join tables and filter on the joined rows cheaply (SQL, with indexes).
    joins_cheaply = False
    # A history id below one already read is either committed or never will be (one writer
    # commits before the next takes an id). Not promised by an arbitrary backend.
    ids_follow_commit_order = False
    # The store has a clock every process may read, used for lease expiries.
    has_own_clock = False
    # A stored datetime column in Unix seconds, in this store's SQL ({column} is its name); None
    # where the store speaks no SQL.
    epoch_of_column: str | None = None
    # Several moves may share one write transaction (complete-and-claim-next, a batch of claims:
    # board.engine.transitions.batches): a move nested in it that is refused (flow.AtLimit) rolls
    # back on its own (a savepoint), leaving the moves before it. False where a nested block has
    # no savepoint (MongoDB): each move then runs in a transaction of its own.
    moves_share_a_transaction = True
    # How many rows a queue's concurrency limit and its rate are each split over (at most; never
    # more than the limit or the count: board.engine.flow, QueueShard). One where writers take
    # turns anyway (SQLite's one writer, MongoDB's history counter): more rows only cost reads.
    queue_shards = 1
    # Whether a claim may skip a shard another transaction holds locked (FOR UPDATE SKIP LOCKED)
    # and take the next one, instead of waiting for it.
    skips_locked_rows = False

    def __init__(self, using: str):
        self.using = using
        # The hand-written statements of the hot verbs, or None (the ORM path): set by the
        # stores that have them (stores.statements.chosen).
        self.statements: Statements | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.using!r}>"

    @property
    def connection(self):
        return connections[self.using]

    # --- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's current time (aware)."""
        return timezone.now()

    def now_in_query(self) -> Any:
        """"Now" for an ORM filter: a value, or an expression the database evaluates."""
        return self.now()

    # --- transactions ---------------------------------------------------------------------

    def _refuse_in_read(self) -> None:
        if getattr(self.connection, _READ_ONLY_FLAG, False):
            raise RuntimeError("a write inside read_transaction: it would need the write lock it does not hold")

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        """One write transaction (inside a caller's transaction: that one)."""
        self._refuse_in_read()
        with transaction.atomic(using=self.using):
            yield

    def statement_transaction(self):
        """A write transaction for hand-written statements only (see stores.sqlite)."""
        return self.write_transaction()

    @contextmanager
    def read_transaction(self, *, give_way: bool = False) -> Iterator[None]:
        """One consistent read of several queries, holding no write lock and waiting for none.
        Inside a transaction the caller already reads a consistent state: nothing is opened.
        Nothing may write inside it (write_transaction refuses).

        `give_way`: a reader that can be retried (a panel recomputed later) gives up, with the
        store's error, rather than wait long for a table lock (on PostgreSQL only DDL or a
        TRUNCATE holds one; a TRUNCATE that locked one of the tables while this read holds the
        other would otherwise deadlock, and PostgreSQL may cancel the TRUNCATE)."""
        if self.in_transaction():
            yield
            return
        with self._read_transaction(give_way=give_way):
            connection = self.connection
            setattr(connection, _READ_ONLY_FLAG, True)
            try:
                yield
            finally:
                setattr(connection, _READ_ONLY_FLAG, False)

    def _read_transaction(self, *, give_way: bool = False):
        return transaction.atomic(using=self.using)

    def verb_gate(self):
        """What a write verb holds from its start to its end (retry_conflicts): nothing here."""
        return nullcontext()

    def in_transaction(self) -> bool:
        return self.connection.in_atomic_block

    def savepoint(self):
        """A block that can fail (an insert that may hit a unique key) without ending the
        transaction around it."""
        return transaction.atomic(using=self.using)

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the open transaction commits (never if it rolls back), or now
        when none is open."""
        transaction.on_commit(callback, using=self.using)

    def serialise_on(self, key: str) -> None:
        """Inside a write transaction: make any other transaction that calls this with the same
        `key` (hex digits) run after this one has ended. Nothing here: a store without a way to
        do it (SQLite needs none: its write transaction is the only writer)."""

    def conflict_with_writers(self) -> None:
        """Inside a write transaction: make it conflict with every concurrent transaction that
        moves or creates a task, where the store needs that (MongoDB). Nothing here."""

    def hold_off_task_writers(self) -> None:
        """Inside a write transaction: wait until every transaction that moves a task has ended,
        and keep new ones waiting (or conflicting) until this one ends, so that what it then
        reads of the tasks stays true until it commits. Nothing here: SQLite's write transaction
        is the only writer already."""

    def check_references_now(self) -> None:
        """Inside a write transaction: check the foreign keys of the rows it wrote so far now,
        taking their references' locks now, not at COMMIT, where the store defers them
        (PostgreSQL). Nothing here: SQLite's writer is alone, MongoDB has no foreign keys."""

    def lost_a_lock_race(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by a write verb, means its transaction lost a race for row locks
        to others (PostgreSQL's deadlock detector): it was rolled back as a whole and may run
        again (retry_conflicts). False here."""
        return False

    def transactions_open_before(self, moment: datetime) -> int:
        """How many transactions of other sessions, begun before `moment`, are still open,
        where the store can tell (PostgreSQL); 0 here."""
        return 0

    # --- rows -----------------------------------------------------------------------------

    def number_rows(self, rows: Sequence) -> None:
        """Give new rows of a table whose ids follow commit order their ids, where the store
        has no auto-increment (MongoDB). Nothing here."""

    def insert_missing(self, model, rows: Sequence) -> None:
        """Inside a write transaction: insert those of `rows` whose primary key is not taken,
        leaving existing rows as they are (two transactions inserting one key: both succeed, one
        row). SQL: INSERT ... ON CONFLICT DO NOTHING."""
        if not rows:
            return
        if self.connection.features.supports_ignore_conflicts:
            model.objects.using(self.using).bulk_create(rows, ignore_conflicts=True)
            return
        taken = set(model.objects.using(self.using).filter(pk__in=[row.pk for row in rows])
                    .values_list("pk", flat=True))
        model.objects.using(self.using).bulk_create([row for row in rows if row.pk not in taken])

    def skip_locked(self, rows: QuerySet) -> QuerySet:
        """`rows` to be locked by the write transaction that reads them, skipping the rows other
        transactions have locked, where the store can: claimers racing for the best ready task
        then pick different ones instead of queueing behind one row. Not the concurrency
        mechanism (the compare-and-swap is)."""
        if self.connection.features.has_select_for_update_skip_locked:
            return rows.select_for_update(skip_locked=True)
        return rows

    def lock_rows(self, rows: QuerySet) -> QuerySet:
        """`rows` locked until the write transaction ends, where the store has row locks. The
        prune (board.engine.retention) locks the terminal tasks it is about to delete, so that a
        create naming one as a dependency waits for the batch, then refuses it as unknown."""
        if self.connection.features.has_select_for_update:
            return rows.select_for_update()
        return rows

    def takeable(self, rows: QuerySet, capabilities: tuple[str, ...]) -> QuerySet:
        """`rows` (tasks) without those requiring a capability a claimer lacks
        (board.engine.capabilities). Here (MongoDB, whose backend has no subset match in the ORM):
        the requiring tasks among `rows` are read and judged in Python, their ids kept."""
        if not capabilities:
            return rows.filter(has_requires=False)
        held = set(capabilities)
        fitting = [pk for pk, requires in rows.filter(requires__isnull=False).order_by()
                   .values_list("pk", "requires") if set(requires or ()) <= held]
        return rows.filter(Q(requires__isnull=True) | Q(pk__in=fitting))

    def live_keys(self) -> Q:
        """The filter of live agent keys: no end set, or an end (a rotated key's grace) still
        ahead by the store's clock. The one definition the engine and board.agent_keys use; the
        SQL stores' statements spell the same rule in SQL."""
        return Q(revoked_at__isnull=True) | Q(revoked_at__gt=self.now_in_query())

    def find_live_key(self, key_hash: str):
        """The live agent key with this hash, or None. The SQL stores read only what a request
        needs of it."""
        from board.models import AgentKey

        return AgentKey.objects.using(self.using).filter(self.live_keys(), key_hash=key_hash).first()

    def ping(self) -> None:
        """One round trip to the store; raises when it does not answer."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT 1")


class DirectCommitHooks:
    """For SQL stores: an open connection in autocommit outside any atomic block runs an
    on-commit callback at once. Django's `transaction.on_commit` says the same, but first makes
    sure of the connection through its thread-safety checks: a cost the hot verbs paid twice per
    move (board.engine.commits and outcomes)."""

    def on_commit(self, callback: Callable[[], None]) -> None:
        connection = self.connection
        if not connection.in_atomic_block and connection.connection is not None and connection.autocommit:
            callback()
        else:
            transaction.on_commit(callback, using=self.using)
