"""What the engine says to MongoDB, command by command (issue 10): the compare-and-swap of renew,
complete and claim is one `update` of the task filtered on its id, the stage and version it was
read at (and, for a holder's verb, the SHA-256 of the lease token), with `multi` (the backend
updates with update_many) and a pipeline `$set` of the new stage, version + 1 and the rest, sent
inside a session transaction: `lsid`, `txnNumber`, `autocommit: false`, `startTransaction` and
read concern "snapshot" on its first command, and a commit with write concern "majority".

The client is real (the "wire" alias of tests/mongodb_settings.py: pymongo through the
board.mongodb engine); the server is MockupDB, a scripted MongoDB wire server. The engine runs a
verb in a thread; this thread plays the server: it receives each command in the order the engine
must send it, asserts what it says, and answers as a replica-set primary would. Because every
command waits for its answer, a verb that returns has sent exactly the commands answered here,
in that order, and nothing else. SecantusDB is not needed (no `mongodb` mark), but these tests
run in the MongoDB session: its settings are the ones where the models are MongoDB's.

Every wait is bounded: each `receives` and each verb's result give up after RECEIVE_TIMEOUT.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError

from board.engine import errors, transitions

if "wire" not in settings.DATABASES:
    pytest.skip("the wire tests run in the MongoDB session (--ds=tests.mongodb_settings)", allow_module_level=True)

from django_mongodb_backend.base import DatabaseWrapper  # noqa: E402
from mockupdb import MockupDB  # noqa: E402

RECEIVE_TIMEOUT = 10  # seconds: a command the engine should send, or a verb's result
POLL_SECONDS = 0.1  # while waiting for a command: how often to look whether the verb has ended
ALIAS = "wire"
TASK_ID = "t-wire"
# The primary's clock as the test server tells it (BSON dates are milliseconds, UTC, naive here).
NOW = datetime(2030, 1, 2, 3, 4, 5, 678000)


def primary_hello(port: int) -> dict:
    """The handshake and monitoring answer of a replica-set primary, as pymongo 4.20 needs it
    for transactions: `setName` with `ismaster: true` makes the server an RSPrimary (without
    setName it is a Standalone, where MongoDB refuses transactions);
    `logicalSessionTimeoutMinutes` is what says sessions are supported (without it pymongo
    raises "Sessions are not supported" for an explicit session); maxWireVersion must be at
    least 9 (pymongo.common.MIN_SUPPORTED_WIRE_VERSION); 21 is MongoDB 7.0, the version
    buildinfo reports below. No `helloOk`: pymongo then monitors with the legacy isMaster, which
    this answer covers, so the only `hello` the test receives is the clock's (board/engine/clock.py)."""
    address = f"127.0.0.1:{port}"
    return {
        "ismaster": True,
        "isWritablePrimary": True,
        "setName": "rs-wire",
        "hosts": [address],
        "primary": address,
        "me": address,
        "minWireVersion": 0,
        "maxWireVersion": 21,
        "logicalSessionTimeoutMinutes": 30,
        "maxBsonObjectSize": 16 * 1024 * 1024,
        "maxMessageSizeBytes": 48_000_000,
        "maxWriteBatchSize": 100_000,
    }


@pytest.fixture
def server(django_db_blocker):
    """A scripted primary on the "wire" alias's port, and a fresh MongoClient for each test
    (the backend keeps one per alias for the process): sessions then start at txnNumber 1 and
    nothing a previous test left unanswered can reach this one."""
    mock = MockupDB(port=settings.WIRE_PORT, auto_ismaster=primary_hello(settings.WIRE_PORT),
                    request_timeout=RECEIVE_TIMEOUT)
    mock.run()
    # Django checks the server's version when a thread's connection opens (the backend needs 6.0).
    mock.autoresponds("buildinfo", version="7.0.0", versionArray=[7, 0, 0, 0])
    # Closing the client ends its pooled sessions with one command (its argument is the list of
    # sessions, so it is matched by name).
    mock.autoresponds(lambda request: request.command_name == "endSessions" and request.replies())
    # pytest-django blocks database access outside `django_db` tests; "wire" needs no test
    # database (asking for one would create it on this scripted server), only the connection.
    with django_db_blocker.unblock():
        try:
            yield mock
        finally:
            client = DatabaseWrapper._connection_pools.pop(ALIAS, None)
            if client is not None:
                client.close()
            mock.stop()  # closes the sockets: an engine thread still waiting on one gets an error


class InThread:
    """An engine call running in a thread of its own, as in a server worker. Its Django
    connection to "wire" is that thread's own, on the alias's shared MongoClient."""

    def __init__(self, fn, *args, **kwargs) -> None:
        self._outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                self._outcome["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the test thread by result()
                self._outcome["error"] = exc

        self._thread = threading.Thread(target=run, name=f"engine {fn.__name__}", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def outcome(self) -> str:
        return repr(self._outcome.get("error", self._outcome.get("value")))

    def result(self):
        self._thread.join(RECEIVE_TIMEOUT)
        if self._thread.is_alive():
            raise AssertionError(f"{self._thread.name} did not finish within {RECEIVE_TIMEOUT} s")
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


@dataclass(frozen=True)
class Transaction:
    """A transaction on the wire: its session id and transaction number."""

    lsid: dict
    number: int


class Wire:
    """The test's side of the wire: receive the engine's next command, check it, answer it."""

    def __init__(self, server: MockupDB) -> None:
        self.server = server
        self.received: list = []
        self.verb: InThread | None = None

    def run(self, fn, *args, **kwargs) -> InThread:
        """Start an engine call; the test then answers its commands."""
        self.verb = InThread(fn, *args, **kwargs)
        return self.verb

    def next(self, name: str, target: Any = None):
        request = self._receive(name)
        self.received.append(request)
        assert request.command_name.lower() == name.lower(), f"expected {name}, the engine sent {request!r}"
        if target is not None:
            assert request[request.command_name] == target, request
        return request

    def _receive(self, name: str):
        """The next command, within RECEIVE_TIMEOUT; a verb that has ended instead is reported
        with what it returned or raised (not as a silent wait for a command that cannot come)."""
        deadline = time.monotonic() + RECEIVE_TIMEOUT
        while True:
            try:
                return self.server.receives(timeout=POLL_SECONDS)
            except AssertionError:  # nothing yet (no matcher is given: nothing else raises it)
                # An ended verb has had an answer to every command it sent: none can be queued.
                if self.verb is not None and self.verb.done():
                    raise AssertionError(f"expected {name}, but the verb ended: {self.verb.outcome()}") from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"expected {name}, the engine sent nothing in {RECEIVE_TIMEOUT} s") from None

    def clock(self, at: datetime = NOW) -> None:
        """board.engine.clock.now: the primary's time from `hello`, asked outside the transaction
        (MongoDB does not allow `hello` in one)."""
        hello = self.next("hello", 1)
        assert hello.namespace == "admin"
        for field in ("txnNumber", "startTransaction", "autocommit"):
            assert field not in hello, hello
        hello.replies(localTime=at)

    def read_task(self, stored: dict) -> Transaction:
        """The verb's read of the task: the transaction's first command."""
        read = self.next("aggregate", "board_task")
        assert read["pipeline"] == [{"$match": {"_id": stored["_id"]}}, {"$limit": 21}]
        transaction = Transaction(read["lsid"], read["txnNumber"])
        assert read["startTransaction"] is True
        assert read["autocommit"] is False
        assert read["readConcern"] == {"level": "snapshot"}
        assert "writeConcern" not in read
        read.replies(cursor={"id": 0, "ns": f"{ALIAS}.board_task", "firstBatch": [stored]})
        return transaction

    def in_transaction(self, transaction: Transaction, name: str, target: Any = None):
        """A later command of `transaction`: same session and number, no start, no read concern
        (only the first command carries them) and no write concern (only the commit does)."""
        request = self.next(name, target)
        assert request["lsid"] == transaction.lsid
        assert request["txnNumber"] == transaction.number
        assert request["autocommit"] is False
        for field in ("startTransaction", "readConcern", "writeConcern"):
            assert field not in request, request
        return request

    def cas(self, transaction: Transaction):
        """The compare-and-swap: its one update statement (not yet answered)."""
        update = self.in_transaction(transaction, "update", "board_task")
        assert update["ordered"] is True
        return update

    def queue_slot(self, transaction: Transaction, *, taken: bool) -> None:
        """Flow control (board.engine.flow), after a move into RUNNING (`taken`) or out of it: the
        task's queue is asked whether it is paused or limited (here it has no row: no limit), or
        given its slot back only where it is counted: the task holds no shard's slot (its slot,
        read again, is null), so its queue's debt, where there is one."""
        if taken:
            read = self.in_transaction(transaction, "aggregate", "board_queue")
            assert read["pipeline"][0] == {"$match": {"_id": "default"}}, read
            read.replies(cursor={"id": 0, "ns": f"{ALIAS}.board_queue", "firstBatch": []})
            return
        # The task's slot, read again in the transaction (a limit changed meanwhile may have
        # given it another: flow.give_back_slot).
        read = self.in_transaction(transaction, "aggregate", "board_task")
        assert read["pipeline"][0] == {"$match": {"_id": TASK_ID}}, read
        assert read["pipeline"][1] == {"$project": {"slot": 1, "_id": 1}}, read
        read.replies(cursor={"id": 0, "ns": f"{ALIAS}.board_task", "firstBatch": [{"_id": TASK_ID, "slot": None}]})
        update = self.in_transaction(transaction, "update", "board_queueshard")
        statement, = update["updates"]
        assert conjuncts(statement["q"]) == conjuncts({"$and": [
            {"queue": "default"}, {"kind": "debt"}, {"running": {"$gt": 0}}]}), statement
        update.replies(n=0, nModified=0)

    def history(self, transaction: Transaction, *, last: int) -> dict:
        """The move's history row: its id from the `board_counter` document (incremented in the
        same transaction; `last` is the counter before), then its insert. Returns the row."""
        counter = self.in_transaction(transaction, "findAndModify", "board_counter")
        assert counter["query"] == {"_id": "board_taskevent"}
        assert counter["update"] == {"$inc": {"last": 1}}
        assert counter["new"] is True and counter["upsert"] is True
        counter.replies(value={"_id": "board_taskevent", "last": last + 1},
                        lastErrorObject={"n": 1, "updatedExisting": True})
        insert = self.in_transaction(transaction, "insert", "board_taskevent")
        row, = insert["documents"]
        insert.replies(n=1)
        return row

    def end(self, transaction: Transaction, name: str, *, answer: dict | None = None) -> None:
        """commitTransaction or abortTransaction: on admin, with write concern majority."""
        end = self.next(name, 1)
        assert end.namespace == "admin"
        assert end["lsid"] == transaction.lsid
        assert end["txnNumber"] == transaction.number
        assert end["autocommit"] is False
        assert end["writeConcern"] == {"w": "majority"}
        assert "startTransaction" not in end
        end.replies(**(answer or {}))


@pytest.fixture
def wire(server) -> Wire:
    return Wire(server)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stored_task(**fields: Any) -> dict:
    """A task's document as the board.mongodb engine stores it: the model's columns by name
    (the primary key is the document's `_id`: board/models.py)."""
    document = {
        "_id": TASK_ID, "title": "wire", "description": "", "payload": None,
        "queue": "default", "priority": 0, "on_hold": False, "max_retries": 3,
        "stage": "QUEUED", "version": 0, "owner": "", "lease_token_hash": None, "fence": 0,
        "lease_expires_at": None, "claim_request_hash": None, "claim_token_seed": None,
        "attempts": 0, "not_before": None, "checkpoint": None, "progress": None, "result": None,
        "last_error": "", "created_at": NOW - timedelta(hours=1), "updated_at": NOW - timedelta(minutes=1),
        "has_deps": False, "has_dependents": False, "stage_changed_at": NOW - timedelta(minutes=5),
    }
    unknown = set(fields) - set(document)
    assert not unknown, unknown
    document.update(fields)
    return document


def held_task(token: str, **fields: Any) -> dict:
    return stored_task(**{"stage": "RUNNING", "version": 4, "owner": "agent-1", "lease_token_hash": sha256(token),
                          "fence": 3, "attempts": 1, "lease_expires_at": NOW + timedelta(seconds=30), **fields})


def conjuncts(query: dict) -> list:
    """The conditions a filter ANDs, in a stable order (their order in `$and` means nothing)."""
    parts = query["$and"] if set(query) == {"$and"} else [{key: value} for key, value in query.items()]
    return sorted(parts, key=repr)


def literal_set(**values: Any) -> list:
    """The pipeline update the backend sends: `$set` of each column to a `$literal` value."""
    return [{"$set": {column: {"$literal": value} for column, value in values.items()}}]


def aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC)


def test_renew_is_one_conditional_update_in_a_snapshot_transaction_committed_by_majority(wire):
    token = "renew-token"
    verb = wire.run(transitions.renew, TASK_ID, token, 60, agent="agent-1", using=ALIAS)

    wire.clock()
    transaction = wire.read_task(held_task(token))
    update = wire.cas(transaction)
    statement, = update["updates"]
    assert conjuncts(statement["q"]) == conjuncts({"$and": [
        {"_id": TASK_ID},
        {"stage": "RUNNING"},
        {"version": 4},
        {"lease_token_hash": sha256(token)},
        # renew's guard: the lease is still live in the statement itself
        {"lease_expires_at": {"$gt": NOW}},
    ]})
    assert statement["u"] == literal_set(
        lease_expires_at=NOW + timedelta(seconds=60), stage="RUNNING", version=5, updated_at=NOW)
    assert statement["multi"] is True
    assert statement["upsert"] is False
    update.replies(n=1, nModified=1)
    row = wire.history(transaction, last=41)
    wire.end(transaction, "commitTransaction")

    claim = verb.result()
    assert (claim.task.version, claim.lease.fence, claim.lease.token) == (5, 3, token)
    assert claim.lease.expires_at == aware(NOW + timedelta(seconds=60))
    assert row == {
        "_id": 42, "task_id": TASK_ID, "verb": "renew", "from_stage": "RUNNING", "to_stage": "RUNNING",
        "version": 5, "fence": 3, "actor": "agent-1", "at": NOW, "detail": None,
    }
    assert not any(token in repr(request) for request in wire.received), "the lease token went on the wire"


def test_complete_pins_the_token_and_the_absence_of_dependents(wire):
    token = "complete-token"
    verb = wire.run(transitions.complete, TASK_ID, token, {"rows": 3}, agent="agent-1", using=ALIAS)

    wire.clock()
    transaction = wire.read_task(held_task(token, version=7))
    update = wire.cas(transaction)
    statement, = update["updates"]
    assert conjuncts(statement["q"]) == conjuncts({"$and": [
        {"_id": TASK_ID},
        {"stage": "RUNNING"},
        {"version": 7},
        {"lease_token_hash": sha256(token)},
        # read without dependents: a dependent created meanwhile makes this CAS miss
        {"has_dependents": False},
    ]})
    assert statement["u"] == literal_set(
        result={"rows": 3}, owner="", lease_token_hash=None, lease_expires_at=None, claim_request_hash=None,
        claim_token_seed=None, stage="COMPLETED", version=8, updated_at=NOW, stage_changed_at=NOW)
    assert statement["multi"] is True
    assert statement["upsert"] is False
    update.replies(n=1, nModified=1)
    wire.queue_slot(transaction, taken=False)
    row = wire.history(transaction, last=7)
    wire.end(transaction, "commitTransaction")

    task = verb.result()
    assert (task.stage, task.version, task.result, task.lease_token_hash) == ("COMPLETED", 8, {"rows": 3}, None)
    assert (row["_id"], row["verb"], row["from_stage"], row["to_stage"], row["version"]) == (
        8, "complete", "RUNNING", "COMPLETED", 8)


def test_claim_sets_a_new_lease_whose_token_only_travels_as_its_hash(wire):
    verb = wire.run(transitions.claim, TASK_ID, "agent-2", 45, using=ALIAS)

    wire.clock()
    transaction = wire.read_task(stored_task(stage="QUEUED", version=2, fence=3, attempts=0))
    update = wire.cas(transaction)
    statement, = update["updates"]
    assert conjuncts(statement["q"]) == conjuncts({"$and": [{"_id": TASK_ID}, {"stage": "QUEUED"}, {"version": 2}]})
    assert statement["multi"] is True
    assert statement["upsert"] is False
    update.replies(n=1, nModified=1)
    wire.queue_slot(transaction, taken=True)
    row = wire.history(transaction, last=0)
    wire.end(transaction, "commitTransaction")

    claim = verb.result()
    assert statement["u"] == literal_set(
        owner="agent-2", lease_token_hash=sha256(claim.lease.token), fence=4,
        lease_expires_at=NOW + timedelta(seconds=45), not_before=None, claim_request_hash=None,
        claim_token_seed=None, attempts=1, stage="RUNNING", version=3, updated_at=NOW, stage_changed_at=NOW)
    assert (claim.lease.fence, claim.lease.expires_at, claim.task.version) == (
        4, aware(NOW + timedelta(seconds=45)), 3)
    assert (row["_id"], row["verb"], row["actor"], row["fence"]) == (1, "claim", "agent-2", 4)
    assert not any(claim.lease.token in repr(request) for request in wire.received), \
        "the minted token went on the wire"


WRITE_CONFLICT = {
    "code": 112,
    "codeName": "WriteConflict",
    "errmsg": "WriteConflict error: this operation conflicted with another operation. Please retry your operation "
              "or multi-document transaction.",
    "errorLabels": ["TransientTransactionError"],
}
# What a primary answers to abortTransaction once a conflict has aborted the transaction itself.
NO_SUCH_TRANSACTION = {"ok": 0, "code": 251, "codeName": "NoSuchTransaction",
                       "errmsg": "Transaction with { txnNumber: 1 } has been aborted."}


def conflict(wire: Wire, transaction: Transaction) -> None:
    """Answer the CAS with a WriteConflict; the engine must abort that transaction."""
    update = wire.cas(transaction)
    update.command_err(**WRITE_CONFLICT)
    wire.end(transaction, "abortTransaction", answer=NO_SUCH_TRANSACTION)


def test_a_write_conflict_aborts_and_runs_renew_again_in_a_new_transaction(wire):
    token = "renew-token"
    verb = wire.run(transitions.renew, TASK_ID, token, 60, agent="agent-1", using=ALIAS)

    wire.clock()
    first = wire.read_task(held_task(token, version=4))
    conflict(wire, first)

    # The verb runs again from the start: a new clock reading, a new transaction, and the row
    # as the winner left it (here the holder's own earlier renew: version 5).
    later = NOW + timedelta(milliseconds=40)
    wire.clock(later)
    second = wire.read_task(held_task(token, version=5, lease_expires_at=NOW + timedelta(seconds=50)))
    assert (second.lsid, second.number) != (first.lsid, first.number)
    if second.lsid == first.lsid:  # the session went back to the pool: a higher number on it
        assert second.number > first.number
    update = wire.cas(second)
    statement, = update["updates"]
    assert {"version": 5} in statement["q"]["$and"]
    assert statement["u"] == literal_set(
        lease_expires_at=later + timedelta(seconds=60), stage="RUNNING", version=6, updated_at=later)
    update.replies(n=1, nModified=1)
    wire.history(second, last=50)
    wire.end(second, "commitTransaction")

    claim = verb.result()
    assert (claim.task.version, claim.lease.expires_at) == (6, aware(later + timedelta(seconds=60)))


def test_a_write_conflict_then_a_takeover_raises_lease_lost_not_a_database_error(wire):
    token = "complete-token"
    verb = wire.run(transitions.complete, TASK_ID, token, {"rows": 3}, agent="agent-1", using=ALIAS)

    wire.clock()
    first = wire.read_task(held_task(token, version=7))
    conflict(wire, first)

    # The winner was another agent taking the task over: the run again reads its lease, refuses
    # before any write, and aborts the (read-only) transaction.
    wire.clock()
    second = wire.read_task(held_task("someone-else", version=9, owner="agent-9", fence=4))
    assert (second.lsid, second.number) != (first.lsid, first.number)
    wire.end(second, "abortTransaction")

    with pytest.raises(errors.LeaseLost) as raised:
        verb.result()
    assert not isinstance(raised.value, DatabaseError)
