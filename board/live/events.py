"""Live updates for the board: the history table is the outbox.

Every transition writes its TaskEvent in the same transaction as the change (board.engine.transitions),
so an event exists exactly when a change committed: a refused or rolled-back change has none.
In each server process one `Tailer` reads new events in id order and fans them out to that
process's sockets. A change made anywhere (another server process, the reaper, a management
command, the admin) therefore reaches every browser, after its commit.

The fan-out does not go through a channel layer: the in-memory layer deep-copies every message
for every socket (about 3 ms per event at 100 sockets) and drops messages once a socket's queue
is full, and the Redis layer delivers at most once. The tailer encodes one frame per page of
events (a batch of changes) and hands that same text to each subscribed socket of its process,
without waiting for any of them (each socket queues it: board.live.consumers).

Finding new events: ids are taken at insert, and on PostgreSQL two transactions can commit out of
id order, so "id > last seen" alone could skip an event that commits late. The cursor remembers
the ids it has not seen below the highest one it has (holes) and asks for them again on every
read, however long that takes. A hole is given up only when it is proven never to commit: with
each new hole the cursor takes a fresh transaction id (`pg_current_xact_id()`, after the events
were read: the transaction that took the missing id already had its xid, which is therefore
lower, since every event is written after its task row), and it drops the hole only after a read
that looked for it began when the oldest running transaction (`pg_current_snapshot()`'s xmin)
was past that mark: the writer had ended by then, so the id is absent because it rolled back. Transaction ids are the whole
server's: a long transaction anywhere on it keeps holes (a few bytes each) until it ends. On
SQLite ids are handed out under the write lock and committed before the next writer starts, so
there are no holes.

Reading is paged (EVENTS_PER_READ events, holes first as they have the lowest ids), page after
page until caught up, one frame per page. The cursor moves only after a page's frame was built
and handed to the sockets: a pass that fails (a database error) reads the same events again
next time, so nothing is skipped.

Waking up: the tailer polls a few times a second. A commit in this process wakes it at once
(passes are at least MIN_PASS_SECONDS apart, so a burst of commits is read in one pass);
with a Redis channel layer (REDIS_URL) a commit in any process wakes every tailer through the
`WAKEUP_GROUP` group. Redis is a doorbell here, never the only carrier of an update, and never
in a writer's way: the ring goes from a thread of its own (`Doorbell`), and the tailer listens
for it in a task that retries; a Redis that hangs or refuses only leaves the poll to do it.

Nothing here ever carries a lease token: messages are built from `board.public.public_task`.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Protocol

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.db.models import Q

from board.engine import db, selectors
from board.engine.lifecycle import Stage
from board.live import insights, waiting
from board.models import Task, TaskEvent
from board.public import public_event, public_task

log = logging.getLogger("board.live.events")

WAKEUP_GROUP = "board.wakeup"
POLL_SECONDS = 0.1  # one indexed "id > last" query: cheap enough to ask ten times a second
MIN_PASS_SECONDS = 0.02  # at most 50 passes a second, however often commits ring
EVENTS_PER_READ = 1000
PROBLEMS_MIN_INTERVAL_SECONDS = 0.5  # the problems panel is recomputed at most twice a second
PROBLEMS_REFRESH_SECONDS = 2.0  # and also on a timer: a lease expires without any event
# The agents and throughput panel (board.live.insights) reads an hour of history: at most once every
# few seconds however busy the board, and on a timer too, as its minutes roll on.
INSIGHTS_MIN_INTERVAL_SECONDS = 3.0
INSIGHTS_REFRESH_SECONDS = 30.0

_encoder = DjangoJSONEncoder()


def jsonable(value):
    """Datetimes as ISO 8601 strings, so a message survives any channel layer's encoding."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return _encoder.default(value)


# ---------------------------------------------------------------------------------------------
# Announcing commits (called from board.engine.transitions, in whatever thread committed)

_local_tailer: Tailer | None = None
_local_lock = threading.Lock()


def announce_commit() -> None:
    """A transition committed: wake this process's tailer now, and ring the other processes'
    (Redis) from the doorbell's own thread. Never waits on Redis: it runs in the writer's thread,
    right after its commit, and a Redis that hangs or refuses must cost a write nothing."""
    tailer = _local_tailer
    if tailer is not None:
        tailer.wake_threadsafe()
    if getattr(settings, "REDIS_URL", ""):
        doorbell.ring()


DOORBELL_TIMEOUT_SECONDS = 2.0  # one ring (or subscription) to Redis; past it, it is given up


class Doorbell:
    """Rings `WAKEUP_GROUP` through the channel layer from a daemon thread of its own. Rings are
    merged: while one is on its way, any number of commits make exactly one more. A ring that
    fails or times out only costs the other processes latency (their poll still runs); the
    failure is logged once per run of failures. At exit, rings still pending are sent (bounded
    by the timeout), so that a short-lived command's commit still wakes the servers."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._asked = 0  # rings asked for
        self._done = 0  # of them, the ones sent (or given up)
        self._thread: threading.Thread | None = None
        self._failing = False

    def ring(self) -> None:
        with self._changed:
            self._asked += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="doorbell", daemon=True)
                self._thread.start()
                atexit.register(self.flush)
            self._changed.notify_all()

    def flush(self, timeout: float = DOORBELL_TIMEOUT_SECONDS) -> bool:
        """Wait (bounded) until every ring asked for so far was sent or given up."""
        with self._changed:
            target = self._asked
            return self._changed.wait_for(lambda: self._done >= target, timeout=timeout)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._done)
                target = self._asked
            try:
                loop.run_until_complete(asyncio.wait_for(
                    get_channel_layer().group_send(WAKEUP_GROUP, {"type": "board.wakeup"}),
                    timeout=DOORBELL_TIMEOUT_SECONDS))
                if self._failing:
                    log.info("the doorbell (REDIS_URL) works again")
                self._failing = False
            except Exception as exc:  # noqa: BLE001  (whatever Redis does, the poll still runs)
                if not self._failing:
                    log.warning("could not ring the other servers' tailers (they still poll): %r", exc)
                self._failing = True
            with self._changed:
                self._done = target
                self._changed.notify_all()


doorbell = Doorbell()


# ---------------------------------------------------------------------------------------------
# Reading the outbox


@dataclass
class Page:
    """One read of the outbox: its events (id order) and where the cursor would be after them.
    Nothing moves until `Cursor.advance(page)`, called once the page's frame was handed out."""

    events: list[TaskEvent]
    last_id: int
    holes: dict[int, int | None]
    full: bool  # a whole page came back: more may be waiting, read again at once


@dataclass
class Cursor:
    """Where a tailer is in the event table: the highest id seen, and the holes below it (ids
    not seen yet, each with the transaction horizon that proves when it can be given up)."""

    last_id: int
    holes: dict[int, int | None] = field(default_factory=dict)
    using: str = "default"

    def read(self) -> Page:
        """The next page of new events and of late ones filling holes, in id order. Runs in a
        sync thread; changes nothing (see `advance`)."""
        late_commits = not db.ids_follow_commit_order(self.using)
        # Read BEFORE the events: every transaction older than this has ended by the time the
        # events are read, so a hole it left that is still missing then never commits.
        settled = _oldest_running_xid(self.using) if late_commits and self.holes else None
        runs = _runs(sorted(self.holes))[:MAX_HOLE_RUNS]
        wanted = Q(id__gt=self.last_id)
        for first, last in runs:
            wanted |= Q(id__range=(first, last))
        rows = list(TaskEvent.objects.using(self.using).filter(wanted).order_by("id")[:EVENTS_PER_READ])
        full = len(rows) == EVENTS_PER_READ
        holes, last_id, new_holes = dict(self.holes), self.last_id, []
        for event in rows:
            holes.pop(event.id, None)
            if event.id > last_id:
                new_holes.extend(range(last_id + 1, event.id))
                last_id = event.id
        if late_commits:
            if new_holes:
                # Taken AFTER the events were read: the transaction that took a missing id had
                # its xid before a later id committed, so its xid is below this one.
                horizon = _new_xid(self.using)
                holes.update(dict.fromkeys(new_holes, horizon))
            if settled is not None:
                # Only holes this read looked at may be given up (a full page stops early).
                looked_up_to = rows[-1].id if full else last_id
                covered = {i for first, last in runs for i in range(first, min(last, looked_up_to) + 1)}
                holes = {i: h for i, h in holes.items() if not (i in covered and h is not None and h <= settled)}
        else:
            # SQLite hands out ids under the write lock and commits before the next writer
            # starts, and MongoDB's writers take theirs from one counter document in their
            # transaction (board.engine.db.number_rows): an id below one already read that is not
            # there was rolled back.
            holes = {}
        return Page(rows, last_id, holes, full)

    def advance(self, page: Page) -> None:
        self.last_id, self.holes = page.last_id, page.holes


MAX_HOLE_RUNS = 200  # runs of consecutive missing ids asked for per read (the rest: next pages)


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as runs of consecutive ids: a big transaction's missing ids are one range."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _oldest_running_xid(using: str) -> int:
    """The oldest transaction still running on the server (every older one has ended)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return cursor.fetchone()[0]


def _new_xid(using: str) -> int:
    """A transaction id handed out now, so above that of every transaction running already.
    (Not the snapshot's xmax: that is one past the highest *completed* xid, and a running
    transaction may have a higher one.) Costs one xid, only on a read that found new holes."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        return cursor.fetchone()[0]


def latest_event_id() -> int:
    return TaskEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def card_task(task: Task, deps: list[str]) -> dict:
    """What a card shows: the public task without its bulky fields (description, payload,
    checkpoint, result), which the details panel fetches from the API when opened. `task` is a
    Task or, for the snapshot, any object with its public fields (a row of CARD_COLUMNS)."""
    card = public_task(task, deps)
    for bulky in ("description", "payload", "checkpoint", "result"):
        del card[bulky]
    return card


def changes_for(events: list[TaskEvent]) -> list[dict]:
    """One item per event, in commit-read order, each carrying the task as it is now (its
    version is at least the event's): the browser applies a task only when its version is newer
    than what it shows."""
    if not events:
        return []
    ids = list({e.task_id for e in events})
    tasks = {t.pk: t for t in Task.objects.filter(pk__in=ids)}
    deps = selectors.deps_of(ids)
    return [
        {"event": jsonable(live_event(e)), "task": jsonable(card_task(tasks[e.task_id], deps[e.task_id]))}
        for e in events if e.task_id in tasks
    ]


def live_event(event: TaskEvent) -> dict:
    """The public event without a failure's traceback (up to 64 KiB each, and a frame carries
    up to EVENTS_PER_READ events): the details panel reads it from the API's history."""
    data = public_event(event)
    detail = data["detail"]
    if isinstance(detail, dict) and "traceback" in detail:
        data["detail"] = {**{k: v for k, v in detail.items() if k != "traceback"}, "has_traceback": True}
    return data


def problem_dicts() -> list[dict]:
    return [{"task": p.task, "code": p.code, "text": p.text} for p in selectors.problems()]


def problems_message() -> dict:
    """The tailer's (debounced) push of the problems panel."""
    return {"type": "problems", "problems": problem_dicts()}


SNAPSHOT_PART = 1000  # tasks per frame: frames stay under 1 MiB (daphne's limit, and a common proxy limit)


def snapshot_frames(terminal_limit: int = 200, problems: list | None = None) -> list[str]:
    """What a browser needs to draw the board, plus the event id it is current to, as encoded
    frames: {"type": "snapshot", ..., "more": bool} then {"type": "snapshot_more", "tasks",
    "more"} until "more" is false. `problems`: a recent check() result to reuse.

    Built a part at a time from selectors.board_parts (one read that takes no write lock): only
    the encoded frames and the part being built are held, never a model instance per task.
    A frame is encoded once the next part is read (its "more" depends on it)."""
    parts = selectors.board_parts(terminal_limit=terminal_limit, part_size=SNAPSHOT_PART)
    head = next(parts)
    if problems is None:
        problems = problem_dicts()  # inside the board's read: the problems of the same board
    frames: list[str] = []
    frame = {"type": "snapshot", "last_event_id": head["last_event_id"], "counts": head["counts"],
             "tasks": [], "problems": problems}
    for part in parts:
        if frame["tasks"]:
            frames.append(json.dumps({**frame, "more": True}))
            frame = {"type": "snapshot_more", "tasks": []}
        frame["tasks"] = [card_task(SimpleNamespace(**row, **_NOT_ON_CARDS), deps) for row, deps in part]
    frames.append(json.dumps({**frame, "more": False}))
    return frames


# card_task drops these; rows read for cards (selectors.CARD_COLUMNS) do not carry them.
_NOT_ON_CARDS = {"description": "", "payload": None, "checkpoint": None, "result": None}


def newly_ready(events: list[TaskEvent]) -> dict[str, int]:
    """How many tasks each queue has gained among `events` (moved to QUEUED and still there): as
    many parked claims of that queue are woken (board.live.waiting). One query, and only when some
    task has moved to QUEUED."""
    moved = [e.task_id for e in events if e.to_stage == Stage.QUEUED]
    if not moved:
        return {}
    queues = dict(Task.objects.filter(pk__in=set(moved), stage=Stage.QUEUED).values_list("pk", "queue"))
    ready: dict[str, int] = {}
    for task_id in moved:
        if task_id in queues:
            ready[queues[task_id]] = ready.get(queues[task_id], 0) + 1
    return ready


# ---------------------------------------------------------------------------------------------
# The tailer: one per server process, started by the first socket or parked claim


class Subscriber(Protocol):
    """What the tailer needs of a socket (board.live.consumers.BoardConsumer implements it)."""

    async def deliver(self, frame: str) -> None: ...


class Tailer:
    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake = asyncio.Event()
        self.ready = asyncio.Event()  # set once it listens (cursor placed, a working doorbell answered)
        self.task: asyncio.Task | None = None
        self.problems_sent: list = []  # snapshots carry the problems; push only changes
        self.problems_at = 0.0
        self.problems_dirty = True
        # board.live.insights: computed here once for every socket of this process.
        self.insights = insights.Insights()
        self.insights_frame: str | None = None  # the last one computed (a new socket gets it)
        self.insights_at = 0.0
        # Nothing is computed before a socket asks (after its snapshot) or a change is read.
        self.insights_dirty = False
        self.insights_failing = False
        self.insights_task: asyncio.Task | None = None

    def want_insights(self) -> None:
        """A socket has no insights frame yet: compute one on the next pass (rate limits apply)."""
        self.insights_dirty = True
        self.wake.set()

    def wake_threadsafe(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.wake.set)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        cursor = Cursor(await sync_to_async(latest_event_id)())
        doorbell_task = None
        if getattr(settings, "REDIS_URL", ""):
            listening = asyncio.Event()
            doorbell_task = asyncio.create_task(self._listen_for_doorbell(listening))
            # A working Redis is listening before `ready`; a broken one only delays the start
            # this long (the poll does not need it).
            try:
                await asyncio.wait_for(listening.wait(), timeout=DOORBELL_TIMEOUT_SECONDS)
            except TimeoutError:
                pass
        self.ready.set()
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
                # Under load every commit rings: gather what committed meanwhile into one pass.
                await asyncio.sleep(MIN_PASS_SECONDS)
                self.wake.clear()
                try:
                    await self._pass(cursor)
                except Exception:  # a database hiccup must not stop live updates for good
                    log.exception("live update pass failed; retrying")
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            if doorbell_task is not None:
                doorbell_task.cancel()
            if self.insights_task is not None:
                self.insights_task.cancel()

    async def _pass(self, cursor: Cursor) -> None:
        while True:  # page after page until caught up: a big commit is never left half read
            to_sockets = bool(self.subscribers)

            def read(to_sockets=to_sockets):
                page = cursor.read()
                # With no socket to feed, only parked claims listen, and they need no card.
                return page, changes_for(page.events) if to_sockets else [], newly_ready(page.events)

            # database_sync_to_async: a connection the database dropped is replaced, not reused.
            page, changes, ready = await database_sync_to_async(read)()
            if ready:
                waiting.waiters().notify_ready(ready)
            if changes:
                await self._broadcast(json.dumps({"type": "tasks", "items": changes}))
                self.problems_dirty = True
                self.insights_dirty = True
            # Only now: a pass that failed before this point reads the same events again.
            cursor.advance(page)
            if not page.full:
                break
        if not self.subscribers:
            return  # nobody to tell: check() waits for a socket
        now = time.monotonic()
        due = self.problems_dirty or now - self.problems_at >= PROBLEMS_REFRESH_SECONDS
        if due and now - self.problems_at >= PROBLEMS_MIN_INTERVAL_SECONDS:
            def compute():
                # The start of the computation is what the interval is measured from (the sync
                # thread may have kept us waiting since `now`).
                self.problems_at = time.monotonic()
                return problems_message()

            self.problems_dirty = False
            message = await sync_to_async(compute)()
            if message["problems"] != self.problems_sent:
                self.problems_sent = message["problems"]
                await self._broadcast(json.dumps(message))
        self._start_insights()

    def _start_insights(self) -> None:
        """Recompute the insights when something changed (or, once sent, on the refresh timer),
        at most every INSIGHTS_MIN_INTERVAL_SECONDS, in a task of its own: reading an hour of
        history must not hold up the changes this loop fans out."""
        if self.insights_task is not None and not self.insights_task.done():
            return
        now = time.monotonic()
        timer = self.insights_frame is not None and now - self.insights_at >= INSIGHTS_REFRESH_SECONDS
        if not (self.insights_dirty or timer) or now - self.insights_at < INSIGHTS_MIN_INTERVAL_SECONDS:
            return
        self.insights_at = now
        self.insights_dirty = False
        self.insights_task = asyncio.get_running_loop().create_task(self._push_insights())

    async def _push_insights(self) -> None:
        """Compute the insights and push them when they differ from the last push. A failure is
        logged once per run of failures and leaves the other updates alone."""
        try:
            # Not in the thread every socket's snapshot and this loop's reads share
            # (thread-sensitive): a slow computation must not delay them.
            data = await database_sync_to_async(self.insights.compute, thread_sensitive=False)()
        except Exception:  # the panel waits for the next try; the board goes on
            if not self.insights_failing:
                log.exception("could not compute the insights panel; retrying")
            self.insights_failing = True
            return
        self.insights_failing = False
        previous = json.loads(self.insights_frame) if self.insights_frame else None
        self.insights_frame = json.dumps(data)
        # "now" alone moving is no news.
        if previous is None or {**previous, "now": None} != {**data, "now": None}:
            await self._broadcast(self.insights_frame)

    def recent_problems(self) -> list | None:
        """The last check() result if it is fresh enough to put in a snapshot, else None."""
        if self.problems_at and not self.problems_dirty and time.monotonic() - self.problems_at < PROBLEMS_REFRESH_SECONDS:
            return self.problems_sent
        return None

    async def _broadcast(self, frame: str) -> None:
        for subscriber in list(self.subscribers):
            try:
                await subscriber.deliver(frame)
            except Exception:  # one broken socket must not starve the others
                log.exception("could not deliver to a socket; dropping it")
                self.subscribers.discard(subscriber)

    async def _listen_for_doorbell(self, listening: asyncio.Event) -> None:
        """Answer the other processes' rings; when Redis fails, try again later (backing off)."""
        layer = get_channel_layer()
        retry = 1.0
        while True:
            try:
                channel = await asyncio.wait_for(layer.new_channel(), timeout=DOORBELL_TIMEOUT_SECONDS)
                await asyncio.wait_for(layer.group_add(WAKEUP_GROUP, channel), timeout=DOORBELL_TIMEOUT_SECONDS)
                listening.set()
                retry = 1.0
                while True:
                    await layer.receive(channel)
                    self.wake.set()
            except Exception as exc:  # noqa: BLE001  (the poll carries the updates meanwhile)
                log.warning("cannot hear the doorbell (REDIS_URL), retrying in %g s: %r", retry, exc)
                await asyncio.sleep(retry)
                retry = min(retry * 2, 30.0)


def ensure_tailer() -> Tailer:
    """Start this process's tailer on the running event loop, once."""
    global _local_tailer
    with _local_lock:
        tailer = _local_tailer
        if tailer is None or tailer.task is None or tailer.task.done() or tailer.loop is not asyncio.get_running_loop():
            tailer = Tailer()
            tailer.task = asyncio.get_running_loop().create_task(tailer.run())
            _local_tailer = tailer
    return tailer
