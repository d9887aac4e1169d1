"""Bulk actions from the board (issue 33, item 1) in a real browser (Debian's Chromium, Playwright)
against a real board server on the test database: an operator filters the board (`queue:ci-*`),
clicks "Act on all N matching…" (the count over every task, not only the cards loaded), confirms
"Cancel N tasks in queue ci-*" in the dialog (two clicks from the filter), watches the
progress pushed over the socket, stops a first job midway, runs a second to its end, and reads
the summary; a user who may not intervene has no such button.

The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` / `wait_for_function` with a bound, never a sleep."""
# ruff: noqa: F811
from __future__ import annotations

import re
import time

import pytest

from board.engine.transitions import TaskSpec
from board.engine import transitions
from board.models import BulkJob, Task
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

N = 2400  # tasks in queues ci-*: enough for the job to take a few seconds, its progress seen on the way
JOB = 60_000  # ms: a job makes progress (or a page gets ready) within this on a loaded machine


def wait_for_the_end(panel, state: str = "done"):
    """Until the panel's job is in `state`. It fails when the job's count of tasks done stops
    moving for JOB ms, not after a fixed total: on a loaded two-core CI machine a job of N tasks
    moved at 12 tasks/s (2026-12-04), so its whole run is no bound, but a stall is a bug."""
    done, moved_at = None, time.monotonic()
    while True:
        try:
            expect(panel).to_have_attribute("data-state", state, timeout=2000)
            return
        except AssertionError:
            now_done = panel.get_attribute("data-done")
            if now_done != done:
                done, moved_at = now_done, time.monotonic()
            elif time.monotonic() - moved_at > JOB / 1000:
                raise AssertionError(f"the job stalled at {done} done (state {panel.get_attribute('data-state')!r})")


def make_tasks():
    for start in range(0, N, 800):
        transitions.create([TaskSpec(id=f"ci-{i:05d}", title=f"build {i}", queue="ci-a" if i % 2 else "ci-b")
                            for i in range(start, start + 800)])
    transitions.create([TaskSpec(id=f"doc-{i}", title="docs", queue="docs") for i in range(20)])


def test_bulk_cancel_from_the_board_with_progress_stop_and_summary(open_board, orm):
    orm(make_tasks)
    watcher = open_board(superuser=False)  # board.view_task only: no bulk button
    page = open_board()
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=JOB)
    bulk_open = page.locator("#bulk-open")
    expect(bulk_open).to_be_hidden()  # no filter, no button

    page.locator("#filter-text").fill("queue:ci-*")
    expect(bulk_open).to_have_text(f"Act on all {N:,} matching…", timeout=10_000)
    expect(watcher.locator("body")).to_have_attribute("data-can-intervene", "false")
    watcher.locator("#filter-text").fill("queue:ci-*")
    expect(watcher.locator("#bulk-open")).to_be_hidden()

    # Click 1: the dialog counts over every task; click 2: confirm with that sentence.
    bulk_open.click()
    dialog = page.locator("#bulk-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".bulk-count")).to_have_attribute("data-total", str(N), timeout=10_000)
    confirm = dialog.locator("button.bulk-confirm")
    expect(confirm).to_have_text(f"Cancel {N:,} tasks in queue ci-*")
    dialog.locator("textarea[name=reason]").fill("bad runner image")
    page.screenshot(path="/tmp/bulk-dialog.png")
    confirm.click()
    panel = page.locator("#bulk")
    expect(panel).to_be_visible(timeout=5000)
    first = int(panel.get_attribute("data-job"))

    # Progress comes over the socket: a frame with some done and not all, then Stop.
    page.wait_for_function(
        f"() => {{ const p = document.getElementById('bulk'); const d = +p.dataset.done;"
        f" return p.dataset.state === 'running' && d > 0 && d < {N}; }}", timeout=JOB)
    page.screenshot(path="/tmp/bulk-progress.png")
    panel.locator("button.bulk-stop").click()
    expect(panel).to_have_attribute("data-state", "stopped", timeout=JOB)
    expect(panel.locator(".bulk-summary")).to_contain_text(re.compile(r"Stopped after [\d,]+ of 2,400 tasks\."))
    stopped = orm(lambda: BulkJob.objects.get(pk=first))
    cancelled = orm(lambda: Task.objects.filter(stage="CANCELLED").count())
    assert stopped.state == "stopped" and 0 < stopped.done == cancelled < N
    assert stopped.done + stopped.skipped + stopped.lost == stopped.position
    assert int(panel.get_attribute("data-done")) == stopped.done

    # Again, to the end: the count is now what is left, and the summary says what happened.
    panel.locator("button.bulk-close").click()
    expect(bulk_open).to_have_text(f"Act on all {N:,} matching…")  # the cancelled ones still match
    bulk_open.click()
    expect(dialog.locator(".bulk-count")).to_have_attribute("data-total", str(N - cancelled), timeout=10_000)
    expect(dialog.locator(".bulk-count")).to_contain_text(f"{cancelled:,} more match")
    dialog.locator("button.bulk-confirm").click()
    wait_for_the_end(panel)
    assert watcher.locator("#bulk").is_hidden()  # no rights: no panel either
    expect(panel.locator(".bulk-summary")).to_have_text(
        f"Finished: {N - cancelled:,} tasks. Cancelled: {N - cancelled:,}. Skipped: 0. "
        "Lost a race (changed meanwhile, left as they were): 0. Check: no problem on the board.")
    assert int(panel.get_attribute("data-updates")) >= 2
    page.screenshot(path="/tmp/bulk-done.png")
    stages = orm(lambda: dict(Task.objects.values_list("queue", "stage").distinct()))
    assert orm(lambda: Task.objects.filter(queue__startswith="ci-").exclude(stage="CANCELLED").count()) == 0
    assert stages["docs"] == "QUEUED"
