"""The MongoDB store: a replica set through django-mongodb-backend (backend/), with session
transactions, the primary's clock and ids from counter documents. Everything MongoDB lives in
this folder: the backend wrapper (backend/), the settings builder (settings.py), the contrib
apps (apps.py) and the migrations (migrations/, checked against the SQL ones by
tests/test_mongo_migrations.py).

A transaction is a session's multi-document transaction (Django's `transaction.atomic` does
nothing here), reading one snapshot and committing with write concern "majority". Two
transactions that write the same document do not queue: the second fails at once with a
WriteConflict, raised as TransactionConflict, and the engine's verbs (retry_conflicts) run again
from the start. Every move increments one counter document (`number_rows`), so writers are
serialised anyway: threads of one process queue on the process lock, and only other processes
conflict. Why, measured: docs/stores.md.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from datetime import UTC, datetime

from django.db import DatabaseError

from board.engine.stores.base import Store, TransactionConflict, process_lock
from board.engine.stores.mongodb.counters import COUNTERS, number_rows

log = logging.getLogger("board.engine.stores")

# One document per key given to serialise_on (expired by a TTL index after a day).
SERIALISED = "board_serialised"

# How often a commit whose outcome is unknown (a network error, a failover during the commit)
# is sent again. Committing again is what MongoDB prescribes: it commits once at most.
COMMIT_RETRIES = 5


class MongoDBStore(Store):
    # The board's SQL does not run here, and a join is a `$lookup` per row: the engine reads
    # the rows it needs with indexed queries and joins them in Python (on SecantusDB, the test
    # server, a two-level `$lookup` over 51 tasks took 2 s).
    speaks_sql = False
    joins_cheaply = False
    # Every writer increments one counter document (number_rows), so a second writer conflicts
    # until the first has committed: ids follow commit order.
    ids_follow_commit_order = True
    has_own_clock = True
    # savepoint() is nothing here: a move refused inside a shared transaction could not roll
    # back alone (board.engine.transitions.batches runs each move in its own transaction).
    moves_share_a_transaction = False

    def now(self) -> datetime:
        """The primary's clock, read with `hello` (`localTime`, to the millisecond, which is
        what MongoDB stores). Not part of any transaction: `hello` is not allowed in one."""
        connection = self.connection
        connection.ensure_connection()
        return connection.connection.admin.command("hello")["localTime"].replace(tzinfo=UTC)

    # now_in_query is `now`: Now() would be `$$NOW`, which the test server (SecantusDB
    # 0.7.0b3) compares wrongly in `$expr`, so the board does not depend on it.

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        self._refuse_in_read()
        if self.connection.in_atomic_block_mongo:
            yield
            return
        # Threads of one process queue here, like SQLite's writers: only writers of other
        # processes still conflict (and are retried).
        with process_lock(self.using), self._transaction():
            yield

    def _read_transaction(self, *, give_way: bool = False):
        return self._transaction(read_only=True)

    def in_transaction(self) -> bool:
        # Only a session transaction counts: Django's own `transaction.atomic` (which the
        # admin's views open) does nothing here.
        return self.connection.in_atomic_block_mongo

    def savepoint(self):
        # None here: the error aborts the whole transaction, and its verb runs again
        # (retry_conflicts) and sees what it hit.
        return nullcontext()

    def serialise_on(self, key: str) -> None:
        """A write to the key's document, so that a second transaction conflicts (its verb runs
        again once this one has committed)."""
        connection = self.connection
        connection.get_collection(SERIALISED).update_one(
            {"_id": key}, {"$set": {"at": datetime.now(UTC)}}, upsert=True, session=connection.session)

    def conflict_with_writers(self) -> None:
        """Every writer increments the history's counter document (number_rows): a write to it
        here aborts one of two concurrent transactions, and the one run again sees what the other
        committed."""
        from board.models import TaskEvent

        connection = self.connection
        connection.get_collection(COUNTERS).update_one(
            {"_id": TaskEvent._meta.db_table}, {"$set": {"touched_at": datetime.now(UTC)}}, upsert=True,
            session=connection.session)

    def hold_off_task_writers(self) -> None:
        """Every move writes the history's counter document: so does this, and one of two
        concurrent transactions runs again after the other has committed."""
        self.conflict_with_writers()

    def number_rows(self, rows: Sequence) -> None:
        number_rows(self.using, rows)

    def insert_missing(self, model, rows: Sequence) -> None:
        """An upsert per row that only sets fields when it inserts ($setOnInsert): two
        transactions inserting one key conflict, and the one run again finds the row."""
        connection = self.connection
        collection = connection.get_collection(model._meta.db_table)
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        for row in rows:
            document = {f.column: f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields}
            collection.update_one({"_id": row.pk}, {"$setOnInsert": document}, upsert=True,
                                  session=connection.session)

    def ping(self) -> None:
        self.connection.ensure_connection()
        self.connection.connection.admin.command("ping")

    @contextmanager
    def _transaction(self, *, read_only: bool = False) -> Iterator[None]:
        """One multi-document transaction on the connection's session (the backend passes
        `connection.session` to every query). Inside a caller's transaction it is that one. A
        read-only transaction is aborted at the end (it wrote nothing). Errors MongoDB labels
        transient come out as TransactionConflict."""
        connection = self.connection
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
