"""The tailer: one per server process, it reads the outbox and fans each page out to the sockets.

In each server process one `Tailer` reads new events in id order (board.live.outbox) and fans
them out to that process's sockets and parked claims. A change made anywhere (another server
process, the reaper, a management command, the admin) therefore reaches every browser, after
its commit. It is started by the first socket (board.live.consumers) or parked claim
(server/serving.py) of the process (`ensure_tailer`). It is what wakes parked claims
(board.live.parked): one per task that became ready in their queue, and every
parked.POLL_SECONDS as many as the queues waited on have ready tasks (a retry backoff ending
announces itself with no event).

The fan-out does not go through a channel layer: the in-memory layer deep-copies every message
for every socket (about 3 ms per event at 100 sockets) and drops messages once a socket's queue
is full, and the Redis layer delivers at most once. The tailer encodes one frame per page of
events (a batch of changes, board.live.frames) and hands that same text to each subscribed
socket of its process, without waiting for any of them (each socket queues it:
board.live.consumers).

Reading is paged, page after page until caught up, one frame per page; the cursor moves only
after a page's frame was built and handed to the sockets, so a pass that fails (a database
error) reads the same events again next time (board.live.outbox).

Waking up: the tailer polls a few times a second. A commit in this process wakes it at once
(passes are at least `pass_gap` apart, MIN_PASS_SECONDS with a few sockets and more with many,
so a burst of commits is read in one pass; with no socket, only parked claims,
WAITERS_ONLY_PASS_SECONDS);
with a Redis channel layer (REDIS_URL) a commit in any process wakes every tailer through the
doorbell (board.live.doorbell), which is never the only carrier of an update: a Redis that
hangs or refuses only leaves the poll to do it.

Every REMOVALS_POLL_SECONDS it also reads the prune's records of deleted tasks
(board.live.outbox.Removals) and tells its sockets, whose pages drop those cards.

Besides the changes, the tailer keeps two panels current for its sockets, each computed once
per process however many sockets watch: the invariant problems (debounced: at most every
PROBLEMS_MIN_INTERVAL_SECONDS, or PROBLEMS_DUTY of the time where check() is slow, and on a
timer, since a lease expires without any event; in a task of its own) and the
agents and throughput panel (board.live.insights: at most every INSIGHTS_MIN_INTERVAL_SECONDS,
or INSIGHTS_DUTY of the time where reading the hour's history is slow, in a task of its own). And the queues strip (issue 29: each queue's limit, running count, depth
and pause): a queue's settings change with no task event (board.engine.flow.change_queue only
commits and announces), so every wake by a commit, not only a page of events, makes it due; it
is read at most every QUEUES_MIN_INTERVAL_SECONDS, on a timer too (a change made in another
process without a Redis doorbell wakes nobody here), and pushed only when its content changed.

Nothing here ever carries a lease token: frames are built by board.live.frames from
board.public.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Protocol

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from board import metrics
from board.bulk import jobs as bulk_jobs
from board.live import background, doorbell, frames, insights, outbox, parked

log = logging.getLogger("board.live.tailer")

POLL_SECONDS = 0.1  # one indexed "id > last" query: cheap enough to ask ten times a second
MIN_PASS_SECONDS = 0.02  # at most 50 passes a second, however often commits ring
# The tick grows with the sockets: every frame costs each socket a send (and each watcher a
# parse), so with many watchers a pass waits longer and gathers more changes into one frame:
# 0.02 s with a few sockets, 0.035 s at 300, 0.07 s at 1,000, MAX_PASS_SECONDS (0.25 s) from
# 4,600 on (bench/board.py --clients 1000 and 5000: docs/live-protocol.md, "How the server
# produces them").
TICK_SECONDS_PER_SOCKET = 0.00005
MAX_PASS_SECONDS = 0.25


def pass_gap(sockets: int) -> float:
    """The least time between two passes of a tailer feeding `sockets` sockets."""
    return min(MAX_PASS_SECONDS, MIN_PASS_SECONDS + sockets * TICK_SECONDS_PER_SOCKET)

# With no socket to feed, only parked claims listen (board.live.parked): for an agent's long
# poll a pass every POLL_SECONDS is soon enough, and on a busy board it saves most passes (each a
# database read and a thread hand-off in every server process), which the working agents'
# requests would otherwise pay for.
WAITERS_ONLY_PASS_SECONDS = POLL_SECONDS
PROBLEMS_MIN_INTERVAL_SECONDS = 0.5  # the problems panel is recomputed at most twice a second
PROBLEMS_REFRESH_SECONDS = 2.0  # and also on a timer: a lease expires without any event
# check() runs at most this fraction of the time (board.live.tailer._problems_gap): at 1,000,000
# tasks one takes 6 s, and every 2 s it would never stop.
PROBLEMS_DUTY = 0.1
# The agents and throughput panel (board.live.insights) reads an hour of history: at most once every
# few seconds however busy the board, and on a timer too, as its minutes roll on.
INSIGHTS_MIN_INTERVAL_SECONDS = 3.0
INSIGHTS_REFRESH_SECONDS = 30.0
# ... and at most this fraction of the time (_insights_gap): an hour of 120,000 history rows took
# 2.7 s to read (2026-12-06), and every 3 s it would hold the process's GIL most of the time,
# slowing every page, snapshot and change this process serves.
INSIGHTS_DUTY = 0.1
# Tasks the prune deleted (hourly, tasks untouched for weeks) are read this often: their cards
# may go a little late, and a busy board's passes pay no extra query.
REMOVALS_POLL_SECONDS = 2.0
# The queues strip (board.live.frames.queues_message): after a commit, at most twice a second;
# on a timer for the changes of other processes that no doorbell announced.
QUEUES_MIN_INTERVAL_SECONDS = 0.5
QUEUES_REFRESH_SECONDS = 2.0
# Bulk jobs (board.bulk): their rows are read this often while a socket watches (one indexed
# query: the active jobs and those finished in the last minute), and a "bulk" frame is pushed
# for each whose counts or state changed. A job runs in any process (a server's thread or the
# reaper): its row, not a message, is what every process's tailer reads.
BULK_POLL_SECONDS = 0.25


class Subscriber(Protocol):
    """What the tailer needs of a socket (board.live.consumers.BoardConsumer implements it):
    `deliver` takes each frame's text and its websocket bytes (`wire`, built once for every
    socket, for a server that writes them as they are: board.live.frames.SEND_FRAME); it
    answers True when the frame was written at once, False when queued, None when not taken
    (the socket is closing)."""

    async def deliver(self, frame: str, wire: bytes | None = None) -> bool | None: ...


class Tailer:
    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake = asyncio.Event()
        self.ready = asyncio.Event()  # set once it listens (cursor placed, a working doorbell answered)
        self.placed = asyncio.Event()  # set once its cursors are placed (`wait_placed`)
        self.task: asyncio.Task | None = None
        # Snapshots carry the problems; push only changes. None before the first check(): the
        # first result is pushed whatever it is (a snapshot said "not checked yet").
        self.problems_sent: list | None = None
        self.problems_at = 0.0
        self.problems_dirty = True
        self.problems_took = 0.0  # how long the last check() took (seconds)
        self.problems_failing = False
        self.problems_task: asyncio.Task | None = None
        # board.live.insights: computed here once for every socket of this process.
        self.insights = insights.Insights()
        self.insights_frame: str | None = None  # the last one computed (a new socket gets it)
        self.insights_at = 0.0
        self.insights_took = 0.0  # the last computation's time (_insights_gap)
        # Nothing is computed before a socket asks (after its snapshot) or a change is read.
        self.insights_dirty = False
        self.insights_failing = False
        self.insights_task: asyncio.Task | None = None
        self.removals: outbox.Removals | None = None  # placed when the tailer starts
        self.removals_at = 0.0
        self.removals_failing = False
        self.parked_polled_at = 0.0  # board.live.parked: the last look for ready work
        self.parked_failing = False
        self.queues_frame: str | None = None  # the last one sent (a new socket gets it)
        self.queues_at = 0.0
        self.queues_dirty = True
        self.queues_failing = False
        self.bulk_at = 0.0
        self.bulk_sent: dict[int, str] = {}  # job id -> the last frame sent for it
        self.bulk_failing = False

    def want_insights(self) -> None:
        """A socket has no insights frame yet: compute one on the next pass (rate limits apply)."""
        self.insights_dirty = True
        self.wake.set()

    async def wait_placed(self) -> None:
        """Until this tailer's cursors are placed. A socket reads its snapshot after that: a
        change or a deletion committed after the snapshot's read is then after the cursors too,
        so the tailer sends it. Raises when the tailer ended without placing them (the database
        failed as it started): the socket closes, and the page's reconnection starts a new one."""
        if self.placed.is_set():
            return
        placed = asyncio.ensure_future(self.placed.wait())
        try:
            await asyncio.wait([placed, self.task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            placed.cancel()
        if not self.placed.is_set():
            raise RuntimeError("the live board's tailer ended before its cursors were placed")

    def wake_threadsafe(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.wake.set)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()

        def place():
            return outbox.latest_removal_id(), outbox.starting_cursor()

        removal_id, cursor = await sync_to_async(place)()
        self.removals = outbox.Removals(removal_id)
        self.placed.set()
        doorbell_task = None
        if getattr(settings, "REDIS_URL", ""):
            listening = asyncio.Event()
            doorbell_task = asyncio.create_task(doorbell.listen(self.wake, listening))
            # A working Redis is listening before `ready`; a broken one only delays the start
            # this long (the poll does not need it).
            try:
                await asyncio.wait_for(listening.wait(), timeout=doorbell.DOORBELL_TIMEOUT_SECONDS)
            except TimeoutError:
                pass
        self.ready.set()
        pass_started = 0.0
        try:
            while True:
                # asgiref's sync_to_async swallows a cancellation that comes while its thread
                # runs (it waits for the thread and returns its result): honour it here, or
                # this loop outlives the shutdown of its event loop, which then never ends.
                if asyncio.current_task().cancelling():
                    raise asyncio.CancelledError
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=POLL_SECONDS)
                except TimeoutError:
                    pass
                # Under load every commit rings: gather what committed meanwhile into one pass,
                # passes at least a tick apart (from the start of the last one: a poll that
                # already waited POLL_SECONDS does not wait a tick more, which added it to every
                # change another process made, bench/board.py --clients 1000).
                if self.subscribers:
                    await asyncio.sleep(max(0.0, pass_gap(len(self.subscribers)) - (time.monotonic() - pass_started)))
                else:
                    await asyncio.sleep(WAITERS_ONLY_PASS_SECONDS)
                pass_started = time.monotonic()
                if self.wake.is_set():
                    # A commit (or a socket's request) rang, before this tick or during it: a
                    # queue's settings may have changed, which writes no event for the outbox
                    # to read. (Read here, as the wake is cleared: one that rang during the
                    # tick was cleared unread, and the change waited for the refresh timer.)
                    self.queues_dirty = True
                self.wake.clear()
                try:
                    await self._pass(cursor)
                except Exception:  # a database hiccup must not stop live updates for good
                    log.exception("live update pass failed; retrying")
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            if doorbell_task is not None:
                doorbell_task.cancel()
            for task in (self.insights_task, self.problems_task):
                if task is not None:
                    task.cancel()

    async def _pass(self, cursor: outbox.Cursor) -> None:
        while True:  # page after page until caught up: a big commit is never left half read
            to_sockets = bool(self.subscribers)

            def read(to_sockets=to_sockets):
                page = cursor.read()
                # With no socket to feed, only parked claims listen, and they need no card.
                frame = frames.changes_frame(page.events) if to_sockets else None
                return page, frame, parked.newly_ready(page.events)

            # database_sync_to_async: a connection the database dropped is replaced, not reused.
            page, frame, ready = await database_sync_to_async(read)()
            if ready:
                parked.waiters().notify_ready(ready)
            if frame is not None:
                await self._broadcast(frame)
            if page.events:
                # Stale now, sockets or not: the next socket gets the cached frames, and work
                # done while nobody watched must not wait for the refresh timers to show.
                self.problems_dirty = True
                self.insights_dirty = True
                self.queues_dirty = True  # running counts and depths
            # Only now: a pass that failed before this point reads the same events again.
            cursor.advance(page)
            metrics.tailer_delivered(cursor.last_id, cursor.using)
            if not page.full:
                break
        await self._poll_parked()
        if not self.subscribers:
            return  # nobody to tell: check() and the prune's removals wait for a socket
        await self._pass_removals()
        self._start_problems()
        await self._pass_queues()
        await self._pass_bulk()
        self._start_insights()

    async def _pass_queues(self) -> None:
        """The queues strip, when due: read, and pushed when it differs from the last push. A
        failure is logged once per run of failures; the next pass tries again."""
        now = time.monotonic()
        due = self.queues_dirty or now - self.queues_at >= QUEUES_REFRESH_SECONDS
        if not due or now - self.queues_at < QUEUES_MIN_INTERVAL_SECONDS:
            return
        self.queues_at = now
        self.queues_dirty = False
        message = await self._logged_once("queues_failing", "read the queues strip", frames.queues_message)
        if message is None:
            self.queues_dirty = True
            return
        frame = frames.queues_frame(message)
        if frame != self.queues_frame:
            self.queues_frame = frame  # before the broadcast: a socket subscribing meanwhile gets one or the other
            await self._broadcast(frame)

    async def _pass_bulk(self) -> None:
        """Every BULK_POLL_SECONDS: a "bulk" frame for each recent job whose frame changed."""
        now = time.monotonic()
        if now - self.bulk_at < BULK_POLL_SECONDS:
            return
        self.bulk_at = now
        recent = await self._logged_once("bulk_failing", "read the bulk jobs", bulk_jobs.recent)
        if recent is None:
            return
        sent = {}
        for job in recent:
            frame = frames.bulk_frame(job)
            sent[job.pk] = frame
            if self.bulk_sent.get(job.pk) != frame:
                await self._broadcast(frame)
        self.bulk_sent = sent

    async def _poll_parked(self) -> None:
        """Every parked.POLL_SECONDS while claims are parked: wake as many of each queue's as it
        has ready tasks, which no event may have announced (a retry backoff ending)."""
        now = time.monotonic()
        wanted = parked.waiters().wanted()
        if not wanted:
            self.parked_polled_at = now  # a claim parked from now on waits a whole period first
            return
        if now - self.parked_polled_at < parked.POLL_SECONDS:
            return
        self.parked_polled_at = now
        ready = await self._logged_once("parked_failing", "look for ready work for parked claims",
                                        lambda: parked.ready_counts(wanted))
        if ready is not None:
            parked.waiters().wake_ready(ready)

    async def _pass_removals(self) -> None:
        """Every REMOVALS_POLL_SECONDS: the tasks the prune deleted since the last read, one
        "removed" frame per read (board.live.frames), so that open pages drop their cards. The
        records are read on from where the last frame left off, as the outbox is."""
        now = time.monotonic()
        if now - self.removals_at < REMOVALS_POLL_SECONDS:
            return
        self.removals_at = now
        while True:
            # A failure: the cards wait for the next read; the board goes on.
            records = await self._logged_once("removals_failing", "read the records of deleted tasks",
                                              self.removals.read)
            if records is None:
                return
            if records:
                await self._broadcast(frames.removals_frame(records))
                self.removals.advance(records)
            if len(records) < outbox.EVENTS_PER_READ:
                return

    def _problems_gap(self) -> float:
        """The least time between two check() runs: PROBLEMS_MIN_INTERVAL_SECONDS, or longer on
        a board where check() is slow, so that it runs at most PROBLEMS_DUTY of the time."""
        return max(PROBLEMS_MIN_INTERVAL_SECONDS, self.problems_took / PROBLEMS_DUTY)

    def _start_problems(self) -> None:
        """Recompute the problems panel when something changed (and on the refresh timer), at
        most every _problems_gap(), in a task of its own: check() reads every task (6 s at
        1,000,000 tasks, bench/big_board.py), and this loop must go on fanning out changes."""
        if self.problems_task is not None and not self.problems_task.done():
            return
        now, gap = time.monotonic(), self._problems_gap()
        due = self.problems_dirty or now - self.problems_at >= max(PROBLEMS_REFRESH_SECONDS, gap)
        if not due or now - self.problems_at < gap:
            return
        self.problems_dirty = False
        self.problems_task = asyncio.get_running_loop().create_task(self._push_problems())

    async def _push_problems(self) -> None:
        """check(), pushed when its problems differ from the last push. A failure is logged once
        per run of failures; the next pass tries again."""
        def compute():
            # Its start is what the gap is measured from (a thread may have kept us waiting).
            started = self.problems_at = time.monotonic()
            try:
                return frames.problems_message()
            finally:
                self.problems_took = time.monotonic() - started

        # Not in the thread-sensitive thread that this loop's reads share.
        message = await self._logged_once("problems_failing", "compute the problems panel", compute,
                                          thread_sensitive=False)
        if message is None:
            self.problems_dirty = True
            return
        if message["problems"] != self.problems_sent:
            self.problems_sent = message["problems"]
            await self._broadcast(frames.problems_frame(message))

    def _start_insights(self) -> None:
        """Recompute the insights when something changed (or, once sent, on the refresh timer),
        at most every INSIGHTS_MIN_INTERVAL_SECONDS, in a task of its own: reading an hour of
        history must not hold up the changes this loop fans out."""
        if self.insights_task is not None and not self.insights_task.done():
            return
        now, gap = time.monotonic(), self._insights_gap()
        timer = self.insights_frame is not None and now - self.insights_at >= max(INSIGHTS_REFRESH_SECONDS, gap)
        if not (self.insights_dirty or timer) or now - self.insights_at < gap:
            return
        self.insights_at = now
        self.insights_dirty = False
        self.insights_task = asyncio.get_running_loop().create_task(self._push_insights())

    def _insights_gap(self) -> float:
        """The least time between two computations of the insights: INSIGHTS_MIN_INTERVAL_SECONDS,
        or longer where reading the hour's history is slow, so that it runs at most INSIGHTS_DUTY
        of the time."""
        return max(INSIGHTS_MIN_INTERVAL_SECONDS, self.insights_took / INSIGHTS_DUTY)

    async def _push_insights(self) -> None:
        """Compute the insights and push them when they differ from the last push. A failure is
        logged once per run of failures and leaves the other updates alone."""
        # On the background thread (board.live.background: a lower CPU priority), not in the
        # thread this loop's reads share: a slow computation must not delay them, nor take the
        # CPU a page load needs. A failure: the panel waits for the next try; the board goes on.
        def compute():
            # Its start is what the gap is measured from (a thread may have kept us waiting).
            started = self.insights_at = time.monotonic()
            try:
                return self.insights.compute()
            finally:
                self.insights_took = time.monotonic() - started

        data = await self._logged_once("insights_failing", "compute the insights panel", compute,
                                       in_background=True)
        if data is None:
            return
        previous = json.loads(self.insights_frame) if self.insights_frame else None
        self.insights_frame = frames.insights_frame(data)
        # "now" alone moving is no news.
        if previous is None or {**previous, "now": None} != {**data, "now": None}:
            await self._broadcast(self.insights_frame)

    async def _logged_once(self, flag: str, what: str, call, *, in_background: bool = False, **how):
        """`call()` (which returns something other than None) in a sync thread (the background
        one with `in_background`), or None when it failed: a failure is logged once per run of
        failures, counted by the attribute `flag`."""
        try:
            if in_background:
                result = await background.run(call)
            else:
                result = await database_sync_to_async(call, **how)()
        except Exception:
            if not getattr(self, flag):
                log.exception("could not %s; retrying", what)
            setattr(self, flag, True)
            return None
        setattr(self, flag, False)
        return result

    def recent_problems(self) -> list | None:
        """The problems a snapshot carries: the last check() result this tailer computed, however
        old, or None before its first (the snapshot says "not checked yet": its sockets
        subscribed before it, so the first result reaches them as a problems frame). An old one,
        or none, makes a new computation due: if it differs, it reaches every socket as a
        problems frame, the new one included. So a new socket waits for no check() (6.8-9.5 s
        at 1,000,000 tasks, bench/big_board.py)."""
        if (self.problems_sent is None or self.problems_dirty
                or time.monotonic() - self.problems_at >= PROBLEMS_REFRESH_SECONDS):
            self.problems_dirty = True
            self.wake.set()
        return self.problems_sent

    async def _broadcast(self, frame: str) -> None:
        # The frame's websocket bytes, built once for every socket whose server writes them as
        # they are (board.live.frames.SEND_FRAME; a socket under another server ignores them).
        wire = frames.text_frame(frame)
        written = queued = 0
        for subscriber in list(self.subscribers):
            try:
                taken = await subscriber.deliver(frame, wire)
            except Exception:  # one broken socket must not starve the others
                log.exception("could not deliver to a socket; dropping it")
                self.subscribers.discard(subscriber)
                continue
            written += taken is True
            queued += taken is False
        metrics.board_frames(written, queued)


_local_tailer: Tailer | None = None
_local_lock = threading.Lock()


def ensure_tailer() -> Tailer:
    """Start this process's tailer on the running event loop, once; a commit in this process
    wakes it (board.live.doorbell.announce_commit)."""
    global _local_tailer
    with _local_lock:
        tailer = _local_tailer
        if tailer is None or tailer.task is None or tailer.task.done() or tailer.loop is not asyncio.get_running_loop():
            tailer = Tailer()
            tailer.task = asyncio.get_running_loop().create_task(tailer.run())
            _local_tailer = tailer
            doorbell.listen_here(tailer.wake_threadsafe)
    return tailer
