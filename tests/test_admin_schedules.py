"""The admin's Schedules page (issue 29, periodic tasks) through the whole HTTP stack (test Client
-> middleware -> admin -> board.engine.schedules) on the real SQLite test database: the list, the
add and change forms (written by the engine), the engine's fields read-only, the pause / resume
actions, deleting, and refusals — an invalid cron, an unknown time zone, a bad template, missing
permissions — which change nothing."""
from __future__ import annotations

import json

import pytest
from django.forms.models import model_to_dict
from django.urls import reverse

from board.engine import schedules, selectors
from board.models import Schedule
from tests.support import db_state, sqlite_db_mark
from tests.test_admin import client_for, make_user, messages_of

pytestmark = sqlite_db_mark()

LIST = reverse("admin:board_schedule_changelist")
ADD = reverse("admin:board_schedule_add")
TEMPLATE = {"title": "nightly report", "queue": "reports", "payload": {"report": "daily"}}


def page_of(name: str) -> str:
    return reverse("admin:board_schedule_change", args=[name])


@pytest.fixture(autouse=True)
def _board_stays_consistent():
    yield
    assert selectors.problems() == [], "check() found problems after the test"


@pytest.fixture
def changer():
    return client_for(make_user("op", ["board.change_queue"]))


@pytest.fixture
def watcher():
    return client_for(make_user("watcher", ["board.view_schedule"]))


def everything() -> tuple:
    return db_state(), [model_to_dict(s) for s in Schedule.objects.order_by("name")]


def make(name: str = "nightly", cron: str = "0 2 * * *", **settings) -> Schedule:
    return schedules.create_schedule(name, cron=cron, task=settings.pop("task", TEMPLATE), actor="api", **settings)[0]


def add_data(**values) -> dict:
    data = {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "task": json.dumps(TEMPLATE)}
    data.update(values)
    return {key: value for key, value in data.items() if value is not None}


def errors_of(response) -> dict:
    form = response.context["adminform"].form
    return {field: list(errs) for field, errs in form.errors.items()}


def test_the_list_and_the_page_show_the_schedule_and_its_next_ticks_read_only(changer, watcher):
    made = make(timezone="Europe/Berlin")
    make("paused-one", paused=True)
    response = watcher.get(LIST)
    assert response.status_code == 200
    assert [s.name for s in response.context["cl"].result_list] == ["nightly", "paused-one"]
    assert "reports" in response.content.decode()
    page = watcher.get(page_of("nightly"))
    assert page.status_code == 200
    body = page.content.decode()
    for tick in schedules.next_ticks(made):
        assert tick.astimezone(schedules.time_zone("Europe/Berlin")).strftime("%a %Y-%m-%d %H:%M %Z") in body
    assert 'name="cron"' not in body  # a watcher's page is read-only
    form = changer.get(page_of("nightly")).context["adminform"].form
    assert set(form.fields) == {"cron", "timezone", "task", "paused"}  # the engine's fields are not in the form
    assert "None: paused." in changer.get(page_of("paused-one")).content.decode()


def test_adding_goes_through_the_engine(changer):
    response = changer.post(ADD, add_data())
    assert response.status_code == 302, errors_of(response)
    schedule = Schedule.objects.get(pk="nightly")
    assert (schedule.cron, schedule.timezone, schedule.created_by) == ("0 2 * * *", "Europe/Berlin", "op")
    assert schedule.task == {**schedules.TEMPLATE_DEFAULTS, **TEMPLATE}
    assert schedule.next_tick_at == schedules.first_tick_after("0 2 * * *", "Europe/Berlin", schedule.created_at)


@pytest.mark.parametrize("values, field", [
    ({"cron": "0 2 * *"}, "cron"), ({"cron": "0 25 * * *"}, "cron"), ({"timezone": "Mars/Olympus"}, "timezone"),
    ({"task": json.dumps({"title": ""})}, "task"), ({"task": json.dumps({"title": "t", "deps": ["x"]})}, "task"),
    ({"task": json.dumps(["t"])}, "task"), ({"task": "{not json"}, "task"), ({"name": "two words"}, "name"),
    ({"name": "nightly-existing"}, "name"),
])
def test_bad_input_to_the_add_form_shows_on_its_field_and_writes_nothing(changer, values, field):
    make("nightly-existing", cron="0 3 * * *")
    before = everything()
    response = changer.post(ADD, add_data(**values))
    assert response.status_code == 200
    assert field in errors_of(response), errors_of(response)
    assert everything() == before


def test_changing_sends_only_what_changed_and_a_bad_cron_writes_nothing(changer):
    made = make(timezone="Europe/Berlin")
    data = {"cron": "30 6 * * MON", "timezone": "Europe/Berlin", "task": json.dumps(made.task)}
    response = changer.post(page_of("nightly"), data)
    assert response.status_code == 302, errors_of(response)
    changed = Schedule.objects.get(pk="nightly")
    assert (changed.cron, changed.version, changed.task) == ("30 6 * * MON", made.version + 1, made.task)
    before = everything()
    response = changer.post(page_of("nightly"), {**data, "cron": "30 6 * * XYZ"})
    assert response.status_code == 200 and "cron" in errors_of(response)
    response = changer.post(page_of("nightly"), {**data, "timezone": "Europe/Atlantis"})
    assert response.status_code == 200 and "timezone" in errors_of(response)
    assert everything() == before


def test_pause_and_resume_actions_report_each_schedule(changer):
    make("a")
    make("b", paused=True)
    response = changer.post(LIST, {"action": "pause_schedules", "_selected_action": ["a", "b"], "index": "0"},
                            follow=True)
    assert messages_of(response) == ["a: paused", "b: skipped: already paused"]
    assert set(Schedule.objects.values_list("name", "paused")) == {("a", True), ("b", True)}
    response = changer.post(LIST, {"action": "resume_schedules", "_selected_action": ["b"], "index": "0"},
                            follow=True)
    (line,) = messages_of(response)
    assert line.startswith("b: resumed; next tick") and not Schedule.objects.get(pk="b").paused


def test_deleting_goes_through_the_engine(changer):
    make("a")
    make("b")
    response = changer.post(reverse("admin:board_schedule_delete", args=["a"]), {"post": "yes"})
    assert response.status_code == 302
    response = changer.post(LIST, {"action": "delete_selected", "_selected_action": ["b"], "index": "0",
                                   "post": "yes"})
    assert response.status_code == 302
    assert not Schedule.objects.exists()


def test_without_the_change_queue_permission_nothing_changes(watcher):
    make()
    before = everything()
    assert watcher.post(ADD, add_data(name="other")).status_code == 403
    assert watcher.post(page_of("nightly"), {"cron": "* * * * *", "timezone": "UTC",
                                             "task": json.dumps(TEMPLATE)}).status_code == 403
    watcher.post(LIST, {"action": "pause_schedules", "_selected_action": ["nightly"], "index": "0"})
    assert watcher.post(reverse("admin:board_schedule_delete", args=["nightly"]), {"post": "yes"}).status_code == 403
    assert everything() == before
    nobody = client_for(make_user("nobody", []))
    assert nobody.get(LIST).status_code == 403
