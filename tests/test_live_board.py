"""The live board against the real server (`manage.py serve`: uvicorn workers, Channels), real
websocket clients and real stores: every committed change reaches a socket whatever the size and
commit order of the transactions, and the socket survives what goes wrong around it (a broken
Redis, a failed snapshot, a hostile message, dropped database connections, a client that never
reads).

Sessions are written straight into the server's database, signed with this process's
SECRET_KEY, which the server is given: a socket logs in with a real session cookie."""
from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
)
from django.contrib.auth.models import Permission
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import connections
from django.db.models import Count
from django.utils import timezone
from django.utils.crypto import get_random_string
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from board import agent_keys
from board.engine import transitions
from board.engine.stores import store
from board.engine.limits import MAX_BATCH_TASKS
from board.engine.transitions import TaskSpec
from board.live.reads import COLUMN_PAGE
from board.models import Task, TaskEvent
from tests.live_server import BoardServer, server_for_sessions, wait_until
from tests.support import postgres_db_mark, terminate_backends

WAIT = 60  # seconds: a generous bound for something to arrive on a loaded 2-core machine


def staff_session(using: str, *, permission: bool = True) -> tuple:
    """A staff user (with `board.view_task` unless told otherwise) and a session key for them in
    the database `using`, as Django's login would write it."""
    user = get_user_model().objects.db_manager(using).create_user(
        f"staff-{time.monotonic_ns()}", password="x", is_staff=True)
    if permission:
        user.user_permissions.add(
            Permission.objects.using(using).get(codename="view_task", content_type__app_label="board"))
    data = {SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
            HASH_SESSION_KEY: user.get_session_auth_hash()}
    key = get_random_string(32)
    Session.objects.using(using).create(session_key=key, session_data=SessionStore().encode(data),
                                        expire_date=timezone.now() + timedelta(hours=1))
    return user, key


class BoardSocket:
    """A websocket client of the board, read in a thread: keeps, like the page, each task's
    newest (id -> version) from snapshots and change frames, drops the tasks the prune deleted
    (those the snapshot did not already leave out), and how the socket closed."""

    def __init__(self, server: BoardServer, session_key: str | None, *, read: bool = True):
        headers = {"Origin": server.url}
        if session_key:
            headers["Cookie"] = f"sessionid={session_key}"
        self.ws = ws_connect(f"ws://127.0.0.1:{server.port}/ws/board/", additional_headers=headers,
                             open_timeout=WAIT, max_size=None, close_timeout=5).__enter__()
        self.versions: dict[str, int] = {}
        self.max_event_id = 0
        self.snapshot_removal_id = 0
        self.removed: set[str] = set()  # tasks dropped by "removed" frames
        self.snapshots = 0
        self.counts: dict[str, int] = {}  # the last snapshot's counts per stage
        self.changes = 0
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        if read:
            self.thread.start()

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code if self.closed.is_set() else None

    def _apply(self, task: dict | None) -> None:
        if task is None:  # an event of a task deleted since: nothing to show
            return
        if task["version"] >= self.versions.get(task["id"], -1):
            self.versions[task["id"]] = task["version"]

    def _read(self) -> None:
        try:
            while True:
                message = json.loads(self.ws.recv())
                if message["type"] == "snapshot":
                    self.snapshots += 1
                    self.max_event_id = max(self.max_event_id, message["last_event_id"] or 0)
                    self.snapshot_removal_id = message["last_removal_id"]
                    self.counts = message["counts"]
                if message["type"] in ("snapshot", "snapshot_more"):
                    for task in message["tasks"]:
                        self._apply(task)
                elif message["type"] == "removed":
                    for removal in message["tasks"]:
                        if removal["id"] > self.snapshot_removal_id:
                            self.versions.pop(removal["task"], None)
                            self.removed.add(removal["task"])
                elif message["type"] == "tasks":
                    for item in message["items"]:
                        self.changes += 1
                        self._apply(item["task"])
                        self.max_event_id = max(self.max_event_id, item["event"]["id"])
        except ConnectionClosed:
            pass
        finally:
            self.closed.set()

    def start_reading(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.ws.close()
        if self.thread.is_alive():
            self.thread.join(timeout=WAIT)


def db_versions(using: str) -> dict[str, int]:
    return dict(Task.objects.using(using).values_list("id", "version"))


def wait_for_versions(socket: BoardSocket, using: str, timeout: float = WAIT) -> None:
    """Wait until the socket shows every task at the database's version; say what differs."""
    try:
        wait_until(lambda: socket.versions == db_versions(using), timeout, "the socket caught up")
    except AssertionError:
        want, got = db_versions(using), dict(socket.versions)
        missing = [t for t in want if t not in got]
        stale = [t for t in want if t in got and got[t] != want[t]]
        raise AssertionError(f"the socket never caught up: {len(missing)} of {len(want)} tasks missing "
                             f"(e.g. {missing[:3]}), {len(stale)} at an old version (e.g. {stale[:3]})") from None


def wait_for_a_current_snapshot(socket: BoardSocket, using: str, timeout: float = WAIT) -> None:
    """Wait until the socket holds a snapshot of the board as it is: each column's first page
    (board.live.reads.COLUMN_PAGE) at the database's versions and every column's count, for a
    board that does not change meanwhile (a socket holds a window of each column, not every task)."""
    def current():
        want = db_versions(using)
        counts = dict(Task.objects.using(using).values_list("stage").annotate(n=Count("id")).order_by())
        pages = sum(min(n, COLUMN_PAGE) for n in counts.values())
        got = dict(socket.versions)
        return (len(got) == pages and all(want.get(t) == v for t, v in got.items())
                and {s: n for s, n in socket.counts.items() if n} == counts)

    wait_until(current, timeout, "a snapshot of the board as it is")


@pytest.fixture(scope="module")
def pg_server(django_db_setup, django_db_blocker):
    """The real server on the PostgreSQL test database, signing sessions with our SECRET_KEY."""
    if not settings.POSTGRES_AVAILABLE:
        pytest.skip("NOT RUN: PostgreSQL tests (no server)")
    with django_db_blocker.unblock():
        server = server_for_sessions("postgres")
    try:
        yield server
    finally:
        server.close()


# ---------------------------------------------------------------------------------------------
# Item: every committed event reaches the board, whatever the size and order of transactions

BATCH = 3000
AGENTS = 8
CLAIMS_PER_AGENT = 60
OLD_HOLE_PATIENCE = 10.0  # seconds the tailer used to wait for a missing id before forgetting it


def create_in_one_transaction(prefix: str, alias: str) -> None:
    """BATCH tasks committed together: requests of at most MAX_BATCH_TASKS in one transaction."""
    with store(alias).write_transaction():
        for start in range(0, BATCH, MAX_BATCH_TASKS):
            transitions.create([TaskSpec(id=f"{prefix}-{i}", title=prefix)
                                for i in range(start, min(start + MAX_BATCH_TASKS, BATCH))], using=alias)


@pytest.mark.parametrize("alias", [pytest.param("postgres", marks=postgres_db_mark())])
def test_large_batches_committed_out_of_order_and_eight_agents_all_reach_the_socket(alias, pg_server):
    _, session = staff_session(alias)
    socket = BoardSocket(pg_server, session)
    wait_until(lambda: socket.snapshots, WAIT, "the first snapshot")
    barrier = threading.Barrier(2 + AGENTS)
    held_inserted, open_committed = threading.Event(), threading.Event()
    failures: list = []

    def guarded(work):
        def run(*args):
            try:
                barrier.wait(timeout=WAIT)
                work(*args)
            except BaseException as exc:  # judged by the test below
                failures.append(exc)
            finally:
                connections[alias].close()
        return run

    def held_batch():
        # Takes its event ids first, and commits last: every later commit leaves holes below it.
        # It stays open until the socket has seen later events, and then longer than the old
        # tailer's patience for a hole (a transaction can stay open that long on a loaded server).
        with store(alias).write_transaction():
            create_in_one_transaction("held", alias)
            own_last = TaskEvent.objects.using(alias).order_by("-id").values_list("id", flat=True).first()
            held_inserted.set()
            wait_until(lambda: socket.max_event_id > own_last, WAIT, "a later commit reached the socket")
            time.sleep(OLD_HOLE_PATIENCE + 1)  # the hole's age, which no condition can stand for

    def open_batch():
        assert held_inserted.wait(timeout=WAIT)
        create_in_one_transaction("open", alias)
        open_committed.set()

    def agent(n):
        assert open_committed.wait(timeout=WAIT)
        for _ in range(CLAIMS_PER_AGENT):
            claim = transitions.claim_next(f"agent-{n}", 60, using=alias)
            if claim is None:
                break
            transitions.renew(claim.task.pk, claim.lease.token, 60, progress=0.5, using=alias)
            transitions.complete(claim.task.pk, claim.lease.token, {"by": n}, using=alias)

    threads = [threading.Thread(target=guarded(held_batch)), threading.Thread(target=guarded(open_batch))]
    threads += [threading.Thread(target=guarded(agent), args=(n,)) for n in range(AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert Task.objects.using(alias).count() == 2 * BATCH
    assert Task.objects.using(alias).filter(stage="COMPLETED").count() == AGENTS * CLAIMS_PER_AGENT
    wait_for_versions(socket, alias)
    socket.close()


# ---------------------------------------------------------------------------------------------
# Item: after PostgreSQL drops the server's connections, live updates and the API recover


def api_get(server: BoardServer, path: str, key: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def terminate_other_backends(alias: str) -> int:
    """pg_terminate_backend on every connection to this test database but ours (the server's),
    waiting (up to 10 s) until every one has gone: a terminated backend exits a moment
    after the signal, and a request in that moment would fail whatever the server did."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        terminated = terminate_backends(cursor, [pid for pid, in cursor.fetchall()])
    # That also killed the idle connections of this test process's own pool (its other threads'):
    # start it afresh, so that the tests after this one do not meet them.
    connections[alias].close()
    connections[alias].close_pool()
    return terminated


@pytest.mark.parametrize("alias", [pytest.param("postgres", marks=postgres_db_mark())])
def test_after_postgres_drops_the_servers_connections_live_updates_and_the_api_recover(alias, pg_server):
    _, key = agent_keys.create_key("reader", using=alias)
    _, session = staff_session(alias)
    socket = BoardSocket(pg_server, session)
    wait_until(lambda: socket.snapshots, WAIT, "the snapshot")
    # Fill the servers' connection pools: many requests at once, each holding a connection.
    barrier = threading.Barrier(16)
    statuses: list = []

    def warm():
        barrier.wait(timeout=WAIT)
        statuses.append(api_get(pg_server, "/api/tasks", key))

    threads = [threading.Thread(target=warm) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 16
    transitions.create(TaskSpec(id="before", title="before"), using=alias)
    wait_for_versions(socket, alias)

    assert terminate_other_backends(alias) > 0
    transitions.create(TaskSpec(id="after", title="after"), using=alias)
    wait_for_versions(socket, alias)  # the tailer came back by itself: no new socket connected
    statuses = [api_get(pg_server, "/api/tasks", key) for _ in range(30)]
    assert statuses == [200] * 30, pg_server.log_tail()
    assert socket.close_code is None
    socket.close()
