"""One store object per database alias (board.engine.stores): what differs between SQLite,
PostgreSQL and MongoDB is asked of it, and nothing outside board/engine/stores/ tests a vendor.
This reads every module of the app and the project for the ways a vendor gets tested."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from board.engine import stores
from board.engine.stores.postgresql import PostgresStore
from board.engine.stores.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parent.parent
STORES = ROOT / "board" / "engine" / "stores"

# A vendor test, in any of its spellings: the connection's vendor, an ENGINE compared, a
# backend's module named, MongoDB's own transaction flag, a backend feature asked directly.
VENDOR_TESTS = re.compile(
    r"\.vendor\b|\[\"ENGINE\"\]\s*[!=]=|ENGINE\"\)\s*[!=]=|django\.db\.backends\.(?:sqlite3|postgresql)\b"
    r"|in_atomic_block_mongo|\.features\.(?:has|supports|can)_|stores\.mongodb\.backend\b")
# Where a vendor test belongs without being the store's: Django's migrations run SQL per
# database by nature (history, not code the engine runs), and the settings build each store's
# DATABASES entry from DATABASE_URL (which ENGINE a URL means is the settings' to say).
ALLOWED = (ROOT / "board" / "migrations", ROOT / "taskflow_site" / "settings.py")


def modules() -> list[Path]:
    found = []
    for package in ("board", "taskflow_site", "server"):
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else ():
            if STORES in path.parents or any(path == allowed or allowed in path.parents for allowed in ALLOWED):
                continue
            found.append(path)
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_stores_tests_a_vendor(path):
    lines = [f"line {number}: {line.strip()}" for number, line in enumerate(path.read_text().splitlines(), 1)
             if VENDOR_TESTS.search(line)]
    assert lines == [], "ask board.engine.stores.store(using) instead"


def test_the_check_finds_each_spelling_of_a_vendor_test():
    for line in ('if connections[using].vendor == "sqlite":', 'if settings.DATABASES["default"]["ENGINE"] == x:',
                 "connection.in_atomic_block_mongo", 'engine == "django.db.backends.sqlite3"',
                 "if connection.features.has_select_for_update:"):
        assert VENDOR_TESTS.search(line), line


def test_one_store_per_alias_chosen_by_its_database():
    assert type(stores.store("default")) is SQLiteStore
    assert stores.store("default") is stores.store("default")
    assert stores.store("default").using == "default"


@pytest.mark.postgres
def test_postgresql_gets_its_own_store():
    assert type(stores.store("postgres")) is PostgresStore


def test_a_change_of_the_settings_chooses_again(settings):
    before = stores.store("default")
    settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": "orm"}
    assert stores.store("default") is not before
    assert stores.store("default").statements is None
