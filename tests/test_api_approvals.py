"""Approval gates (issue 32, item 2) through the whole HTTP stack on SQLite: the holder asks
(`POST /api/tasks/{id}/request-approval`), an allowed approver answers (`POST
/api/tasks/{id}/answer`: staff named by username or group, operators when none is named, an
operator key), the lists (`GET /api/approvals`, `GET /api/tasks/{id}/approvals`), and the answer
in the next claim's lease. Refusals are the API's error shape and change nothing. The engine's
rules on every store, with the 16-answerer race, are in the contract suite (tests/test_contract.py,
"approval gates")."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command

from board import agent_keys
from board.models import Approval, Task
from tests.support import db_state, sqlite_db_mark
from tests.test_api import (  # noqa: F401 (fixtures)
    agent,
    agent_b,
    assert_error,
    create,
    get,
    http,
    operator,
    post,
    used_key,
)

pytestmark = sqlite_db_mark()

FORM = {"type": "object", "properties": {"env": {"type": "string", "enum": ["staging", "prod"], "title": "Where"},
                                         "canary": {"type": "boolean"}}, "required": ["env"]}
APPROVAL_FIELDS = {"id", "task", "question", "form", "approvers", "asked_by", "asked_at", "attempt", "fence", "due_at",
                   "on_timeout", "state", "approved", "values", "comment", "answered_by", "answered_at"}


def staff(username: str, *perms: str, groups: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(username, password="x" * 20, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="board", codename__in=perms))
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


def claim(http, key, task_id: str | None = None) -> dict:  # noqa: F811
    response = post(http, f"/tasks/{task_id}/claim" if task_id else "/claim", {"ttl_seconds": 60}, key)
    assert response.status_code == 200, response.content
    return response.json()


def ask(http, key, task_id: str, token: str, **fields):  # noqa: F811
    return post(http, f"/tasks/{task_id}/request-approval", {"token": token, "question": "deploy?", **fields}, key)


def test_ask_answer_and_the_answer_in_the_next_claim(http, agent, agent_b, operator):  # noqa: F811
    create(http, agent, id="deploy")
    held = claim(http, agent)
    asked = ask(http, agent, "deploy", held["lease"]["token"], question="deploy to which env?", form=FORM,
                approvers=["alice", "release-managers"], timeout_seconds=3600, on_timeout="cancel")
    assert asked.status_code == 200, asked.content
    body = asked.json()
    assert set(body["approval"]) == APPROVAL_FIELDS
    assert (body["task"]["stage"], body["task"]["awaiting_approval"], body["task"]["owner"]) == ("PAUSED", True, "")
    assert (body["approval"]["state"], body["approval"]["asked_by"], body["approval"]["on_timeout"]) == (
        "waiting", "agent-a", "cancel")
    assert "token" not in str(body["approval"])
    # The lease ended with the question: the holder's late complete is refused.
    assert_error(post(http, "/tasks/deploy/complete", {"token": held["lease"]["token"], "result": 1}, agent), 409,
                 "lease_lost")
    waiting = get(http, "/approvals", agent_b).json()
    assert [a["id"] for a in waiting["items"]] == [body["approval"]["id"]] and waiting["next_after"] is None

    # Approvers: a staff user with operator rights who is not named may not answer; nothing changes.
    before = db_state()
    http.force_login(staff("bob", "view_task", "intervene"))
    refused = assert_error(post(http, "/tasks/deploy/answer", {"approve": True, "values": {"env": "prod"}}), 403,
                           "forbidden")
    assert "alice, release-managers" in refused["message"]
    # An agent key without operator rights neither.
    assert_error(post(http, "/tasks/deploy/answer", {"approve": True, "values": {"env": "prod"}}, agent_b), 403,
                 "forbidden")
    assert db_state() == before
    # A member of a named group may; values must fill the form (422, nothing changes).
    http.force_login(staff("carol", "view_task", groups=("release-managers",)))
    assert_error(post(http, "/tasks/deploy/answer", {"approve": True, "values": {"env": "moon"}}), 422,
                 "validation_error")
    assert_error(post(http, "/tasks/deploy/answer", {"approve": True}), 422, "validation_error")
    assert db_state() == before
    answered = post(http, "/tasks/deploy/answer", {"approve": True, "values": {"env": "prod", "canary": True},
                                                   "comment": "go, watch the canary",
                                                   "approval_id": body["approval"]["id"]})
    assert answered.status_code == 200, answered.content
    assert (answered.json()["task"]["stage"], answered.json()["approval"]["answered_by"]) == ("QUEUED", "carol")
    # The second answer is 409 already_answered, with who answered first.
    http.force_login(User.objects.create_superuser("root", password="x" * 20))
    late = assert_error(post(http, "/tasks/deploy/answer", {"approve": False}), 409, "already_answered")
    assert "carol" in late["message"]
    assert get(http, "/approvals", agent).json()["items"] == []
    assert [a["state"] for a in get(http, "/approvals?state=answered", agent).json()["items"]] == ["approved"]

    # Kept for the agent that asked: the other finds no work and may not take it by id.
    http.logout()
    assert post(http, "/claim", {"ttl_seconds": 60}, agent_b).status_code == 204
    assert_error(post(http, "/tasks/deploy/claim", {"ttl_seconds": 60}, agent_b), 409, "blocked")
    again = claim(http, agent, "deploy")
    assert again["lease"]["fence"] == 2
    approval = again["lease"]["approval"]
    assert (approval["approved"], approval["values"], approval["comment"]) == (
        True, {"env": "prod", "canary": True}, "go, watch the canary")
    history = get(http, "/tasks/deploy/approvals", agent).json()["items"]
    assert [(a["state"], a["answered_by"]) for a in history] == [("approved", "carol")]


def test_bad_requests_are_refused_and_change_nothing(http, agent, agent_b):  # noqa: F811
    create(http, agent, id="t")
    token = claim(http, agent)["lease"]["token"]
    before = db_state()
    for fields, status, code in (
            ({"question": ""}, 422, "validation_error"),
            ({"form": {"type": "object", "properties": {"f": {"type": "array"}}}}, 422, "validation_error"),
            ({"form": {"type": "object", "properties": {"f": {"type": "string"}}, "allOf": []}}, 422,
             "validation_error"),
            ({"approvers": [""]}, 422, "validation_error"),
            ({"timeout_seconds": 0}, 422, "validation_error"),
            ({"on_timeout": "later"}, 422, "validation_error"),
            ({"surprise": 1}, 422, "validation_error")):
        assert_error(ask(http, agent, "t", token, **fields), status, code)
    assert_error(ask(http, agent, "t", "not-the-lease"), 409, "lease_lost")
    assert_error(ask(http, agent_b, "t", token), 403, "forbidden")  # another agent's key with this token
    assert_error(ask(http, agent, "nope", token), 404, "not_found")
    assert_error(post(http, "/tasks/t/answer", {"approve": True}, agent), 403, "forbidden")  # not an operator
    assert db_state() == before


def test_operators_answer_when_no_approver_is_named_and_a_scoped_key_sees_its_queues_only(http, agent, operator):  # noqa: F811
    create(http, agent, id="a1", queue="ci")
    create(http, agent, id="b1", queue="docs")
    for task_id in ("a1", "b1"):
        ask(http, agent, task_id, claim(http, agent, task_id)["lease"]["token"])
    _, scoped = agent_keys.create_key("ci-reader", queues="ci")
    assert [a["task"] for a in get(http, "/approvals", scoped).json()["items"]] == ["a1"]
    assert [a["task"] for a in get(http, "/approvals?queue=docs", operator).json()["items"]] == ["b1"]
    assert_error(get(http, "/tasks/b1/approvals", scoped), 404, "not_found")
    page = get(http, "/approvals?limit=1", operator).json()
    assert [a["task"] for a in page["items"]] == ["a1"] and page["next_after"] is not None
    assert [a["task"] for a in get(http, f"/approvals?limit=1&after={page['next_after']}", operator).json()["items"]] == ["b1"]
    answered = post(http, "/tasks/a1/answer", {"approve": False, "comment": "not now"}, operator)
    assert answered.status_code == 200, answered.content
    assert answered.json()["approval"]["state"] == "rejected"


def test_the_reaper_applies_a_timeout(http, agent):  # noqa: F811
    create(http, agent, id="slow")
    ask(http, agent, "slow", claim(http, agent)["lease"]["token"], timeout_seconds=30, on_timeout="fail")
    Approval.objects.filter(task_id="slow").update(due_at=Approval.objects.get(task_id="slow").asked_at
                                                   - timedelta(seconds=1))
    out = StringIO()
    call_command("reap", stdout=out)
    assert "approval timed out: slow -> FAILED" in out.getvalue()
    task = Task.objects.get(pk="slow")
    assert (task.stage, task.awaiting_approval) == ("FAILED", False)
    assert get(http, "/tasks/slow/approvals", agent).json()["items"][0]["state"] == "timed_out"


@pytest.mark.parametrize("on_timeout", ["approve", "cancel"])
def test_the_other_timeouts(http, agent, on_timeout):  # noqa: F811
    create(http, agent, id="slow")
    ask(http, agent, "slow", claim(http, agent)["lease"]["token"], timeout_seconds=30, on_timeout=on_timeout)
    Approval.objects.filter(task_id="slow").update(due_at=Approval.objects.get(task_id="slow").asked_at)
    call_command("reap", stdout=StringIO())
    assert Task.objects.get(pk="slow").stage == {"approve": "QUEUED", "cancel": "CANCELLED"}[on_timeout]
