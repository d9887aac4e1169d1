"""A snapshot's column counts followed from the history (board.live.column_counts): after one
count, a process moves its counts by the events and prune records since, and they stay the
counts of the tasks the same read sees, on SQLite and PostgreSQL, under concurrent writers and
late commits (PostgreSQL), through deletions and a flushed history."""
from __future__ import annotations

import random
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from board.engine import clock, retention, transitions
from board.engine.stores import store
from board.engine.transitions import TaskSpec
from board.live import column_counts
from board.models import Dependency, Task, TaskEvent
from tests.support import sql_stores
from tests.test_outbox import cursor_at_the_end, open_writer

BACKENDS = sql_stores()


@pytest.fixture
def following(monkeypatch):
    """Every board followed, whatever its size (the module counts boards under FOLLOW_FROM)."""
    monkeypatch.setattr(column_counts, "FOLLOW_FROM", 1)
    column_counts.forget()
    yield
    column_counts.forget()


def read(alias) -> tuple[column_counts.BoardMark, dict, bool]:
    """One read: the mark, the counts counted in the same read, and whether the mark counted
    the tasks itself (a grouped query on the task table: SQL's GROUP BY, MongoDB's $group)
    rather than follow the history."""
    connections[alias].queries_log.clear()  # the log is bounded: a full one warns on each read
    with store(alias).read_transaction(), CaptureQueriesContext(connections[alias]) as queries:
        mark = column_counts.read_mark(alias)
        counted_by_mark = any("GROUP BY" in q["sql"] or "$group" in q["sql"] for q in queries.captured_queries)
        truth = column_counts.counted(alias)
    return mark, truth, counted_by_mark


def some_moves(alias, prefix: str, n: int) -> None:
    """Tasks created, claimed, completed, failed for good, released, cancelled; a dependent admitted."""
    transitions.create([TaskSpec(id=f"{prefix}-{i}", title="t") for i in range(n)], using=alias)
    transitions.create([TaskSpec(id=f"{prefix}-dep", title="after", deps=[f"{prefix}-0"])], using=alias)
    tokens = {i: transitions.claim(f"{prefix}-{i}", "a", 60, using=alias).lease.token for i in range(4)}
    transitions.complete(f"{prefix}-0", tokens[0], {}, using=alias)  # admits -dep: PENDING -> QUEUED
    transitions.fail(f"{prefix}-1", tokens[1], "boom", retryable=False, using=alias)
    transitions.release(f"{prefix}-2", tokens[2], using=alias)
    transitions.cancel(f"{prefix}-4", actor="op", using=alias)


def check_follow(alias):
    cursor_at_the_end(alias)  # a history to follow
    some_moves(alias, "a", 8)
    first, truth, counted = read(alias)
    assert counted and first.counts == truth
    some_moves(alias, "b", 6)
    later, truth, counted = read(alias)
    assert not counted, "the second read counted the tasks again"
    assert later.counts == truth and later.counts != first.counts
    assert later.last_event_id > first.last_event_id
    # Nothing since: the same counts, followed.
    again, truth, counted = read(alias)
    assert not counted and again.counts == truth == later.counts


def check_prune(alias):
    cursor_at_the_end(alias)
    some_moves(alias, "p", 8)
    transitions.create(TaskSpec(id="stays", title="t"), using=alias)  # the last event: its task stays
    before, _, _ = read(alias)
    # A prune run later in time (its `now`) deletes the finished tasks; a new task after it.
    report = retention.prune(now=clock.now(alias) + timedelta(days=400), using=alias)
    assert report.tasks_deleted["CANCELLED"] == 1  # (p-0 has a dependent, p-1 attempts left: kept)
    transitions.create(TaskSpec(id="after-prune", title="t"), using=alias)
    after, truth, counted = read(alias)
    assert not counted and after.counts == truth and after.last_removal_id > before.last_removal_id
    assert after.counts["CANCELLED"] == 0 < before.counts["CANCELLED"]


def check_flush(alias):
    cursor_at_the_end(alias)
    some_moves(alias, "f", 8)
    read(alias)
    # What a test database's flush does: every row gone, then new ones (their ids may be reused).
    for model in (TaskEvent, Dependency, Task):
        model.objects.using(alias).all().delete()
    transitions.create([TaskSpec(id=f"new-{i}", title="t") for i in range(3)], using=alias)
    mark, truth, counted = read(alias)
    assert counted and mark.counts == truth and truth["QUEUED"] == 3


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_an_event_committed_after_the_read_is_counted_once_by_the_read_that_sees_it(alias, following):
    """PostgreSQL: a transaction holding a lower event id commits after a read that saw a later
    one. That read's counts leave it out and name it unseen; the next read adds it, once."""
    cursor_at_the_end(alias)
    read(alias)
    thread, finish = open_writer(alias, "late")
    try:
        transitions.create(TaskSpec(id="early", title="t"), using=alias)  # a later id, committed first
        mark, truth, counted = read(alias)
        late_id = mark.last_event_id - 1
        assert not counted and mark.counts == truth and late_id in mark.unseen
    finally:
        finish.set()
        thread.join()
    seen, truth, counted = read(alias)
    assert not counted and seen.counts == truth and late_id not in seen.unseen
    assert seen.counts["QUEUED"] == mark.counts["QUEUED"] + 1
    again, truth, _ = read(alias)
    assert again.counts == truth == seen.counts


def check_race(alias, rounds: int = 100):
    """Four writers released together move tasks through every stage while an observer reads
    the board again and again: in every read the followed counts equal the counted ones."""
    cursor_at_the_end(alias)
    writers = 4
    barrier = threading.Barrier(writers + 1)
    done = threading.Event()
    reads: list[tuple[dict, dict, bool]] = []
    faults: list[BaseException] = []

    def writer(n):
        try:
            barrier.wait(timeout=30)
            for i in range(rounds):
                task_id = f"w{n}-{i}"
                transitions.create(TaskSpec(id=task_id, title="w"), using=alias)
                token = transitions.claim(task_id, f"agent-{n}", 60, using=alias).lease.token
                end = random.choice(("complete", "fail", "release", "cancel"))
                if end == "complete":
                    transitions.complete(task_id, token, {}, using=alias)
                elif end == "fail":
                    transitions.fail(task_id, token, "x", retryable=False, using=alias)
                elif end == "release":
                    transitions.release(task_id, token, using=alias)
                else:
                    transitions.cancel(task_id, actor="op", using=alias)
        except BaseException as exc:  # a writer's fault fails the test, never passes as a count
            faults.append(exc)
        finally:
            connections[alias].close()

    def observer():
        try:
            barrier.wait(timeout=30)
            while not done.is_set():
                mark, truth, counted = read(alias)
                reads.append((mark.counts, truth, counted))
        except BaseException as exc:
            faults.append(exc)
        finally:
            connections[alias].close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    watcher = threading.Thread(target=observer)
    for t in [*threads, watcher]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert not faults, faults
    final, truth, _ = read(alias)
    assert final.counts == truth and sum(truth.values()) >= writers * rounds
    wrong = [(followed, counted_then) for followed, counted_then, _ in reads if followed != counted_then]
    assert not wrong, f"{len(wrong)} of {len(reads)} reads had other counts, e.g. {wrong[0]}"
    followed = sum(not counted for _, _, counted in reads)
    assert len(reads) >= 10 and followed >= len(reads) - 1, (len(reads), followed)


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_snapshots_counts_follow_the_history_after_one_count(alias, following):
    check_follow(alias)


@pytest.mark.parametrize("alias", BACKENDS)
def test_tasks_the_prune_deleted_leave_the_counts_they_were_in(alias, following):
    check_prune(alias)


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_flushed_history_is_counted_again(alias, following):
    check_flush(alias)


@pytest.mark.parametrize("alias", BACKENDS)
def test_counts_followed_while_writers_move_tasks_equal_the_counted_ones_in_every_read(alias, following):
    check_race(alias)
