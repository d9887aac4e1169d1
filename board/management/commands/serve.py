"""Serve the board: uvicorn worker processes on one port (HTTP through Django's WSGI handler,
websockets through Channels: server/application.py), and the reaper beside them, restarted if it
dies. All of them write their metrics to one PROMETHEUS_MULTIPROC_DIR (the one named in the
environment, emptied at start, or a fresh one removed at the end), so that /metrics shows the
whole server's numbers (board/metrics.py). `make run` runs this (with --ensure-admin); so do the tests' and benchmarks' live servers
(harness/board_server.py).

Start-up ends with one banner, printed once the server answers HTTP (so that nothing it prints
while starting comes after it): the addresses, and on the first run the administrator and the
password made for it, which is shown there and nowhere else."""
import http.client
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from board.management.commands.ensure_admin import FirstAdmin, ensure_first_admin
from server import metrics_dir



def run_in_workers(app: str, **options) -> None:
    """uvicorn.run, except that one worker is a process of its own too, as each of several is.
    This process loaded Django, and so board.metrics, before `handle` named the metrics
    directory: a worker served here would keep its counts in memory, which no scrape adds up
    (board/metrics.py, multi-process mode). And uvicorn's supervisor then restarts that one
    worker if it dies, as it does each of several."""
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(app, **options)
    try:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    except KeyboardInterrupt:
        pass


def asgi_app() -> str:
    """uvicorn's "module:attribute" of the project's ASGI application (ASGI_APPLICATION)."""
    module, _, attribute = settings.ASGI_APPLICATION.rpartition(".")
    return f"{module}:{attribute}"


# Connections a server process may hold beside its request threads': asgiref's one sync thread
# (the live board's tailer, the waiting claims' poll, the websockets' session lookups), the
# board's snapshot builder (board/live/snapshots.py), the /healthz checker (board/health.py), and
# one to spare, as before those two threads existed.
BACKGROUND_CONNECTIONS = 4

log = logging.getLogger("board.reaper")

# `manage.py reap --loop` with SIGINT ignored: Ctrl-C in `make run`'s terminal reaches the whole
# process group, and the reaper would die of it with a KeyboardInterrupt traceback under the
# banner; serve stops it itself (SIGTERM) once its workers are down.
REAPER_COMMAND = [
    sys.executable, "-c",
    ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
     "sys.argv = ['manage.py', *sys.argv[1:]]; runpy.run_path('manage.py', run_name='__main__')"),
    "reap", "--loop",  # `ps` shows them: the reaper is found as `reap --loop`
]


class ReaperSupervisor:
    """Runs `manage.py reap --loop` and starts it again whenever it exits: without it lost leases
    never come back. A reaper that keeps dying is restarted after a growing pause (1 s doubling
    to 30 s; back to 1 s once one has run for a minute), so a broken setup does not spin.

    The reaper shares serve's process group (so that it never outlives a group that is killed):
    SIGTERM to the group ends it at the same moment as serve, so a reaper ended by SIGTERM is
    given STOP_GRACE seconds (more than uvicorn's graceful shutdown) for serve to say it is
    stopping: a normal stop neither prints "reaper exited" nor starts another one. It ignores
    SIGINT (REAPER_COMMAND): serve stops it after Ctrl-C."""

    FIRST_PAUSE, MAX_PAUSE, HEALTHY_RUN, STOP_GRACE = 1.0, 30.0, 60.0, 10.0

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._supervise, name="reaper-supervisor", daemon=True)

    def start(self) -> "ReaperSupervisor":
        self._spawn()
        self.thread.start()
        return self

    def _spawn(self) -> None:
        self.process = subprocess.Popen(REAPER_COMMAND, cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL)

    def _supervise(self) -> None:
        pause = self.FIRST_PAUSE
        while True:
            started = time.monotonic()
            code = self.process.wait()
            if self.stopping.is_set():
                return
            if code == -signal.SIGTERM and self.stopping.wait(self.STOP_GRACE):
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


def wait_answering(host: str, port: int, stop: threading.Event, interval: float = 0.05) -> bool:
    """Poll until the server answers an HTTP request (any status): every uvicorn worker
    shares the port, so the first answer means requests are being served. False if `stop`."""
    probe = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection(probe, port, timeout=2)
            try:
                conn.request("GET", "/")  # a redirect to /board/: no database work
                conn.getresponse().read()
                return True
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            stop.wait(interval)
    return False


def banner(host: str, port: int, *, workers: int, threads: int, reaper: bool,
           admin: FirstAdmin | None, readme: str) -> str:
    """What `make run` leaves on the screen: where everything is, and how to log in."""
    wildcard = host in ("", "0.0.0.0", "::")
    shown = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)
    base = f"http://{shown}:{port}"
    if admin is None:
        login = ["log in as an existing staff user (manage.py createsuperuser adds one)"]
    elif admin.password:
        login = [f"user {admin.username}   password {admin.password}",
                 "(shown only now: change it at /admin/password_change/)"]
    else:
        login = [f"user {admin.username}   password from DJANGO_SUPERUSER_PASSWORD"]
    rule = "=" * 72
    lines = [
        rule,
        f"TaskFlow board is ready on {base}/"
        + (f"  (listening on all addresses, {host or '0.0.0.0'})" if wildcard else ""),
        f"  board       {base}/board/",
        f"  admin       {base}/admin/",
        f"  login       {login[0]}",
        *(f"              {more}" for more in login[1:]),
        f"  API docs    {base}/api/docs",
        f"  README      {readme}",
        f"  {workers} server process{'es' if workers != 1 else ''}, {threads} request thread{'s' if threads != 1 else ''} each, "
        + ("the reaper beside them (restarted if it dies)." if reaper else "no reaper (--no-reaper).")
        + " Ctrl-C stops.",
        rule,
    ]
    return "\n".join(lines)


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
        parser.add_argument("--ensure-admin", action="store_true",
                            help="with no user at all, create an administrator first (random "
                                 "password shown once, in the banner; or DJANGO_SUPERUSER_*)")
        parser.add_argument("--access-log", action="store_true",
                            default=os.environ.get("TASKFLOW_ACCESS_LOG", "") in ("1", "true"),
                            help="log every request (TASKFLOW_ACCESS_LOG=1)")

    def handle(self, *args, host, port, workers, no_reaper, ensure_admin, access_log, **options):
        self.check_pool()
        admin = ensure_first_admin() if ensure_admin else None
        # Before any child starts: the workers and the reaper inherit it (board/metrics.py).
        metrics_path, own_metrics_dir = metrics_dir.prepare_metrics_dir()
        os.environ[metrics_dir.METRICS_DIR_ENV] = metrics_path
        stop_watching = threading.Event()
        metrics_dir.watch_metrics_dir(metrics_path, stop_watching)
        reaper = None if no_reaper else ReaperSupervisor().start()
        text = banner(host, port, workers=workers, threads=settings.TASKFLOW["HTTP_THREADS"],
                      reaper=reaper is not None, admin=admin, readme=str(settings.BASE_DIR / "README.md"))
        stopping = threading.Event()

        def announce() -> None:
            if wait_answering(host, port, stopping):
                self.stdout.write(text)
                self.stdout.flush()

        threading.Thread(target=announce, name="banner", daemon=True).start()
        try:
            run_in_workers(
                asgi_app(), host=host, port=port, workers=workers,
                # httptools with the caps and clocks of server/http_protocol.py (head size,
                # slow clients, lingering close), which also keeps idle connections 5 s by default.
                loop="uvloop", http="server.http_protocol:BoundedHttpToolsProtocol",
                # websockets-sansio, plus the board's direct write of a frame built once for every
                # socket (server/websocket_protocol.py).
                ws="server.websocket_protocol:BoardWebSocketProtocol", lifespan="off",
                timeout_keep_alive=settings.TASKFLOW["KEEPALIVE_TIMEOUT_SECONDS"],
                access_log=access_log, log_level="info" if access_log else "warning",
                # The board's socket sends big snapshots in 1 MiB frames; the page sends little.
                ws_max_size=4 * 1024 * 1024, ws_per_message_deflate=False,
                server_header=False, timeout_graceful_shutdown=5,
                # LOG_FORMAT=json: this process's own uvicorn lines (a worker that died) go through
                # settings.LOGGING as JSON too, instead of uvicorn's text configuration.
                **({"log_config": None} if settings.LOG_FORMAT == "json" else {}),
            )
        finally:
            stopping.set()
            if reaper is not None:
                reaper.stop()
            stop_watching.set()
            if own_metrics_dir:
                shutil.rmtree(metrics_path, ignore_errors=True)

    @staticmethod
    def check_pool(pool=None, threads: int | None = None) -> None:
        """Every thread of a server process that uses the database must find a connection without
        waiting: the request threads, and BACKGROUND_CONNECTIONS more. (From the settings unless
        given.)"""
        if pool is None:
            pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
        needed = (threads or settings.TASKFLOW["HTTP_THREADS"]) + BACKGROUND_CONNECTIONS
        if isinstance(pool, dict) and pool.get("max_size", needed) < needed:
            raise CommandError(
                f"DATABASE_POOL_MAX={pool['max_size']} is below what a server process can hold at "
                f"once ({needed}: TASKFLOW_HTTP_THREADS + {BACKGROUND_CONNECTIONS}); raise it or lower the threads")
