"""A task's admin page (issue 30, items 11 and 14): its whole history, paged, heartbeats collapsed
into a counted range; times with seconds; a failure's detail as text, not escaped JSON; Retry and
Cancel on a FAILED task's page, through the engine's operator verbs (one compare-and-swap held to
the version the page showed, with a reason), for board.intervene only. And the task's own page
(/board/task/<id>) as the test client sees it: the board's permission rules, 404, no token."""
from __future__ import annotations

import hashlib
import re

import pytest
from django.urls import reverse

from board.admin.history import HISTORY_PAGE, history_page
from board.engine import selectors, transitions
from board.engine.lifecycle import Stage
from board.engine.transitions import TaskSpec
from board.models import TaskEvent
from tests.support import end_backoff, sql_stores, sqlite_db_mark
from tests.test_admin import change_url, client_for, db_state, events, make_user, op, running, viewer  # noqa: F401

pytestmark = sqlite_db_mark()

TRACEBACK = 'Traceback (most recent call last):\n  File "worker.py", line 12, in run\nKeyError: \'url\''


def failed(task_id: str) -> None:
    c = running(task_id, max_retries=0)
    transitions.fail(task_id, c.lease.token, "KeyError: 'url'", traceback=TRACEBACK)


def test_a_long_tasks_history_keeps_its_create_and_claim_and_collapses_its_renewals(op):
    c = running("long")
    renews = 250  # more than the 200 rows the page used to keep, all renews
    for _ in range(renews):
        transitions.renew("long", c.lease.token, 600)
    transitions.complete("long", c.lease.token, {"ok": True})
    page = op.get(change_url("long"))
    html = page.content.decode()
    assert re.search(rf"renewed {renews} times, \d\d:\d\d:\d\d–\d\d:\d\d:\d\d", html)
    # Times keep their seconds.
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</td>", html)
    rows = page.context["task_history"].rows
    assert [(r.verb, r.renewals) for r in rows] == [("create", 0), ("claim", 0), ("renew", renews), ("complete", 0)]
    assert html.count('data-verb="renew"') == 1


def test_the_history_is_paged_oldest_first_and_every_page_reachable(op):
    c = running("paged", max_retries=0)
    for n in range(HISTORY_PAGE + 20):  # edits: moves of their own, not renews
        transitions.edit("paged", actor="op", version=selectors.get_task("paged").version, priority=n % 5 + 1)
        if n % 10 == 0:
            transitions.renew("paged", c.lease.token, 600)
    last = op.get(change_url("paged")).context["task_history"]
    assert (last.number, last.pages, last.moves) == (2, 2, HISTORY_PAGE + 22)
    assert "create" not in [r.verb for r in last.rows]
    first = op.get(change_url("paged"), {"history": "1"})
    rows = first.context["task_history"].rows
    assert [r.verb for r in rows[:2]] == ["create", "claim"]
    shown = sum(r.renewals for r in rows + last.rows)
    assert shown == TaskEvent.objects.filter(task_id="paged", verb="renew").count() == 12
    assert 'href="?history=1#events-group"' in op.get(change_url("paged")).content.decode()
    transitions.cancel("paged", actor="op")


def test_a_failures_detail_is_text_with_its_traceback_folded_not_escaped_json(op):
    failed("tb")
    html = op.get(change_url("tb")).content.decode()
    history = html[html.index('id="events-group"'):]
    assert "\\n" not in history  # no escaped newlines
    assert '<details class="traceback"><summary>traceback</summary>' in history
    assert 'File &quot;worker.py&quot;, line 12, in run\nKeyError' in history
    assert re.search(r'<pre class="error"[^>]*>KeyError: &#x27;url&#x27;</pre>', history)  # the error, as text


def test_retry_on_a_failed_tasks_page_requeues_it_with_a_reason(op):
    failed("f")
    page = op.get(change_url("f")).content.decode()
    assert 'id="task-verb-retry"' in page and 'id="task-verb-cancel"' in page
    version = selectors.get_task("f").version
    url = reverse("admin:board_task_act", args=["f", "retry"])
    response = op.post(url, {"version": version, "reason": "fixed the url"}, follow=True)
    task = selectors.get_task("f")
    assert (task.stage, task.attempts) == (Stage.QUEUED, 0)
    last = TaskEvent.objects.filter(task_id="f").order_by("-id").first()
    assert (last.verb, last.actor, last.detail) == ("requeue", "op", {"reason": "fixed the url", "reset_attempts": True})
    assert "Retry, 1 task: 1 done." in response.content.decode()
    transitions.cancel("f", actor="op")


def test_cancel_on_the_page_held_to_the_version_shown(op):
    failed("c")
    shown = selectors.get_task("c").version
    transitions.requeue("c", actor="someone", reset_attempts=True)  # it moved after the page was read
    before = db_state()
    response = op.post(reverse("admin:board_task_act", args=["c", "cancel"]), {"version": shown, "reason": "r"},
                       follow=True)
    assert "lost a race" in response.content.decode()
    assert db_state() == before  # nothing written
    response = op.post(reverse("admin:board_task_act", args=["c", "cancel"]),
                       {"version": selectors.get_task("c").version, "reason": "not needed"}, follow=True)
    assert selectors.get_task("c").stage == Stage.CANCELLED
    assert events("c")[-1][0] == "cancel"


def test_a_viewer_gets_no_buttons_and_cannot_post_them(viewer):
    failed("v")
    page = viewer.get(change_url("v")).content.decode()
    assert 'id="task-verb-retry"' not in page and 'id="events-group"' in page
    before = db_state()
    response = viewer.post(reverse("admin:board_task_act", args=["v", "retry"]),
                           {"version": selectors.get_task("v").version})
    assert response.status_code == 403
    assert db_state() == before
    transitions.cancel("v", actor="op")


# -- the task's own page, /board/task/<id> ----------------------------------------------------

def test_the_task_page_follows_the_boards_rules(viewer):
    c = running("mine")
    anonymous = client_for(make_user("nobody-staff", []))
    refused = anonymous.get("/board/task/mine")
    assert refused.status_code == 403 and "board.view_task" in refused.content.decode()
    page = viewer.get("/board/task/mine")
    html = page.content.decode()
    assert page.status_code == 200 and "mine: title of mine" in html
    for secret in (c.lease.token, hashlib.sha256(c.lease.token.encode()).hexdigest()):
        assert secret not in html
    missing = viewer.get("/board/task/no-such-task")
    assert missing.status_code == 404 and "No task no-such-task" in missing.content.decode()
    transitions.complete("mine", c.lease.token, {})


def test_the_task_page_lists_dependencies_both_ways(viewer):
    transitions.create([TaskSpec(id="a", title="first"), TaskSpec(id="b", title="second", deps=["a"]),
                        TaskSpec(id="c", title="third", deps=["b"])])
    html = viewer.get("/board/task/b").content.decode()
    waits_on = html[html.index('class="waits-on"'):html.index("Waited on by")]
    waited_by = html[html.index('class="waited-by"'):]
    assert 'href="/board/task/a"' in waits_on and "c" not in re.findall(r'data-id="(\w+)"', waits_on)
    assert 'href="/board/task/c"' in waited_by
    for task_id in ("a", "b", "c"):
        transitions.cancel(task_id, actor="op")


@pytest.mark.parametrize("using", sql_stores())
def test_the_grouped_renewals_on_each_sql_store(using):
    """history_page's one grouped query (count, first and last time per fence) on SQLite and
    PostgreSQL alike (MongoDB: tests/mongodb/test_admin_mongodb.py collects this module)."""
    transitions.create(TaskSpec(id="g", title="grouped", max_retries=1), using=using)
    for agent in ("agent-1", "agent-2"):
        lease = transitions.claim("g", agent, 60, using=using).lease
        for _ in range(30 if agent == "agent-1" else 3):
            transitions.renew("g", lease.token, 60, using=using)
        transitions.fail("g", lease.token, "boom", using=using)
        if agent == "agent-1":
            end_backoff("g", using=using)
    page = history_page("g", using=using)
    assert [(r.verb, r.renewals, r.fence) for r in page.rows if r.verb in ("claim", "renew", "fail")] == [
        ("claim", 0, 1), ("renew", 30, 1), ("fail", 0, 1), ("claim", 0, 2), ("renew", 3, 2), ("fail", 0, 2)]
    first_run = next(r for r in page.rows if r.renewals)
    assert page.renewals == 33 and first_run.until >= first_run.at


def test_a_completed_tasks_page_does_not_show_an_earlier_error_as_its_last_error(op):
    c = running("ok-later", max_retries=1)
    transitions.fail("ok-later", c.lease.token, "KeyError: 'url'", traceback=TRACEBACK)
    end_backoff("ok-later")
    c = transitions.claim("ok-later", "agent-1", 600)
    transitions.complete("ok-later", c.lease.token, {})
    html = op.get(change_url("ok-later")).content.decode()
    assert 'class="last-error"' not in html and "an earlier attempt failed" in html
    assert html.count('<pre class="error"') == 1  # the error once, in the history's fail row
