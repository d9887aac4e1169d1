"""Settings for the test suite: the embedded SQLite store as a real file (WAL), and PostgreSQL
as a second database alias when its server answers.

`TEST_POSTGRES_URL` (default postgres://postgres@127.0.0.1:5432/taskflow) names the server;
Django creates and drops its own test database there (test_taskflow)."""
import os
import secrets
import socket
from urllib.parse import urlparse

# A random key per run: tests need one, and no key is ever committed.
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))

from taskflow_site.settings import *  # noqa: E402,F401,F403
from taskflow_site.settings import BASE_DIR, database_from_url  # noqa: E402

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/taskflow")


def _answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5432), timeout=1):
            return True
    except OSError:
        return False


DATABASES = {
    "default": {
        **database_from_url(f"sqlite:///{BASE_DIR / '.test-default.sqlite3'}"),
        # A real file, so that threads with their own connections share it (WAL, IMMEDIATE).
        "TEST": {"NAME": str(BASE_DIR / ".test-default.sqlite3")},
    }
}
POSTGRES_AVAILABLE = _answers(POSTGRES_URL)
if POSTGRES_AVAILABLE:
    DATABASES["postgres"] = database_from_url(POSTGRES_URL)

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; test users only
