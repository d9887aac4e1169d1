"""The outbox tailer's cursor: every committed event is read exactly once, even when
transactions commit out of id order (PostgreSQL), and nothing rolled back is ever read."""
import threading
import time

import pytest
from django.db import connections

from board import transitions
from board.db import write_transaction
from board.events import HOLE_PATIENCE_SECONDS, Cursor
from board.models import TaskEvent
from board.transitions import TaskSpec
from tests.support import postgres_db_mark, sqlite_db_mark

BACKENDS = [pytest.param("default", marks=sqlite_db_mark(), id="sqlite"),
            pytest.param("postgres", marks=postgres_db_mark(), id="postgres")]


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


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_an_event_committed_after_a_later_id_is_still_read(alias):
    cursor = cursor_at_the_end(alias)
    inserted, commit = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with write_transaction(alias):
                transitions.create(TaskSpec(id="slow", title="slow"), using=alias)
                inserted.set()
                assert commit.wait(timeout=30)
        finally:
            connections[alias].close()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inserted.wait(timeout=30)
    transitions.create(TaskSpec(id="fast", title="fast"), using=alias)  # a later id, committed first
    first = [e.task_id for e in cursor.read(time.monotonic())]
    assert first == ["fast"] and len(cursor.holes) == 1
    commit.set()
    writer.join()
    second = [e.task_id for e in cursor.read(time.monotonic())]
    assert second == ["slow"] and cursor.holes == {}
    assert cursor.read(time.monotonic()) == []


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
                seen.extend(e.id for e in cursor.read(time.monotonic()))
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
    seen.extend(e.id for e in cursor.read(time.monotonic()))  # the last commits
    assert len(seen) == len(set(seen)), "an event was read twice"
    assert sorted(seen) == [i for i in all_event_ids(alias) if i > first_id] and len(seen) == 4 * 40 * 3


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_a_hole_is_given_up_after_its_patience(alias):
    transitions.create(TaskSpec(id="x", title="x"), using=alias)
    cursor = Cursor(0, using=alias)
    cursor.holes = {10_000_000: time.monotonic()}  # an id whose transaction rolled back
    cursor.read(time.monotonic())
    assert 10_000_000 in cursor.holes
    cursor.read(time.monotonic() + HOLE_PATIENCE_SECONDS + 1)
    assert cursor.holes == {}


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_parked_claims_are_woken_once_per_move_to_queued_of_a_task_still_queued(alias):
    from board.events import newly_ready

    cursor = cursor_at_the_end(alias)
    transitions.create([TaskSpec(id="a1", title="a", queue="alpha"), TaskSpec(id="a2", title="a", queue="alpha"),
                        TaskSpec(id="b1", title="b", queue="beta"),
                        TaskSpec(id="held", title="h", queue="beta", hold=True)])
    taken = transitions.claim("a2", "agent", 60)
    transitions.release("a2", taken.lease.token)  # back to QUEUED: a second event for a2
    transitions.claim("b1", "agent", 60)  # no longer ready when the tailer reads
    events = cursor.read(time.monotonic())
    # a1 (create), a2 (create, release: both QUEUED events while it is QUEUED), b1 claimed since
    assert newly_ready(events) == {"alpha": 3}
    assert newly_ready([e for e in events if e.to_stage != "QUEUED"]) == {}
