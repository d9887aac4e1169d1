"""Reads at scale (issue 9, item 5): reads never take or wait for SQLite's write lock, and check()
and the live board's snapshot stay bounded in memory on a big board, with the same results.

Against the real server (`manage.py serve`) on the real SQLite file: a writer holding the write
lock (BEGIN IMMEDIATE) and the writers' queue (the flock of `<db>-writers`, board/engine/stores/sqlite.py) must not
hold up `GET /api/check`, `GET /api/tasks` or a websocket snapshot; agents looping
`GET /api/check` on a big board must not cost a renewing agent its lease.
"""
from __future__ import annotations

import fcntl
import http.client
import json
import sqlite3
import threading
import time
import tracemalloc
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connections
from django.test import Client
from django.utils import timezone

from bench.big_board import fill_board
from board import agent_keys
from board.engine import listing, selectors, transitions
from board.engine.stores import store
from board.engine.invariants import check
from board.engine.lifecycle import TERMINAL, Stage
from board.engine.transitions import TaskSpec
from board.live import frames as live_frames
from board.live import reads as live_reads
from board.live.reads import COLUMN_PAGE
from board.models import Dependency, Task
from tests.live_server import BoardServer, server_for_sessions, wait_until
from tests.support import db_state, sql_stores, sqlite_db_mark

pytestmark = sqlite_db_mark()

READ_TIMEOUT = 10.0  # a read answers in milliseconds; before the fix these waited 30 s and more
BIG_BOARD = 40_000  # tasks: big enough that a check() holding the write lock took seconds


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """The board's server, with the test run's SECRET_KEY so that a session made here is valid."""
    with django_db_blocker.unblock():
        server = server_for_sessions("default")
    try:
        yield server
    finally:
        server.close()


def sqlite_path() -> str:
    return str(connections["default"].settings_dict["NAME"])


@contextmanager
def writer_holding_the_lock():
    """Another writer in the middle of a long write: it holds SQLite's write lock (BEGIN
    IMMEDIATE on its own connection) and the board's writers' queue (the flock of
    `<db>-writers`) until the block ends."""
    queue_fd = open(f"{sqlite_path()}-writers", "a+")
    fcntl.flock(queue_fd, fcntl.LOCK_EX)
    writer = sqlite3.connect(sqlite_path(), isolation_level=None, timeout=0)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE board_task SET title = title WHERE id = ''")
        yield
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        fcntl.flock(queue_fd, fcntl.LOCK_UN)
        queue_fd.close()


def write_lock_is_held() -> bool:
    probe = sqlite3.connect(sqlite_path(), isolation_level=None, timeout=0)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc), exc
        return True
    finally:
        probe.close()


def api(server: BoardServer, method: str, path: str, key: str, body=None, timeout: float = READ_TIMEOUT):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def session_cookie() -> str:
    user = get_user_model().objects.create_user(f"watcher-{time.monotonic_ns()}", password="x", is_staff=True)
    # Watching the board needs board.view_task (board/access.py).
    user.user_permissions.add(Permission.objects.get(content_type__app_label="board", codename="view_task"))
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def board_snapshot(server: BoardServer, cookie: str, timeout: float = READ_TIMEOUT) -> list[dict]:
    """The frames of one websocket snapshot (the socket is closed afterwards)."""
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/ws/board/", origin=server.url, proxy=None,
                 additional_headers={"Cookie": f"sessionid={cookie}"}, open_timeout=timeout) as socket:
        frames = [json.loads(socket.recv(timeout=timeout))]
        while frames[-1]["more"]:
            frames.append(json.loads(socket.recv(timeout=timeout)))
    return frames


def concurrently(calls: dict) -> dict:
    """Run each call in its own thread, released together; name -> result or the exception."""
    barrier = threading.Barrier(len(calls))
    results: dict = {}

    def run(name, call):
        barrier.wait(timeout=30)
        try:
            results[name] = call()
        except Exception as exc:  # judged by the test
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# ---------------------------------------------------------------------------------------------
# Reads beside a writer


def test_reads_answer_while_another_writer_holds_the_write_lock(server):
    transitions.create([TaskSpec(id="first", title="first"), TaskSpec(id="second", title="second", deps=["first"])])
    key = agent_keys.create_key("reader")[1]
    cookie = session_cookie()
    # The key's first use is recorded (a write, at most once a minute): done before the lock.
    assert api(server, "GET", "/api/tasks", key)[0] == 200

    with writer_holding_the_lock():
        assert write_lock_is_held()
        answers = concurrently({
            "check": lambda: api(server, "GET", "/api/check", key),
            "tasks": lambda: api(server, "GET", "/api/tasks", key),
            "snapshot": lambda: board_snapshot(server, cookie),
        })
        assert write_lock_is_held(), "the writer still held the lock while every read answered"

    failed = {name: repr(answer) for name, answer in answers.items() if isinstance(answer, Exception)}
    assert not failed, f"reads waited for the writer: {failed}"
    assert answers["check"] == (200, {"problems": []})
    status, page = answers["tasks"]
    assert status == 200 and [t["id"] for t in page["items"]] == ["first", "second"]
    head = answers["snapshot"][0]
    assert head["type"] == "snapshot" and {t["id"] for t in head["tasks"]} == {"first", "second"}
    assert head["counts"]["PENDING"] == 1 and head["counts"]["QUEUED"] == 1


def test_agents_looping_check_on_a_big_board_do_not_cost_a_renewing_agent_its_lease(server):
    """The issue's report: three agents looping GET /api/check on a big board, and a healthy
    agent renewing its lease lost it. Every renew must find the lease still held."""
    TTL = 3
    fill_board(BIG_BOARD)
    transitions.create([TaskSpec(id="held", title="held by a healthy agent", queue="healthy")])
    checker, worker = agent_keys.create_key("checker")[1], agent_keys.create_key("worker")[1]
    assert api(server, "GET", "/api/check", checker, timeout=120)[0] == 200  # the key's use, recorded

    stop = threading.Event()
    checks: list[int] = []

    def loop_check():
        while not stop.is_set():
            checks.append(api(server, "GET", "/api/check", checker, timeout=120)[0])

    loopers = [threading.Thread(target=loop_check) for _ in range(3)]
    for looper in loopers:
        looper.start()
    renewals = []
    try:
        wait_until(lambda: len(checks) >= 3, 120, "three checks answered")
        status, claim = api(server, "POST", "/api/claim", worker, {"ttl_seconds": TTL, "queue": "healthy"}, timeout=30)
        assert status == 200, claim
        token = claim["lease"]["token"]
        # A renew every ttl/3, as taskflow_client's hold() does: each must land within 2 s of
        # the last, 40 times what a renew takes on a loaded machine (before the fix: 6 s).
        for _ in range(12):
            started = time.monotonic()
            status, body = api(server, "POST", "/api/tasks/held/renew", worker,
                                {"token": token, "ttl_seconds": TTL}, timeout=30)
            renewals.append((status, round(time.monotonic() - started, 3), body if status != 200 else ""))
            if status != 200:
                break
            time.sleep(max(0.0, TTL / 3 - (time.monotonic() - started)))  # the client's cadence, not a wait
    finally:
        stop.set()
        for looper in loopers:
            looper.join(timeout=180)
    assert [r[0] for r in renewals] == [200] * 12, f"renewals (status, seconds, error): {renewals}"
    assert set(checks) == {200} and len(checks) >= 3


# ---------------------------------------------------------------------------------------------
# Bounded memory, same results


@pytest.fixture
def big_board(transactional_db):
    return fill_board(BIG_BOARD)


def traced_peak(call):
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_check_holds_no_row_per_task_and_finds_what_the_full_snapshot_finds(big_board):
    now = timezone.now()
    # Problems planted in the big board: an expired lease, a cycle, a QUEUED task waiting for it.
    running = Task.objects.filter(stage="RUNNING").order_by("pk")[0].pk
    Task.objects.filter(pk=running).update(lease_expires_at=now - timedelta(seconds=1))
    queued = Task.objects.filter(stage="QUEUED").order_by("pk")[0].pk
    Task.objects.bulk_create([Task(id=f"loop-{n}", title="on a cycle", created_at=now, updated_at=now,
                                   claim_rank=now.timestamp())
                              for n in "ab"])
    Dependency.objects.bulk_create([Dependency(task_id="loop-a", depends_on_id="loop-b"),
                                    Dependency(task_id="loop-b", depends_on_id="loop-a"),
                                    Dependency(task_id=queued, depends_on_id="loop-a")])

    found, peak = traced_peak(lambda: selectors.problems(now=now))
    assert found == check(selectors.snapshot(), now)
    assert {(p.task, p.code) for p in found} == {
        (running, "lease_expired"), (queued, "queued_blocked"), ("loop-a", "dep_cycle"), ("loop-b", "dep_cycle")}
    # 40,000 tasks read into Python took 27 MB; what check() keeps now is the dependency graph.
    assert peak < 10 * 1024 * 1024, f"check() peaked at {peak / 2**20:.1f} MB"


def test_a_snapshot_holds_its_frames_and_one_part_of_the_board_at_a_time(big_board):
    frames, peak = traced_peak(lambda: live_frames.snapshot_frames(problems=[]))
    sent = sum(len(frame) for frame in frames)
    # Each column's first page, whatever the board's size (a column holds thousands here).
    shown = sum(min(COLUMN_PAGE, Task.objects.filter(stage=stage).count()) for stage in Stage)
    cards = [card for frame in frames for card in json.loads(frame)["tasks"]]
    assert len(cards) == shown == 7 * COLUMN_PAGE
    # Every card is what card_task makes of the full row (the frames' format is unchanged).
    sample = {c["id"]: c for c in cards[:: len(cards) // 50]}
    deps = selectors.deps_of(list(sample))
    for task in Task.objects.filter(pk__in=list(sample)):
        assert sample[task.pk] == json.loads(live_frames.encode(live_frames.card_task(task, deps[task.pk])))
    # The frames themselves, plus one part of the board (SNAPSHOT_PART cards) being built.
    assert peak < sent + 8 * 1024 * 1024, f"snapshot peaked at {peak / 2**20:.1f} MB for {sent / 2**20:.1f} MB of frames"


BACKENDS = sql_stores()


def plant_every_problem(using: str, now) -> None:
    """A small board with every problem the store can hold (duplicate ids cannot be stored:
    the id is the primary key), written around the engine, plus valid tasks beside them."""
    hour = timedelta(hours=1)

    def task(task_id, stage, **fields):
        values = dict(id=task_id, title=task_id or "empty", stage=stage, created_at=now, updated_at=now,
                      claim_rank=now.timestamp())  # its creation's place in the line (priority 0)
        if stage in ("RUNNING", "PAUSED", "COMPLETED", "FAILED"):
            values["attempts"] = 1
        if stage == "RUNNING":
            values.update(owner="agent", lease_token_hash="h" * 64, lease_expires_at=now + hour)
        values.update(checkpoint={"step": 1} if stage == "PAUSED" else None,
                      result={"ok": True} if stage == "COMPLETED" else None)
        values.update(fields)
        return Task(**values)

    Task.objects.using(using).bulk_create([
        task("ok-done", "COMPLETED"), task("ok-queued", "QUEUED"), task("ok-pending", "PENDING"),
        task("ok-running", "RUNNING"), task("", "QUEUED"), task("lost", "LOST"),
        task("ghost-dep", "PENDING"), task("selfish", "PENDING"),
        task("no-owner", "RUNNING", owner=""),
        task("no-lease", "RUNNING", owner="", lease_token_hash=None, lease_expires_at=None),
        task("stray-lease", "QUEUED", owner="someone"), task("stray-expiry", "PAUSED", lease_expires_at=now),
        task("early", "RUNNING"), task("done-held", "COMPLETED", lease_token_hash="h" * 64),
        task("late", "RUNNING", lease_expires_at=now - timedelta(seconds=1)),
        task("waiting", "QUEUED"), task("paused-bare", "PAUSED", checkpoint=None),
        task("done-bare", "COMPLETED", result=None), task("dropped", "CANCELLED"), task("broke", "FAILED"),
        task("orphan", "PENDING"), task("stuck", "QUEUED"), task("dropped-too", "CANCELLED"),
        task("retried", "FAILED", attempts=9, max_retries=1),
        task("c1", "PENDING"), task("c2", "PENDING"), task("c3", "QUEUED"), task("after-cycle", "PENDING"),
        task("two-causes", "QUEUED"), task("via-ghost", "PENDING"),
        task("line-jumper", "QUEUED", claim_rank=now.timestamp() - 3600),  # ranked an hour before its creation
    ])
    edges = [("ok-queued", "ok-done"), ("ok-pending", "ok-queued"), ("lost", "ok-pending"),
             ("ghost-dep", "nowhere"), ("early", "ok-pending"), ("waiting", "ok-pending"),
             ("orphan", "dropped"), ("stuck", "broke"), ("dropped-too", "dropped"),
             ("c1", "c2"), ("c2", "c3"), ("c3", "c1"), ("after-cycle", "c1"),
             ("two-causes", "ok-pending"), ("two-causes", "c1"),
             # a cycle through a task that does not exist is none (only via-ghost's unknown_dep)
             ("via-ghost", "ghost"), ("ghost", "via-ghost")]
    if using == "default":
        edges.append(("selfish", "selfish"))
    table = Dependency._meta.db_table
    with connections[using].cursor() as cursor:
        # Around the constraints, as a damaged store or another program could.
        if using == "default":
            cursor.execute("PRAGMA foreign_keys = OFF")
            cursor.execute("PRAGMA ignore_check_constraints = ON")
        else:
            cursor.execute("SET session_replication_role = replica")
        try:
            cursor.executemany(f"INSERT INTO {table} (task_id, depends_on_id) VALUES (%s, %s)", edges)
        finally:
            if using == "default":
                cursor.execute("PRAGMA foreign_keys = ON")
                cursor.execute("PRAGMA ignore_check_constraints = OFF")
            else:
                cursor.execute("SET session_replication_role = DEFAULT")


@pytest.mark.parametrize("alias", BACKENDS)
def test_check_of_the_store_is_check_of_the_full_snapshot_for_every_problem(alias):
    from board.engine.invariants import ALL_CODES

    now = timezone.now()
    plant_every_problem(alias, now)
    found = selectors.problems(now=now, using=alias)
    assert found == check(selectors.snapshot(using=alias), now)
    unstorable = {"duplicate_id"} | ({"self_dep"} if alias == "postgres" else set())
    assert {p.code for p in found} == set(ALL_CODES) - unstorable
    assert not any(p.task.startswith("ok-") for p in found)


@pytest.mark.parametrize("alias", BACKENDS)
def test_the_snapshot_reads_every_card_as_card_task_makes_it_from_the_full_row(alias):
    """The snapshot reads rows, not model instances, and formats their times itself: every card
    must still be what card_task makes of the Task (the frames' format is unchanged)."""
    now = timezone.now()
    fill_board(3000, using=alias, now=now)
    # Whole seconds (no fraction in the text SQLite stores), a held task, progress, a backoff.
    whole = now.replace(microsecond=0)
    Task.objects.using(alias).bulk_create([Task(
        id="whole-second", title="on the second", stage="PENDING", on_hold=True, progress=0.25,
        not_before=whole, created_at=whole, updated_at=whole)])
    parts = live_reads.board_parts(using=alias)
    head = next(parts)
    cards = {row["id"]: live_frames.card_task(SimpleNamespace(**row, description="", payload=None, checkpoint=None,
                                                              result=None, notes_count=0), deps)
             for part in parts for row, deps in part}
    assert head["counts"] == {stage: Task.objects.using(alias).filter(stage=stage).count()
                              for stage in ["PENDING", "QUEUED", "RUNNING", "PAUSED", "COMPLETED", "FAILED", "CANCELLED"]}
    shown = [task for stage in Stage for task in Task.objects.using(alias).filter(stage=stage).order_by(
        *(("-updated_at", "-id") if stage in TERMINAL else ("claim_rank", "id")))[:COLUMN_PAGE]]
    deps = selectors.deps_of([t.pk for t in shown], using=alias)
    assert cards == {t.pk: json.loads(live_frames.encode(live_frames.card_task(t, deps[t.pk]))) for t in shown}
    # Each column's next page resumes after its last card, with the cursor the API gives for that
    # task (its exact times, read from the driver's values: not the card's milliseconds).
    for stage in Stage:
        column = [t for t in shown if t.stage == stage]
        more = head["counts"][stage] > COLUMN_PAGE
        assert head["next_pages"][stage] == (listing.cursor_of(column[-1], live_reads.column_order(stage)) if more else None)
    assert cards["whole-second"]["created_at"] == whole.isoformat().replace("+00:00", "Z")
    assert cards["whole-second"]["on_hold"] is True


def test_a_write_inside_a_read_transaction_is_refused_and_writes_nothing():
    before = db_state()
    with store("default").read_transaction():
        with pytest.raises(RuntimeError, match="inside read_transaction"):
            transitions.create([TaskSpec(id="refused", title="written where only reads may be")])
    assert db_state() == before
