"""The plan as a graph (issue 33, item 3): /board/graph/ in a real browser (Debian's Chromium,
Playwright) against the real server, and its data endpoint. Waits are Playwright's `expect`
with a bound, never a sleep. TASKFLOW_SCREENSHOTS=1 writes docs/screenshots/graph-*.png."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from board.engine import transitions
from board.engine.transitions import TaskSpec
from tests.support import sqlite_db_mark
from tests.test_browser import SLOW, browser, open_page, orm, server  # noqa: F401  (fixtures)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def three_levels():
    """fetch <- (parse, index) <- report <- publish, and an unrelated task; fetch completed, parse
    running, the rest waiting."""
    transitions.create([
        TaskSpec(id="fetch", title="fetch the pages"),
        TaskSpec(id="parse", title="parse them", deps=["fetch"]),
        TaskSpec(id="index", title="index them", deps=["fetch"]),
        TaskSpec(id="report", title="write the report", deps=["parse", "index"]),
        TaskSpec(id="publish", title="publish it", deps=["report"]),
        TaskSpec(id="elsewhere", title="another plan"),
    ])
    transitions.complete("fetch", transitions.claim("fetch", "agent-1", 60).lease.token, {"pages": 3})
    return transitions.claim("parse", "agent-2", 600).lease.token


def test_the_graph_of_a_three_level_plan_marks_the_critical_path_and_follows_the_tasks(open_page, orm):
    parse_token = orm(three_levels)
    page = open_page("/board/graph/?root=index")
    graph = page.locator("#graph-page")
    expect(graph).to_have_attribute("data-drawn", "5", timeout=SLOW)  # the whole plan, not "elsewhere"
    nodes = page.locator("svg .node")
    assert sorted(nodes.evaluate_all("gs => gs.map(g => g.dataset.id)")) == ["fetch", "index", "parse", "publish", "report"]
    expect(page.locator("svg .edge")).to_have_count(5)
    expect(page.locator('.node[data-id="fetch"]')).to_have_attribute("data-stage", "COMPLETED")
    expect(page.locator('.node[data-id="parse"]')).to_have_attribute("data-stage", "RUNNING")
    expect(page.locator('.node[data-id="parse"] .node-stage')).to_have_text("RUNNING · agent-2")
    # Left to right by dependency: fetch, then parse and index, then report, then publish.
    x = {i: page.locator(f'.node[data-id="{i}"]').evaluate("g => g.transform.baseVal[0].matrix.e")
         for i in ("fetch", "parse", "index", "report", "publish")}
    assert x["fetch"] < x["parse"] == x["index"] < x["report"] < x["publish"], x
    # The critical path: the longest chain of unfinished tasks (three of them; fetch is done).
    critical = page.locator(".node.critical").evaluate_all("gs => gs.map(g => g.dataset.id)")
    assert len(critical) == 3 and {"report", "publish"} < set(critical) and "fetch" not in critical, critical
    expect(page.locator(".graph-summary")).to_contain_text("5 tasks · 5 dependencies")
    if os.environ.get("TASKFLOW_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "graph.png"), full_page=False)
    # What blocks publish: report, parse and index (not fetch: done).
    page.locator('.node[data-id="publish"]').click()
    expect(page.locator(".graph-selected")).to_contain_text("publish waits on")
    assert sorted(page.locator(".node.blocker").evaluate_all("gs => gs.map(g => g.dataset.id)")) == [
        "index", "parse", "report"]
    # Live: parse completes; its box turns COMPLETED without a reload, index and report stay.
    orm(transitions.complete, "parse", parse_token, {})
    expect(page.locator('.node[data-id="parse"]')).to_have_attribute("data-stage", "COMPLETED", timeout=SLOW)
    expect(page.locator('.node[data-id="index"]')).to_have_attribute("data-stage", "QUEUED")
    # Double-click opens a task's page.
    page.locator('.node[data-id="report"]').dblclick()
    expect(page.locator(".details-title")).to_have_text("report: write the report", timeout=SLOW)


def test_a_500_task_plan_is_drawn_whole_and_fits_the_window(open_page, orm):
    """Ten stages of fifty tasks, each waiting for two neighbours of the stage before. How long the page
    took to draw it is printed (the figure the closing note quotes; not asserted: speed is for
    benchmarks)."""
    def big():
        specs = []
        for level in range(10):
            for i in range(50):
                deps = [] if level == 0 else [f"t{level - 1}-{i}", f"t{level - 1}-{(i + 1) % 50}"]
                specs.append(TaskSpec(id=f"t{level}-{i}", title=f"step {level} part {i}", deps=sorted(set(deps))))
        transitions.create(specs)

    orm(big)
    page = open_page("/board/graph/?root=t0-0", width=1600, height=1000)
    graph = page.locator("#graph-page")
    expect(graph).to_have_attribute("data-drawn", "500", timeout=SLOW)
    expect(page.locator("svg .node")).to_have_count(500)
    assert page.locator("svg .edge").count() == 2 * 50 * 9
    print(f"\n500-task plan drawn {graph.get_attribute('data-drawn-ms')} ms after the page started")
    # Fitted: the whole drawing is inside the view.
    box = page.locator("svg.graph").bounding_box()
    drawn = page.locator(".graph-world").bounding_box()
    assert drawn["x"] >= box["x"] - 1 and drawn["x"] + drawn["width"] <= box["x"] + box["width"] + 1
    assert drawn["y"] >= box["y"] - 1 and drawn["y"] + drawn["height"] <= box["y"] + box["height"] + 1
    # Zoomed in with the button, a task's text is readable size again.
    for _ in range(6):
        page.locator(".graph-zoom-in").click()
    assert page.locator('.node[data-id="t5-5"] rect').bounding_box()["width"] > 100
    if os.environ.get("TASKFLOW_SCREENSHOTS"):
        page.locator(".graph-fit").click()
        page.screenshot(path=str(SHOTS / "graph-500.png"), full_page=False)
