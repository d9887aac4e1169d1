"""Settings for the test suite: the embedded SQLite store as a real file (WAL), and PostgreSQL
as a second database alias when its server answers.

`TEST_POSTGRES_URL` (default postgres://postgres@127.0.0.1:5432/taskflow) names the server;
Django creates and drops its own test database there (test_taskflow)."""
import os
import secrets
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

# A random key per run: tests need one, and no key is ever committed.
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
# Production settings, even in a checkout `make run` marked as a development one.
os.environ.setdefault("DEBUG", "0")

from taskflow_site.settings import *  # noqa: E402,F401,F403
from taskflow_site.settings import database_from_url  # noqa: E402

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/taskflow")


def _answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        port = parsed.port or {"redis": 6379}.get(parsed.scheme, 5432)
        with socket.create_connection((parsed.hostname or "127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


# A real file, so that threads with their own connections share it (WAL, IMMEDIATE); one per
# test run, so that two runs on one machine never share (or delete) each other's database.
SQLITE_TEST_FILE = Path(tempfile.gettempdir()) / f"taskflow-test-{os.getpid()}.sqlite3"
DATABASES = {
    "default": {
        **database_from_url(f"sqlite:///{SQLITE_TEST_FILE}"),
        "TEST": {"NAME": str(SQLITE_TEST_FILE)},
    }
}
POSTGRES_AVAILABLE = _answers(POSTGRES_URL)
if POSTGRES_AVAILABLE:
    # Its own test database per run, like the SQLite file: concurrent runs never collide.
    DATABASES["postgres"] = {**database_from_url(POSTGRES_URL), "TEST": {"NAME": f"test_taskflow_{os.getpid()}"}}

# tests/test_fencing.py's downstream table. SQL migrations only: the MongoDB session, whose
# settings build on these (tests/mongodb_settings.py sets DATABASE_URL first), leaves it out.
if not os.environ.get("DATABASE_URL", "").startswith("mongodb"):
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.fenced_sink"]

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; test users only

# A store of its own for tests that run outside Django's test-case wrapper (it forbids, for
# the threads of a wrapped test, connections to aliases the test did not declare).
SCRATCH_FILE = Path(tempfile.gettempdir()) / f"taskflow-scratch-{os.getpid()}.sqlite3"
DATABASES["scratch"] = database_from_url(f"sqlite:///{SCRATCH_FILE}")

# Stores that cannot be reached, for the criteria's fault tests (tests/test_contract_faults.py).
# No test asks pytest-django to set them up; connecting to them fails for real.
DATABASES["unreachable-sqlite"] = database_from_url("sqlite:////nonexistent-directory/taskflow.sqlite3")
DATABASES["unreachable-postgres"] = database_from_url("postgres://postgres@127.0.0.1:1/taskflow")
# No pool: a refused connection fails at once (the pool would wait its 5 s for one first).
DATABASES["unreachable-postgres"]["OPTIONS"].pop("pool", None)

# The suite runs with DEBUG off (production settings) but over plain HTTP on local names.
SECURE_SSL_REDIRECT = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

# Redis, for the tests of the Redis channel layer (REDIS_URL itself stays unset: the suite's
# default layer is the in-memory one).
REDIS_TEST_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/1")
REDIS_AVAILABLE = _answers(REDIS_TEST_URL)
