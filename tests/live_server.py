"""A real daphne process serving the board on the test database, for tests that speak HTTP.

`BoardServer` starts ``daphne -b 127.0.0.1 -p <free port> taskflow_site.asgi:application`` with
DATABASE_URL pointing at the test database, waits (bounded) until it answers HTTP, and stops it.
The `board_server` fixture gives one per test module; tests that use it must commit their rows
(``sqlite_db_mark()``: transaction=True) so that the server process sees them.

Also here: `manage()` (a management command as another process on the same database, e.g. the
reaper), `LineReader` (read a child's stdout lines with a deadline) and `wait_until`.
"""
from __future__ import annotations

import http.client
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
from pathlib import Path
from typing import Callable, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0  # seconds for daphne to answer its first request


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


def server_env(database_url: str, secret_key: str) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "taskflow_site.settings",
        "DATABASE_URL": database_url,
        "DEBUG": "1",
        "SECRET_KEY": secret_key,
        "PYTHONUNBUFFERED": "1",
    }


class BoardServer:
    """One daphne process on 127.0.0.1:<free port>. ``url`` is its base URL once started."""

    def __init__(self, database_url: str):
        self.database_url = database_url
        self.secret_key = secrets.token_urlsafe(50)
        self.env = server_env(database_url, self.secret_key)
        self.process: Optional[subprocess.Popen] = None
        self.port = 0
        self.url = ""
        self._log = tempfile.NamedTemporaryFile(prefix="taskflow-daphne-", suffix=".log", delete=False)

    def start(self, timeout: float = START_TIMEOUT) -> "BoardServer":
        daphne = Path(sys.executable).with_name("daphne")
        for _ in range(3):  # another process may grab the free port before daphne binds it
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.process = subprocess.Popen(
                [str(daphne), "-b", "127.0.0.1", "-p", str(self.port), "-v", "1", "--access-log", os.devnull,
                 "taskflow_site.asgi:application"],
                cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            )
            if self._wait_answering(timeout):
                return self
            if "Address already in use" not in self.log_tail():
                break
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"daphne did not start within {timeout:g} s:\n{log}")

    def _wait_answering(self, timeout: float) -> bool:
        """Poll the port until daphne answers an HTTP request (any status), bounded."""
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
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

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
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output

    def next(self, timeout: float) -> Optional[str]:
        """The next line; None at end of output; AssertionError after `timeout` seconds."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout:g} s") from None


@pytest.fixture(scope="module")
def board_server(django_db_setup, django_db_blocker):
    """A daphne process serving the test database for this module's tests."""
    from django.db import connections

    from tests.support import database_url

    with django_db_blocker.unblock():
        url = database_url(connections["default"].settings_dict)
    server = BoardServer(url).start()
    try:
        yield server
    finally:
        server.close()
