"""The outbox's cursor (board.live.outbox): every committed event is read exactly once, even when
transactions commit out of id order (PostgreSQL), and nothing rolled back is ever read."""
import json
import threading
from datetime import timedelta

import pytest
from django.db import connections

from board.engine import clock, retention, transitions
from board.engine.stores import store
from board.engine.limits import MAX_BATCH_TASKS
from board.engine.transitions import TaskSpec
from board.live import frames, outbox
from board.live.outbox import Cursor
from board.models import TaskEvent
from tests.live_server import wait_until
from tests.support import sql_stores

BACKENDS = sql_stores()


def all_event_ids(alias):
    return list(TaskEvent.objects.using(alias).order_by("id").values_list("id", flat=True))


def cursor_at_the_end(alias) -> Cursor:
    """A cursor placed after every event so far, as a tailer starts (ids are not reset between
    tests, so starting at 0 would see earlier tests' ids as holes)."""
    last = TaskEvent.objects.using(alias).order_by("-id").values_list("id", flat=True).first()
    if last is None:  # an empty table: the next id is the sequence's, maybe far above 0
        transitions.create(TaskSpec(id="marker", title="marker"), using=alias)
        last = TaskEvent.objects.using(alias).order_by("-id").values_list("id", flat=True).first()
    return Cursor(last, using=alias)


def read(cursor: Cursor) -> list[TaskEvent]:
    """Every event the cursor can read now (page after page), moving it past them."""
    found = []
    while True:
        page = cursor.read()
        cursor.advance(page)
        found += page.events
        if not page.full:
            return found


class _RolledBack(Exception):
    pass


def open_writer(alias, task_id: str, *, rollback: bool = False) -> tuple[threading.Thread, threading.Event]:
    """A writer whose transaction has created task `task_id` (so holds its event's id) and stays
    open until the returned event is set, then commits (or rolls back). Returns (thread, finish)
    once the row is inserted."""
    inserted, finish = threading.Event(), threading.Event()

    def write():
        try:
            with store(alias).write_transaction():
                transitions.create(TaskSpec(id=task_id, title=task_id), using=alias)
                inserted.set()
                assert finish.wait(timeout=30)
                if rollback:
                    raise _RolledBack
        except _RolledBack:
            pass
        finally:
            connections[alias].close()

    thread = threading.Thread(target=write)
    thread.start()
    assert inserted.wait(timeout=30)
    return thread, finish


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_an_event_committed_after_a_later_id_is_still_read(alias):
    cursor = cursor_at_the_end(alias)
    writer, commit = open_writer(alias, "slow")
    transitions.create(TaskSpec(id="fast", title="fast"), using=alias)  # a later id, committed first
    first = [e.task_id for e in read(cursor)]
    assert first == ["fast"] and len(cursor.holes) == 1
    commit.set()
    writer.join()
    second = [e.task_id for e in read(cursor)]
    assert second == ["slow"] and cursor.holes == {}
    assert read(cursor) == []


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_a_hole_is_kept_while_its_transaction_runs_and_given_up_once_it_rolled_back(alias):
    cursor = cursor_at_the_end(alias)
    writer, finish = open_writer(alias, "doomed", rollback=True)
    transitions.create(TaskSpec(id="later", title="later"), using=alias)
    assert [e.task_id for e in read(cursor)] == ["later"]
    for _ in range(50):  # however many passes go by, a hole of a running transaction stays
        assert read(cursor) == [] and len(cursor.holes) == 1
    finish.set()
    writer.join()
    # Given up by the first read that starts once every transaction older than the hole's
    # horizon has ended. Transaction ids are the whole server's: other databases' transactions
    # (other test runs) may hold that moment back; the test waits for it, then reads once.
    (horizon,) = set(cursor.holes.values())
    wait_until(lambda: outbox._oldest_running_xid(alias) >= horizon, 300, "older transactions ended")
    assert read(cursor) == [] and cursor.holes == {}
    transitions.create(TaskSpec(id="after", title="after"), using=alias)
    assert [e.task_id for e in read(cursor)] == ["after"]


@pytest.mark.parametrize("alias", [BACKENDS[1]])
@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_cursor_started_while_a_lower_id_is_uncommitted_reads_it_once_it_commits(alias, ending):
    """A tailer that starts after a later id committed, while a transaction holding a lower one
    is still open: the lower id is a hole from the start, read when it commits, given up once
    its writer rolled back."""
    cursor_at_the_end(alias)  # the table is not empty: the window below the newest id is real
    thread, finish = open_writer(alias, "open", rollback=ending == "rollback")
    try:
        transitions.create(TaskSpec(id="later", title="later"), using=alias)
        cursor = outbox.starting_cursor(alias)
        assert cursor.last_id == all_event_ids(alias)[-1]
        assert read(cursor) == []  # nothing after the newest id yet; the open one is a hole
        open_id = cursor.last_id - 1
        assert open_id in cursor.holes
    finally:
        finish.set()
        thread.join()
    if ending == "commit":
        assert [e.task_id for e in read(cursor)] == ["open"] and open_id not in cursor.holes
    else:
        horizon = cursor.holes[open_id]
        wait_until(lambda: outbox._oldest_running_xid(alias) >= horizon, 300, "older transactions ended")
        assert read(cursor) == [] and cursor.holes == {}
    assert read(cursor) == []


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_a_starting_cursor_takes_no_hole_below_an_event_older_than_the_prune_window(alias):
    """On a quiet board the last ids are old and the prune has deleted many of them: none of
    them can still commit, so none is a hole (each would be asked for on every read while any
    older transaction stays open on the server). A recent missing id still is one."""
    cursor_at_the_end(alias)
    old = [f"old{i}" for i in range(6)]
    for task_id in old:
        transitions.create(TaskSpec(id=task_id, title="old"), using=alias)
    ancient = clock.now(alias) - retention.MIN_WINDOW - timedelta(minutes=1)
    TaskEvent.objects.using(alias).filter(task_id__in=old).update(at=ancient)
    TaskEvent.objects.using(alias).filter(task_id__in=["old1", "old3", "old4"]).delete()  # as a prune does
    for i in range(3):
        transitions.create(TaskSpec(id=f"new{i}", title="new"), using=alias)
    recent_gap = TaskEvent.objects.using(alias).get(task_id="new1").id
    TaskEvent.objects.using(alias).filter(id=recent_gap).delete()  # as a transaction still open leaves

    cursor = outbox.starting_cursor(alias)

    assert cursor.last_id == all_event_ids(alias)[-1]
    assert set(cursor.holes) == {recent_gap}


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_a_starting_cursor_on_sqlite_has_no_holes(alias):
    transitions.create([TaskSpec(id=f"s{i}", title="s") for i in range(3)], using=alias)
    TaskEvent.objects.using(alias).filter(task_id="s1").delete()  # a gap, as a prune leaves
    cursor = outbox.starting_cursor(alias)
    assert cursor.last_id == all_event_ids(alias)[-1] and cursor.holes == {}


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_a_snapshot_names_the_ids_below_its_last_event_it_does_not_hold(alias):
    """The page ignores a change at or below the snapshot's last event to a task the snapshot
    left out, unless the snapshot names its id as unseen: a transaction that had taken it and
    not committed yet when the snapshot was read."""
    cursor_at_the_end(alias)
    thread, finish = open_writer(alias, "open")
    try:
        transitions.create(TaskSpec(id="later", title="later"), using=alias)
        head = json.loads(frames.snapshot_frames(problems=[], using=alias)[0])
        open_id = head["last_event_id"] - 1
        assert head["last_event_id"] == all_event_ids(alias)[-1]
        # Ids of earlier tests' rows (emptied, never reused) are missing too: the snapshot cannot
        # tell them from a late commit, and the page applying a change of theirs costs nothing.
        assert open_id in head["unseen_event_ids"] and head["last_event_id"] not in head["unseen_event_ids"]
        shown = {t["id"] for t in head["tasks"]}
        assert "later" in shown and "open" not in shown
    finally:
        finish.set()
        thread.join()
    head = json.loads(frames.snapshot_frames(problems=[], using=alias)[0])
    assert open_id not in head["unseen_event_ids"] and "open" in {t["id"] for t in head["tasks"]}


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_a_snapshot_on_sqlite_names_no_unseen_id(alias):
    """SQLite's ids follow commit order: a gap below the last event is a write that rolled back
    (or a pruned row), never one still to commit."""
    transitions.create([TaskSpec(id=f"s{i}", title="s") for i in range(3)], using=alias)
    TaskEvent.objects.using(alias).filter(task_id="s1").delete()
    head = json.loads(frames.snapshot_frames(problems=[], using=alias)[0])
    assert head["last_event_id"] == all_event_ids(alias)[-1] and head["unseen_event_ids"] == []


@pytest.mark.parametrize("alias", BACKENDS)
def test_concurrent_writers_every_event_read_exactly_once(alias):
    cursor = cursor_at_the_end(alias)
    first_id = cursor.last_id
    seen: list[int] = []
    done = threading.Event()
    barrier = threading.Barrier(5)

    def writer(n):
        try:
            barrier.wait(timeout=30)
            for i in range(40):
                transitions.create(TaskSpec(id=f"w{n}-{i}", title="w"), using=alias)
                claim = transitions.claim(f"w{n}-{i}", f"agent-{n}", 60, using=alias)
                transitions.complete(f"w{n}-{i}", claim.lease.token, {}, using=alias)
        finally:
            connections[alias].close()

    def reader():
        try:
            barrier.wait(timeout=30)
            while not done.is_set():
                seen.extend(e.id for e in read(cursor))
        finally:
            connections[alias].close()

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    tail = threading.Thread(target=reader)
    for t in writers + [tail]:
        t.start()
    for t in writers:
        t.join()
    done.set()
    tail.join()
    seen.extend(e.id for e in read(cursor))  # the last commits
    assert len(seen) == len(set(seen)), "an event was read twice"
    assert sorted(seen) == [i for i in all_event_ids(alias) if i > first_id] and len(seen) == 4 * 40 * 3


@pytest.mark.parametrize("alias", BACKENDS)
def test_one_commit_larger_than_a_page_is_read_in_pages_each_event_once(alias):
    cursor = cursor_at_the_end(alias)
    first_id = cursor.last_id
    total = 2 * outbox.EVENTS_PER_READ + 5
    with store(alias).write_transaction():  # one commit, made of requests of at most MAX_BATCH_TASKS
        for start in range(0, total, MAX_BATCH_TASKS):
            transitions.create([TaskSpec(id=f"p{i}", title="p") for i in range(start, min(start + MAX_BATCH_TASKS, total))],
                               using=alias)
    pages = []
    while True:
        page = cursor.read()
        cursor.advance(page)
        pages.append(len(page.events))
        if not page.full:
            break
    assert pages == [outbox.EVENTS_PER_READ, outbox.EVENTS_PER_READ, 5]
    assert cursor.last_id == all_event_ids(alias)[-1] and cursor.last_id - first_id == 2 * outbox.EVENTS_PER_READ + 5
