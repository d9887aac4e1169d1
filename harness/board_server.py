"""The board's real server, and helpers for tests and benchmarks that talk to it over HTTP,
websockets or the command line (runtime install only: no pytest here).

`BoardServer` starts ``manage.py serve --host 127.0.0.1 --port <free port> --no-reaper`` — the
command `make run` runs: uvicorn worker processes (two here, as many as this machine's cores)
serving HTTP through Django's WSGI handler and /ws/ through Channels — with DATABASE_URL
pointing at the database it is given, waits (bounded) until it answers HTTP, and stops it.
The tests' fixtures around it (one server per test module, on the test database) are in
tests/live_server.py.

Also here: `manage()` (a management command as another process on the same database, e.g. the
reaper), `LineReader` (read a child's stdout lines with a deadline), `wait_until`, `api_call`,
`server_env`, `stop_process` and `free_port`.
"""
from __future__ import annotations

import http.client
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0  # seconds for the server to answer its first request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll `condition` until it returns something truthy (returned), or fail after `timeout`
    seconds saying `what` did not happen. For conditions in other processes: never a bare sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


def api_call(server: BoardServer, method: str, path: str, key: str, body: dict | None = None,
             timeout: float = 30) -> tuple[int, dict | None]:
    """One JSON request with an agent key: (status, parsed answer or None when empty)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def server_env(database_url: str, secret_key: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="taskflow_site.settings", DATABASE_URL=database_url,
               DEBUG="1", SECRET_KEY=secret_key, PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class BoardServer:
    """The board's server (`manage.py serve`, as `make run` starts it, without the reaper) on
    127.0.0.1 (a free port unless one is given), on the database at `database_url`. DEBUG is on
    (so that it serves the static files) unless `env` says otherwise; `args` are extra `serve`
    options (e.g. ["--workers", "1"]). The one server launcher of the tests and the benchmarks:
    `command` replaces `manage.py serve` for a benchmark's reference server (its "{port}" is
    filled in)."""

    def __init__(self, database_url: str, *, secret_key: str | None = None, env: dict | None = None,
                 args: list[str] | None = None, port: int | None = None, command: list[str] | None = None):
        self.database_url = database_url
        self.secret_key = secret_key or secrets.token_urlsafe(50)
        self.env = server_env(database_url, self.secret_key, **(env or {}))
        self.args = list(args or [])
        self.port = port
        self.command = command or [sys.executable, "manage.py", "serve", "--host", "127.0.0.1",
                                   "--port", "{port}", "--no-reaper", *self.args]
        self.process: subprocess.Popen | None = None
        # The server's output, kept open for its whole life (closed and removed by close()).
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="taskflow-serve-", suffix=".log", delete=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = START_TIMEOUT) -> BoardServer:
        """Start and wait (bounded) until it answers HTTP. A port we picked ourselves may be taken
        by another process before the server binds it: then another one is tried."""
        ours = self.port is None
        for _ in range(3 if ours else 1):
            if ours:
                self.port = free_port()
            self.process = subprocess.Popen(
                [part.replace("{port}", str(self.port)) for part in self.command],
                cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._wait_answering(timeout):
                return self
            if not ours or "Address already in use" not in self.log_tail():
                break
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"the server did not start within {timeout:g} s:\n{log}")

    def _wait_answering(self, timeout: float) -> bool:
        """Poll the port until the server answers an HTTP request (any status), bounded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/api/check")
                conn.getresponse().read()
                conn.close()
                return True
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)
        return False

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """Stop the server and its worker processes (its own process group)."""
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            try:  # workers that outlived their supervisor, or a supervisor that did not stop
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port (a page reconnects to the same URL)."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


def manage(database_url: str, secret_key: str, *args: str, **popen) -> subprocess.Popen:
    """`manage.py <args>` as another process on the same database (e.g. the reaper)."""
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT,
                            env=server_env(database_url, secret_key), **popen)


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate `process` (one we started) and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


class LineReader:
    """Collect a child's output lines in a thread, so a test can wait for one with a deadline."""

    def __init__(self, stream):
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output

    def next(self, timeout: float) -> str | None:
        """The next line; None at end of output; AssertionError after `timeout` seconds."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout:g} s") from None
