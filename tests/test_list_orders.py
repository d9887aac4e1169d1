"""The API's read orders (board.api.reads) and a task's latest history, on every store:
`task_list(order="claim")` paged through `list_key` cursors gives the QUEUED tasks in exactly the
order claim_next then takes them, and `selectors.latest_events` the N most recent history rows,
oldest first. SQLite and
PostgreSQL here; MongoDB in tests/mongodb/test_list_orders_mongodb.py."""
import base64
import json

import pytest

from board.api import reads
from board.engine import listing, selectors, transitions
from board.models import TaskEvent
from tests.support import sql_stores


def check_claim_order_pages(using: str) -> None:
    # A batch shares one created_at: the id breaks the tie, as in a claim.
    transitions.create([transitions.TaskSpec(title=f"t{i}", id=f"t{i}", priority=i % 3) for i in range(9)],
                       actor="test", using=using)
    transitions.create([transitions.TaskSpec(title="late", id="late", priority=2),
                        transitions.TaskSpec(title="held", id="held", priority=9, on_hold=True)],
                       actor="test", using=using)
    listed, after = [], None
    while page := reads.task_list(stages=["QUEUED"], order="claim", after=after, count=2, using=using):
        listed += [task.pk for task in page]
        after = reads.list_key(page[-1], "claim")
    assert listed == ["t2", "t5", "t8", "late", "t1", "t4", "t7", "t0", "t3", "t6"]
    taken = []
    while (claim := transitions.claim_next("agent", 60, using=using)) is not None:
        taken.append(claim.task.pk)
    assert taken == listed
    oldest_first = [task.pk for task in reads.task_list(stages=["RUNNING"], count=100, using=using)]
    assert oldest_first == [f"t{i}" for i in range(9)] + ["late"]


def check_latest_events(using: str) -> None:
    transitions.create([transitions.TaskSpec(title="t", id="t"), transitions.TaskSpec(title="u", id="u")],
                       actor="test", using=using)
    for _ in range(3):
        for task_id in ("t", "u"):
            token = transitions.claim(task_id, "agent", 60, using=using).lease.token
            transitions.release(task_id, token, using=using)
    everything = list(TaskEvent.objects.using(using).filter(task_id="t").order_by("id"))
    assert len(everything) == 7
    for count in (1, 3, 7, 500):
        assert selectors.latest_events("t", count, using=using) == everything[-count:]


@pytest.mark.parametrize("using", sql_stores())
def test_claim_order_pages_are_the_order_claims_take(using):
    check_claim_order_pages(using)


@pytest.mark.parametrize("using", sql_stores())
def test_latest_events_are_the_most_recent_oldest_first(using):
    check_latest_events(using)


# -- every order of the task list (board.engine.listing), paged by cursors -----------------------


def _varied_board(using: str) -> list:
    """25 tasks with distinct creation and update times, priorities with ties, and some RUNNING
    since different moments (the in_stage order's key), one written outside the engine without a
    stage_changed_at (it sorts by its last write, as board.public shows it)."""
    from datetime import timedelta

    from django.utils import timezone

    from board.models import Task
    transitions.create([transitions.TaskSpec(title=f"task {i}", id=f"v{i:02}", priority=i % 4, queue=f"q{i % 2}")
                        for i in range(25)], actor="test", using=using)
    base = timezone.now() - timedelta(hours=1)
    for i in range(25):
        # created in one order, updated in another, in stage since a third
        Task.objects.using(using).filter(pk=f"v{i:02}").update(
            created_at=base + timedelta(seconds=i), updated_at=base + timedelta(seconds=(i * 7) % 25, minutes=5),
            stage_changed_at=None if i == 3 else base + timedelta(seconds=(i * 11) % 25, minutes=2))
    return list(Task.objects.using(using).all())


def _expected(tasks, order: str) -> list[str]:
    from board.engine import listing
    keyed = [(listing.list_key(t, order), t.pk) for t in tasks]
    fields = listing.LIST_ORDERS[order]
    for position in reversed(range(len(fields))):  # a stable sort per field, last field first
        keyed.sort(key=lambda pair: pair[0][position], reverse=fields[position].startswith("-"))
    return [pk for _, pk in keyed]


def check_every_order_pages_by_cursor(using: str) -> None:
    from board.engine import listing
    tasks = _varied_board(using)
    for order in listing.LIST_ORDERS:
        listed, cursor = [], None
        while True:
            after = listing.cursor_after(cursor, order) if cursor else None
            page = listing.task_list(order=order, after=after, count=4, using=using)
            listed += [task.pk for task in page]
            if len(page) < 4:
                break
            cursor = listing.cursor_of(page[-1], order)
        assert listed == _expected(tasks, order), order
        assert len(listed) == listing.count_tasks(listing.Filters(), using=using) == 25
    # A filter narrows every order alike, and the count says how many its pages hold.
    narrowed = listing.check_filters(queue="q1", text="TASK 1")
    assert listing.count_tasks(narrowed, using=using) == 6  # v01, v11, v13, v15, v17, v19
    ids = [t.pk for t in listing.task_list(queue="q1", text="TASK 1", order="priority", count=100, using=using)]
    assert ids == ["v11", "v15", "v19", "v01", "v13", "v17"]  # priority 3 then 1, oldest first


@pytest.mark.parametrize("using", sql_stores())
def test_every_order_of_the_task_list_pages_by_cursor_in_exactly_its_sort(using):
    check_every_order_pages_by_cursor(using)


def test_a_cursor_is_good_only_for_its_own_order():
    from board.engine import errors, listing
    from board.models import Task
    from django.utils import timezone
    task = Task(id="t", created_at=timezone.now(), updated_at=timezone.now(), priority=2, claim_rank=1.0)
    for order in listing.LIST_ORDERS:
        cursor = listing.cursor_of(task, order)
        assert listing.cursor_after(cursor, order) == listing.list_key(task, order)
        for other in set(listing.LIST_ORDERS) - {order}:
            with pytest.raises(errors.InvalidRequest):
                listing.cursor_after(cursor, other)


@pytest.mark.parametrize("parts", [
    ("claim", 1733456789.123456, "task-1"),
    ("updated", "2026-12-06T03:58:00.123456+00:00", "ünïcode \"quoted\" \\ back\tslash\n\u2028"),
    (12345678901234567890, -0.0, 1e-300, 2.5e300, 0),
    ("", "<script>&</script>"),
    (True, None, 1),  # not a cursor's: json.dumps writes these
    (float("nan"), "x"),
])
def test_a_cursor_is_the_base64_of_the_json_that_json_dumps_writes(parts):
    assert listing.encode_cursor(*parts) == base64.urlsafe_b64encode(
        json.dumps(list(parts)).encode()).decode().rstrip("=")
