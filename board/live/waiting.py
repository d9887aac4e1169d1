"""The process's waiting claims: agents parked until a task becomes ready in their queue.

A waiting claim (`POST /api/claim` with `wait_seconds`) that found nothing is parked here by the
server (server/serving.py) as an asyncio future: it holds no thread and no database
connection while it waits. It is woken:

- by the board's own commit signal: this process's outbox tailer (board/live/tailer.py) reads every
  committed event, from any process, and calls `notify_ready` with the queues of tasks that have
  just become QUEUED (`newly_ready`); one waiter per such task is woken (oldest first), not all
  of them;
- by a short poll (`POLL_SECONDS`) that asks the database, once for every queue waited on, how
  many tasks are ready — what no event announces: a retry backoff ending.

A woken waiter replays its claim, which may lose to another agent; it then waits again. Nothing
here touches the database but the poll, which runs one bounded query per queue waited on, and
`newly_ready`, run by the tailer; both reads are board.engine.selectors'.

This module is imported before Django is set up (server/serving.py takes its header
names), hence the imports of the board's modules inside the functions that use them.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict, defaultdict

from asgiref.sync import sync_to_async

log = logging.getLogger("board.live.waiting")

POLL_SECONDS = 1.0

# How the claim view hands a wait to the server: the server marks the requests it can park
# (environ[CAN_WAIT]); the view then answers "nothing ready yet; wait up to N seconds for this
# queue" with these headers, which the server strips before the answer leaves.
CAN_WAIT = "taskflow.can_wait"
WAIT_HEADER = "X-Taskflow-Wait"
WAIT_QUEUE_HEADER = "X-Taskflow-Wait-Queue"
WAIT_KEY_HEADER = "X-Taskflow-Wait-Key"  # whose claim it is: waiting claims are capped per agent
WAIT_CLAIM_HEADER = "X-Taskflow-Wait-Claim"  # the claim as parsed: what a replay sends again
ANY_QUEUE = None  # the key of waiters that take work from every queue


class Waiters:
    def __init__(self) -> None:
        # queue (or ANY_QUEUE) -> futures in arrival order (an OrderedDict as an ordered set)
        self.by_queue: dict[str | None, OrderedDict[asyncio.Future, None]] = defaultdict(OrderedDict)
        self.claims = KeyTally()  # waiting claims, parked or being replayed, per agent
        self.poller: asyncio.Task | None = None

    @property
    def count(self) -> int:
        """Claims parked now (a woken one leaves its queue's list at once)."""
        return sum(len(parked) for parked in self.by_queue.values())


    async def wait(self, queue: str | None, timeout: float) -> bool:
        """Park until woken (True) or `timeout` seconds pass (False)."""
        from board.live import tailer  # which imports this module

        tailer.ensure_tailer()  # the commit signal that wakes us
        if self.poller is None or self.poller.done():
            self.poller = asyncio.get_running_loop().create_task(self._poll())
        future = asyncio.get_running_loop().create_future()
        parked = self.by_queue[queue]
        parked[future] = None
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            parked.pop(future, None)
            if not parked:
                self.by_queue.pop(queue, None)

    def notify_ready(self, ready: dict[str | None, int]) -> None:
        """`ready[queue]` tasks have just become ready in `queue`: wake as many waiters of that
        queue, and the rest of the tasks' worth of waiters that take any queue."""
        for queue, n in ready.items():
            n = self._wake(queue, n)
            self._wake(ANY_QUEUE, n)

    def _wake(self, queue: str | None, n: int) -> int:
        """Wake up to `n` waiters of `queue`; returns how many of `n` were not used."""
        parked = self.by_queue.get(queue)
        while parked and n > 0:
            future, _ = parked.popitem(last=False)
            if not future.done():
                future.set_result(True)
                n -= 1
        return n

    async def _poll(self) -> None:
        while self.count:
            await asyncio.sleep(POLL_SECONDS)
            wanted = {queue: len(parked) for queue, parked in self.by_queue.items() if parked}
            if not wanted:
                continue
            try:
                ready = await sync_to_async(_ready_counts)(wanted)
            except Exception:  # the database is away: the next poll tries again
                log.exception("waiting claims: could not look for ready work")
                continue
            for queue, n in ready.items():
                self._wake(queue, n)
        self.poller = None


def _ready_counts(wanted: dict[str | None, int]) -> dict[str | None, int]:
    """How many ready tasks each queue has, counting no further than its waiters."""
    from board.engine import selectors

    return selectors.ready_counts(wanted)


def newly_ready(events: list) -> dict[str, int]:
    """How many tasks each queue has gained among `events` (history rows, board.models.TaskEvent:
    moved to QUEUED and still there): as many parked claims of that queue are woken. One query,
    and only when some task has moved to QUEUED."""
    from board.engine import selectors
    from board.engine.lifecycle import Stage

    moved = [e.task_id for e in events if e.to_stage == Stage.QUEUED]
    if not moved:
        return {}
    queues = selectors.queues_of_queued(moved)
    ready: dict[str, int] = {}
    for task_id in moved:
        if task_id in queues:
            ready[queues[task_id]] = ready.get(queues[task_id], 0) + 1
    return ready


_waiters: Waiters | None = None


def waiters() -> Waiters:
    """This process's waiting list (one event loop per server process)."""
    global _waiters
    if _waiters is None:
        _waiters = Waiters()
    return _waiters


class KeyTally:
    """Waiting claims counted in all and per agent (key name), for their caps. The server's
    counts one on its event loop when the claim's wait begins, in the same step as the caller's
    check of the caps (no await between them), so concurrent claims cannot both pass a full cap."""

    def __init__(self) -> None:
        self.total = 0
        self.by_key: dict[str, int] = {}

    def of(self, key: str) -> int:
        return self.by_key.get(key, 0)

    def take(self, key: str, total: int, per_key: int) -> bool:
        """Count one more for `key` unless that passes either cap."""
        if self.total >= total or self.of(key) >= per_key:
            return False
        self.total += 1
        self.by_key[key] = self.of(key) + 1
        return True

    def give_back(self, key: str) -> None:
        self.total -= 1
        if self.by_key[key] == 1:
            del self.by_key[key]
        else:
            self.by_key[key] -= 1


class ThreadWaitSlots(KeyTally):
    """Waiting claims outside the board's server (a plain WSGI server, Django's test client),
    where each one holds its worker thread for the whole wait: the same tally under a lock, as
    the waits run in threads; the view answers 503 too_many_waiters past the caps."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def take(self, key: str, total: int, per_key: int) -> bool:
        with self._lock:
            return super().take(key, total, per_key)

    def give_back(self, key: str) -> None:
        with self._lock:
            super().give_back(key)


thread_wait_slots = ThreadWaitSlots()
