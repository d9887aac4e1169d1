"""The Python client's deadlines (issue 29, item 7) against the REAL server (manage.py serve) on
the test database: `create(..., queue_timeout_seconds=, attempt_timeout_seconds=,
progress_timeout_seconds=)` and a holder whose lease the deadline pass takes back. Refusals raise
their error class and leave the database as it was."""
from datetime import timedelta

import pytest
from django.utils import timezone

from board.engine import transitions
from board.models import Task
from taskflow_client import LeaseLost, ValidationFailed
from tests.live_server import board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark
from tests.test_client import alice, keys  # noqa: F401  (fixtures)

pytestmark = sqlite_db_mark()


def test_create_sets_deadlines_and_a_lease_without_progress_is_taken_back(alice):
    made = alice.create([{"id": "d1", "title": "stuck in a loop"}, {"id": "d2", "title": "progressing"}],
                        attempt_timeout_seconds=3600, progress_timeout_seconds=60)
    assert [(t["attempt_timeout_seconds"], t["progress_timeout_seconds"], t["queue_timeout_seconds"])
            for t in made] == [(3600, 60, None)] * 2
    stuck, moving = alice.claim("d1", 300), alice.claim("d2", 300)
    for task_id in ("d1", "d2"):  # both claimed 50 s ago (the row aged, not slept)
        Task.objects.filter(pk=task_id).update(stage_changed_at=timezone.now() - timedelta(seconds=50))
    stuck.renew()  # a heartbeat only
    moving.renew(progress=0.5)
    assert moving.task["progress_changed_at"] is not None
    moved = transitions.enforce_deadlines(now=timezone.now() + timedelta(seconds=11))
    assert [(m.task_id, m.reason) for m in moved] == [("d1", "no progress in 60 s")]
    with pytest.raises(LeaseLost):
        stuck.complete({"late": True})
    moving.complete({"done": True})
    assert list(Task.objects.order_by("pk").values_list("stage", flat=True)) == ["QUEUED", "COMPLETED"]


@pytest.mark.parametrize("deadline", [{"queue_timeout_seconds": 0}, {"attempt_timeout_seconds": -1},
                                      {"progress_timeout_seconds": 30 * 24 * 3600 + 1}])
def test_a_bad_deadline_raises_validation_failed_and_creates_nothing(alice, deadline):
    before = db_state()
    with pytest.raises(ValidationFailed):
        alice.create({"title": "t"}, **deadline)
    with pytest.raises(ValidationFailed):
        alice.create({"title": "t", **deadline})
    assert db_state() == before
