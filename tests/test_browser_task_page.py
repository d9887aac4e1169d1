"""A task's own page (/board/task/<id>) and the details panel's timeline, in a real browser
(Debian's Chromium, Playwright) against the real server (issue 30: items 7, 8, 11, 16).

The tasks are moved through the engine as agents and operators move them; what the page shows
comes from the server. Any page error or console error fails the test. Waits are Playwright's
`expect(...)` with a bound, never a sleep. The screenshots of docs/screenshots/task-page-*.png
are taken here (TASKFLOW_SCREENSHOTS=1 writes them)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from board.engine import handoffs, selectors, transitions, usage
from board.engine.transitions import TaskSpec
from tests.support import end_backoff, sqlite_db_mark
from tests.test_browser import SLOW, browser, open_page, orm, server  # noqa: F401  (fixtures)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
TRACEBACK = 'Traceback (most recent call last):\n  File "loader.py", line 88, in load_rows\nValueError: bad row 17'
RENEWS = 8
HOLDER_NOTE = "row 17 has a stray quote; skipping it would break the totals"
STAFF_NOTE = "fixed upstream: load from row 1 again"


def plan():
    """up (COMPLETED) <- mid <- down. mid: claimed, renewed 8 times, failed with a traceback on
    its only attempt, retried by an operator with a reason (attempts reset), claimed again and
    completed. down is then admitted, claimed and left RUNNING. Returns down's lease token."""
    transitions.create([
        TaskSpec(id="up", title="fetch the rows"),
        TaskSpec(id="mid", title="load the rows", deps=["up"], max_retries=0, description="loads into the warehouse"),
        TaskSpec(id="down", title="report", deps=["mid"]),
    ])
    up = transitions.claim("up", "agent-1", 60).lease
    transitions.complete("up", up.token, {"rows": 17})
    lease = transitions.claim("mid", "agent-2", 60).lease
    for _ in range(RENEWS):
        transitions.renew("mid", lease.token, 60)
    transitions.add_note("mid", HOLDER_NOTE, author="agent-2", token=lease.token)
    task = selectors.get_task("mid")
    usage.record(task, 1, "agent-2", usage.checked({"model": "opus", "input_tokens": 1200, "output_tokens": 300,
                                                    "cost_usd": 0.05}))
    transitions.fail("mid", lease.token, "ValueError: bad row 17\n  File \"loader.py\", line 88", traceback=TRACEBACK)
    transitions.requeue("mid", actor="ops-1", reset_attempts=True, reason="row 17 fixed upstream")
    transitions.add_note("mid", STAFF_NOTE, author="ops-1")  # between the attempts
    end_backoff("mid")
    lease = transitions.claim("mid", "agent-3", 60).lease
    transitions.renew("mid", lease.token, 60)
    usage.record(selectors.get_task("mid"), 2, "agent-3", usage.checked({"input_tokens": 40, "output_tokens": 2}))
    transitions.complete("mid", lease.token, {"loaded": 17})
    return transitions.claim("down", "agent-4", 60).lease.token


def test_the_task_page_shows_the_whole_task_deps_both_ways_attempts_and_collapsed_history(open_page, orm):
    down_token = orm(plan)
    page = open_page("/board/task/mid")
    expect(page.locator(".details-title")).to_have_text("mid: load the rows")
    expect(page.locator(".stage-chip")).to_have_text("COMPLETED")
    # Dependencies both ways, each a link to its own page.
    expect(page.locator(".waits-on li")).to_have_count(1)
    expect(page.locator('.waits-on li[data-id="up"]')).to_contain_text("COMPLETED")
    expect(page.locator('.waits-on a[href="/board/task/up"]')).to_be_visible()
    expect(page.locator("a.graph-link")).to_have_attribute("href", "/board/graph/?root=mid")
    expect(page.locator('.waited-by li[data-id="down"]')).to_contain_text("RUNNING")
    expect(page.locator(".details-body")).to_contain_text("loads into the warehouse")
    expect(page.locator(".details-body")).to_contain_text('"loaded": 17')
    # Item 7: one count of attempts, and the operator's retry with its reason in the timeline.
    attempts = page.locator(".attempts")
    expect(attempts.locator("h3")).to_have_text("Attempts (2)")
    expect(attempts.locator(".attempt")).to_have_count(2)
    move = attempts.locator('.operator-move[data-verb="requeue"]')
    expect(move).to_contain_text("requeued by ops-1")
    expect(move).to_contain_text("attempts reset")
    expect(move.locator("q")).to_have_text("row 17 fixed upstream")
    expect(attempts.locator(".attempt").nth(0)).to_contain_text(f"{RENEWS} heartbeats")
    # Usage (issue 32, item 5): each attempt's, and in all; a missing cost is said missing.
    expect(attempts.locator(".attempt").nth(0).locator(".attempt-usage")).to_have_text(
        "used 1,200 in + 300 out tokens · $0.0500 (opus)")
    expect(attempts.locator(".attempt").nth(1).locator(".attempt-usage")).to_have_text(
        "used 40 in + 2 out tokens · cost not reported (1 of 1 report)")
    expect(attempts.locator(".usage-total")).to_have_text(
        "In all: used 1,240 in + 302 out tokens · cost not reported (1 of 2 reports)")
    # Notes (issue 32, item 4): the holder's in its attempt, staff's between the attempts.
    expect(attempts.locator(".attempt").nth(0).locator(".note")).to_contain_text("note by agent-2 (holder)")
    expect(attempts.locator(".attempt").nth(0).locator(".note-text")).to_have_text(HOLDER_NOTE)
    expect(attempts.locator("ol > li.note .note-text")).to_have_text(STAFF_NOTE)
    assert attempts.locator("ol > li").evaluate_all("items => items.map(i => i.className)") == [
        "attempt", "operator-move", "note", "attempt"]
    assert page.locator("dt", has_text="attempts").count() == 0
    # Item 8: no "last error" on a COMPLETED task; the traceback once, folded.
    assert page.locator("dt", has_text="last error").count() == 0
    body = page.locator("#task-page")
    assert body.evaluate("e => e.textContent.split('in load_rows').length - 1") == 1
    fold = attempts.locator("details.attempt-traceback")
    expect(fold.locator("pre")).to_be_hidden()
    expect(attempts.locator(".attempt-error")).to_have_text("ValueError: bad row 17")
    # Item 11: the 8 renewals of the first lease are one counted row, not 8.
    renewals = page.locator(".history li.history-renewals")
    expect(renewals).to_have_count(2)
    expect(renewals.nth(0)).to_contain_text(f"renewed {RENEWS} times")
    expect(renewals.nth(1)).to_contain_text("renewed once")
    verbs = page.locator(".history > li").evaluate_all("items => items.map(li => li.dataset.verb)")
    assert verbs == ["create", "admit", "claim", "renew", "fail", "requeue", "claim", "renew", "complete"] or \
        verbs == ["create", "claim", "renew", "fail", "requeue", "claim", "renew", "complete"], verbs
    expect(page.locator('.history li.history-operator[data-verb="requeue"] q')).to_have_text("row 17 fixed upstream")
    # No move on a finished task but running it again as new; an admin link and the board's link.
    expect(page.locator(".details-actions button")).to_have_text(["Run again as new"])
    expect(page.locator("a.board-link")).to_have_attribute("href", "/board/?task=mid")
    expect(page.locator("a.details-admin")).to_have_attribute("href", "/admin/board/task/mid/change/")

    # The running dependent's page: no lease token anywhere on it.
    page.goto(page.url.replace("/mid", "/down"))
    expect(page.locator(".attempts .attempt")).to_have_count(1)
    expect(page.locator(".details-actions button")).to_have_count(3)  # Release, Pause, Cancel
    content = page.content()
    assert down_token not in content and hashlib.sha256(down_token.encode()).hexdigest() not in content


def test_the_task_page_acts_retry_and_cancel_with_a_reason(open_page, orm):
    def failed():
        transitions.create([TaskSpec(id="f1", title="fails", max_retries=0),
                            TaskSpec(id="f2", title="fails too", max_retries=0),
                            TaskSpec(id="after", title="waits for f2", deps=["f2"])])
        for task_id in ("f1", "f2"):
            lease = transitions.claim(task_id, "agent-1", 60).lease
            transitions.fail(task_id, lease.token, "boom")

    orm(failed)
    page = open_page("/board/task/f1")
    expect(page.locator(".stage-chip")).to_have_text("FAILED")
    page.locator('button[data-verb="requeue"]').click()  # "Retry": attempts back
    expect(page.locator(".stage-chip")).to_have_text("QUEUED", timeout=SLOW)
    expect(page.locator("#message")).to_contain_text("Retry: f1 is now QUEUED")
    expect(page.locator('.attempts .operator-move[data-verb="requeue"]')).to_contain_text("attempts reset")

    page.goto(page.url.replace("/f1", "/f2"))
    page.locator('button[data-verb="cancel"]').click()
    dialog = page.locator("#cancel-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".stranded li")).to_have_text(["after: waits for f2"])
    dialog.locator("textarea").fill("not needed any more")
    dialog.locator('button[value="confirm"]').click()
    expect(page.locator(".stage-chip")).to_have_text("CANCELLED", timeout=SLOW)
    expect(page.locator('.attempts .operator-move[data-verb="cancel"] q')).to_have_text("not needed any more")
    assert orm(lambda: selectors.get_task("f2").stage) == "CANCELLED"


def test_the_task_page_asks_a_reason_before_pausing_a_running_task(open_page, orm):
    """Pause takes the holder's lease away: the page asks first, as the board does (issue 30,
    item 10), and the reason is in the timeline."""
    orm(transitions.create, TaskSpec(id="r1", title="runs"))
    orm(transitions.claim, "r1", "agent-1", 600)
    page = open_page("/board/task/r1")
    expect(page.locator(".stage-chip")).to_have_text("RUNNING")
    page.locator('button[data-verb="force_pause"]').click()
    dialog = page.locator("#reason-dialog")
    expect(dialog.locator("h2")).to_have_text("Pause r1?")
    dialog.locator("textarea").fill("disk full on agent-1")
    dialog.get_by_role("button", name="Pause the task").click()
    expect(page.locator(".stage-chip")).to_have_text("PAUSED", timeout=SLOW)
    expect(page.locator('.history li[data-verb="force_pause"]')).to_contain_text("disk full on agent-1")
    assert orm(lambda: selectors.get_task("r1").stage) == "PAUSED"


def test_the_details_panel_counts_attempts_once_and_links_to_the_full_page(open_page, orm):
    orm(plan)
    page = open_page("/board/?task=mid")
    details = page.locator("#details")
    expect(details.locator(".attempts h3")).to_have_text("Attempts (2)", timeout=SLOW)
    # Item 7: one count (no "attempts 1 of 1" beside "Attempts (2)"), the operator's move with its reason.
    assert details.locator("dt", has_text="attempts").count() == 0
    expect(details.locator('.operator-move[data-verb="requeue"] q')).to_have_text("row 17 fixed upstream")
    expect(details.locator(".attempt .note-text")).to_have_text(HOLDER_NOTE)
    # Item 8: no "last error" on a COMPLETED task, the traceback once (folded).
    assert details.locator("dt", has_text="last error").count() == 0
    assert details.evaluate("e => e.textContent.split('in load_rows').length - 1") == 1
    # Item 11: renewals collapsed in the panel's history too.
    expect(details.locator(".history li.history-renewals").first).to_contain_text(f"renewed {RENEWS} times")
    assert details.locator('.history li[data-verb="renew"]').count() == 2
    expect(details.locator("a.details-page")).to_have_attribute("href", "/board/task/mid")
    expect(details.locator("a.details-graph")).to_have_attribute("href", "/board/graph/?root=mid")
    details.locator("a.details-page").click()
    expect(page.locator("#task-page .details-title")).to_have_text("mid: load the rows", timeout=SLOW)


def test_staff_add_a_note_from_the_task_page_and_the_holder_gets_it(open_page, orm):
    orm(transitions.create, TaskSpec(id="n1", title="takes notes"))
    page = open_page("/board/task/n1")
    expect(page.locator(".attempts")).to_contain_text("Not claimed yet.")
    page.locator(".note-form textarea").fill("use the EU endpoint")
    page.get_by_role("button", name="Add note").click()
    expect(page.locator("#message")).to_contain_text("note added to n1")
    expect(page.locator(".attempts li.note .note-text")).to_have_text("use the EU endpoint", timeout=SLOW)
    expect(page.locator(".note-form textarea")).to_have_value("")
    claim = orm(transitions.claim_next, "agent-1", 60)
    handed = orm(lambda: handoffs.for_claim(claim.task, []))
    assert [(n["text"], n["author"], n["by_holder"]) for n in handed["notes"]] == [
        ("use the EU endpoint", page.username, False)]


def test_run_again_as_new_opens_the_copy_linked_both_ways(open_page, orm):
    def failed():
        transitions.create(TaskSpec(id="r1", title="flaky", max_retries=0, payload={"n": 1}))
        transitions.fail("r1", transitions.claim("r1", "agent-1", 60).lease.token, "boom")

    orm(failed)
    page = open_page("/board/task/r1")
    expect(page.locator(".stage-chip")).to_have_text("FAILED")
    page.locator('button[data-verb="replay"]').click()
    expect(page.locator(".stage-chip")).to_have_text("QUEUED", timeout=SLOW)  # the copy's page
    copy_id = page.url.rsplit("/", 1)[-1]
    assert copy_id != "r1"
    expect(page.locator("a.replay-of")).to_have_text("r1")
    expect(page.locator(".details-body")).to_contain_text('"n": 1')
    page.locator("a.replay-of").click()
    expect(page.locator(".replays")).to_have_text(f"Run again as: {copy_id}", timeout=SLOW)
    assert orm(lambda: selectors.get_task(copy_id).replay_of) == "r1"


def test_a_viewer_sees_the_task_page_without_actions(open_page, orm):
    orm(lambda: transitions.create(TaskSpec(id="p1", title="private")))
    page = open_page("/board/task/p1", superuser=False)  # board.view_task, not board.intervene
    expect(page.locator(".details-title")).to_have_text("p1: private")
    expect(page.locator(".details-body")).to_contain_text("QUEUED")
    expect(page.locator(".details-actions button")).to_have_count(0)
    assert page.locator(".note-form").count() == 0  # a note without a token is staff's


@pytest.mark.parametrize("name,width,height,scheme", [
    ("task-page-desktop", 1600, 1000, "light"),
    ("task-page-phone", 390, 844, "light"),
    ("task-page-dark", 1600, 1000, "dark"),
])
def test_the_task_page_fits_desktop_phone_and_dark(open_page, orm, name, width, height, scheme):
    orm(plan)
    page = open_page("/board/task/mid", width=width, height=height, color_scheme=scheme)
    expect(page.locator(".attempts .attempt")).to_have_count(2, timeout=SLOW)
    expect(page.locator(".history li.history-renewals")).to_have_count(2)
    # Nothing wider than the window (the phone scrolls down, never sideways).
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    background = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
    assert (background == "rgb(15, 17, 21)") == (scheme == "dark"), background
    if os.environ.get("TASKFLOW_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def test_the_admin_page_of_a_failed_task_retries_it_and_shows_its_history_collapsed(open_page, orm):
    def failed_after_renewals():
        transitions.create(TaskSpec(id="adm", title="fails in the admin", max_retries=0))
        lease = transitions.claim("adm", "agent-1", 60).lease
        for _ in range(RENEWS):
            transitions.renew("adm", lease.token, 60)
        transitions.fail("adm", lease.token, "ValueError: bad row 17", traceback=TRACEBACK)

    orm(failed_after_renewals)
    page = open_page("/admin/board/task/adm/change/")
    history = page.locator("#events-group")
    expect(history.locator('tr[data-verb="renew"]')).to_have_count(1)
    expect(history.locator('tr[data-verb="renew"]')).to_contain_text(f"renewed {RENEWS} times")
    expect(history.locator("details.traceback pre")).to_be_hidden()
    if os.environ.get("TASKFLOW_SCREENSHOTS"):
        page.screenshot(path="/tmp/admin-task-page.png", full_page=True)
    expect(page.locator("#task-page-link")).to_have_attribute("href", "/board/task/adm")
    page.locator('input[name="reason"]').fill("bad row fixed")
    page.locator("#task-verb-retry").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Retry, 1 task: 1 done.")
    expect(history.locator('tr[data-verb="requeue"]')).to_contain_text("bad row fixed")
    assert orm(lambda: selectors.get_task("adm").stage) == "QUEUED"
