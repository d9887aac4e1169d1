"""The Python client's `create(..., dedup_key=, run_at=, fairness_key=, fairness_weight=)` (issue 29) against the REAL server
(manage.py serve) on the test database: a second create with a live key returns the same task
marked `deduplicated`, `run_at` is sent as ISO 8601 with its zone, and the call's own refusals
(a batch given one dedup_key, a naive run_at) send nothing."""
from datetime import UTC, datetime, timedelta

import pytest

from board.models import Task
from taskflow_client import ValidationFailed
from tests.live_server import board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark
from tests.test_client import alice, bob, keys, op  # noqa: F401  (fixtures)

pytestmark = sqlite_db_mark()


def test_a_second_create_with_a_live_dedup_key_returns_the_same_task(alice):
    first = alice.create({"title": "nightly report"}, dedup_key="nightly:2026-12-04")
    again = alice.create({"title": "nightly report (retry of the cron)"}, dedup_key="nightly:2026-12-04")
    assert (first["deduplicated"], again["deduplicated"]) == (False, True)
    assert again["id"] == first["id"] and again["title"] == "nightly report"
    assert Task.objects.filter(dedup_key="nightly:2026-12-04").count() == 1
    lease = alice.claim(first["id"], 30)
    lease.complete({"ok": True})
    fresh = alice.create({"title": "next night"}, dedup_key="nightly:2026-12-04")
    assert fresh["deduplicated"] is False and fresh["id"] != first["id"]


def test_run_at_is_sent_with_its_zone_and_holds_the_task_back(alice):
    later = datetime.now(UTC) + timedelta(hours=2)
    made = alice.create([{"id": "r1", "title": "later"}, {"id": "r2", "title": "later too"}], run_at=later)
    # The server answers times to the millisecond.
    assert all(abs(datetime.fromisoformat(t["not_before"]) - later) < timedelta(milliseconds=1) for t in made)
    assert alice.claim_next(30) is None


def test_the_calls_own_refusals_send_nothing(alice):
    before = db_state()
    with pytest.raises(ValueError, match="dedup_key"):
        alice.create([{"title": "a"}, {"title": "b"}], dedup_key="one-for-two")
    with pytest.raises(ValueError, match="aware"):
        alice.create({"title": "naive"}, run_at=datetime(2026, 12, 4, 14, 5))
    with pytest.raises(ValidationFailed):
        alice.create({"title": "bad key"}, dedup_key="x" * 201)
    assert db_state() == before


def test_fairness_key_and_weight_are_set_on_every_task_of_the_call(alice):
    from board.models import FairnessKey

    made = alice.create([{"id": "p1", "title": "plan step 1"}, {"id": "p2", "title": "plan step 2"}],
                        fairness_key="plan:a", fairness_weight=3)
    assert [(t["id"], t["fairness_key"]) for t in made] == [("p1", "plan:a"), ("p2", "plan:a")]
    assert made[0]["claim_rank"] < made[1]["claim_rank"]  # the key's consecutive turns
    assert FairnessKey.objects.get(name="plan:a").weight == 3
