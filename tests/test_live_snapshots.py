"""Snapshots are built on a thread of their own, one build at a time per process, shared by every
socket that asked before it started (board.live.snapshots): driven through the real ASGI
application with Channels' WebsocketCommunicator, against the real SQLite test database. A build
is held on a threading.Event to make the overlap certain (no timing)."""
import asyncio
import json
import threading

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live import frames as live_frames
from board.live import snapshots, tailer
from tests.support import sqlite_db_mark
from tests.test_consumers import WAIT, drain, login_cookie, open_socket, receive_until, run

pytestmark = sqlite_db_mark()
SOCKETS = 6


def held_builds(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the snapshot builds wait on `release` once one has started (`started` is then set)."""
    real = live_frames.snapshot_frames
    started, release = threading.Event(), threading.Event()

    def held(**kwargs):
        started.set()
        if not release.wait(WAIT * 4):
            raise AssertionError("the test never released the build")
        return real(**kwargs)

    monkeypatch.setattr(live_frames, "snapshot_frames", held)
    return started, release


async def until(condition, what: str) -> None:
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within {WAIT} s")


def test_sockets_that_ask_while_a_snapshot_is_built_share_the_next_build(monkeypatch):
    transitions.create([TaskSpec(id=f"t{n}", title="t") for n in range(10)])
    cookie = login_cookie()
    started, release = held_builds(monkeypatch)

    async def scenario():
        first, connected, _ = await open_socket(cookie)
        assert connected
        await until(started.is_set, "the first socket's build started")  # and is held
        builds = snapshots.builds()
        others = [(await open_socket(cookie))[0] for _ in range(SOCKETS - 1)]
        await until(lambda: builds.requests == SOCKETS, "every socket asked for its snapshot")
        release.set()
        for socket in [first, *others]:
            head = await receive_until(socket, lambda m: m["type"] == "snapshot", [], wait=WAIT)
            assert len(head["tasks"]) == 10
            await socket.disconnect()
        return builds.builds

    # One build for the first socket, one for the five that asked while it ran (not five).
    assert run(scenario()) == 2


def test_a_socket_gets_its_changes_while_another_sockets_snapshot_is_being_built(monkeypatch):
    cookie = login_cookie()

    async def scenario():
        watcher, connected, _ = await open_socket(cookie)
        assert connected
        await receive_until(watcher, lambda m: m["type"] == "snapshot", [])
        started, release = held_builds(monkeypatch)
        asker, connected, _ = await open_socket(cookie)
        assert connected
        await until(started.is_set, "the asker's snapshot build started")
        try:
            # The asker's snapshot is being built (and held): the tailer reads and sends on. (The
            # commit from a thread of its own, not the sync thread the tailer reads with.)
            await asyncio.to_thread(transitions.create, TaskSpec(id="during", title="made during a snapshot"))
            try:
                change = await receive_until(watcher, lambda m: m["type"] == "task", [])
            except TimeoutError:
                raise AssertionError("no change reached the watcher while another socket's snapshot was built") from None
            assert change["task"]["id"] == "during"
        finally:
            release.set()
        head = await receive_until(asker, lambda m: m["type"] == "snapshot", [])
        assert "during" in {t["id"] for t in head["tasks"]}
        await watcher.disconnect()
        await asker.disconnect()

    run(scenario())


def test_a_socket_that_asks_again_and_again_while_its_snapshot_is_built_gets_one_more(monkeypatch):
    transitions.create(TaskSpec(id="only", title="t"))
    cookie = login_cookie()
    started, release = held_builds(monkeypatch)

    async def scenario():
        socket, connected, _ = await open_socket(cookie)
        assert connected
        await until(started.is_set, "the socket's build started")
        builds = snapshots.builds()
        for _ in range(11):
            await socket.send_to(text_data=json.dumps({"type": "snapshot"}))
        # The socket took every request while its first snapshot is held (one consumer here).
        consumer = next(iter(tailer._local_tailer.subscribers))
        await until(lambda: socket.input_queue.empty() and consumer.snapshot_wanted, "the requests were read")
        assert builds.requests == 1
        release.set()
        heads = []
        while len(heads) < 2:
            heads.append(await receive_until(socket, lambda m: m["type"] == "snapshot", []))
        later = [json.loads(f)["type"] for f in await drain(socket, 0.5)]  # problems, insights, ...
        assert "snapshot" not in later  # and no third snapshot
        await socket.disconnect()
        return builds.builds

    # Eleven requests during the first build: one more snapshot, not eleven.
    assert run(scenario()) == 2
