"""Fenced downstream writes (board/fencing.py, docs/fencing.md): a holder that has been taken
over cannot overwrite what the new holder wrote.

Every race uses real fences from the engine: holder A claims a task, its lease is aged past
expiry by writing the row, holder B takes the task over (a higher fence, and A's token is dead).
Then A and B write the task's downstream row at the same moment, from two threads with their
own connections released by a barrier, 200 rounds, on SQLite and PostgreSQL. Whatever the
order, the row ends with B's value and fence; A's write is accepted only when it landed before
B's, and refused with StaleFence (naming B's fence) when it landed after.
"""
from __future__ import annotations

import re
import sqlite3
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
from django.db import connections, transaction

from board.engine import errors, transitions
from board.engine.transitions import TaskSpec
from board.fencing import FencedWriter, StaleFence
from tests.fenced_sink.models import SinkRow
from tests.support import (
    database_url,
    expire_lease,
    postgres_db_mark,
    race,
    sqlite_db_mark,
)

ROUNDS = 200
TTL = 60
# Only to vary who goes first from round to round (tests/support.race); no assertion depends on it.
JITTER = [0.002, 0.002]
DOC = Path(__file__).resolve().parent.parent / "docs" / "fencing.md"


def recipe(name: str) -> dict:
    """Run the docs' code block marked `fencing-recipe: name`, as written, and return its names."""
    text = DOC.read_text()
    found = re.search(rf"<!-- fencing-recipe: {name} .*?-->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, f"docs/fencing.md has no {name} recipe"
    namespace: dict = {"__name__": f"fencing_recipe_{name}"}
    exec(compile(found.group(1), f"{DOC}:{name}", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def two_holders(alias: str, task_id: str):
    """Holder A's lease, then holder B's after A's expired and B took the task over."""
    transitions.create(TaskSpec(id=task_id, title=task_id), using=alias)
    a = transitions.claim(task_id, "holder-a", TTL, using=alias).lease
    expire_lease(task_id, using=alias)
    b = transitions.claim(task_id, "holder-b", TTL, using=alias).lease
    assert b.fence > a.fence
    # A is superseded on the board itself: only its downstream writes are left to refuse.
    with pytest.raises(errors.LeaseLost):
        transitions.renew(task_id, a.token, TTL, using=alias)
    return a, b


def judge_round(n: int, a_fence: int, b_fence: int, a_outcome, b_outcome,
                stale_type: type[Exception]) -> str:
    """The exact outcomes a round may have; returns 'A first' or 'A refused'."""
    assert not isinstance(b_outcome, BaseException), f"round {n}: B's write failed: {b_outcome!r}"
    if isinstance(a_outcome, stale_type):
        # A landed after B: refused. FencedWriter's error says what it met (B's fence).
        if isinstance(a_outcome, StaleFence):
            assert (a_outcome.fence, a_outcome.stored_fence) == (a_fence, b_fence), f"round {n}"
        return "A refused"
    assert not isinstance(a_outcome, BaseException), f"round {n}: A's write failed: {a_outcome!r}"
    return "A first"


class FencedWriterContract:
    """FencedWriter on one database alias (subclasses below)."""

    alias: str

    @property
    def writer(self) -> FencedWriter:
        return FencedWriter(SinkRow, using=self.alias)

    def rows(self) -> list[tuple]:
        return list(SinkRow.objects.using(self.alias).order_by("key").values_list("key", "fence", "value", "writer"))

    def test_first_write_inserts_equal_and_higher_fences_overwrite_a_lower_one_is_refused(self):
        assert self.writer.write("t1", 3, value="first", writer="a") == "inserted"
        assert self.writer.write("t1", 3, value="again", writer="a") == "updated"  # the same holder
        assert self.writer.write("t1", 4, value="newer", writer="b") == "updated"
        before = self.rows()
        with pytest.raises(StaleFence) as refused:
            self.writer.write("t1", 3, value="late", writer="a")
        assert (refused.value.key, refused.value.fence, refused.value.stored_fence) == ("t1", 3, 4)
        assert "fence 3" in str(refused.value) and "fence 4" in str(refused.value)
        assert self.rows() == before == [("t1", 4, "newer", "b")]
        # Keys are independent: a lower fence on another key is that key's first write.
        assert self.writer.write("t2", 1, value="other", writer="c") == "inserted"
        assert self.rows() == [("t1", 4, "newer", "b"), ("t2", 1, "other", "c")]

    def test_bad_fences_and_misuse_are_refused_before_anything_is_written(self):
        for fence, kind in (("3", TypeError), (3.0, TypeError), (True, TypeError), (None, TypeError), (-1, ValueError)):
            with pytest.raises(kind):
                self.writer.write("t1", fence, value="x")
        with pytest.raises(ValueError, match="set by the writer"):
            self.writer.write("t1", 1, fence=2, value="x")
        with pytest.raises(ValueError, match="must be unique"):
            FencedWriter(SinkRow, key_field="writer", using=self.alias)
        with pytest.raises(TypeError, match="integer field"):
            FencedWriter(SinkRow, fence_field="value", using=self.alias)
        assert self.rows() == []

    def test_a_refused_write_inside_the_callers_transaction_leaves_it_usable(self):
        self.writer.write("t1", 5, value="current", writer="b")
        with transaction.atomic(using=self.alias):
            with pytest.raises(StaleFence):
                self.writer.write("t1", 4, value="late", writer="a")
            self.writer.write("t2", 1, value="same transaction", writer="a")
        assert self.rows() == [("t1", 5, "current", "b"), ("t2", 1, "same transaction", "a")]

    def test_two_holders_write_at_once_and_only_the_current_one_survives_200_rounds(self):
        seen = Counter()
        for n in range(ROUNDS):
            key = f"fenced-{n}"
            a, b = two_holders(self.alias, key)
            # Odd rounds: A had written before it was superseded (the race is UPDATE against
            # UPDATE). Even rounds: the row does not exist yet (INSERT against INSERT).
            wrote_before = n % 2 == 1
            if wrote_before:
                assert self.writer.write(key, a.fence, value=f"A{n}-early", writer="holder-a") == "inserted"
            writer = self.writer
            a_out, b_out = race([
                partial(writer.write, key, a.fence, value=f"A{n}", writer="holder-a"),
                partial(writer.write, key, b.fence, value=f"B{n}", writer="holder-b"),
            ], alias=self.alias, jitter=JITTER)
            order = judge_round(n, a.fence, b.fence, a_out, b_out, StaleFence)
            # Which statement each made, given the order: exactly one first insert per key.
            if wrote_before:
                expected = ("updated", "updated") if order == "A first" else (None, "updated")
            else:
                expected = ("inserted", "updated") if order == "A first" else (None, "inserted")
            got = (None if isinstance(a_out, StaleFence) else a_out, b_out)
            assert got == expected, f"round {n}: {got} for {order}"
            # Every round the sink holds B's value and fence; A's never survives B's.
            assert SinkRow.objects.using(self.alias).filter(key=key).count() == 1
            assert SinkRow.objects.using(self.alias).values_list("fence", "value", "writer").get(key=key) == (
                b.fence, f"B{n}", "holder-b"), f"round {n}"
            seen[order] += 1
        assert sum(seen.values()) == ROUNDS
        # Both orders happened, so both paths ran (A's write landing first, then refused after
        # B's; each with a first insert racing the other's in the even rounds).
        assert set(seen) == {"A first", "A refused"}, seen
        assert SinkRow.objects.using(self.alias).exclude(writer="holder-b").count() == 0
        print(f"\n{self.alias}: {ROUNDS} rounds, {dict(sorted(seen.items()))}")


class TestFencedWriterSQLite(FencedWriterContract):
    pytestmark = sqlite_db_mark()
    alias = "default"


class TestFencedWriterPostgres(FencedWriterContract):
    pytestmark = postgres_db_mark()
    alias = "postgres"


# -- the docs' recipe for any SQL table, run as written ---------------------------------------

REPORT_TABLE = "CREATE TABLE report (task_id TEXT PRIMARY KEY, fence BIGINT NOT NULL, body TEXT NOT NULL)"


def check_recipe(alias: str, connect, code: dict, read_row) -> None:
    """The doc's recipe (`code`: what its block defines) against the contract: first write, same
    holder again, newer holder, then an older one, single-threaded; then the two holders' race."""
    with connect() as db:
        code["write_report"](db, "solo", 2, "first")
        code["write_report"](db, "solo", 2, "again")
        code["write_report"](db, "solo", 3, "newer")
        with pytest.raises(code["StaleFence"]):
            code["write_report"](db, "solo", 2, "late")
    assert read_row("solo") == (3, "newer")
    race_recipe(alias, connect, code["write_report"], code["StaleFence"], read_row)


def race_recipe(alias: str, connect, write, stale: type[Exception], read_row) -> Counter:
    """Two holders of each task write through `write` (the recipe's function) at once, each
    thread on its own connection; returns how the rounds went."""
    seen = Counter()
    for n in range(ROUNDS):
        key = f"recipe-{n}"
        a, b = two_holders(alias, key)
        wrote_before = n % 2 == 1
        if wrote_before:
            with connect() as db:
                write(db, key, a.fence, f"A{n}-early")

        def writer(key, fence, body):
            with connect() as db:
                return write(db, key, fence, body)

        a_out, b_out = race([partial(writer, key, a.fence, f"A{n}"), partial(writer, key, b.fence, f"B{n}")],
                            alias=alias, jitter=JITTER)
        seen[judge_round(n, a.fence, b.fence, a_out, b_out, stale)] += 1
        assert read_row(key) == (b.fence, f"B{n}"), f"round {n}"
        # The recipe refuses exactly what FencedWriter refuses: a lower fence, after the fact.
        with pytest.raises(stale), connect() as db:
            write(db, key, a.fence, "late")
        assert read_row(key) == (b.fence, f"B{n}")
    assert sum(seen.values()) == ROUNDS
    assert set(seen) == {"A first", "A refused"}, seen  # both orders happened
    print(f"\nrecipe on {alias}: {ROUNDS} rounds, {dict(sorted(seen.items()))}")
    return seen


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_sqlite3_recipe_refuses_the_superseded_holder_over_200_rounds(tmp_path):
    code = recipe("sqlite3")
    path = tmp_path / "downstream.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(REPORT_TABLE)

    class connect:  # a fresh connection per writer, closed after it (sqlite3's own `with` only commits)
        def __enter__(self):
            self.db = sqlite3.connect(path, timeout=30)
            return self.db

        def __exit__(self, *exc):
            self.db.close()

    def read_row(key):
        with connect() as db:
            return db.execute("SELECT fence, body FROM report WHERE task_id = ?", (key,)).fetchone()

    check_recipe("default", connect, code, read_row)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_the_psycopg_recipe_refuses_the_superseded_holder_over_200_rounds():
    import psycopg

    code = recipe("psycopg")
    # The test database Django made for the postgres alias; the recipe's table lives beside the board's.
    url = database_url(connections["postgres"].settings_dict)

    def connect():
        return psycopg.connect(url, autocommit=True)

    def read_row(key):
        with connect() as db:
            return db.execute("SELECT fence, body FROM report WHERE task_id = %s", (key,)).fetchone()

    with connect() as db:
        db.execute(REPORT_TABLE)
    try:
        check_recipe("postgres", connect, code, read_row)
    finally:
        with connect() as db:
            db.execute("DROP TABLE report")
