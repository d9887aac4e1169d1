"""Timers (issue 29, item 6, in part): a create's `run_at` (not claimable before it) and a
holder's snooze (`release` with `retry_after_seconds`: back to QUEUED, not claimable until then,
attempts unchanged). Time is moved by writing the row or passing the store's clock, never slept."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from board.engine import errors, transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import db_state, end_backoff, sql_stores, sqlite_db_mark
from tests.test_api import API, assert_error, create, http, post, used_key  # noqa: F401

TTL = 60


@pytest.fixture(params=sql_stores())
def alias(request):
    return request.param


def test_a_task_with_run_at_is_not_claimable_before_it(alias):
    later = timezone.now() + timedelta(hours=1)
    transitions.create([TaskSpec(id="later", title="l", run_at=later), TaskSpec(id="now", title="n")], using=alias)
    assert Task.objects.using(alias).get(pk="later").not_before == later
    assert transitions.claim_next("a", TTL, using=alias).task.pk == "now"
    assert transitions.claim_next("a", TTL, using=alias) is None
    with pytest.raises(errors.Blocked) as refused:
        transitions.claim("later", "a", TTL, using=alias)
    assert refused.value.details["waiting"] == f"not before {later.isoformat()}"
    end_backoff("later", alias)  # its time has come
    assert transitions.claim_next("a", TTL, using=alias).task.pk == "later"


def test_a_snoozed_task_goes_back_queued_and_waits_with_its_attempts_unchanged(alias):
    transitions.create(TaskSpec(id="s", title="s"), using=alias)
    held = transitions.claim_next("a", TTL, using=alias)
    released = transitions.release("s", held.lease.token, retry_after_seconds=90, using=alias)
    assert (released.stage, released.attempts) == ("QUEUED", 0)
    assert released.not_before - released.updated_at == timedelta(seconds=90)
    event = TaskEvent.objects.using(alias).filter(task_id="s").order_by("-id").first()
    assert (event.verb, event.detail) == ("release", {"retry_after_seconds": 90})
    assert transitions.claim_next("a", TTL, using=alias) is None
    end_backoff("s", alias)
    assert transitions.claim_next("a", TTL, using=alias).task.attempts == 1


@pytest.mark.parametrize("seconds", [0, -1, 7 * 24 * 3600 + 1, True, "60"])
def test_a_bad_snooze_is_refused_and_changes_nothing(alias, seconds):
    transitions.create(TaskSpec(id="b", title="b"), using=alias)
    held = transitions.claim_next("a", TTL, using=alias)
    before = db_state(alias)
    with pytest.raises(errors.InvalidRequest):
        transitions.release("b", held.lease.token, retry_after_seconds=seconds, using=alias)
    assert db_state(alias) == before


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_run_at_and_snooze_over_the_api(http):
    agent = used_key("timer-agent")
    later = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    task = create(http, agent, id="api-later", run_at="2030-01-02T03:04:05Z")
    assert datetime.fromisoformat(task["not_before"]) == later
    create(http, agent, id="api-now")
    claimed = post(http, "/claim", {"ttl_seconds": 60}, agent).json()
    assert claimed["task"]["id"] == "api-now"
    snoozed = post(http, "/tasks/api-now/release", {"token": claimed["lease"]["token"], "retry_after_seconds": 60},
                   agent).json()
    assert (snoozed["stage"], snoozed["attempts"]) == ("QUEUED", 0)
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 204


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("run_at", ["2030-01-02T03:04:05", "tomorrow", "2030-13-01T00:00:00Z", 5])
def test_a_run_at_without_a_zone_or_not_a_time_is_422_and_creates_nothing(http, run_at):
    agent = used_key("timer-agent-2")
    before = db_state()
    assert_error(post(http, "/tasks", {"title": "t", "run_at": run_at}, agent), 422, "validation_error")
    assert db_state() == before
