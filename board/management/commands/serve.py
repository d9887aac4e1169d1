"""Serve the board: uvicorn worker processes on one port (HTTP through Django's WSGI handler,
websockets through Channels: taskflow_site/asgi.py), and the reaper beside them, restarted if it
dies. `make run` runs this; so do the tests' and benchmarks' live servers (tests/live_server.py)."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

APP = "taskflow_site.asgi:application"

log = logging.getLogger("board.reaper")


class ReaperSupervisor:
    """Runs `manage.py reap --loop` and starts it again whenever it exits: without it lost leases
    never come back. A reaper that keeps dying is restarted after a growing pause (1 s doubling
    to 30 s; back to 1 s once one has run for a minute), so a broken setup does not spin."""

    FIRST_PAUSE, MAX_PAUSE, HEALTHY_RUN = 1.0, 30.0, 60.0

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._supervise, name="reaper-supervisor", daemon=True)

    def start(self) -> "ReaperSupervisor":
        self._spawn()
        self.thread.start()
        return self

    def _spawn(self) -> None:
        self.process = subprocess.Popen([sys.executable, "manage.py", "reap", "--loop"],
                                        cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL)

    def _supervise(self) -> None:
        pause = self.FIRST_PAUSE
        while True:
            started = time.monotonic()
            code = self.process.wait()
            if self.stopping.is_set():
                return
            pause = self.FIRST_PAUSE if time.monotonic() - started >= self.HEALTHY_RUN else pause
            log.error("reaper exited (code %s); restarting it in %g s", code, pause)
            if self.stopping.wait(pause):
                return
            self._spawn()
            pause = min(pause * 2, self.MAX_PAUSE)

    def stop(self) -> None:
        self.stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def default_workers() -> int:
    """One worker process per core: a request is CPU-bound Python, and each process has its GIL."""
    return int(os.environ.get("TASKFLOW_WORKERS") or os.cpu_count() or 1)


class Command(BaseCommand):
    help = ("Serve the board (API, admin, board page and its websocket) on one address, with "
            "one worker process per core and the reaper.")

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST") or "127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8000))
        parser.add_argument("--workers", type=int, default=default_workers(),
                            help="server processes sharing the port (default: TASKFLOW_WORKERS or "
                                 "the number of cores, %(default)s here)")
        parser.add_argument("--no-reaper", action="store_true",
                            help="do not start the reaper (run `manage.py reap --loop` elsewhere)")
        parser.add_argument("--access-log", action="store_true",
                            default=os.environ.get("TASKFLOW_ACCESS_LOG", "") in ("1", "true"),
                            help="log every request (TASKFLOW_ACCESS_LOG=1)")

    def handle(self, *args, host, port, workers, no_reaper, access_log, **options):
        self.check_pool()
        reaper = None if no_reaper else ReaperSupervisor().start()
        shown = f"[{host}]" if ":" in host else host
        self.stdout.write(
            f"TaskFlow board on http://{shown}:{port}/  ({workers} server process"
            f"{'es' if workers != 1 else ''}, {settings.TASKFLOW['HTTP_THREADS']} threads each"
            + (f", reaper pid {reaper.process.pid}, restarted if it dies)" if reaper else ", no reaper)"))
        self.stdout.flush()
        try:
            uvicorn.run(
                APP, host=host, port=port, workers=workers,
                loop="uvloop", http="httptools", ws="websockets-sansio", lifespan="off",
                access_log=access_log, log_level="info" if access_log else "warning",
                # The board's socket sends big snapshots in 1 MiB frames; the page sends little.
                ws_max_size=4 * 1024 * 1024, ws_per_message_deflate=False,
                server_header=False, timeout_graceful_shutdown=5,
            )
        finally:
            if reaper is not None:
                reaper.stop()

    @staticmethod
    def check_pool() -> None:
        """Every request thread, and the one thread of the tailer, the waiting claims' poll and
        the websockets' session lookups, must find a connection without waiting."""
        pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
        needed = settings.TASKFLOW["HTTP_THREADS"] + 2
        if isinstance(pool, dict) and pool.get("max_size", needed) < needed:
            raise CommandError(
                f"DATABASE_POOL_MAX={pool['max_size']} is below what a server process can hold at "
                f"once ({needed}: TASKFLOW_HTTP_THREADS + 2); raise it or lower the threads")
