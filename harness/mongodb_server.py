"""The MongoDB server of the MongoDB test session and of `bench/claims.py --backends mongodb`:
a real replica set named by TEST_MONGO_URL, or else a SecantusDB server started for this run
(requirements-test.txt; a MongoDB-wire-compatible replica set with transactions, run here only
as a test-time process: it is a beta under the GPL, never imported by the product). A pass on SecantusDB is evidence, not proof:
TEST_MONGO_URL runs the same tests against a real `mongod` replica set.

No Django imports: tests/mongodb_settings.py (and bench/claims.py --backends mongodb) start it
before Django is configured."""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

from harness import TEST_INSTALL
from harness.board_server import ROOT, free_port, stop_process

START_TIMEOUT = 30


def _answers(url: str) -> bool:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    client = MongoClient(url, serverSelectionTimeoutMS=500)
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:  # no server there yet (pymongo wraps socket errors in its own)
        return False
    finally:
        client.close()


def start() -> tuple[str | None, str, str]:
    """(server URL without a database, what it is, why not) — the URL is None when no server
    could be reached or started."""
    given = os.environ.get("TEST_MONGO_URL", "")
    if given:
        parts = urlsplit(given)
        url = urlunsplit((parts.scheme, parts.netloc, "/", parts.query, ""))
        if _answers(url):
            return url, f"the replica set at {parts.hostname}", ""
        return None, "", f"no server answers at TEST_MONGO_URL ({parts.hostname}:{parts.port})"
    try:
        import pymongo  # noqa: F401
    except ImportError:
        return None, "", "pymongo is not installed (it is in requirements.txt)"
    try:
        import secantus  # noqa: F401  (only to know it is there: it runs in its own process)
    except ImportError:
        return None, "", f"TEST_MONGO_URL is not set and SecantusDB is not installed; {TEST_INSTALL}"
    port = free_port()
    # harness/secantus_server.py: secantusd-py with the fixes the board's tests need.
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.secantus_server", "--host", "127.0.0.1", "--port", str(port),
         "--storage-path", ":memory:", "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
        # Called before the run starts threads of its own (as the settings load, or at the start
        # of the bench's MongoDB rows), so no lock can be held across the fork.
        preexec_fn=_die_with_parent)  # noqa: PLW1509
    atexit.register(stop_process, process)
    url = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return None, "", f"SecantusDB exited with {process.returncode} on start"
        if _answers(url):
            return url, f"SecantusDB {_version()} on port {port}", ""
        time.sleep(0.1)
    stop_process(process)
    return None, "", f"SecantusDB did not answer within {START_TIMEOUT} s"


def is_secantus(url: str) -> bool:
    """Whether the server at `url` is SecantusDB (its buildInfo says so): a one-process server
    in Python, on which the MongoDB session runs fewer rounds of its races."""
    from pymongo import MongoClient

    client = MongoClient(url, serverSelectionTimeoutMS=2000)
    try:
        return "secantusVersion" in client.admin.command("buildInfo")
    finally:
        client.close()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("secantusdb")
    except PackageNotFoundError:
        return "?"


def _die_with_parent() -> None:
    """In the server's process before it starts (Linux): SIGTERM when the test run ends in any
    way, even killed (atexit does not run then), so that no server outlives its run."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: atexit still stops it on a normal exit
        pass
