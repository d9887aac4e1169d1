"""The insights panel's charts in a real browser (Debian's Chromium, Playwright) against the real
server: the charts share one scale per panel, carry axes and print the latest value, and the
last hour's wait and run times are exact (the churn is in tests/test_browser_churn.py, with a
server of its own). Waits are Playwright's `expect(...)` with a bound."""
from __future__ import annotations

import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest

from board.engine import transitions
from board.engine.transitions import TaskSpec
from tests.support import sqlite_db_mark
from tests.test_browser import SLOW, browser, open_board, orm, server  # noqa: F401  (fixtures)
from tests.test_browser_churn import watch_console
from tests.test_insights import Script

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

# ---------------------------------------------------------------------------------------------
# Readable charts: one scale for every queue, axes, bars a few px wide, the latest value printed

SHOTS = Path(os.environ.get("TASKFLOW_SCREENSHOTS", tempfile.gettempdir()))  # docs/screenshots to commit them


def seed_an_hour():
    """ingest: 796 tasks queued 50 min ago, 10 of them claimed one every 2 min from 40 min ago
    (waits 10, 12, .. 28 min), each completed a minute later (runs 1 min) but 2 that failed for
    good: 786 left; ux: 2 queued 15 min ago. Rows stamped minutes ago, in time order."""
    from django.utils import timezone

    now = timezone.now()
    s = Script("default")

    def at(minutes_ago, step):
        return s.at(now - timedelta(minutes=minutes_ago), step)

    at(50, lambda: transitions.create([TaskSpec(id=f"in-{i:03}", title="ingest", queue="ingest") for i in range(796)]))
    for k in range(10):
        lease = at(40 - 2 * k, lambda k=k: transitions.claim(f"in-{k:03}", "loader", 3600)).lease
        if k in (3, 7):
            at(39 - 2 * k, lambda k=k, lease=lease: transitions.fail(f"in-{k:03}", lease.token, "bad row", retryable=False))
        else:
            at(39 - 2 * k, lambda k=k, lease=lease: transitions.complete(f"in-{k:03}", lease.token, {}))
    at(15, lambda: transitions.create([TaskSpec(id=f"ux-{i}", title="ux", queue="ux") for i in range(2)]))


def bars(chart) -> list[dict]:
    return chart.locator("rect").evaluate_all("(rects) => rects.map((r) => ({h: r.getBBox().height, w: r.getBBox().width}))")


def test_the_charts_share_one_scale_carry_axes_and_print_the_latest_value(open_board, orm):
    orm(seed_an_hour)
    seen: list[str] = []
    page = open_board(before_load=watch_console(seen), width=1600, height=1000)
    panel = page.locator("#insights")
    ingest, ux = panel.locator('svg.chart[data-queue="ingest"]'), panel.locator('svg.chart[data-queue="ux"]')
    expect(ingest).to_have_attribute("data-depth", "786", timeout=SLOW)
    expect(ux).to_have_attribute("data-depth", "2")

    # One scale for both queues: a round top above 796 (the most ingest held), ux's bars 2/796 of
    # ingest's tallest (1 px at the least).
    assert ingest.get_attribute("data-top") == ux.get_attribute("data-top") == "800"
    tallest = max(bar["h"] for bar in bars(ingest))
    assert max(bar["h"] for bar in bars(ux)) == pytest.approx(max(1, tallest * 2 / 800), abs=0.01)
    assert tallest == pytest.approx(796 / 800 * 37, abs=0.01)  # 60 px less the margins: 37 px of plot
    # Axes: round ticks up the y axis (a grid line each 200, labelled each 400 in 37 px), times
    # along the x axis, and "now" at its end.
    assert ingest.locator("text.tick.y").all_text_contents() == ["0", "400", "800"]
    assert ingest.locator("line.grid").count() == 4
    times = ingest.locator("text.tick.x").all_text_contents()
    assert times[-1] == "now" and len(times) >= 4
    assert all(re.fullmatch(r"\d\d:\d\d", t) for t in times[:-1]), times
    # Bars a few px wide; the latest value printed beside the last bar.
    assert min(bar["w"] for bar in bars(ingest) + bars(panel.locator("svg.throughput"))) >= 4
    expect(ingest.locator("text.latest")).to_have_text("786")
    expect(ux.locator("text.latest")).to_have_text("2")
    expect(panel.locator("svg.throughput text.latest")).to_have_text("0")
    expect(panel).to_have_attribute("data-completed", "8")
    expect(panel).to_have_attribute("data-failed", "2")

    # The last hour's waits and runs: ingest's ten waits 10, 12, .. 28 min (p50 the 5th: 18 min,
    # p95 the 10th), its runs all 1 min.
    row = panel.locator('table.timing tr[data-queue="ingest"]')
    expect(row.locator(".wait-p50")).to_have_text("18m 00s")
    expect(row.locator(".wait-p95")).to_have_text("28m 00s")
    expect(row.locator(".run-p50")).to_have_text("1m 00s")
    expect(row.locator(".run-p95")).to_have_text("1m 00s")

    panel.screenshot(path=str(SHOTS / "charts-desktop.png"))
    dark = open_board(before_load=watch_console(seen), width=1600, height=1000, color_scheme="dark")
    expect(dark.locator('#insights svg.chart[data-queue="ingest"]')).to_have_attribute("data-depth", "786", timeout=SLOW)
    dark.locator("#insights").screenshot(path=str(SHOTS / "charts-dark.png"))
    assert seen == [], seen
