"""Waking the tailers when a change commits: at once in this process, through Redis in the others.

`announce_commit` is the live board's subscriber to board.engine.commits (board/apps.py, in
every process). Right after a commit, in the writer's thread, it wakes this process's tailer and,
with REDIS_URL, rings `WAKEUP_GROUP` from a thread of its own (`Doorbell`); tailers `listen` for
it. Redis is only a doorbell: a Redis that hangs or refuses costs the write nothing and leaves
the tailers' poll to deliver. Channels is imported only where it is used (a writing process must
not load it). docs/live-protocol.md, "How the server produces them", says more.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Callable

from django.conf import settings

log = logging.getLogger("board.live.doorbell")

WAKEUP_GROUP = "board.wakeup"
DOORBELL_TIMEOUT_SECONDS = 2.0  # one ring (or subscription) to Redis; past it, it is given up

# This process's tailer, woken directly by a commit made here (set by board.live.tailer when it
# starts one): a thread-safe callable, or None while no tailer runs in this process.
_wake_local_tailer: Callable[[], None] | None = None


def listen_here(wake: Callable[[], None] | None) -> None:
    """Make `wake` (thread-safe) what a commit in this process calls: the tailer that runs here."""
    global _wake_local_tailer
    _wake_local_tailer = wake


def announce_commit() -> None:
    """A transition committed: wake this process's tailer now, and ring the other processes'
    (Redis) from the doorbell's own thread. Never waits on Redis: it runs in the writer's thread,
    right after its commit, and a Redis that hangs or refuses must cost a write nothing."""
    wake = _wake_local_tailer
    if wake is not None:
        wake()
    if getattr(settings, "REDIS_URL", ""):
        doorbell.ring()


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
        # Here, not at the top: only a process that rings (REDIS_URL set, a commit made) loads Channels.
        from channels.layers import get_channel_layer

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


async def listen(wake: asyncio.Event, listening: asyncio.Event) -> None:
    """A tailer's task: set `wake` on every other process's ring; `listening` is set once
    subscribed. When Redis fails, try again later (backing off); runs until cancelled."""
    # A server process (the tailer's): Channels is loaded there already.
    from channels.layers import get_channel_layer

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
                wake.set()
        except Exception as exc:  # noqa: BLE001  (the poll carries the updates meanwhile)
            log.warning("cannot hear the doorbell (REDIS_URL), retrying in %g s: %r", retry, exc)
            await asyncio.sleep(retry)
            retry = min(retry * 2, 30.0)
