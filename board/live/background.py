"""The board's background work, on one thread per server process that runs at a lower CPU
priority: what may be late by a second but must not slow a page, a snapshot or a change (the
agents and throughput panel, board.live.insights, whose first computation reads the whole last
hour of history: 1.4 s at 120,520 rows, bench/insights.py).

Why a lower priority: on a machine whose cores are all busy (a 2-core host serving its own
browser tabs, bench/board.py), that computation took the CPU the page load needed. At 100,000
tasks the first cards came in a median of 972-1,197 ms while it ran at the normal priority and
643-799 ms with it niced by NICE (2026-12-07, four runs); without it at all, 669-740 ms. The kernel gives the
thread what the others leave.

The priority is the thread's own (Linux: setpriority on the thread id moves that thread only;
elsewhere the thread runs as any other). Not the lowest (19): the thread holds the GIL while it
runs Python, and the event loop of its process waits for it when it wants the GIL; at NICE 10
it still gets about a tenth of a busy core, so that wait stays short. A priority once lowered
cannot be raised again without privilege, so the thread is this module's own and only runs
this work, never a request.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import close_old_connections

log = logging.getLogger(__name__)

NICE = 10  # added to the process's niceness for this thread (Linux only)

T = TypeVar("T")


def _lower_priority() -> None:
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + NICE))
    except OSError:  # a sandbox that forbids it: the work runs at the normal priority
        log.warning("could not lower the background thread's CPU priority", exc_info=True)


_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="board-background", initializer=_lower_priority)


def _call(work: Callable[[], T]) -> T:
    # A usable connection, given back afterwards, as database_sync_to_async does.
    close_old_connections()
    try:
        return work()
    finally:
        close_old_connections()


async def run(work: Callable[[], T]) -> T:
    """`work()` on the background thread; its result, or its exception."""
    return await asyncio.get_running_loop().run_in_executor(_executor, _call, work)
