"""Parked claims: the one home of a waiting claim (`POST /api/claim` with `wait_seconds`) that
found nothing, on the board's own server, and of its caps.

- The hand-over. The server (server/serving.py) puts a `Parking` in each request's WSGI environ
  (`parking_of`); the claim view, finding no work, calls `Parking.park(...)` and answers 204.
  The server then parks the request here, as an asyncio future: no thread, no database
  connection. A claim served elsewhere (a plain WSGI server, Django's test client) has no
  `Parking`: the view waits in its own thread, counted by `thread_wait_slots`.
- The wake-up. This process's tailer (board/live/tailer.py) is the only one that wakes parked
  claims: for each task that has just become QUEUED it wakes one waiter of its queue (oldest
  first; `newly_ready`, `Waiters.notify_ready`), and every POLL_SECONDS it asks how many tasks are
  ready in the queues waited on (`ready_counts`): what no event announces, a retry backoff ending,
  or a wake-up an event gave a claim that could not take the task. Waiters are kept by queue and
  by the capabilities they claim with (board.engine.capabilities): the poll counts for each what
  it could take, so a claim that can take a task requiring some is woken for it, and one that
  cannot is not woken again and again by it.
- The caps: `KeyTally` counts waiting claims in all and per agent (TASKFLOW_MAX_WAITERS,
  TASKFLOW_MAX_WAITERS_PER_KEY; WSGI_MAX_WAITERS in threads).

A woken claim is replayed (the view runs again); it may lose to another agent and park again.
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

POLL_SECONDS = 1.0  # how often the tailer looks for ready work that no event announced
ENVIRON_KEY = "taskflow.parking"  # where the server puts a request's Parking
ANY_QUEUE = None  # the queue of waiters that take work from every queue
# What waiters are kept by: (their queue or ANY_QUEUE, the capabilities they claim with).
WaitKey = tuple[str | None, tuple[str, ...]]


@dataclass(frozen=True)
class ParkedClaim:
    """What the view hands the server: wait up to `seconds` for work in `queue` (None: any),
    for `agent` (waiting claims are capped per agent), then replay `claim` (the body as the view
    parsed it: a few hundred bytes, not what the client sent)."""

    seconds: float
    queue: str | None
    agent: str
    claim: bytes
    capabilities: tuple[str, ...] = ()  # the claim's (narrowed) capabilities


class Parking:
    """A server that can park a request puts one in its environ; the view fills it."""

    def __init__(self) -> None:
        self.claim: ParkedClaim | None = None

    def park(self, seconds: float, queue: str | None, agent: str, claim: bytes,
             capabilities: tuple[str, ...] = ()) -> None:
        self.claim = ParkedClaim(seconds, queue, agent, claim, capabilities)


def parking_of(request) -> Parking | None:
    """The request's Parking (the board's own server), or None (the view waits in its thread)."""
    return request.META.get(ENVIRON_KEY)


class Waiters:
    """This process's parked claims, by queue, on its event loop."""

    def __init__(self) -> None:
        # (queue or ANY_QUEUE, capabilities) -> futures in arrival order (an OrderedDict as an
        # ordered set)
        self.by_queue: dict[WaitKey, OrderedDict[asyncio.Future, None]] = defaultdict(OrderedDict)
        self.claims = KeyTally()  # waiting claims, parked or being replayed, per agent

    @property
    def count(self) -> int:
        """Claims parked now (a woken one leaves its queue's list at once)."""
        return sum(len(parked) for parked in self.by_queue.values())

    def wanted(self) -> dict[WaitKey, int]:
        """How many claims are parked on each queue with each set of capabilities (what
        `ready_counts` is asked)."""
        return {key: len(parked) for key, parked in self.by_queue.items() if parked}

    async def wait(self, queue: str | None, timeout: float, capabilities: tuple[str, ...] = ()) -> bool:
        """Park until woken (True) or `timeout` seconds pass (False). The caller has started
        this process's tailer, which wakes it."""
        future = asyncio.get_running_loop().create_future()
        key = (queue, tuple(capabilities))
        parked = self.by_queue[key]
        parked[future] = None
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            parked.pop(future, None)
            if not parked:
                self.by_queue.pop(key, None)

    def notify_ready(self, ready: dict[str | None, int]) -> None:
        """`ready[queue]` tasks have just become ready in `queue`: wake as many waiters of that
        queue (whatever their capabilities: the event does not say what the tasks require; one
        that cannot take them parks again, and the poll wakes one that can), and the rest of the
        tasks' worth of waiters that take any queue."""
        for queue, n in ready.items():
            for key in [key for key in self.by_queue if key[0] == queue]:
                n = self._wake(key, n)
            for key in [key for key in self.by_queue if key[0] is ANY_QUEUE]:
                n = self._wake(key, n)

    def wake_ready(self, ready: dict[WaitKey, int]) -> None:
        """`ready_counts`' answer: wake that many waiters of each (queue, capabilities) asked about."""
        for key, n in ready.items():
            self._wake(key, n)

    def _wake(self, key: WaitKey, n: int) -> int:
        """Wake up to `n` waiters of `key`; returns how many of `n` were not used."""
        parked = self.by_queue.get(key)
        while parked and n > 0:
            future, _ = parked.popitem(last=False)
            if not future.done():
                future.set_result(True)
                n -= 1
        return n


def ready_counts(wanted: dict[WaitKey, int]) -> dict[WaitKey, int]:
    """How many ready tasks each queue has that claimers with those capabilities could take,
    counting no further than its waiters."""
    from board.live import reads

    return reads.ready_counts(wanted)


def newly_ready(events: list) -> dict[str, int]:
    """How many tasks each queue has gained among `events` (history rows, board.models.TaskEvent:
    moved to QUEUED and still there): as many parked claims of that queue are woken. One query,
    and only when some task has moved to QUEUED."""
    from board.engine.lifecycle import Stage
    from board.live import reads

    moved = [e.task_id for e in events if e.to_stage == Stage.QUEUED]
    if not moved:
        return {}
    queues = reads.queues_of_queued(moved)
    ready: dict[str, int] = {}
    for task_id in moved:
        if task_id in queues:
            ready[queues[task_id]] = ready.get(queues[task_id], 0) + 1
    return ready


_waiters: Waiters | None = None


def waiters() -> Waiters:
    """This process's parked claims (one event loop per server process)."""
    global _waiters
    if _waiters is None:
        _waiters = Waiters()
    return _waiters


class KeyTally:
    """Waiting claims counted in all and per agent (key name), for their caps. The server counts
    one on its event loop when the claim's wait begins, in the same step as its check of the
    caps (no await between them), so concurrent claims cannot both pass a full cap."""

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
