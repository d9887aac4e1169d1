"""Snapshots under backpressure (issue 27, item 10), against the real server (`manage.py serve`,
one worker process) and real sockets:

- sockets that never read cost the server a bounded amount of memory, snapshots included
  (the worker's VmRSS is read from /proc);
- sockets asking for snapshots back to back do not hold up another socket's changes.
"""
from __future__ import annotations

import base64
import json
import os
import socket as net
import statistics
import threading
import time

import pytest
from websockets.sync.client import connect as ws_connect

from board import agent_keys
from board.engine import transitions
from board.engine.limits import MAX_BATCH_TASKS
from board.engine.transitions import TaskSpec
from tests.live_server import api_call, server_for_sessions, wait_until
from tests.test_live_board import WAIT, BoardSocket, staff_session
from tests.test_metrics import TOKEN, labelled, scrape

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

BOARD_TASKS = 6000  # titles of 300 characters: a snapshot of 2.5 MB before it held a page per column (issue 31)
STUCK_SOCKETS = 40
FLOOD_TASKS = 3000
MAX_FLOOD_TASKS = 8000  # ~1.4 KB of frames each: past a loopback socket's kernel buffers (4 MB at most)
SEND_TIMEOUT = 8  # TASKFLOW_SOCKET_SEND_TIMEOUT of this module's server (default 30 s)
TRANSPORT_HIGH_WATER = 64 * 1024  # asyncio's (and uvloop's) default for a transport's write buffer


@pytest.fixture(scope="module")
def big_board_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """One worker process (the sockets, the changes made through its API and its tailer all meet
    in it), with its metrics (which way frames went)."""
    with django_db_blocker.unblock():
        server = server_for_sessions("default", args=["--workers", "1"],
                                     env={"TASKFLOW_SOCKET_SEND_TIMEOUT": str(SEND_TIMEOUT),
                                          "PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("metrics")),
                                          "TASKFLOW_METRICS_TOKEN": TOKEN})
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def big_board(big_board_server):
    """A board whose snapshot is a few MB (each test's rows are flushed after it), and an agent
    key for the server's API."""
    title = "t" * 300
    for start in range(0, BOARD_TASKS, MAX_BATCH_TASKS):
        transitions.create([TaskSpec(id=f"big-{n}", title=title) for n in range(start, start + MAX_BATCH_TASKS)])
    return big_board_server, agent_keys.create_key("latency")[1]


def rss_of_tree(pid: int) -> int:
    """VmRSS (bytes) of process `pid` and every process below it (the worker serving sockets)."""
    total, pids = 0, [pid]
    while pids:
        current = pids.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                total += next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
            with open(f"/proc/{current}/task/{current}/children") as children:
                pids += [int(child) for child in children.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def stuck_socket(port: int, session_key: str) -> net.socket:
    """A websocket to the board that completes its handshake and then never reads (a tiny
    receive buffer, so that the kernel holds little for it)."""
    sock = net.socket()
    sock.setsockopt(net.SOL_SOCKET, net.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws/board/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Origin: http://127.0.0.1:{port}\r\nCookie: sessionid={session_key}\r\n\r\n").encode())
    answer = b""
    while b"\r\n\r\n" not in answer:  # the handshake's answer only, byte by byte: no frame read
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return sock


STALLED = "dropping a board socket that took no frame"


def flood() -> None:
    """FLOOD_TASKS cards of 300-character titles (about 2 MB of frames), in batches."""
    for start in range(0, FLOOD_TASKS, MAX_BATCH_TASKS):
        transitions.create([TaskSpec(id=f"flood-{n}", title="f" * 300) for n in range(start, start + MAX_BATCH_TASKS)])


def full_snapshot(socket: BoardSocket, before: int) -> None:
    wait_until(lambda: socket.snapshots > before and socket.snapshot_done, WAIT, "a snapshot arrived whole")


class CountingSocket(BoardSocket):
    """A board socket that knows when its last snapshot arrived whole, and when each task first
    appeared."""

    def __init__(self, *args, **kwargs):
        self.snapshot_done = False
        self.snapshot_bytes = 0  # of the last snapshot
        self.max_frame = 0
        self.first_seen: dict[str, float] = {}
        super().__init__(*args, **kwargs)

    def _apply(self, task: dict) -> None:
        self.first_seen.setdefault(task["id"], time.monotonic())
        super()._apply(task)

    def _read(self) -> None:
        real_recv = self.ws.recv

        def recv():
            text = real_recv()
            message = json.loads(text)
            if message["type"] == "snapshot":
                self.snapshot_done = False
                self.snapshot_bytes = 0
            if message["type"] in ("snapshot", "snapshot_more"):
                self.snapshot_bytes += len(text)
                self.max_frame = max(self.max_frame, len(text))
            if message["type"] in ("snapshot", "snapshot_more") and not message["more"]:
                self.snapshot_done = True
            return text

        self.ws.recv = recv
        super()._read()


@pytest.mark.timing  # the server's RSS: beside another worker's load it grew 51 MB against 44 (28.9 alone)
def test_sockets_that_never_read_do_not_grow_the_servers_memory_past_a_bound(big_board):
    big_board_server, _ = big_board
    _, key = staff_session("default")
    probe = CountingSocket(big_board_server, key)
    stuck: list[net.socket] = []
    try:
        full_snapshot(probe, 0)
        # Warm: a few snapshots built and sent, so that the allocator has its working set.
        for n in range(1, 4):
            probe.ws.send(json.dumps({"type": "snapshot"}))
            full_snapshot(probe, n)
        before = rss_of_tree(big_board_server.process.pid)
        stuck = [stuck_socket(big_board_server.port, key) for _ in range(STUCK_SOCKETS)]
        # A snapshot asked for after the stuck sockets opened is built after theirs were: once it
        # arrived, every stuck socket had its snapshot built and handed out.
        probe.ws.send(json.dumps({"type": "snapshot"}))
        full_snapshot(probe, 4)
        probe.ws.send(json.dumps({"type": "snapshot"}))
        full_snapshot(probe, 5)
        grown = rss_of_tree(big_board_server.process.pid) - before
        # The bound (docs/board.md, what the board guarantees): the snapshot the stuck sockets share, one more being built
        # (the probe's), and per stuck socket one frame and the transport's high-water mark,
        # twice over for the allocator's slack (freed frames do not give their pages back at once)
        # and each socket's own objects.
        bound = 2 * (2 * probe.snapshot_bytes + STUCK_SOCKETS * (probe.max_frame + TRANSPORT_HIGH_WATER))
        print(f"RSS grew {grown / 2**20:.1f} MB with {STUCK_SOCKETS} sockets that never read "
              f"(bound {bound / 2**20:.1f} MB; snapshot {probe.snapshot_bytes / 2**20:.1f} MB, "
              f"frames up to {probe.max_frame / 1024:.0f} KiB)")
        assert grown < bound, f"{STUCK_SOCKETS} sockets that never read grew the server by {grown / 2**20:.1f} MB"
        # A socket that took no frame for SEND_TIMEOUT seconds is dropped, and lets go of what it
        # holds: the next stuck socket to come does not add one more. A snapshot is each column's
        # first page (tens of KB here), which the kernel's buffers take whole: changes fill them
        # (FLOOD_TASKS cards of 300-character titles, about 2 MB of frames, shared by the sockets).
        flood()
        wait_until(lambda: big_board_server.log_tail(10**7).count(STALLED) == STUCK_SOCKETS, SEND_TIMEOUT + WAIT,
                   "every stuck socket was dropped")
        # And the server still serves: a change reaches the probe.
        transitions.create(TaskSpec(id=f"after-stuck-{time.monotonic_ns()}", title="after"))
        wait_until(lambda: any(t.startswith("after-stuck-") for t in probe.versions), WAIT, "a change arrived")
    finally:
        for sock in stuck:
            sock.close()
        probe.close()


SNAPSHOT_LOOPERS = 4
CHANGES = 20
# The median time from an API request creating a task to its card on another socket. On an idle
# server it is ~0.03 s (the issue: 0.05 s): the request, the commit waking the tailer at once, a
# pass at least MIN_PASS_SECONDS (0.02 s) after it. The bound is twice the idle figure,
# room for a 2-core machine shared with other work, and half the lowest latency seen while four
# sockets asked for snapshots back to back on the thread the tailer reads with (0.2-0.56 s in the
# issue, a median of 0.13 s here).
LATENCY_BOUND = 0.1


def change_latencies(server, agent_key: str, watcher: CountingSocket, prefix: str) -> list[float]:
    """Create CHANGES new tasks one at a time through the server's API (its commit wakes the
    worker's tailer at once); the seconds from each request until the task appeared on
    `watcher`."""
    latencies = []
    for n in range(CHANGES):
        task_id = f"{prefix}-{n}"
        started = time.monotonic()
        status, _ = api_call(server, "POST", "/api/tasks", agent_key, {"id": task_id, "title": "latency"})
        assert status == 201
        wait_until(lambda task_id=task_id: task_id in watcher.first_seen, WAIT, f"{task_id} arrived", interval=0.005)
        latencies.append(watcher.first_seen[task_id] - started)
    return latencies


@pytest.mark.timing
def test_sockets_asking_for_snapshots_back_to_back_do_not_delay_another_sockets_changes(big_board):
    big_board_server, agent_key = big_board
    _, key = staff_session("default")
    watcher = CountingSocket(big_board_server, key)
    stop = threading.Event()
    loopers: list[threading.Thread] = []
    asked = [0] * SNAPSHOT_LOOPERS

    def loop_snapshots(n: int) -> None:
        headers = {"Origin": big_board_server.url, "Cookie": f"sessionid={key}"}
        with ws_connect(f"ws://127.0.0.1:{big_board_server.port}/ws/board/", additional_headers=headers,
                        max_size=None) as ws:
            while not stop.is_set():
                message = json.loads(ws.recv(timeout=WAIT))
                if message["type"] in ("snapshot", "snapshot_more") and not message["more"]:
                    asked[n] += 1
                    ws.send(json.dumps({"type": "snapshot"}))

    try:
        full_snapshot(watcher, 0)
        quiet = change_latencies(big_board_server, agent_key, watcher, f"quiet-{time.monotonic_ns()}")
        loopers = [threading.Thread(target=loop_snapshots, args=(n,), daemon=True) for n in range(SNAPSHOT_LOOPERS)]
        for thread in loopers:
            thread.start()
        wait_until(lambda: min(asked) >= 2, WAIT, "every looper received snapshots")
        busy = change_latencies(big_board_server, agent_key, watcher, f"busy-{time.monotonic_ns()}")
        snapshots = sum(asked)
        print(f"change latency, median / max: quiet {statistics.median(quiet):.3f} / {max(quiet):.3f} s; "
              f"{SNAPSHOT_LOOPERS} sockets asking for snapshots back to back "
              f"{statistics.median(busy):.3f} / {max(busy):.3f} s ({snapshots} snapshots sent)")
        assert min(asked) >= 2
        assert statistics.median(busy) < LATENCY_BOUND, f"median change latency {statistics.median(busy):.3f} s"
    finally:
        stop.set()
        for thread in loopers:
            thread.join(timeout=WAIT)
        watcher.close()


@pytest.mark.timing
def test_sockets_that_stopped_reading_do_not_delay_another_sockets_changes(big_board):
    big_board_server, agent_key = big_board
    _, key = staff_session("default")
    watcher = CountingSocket(big_board_server, key)
    stuck: list[net.socket] = []
    try:
        full_snapshot(watcher, 0)
        quiet = change_latencies(big_board_server, agent_key, watcher, f"quiet-{time.monotonic_ns()}")
        dropped_before = big_board_server.log_tail(10**7).count(STALLED)
        stuck = [stuck_socket(big_board_server.port, key) for _ in range(STUCK_SOCKETS)]
        # Frames that reach a socket while its snapshot is on its way queue behind it: counted
        # from a change made after the stuck sockets came.
        settled = f"settled-{time.monotonic_ns()}"
        transitions.create(TaskSpec(id=settled, title="settled"))
        wait_until(lambda: settled in watcher.first_seen, WAIT, "the watcher read a change")
        queued_before = frames_by_path(big_board_server).get("queued", 0)
        # A flood the stuck sockets cannot take, while the watcher reads it all: batch after
        # batch until their buffers are full and their frames queue, a frame per stuck socket at
        # least (else this test would measure nothing). Each batch is read by the watcher before
        # the next, so it is a frame of its own: one frame of the whole flood could go to the
        # kernel's buffers at once, which on loopback grow to a few MB per socket.
        flooded = 0
        while frames_by_path(big_board_server).get("queued", 0) - queued_before < STUCK_SOCKETS:
            assert flooded < MAX_FLOOD_TASKS, f"{flooded} cards written and no stuck socket's frame queued"
            transitions.create([TaskSpec(id=f"flood-{n}", title="f" * 300)
                                for n in range(flooded, flooded + MAX_BATCH_TASKS)])
            flooded += MAX_BATCH_TASKS
            wait_until(lambda: f"flood-{flooded - 1}" in watcher.first_seen, WAIT, "the watcher read the flood")
        busy = change_latencies(big_board_server, agent_key, watcher, f"busy-{time.monotonic_ns()}")
        print(f"change latency, median / max: quiet {statistics.median(quiet):.3f} / {max(quiet):.3f} s; "
              f"beside {STUCK_SOCKETS} sockets that stopped reading ({flooded} cards flooded) {statistics.median(busy):.3f} / {max(busy):.3f} s")
        assert statistics.median(busy) < LATENCY_BOUND, f"median change latency {statistics.median(busy):.3f} s"
        # They were still there, holding frames (dropped only after SEND_TIMEOUT without taking one).
        assert big_board_server.log_tail(10**7).count(STALLED) == dropped_before
    finally:
        for sock in stuck:
            sock.close()
        watcher.close()


PING, PONG = 0x89, 0x8A  # final control frames: the server's keepalive ping, a pong


def read_frame(sock: net.socket) -> bytes:
    """One whole server text frame's payload (unmasked, unfragmented: what the board sends).
    The server's keepalive pings (uvicorn sends one every 20 s; a socket that paused reading
    finds one among its frames) are answered with a pong, as a client must, and passed over."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the server closed the socket"
            data += chunk
        return data

    while True:
        first, second = exactly(2)
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(exactly(2), "big")
        elif size == 127:
            size = int.from_bytes(exactly(8), "big")
        payload = exactly(size)
        if first == PING:  # a control frame's payload is at most 125 bytes; a client's frame is masked
            mask = os.urandom(4)
            sock.sendall(bytes([PONG, 0x80 | size]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
            continue
        assert first == 0x81, f"not a final text frame: {first:#x}"
        return payload


MAX_PAUSED_TASKS = 20_000  # cards of 300-character titles: ~1.4 KB of frames each


def frames_by_path(server) -> dict[str, float]:
    """taskflow_board_frames_total by path ("direct", "queued") in the server's metrics."""
    return {dict(labels)["path"]: count for labels, count in labelled(scrape(server), "taskflow_board_frames_total").items()}


def test_a_socket_that_stops_reading_then_reads_gets_every_change_in_order(big_board_server):
    """Frames reach a socket two ways (board/live/consumers.py `deliver`): written at once as the
    bytes built once for every socket, or queued behind the socket's earlier frames when its
    connection's buffer is full. A socket that stops reading while changes pour in, then reads
    again, must get every change once and in the order of the history, across both ways."""
    from board.models import TaskEvent

    _, key = staff_session("default")
    sock = stuck_socket(big_board_server.port, key)
    try:
        sock.settimeout(WAIT)
        before = frames_by_path(big_board_server)
        last_in_snapshot = None
        while last_in_snapshot is None:  # the snapshot's parts, then whatever follows them
            message = json.loads(read_frame(sock))
            if message["type"] == "snapshot":
                last_in_snapshot = message["last_event_id"]
        # Not reading now: the changes fill the kernel's buffers (a few MB on loopback), then
        # the server's transport (past its high water the socket's frames queue): changes are
        # made until a frame was queued, then everything is read back in one go.
        made = 0
        while frames_by_path(big_board_server).get("queued", 0) <= before.get("queued", 0):
            assert made < MAX_PAUSED_TASKS, f"{made} changes and no frame queued: the buffers never filled"
            handed = sum(frames_by_path(big_board_server).values())
            transitions.create([TaskSpec(id=f"paused-{n}", title="p" * 300) for n in range(made, made + MAX_BATCH_TASKS)])
            made += MAX_BATCH_TASKS
            wait_until(lambda handed=handed: sum(frames_by_path(big_board_server).values()) > handed, WAIT,
                       "the tailer handed the change out")
        newest = TaskEvent.objects.order_by("-id").values_list("id", flat=True).first()
        seen: list[int] = []
        while not seen or seen[-1] < newest:
            message = json.loads(read_frame(sock))
            if message["type"] == "tasks":
                seen += [item["event"]["id"] for item in message["items"]]
        expected = list(TaskEvent.objects.filter(id__gt=last_in_snapshot, id__lte=newest)
                        .order_by("id").values_list("id", flat=True))
        assert seen == expected, f"{len(seen)} events received, {len(expected)} in the history after the snapshot"
        after = frames_by_path(big_board_server)
        # Both ways were taken: the first frames at once, then (the buffer full) the queue.
        assert after.get("direct", 0) > before.get("direct", 0), (before, after)
        assert after.get("queued", 0) > before.get("queued", 0), (before, after)
        # And reading again, a new change arrives as usual.
        transitions.create(TaskSpec(id="after-the-pause", title="after"))
        while True:
            message = json.loads(read_frame(sock))
            if message["type"] == "tasks" and any(i["event"]["task"] == "after-the-pause" for i in message["items"]):
                break
    finally:
        sock.close()
