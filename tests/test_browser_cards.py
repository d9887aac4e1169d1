"""What cards and the details panel show, the human actions' safety, and the page's look, in a
real browser (Debian's Chromium, Playwright) against a real board server on the test database.

The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` with a bound, never a sleep."""
# The fixtures imported from tests/test_browser.py are test parameters by the same names.
# ruff: noqa: F811
from __future__ import annotations

import json
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures, found by pytest by name)
    ARRIVAL,
    SLOW,
    browser,
    card,
    open_board,
    orm,
    server,
    settled,
)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

SCREENSHOTS = Path(tempfile.gettempdir()) / "taskflow-board-screenshots"


@pytest.fixture
def open_styled(open_board):
    """open_styled(width, height, color_scheme) -> the live board, as an operator, in a window of
    that size and colour scheme."""
    return lambda width=1800, height=1000, color_scheme="light": open_board(
        width=width, height=height, color_scheme=color_scheme)


@pytest.fixture
def no_backoff(settings):
    """Retries are claimable at once (the default backoff is 2 s)."""
    settings.TASKFLOW = {**settings.TASKFLOW, "RETRY_BACKOFF_BASE_SECONDS": 0}


def in_stage(page, task_id: str):
    return card(page, task_id).locator(".in-stage")


# ---------------------------------------------------------------------------------------------
# 1. Time in stage; fence and version in the details


def test_a_card_shows_its_time_in_stage_from_stage_changed_at_and_it_ticks(open_board, orm):
    orm(transitions.create, TaskSpec(id="waiting", title="waits a while"))
    entered = timezone.now() - timedelta(minutes=7, seconds=10)
    orm(lambda: Task.objects.filter(pk="waiting").update(stage_changed_at=entered))
    page = open_board()
    # 7 min 10 s ago, read a few seconds later at most: "7m" (the bound: never 6m, never 8m).
    expect(in_stage(page, "waiting")).to_have_text("7m in QUEUED")
    assert "fence" not in card(page, "waiting").inner_text()

    claim = orm(transitions.claim, "waiting", "agent-1", 120)
    running = settled(page, "waiting", "RUNNING")
    expect(running).to_be_visible(timeout=ARRIVAL)
    changed = orm(lambda: Task.objects.get(pk="waiting").stage_changed_at)
    assert abs(changed - timezone.now()) < timedelta(seconds=30)
    # Seconds, not the 7 minutes of QUEUED (a loaded CI machine may show it 10 s or more late).
    expect(in_stage(page, "waiting")).to_have_text(re.compile(r"^\d+s in RUNNING$"))
    first = in_stage(page, "waiting").text_content()
    # It ticks each second, its one text node changed in place (static/board/page.js setText:
    # a node replaced every second on every card was garbage the tab kept until a collection).
    in_stage(page, "waiting").evaluate("label => { window.tickedNode = label.firstChild; }")
    expect(in_stage(page, "waiting")).not_to_have_text(first, timeout=SLOW)
    assert in_stage(page, "waiting").evaluate("label => label.firstChild === window.tickedNode && label.childNodes.length === 1")
    # A renew keeps the stage: the time in it keeps counting from the claim.
    orm(transitions.renew, "waiting", claim.lease.token, 120)
    assert orm(lambda: Task.objects.get(pk="waiting").stage_changed_at) == changed

    card(page, "waiting").click()
    body = page.locator("#details .details-body")
    expect(body).to_contain_text(re.compile(r"RUNNING \(version 2\) since"))
    expect(body.locator("dt", has_text="fence")).to_be_visible()
    expect(body.locator("dt:text-is('fence') + dd")).to_have_text("1")


# ---------------------------------------------------------------------------------------------
# 2. Red badges only where they matter


def test_a_completed_card_that_failed_once_wears_no_error_badge(open_board, orm, no_backoff):
    orm(transitions.create, TaskSpec(id="flaky", title="fails once", max_retries=2))
    page = open_board()
    claim = orm(transitions.claim, "flaky", "agent-1", 60)
    orm(transitions.fail, "flaky", claim.lease.token, "boom", retryable=True)
    queued = settled(page, "flaky", "QUEUED")
    expect(queued.locator(".badge.bad.failed")).to_be_visible(timeout=ARRIVAL)  # QUEUED after a retry

    claim = orm(transitions.claim, "flaky", "agent-2", 60)
    running = settled(page, "flaky", "RUNNING")
    expect(running.locator(".badge.bad.retried")).to_have_text("attempt 2", timeout=ARRIVAL)
    expect(running.locator(".badge.bad.failed")).to_be_visible()

    orm(transitions.complete, "flaky", claim.lease.token, {"ok": True})
    completed = settled(page, "flaky", "COMPLETED")
    expect(completed).to_be_visible(timeout=ARRIVAL)
    expect(completed.locator(".badge.bad")).to_have_count(0)
    assert orm(lambda: Task.objects.get(pk="flaky").last_error) == "boom"  # still kept, just not worn


def test_a_queued_card_that_may_not_start_yet_says_until_when(open_board, orm):
    """A run_at (issue 29; a snooze or a retry's backoff alike) ahead: the card names the time;
    a task ready now wears no such badge."""
    later = timezone.now() + timedelta(hours=2)
    orm(transitions.create, [TaskSpec(id="later", title="runs later", run_at=later),
                             TaskSpec(id="now", title="ready now")])
    page = open_board()
    card = settled(page, "later", "QUEUED")
    expect(card.locator(".badge.not-before")).to_contain_text("not before", timeout=ARRIVAL)
    shown = card.locator(".badge.not-before").get_attribute("title")
    assert shown and str(later.astimezone().year) in shown
    expect(settled(page, "now", "QUEUED").locator(".badge.not-before")).to_have_count(0)


def test_a_card_with_a_deadline_says_when_it_runs_out(open_board, orm):
    """Deadlines (issue 29, item 7): a RUNNING card names its attempt's deadline (the earliest of
    its deadlines), a QUEUED one when it fails unstarted; a card without one wears no such badge."""
    orm(transitions.create, [TaskSpec(id="timed", title="an hour at most", attempt_timeout_seconds=3600),
                             TaskSpec(id="waits", title="ten minutes to start", queue_timeout_seconds=600),
                             TaskSpec(id="free", title="no deadline")])
    orm(transitions.claim, "timed", "agent", 300)
    due = orm(lambda: Task.objects.get(pk="timed").stage_changed_at) + timedelta(seconds=3600)
    page = open_board()
    badge = settled(page, "timed", "RUNNING").locator(".badge.deadline")
    expect(badge).to_contain_text("deadline", timeout=ARRIVAL)
    title = badge.get_attribute("title")
    assert title.startswith("the attempt's time runs out at") and str(due.astimezone().year) in title
    expect(settled(page, "waits", "QUEUED").locator(".badge.deadline")).to_have_attribute(
        "title", re.compile("^fails if not started by"))
    expect(settled(page, "free", "QUEUED").locator(".badge.deadline")).to_have_count(0)


# ---------------------------------------------------------------------------------------------
# 3. Cancel asks first; Admit says why it cannot


def _chain(orm):
    orm(transitions.create, [
        TaskSpec(id="root", title="the root"), TaskSpec(id="child", title="waits for root", deps=["root"]),
        TaskSpec(id="grandchild", title="waits for child", deps=["child"]),
        TaskSpec(id="bystander", title="waits for nothing"),
    ])


def test_cancel_asks_for_a_reason_lists_the_stranded_chain_and_dismissing_changes_nothing(open_board, orm):
    _chain(orm)
    page = open_board()
    card(page, "root").click()
    page.locator('#details button[data-verb="cancel"]').click()
    dialog = page.locator("#cancel-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".cancel-task")).to_have_text("root")
    expect(dialog.locator(".stranded li")).to_have_text(["child: waits for root", "grandchild: waits for child"])
    expect(dialog.locator(".stranded-none")).to_be_hidden()

    def untouched():
        return (Task.objects.get(pk="root").stage, list(TaskEvent.objects.filter(task_id="root").values_list("verb", flat=True)))

    dialog.get_by_role("button", name="Keep the task").click()
    expect(dialog).to_be_hidden()
    expect(settled(page, "root", "QUEUED")).to_be_visible()
    assert orm(untouched) == ("QUEUED", ["create"])
    page.locator('#details button[data-verb="cancel"]').click()
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")  # closes the dialog only
    expect(dialog).to_be_hidden()
    expect(page.locator("#details")).to_be_visible()
    assert orm(untouched) == ("QUEUED", ["create"])

    page.locator('#details button[data-verb="cancel"]').click()
    expect(dialog.locator("textarea")).to_be_focused()
    expect(dialog.locator("textarea")).to_have_attribute("maxlength", "500")
    page.keyboard.type("superseded by the new pipeline")
    dialog.get_by_role("button", name="Cancel the task").click()
    expect(settled(page, "root", "CANCELLED")).to_be_visible(timeout=ARRIVAL)
    cancel = orm(lambda: TaskEvent.objects.get(task_id="root", verb="cancel"))
    assert cancel.detail == {"reason": "superseded by the new pipeline"}
    # check() flags the whole stranded chain, and the problems panel shows it.
    problems = page.locator("#problems li.problem")
    expect(problems).to_have_count(2, timeout=ARRIVAL)
    assert [(p.get_attribute("data-task"), p.get_attribute("data-code")) for p in problems.all()] == [
        ("child", "dead_dep"), ("grandchild", "dead_dep")]
    # ... and their cards say so, instead of looking like tasks that wait (issue 30, item 12).
    for stranded in ("child", "grandchild"):
        expect(card(page, stranded)).to_have_class(re.compile(r"\bstranded\b"), timeout=ARRIVAL)
        expect(card(page, stranded).locator(".badge.stranded")).to_have_text("stranded: can never run")
    expect(card(page, "child").locator(".badge.stranded")).to_have_attribute(
        "title", re.compile(r"child waits for root, which is CANCELLED"))
    expect(card(page, "bystander")).not_to_have_class(re.compile(r"\bstranded\b"))
    expect(card(page, "child").locator("li.dep.dead")).to_have_text("✗ root")


def test_cancelling_a_task_nobody_waits_for_says_so(open_board, orm):
    _chain(orm)
    page = open_board()
    card(page, "bystander").click()
    page.locator('#details button[data-verb="cancel"]').click()
    dialog = page.locator("#cancel-dialog")
    expect(dialog.locator(".stranded-none")).to_be_visible()
    expect(dialog.locator(".stranded-some")).to_be_hidden()
    dialog.get_by_role("button", name="Cancel the task").click()
    expect(settled(page, "bystander", "CANCELLED")).to_be_visible(timeout=ARRIVAL)
    assert orm(lambda: TaskEvent.objects.get(task_id="bystander", verb="cancel").detail) is None


def test_admit_is_disabled_with_the_reason_while_dependencies_are_unfinished(open_board, orm):
    orm(transitions.create, [TaskSpec(id="base", title="base"),
                             TaskSpec(id="held", title="held and blocked", deps=["base"], on_hold=True)])
    page = open_board()
    card(page, "held").click()
    admit = page.locator('#details button[data-verb="admit"]')
    expect(admit).to_be_disabled()
    expect(admit).to_have_attribute("title", "Blocked: waiting for base to complete")
    expect(page.locator("#details .action-note")).to_have_text("Blocked: waiting for base to complete")
    expect(page.locator("#details .action-note")).to_be_visible()

    claim = orm(transitions.claim, "base", "agent-1", 60)
    orm(transitions.complete, "base", claim.lease.token, {"ok": True})
    expect(admit).to_be_enabled(timeout=ARRIVAL)  # still held: now an operator may admit it
    expect(page.locator("#details .action-note")).to_have_count(0)
    admit.click()
    expect(settled(page, "held", "QUEUED")).to_be_visible(timeout=ARRIVAL)


# ---------------------------------------------------------------------------------------------
# 4. Focus, narrow screens, contrast in both colour schemes


def test_focus_moves_into_the_details_and_back_to_the_card(open_board, orm):
    orm(transitions.create, TaskSpec(id="focus-me", title="keyboard"))
    page = open_board()
    card(page, "focus-me").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#details")).to_be_visible()
    expect(page.locator("#details .details-title")).to_be_focused()
    page.keyboard.press("Tab")  # on through the panel: its full page, plan graph and admin links, close button, then its actions
    expect(page.locator("#details .details-page")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#details .details-graph")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#details .details-admin")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#details .close")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator('#details button[data-verb="cancel"]')).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#details")).to_be_hidden()
    expect(card(page, "focus-me")).to_be_focused()


def test_a_redrawn_details_panel_keeps_the_focus_on_its_button(open_board, orm):
    """The panel is drawn again when the full task arrives and when the task changes. A keyboard
    user on one of its buttons must stay on it (before: the button was replaced and the focus
    fell out of the page; the test above failed that way when the full task came late)."""
    orm(transitions.create, TaskSpec(id="focus-kept", title="keyboard"))
    claim = orm(transitions.claim, "focus-kept", "agent-1", 60)
    page = open_board()
    card(page, "focus-kept").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#details .details-title")).to_be_focused()
    pause = page.locator('#details button[data-verb="force_pause"]')
    pause.focus()
    expect(pause).to_be_focused()
    orm(transitions.renew, "focus-kept", claim.lease.token, 60)  # a new version: the panel is drawn again
    expect(card(page, "focus-kept")).to_have_attribute("data-version", "2", timeout=5000)
    expect(page.locator("#details")).to_have_attribute("data-id", "focus-kept")
    expect(pause).to_be_focused()


def _board_of_every_kind(orm, settings):
    """Tasks in every column, with every kind of chip: held, error and attempt badges, an
    expired lease, done and unfinished dependencies, a problem (dead_dep)."""
    orm(transitions.create, [
        TaskSpec(id="done", title="done"), TaskSpec(id="after-done", title="after done", deps=["done"], on_hold=True),
        TaskSpec(id="dropped", title="dropped"), TaskSpec(id="stranded", title="stranded", deps=["dropped"]),
        TaskSpec(id="flaky", title="a task with a rather long title that must wrap on a narrow screen"),
        TaskSpec(id="expiring", title="lease runs out"), TaskSpec(id="paused", title="paused"),
        TaskSpec(id="broken", title="fails for good", max_retries=0),
        TaskSpec(id="blocked", title="waits", deps=["expiring"]),
    ])
    claim = orm(transitions.claim, "done", "agent-1", 60)
    orm(transitions.complete, "done", claim.lease.token, {"ok": True})
    orm(transitions.cancel, "dropped", actor="op")
    settings.TASKFLOW = {**settings.TASKFLOW, "RETRY_BACKOFF_BASE_SECONDS": 0}
    claim = orm(transitions.claim, "flaky", "agent-1", 60)
    orm(transitions.fail, "flaky", claim.lease.token, "boom", retryable=True)
    orm(transitions.claim, "flaky", "agent-1", 60)  # its second attempt
    claim = orm(transitions.claim, "paused", "agent-2", 60)
    orm(transitions.pause, "paused", claim.lease.token, {"step": 1})
    claim = orm(transitions.claim, "broken", "agent-3", 60)
    orm(transitions.fail, "broken", claim.lease.token, "no luck", retryable=False)
    orm(transitions.claim, "expiring", "agent-4", 1)


def _boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(selector, "els => els.filter(e => e.getClientRects().length).map(e => {"
                                               " const r = e.getBoundingClientRect();"
                                               " return {x: r.x, y: r.y, w: r.width, h: r.height, id: e.dataset.id || e.id ||"
                                               " e.dataset.stage}; })")


def _overlap(a: dict, b: dict) -> bool:
    return (min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"]) > 0.5
            and min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"]) > 0.5)


def test_at_390_px_nothing_overlaps_and_the_details_are_an_overlay(open_styled, orm, settings):
    _board_of_every_kind(orm, settings)
    page = open_styled(390, 844)
    expect(settled(page, "expiring", "RUNNING").locator(".lease.bad")).to_be_visible(timeout=5000)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "board-390.png"), full_page=True)

    # The page itself does not scroll sideways: the columns do, inside their strip.
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    columns = _boxes(page, "#columns .column")
    assert len(columns) == 7 and all(c["w"] >= 200 for c in columns), columns
    for i, a in enumerate(columns):
        for b in columns[i + 1:]:
            assert not _overlap(a, b), (a, b)
    cards = _boxes(page, ".card")
    assert len(cards) == 9
    for i, a in enumerate(cards):
        for b in cards[i + 1:]:
            assert not _overlap(a, b), (a, b)
    for stage in ("QUEUED", "COMPLETED"):  # each card inside its column
        column = _boxes(page, f'.column[data-stage="{stage}"]')[0]
        for c in _boxes(page, f'.column[data-stage="{stage}"] .card'):
            assert column["x"] <= c["x"] and c["x"] + c["w"] <= column["x"] + column["w"] + 0.5, (column, c)
    top, strip, side = (_boxes(page, s)[0] for s in ("#topbar", "#columns", "#side"))
    assert not _overlap(top, strip) and not _overlap(strip, side) and not _overlap(top, side), (top, strip, side)
    for a, b in [(x, y) for i, x in enumerate(_boxes(page, "#topbar > *")) for y in _boxes(page, "#topbar > *")[i + 1:]]:
        assert not _overlap(a, b), (a, b)

    card(page, "flaky").click()
    details = page.locator("#details")
    expect(details).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "board-390-details.png"))
    panel = _boxes(page, "#details")[0]
    assert panel["x"] == 0 and panel["y"] == 0 and panel["w"] == 390 and panel["h"] == 844, panel
    # On top of everything: the middle and the corners of the screen are the panel's.
    for x, y in [(195, 422), (5, 5), (385, 839)]:
        assert page.evaluate(f"document.getElementById('details').contains(document.elementFromPoint({x}, {y}))")
    page.keyboard.press("Escape")
    expect(details).to_be_hidden()


# Every kind of chip on the board, by the selector of its text.
CHIPS = [
    ".badge:not(.bad)", ".badge.bad.failed", ".badge.bad.retried", ".lease.badge.bad", ".dep.done", ".dep.todo",
    ".dep.unknown", ".problem-code", "#problems .count", ".column h2 .count", "#connection", ".card-meta",
    ".in-stage", ".card-id",
]

# The contrast of each element's text with the background it is drawn on (the nearest
# ancestor with an opaque background), per WCAG 2 (relative luminance).
CONTRAST_JS = """
(selectors) => {
  const parse = (c) => { const m = c.match(/[\\d.]+/g).map(Number); return {rgb: m.slice(0, 3), a: m.length > 3 ? m[3] : 1}; };
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
                               return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const out = {};
  for (const sel of selectors) {
    const el = document.querySelector(sel);
    if (!el) { out[sel] = null; continue; }
    const fg = parse(getComputedStyle(el).color);
    let node = el, bg = null;
    while (node && node.nodeType === 1) {
      const c = parse(getComputedStyle(node).backgroundColor);
      if (c.a >= 0.99) { bg = c; break; }
      node = node.parentElement;
    }
    if (!bg) bg = parse(getComputedStyle(document.documentElement).backgroundColor);
    const [hi, lo] = [lum(fg.rgb), lum(bg.rgb)].sort((a, b) => b - a);
    out[sel] = {ratio: (hi + 0.05) / (lo + 0.05), fg: getComputedStyle(el).color, bg: `rgb(${bg.rgb})`, alpha: fg.a};
  }
  return out;
}
"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_chip_has_aa_contrast_in_both_colour_schemes(open_styled, orm, settings, scheme):
    _board_of_every_kind(orm, settings)
    page = open_styled(1800, 1000, scheme)
    expect(settled(page, "expiring", "RUNNING").locator(".lease.bad")).to_be_visible(timeout=5000)
    expect(page.locator('#problems li.problem[data-code="dead_dep"]')).to_have_count(1)
    expect(card(page, "after-done").locator(".dep.done")).to_be_visible()
    expect(card(page, "blocked").locator(".dep.todo")).to_be_visible()
    # A dependency the page has not heard of yet is drawn "unknown" until the API answers:
    # drawn here on a card so that its colours are measured too.
    page.evaluate("""() => { const li = document.createElement('li'); li.className = 'dep unknown';
                      li.textContent = '? elsewhere'; document.querySelector('.card .deps').append(li); }""")
    dark = page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches")
    assert dark == (scheme == "dark")
    measured = page.evaluate(CONTRAST_JS, CHIPS)
    missing = [sel for sel, m in measured.items() if m is None]
    assert missing == [], f"no element to measure for {missing}"
    low = {sel: m for sel, m in measured.items() if m["ratio"] < 4.5 or m["alpha"] < 1}
    assert low == {}, json.dumps(low, indent=1)
    page.screenshot(path=str(SCREENSHOTS.mkdir(exist_ok=True) or SCREENSHOTS / f"board-{scheme}.png"))


# ---------------------------------------------------------------------------------------------
# 5. A new board says what to do next


def test_an_empty_board_says_how_to_get_tasks_and_the_hints_go_as_tasks_come(open_board, orm):
    page = open_board()
    hint = page.locator("#empty-board")
    expect(hint).to_be_visible(timeout=ARRIVAL)
    expect(hint).to_contain_text("manage.py demo")
    expect(hint).to_contain_text("create_agent_key")
    expect(hint.locator('a[href="/api/docs"]')).to_be_visible()
    queued = page.locator('.column[data-stage="QUEUED"] .empty-hint')
    expect(queued).to_be_visible()
    expect(queued).to_contain_text("claim")

    orm(transitions.create, TaskSpec(id="first", title="the first task"))
    expect(card(page, "first")).to_be_visible(timeout=ARRIVAL)
    expect(hint).to_be_hidden()
    expect(queued).to_be_hidden()
    expect(page.locator('.column[data-stage="RUNNING"] .empty-hint')).to_be_visible()
