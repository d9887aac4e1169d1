"""The attempt timeline and the agents and throughput panel in a real browser (Debian's Chromium,
Playwright) against the real server: a task failed twice, retried and completed shows three
attempts with each failure's own error (and traceback); the panel is filled and updated from
the board's websocket alone (the page never asks the API for it). Waits are Playwright's
`expect(...)` with a bound, never a sleep."""
from __future__ import annotations

import os
import re

import pytest

from board.engine import transitions, usage
from board.models import Task
from board.engine.transitions import TaskSpec
from tests.support import end_backoff, sqlite_db_mark
from tests.test_browser import SLOW, browser, open_board, orm, server  # noqa: F401  (fixtures)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]


def fail_retry_complete():
    transitions.create(TaskSpec(id="flaky", title="fails twice", queue="jobs", max_retries=3))
    lease = transitions.claim("flaky", "worker-1", 60).lease
    transitions.renew("flaky", lease.token, 60)
    transitions.renew("flaky", lease.token, 60)
    transitions.fail("flaky", lease.token, "ConnectionError: database away",
                     traceback="Traceback (most recent call last):\n  File \"job.py\", line 3, in run\nConnectionError")
    end_backoff("flaky")
    lease = transitions.claim("flaky", "worker-2", 60).lease
    transitions.fail("flaky", lease.token, "ValueError: bad row 17")
    end_backoff("flaky")
    lease = transitions.claim("flaky", "worker-1", 60).lease
    transitions.complete("flaky", lease.token, {"rows": 42})


def test_the_attempt_timeline_shows_three_attempts_with_their_own_errors(open_board, orm):
    page = open_board()
    orm(fail_retry_complete)
    # Clicked where it ends (a card clicked while the changes still move it may be missed).
    page.locator('.column[data-stage="COMPLETED"] .card[data-id="flaky"]').click()
    attempts = page.locator("#details .attempts .attempt")
    expect(attempts).to_have_count(3, timeout=SLOW)
    expect(page.locator("#details .attempts h3")).to_have_text("Attempts (3)")
    first, second, third = attempts.nth(0), attempts.nth(1), attempts.nth(2)
    expect(first).to_have_attribute("data-outcome", "failed")
    expect(first.locator(".attempt-head")).to_contain_text("worker-1")
    expect(first.locator(".attempt-meta")).to_contain_text("2 heartbeats")
    expect(first.locator(".attempt-error")).to_have_text("ConnectionError: database away")
    expect(first.locator(".attempt-outcome")).to_contain_text("retried after")
    traceback = first.locator("details.attempt-traceback")
    expect(traceback.locator("pre")).to_be_hidden()
    traceback.locator("summary").click()
    expect(traceback.locator("pre")).to_contain_text('File "job.py", line 3, in run')
    expect(second).to_have_attribute("data-outcome", "failed")
    expect(second.locator(".attempt-head")).to_contain_text("worker-2")
    expect(second.locator(".attempt-error")).to_have_text("ValueError: bad row 17")
    expect(second.locator("details")).to_have_count(0)
    expect(third).to_have_attribute("data-outcome", "completed")
    expect(third.locator(".attempt-meta")).to_contain_text("0 heartbeats")
    expect(third.locator(".attempt-error")).to_have_count(0)


def test_the_agents_and_throughput_panel_receives_live_data_from_the_socket(open_board, orm):
    api_calls = []

    def watch(page):
        page.on("request", lambda request: api_calls.append(request.url) if "/api/" in request.url else None)

    orm(lambda: transitions.create([TaskSpec(id=f"job-{i}", title="job", queue="batch") for i in range(3)]))
    held = orm(lambda: transitions.claim("job-0", "agent-7", 600).lease)
    page = open_board(before_load=watch)
    panel = page.locator("#insights")
    agent_row = panel.locator('tr[data-agent="agent-7"]')
    expect(agent_row.locator(".holds")).to_have_text("job-0", timeout=SLOW)
    expect(agent_row.locator(".completed")).to_have_text("0")
    expect(agent_row.locator(".usage")).to_have_text("—")  # no report yet: missing, not 0
    expect(panel.locator('svg.chart[data-queue="batch"]')).to_have_attribute("data-depth", "2")
    expect(panel).to_have_attribute("data-completed", "0")

    def complete_with_usage():
        # Reported before the complete (as with a renew's report): the panel's recomputation that
        # the complete's history row starts reads it.
        task = Task.objects.get(pk="job-0")
        usage.record(task, held.fence, "agent-7", usage.checked({"input_tokens": 12000, "output_tokens": 345,
                                                                 "cost_usd": 0.42}))
        transitions.complete("job-0", held.token, {})

    orm(complete_with_usage)
    expect(panel).to_have_attribute("data-completed", "1", timeout=SLOW)
    expect(agent_row.locator(".completed")).to_have_text("1")
    expect(agent_row.locator(".usage")).to_have_text("12.3k")
    expect(agent_row.locator(".usage")).to_have_attribute("title", "12,000 in + 345 out tokens · $0.42")
    if os.environ.get("TASKFLOW_SCREENSHOTS"):  # looked at, not kept: the agents table with a usage column
        panel.screenshot(path="/tmp/insights-agents.png")
    expect(agent_row.locator(".holds")).to_have_text("—")
    expect(panel.locator("svg.throughput rect.completed")).to_have_count(1)

    def fail_one():
        lease = transitions.claim("job-1", "agent-8", 600).lease
        transitions.fail("job-1", lease.token, "boom", retryable=False)

    orm(fail_one)
    expect(panel).to_have_attribute("data-failed", "1", timeout=SLOW)
    expect(panel.locator('tr[data-agent="agent-8"] .failed')).to_have_text("1")
    expect(panel.locator('svg.chart[data-queue="batch"]')).to_have_attribute("data-depth", "1")
    expect(panel.locator("svg.throughput rect.failed")).to_have_count(1)
    assert not [url for url in api_calls if re.search(r"insights|agents|throughput", url)], api_calls
    assert api_calls == [], api_calls  # the panel is fed by the socket alone
