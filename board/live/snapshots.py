"""The board's snapshots for a process's sockets: one build at a time, on a thread of its own,
shared by every socket that asked before it started (the same frames, not a copy each).

Why a thread of its own (a big board's snapshot held every change back on asgiref's one sync
thread) and why shared (it bounds the memory of sockets that never read): docs/live-protocol.md,
"How the server produces them".
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from board.live import frames

# One builder thread per process: builds never run side by side (each holds its frames and a
# part of the board, and takes a database connection for its read).
SNAPSHOT_BUILDERS = 1
_executor = ThreadPoolExecutor(max_workers=SNAPSHOT_BUILDERS, thread_name_prefix="snapshot")


def _build(problems: list | None) -> list[str]:
    """The snapshot's frames (board.live.frames.snapshot_frames), read on the builder thread with
    a usable connection (as database_sync_to_async does: a connection the database dropped is
    replaced, not reused), which it gives back afterwards (to the pool, on PostgreSQL)."""
    close_old_connections()
    try:
        return frames.snapshot_frames(problems=problems)
    finally:
        close_old_connections()


class SnapshotBuilds:
    """The snapshots of one event loop's sockets. `get()` answers with the frames of a build that
    started after the call; calls made while a build runs share the next one."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._next: asyncio.Future | None = None  # the build the next callers wait for
        self._worker: asyncio.Task | None = None
        self.requests = 0  # calls of get() (with `builds`: how many requests each build served)
        self.builds = 0  # builds done

    async def get(self, problems: Callable[[], list | None]) -> list[str]:
        """The frames of a snapshot read after this call. `problems()` is asked when the build
        starts (a recent check() result to reuse, or None)."""
        self.requests += 1
        if self._next is None:
            self._next = self.loop.create_future()
            # Read by someone even when every socket waiting for it has gone: no "exception never
            # retrieved" noise.
            self._next.add_done_callback(lambda f: f.cancelled() or f.exception())
            if self._worker is None or self._worker.done():
                self._worker = self.loop.create_task(self._work(problems))
        # shield: a socket that closes while waiting does not cancel the build the others wait for.
        return await asyncio.shield(self._next)

    async def _work(self, problems: Callable[[], list | None]) -> None:
        while self._next is not None:
            answer, self._next = self._next, None
            try:
                built = await self.loop.run_in_executor(_executor, _build, problems())
            except Exception as exc:  # every socket of this build closes (1011) and reconnects
                answer.set_exception(exc)
            else:
                answer.set_result(built)
            finally:
                self.builds += 1


_builds: SnapshotBuilds | None = None
_lock = threading.Lock()


def builds() -> SnapshotBuilds:
    """This process's SnapshotBuilds, on the running event loop."""
    global _builds
    loop = asyncio.get_running_loop()
    with _lock:
        if _builds is None or _builds.loop is not loop:
            _builds = SnapshotBuilds(loop)
        return _builds
