"""Approval gates on the live board (issue 32, item 2) in a real browser (Debian's Chromium,
Playwright) against a real board server on the test database: an agent's question (asked through
the engine, as POST /api/tasks/{id}/request-approval asks) shows live in the "Needs you" lane with
a form drawn from its JSON Schema and a browser notification; a person fills it and approves; the
lane empties and the card goes back to QUEUED; a second answer from another page is refused in
words ("Already answered by ..."); a user who is not an approver gets disabled buttons, and the
server's 403 in words; a task's own page lists its approvals and answers the waiting one.

The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` with a bound, never a sleep. Screenshots go to /tmp (never the repo)."""
# The fixtures imported from tests/test_browser.py are test parameters by the same names.
# ruff: noqa: F811
from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import Approval, Task
from tests.support import sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures, found by pytest by name)
    SLOW,
    browser,
    card,
    open_board,
    open_page,
    orm,
    server,
)
from tests.test_browser_cards import CONTRAST_JS

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

LIVE = 5000  # ms: a committed change, then the lane's read of the approvals

FORM = {
    "type": "object",
    "properties": {
        "target": {"type": "string", "title": "Deploy to", "enum": ["staging", "production"],
                   "description": "where the release goes"},
        "replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 20},
        "ratio": {"type": "number", "title": "Canary ratio", "default": 0.1},
        "ticket": {"type": "string", "title": "Change ticket"},
        "notify": {"type": "boolean", "title": "Tell the on-call", "default": False},
    },
    "required": ["target", "replicas"],
}

# Records each `new Notification(...)` the page makes (the browser's own would show nothing in
# a headless run); the permission stays the browser's (the context's grant).
RECORD_NOTIFICATIONS = """(() => {
  const Real = window.Notification;
  const shown = [];
  function Recorded(title, options) {
    shown.push({ title, body: options && options.body });
  }
  Object.defineProperty(Recorded, "permission", { get: () => (Real ? Real.permission : "default") });
  Recorded.requestPermission = (...args) => (Real ? Real.requestPermission(...args) : Promise.resolve("denied"));
  window.Notification = Recorded;
  window.__shownNotifications = shown;
})();"""


def ask(task_id: str, question: str, *, agent: str = "agent-7", **fields) -> int:
    """Create task `task_id`, claim it as `agent` and ask `question`: the task waits PAUSED."""
    transitions.create(TaskSpec(id=task_id, title=f"release {task_id}", queue="deploys"), actor="test")
    held = transitions.claim(task_id, agent, 60)
    # With a checkpoint, as an agent saves its state before it waits (without one, check() reports
    # the waiting task as paused_without_checkpoint: a question for the engine, not the board).
    fields.setdefault("checkpoint", {"step": "asked"})
    return transitions.request_approval(task_id, held.lease.token, question, agent=agent, **fields)[1].id


def lane_item(page, task_id: str):
    return page.locator(f'#needs-you li.approval[data-task="{task_id}"]')


def with_notifications(page):
    page.context.grant_permissions(["notifications"])
    page.add_init_script(RECORD_NOTIFICATIONS)


def test_a_question_shows_live_with_its_form_and_a_notification_and_the_answer_requeues_the_task(open_board, orm):
    page = open_board(before_load=with_notifications)
    lane = page.locator("#needs-you")
    expect(lane).to_be_hidden()
    notify = page.locator("#notify-me")
    expect(notify).to_have_attribute("data-permission", "granted")
    expect(notify).to_have_text("Notifications on")

    question = "Deploy release 4.2? The migration locks the orders table for ~30 s."
    orm(ask, "rel-42", question, form=FORM, timeout_seconds=3600, on_timeout="cancel")
    item = lane_item(page, "rel-42")
    expect(item).to_be_visible(timeout=LIVE)
    expect(lane.locator("h2 .count")).to_have_text("1")
    expect(item.locator(".approval-question")).to_have_text(question)
    expect(item.locator(".approval-meta")).to_contain_text("asked by agent-7 at")
    expect(item.locator(".approval-due")).to_contain_text("the task is cancelled")
    expect(item.locator("a.approval-task")).to_have_attribute("href", "/board/task/rel-42")
    # The form, drawn from the schema: a select for the enum, number boxes, a text box, a checkbox.
    form = item.locator("form.approval-form")
    expect(form.locator('[data-field="target"] select')).to_be_visible()
    expect(form.locator('[data-field="target"] select option')).to_have_text(["choose…", "staging", "production"])
    expect(form.locator('[data-field="replicas"] input')).to_have_attribute("type", "number")
    expect(form.locator('[data-field="replicas"] input')).to_have_attribute("step", "1")
    expect(form.locator('[data-field="ratio"] input')).to_have_value("0.1")
    expect(form.locator('[data-field="ticket"] input')).to_have_attribute("type", "text")
    expect(form.locator('[data-field="notify"] input')).to_have_attribute("type", "checkbox")
    expect(form.locator(".approval-field.required")).to_have_count(2)
    expect(form.locator('[data-field="target"] .field-hint')).to_have_text("where the release goes")
    # The card says it waits for this user (a superuser may answer anything).
    badge = card(page, "rel-42", "PAUSED").locator(".badge.awaiting-approval")
    expect(badge).to_have_text("needs you")
    # The notification: once, with the question.
    page.wait_for_function("window.__shownNotifications.length === 1", timeout=LIVE)
    assert page.evaluate("window.__shownNotifications") == [{"title": "TaskFlow: approval needed", "body": question}]

    # The answer moves it: its details offer no requeue (the engine refuses one), only Cancel.
    card(page, "rel-42", "PAUSED").click()
    expect(page.locator("#details button.action")).to_have_count(1)
    expect(page.locator("#details button.action")).to_have_attribute("data-verb", "cancel")

    # Approve without the required fields: the browser asks for them, nothing is sent.
    form.locator('[data-field="ticket"] input').fill("CHG-1234")
    page.screenshot(path="/tmp/approvals-lane.png")
    form.locator("button.approve").click()
    expect(item).to_be_visible()
    assert orm(lambda: Approval.objects.get(task_id="rel-42").state) == "waiting"

    form.locator('[data-field="target"] select').select_option("production")
    form.locator('[data-field="replicas"] input').fill("3")
    form.locator('[data-field="notify"] input').check()
    form.locator('textarea[name="comment"]').fill("go ahead, watch the locks")
    form.locator("button.approve").click()
    expect(page.locator("#message")).to_contain_text("Approved: task rel-42 is QUEUED again")
    expect(lane).to_be_hidden(timeout=LIVE)
    expect(card(page, "rel-42", "QUEUED")).to_be_visible(timeout=LIVE)
    expect(card(page, "rel-42").locator(".badge.awaiting-approval")).to_have_count(0)
    approval = orm(lambda: Approval.objects.get(task_id="rel-42"))
    assert approval.state == "approved" and approval.approved is True
    assert approval.values == {"target": "production", "replicas": 3, "ratio": 0.1, "ticket": "CHG-1234",
                               "notify": True}
    assert approval.comment == "go ahead, watch the locks"
    assert approval.answered_by.startswith("user-")
    assert orm(lambda: Task.objects.get(pk="rel-42").awaiting_approval) is False
    # Still one notification: an answered approval is no news.
    assert page.evaluate("window.__shownNotifications.length") == 1


@pytest.mark.parametrize("view", ["light", "dark", "phone"])
def test_the_approvals_already_waiting_are_listed_but_not_notified(open_board, orm, view):
    orm(ask, "old-1", "Merge the hotfix?")
    size = {"width": 390, "height": 844} if view == "phone" else {}
    page = open_board(before_load=with_notifications, color_scheme="dark" if view == "dark" else "light", **size)
    expect(lane_item(page, "old-1")).to_be_visible(timeout=LIVE)
    orm(ask, "new-2", "Drop the stale branch?")
    expect(lane_item(page, "new-2")).to_be_visible(timeout=LIVE)
    # Oldest first; a form with no fields is a comment and the two buttons.
    expect(page.locator("#needs-you li.approval")).to_have_count(2)
    assert page.locator("#needs-you li.approval").evaluate_all("els => els.map(e => e.dataset.task)") == \
        ["old-1", "new-2"]
    expect(lane_item(page, "new-2").locator(".approval-field")).to_have_count(0)
    page.wait_for_function("window.__shownNotifications.length === 1", timeout=LIVE)
    assert page.evaluate("window.__shownNotifications")[0]["body"] == "Drop the stale branch?"
    # Readable in both schemes (WCAG AA), as every chip of the board.
    expect(card(page, "new-2", "PAUSED").locator(".badge.needs-you")).to_be_visible()
    measured = page.evaluate(CONTRAST_JS, [".card .badge.needs-you", "#needs-you h2 .count", "#needs-you h2",
                                           ".approval-buttons button.approve", ".approval-buttons button.reject",
                                           ".approval-meta", ".approval-head .approval-task", "#notify-me"])
    low = {sel: m for sel, m in measured.items() if m is None or m["ratio"] < 4.5}
    assert low == {}, json.dumps(low, indent=1)
    page.screenshot(path=f"/tmp/approvals-lane-{view}.png")


# A browser that asks the person: the permission is "default" until they say yes (here: at once).
ASKING_BROWSER = """(() => {
  let permission = "default";
  const asked = [];
  function Asked(title, options) { asked.push({ title, body: options && options.body }); }
  Object.defineProperty(Asked, "permission", { get: () => permission });
  Asked.requestPermission = () => { asked.push("asked"); permission = "granted"; return Promise.resolve(permission); };
  window.Notification = Asked;
  window.__shownNotifications = asked;
})();"""


def test_notify_me_asks_for_the_permission_then_notifies(open_board, orm):
    page = open_board(before_load=lambda p: p.add_init_script(ASKING_BROWSER))
    notify = page.locator("#notify-me")
    expect(notify).to_have_text("Notify me")
    expect(notify).to_have_attribute("data-permission", "default")
    page.locator("#topbar").screenshot(path="/tmp/approvals-notify-me.png")
    orm(ask, "before-1", "Asked before the permission?")
    expect(lane_item(page, "before-1")).to_be_visible(timeout=LIVE)
    notify.click()
    expect(notify).to_have_attribute("data-permission", "granted")
    expect(notify).to_have_text("Notifications on")
    expect(notify).to_be_disabled()
    orm(ask, "after-1", "Asked after it?")
    expect(lane_item(page, "after-1")).to_be_visible(timeout=LIVE)
    page.wait_for_function("window.__shownNotifications.length === 2", timeout=LIVE)
    assert page.evaluate("window.__shownNotifications") == [
        "asked", {"title": "TaskFlow: approval needed", "body": "Asked after it?"}]


def test_a_second_answer_from_another_page_is_told_who_answered_first(open_board, orm):
    orm(ask, "dup-1", "Rotate the signing key?")
    first = open_board()
    second = open_board()
    for page in (first, second):
        expect(lane_item(page, "dup-1")).to_be_visible(timeout=LIVE)
    # The second page has not read the approvals again yet (as when both people click at once).
    second.route("**/api/approvals?*", lambda route: route.abort())
    lane_item(first, "dup-1").locator("button.approve").click()
    expect(first.locator("#needs-you")).to_be_hidden(timeout=LIVE)
    answered_by = orm(lambda: Approval.objects.get(task_id="dup-1").answered_by)

    stale = lane_item(second, "dup-1")
    stale.locator('textarea[name="comment"]').fill("no, wait")
    stale.locator("button.reject").click()
    status = stale.locator(".approval-status")
    expect(status).to_have_attribute("data-outcome", "already_answered")
    expect(status).to_contain_text(f"Already answered by {answered_by} at ")
    expect(status).to_contain_text("(approved)")
    expect(stale.locator("button.reject")).to_be_disabled()
    approval = orm(lambda: Approval.objects.get(task_id="dup-1"))
    assert (approval.state, approval.answered_by, approval.comment) == ("approved", answered_by, "")
    second.screenshot(path="/tmp/approvals-already-answered.png")


def newest_user():
    return get_user_model().objects.order_by("-id").first()


def test_a_user_who_is_not_an_approver_gets_disabled_buttons_and_the_servers_refusal(open_board, orm):
    orm(ask, "gate-1", "Ship it?", approvers=["release-managers"])
    page = open_board(superuser=False)  # board.view_task only, in no group
    user = orm(newest_user)
    item = lane_item(page, "gate-1")
    expect(item).to_be_visible(timeout=LIVE)
    approve = item.locator("button.approve")
    expect(approve).to_be_disabled()
    expect(approve).to_have_attribute("title", "you are not an approver of this question "
                                               "(approvers: release-managers)")
    expect(card(page, "gate-1", "PAUSED").locator(".badge.awaiting-approval")).to_have_text("waiting for approval")

    # In the group, the page offers the answer; out of it again before the click (a stale page),
    # the server refuses, and the page says so in words.
    group = orm(lambda: Group.objects.create(name="release-managers"))
    orm(lambda: user.groups.add(group))
    page.reload()
    item = lane_item(page, "gate-1")
    expect(item.locator("button.approve")).to_be_enabled(timeout=LIVE)
    expect(card(page, "gate-1", "PAUSED").locator(".badge.awaiting-approval")).to_have_text("needs you")
    orm(lambda: user.groups.remove(group))
    item.locator("button.approve").click()
    status = item.locator(".approval-status")
    expect(status).to_have_attribute("data-outcome", "forbidden", timeout=LIVE)
    expect(status).to_contain_text("You are not an approver of this question")
    expect(item.locator("button.approve")).to_be_enabled()  # nothing happened: it may be tried again
    assert orm(lambda: Approval.objects.get(task_id="gate-1").state) == "waiting"


def test_the_task_page_lists_its_approvals_and_answers_the_waiting_one(open_page, orm):
    def asked_twice():
        first = ask("page-1", "Use the new index?", form=FORM)
        transitions.answer("page-1", True, actor="alice", values={"target": "staging", "replicas": 2},
                           comment="staging first", approval_id=first)
        held = transitions.claim("page-1", "agent-7", 60)  # kept for the asker: it takes it back
        transitions.request_approval("page-1", held.lease.token, "Now production?", form=FORM, agent="agent-7",
                                     timeout_seconds=600, checkpoint={"step": "staged"})

    orm(asked_twice)
    page = open_page("/board/task/page-1")
    section = page.locator(".task-page-approvals")
    expect(section).to_be_visible()
    items = section.locator("li.approval")
    expect(items).to_have_count(2, timeout=SLOW)
    answered = items.nth(0)
    expect(answered).to_have_attribute("data-state", "approved")
    expect(answered.locator(".approval-question")).to_have_text("Use the new index?")
    expect(answered.locator(".approval-answer")).to_contain_text("approved by alice at")
    expect(answered.locator(".approval-values")).to_contain_text("Deploy to")
    expect(answered.locator(".approval-values")).to_contain_text("staging")
    expect(answered.locator(".approval-comment-text")).to_have_text("staging first")
    waiting = items.nth(1)
    expect(waiting).to_have_attribute("data-state", "waiting")
    expect(waiting.locator(".approval-due")).to_contain_text("the task fails")
    page.screenshot(path="/tmp/approvals-task-page.png", full_page=True)

    waiting.locator('textarea[name="comment"]').fill("not this week")
    waiting.locator("button.reject").click()  # no values needed to reject
    expect(page.locator("#message")).to_contain_text("Rejected: task page-1 is QUEUED again")
    expect(items.nth(1)).to_have_attribute("data-state", "rejected", timeout=SLOW)
    expect(items.nth(1).locator(".approval-answer")).to_contain_text(f"rejected by {page.username}")
    expect(page.locator(".stage-chip")).to_have_text("QUEUED")
    approval = orm(lambda: Approval.objects.filter(task_id="page-1").order_by("-id").first())
    assert (approval.state, approval.approved, approval.comment) == ("rejected", False, "not this week")


def test_the_admin_lists_the_approvals_and_answers_one(open_page, orm):
    approval_id = orm(ask, "adm-1", "Deploy release 4.2 to production?", form=FORM, timeout_seconds=3600)
    other = orm(ask, "adm-2", "Merge the hotfix?")
    orm(transitions.answer, "adm-2", False, actor="alice", comment="not today", approval_id=other)
    listing = open_page("/admin/board/approval/")
    expect(listing.locator("#result_list tbody tr")).to_have_count(2)
    expect(listing.locator("#changelist-filter")).to_contain_text("waiting")
    listing.screenshot(path="/tmp/approvals-admin-list.png", full_page=True)
    listing.locator(f'#result_list a.answer-link[href$="/{approval_id}/answer/"]').click()
    expect(listing.locator("#approval-question .question")).to_have_text("Deploy release 4.2 to production?")
    listing.select_option('select[name="field_target"]', label="staging")
    listing.fill('input[name="field_replicas"]', "2")
    listing.fill('textarea[name="comment"]', "staging first")
    listing.screenshot(path="/tmp/approvals-admin-answer.png", full_page=True)
    listing.locator('input[name="approve"]').click()
    expect(listing.locator(".messagelist .success")).to_contain_text(
        f"Approval {approval_id} approved: task adm-1 is QUEUED")
    listing.screenshot(path="/tmp/approvals-admin-answered.png", full_page=True)
    approval = orm(lambda: Approval.objects.get(pk=approval_id))
    assert approval.values == {"target": "staging", "replicas": 2, "ratio": 0.1, "notify": False}
