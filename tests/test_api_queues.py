"""Queues over the API (issue 29): `GET /api/queues`, `GET/PUT /api/queues/{name}`, its history,
the create fields `concurrency_key`/`concurrency_limit`, and what a claim gets from a paused or
full queue. Refusals answer the JSON error shape and write nothing."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User

from board.engine import flow, transitions
from board.engine.transitions import TaskSpec
from board.models import ConcurrencyKey, Queue, QueueChange, Task
from tests.support import db_state, sqlite_db_mark
from tests.test_api import API, assert_error, auth, create, get, http, operator, post, used_key  # noqa: F401

pytestmark = sqlite_db_mark()


def put(http, path: str, body, key: str | None = None):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return http.put(API + path, data, content_type="application/json", **auth(key))


def everything() -> tuple:
    return (db_state(), list(Queue.objects.order_by("name").values()), list(QueueChange.objects.values()),
            list(ConcurrencyKey.objects.values()))


def test_queues_list_their_limits_running_counts_and_depth(http, operator):
    agent = used_key("agent-q")
    transitions.create([TaskSpec(id=f"t{n}", title="t", queue="ci") for n in range(3)]
                       + [TaskSpec(id="d0", title="d", queue="docs")])
    assert put(http, "/queues/ci", {"concurrency": 2, "reason": "two runners"}, operator).status_code == 200
    claimed = post(http, "/claim", {"ttl_seconds": 60, "queue": "ci"}, agent)
    assert claimed.status_code == 200
    body = get(http, "/queues", agent).json()
    by_name = {item["name"]: item for item in body["items"]}
    assert sorted(by_name) == ["ci", "docs"]
    ci = by_name["ci"]
    assert (ci["concurrency"], ci["running"], ci["paused"]) == (2, 1, False)
    assert (ci["depth"]["QUEUED"], ci["depth"]["RUNNING"], ci["depth"]["COMPLETED"]) == (2, 1, 0)
    assert ci["oldest_queued_seconds"] >= 0
    assert by_name["docs"]["concurrency"] is None and by_name["docs"]["oldest_queued_seconds"] >= 0
    one = get(http, "/queues/nobody-uses-it", agent).json()
    assert (one["name"], one["concurrency"], one["paused"], one["running"]) == ("nobody-uses-it", None, False, 0)


def test_pausing_a_queue_makes_claims_answer_204_and_resuming_lets_them_in(http, operator):
    agent = used_key("agent-p")
    create(http, agent, id="p1", queue="brake")
    changed = put(http, "/queues/brake", {"paused": True, "reason": "provider outage"}, operator)
    assert changed.status_code == 200, changed.content
    assert (changed.json()["paused"], changed.json()["paused_by"], changed.json()["paused_reason"]) == (
        True, "operator-1", "provider outage")
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 204
    refused = assert_error(post(http, "/tasks/p1/claim", {"ttl_seconds": 60}, agent), 409, "blocked")
    assert refused["details"]["waiting"] == "queue brake is paused"
    assert put(http, "/queues/brake", {"paused": False}, operator).json()["paused_by"] is None
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).json()["task"]["id"] == "p1"
    history = get(http, "/queues/brake/history", agent).json()["items"]
    assert [(h["actor"], h["reason"], h["changes"]) for h in history] == [
        ("operator-1", "", {"paused": [True, False]}), ("operator-1", "provider outage", {"paused": [False, True]})]


def test_only_the_fields_sent_change_and_null_removes_the_limit(http, operator):
    put(http, "/queues/q", {"concurrency": 3, "paused": True}, operator)
    assert put(http, "/queues/q", {"concurrency": None}, operator).json()["concurrency"] is None
    assert Queue.objects.get(name="q").paused is True
    assert put(http, "/queues/q", {"reason": "nothing"}, operator).status_code == 200
    assert QueueChange.objects.filter(queue="q").count() == 2  # a change that changes nothing is not recorded


def test_a_task_names_its_concurrency_key_and_the_key_limits_its_claims(http):
    agent = used_key("agent-k")
    task = create(http, agent, id="k1", concurrency_key="repo:acme/web", concurrency_limit=1)
    create(http, agent, id="k2", concurrency_key="repo:acme/web")
    assert task["concurrency_key"] == "repo:acme/web"
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).json()["task"]["id"] == "k1"
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 204
    assert ConcurrencyKey.objects.get(name="repo:acme/web").running == 1


@pytest.mark.parametrize("body", [
    {"concurrency": 0}, {"concurrency": -1}, {"concurrency": "2"}, {"concurrency": 1.5}, {"concurrency": 10_001},
    {"paused": "yes"}, {"paused": None}, {"reason": "x" * 501}, {"reason": 5}, {"limit": 2}, "[", [],
])
def test_bad_queue_settings_are_422_and_change_nothing(http, operator, body):
    put(http, "/queues/kept", {"concurrency": 4}, operator)
    before = everything()
    assert_error(put(http, "/queues/kept", body, operator), 422, "validation_error")
    assert everything() == before


@pytest.mark.parametrize("fields", [
    {"concurrency_key": ""}, {"concurrency_key": "k" * 201}, {"concurrency_key": "a\nb"},
    {"concurrency_key": "k", "concurrency_limit": 0}, {"concurrency_limit": 2}, {"concurrency_key": 7},
])
def test_bad_concurrency_fields_at_create_are_422_and_change_nothing(http, fields):
    agent = used_key("agent-bad")
    before = everything()
    assert_error(post(http, "/tasks", {"title": "t", **fields}, agent), 422, "validation_error")
    assert everything() == before


def test_changing_a_queue_needs_operator_rights_or_the_change_queue_permission(http, client):
    agent = used_key("plain-agent")
    before = everything()
    assert_error(put(http, "/queues/x", {"paused": True}, agent), 403, "forbidden")
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    http.force_login(user)
    assert_error(put(http, "/queues/x", {"paused": True}), 403, "forbidden")
    assert everything() == before
    user.user_permissions.add(Permission.objects.get(codename="change_queue"))
    http.force_login(User.objects.get(pk=user.pk))
    answer = put(http, "/queues/x", {"paused": True, "reason": "from the board"})
    assert answer.status_code == 200, answer.content
    assert (answer.json()["paused_by"], Queue.objects.get(name="x").paused) == ("staff", True)


def test_a_scoped_key_sees_and_changes_only_its_queues(http):
    from board import agent_keys

    transitions.create([TaskSpec(id="c", title="c", queue="ci-1"), TaskSpec(id="s", title="s", queue="secret")])
    _, key = agent_keys.create_key("scoped-op", is_operator=True, queues="ci-*")
    assert [item["name"] for item in get(http, "/queues", key).json()["items"]] == ["ci-1"]
    before = everything()
    assert_error(get(http, "/queues/secret", key), 404, "not_found")
    assert_error(put(http, "/queues/secret", {"paused": True}, key), 404, "not_found")
    assert everything() == before
    assert put(http, "/queues/ci-1", {"concurrency": 1}, key).status_code == 200
    assert Task.objects.count() == 2
