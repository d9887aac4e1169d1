"""Schedules over the API (issue 29, item 6): `POST/GET /api/schedules`, `GET/PUT/DELETE
/api/schedules/{name}`. Who may, the answers' shape, the retry of a create, and bad input
(an invalid cron, an unknown time zone...): 422 with the JSON error shape and nothing written."""
from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.forms.models import model_to_dict

from board.engine import schedules
from board.models import Queue, Schedule, Task
from tests.support import db_state, sqlite_db_mark
from tests.test_api import API, assert_error, auth, get, http, operator, post, used_key  # noqa: F401

pytestmark = sqlite_db_mark()

BODY = {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
        "task": {"title": "nightly report", "payload": {"report": "daily"}, "queue": "reports"}}


def put(http, path: str, body, key: str | None = None):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return http.put(API + path, data, content_type="application/json", **auth(key))


def delete(http, path: str, key: str | None = None):
    return http.delete(API + path, **auth(key))


def everything() -> tuple:
    return (db_state(), [model_to_dict(s) for s in Schedule.objects.order_by("name")],
            sorted(Queue.objects.values_list("name", flat=True)))


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_an_operator_creates_a_schedule_and_anyone_who_reads_sees_its_next_ticks(http, operator):
    made = post(http, "/schedules", BODY, operator)
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["name"], body["cron"], body["timezone"], body["paused"], body["created_by"]) == (
        "nightly", "0 2 * * *", "Europe/Berlin", False, "operator-1")
    assert body["task"] == {**schedules.TEMPLATE_DEFAULTS, **BODY["task"]}
    ticks = [at(t) for t in body["next_ticks"]]
    assert len(ticks) == 5 and ticks[0] == at(body["next_tick_at"]) and ticks == sorted(ticks)
    assert all(t.astimezone(schedules.time_zone("Europe/Berlin")).hour == 2 for t in ticks)
    assert (body["last_tick_at"], body["last_task_id"], body["skipped_ticks"]) == (None, None, 0)
    reader = used_key("reader")
    assert get(http, "/schedules/nightly", reader).json() == body
    assert [item["name"] for item in get(http, "/schedules", reader).json()["items"]] == ["nightly"]


def test_the_same_create_again_is_200_and_other_settings_are_409_duplicate_name(http, operator):
    first = post(http, "/schedules", BODY, operator).json()
    again = post(http, "/schedules", BODY, operator)
    assert again.status_code == 200 and again.json() == first
    before = everything()
    refused = assert_error(post(http, "/schedules", {**BODY, "cron": "0 3 * * *"}, operator), 409, "duplicate_name")
    assert "nightly" in refused["message"]
    assert everything() == before


def test_fired_ticks_show_on_the_schedule(http, operator):
    post(http, "/schedules", {**BODY, "cron": "*/5 * * * *", "timezone": "UTC"}, operator)
    tick = Schedule.objects.get(pk="nightly").next_tick_at
    schedules.fire_due(now=tick + timedelta(minutes=10))  # the reaper's pass, after a missed tick
    body = get(http, "/schedules/nightly", operator).json()
    assert (at(body["last_tick_at"]), body["last_task_id"], body["skipped_ticks"]) == (
        tick + timedelta(minutes=10), schedules.tick_task_id("nightly", tick + timedelta(minutes=10)), 2)
    assert get(http, f"/tasks/{body['last_task_id']}", operator).json()["title"] == "nightly report"


def test_put_changes_only_what_is_sent_and_pause_resume_and_delete(http, operator):
    post(http, "/schedules", BODY, operator)
    changed = put(http, "/schedules/nightly", {"cron": "30 6 * * MON"}, operator)
    assert changed.status_code == 200, changed.content
    assert (changed.json()["cron"], changed.json()["timezone"]) == ("30 6 * * MON", "Europe/Berlin")
    paused = put(http, "/schedules/nightly", {"paused": True}, operator).json()
    assert (paused["paused"], paused["next_tick_at"], paused["next_ticks"]) == (True, None, [])
    retitled = put(http, "/schedules/nightly", {"task": {"title": "weekly"}}, operator).json()
    assert retitled["task"] == {**schedules.TEMPLATE_DEFAULTS, "title": "weekly"} and retitled["paused"]
    resumed = put(http, "/schedules/nightly", {"paused": False}, operator).json()
    assert not resumed["paused"] and len(resumed["next_ticks"]) == 5
    gone = delete(http, "/schedules/nightly", operator)
    assert gone.status_code == 204 and not Schedule.objects.exists()
    assert_error(get(http, "/schedules/nightly", operator), 404, "not_found")
    assert_error(delete(http, "/schedules/nightly", operator), 404, "not_found")
    assert_error(put(http, "/schedules/nightly", {"paused": True}, operator), 404, "not_found")


@pytest.mark.parametrize("change", [
    {"cron": "* * * *"}, {"cron": "*/5 * * * * *"}, {"cron": "99 * * * *"}, {"cron": "every day"},
    {"cron": "@hourly"}, {"cron": ""}, {"cron": 5}, {"timezone": "Mars/Olympus"}, {"timezone": "utc "},
    {"timezone": "Europe/../../etc/passwd"}, {"name": "two words"}, {"name": "n" * 86}, {"name": "-x"},
    {"task": {}}, {"task": {"title": ""}}, {"task": {"title": "t", "deps": ["a"]}},
    {"task": {"title": "t", "id": "x"}}, {"task": {"title": "t", "priority": "high"}},
    {"task": {"title": "t", "concurrency_limit": 2}}, {"task": {"title": "t", "queue": "a b"}},
    {"task": "t"}, {"paused": "no"}, {"every": "minute"}, {"cron": None},
])
def test_bad_input_to_create_is_422_and_writes_nothing(http, operator, change):
    post(http, "/schedules", {**BODY, "name": "kept"}, operator)
    before = everything()
    body = {key: value for key, value in {**BODY, **change}.items()}
    assert_error(post(http, "/schedules", body, operator), 422, "validation_error")
    assert everything() == before


@pytest.mark.parametrize("change", [
    {"cron": "* * * *"}, {"cron": "0 0 31 2 *"}, {"timezone": "Nowhere/Special"}, {"timezone": None},
    {"cron": None}, {"task": None}, {"paused": None}, {"task": {"description": "no title"}},
    {"name": "renamed"}, "[", [],
])
def test_bad_input_to_a_change_is_422_and_writes_nothing(http, operator, change):
    post(http, "/schedules", BODY, operator)
    before = everything()
    assert_error(put(http, "/schedules/nightly", change, operator), 422, "validation_error")
    assert everything() == before


def test_changing_schedules_needs_operator_rights_or_the_change_queue_permission(http):
    agent = used_key("plain-agent")
    before = everything()
    assert_error(post(http, "/schedules", BODY, agent), 403, "forbidden")
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    http.force_login(user)
    assert_error(post(http, "/schedules", BODY), 403, "forbidden")
    assert everything() == before
    user.user_permissions.add(Permission.objects.get(codename="change_queue"))
    http.force_login(User.objects.get(pk=user.pk))
    made = post(http, "/schedules", BODY)
    assert made.status_code == 201, made.content
    assert made.json()["created_by"] == "staff"
    before = everything()
    assert_error(put(http, "/schedules/nightly", {"paused": True}, agent), 403, "forbidden")
    assert_error(delete(http, "/schedules/nightly", agent), 403, "forbidden")
    assert everything() == before
    assert get(http, "/schedules/nightly", agent).status_code == 200  # reading is for every key


def test_a_scoped_key_sees_and_changes_only_the_schedules_of_its_queues(http, operator):
    from board import agent_keys

    post(http, "/schedules", {**BODY, "name": "ci", "task": {"title": "t", "queue": "ci-1"}}, operator)
    post(http, "/schedules", {**BODY, "name": "secret", "task": {"title": "t", "queue": "secret"}}, operator)
    _, key = agent_keys.create_key("scoped-op", is_operator=True, queues="ci-*")
    assert [item["name"] for item in get(http, "/schedules", key).json()["items"]] == ["ci"]
    before = everything()
    assert_error(get(http, "/schedules/secret", key), 404, "not_found")
    assert_error(put(http, "/schedules/secret", {"paused": True}, key), 404, "not_found")
    assert_error(delete(http, "/schedules/secret", key), 404, "not_found")
    assert_error(post(http, "/schedules", {**BODY, "name": "new", "task": {"title": "t", "queue": "secret"}}, key),
                 403, "forbidden")
    assert_error(put(http, "/schedules/ci", {"task": {"title": "t", "queue": "secret"}}, key), 403, "forbidden")
    assert everything() == before
    assert put(http, "/schedules/ci", {"paused": True}, key).json()["paused"] is True
    assert Task.objects.count() == 0


def test_a_schedule_no_reaper_fires_is_reported_by_check(http, operator):
    post(http, "/schedules", BODY, operator)
    assert get(http, "/check", operator).json()["problems"] == []
    # As after an hour with no reaper: the row's next tick written an hour back.
    Schedule.objects.filter(pk="nightly").update(next_tick_at=Schedule.objects.get(pk="nightly").created_at
                                                 - timedelta(hours=1))
    (problem,) = get(http, "/check", operator).json()["problems"]
    assert (problem["task"], problem["code"]) == ("schedule:nightly", "schedule_missed")
    assert "is a reaper running?" in problem["text"]
    put(http, "/schedules/nightly", {"paused": True}, operator)  # a paused schedule misses nothing
    assert get(http, "/check", operator).json()["problems"] == []


def test_a_template_names_a_rate_key_and_each_tick_task_carries_it(http, operator):
    from board.models import RateKey

    made = post(http, "/schedules", {**BODY, "cron": "*/5 * * * *", "timezone": "UTC",
                                     "task": {**BODY["task"], "rate_key": "provider:llm"}}, operator)
    assert made.status_code == 201, made.content
    assert made.json()["task"]["rate_key"] == "provider:llm"
    assert RateKey.objects.filter(name="provider:llm").exists()  # made as a create naming it makes it
    tick = Schedule.objects.get(pk="nightly").next_tick_at
    schedules.fire_due(now=tick)
    assert Task.objects.get(pk=schedules.tick_task_id("nightly", tick)).rate_key == "provider:llm"
    before = db_state()
    assert_error(post(http, "/schedules", {**BODY, "name": "bad", "task": {**BODY["task"], "rate_key": ""}}, operator),
                 422, "validation_error")
    assert db_state() == before
