"""Where `manage.py serve`'s processes keep their metrics (board/metrics.py): prometheus_client's
multi-process mode. Each worker and the reaper write their values to files in
PROMETHEUS_MULTIPROC_DIR (prometheus_client's own variable, read when it is imported), and a
scrape, whichever worker answers it, adds every process's files up. serve prepares the directory
before it starts them and watches it while they run; nothing here runs inside a request.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("server.metrics_dir")


METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
DEAD_WORKER_CHECK_SECONDS = 1.0


def prepare_metrics_dir() -> tuple[str, bool]:
    """The directory this run's processes write their metrics to, emptied, and whether it was
    made here (then it goes when serve stops). A directory named by PROMETHEUS_MULTIPROC_DIR (a
    deployment's, e.g. /run/taskflow/metrics) is emptied: the files of an earlier run would
    otherwise add its counts to this one's. Without one, a fresh temporary directory."""
    import tempfile
    from pathlib import Path

    named = os.environ.get(METRICS_DIR_ENV)
    if not named:
        return tempfile.mkdtemp(prefix="taskflow-metrics-"), True
    directory = Path(named)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    return str(directory), False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process has this pid now: ours is gone
        return False
    try:  # a zombie (exited, not yet reaped) is dead too
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc here: kill(0) said it exists


def mark_dead_processes(directory: str) -> list[int]:
    """Drop the live gauges (websocket clients, tailer position) of processes that have exited:
    uvicorn replaces a worker that dies, and the reaper is restarted, under new pids. Their
    counters stay: a count made by a process that is gone still happened."""
    from prometheus_client.multiprocess import mark_process_dead

    dead = set()
    for name in os.listdir(directory):
        if name.startswith("gauge_live") and name.endswith(".db"):
            pid = name[:-3].rsplit("_", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                dead.add(int(pid))
    for pid in sorted(dead):
        mark_process_dead(pid, directory)
    return sorted(dead)


def watch_metrics_dir(directory: str, stop: threading.Event) -> threading.Thread:
    """In serve: every DEAD_WORKER_CHECK_SECONDS, mark the processes that exited as dead."""

    def watch() -> None:
        while not stop.wait(DEAD_WORKER_CHECK_SECONDS):
            try:
                mark_dead_processes(directory)
            except OSError:  # the directory went away under us: serve is stopping
                log.exception("could not check the metrics directory")

    thread = threading.Thread(target=watch, name="metrics-dir-watch", daemon=True)
    thread.start()
    return thread
