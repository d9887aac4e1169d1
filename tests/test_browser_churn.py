"""The insights panel under a churn in a real browser (Debian's Chromium, Playwright) against the
real server: tasks created, claimed and completed by agent threads while the board is open, and
the page logs no console error (a chart bar drawn with a negative height did).

A module of its own, so its own server: the churn's figures (its queues' wait and run times,
which a process keeps 15 s: board.live.insights.TIMING_MAX_AGE) never reach the exact charts of
tests/test_browser_charts.py, which a shared server showed them for up to 15 s."""
from __future__ import annotations

import pytest

from tests.support import sqlite_db_mark
from tests.test_browser import SLOW, browser, open_board, orm, server  # noqa: F401  (fixtures)
from tests.test_insights import churn

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]


def watch_console(seen: list[str]):
    """A before_load hook: every console error (and warning) the page logs goes to `seen`."""
    def watch(page):
        page.on("console", lambda message: seen.append(f"{message.type}: {message.text}")
                if message.type in ("error", "warning") else None)
    return watch


def test_a_churn_while_the_board_is_open_logs_no_console_error(open_board):
    """Before the panel's reads shared one snapshot: "Error: <rect> attribute height: A negative
    value is not valid. ("-0.26490066225165565")", 59 times."""
    seen: list[str] = []
    page = open_board(before_load=watch_console(seen))
    panel = page.locator("#insights")
    expect(panel).to_have_attribute("data-updates", "1", timeout=SLOW)
    errors = churn(agents=6, rounds=300)  # about 15 s: five or more of the panel's recomputations
    assert errors == [], errors
    # The panel redrew with the churn's figures (each of the 1,800 rounds completed one task).
    expect(panel).to_have_attribute("data-completed", "1800", timeout=SLOW)
    assert int(panel.get_attribute("data-updates")) >= 3
    assert seen == [], seen
