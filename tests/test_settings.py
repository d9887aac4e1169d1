"""Settings come from the environment, and production settings are secure by default."""
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL"}}
    clean["DJANGO_SETTINGS_MODULE"] = "taskflow_site.settings"
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_production_settings_pass_check_deploy(tmp_path):
    done = manage("check", "--deploy", "--fail-level", "WARNING",
                  DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="board.example.com",
                  DATABASE_URL=f"sqlite:///{tmp_path / 'prod.sqlite3'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    done = manage("check", DEBUG="0", DATABASE_URL=f"sqlite:///{tmp_path / 'prod.sqlite3'}")
    assert done.returncode != 0
    assert "SECRET_KEY is not set" in done.stderr


def test_database_url_selects_postgres_and_sqlite_gets_its_concurrency_options():
    from taskflow_site.settings import database_from_url

    pg = database_from_url("postgres://u@db.internal:6543/board")
    assert (pg["ENGINE"], pg["HOST"], pg["PORT"], pg["NAME"]) == (
        "django.db.backends.postgresql", "db.internal", 6543, "board")
    lite = database_from_url("sqlite:////srv/board.sqlite3")
    assert lite["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in lite["OPTIONS"]["init_command"]
    assert lite["OPTIONS"]["timeout"] > 0


def test_a_mongodb_url_selects_the_mongodb_engine_with_majority_defaults_the_url_may_override():
    import pytest
    from django.core.exceptions import ImproperlyConfigured

    from taskflow_site.settings import database_from_url

    rs = database_from_url("mongodb://a.internal:27017,b.internal:27017/board?replicaSet=rs0")
    assert (rs["ENGINE"], rs["NAME"]) == ("board.engine.stores.mongodb.backend", "board")
    assert rs["HOST"] == "mongodb://a.internal:27017,b.internal:27017/board?replicaSet=rs0"
    assert rs["OPTIONS"] == {"w": "majority", "readConcernLevel": "majority", "serverSelectionTimeoutMS": 5000}
    # An option the URL gives wins (names are case-insensitive in MongoDB URLs).
    given = database_from_url("mongodb+srv://cluster.example.net/board?W=1&readconcernlevel=local")
    assert given["OPTIONS"] == {"serverSelectionTimeoutMS": 5000}
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        database_from_url("mongodb://a.internal:27017/?replicaSet=rs0")


def test_production_settings_on_mongodb_pass_check_deploy():
    done = manage("check", "--deploy", "--fail-level", "WARNING",
                  DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="board.example.com",
                  DATABASE_URL="mongodb://127.0.0.1:1/taskflow?replicaSet=rs0")  # no server needed
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


# Issue 27, item 12: an acknowledged commit survives a power cut on the default store.
READ_SYNCHRONOUS = ("from django.db import connection; c = connection.cursor(); "
                    "c.execute('PRAGMA synchronous'); print('synchronous', c.fetchone()[0])")


@pytest.mark.parametrize(("chosen", "expected"), [(None, 2), ("full", 2), ("normal", 1), ("NORMAL", 1)])
def test_sqlite_connections_run_with_the_chosen_synchronous_full_by_default(tmp_path, chosen, expected):
    """Read through the connection Django makes from the settings, in a process started the way
    the server's are (DATABASE_URL in the environment): 2 is FULL (every commit synced before it
    is acknowledged), 1 is NORMAL."""
    env = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50), "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    if chosen is not None:
        env["SQLITE_SYNCHRONOUS"] = chosen
    done = manage("shell", "-c", READ_SYNCHRONOUS, **env)
    assert done.returncode == 0, done.stderr
    assert f"synchronous {expected}" in done.stdout, done.stdout + done.stderr


def test_an_unknown_sqlite_synchronous_is_refused(tmp_path):
    done = manage("check", DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), SQLITE_SYNCHRONOUS="off",
                  DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert done.returncode != 0 and "SQLITE_SYNCHRONOUS" in done.stderr, done.stderr


@pytest.mark.django_db(transaction=True)
def test_the_test_runs_own_sqlite_connection_is_full():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        assert cursor.fetchone()[0] == 2


def test_an_unknown_log_format_is_refused(tmp_path):
    done = manage("check", DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), LOG_FORMAT="xml",
                  DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert done.returncode != 0 and "LOG_FORMAT must be text or json" in done.stderr, done.stderr
