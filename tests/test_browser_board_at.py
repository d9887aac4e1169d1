"""The board at any moment (issue 33, item 4) in a real browser (Debian's Chromium, Playwright)
against a real board server on the test database: a link /board/?at=<moment> opens the board as it
was then (a card in its old stage, the banner, the counts then, nothing to act with); a step one
event forward shows the next move (the claim, with its owner); the date-time field goes to a
moment before the task existed (the card absent); Live shows the live board again, the card in
its stage now, and the URL loses its moment; Play at 60x reaches now and returns to live. After
the prune deleted an old finished task, a moment before the history's horizon says it is not exact.

The screenshot of docs/screenshots/board-at.png is taken here (TASKFLOW_SCREENSHOTS=1 writes it).
The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` with a bound, never a sleep."""
# ruff: noqa: F811
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from django.utils import timezone

from board.engine import retention, transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures, found by pytest by name)
    browser,
    open_board,
    orm,
    server,
)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]
WAIT = 15_000
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"  # TASKFLOW_SCREENSHOTS=1 writes board-at.png


def make_history():
    """job-1 and job-2 created together (the moment the link shows), then job-1 claimed by
    agent-7 (the next event) and completed; around them, a small plan that moved on since."""
    transitions.create([TaskSpec(id="lint", title="lint"), TaskSpec(id="flaky", title="flaky", max_retries=0)],
                       actor="seed")
    lint = transitions.claim("lint", "agent-2", 600)
    flaky = transitions.claim("flaky", "agent-3", 600)
    transitions.create([TaskSpec(id="job-1", title="build"), TaskSpec(id="job-2", title="docs"),
                        TaskSpec(id="job-3", title="deploy", deps=("job-1",))], actor="seed")
    created = TaskEvent.objects.filter(task_id="job-1", verb="create").values_list("at", flat=True).get()
    claim = transitions.claim("job-1", "agent-7", 600)
    transitions.fail("flaky", flaky.lease.token, "boom", retryable=False)
    transitions.complete("job-1", claim.lease.token, {"ok": True})
    transitions.complete("lint", lint.lease.token, {"ok": True})
    return created


def test_a_link_to_a_moment_shows_the_card_in_its_old_stage_then_back_to_live(open_board, orm, server):
    created = orm(make_history)
    page = open_board()
    live = page.locator('#columns .column[data-stage="COMPLETED"] .card[data-id="job-1"]')
    expect(live).to_be_visible(timeout=WAIT)
    expect(page.locator("#time-control")).to_have_attribute("data-mode", "live")

    # The shareable link: the board as it was when job-1 was created.
    at = created.isoformat().replace("+00:00", "Z")
    page.goto(f"{server.url}/board/?at={at}")
    past = page.locator("#moment-columns")
    expect(past).to_have_attribute("data-drawn", at.replace("Z", "").split(".")[0] + "." + f"{created.microsecond:06d}Z", timeout=WAIT)
    expect(past.locator('.moment-column[data-stage="QUEUED"] .card[data-id="job-1"]')).to_be_visible()
    expect(past.locator('.moment-column[data-stage="QUEUED"] .count')).to_have_text("2")
    expect(past.locator('.moment-column[data-stage="PENDING"] .count')).to_have_text("1")
    expect(past.locator('.moment-column[data-stage="RUNNING"] .count')).to_have_text("2")
    expect(past.locator('.moment-column[data-stage="COMPLETED"] .count')).to_have_text("0")
    expect(page.locator("#moment-banner")).to_be_visible()
    expect(page.locator("#moment-banner")).to_contain_text("Board as it was at")
    expect(page.locator("#moment-banner")).to_have_attribute("data-exact", "true")
    expect(page.locator("#columns")).to_be_hidden()  # the live board, out of sight
    expect(page.locator("#time-control")).to_have_attribute("data-mode", "past")
    assert past.locator("button, [draggable=true]").count() == 0  # read-only
    page.screenshot(path="/tmp/board-at-past.png")

    # One event forward: the claim, with its owner.
    page.locator("#time-forward").click()
    running = past.locator('.moment-column[data-stage="RUNNING"] .card[data-id="job-1"]')
    expect(running).to_be_visible(timeout=WAIT)
    expect(running).to_have_attribute("data-owner", "agent-7")
    expect(running).to_have_attribute("data-version", "1")
    assert "at=" in page.url
    page.screenshot(path=str(SHOTS / "board-at.png") if os.environ.get("TASKFLOW_SCREENSHOTS") else "/tmp/board-at-step.png")

    # The date-time field: an hour before, when no task existed.
    before = created - timedelta(hours=1)
    local = page.evaluate("(ms) => { const d = new Date(ms); const p = (n) => String(n).padStart(2, '0');"
                          " return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:"
                          "${p(d.getMinutes())}:${p(d.getSeconds())}`; }", before.timestamp() * 1000)
    page.locator("#time-at").fill(local)
    page.locator("#time-at").dispatch_event("change")
    expect(past.locator(".card")).to_have_count(0, timeout=WAIT)
    expect(past.locator('.moment-column[data-stage="QUEUED"] .count')).to_have_text("0")

    # Live: the live board again, the card where it is now.
    page.locator("#time-live").click()
    expect(page.locator("#columns")).to_be_visible()
    expect(past).to_be_hidden()
    expect(page.locator("#moment-banner")).to_be_hidden()
    expect(page.locator('#columns .column[data-stage="COMPLETED"] .card[data-id="job-1"]')).to_be_visible()
    assert "at=" not in page.url
    page.screenshot(path="/tmp/board-at-live.png")
    # Play at 60x from a moment a few seconds back: it reaches now and returns to live.
    page.goto(f"{server.url}/board/?at={at}")
    expect(page.locator("#time-control")).to_have_attribute("data-mode", "past", timeout=WAIT)
    page.locator("#time-speed").select_option("60")
    page.locator("#time-play").click()
    expect(page.locator("#time-control")).to_have_attribute("data-mode", "live", timeout=WAIT)
    expect(page.locator("#columns")).to_be_visible()


def age_and_prune():
    """An old finished task deleted by the prune: the history is whole only from its last row."""
    transitions.create(TaskSpec(id="old", title="old"))
    claim = transitions.claim("old", "agent-1", 60)
    transitions.complete("old", claim.lease.token, {"ok": True})
    when = timezone.now() - timedelta(days=40)
    Task.objects.filter(pk="old").update(updated_at=when, stage_changed_at=when)
    TaskEvent.objects.filter(task_id="old").update(at=when)
    transitions.create(TaskSpec(id="new", title="new"))
    retention.prune()
    return when


def test_a_moment_before_the_history_horizon_says_it_is_not_exact(open_board, orm, server):
    when = orm(age_and_prune)
    page = open_board()
    before = (when - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    page.goto(f"{server.url}/board/?at={before}")
    banner = page.locator("#moment-banner")
    expect(banner).to_have_attribute("data-exact", "false", timeout=WAIT)
    expect(banner.locator(".moment-inexact")).to_contain_text("not exact")
    page.screenshot(path="/tmp/board-at-inexact.png")
