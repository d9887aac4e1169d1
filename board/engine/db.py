"""Transactions: the board's writes, and reads that must see one consistent state.

On SQLite only one connection writes at a time (BEGIN IMMEDIATE takes the write lock up front).
A writer that finds the lock taken waits in SQLite's busy handler, which sleeps 1, 2, 5, 10, ...
ms between tries: under contention the lock is handed over slowly, and a writer can keep losing
to newcomers. So SQLite writers queue first on locks that wake the next one the moment the
current one ends:

- threads of one process on a process-local lock per database, which a verb holds from its
  start to its end (`_one_verb_at_a_time`), not only for its transaction;
- processes (several server workers, the reaper, a command) on an exclusive `flock` of a file
  beside the database (`<name>-writers`), which the kernel hands to the next waiter at once.

A writer that takes neither (another program, a migration) still meets SQLite's busy timeout,
which stays correct. On PostgreSQL this is plain `transaction.atomic`.

Every write transaction on SQLite is the only writer while it runs, so how long writers wait
for the lock and how long each holds it (commit included) decide how far one SQLite file
scales: `observe_sqlite_writes` hands both times to an observer (the metrics, board/apps.py).
That is also why no WAL checkpoint runs inside a commit: after each SQLite write transaction,
board.engine.checkpoints counts it, and a thread of the process checkpoints out of the locks.

On MongoDB (a replica set) a transaction is a session's multi-document transaction
(django-mongodb-backend's; Django's own `transaction.atomic` does nothing there), reading one
snapshot and committing with write concern "majority" (board/mongodb/base.py). Two
transactions that write the same document do not queue: the second fails at once with a
WriteConflict, a TransientTransactionError. `write_transaction` raises it as
`TransactionConflict`, and the engine's verbs (decorated with `retry_conflicts`) run again from
the start, as after a lost compare-and-swap; nothing the failed attempt wrote was kept. Since
every move writes one counter document (`number_rows`), writers are serialised anyway: threads
of one process queue on the process lock (as on SQLite), so only other processes conflict.

Everything that differs between the stores is asked here, by what it is, not by vendor:
`speaks_sql` (hand-written statements are possible), `joins_cheaply`, `ids_follow_commit_order`
(the history's ids are handed out in commit order: SQLite's single writer, MongoDB's counter),
`has_own_clock` (the store's clock serves every process: board.engine.clock), `skip_locked`
(row locks skipped where the store has them), `lock_rows` (row locks where it has them), `number_rows` (MongoDB has no auto-increment:
ids from a counter document), `serialise_on`, `savepoint`, `in_transaction`, `ping`, and the
transactions below. The rest of the engine asks these instead of testing `connection.vendor`;
the two modules written per store say so by their job: board.engine.hot_sql (its statements, in
SQLite's and PostgreSQL's dialects, chosen by `hot_sql.store`) and board.engine.clock (how each
store's clock is read).

Reads never go through any of this (`read_transaction`): on SQLite in WAL mode a reader works on
the snapshot it started with while one writer commits beside it, so a read, however long, neither
waits for a writer nor holds one up. Only a read that needs several queries to agree (check(), the
live board's snapshot) opens a transaction, a DEFERRED one, which takes no lock but the WAL
snapshot; a single query needs none.
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from typing import TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.models import QuerySet

from board.engine import checkpoints

log = logging.getLogger("board.engine.db")

SQL_VENDORS = ("sqlite", "postgresql")


def speaks_sql(using: str) -> bool:
    """The store runs SQL (hand-written statements, cursors): SQLite and PostgreSQL."""
    return connections[using].vendor in SQL_VENDORS


def joins_cheaply(using: str) -> bool:
    """A query may join tables and filter on the joined rows (SQL, with indexes). On MongoDB
    the backend makes a join a `$lookup` per row: the engine reads the rows it needs with
    indexed queries and joins them in Python instead (on SecantusDB, the test server, a
    two-level `$lookup` over 51 tasks took 2 s)."""
    return speaks_sql(using)


def ids_follow_commit_order(using: str) -> bool:
    """A history id below one already read is either committed or never will be. True where
    one writer commits before the next takes an id (SQLite), and on MongoDB, where every
    writer increments one counter document (`number_rows`), so a second writer conflicts
    until the first has committed. False on PostgreSQL: a sequence hands ids out at insert
    time, and transactions commit in any order (board/live/outbox.py keeps holes for that)."""
    return connections[using].vendor != "postgresql"


def has_own_clock(using: str) -> bool:
    """The store has a clock every process may read (PostgreSQL's, MongoDB's primary's), which
    the engine then uses for lease expiries (board.engine.clock). SQLite's is this process's."""
    return connections[using].vendor in ("postgresql", "mongodb")


def skip_locked(rows: QuerySet, using: str) -> QuerySet:
    """`rows` to be locked by the write transaction that reads them, skipping the rows other
    transactions have locked, where the store can (PostgreSQL's FOR UPDATE SKIP LOCKED): claimers
    racing for the best ready task then pick different ones instead of queueing behind one row.
    Not the concurrency mechanism (the compare-and-swap is): elsewhere `rows` as they are, since
    SQLite has one writer at a time and MongoDB aborts the second writer of a document."""
    if connections[using].features.has_select_for_update_skip_locked:
        return rows.select_for_update(skip_locked=True)
    return rows


def lock_rows(rows: QuerySet, using: str) -> QuerySet:
    """`rows` locked until the write transaction ends, where the store has row locks
    (PostgreSQL: SELECT ... FOR UPDATE). The prune (board.engine.retention) locks the terminal
    tasks it is about to delete, so that a create naming one as a dependency waits for the
    batch, then finds no row and refuses the dependency as unknown. Elsewhere `rows` as they are: SQLite's
    writers are already serialised, and on MongoDB a conflicting writer is aborted and retried."""
    if connections[using].features.has_select_for_update:
        return rows.select_for_update()
    return rows


def ping(using: str) -> None:
    """One round trip to the store; raises when it does not answer."""
    connection = connections[using]
    if speaks_sql(using):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    else:
        connection.ensure_connection()
        connection.connection.admin.command("ping")


def serialise_on(using: str, key: str) -> None:
    """Inside a write transaction: make any other transaction that calls this with the same
    `key` (hex digits) run after this one has ended. PostgreSQL: a transaction-level advisory
    lock on the key (released at commit or rollback). MongoDB: a write to the key's document,
    so that a second transaction conflicts (TransactionConflict: its verb runs again once this
    one has committed). SQLite: nothing to do, the write transaction is the only writer."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        lock = int.from_bytes(bytes.fromhex(key[:16]), "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock])
    elif connection.vendor == "mongodb":
        from datetime import UTC, datetime

        connection.get_collection(SERIALISED).update_one(
            {"_id": key}, {"$set": {"at": datetime.now(UTC)}}, upsert=True, session=connection.session)


def savepoint(using: str):
    """A block that can fail (an insert that may hit a unique key) without ending the
    transaction around it: a SAVEPOINT on SQL stores. MongoDB has none: there the error aborts
    the whole transaction, and its verb runs again (retry_conflicts) and sees what it hit."""
    if connections[using].vendor == "mongodb":
        return nullcontext()
    return transaction.atomic(using=using)


def in_transaction(using: str) -> bool:
    """Inside a transaction of the store. On MongoDB only a session transaction counts: Django's
    own `transaction.atomic` (which the admin's views open) does nothing there."""
    connection = connections[using]
    if connection.vendor == "mongodb":
        return connection.in_atomic_block_mongo
    return connection.in_atomic_block


def on_commit(callback: Callable[[], None], using: str) -> None:
    """Call `callback()` once the transaction open on `using` commits (never if it rolls back),
    or now when none is open. Django's `transaction.on_commit` says the same, but even with no
    transaction open it first makes sure of the connection, through its thread-safety checks:
    a cost the hot verbs paid twice per move (board.engine.commits and outcomes). So on SQL
    stores, an open connection in autocommit outside any atomic block runs it here; everything
    else (MongoDB, a closed connection, autocommit turned off) is Django's to decide."""
    connection = connections[using]
    if (connection.vendor in SQL_VENDORS and not connection.in_atomic_block
            and connection.connection is not None and connection.autocommit):
        callback()
    else:
        transaction.on_commit(callback, using=using)


def in_statements(connection) -> bool:
    """Whether the SQL a connection runs is being watched (DEBUG or CaptureQueriesContext's query
    log, an execute_wrapper): then Django's cursor must run it, not the driver's."""
    return connection.queries_logged or bool(connection.execute_wrappers)


def _refuse_inside_a_driver_transaction(connection) -> None:
    """A transaction statement_transaction opened is not Django's: a transaction opened inside it
    would send a second BEGIN (and release the writers' flock the outer one holds)."""
    if not connection.in_atomic_block and connection.connection is not None and connection.connection.in_transaction:
        raise RuntimeError("a transaction inside db.statement_transaction: only its statements may run there")


_sqlite_writers: defaultdict[str, threading.RLock] = defaultdict(threading.RLock)
# Told (waited, held) in seconds after every outermost SQLite write transaction: see the module.
_sqlite_write_observers: list[Callable[[float, float], None]] = []
_timing = threading.local()  # `active` while this thread is inside a timed write transaction


def observe_sqlite_writes(observer: Callable[[float, float], None]) -> None:
    """Call `observer(waited, held)` after every outermost SQLite write transaction: the seconds
    it waited for the writers' locks (other processes'; and this process's threads' unless a
    verb already waited for them at its start, `_one_verb_at_a_time`), and the
    seconds it held them (its statements and its commit, or its rollback). Called in the
    writer's thread after the locks are released; it must return at once and never raise."""
    if observer not in _sqlite_write_observers:
        _sqlite_write_observers.append(observer)

_sqlite_files: dict[tuple[int, str], tuple[str | None, int | None]] = {}
_registry_lock = threading.Lock()


def _writer_lock(using: str) -> threading.RLock:
    with _registry_lock:
        return _sqlite_writers[using]


def _sqlite_file(using: str) -> tuple[str | None, int | None]:
    """This process's (database file, descriptor of its writers' lock file), None for either:
    an in-memory database has no file (only the process lock and SQLite's own apply), an
    unwritable folder no lock file. Opened once per process (a forked child opens its own: a
    shared descriptor would share the lock); the process lock serialises its use among
    threads."""
    key = (os.getpid(), using)
    with _registry_lock:
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
    with _writer_lock(using):
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)


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
    if in_transaction(using):
        yield
        return
    with ExitStack() as stack:
        if connection.vendor == "mongodb":
            stack.enter_context(_mongodb_transaction(using, read_only=True))
        elif connection.vendor == "sqlite":
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
    if connection.vendor == "mongodb":
        if connection.in_atomic_block_mongo:
            yield
            return
        # Every writer increments the history's counter document (number_rows), so only one
        # write transaction at a time can commit; the others would fail with a WriteConflict
        # and start again. Threads of one process queue here instead, like SQLite's writers:
        # only writers of other processes still conflict (and are retried).
        with _writer_lock(using), _mongodb_transaction(using):
            yield
        return
    # Inside a caller's own transaction the write lock is already held (IMMEDIATE): taking the
    # locks now could wait on a thread that waits on us.
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
        return
    _refuse_inside_a_driver_transaction(connection)
    with _sqlite_writers_lock(using, transaction.atomic(using=using)):
        yield


@contextmanager
def statement_transaction(using: str) -> Iterator[None]:
    """A write transaction for hand-written statements only (board.engine.hot_sql): on SQLite,
    the writers' locks of write_transaction, with BEGIN IMMEDIATE and COMMIT sent on the
    driver's connection instead of through Django's `transaction.atomic`, whose bookkeeping
    (autocommit switched off and on again, savepoint ids, on-commit hooks) cost about as much
    as the claim's own statement. Django's connection stays in autocommit all along, so nothing
    inside may use Django's transaction API (`atomic`, `on_commit`: the hot verbs tell their
    commit after the block) or expect Django to know a transaction is open. Inside a caller's
    transaction, and on the other stores, it is write_transaction."""
    connection = connections[using]
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        connection.ensure_connection()
        _refuse_inside_a_driver_transaction(connection)
        if connection.autocommit:  # else someone turned it off: Django's way, then
            with _sqlite_writers_lock(using, _driver_transaction(connection)):
                yield
            return
    with write_transaction(using):
        yield


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


# ---------------------------------------------------------------------------------------------
# MongoDB


class TransactionConflict(DatabaseError):
    """The store aborted the transaction because another one wrote the same document first
    (MongoDB's WriteConflict, or any error labelled TransientTransactionError). Nothing the
    transaction wrote was kept: running it again from the start is safe."""


# Attempts of a verb whose transaction keeps conflicting (each conflict means another writer
# committed, so this bounds work, not correctness), and the pause between them: random, so
# that writers which collided do not collide again in step.
CONFLICT_RETRIES = 100
CONFLICT_PAUSE_SECONDS = (0.0005, 0.05)

F = TypeVar("F", bound=Callable)


def retry_conflicts(verb: F) -> F:
    """Run `verb` (which takes `using=`) again when its transaction lost a TransactionConflict,
    up to CONFLICT_RETRIES times. Inside a caller's transaction the conflict goes up to the
    caller: that transaction is aborted as a whole, so only its outermost verb can run again.
    After the last attempt: errors.VersionConflict, as when a verb keeps losing its
    compare-and-swap (the API answers 409 version_conflict; nothing was written).

    Every write verb wears this decorator, so it is also where a verb enters the store: on
    SQLite one at a time per process (`_one_verb_at_a_time`)."""

    @functools.wraps(verb)
    def run(*args, **kwargs):
        using = kwargs.get("using", "default")
        with _one_verb_at_a_time(using):
            return _run(using, args, kwargs)

    def _run(using, args, kwargs):
        for attempt in range(CONFLICT_RETRIES):
            try:
                return verb(*args, **kwargs)
            except TransactionConflict as conflict:
                if in_transaction(using):
                    raise
                log.debug("%s: transaction conflict (attempt %d): %s", verb.__name__, attempt + 1, conflict)
                last = conflict
            low, high = CONFLICT_PAUSE_SECONDS
            time.sleep(random.uniform(low, min(high, low * 2 ** attempt)))
        from board.engine.errors import VersionConflict

        raise VersionConflict(f"{verb.__name__}: the store kept aborting this move for conflicting writes "
                              f"({CONFLICT_RETRIES} attempts); try again") from last

    return run  # type: ignore[return-value]


def _one_verb_at_a_time(using: str):
    """On SQLite, the whole verb runs holding this process's writer lock (the one
    write_transaction takes first; reentrant), not only its transaction. SQLite has one writer
    at a time, so threads of a process gain nothing by running verbs side by side: the Python
    around a verb's transaction (minting a token, building the Task it returns) only competes
    for the GIL with the thread that holds the write lock, which then holds it longer while the
    rest queue. bench/claims.py, 8 threads on SQLite, alternating: 1,100 / 1,149 cycles/s
    without this, 1,502 / 1,533 with it (1 thread: 1,761-1,818). Other processes still wait only
    for the transaction itself (the flock). Inside a caller's transaction nothing is taken, as
    in write_transaction; other stores are not gated."""
    connection = connections[using]
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return nullcontext()
    return _writer_lock(using)


def _transient(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps: the backend raises Django's DatabaseError from
    pymongo's) is one MongoDB labels TransientTransactionError."""
    seen = 0
    while exc is not None and seen < 5:
        has_label = getattr(exc, "has_error_label", None)
        if has_label is not None and has_label("TransientTransactionError"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _error_name(exc: BaseException) -> str:
    """MongoDB's name for the error (e.g. WriteConflict), found on what `exc` wraps."""
    while exc is not None:
        details = getattr(exc, "details", None)
        if isinstance(details, dict) and details.get("codeName"):
            return f"{details['codeName']} (code {details.get('code')})"
        exc = exc.__cause__ or exc.__context__
    return "a transient transaction error"


# How often a commit whose outcome is unknown (a network error, a failover during the commit)
# is sent again. Committing again is what MongoDB prescribes: it commits once at most.
COMMIT_RETRIES = 5


@contextmanager
def _mongodb_transaction(using: str, *, read_only: bool = False) -> Iterator[None]:
    """One multi-document transaction on the connection's session (the backend passes
    `connection.session` to every query). Inside a caller's transaction it is that one. A
    read-only transaction is aborted at the end (it wrote nothing). Errors MongoDB labels
    transient come out as TransactionConflict."""
    connection = connections[using]
    if connection.in_atomic_block_mongo:
        yield
        return
    connection.start_transaction_mongo()
    connection.in_atomic_block_mongo = True
    try:
        yield
    except BaseException as exc:
        connection.in_atomic_block_mongo = False
        _end_session(connection, abort=True)
        if _transient(exc):
            raise TransactionConflict(f"transaction aborted by a conflict: {_error_name(exc)}") from exc
        raise
    connection.in_atomic_block_mongo = False
    if read_only:
        _end_session(connection, abort=True)
        return
    try:
        for attempt in range(COMMIT_RETRIES):
            try:
                connection.session.commit_transaction()
                break
            except Exception as exc:
                unknown = getattr(exc, "has_error_label", lambda label: False)("UnknownTransactionCommitResult")
                if not unknown or attempt == COMMIT_RETRIES - 1:
                    raise
    except Exception as exc:
        _end_session(connection, abort=False)
        if _transient(exc):
            raise TransactionConflict(f"commit aborted by a conflict: {_error_name(exc)}") from exc
        raise DatabaseError(f"commit failed: {exc}") from exc
    _end_session(connection, abort=False)
    _run_commit_hooks(connection)


def _run_commit_hooks(connection) -> None:
    """What Django's run_and_clear_commit_hooks does, without its refusal to run inside
    Django's own `atomic` (a no-op on MongoDB, around which this transaction did commit)."""
    while connection.run_on_commit:
        _, hook, robust = connection.run_on_commit.pop(0)
        if not robust:
            hook()
            continue
        try:
            hook()
        except Exception:  # a robust hook's failure is logged, as Django does
            log.exception("Error calling %s in on_commit()", getattr(hook, "__qualname__", hook))


def _end_session(connection, *, abort: bool) -> None:
    session, connection.session = connection.session, None
    if abort:
        connection.run_on_commit = []
    if session is None:
        return
    with suppress(Exception):  # a transaction the server aborted already: nothing left to abort
        if abort and session.in_transaction:
            session.abort_transaction()
    with suppress(Exception):
        session.end_session()


COUNTERS = "board_counter"
# MongoDB: one document per key given to serialise_on (expired by a TTL index after a day).
SERIALISED = "board_serialised"


def number_rows(using: str, rows: Sequence) -> None:
    """Give new rows of the board's history (and the prune's records of deleted tasks) their ids
    where the store has no auto-increment (MongoDB), from the counter document of their table,
    incremented in the row's own transaction. Two transactions that both increment it conflict,
    so one commits before the other takes its ids: ids follow commit order
    (`ids_follow_commit_order`), which is what the live board's tailer needs to never skip an
    event or a deletion. On SQL stores: nothing to do."""
    missing = [row for row in rows if row.pk is None]
    connection = connections[using]
    if not missing or connection.vendor != "mongodb":
        return
    if not connection.in_atomic_block_mongo:
        raise RuntimeError("rows numbered outside a transaction: their ids would not follow commit order")
    from pymongo import ReturnDocument

    counter = connection.get_collection(COUNTERS).find_one_and_update(
        {"_id": type(missing[0])._meta.db_table}, {"$inc": {"last": len(missing)}},
        upsert=True, return_document=ReturnDocument.AFTER, session=connection.session,
    )
    first = counter["last"] - len(missing) + 1
    for offset, row in enumerate(missing):
        row.pk = first + offset


# ---------------------------------------------------------------------------------------------
# For deletions (board.engine.retention): a transaction that deletes a row another transaction
# may have read a moment ago and still be acting on.


def conflict_with_writers(using: str) -> None:
    """Inside a write transaction: make it conflict with every concurrent transaction that moves
    or creates a task. MongoDB: they all increment the history's counter document
    (`number_rows`), so a write to it here aborts one of the two (TransactionConflict), and the
    one run again sees what the other committed. SQL stores: nothing to do (SQLite has one
    writer at a time; on PostgreSQL see `transactions_open_before`)."""
    connection = connections[using]
    if connection.vendor != "mongodb":
        return
    from datetime import UTC, datetime

    from board.models import TaskEvent

    connection.get_collection(COUNTERS).update_one(
        {"_id": TaskEvent._meta.db_table}, {"$set": {"touched_at": datetime.now(UTC)}}, upsert=True,
        session=connection.session)


def transactions_open_before(using: str, moment) -> int:
    """How many transactions of other sessions on this database, begun before `moment` (the
    store's clock), are still open. PostgreSQL: pg_stat_activity (the sessions of other roles
    show no start time and are not counted: the board's own connections share one role).
    Elsewhere 0: SQLite's transactions are serialised, and MongoDB's conflict instead
    (`conflict_with_writers`)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND xact_start < %s", [moment])
        return cursor.fetchone()[0]
