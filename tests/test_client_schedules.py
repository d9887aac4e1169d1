"""The Python client's schedules (issue 29, periodic tasks) against the REAL server (manage.py
serve) on the test database: `client.schedules()`, `client.schedule(name)` and its `create`/
`get`/`update`/`pause`/`resume`/`delete`. Refusals raise their error class and leave the database
as it was. Ticks are fired here with a given `now` (a yearly cron: the server's own reaper, which
runs every second, has nothing due meanwhile)."""
from datetime import datetime

import pytest
from django.forms.models import model_to_dict

from board.engine import schedules
from board.models import Schedule
from taskflow_client import DuplicateName, Forbidden, NotFound, ValidationFailed
from taskflow_client import Schedule as ScheduleHandle
from tests.live_server import board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark
from tests.test_client import alice, bob, keys, op  # noqa: F401  (fixtures)

pytestmark = sqlite_db_mark()

YEARLY = "0 0 1 1 *"
TEMPLATE = {"title": "new year", "queue": "rituals", "payload": {"say": "happy new year"}}


def everything() -> tuple:
    return db_state(), [model_to_dict(s) for s in Schedule.objects.order_by("name")]


def test_an_operator_creates_pauses_resumes_changes_and_deletes_a_schedule(alice, op):
    yearly = op.schedule("new-year")
    assert isinstance(yearly, ScheduleHandle) and repr(yearly) == "<Schedule 'new-year'>"
    made = yearly.create(YEARLY, TEMPLATE, timezone="Pacific/Auckland")
    assert (made["cron"], made["timezone"], made["paused"], made["created_by"]) == (
        YEARLY, "Pacific/Auckland", False, "op")
    assert made["task"] == {**schedules.TEMPLATE_DEFAULTS, **TEMPLATE}
    assert yearly.create(YEARLY, TEMPLATE, timezone="Pacific/Auckland") == made  # a retried create
    first = datetime.fromisoformat(made["next_tick_at"].replace("Z", "+00:00"))
    assert first.astimezone(schedules.time_zone("Pacific/Auckland")).strftime("%m-%d %H:%M") == "01-01 00:00"
    assert [s["name"] for s in alice.schedules()] == ["new-year"] and alice.schedule("new-year").get() == made

    (fired,) = schedules.fire_due(now=first)  # the reaper's pass at the tick
    got = yearly.get()
    assert (got["last_task_id"], got["skipped_ticks"]) == (fired.task_id, 0)
    assert alice.get(fired.task_id)["payload"] == {"say": "happy new year"}

    assert yearly.pause()["next_ticks"] == []
    assert len(yearly.resume()["next_ticks"]) == 5
    changed = yearly.update(cron="0 12 31 12 *", task={"title": "new year's eve"})
    assert (changed["cron"], changed["task"]["title"], changed["timezone"]) == (
        "0 12 31 12 *", "new year's eve", "Pacific/Auckland")
    assert yearly.delete() is None
    assert op.schedules() == []
    with pytest.raises(NotFound):
        yearly.get()
    assert alice.get(fired.task_id)["stage"] == "QUEUED"  # its tasks stay


def test_refusals_raise_their_error_and_change_nothing(alice, op):
    op.schedule("kept").create(YEARLY, TEMPLATE)
    before = everything()
    with pytest.raises(ValidationFailed):
        op.schedule("bad").create("0 0 1 1", TEMPLATE)  # four fields
    with pytest.raises(ValidationFailed):
        op.schedule("bad").create(YEARLY, TEMPLATE, timezone="Atlantis/Capital")
    with pytest.raises(ValidationFailed):
        op.schedule("kept").update(cron="every year")
    with pytest.raises(DuplicateName):
        op.schedule("kept").create("0 0 2 1 *", TEMPLATE)
    with pytest.raises(Forbidden):
        alice.schedule("kept").pause()
    with pytest.raises(Forbidden):
        alice.schedule("mine").create(YEARLY, TEMPLATE)
    with pytest.raises(NotFound):
        op.schedule("nobody").delete()
    assert everything() == before
