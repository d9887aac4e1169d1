"""The admin's Approvals (issue 32, item 2, approval gates) through the whole HTTP stack (test
Client -> middleware -> admin -> board.engine.transitions.answer) on the real SQLite test
database: the list shows each question with its task, state, asker and answerer and filters by
state; rows are read-only (nobody adds, changes or deletes one); the answer page draws the form
and answers through the engine with the permission rule built from the user (named approvers by
username or group, operators when none is named); a refusal (not an approver, already answered,
values that do not fit) is a message in the engine's words and changes nothing in the database."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from board.engine import selectors, transitions
from board.engine.transitions import TaskSpec
from board.models import Approval, Task
from tests.support import db_state, sqlite_db_mark
from tests.test_admin import OPERATOR_PERMS, client_for, make_user

pytestmark = sqlite_db_mark()

APPROVALS = reverse("admin:board_approval_changelist")
FORM = {"type": "object",
        "properties": {"target": {"type": "string", "title": "Deploy to", "enum": ["staging", "production"]},
                       "replicas": {"type": "integer", "title": "Replicas", "minimum": 1},
                       "notify": {"type": "boolean", "title": "Tell the on-call"}},
        "required": ["target", "replicas"]}


def answer_page(approval_id: int) -> str:
    return reverse("admin:board_approval_answer", args=[approval_id])


def ask(task_id: str, question: str, **fields) -> Approval:
    transitions.create(TaskSpec(id=task_id, title=f"release {task_id}", queue="deploys"), actor="test")
    held = transitions.claim(task_id, "agent-7", 60)
    return transitions.request_approval(task_id, held.lease.token, question, agent="agent-7",
                                        checkpoint={"step": "asked"}, **fields)[1]


@pytest.fixture(autouse=True)
def _board_stays_consistent():
    yield
    assert selectors.problems() == [], "check() found problems after the test"


@pytest.fixture
def op():
    return client_for(make_user("op", OPERATOR_PERMS))


@pytest.fixture
def watcher():
    return client_for(make_user("watcher", ["board.view_task"]))


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_the_list_shows_each_question_and_filters_by_state(op):
    waiting = ask("rel-1", "Deploy release 1? " + "x" * 200, form=FORM)
    done = ask("rel-2", "Merge the hotfix?")
    transitions.answer("rel-2", False, actor="alice", comment="not today", approval_id=done.id)
    response = op.get(APPROVALS)
    assert response.status_code == 200
    admin_of = response.context["cl"].model_admin
    rows = {a.task_id: a for a in response.context["cl"].result_list}
    assert sorted(rows) == ["rel-1", "rel-2"]
    assert admin_of.short_question(rows["rel-1"]) == ("Deploy release 1? " + "x" * 200)[:79] + "…"
    body = response.content.decode()
    assert f'href="{reverse("admin:board_task_change", args=["rel-1"])}" style="white-space: nowrap">rel-1</a>' in body
    assert f'href="{answer_page(waiting.id)}">Answer</a>' in body
    assert answer_page(done.id) not in body  # answered: no answer link
    assert "alice" in body and "agent-7" in body and "rejected" in body

    waiting_only = op.get(APPROVALS, {"state__exact": "waiting"})
    assert [a.task_id for a in waiting_only.context["cl"].result_list] == ["rel-1"]
    answered = op.get(APPROVALS, {"state__exact": "rejected"})
    assert [a.task_id for a in answered.context["cl"].result_list] == ["rel-2"]


def test_rows_are_read_only(op):
    approval = ask("rel-1", "Ship it?")
    page = op.get(reverse("admin:board_approval_change", args=[approval.id]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "Ship it?" in body and 'name="_save"' not in body
    assert answer_page(approval.id) in body
    assert op.get(reverse("admin:board_approval_add")).status_code == 403
    before = db_state()
    assert op.post(reverse("admin:board_approval_delete", args=[approval.id]), {"post": "yes"}).status_code == 403
    assert op.post(reverse("admin:board_approval_change", args=[approval.id]),
                   {"question": "changed", "state": "approved"}).status_code == 403
    assert db_state() == before


def test_an_operator_answers_through_the_form(op):
    approval = ask("rel-1", "Deploy release 1?", form=FORM)
    page = op.get(answer_page(approval.id))
    assert page.status_code == 200
    body = page.content.decode()
    assert "Deploy release 1?" in body and "agent-7" in body
    assert 'name="field_target"' in body and '<option value="&quot;production&quot;">production</option>' in body
    assert 'name="field_replicas"' in body and 'type="number"' in body
    assert 'name="field_notify"' in body and 'type="checkbox"' in body
    assert "Deploy to (required to approve)" in body
    assert 'id="not-an-approver"' not in body

    response = op.post(answer_page(approval.id), {"field_target": '"production"', "field_replicas": "3",
                                                  "field_notify": "on", "comment": "go", "approve": "Approve"},
                       follow=True)
    done = f"Approval {approval.id} approved: task rel-1 is QUEUED again"
    assert any(m.startswith(done) for m in messages_of(response))
    approval.refresh_from_db()
    assert (approval.state, approval.approved, approval.answered_by, approval.comment) == ("approved", True, "op", "go")
    assert approval.values == {"target": "production", "replicas": 3, "notify": True}
    task = Task.objects.get(pk="rel-1")
    assert (task.stage, task.awaiting_approval) == ("QUEUED", False)
    # Answered: its page says so, and sends back to the approval's page.
    again = op.get(answer_page(approval.id), follow=True)
    assert any("is not waiting: approved by op" in m for m in messages_of(again))


def test_reject_needs_no_values(op):
    approval = ask("rel-1", "Deploy release 1?", form=FORM)
    op.post(answer_page(approval.id), {"comment": "not this week", "reject": "Reject"})
    approval.refresh_from_db()
    assert (approval.state, approval.approved, approval.comment) == ("rejected", False, "not this week")


def test_values_that_do_not_fit_the_form_are_refused_in_words_and_change_nothing(op):
    approval = ask("rel-1", "Deploy release 1?", form=FORM)
    before = db_state()
    response = op.post(answer_page(approval.id), {"field_target": '"staging"', "approve": "Approve"})
    assert response.status_code == 200  # the page stays, with what was filled in
    [message] = messages_of(response)
    assert message.startswith("Not answered: values: '") and message.endswith("'replicas' is a required property")
    assert db_state() == before


def test_a_user_who_is_not_an_approver_is_refused_and_nothing_changes():
    approval = ask("gate-1", "Ship it?", approvers=["release-managers"])
    outsider = make_user("outsider", ["board.view_task"])
    client = client_for(outsider)
    page = client.get(answer_page(approval.id))
    assert 'id="not-an-approver"' in page.content.decode()
    before = db_state()
    response = client.post(answer_page(approval.id), {"comment": "yes", "approve": "Approve"})
    assert messages_of(response) == [
        "Not answered: outsider may not answer this approval: its approvers are release-managers"]
    assert db_state() == before
    # An operator is no approver of a question that names its approvers either.
    operator = client_for(make_user("op", OPERATOR_PERMS))
    assert operator.post(answer_page(approval.id), {"approve": "Approve"}).status_code == 200
    assert db_state() == before

    # In the group, the same user may.
    outsider.groups.add(Group.objects.create(name="release-managers"))
    client.post(answer_page(approval.id), {"comment": "yes", "approve": "Approve"})
    approval.refresh_from_db()
    assert (approval.state, approval.answered_by) == ("approved", "outsider")


def test_without_operator_rights_an_approval_naming_no_approvers_is_refused(watcher):
    approval = ask("rel-1", "Ship it?")
    assert watcher.get(APPROVALS).status_code == 200  # reading is for every reader
    before = db_state()
    response = watcher.post(answer_page(approval.id), {"approve": "Approve"})
    assert messages_of(response) == ["Not answered: watcher may not answer this approval: its approvers are operators"]
    assert db_state() == before


def test_a_second_answer_is_told_who_answered_first(op):
    approval = ask("rel-1", "Ship it?")
    transitions.answer("rel-1", True, actor="alice", approval_id=approval.id)
    before = db_state()
    # The page was opened before alice answered: its POST comes after.
    response = op.post(answer_page(approval.id), {"reject": "Reject"}, follow=True)
    assert any("is not waiting: approved by alice" in m for m in messages_of(response))
    assert db_state() == before


def test_a_user_who_may_not_read_tasks_sees_no_approvals():
    nobody = client_for(make_user("nobody", []))
    approval = ask("rel-1", "Ship it?")
    assert nobody.get(APPROVALS).status_code == 403
    assert nobody.get(answer_page(approval.id)).status_code == 403
