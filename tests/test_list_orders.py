"""The API's read orders (board.api.reads) and a task's latest history, on every store:
`task_list(order="claim")` paged through `list_key` cursors gives the QUEUED tasks in exactly the
order claim_next then takes them, and `selectors.latest_events` the N most recent history rows,
oldest first. SQLite and
PostgreSQL here; MongoDB in tests/mongodb/test_list_orders_mongodb.py."""
import pytest

from board.api import reads
from board.engine import selectors, transitions
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
