"""board.live.background: the board's background work runs on a thread of its own, at a lower CPU
priority than the threads that serve pages, snapshots and changes (Linux: the thread's own
niceness), and gives back what it computed or raised."""
from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from board.live import background

# The background thread keeps its database connection between calls (as every server thread
# does) and checks it before each one: an earlier test's work on it may have opened one.
pytestmark = pytest.mark.django_db


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="a thread has a priority of its own on Linux only")
def test_background_work_runs_niced_and_the_callers_thread_keeps_its_priority():
    mine = niceness()
    theirs, thread = asyncio.run(background.run(lambda: (niceness(), threading.get_ident())))
    assert theirs == min(19, os.getpriority(os.PRIO_PROCESS, 0) + background.NICE)
    assert thread != threading.get_ident()
    assert niceness() == mine  # the process and this thread are untouched


def test_background_work_gives_back_its_exception():
    def boom():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(background.run(boom))
