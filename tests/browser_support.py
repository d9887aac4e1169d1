"""Plumbing for the browser tests and the board benchmark: a real daphne server process on a
free local port, and Debian's Chromium driven by Playwright.

No Django import at module level: bench/board.py uses this before configuring Django."""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SERVER_START_SECONDS = 30


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"the playwright package is not installed ({exc})"
    return None


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Daphne:
    """`daphne taskflow_site.asgi:application` in its own process, DEBUG on (so that it serves
    the static files), on a database given by URL. Its output goes to a log file that
    `log()` returns for failure messages."""

    def __init__(self, database_url: str, port: int | None = None, secret_key: str | None = None,
                 env: dict | None = None, args: list[str] | None = None):
        self.database_url = database_url
        self.port = port or free_port()
        self.secret_key = secret_key or secrets.token_urlsafe(50)
        self.extra_env = env or {}
        self.extra_args = list(args or [])
        self.process: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="taskflow-daphne-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
        env.update(DJANGO_SETTINGS_MODULE="taskflow_site.settings", DEBUG="1", SECRET_KEY=self.secret_key,
                   DATABASE_URL=self.database_url, ALLOWED_HOSTS="127.0.0.1,localhost",
                   PYTHONUNBUFFERED="1", **self.extra_env)
        return env

    def start(self) -> "Daphne":
        daphne = Path(sys.executable).with_name("daphne")
        command = [str(daphne) if daphne.exists() else shutil.which("daphne") or "daphne",
                   "-b", "127.0.0.1", "-p", str(self.port), *self.extra_args, "taskflow_site.asgi:application"]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(command, cwd=PROJECT, env=self.env(), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not port_accepts(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"daphne did not listen on {self.port} within {SERVER_START_SECONDS} s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""
