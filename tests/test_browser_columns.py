"""Columns longer than a page, in a real browser (Debian's Chromium, Playwright) against the real
server (issue 31): the snapshot brings each column's first page (board.live.reads.COLUMN_PAGE)
and every count; scrolling a column to its end loads the next page; a change past a column's
window changes its count only, and its card shows once the column is scrolled to it; changes
land in the right place; the counts stay exact however many of the moved tasks the page holds.
The protocol's rules: docs/live-protocol.md ("Applying frames")."""
from __future__ import annotations

import pytest
from django.utils import timezone

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live.reads import COLUMN_PAGE
from board.models import Task
from tests.support import sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures)
    COLUMN_HOLDS, SLOW, browser, card, count, expected_order, open_board, orm, scroll_to_end, server,
)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

QUEUED = '.column[data-stage="QUEUED"]'


def shown_ids(page, stage: str) -> list[str]:
    """The ids the column holds, in order: its cards', and those a chunk far from the column's
    view keeps in place of its cards (static/board/render.js, virtualized columns)."""
    return page.locator(f'.column[data-stage="{stage}"] .cards').evaluate(COLUMN_HOLDS)


def db_column(stage: str) -> list[str]:
    order = ("-updated_at", "-id") if stage in ("COMPLETED", "FAILED", "CANCELLED") else ("claim_rank", "id")
    return list(Task.objects.filter(stage=stage).order_by(*order).values_list("id", flat=True))


def test_a_long_column_shows_its_first_page_then_the_rest_as_it_is_scrolled(open_board, orm):
    total = 2 * COLUMN_PAGE + 50
    orm(transitions.create, [TaskSpec(id=f"q{i:03d}", title=f"queued {i}") for i in range(total)])
    page = open_board()
    expect(count(page, "QUEUED")).to_have_text(str(total))
    expect(page.locator(f"{QUEUED} .card")).to_have_count(COLUMN_PAGE)
    assert shown_ids(page, "QUEUED") == [f"q{i:03d}" for i in range(COLUMN_PAGE)]  # the claim order's first
    expect(page.locator(f"{QUEUED} .show-more")).to_have_text(f"show more ({total - COLUMN_PAGE} more)")

    # Changes past the window: the counts follow, no card appears (and none is lost).
    beyond = [f"q{i:03d}" for i in range(total - 10, total)]

    def finish_beyond():
        for task_id in beyond:
            held = transitions.claim(task_id, "agent-1", 60)
            transitions.complete(task_id, held.lease.token, {"ok": True})
        transitions.create([TaskSpec(id=f"late{i}", title="at the back") for i in range(3)])
        transitions.create(TaskSpec(id="urgent", title="to the front", priority=10))
        transitions.claim("q000", "agent-2", 60)  # inside the window: its card moves

    orm(finish_beyond)
    expect(count(page, "QUEUED")).to_have_text(str(total - 10 + 3 + 1 - 1))
    expect(count(page, "COMPLETED")).to_have_text("10")
    expect(card(page, "q000", "RUNNING")).to_be_visible()
    expect(card(page, "urgent", "QUEUED")).to_be_visible()
    assert shown_ids(page, "QUEUED")[0] == "urgent"
    assert shown_ids(page, "COMPLETED") == list(reversed(beyond))
    # Past the window: neither the late ones nor the tasks of the next page are drawn yet.
    assert not set(shown_ids(page, "QUEUED")) & {"late0", "late1", "late2", f"q{COLUMN_PAGE + 1:03d}"}

    # Scrolled to its end, the column loads page after page until it holds exactly the column.
    scroll_to_end(page, "QUEUED")
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")
    assert len(shown_ids(page, "QUEUED")) == total - 10 + 3
    # A change at the bottom of the (now whole) column lands there.
    orm(transitions.create, TaskSpec(id="last", title="newest"))
    expect(card(page, "last", "QUEUED")).to_be_visible()
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")


def test_a_change_below_the_window_counts_at_once_and_shows_its_card_when_scrolled_to(open_board, orm):
    orm(transitions.create, [TaskSpec(id=f"w{i:03d}", title=f"waiting {i}") for i in range(COLUMN_PAGE + 40)])
    page = open_board()
    expect(page.locator(f"{QUEUED} .card")).to_have_count(COLUMN_PAGE)
    far = f"w{COLUMN_PAGE + 20:03d}"
    # Its title changes (an edit: a new version) while the page does not show it.
    orm(transitions.edit, far, actor="op", version=0, title="edited while away")
    orm(transitions.cancel, f"w{COLUMN_PAGE + 30:03d}", actor="op")
    expect(count(page, "QUEUED")).to_have_text(str(COLUMN_PAGE + 39))
    expect(count(page, "CANCELLED")).to_have_text("1")
    expect(card(page, far)).to_have_count(0)
    scroll_to_end(page, "QUEUED")
    expect(card(page, far, "QUEUED").locator(".card-title")).to_have_text("edited while away")
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")


def test_a_column_loads_no_page_while_the_board_at_a_past_moment_is_shown(open_board, orm, server):
    """The live columns are not drawn then (their cards measure nothing): a column whose window
    claims emptied loads its next page once the live board shows again, not before."""
    orm(transitions.create, [TaskSpec(id=f"m{i:03d}", title=f"moment {i}") for i in range(COLUMN_PAGE + 30)])
    page = open_board()
    expect(page.locator(f"{QUEUED} .card")).to_have_count(COLUMN_PAGE)
    at = orm(lambda: timezone.now().isoformat().replace("+00:00", "Z"))
    asked: list[str] = []
    page.on("request", lambda request: "/board/filter" in request.url and asked.append(request.url))
    page.goto(f"{server.url}/board/?at={at}")
    expect(page.locator("#moment-banner")).to_be_visible(timeout=SLOW)

    def claim_the_window():  # the live window empties meanwhile
        for i in range(COLUMN_PAGE):
            transitions.claim(f"m{i:03d}", "agent-1", 60)

    orm(claim_the_window)
    expect(count(page, "QUEUED")).to_have_text("30")  # the live model follows while hidden
    assert [url for url in asked if "stage=QUEUED" in url] == []
    page.locator("#time-live").click()
    expect(page.locator(f"{QUEUED} .card")).to_have_count(30)  # now drawn: it loads the rest
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")


def test_a_column_watched_at_its_top_lets_go_of_its_tail_and_scrolling_loads_it_again(open_board, orm):
    """A finished column takes every completion at its top: watched while 450 tasks finish, it
    keeps at most TRIM_AT (400) cards, its count exact, and scrolled down it loads the rest again,
    page after page, each task once, in the column's order."""
    total = 450
    orm(transitions.create, [TaskSpec(id=f"f{i:03d}", title=f"finishing {i}") for i in range(total)])
    page = open_board()
    expect(count(page, "QUEUED")).to_have_text(str(total))

    def finish_all():
        for i in range(total):
            held = transitions.claim(f"f{i:03d}", "agent-1", 60)
            transitions.complete(f"f{i:03d}", held.lease.token, {"i": i})

    orm(finish_all)
    completed = page.locator('.column[data-stage="COMPLETED"]')
    expect(count(page, "COMPLETED")).to_have_text(str(total))
    expect(card(page, f"f{total - 1:03d}", "COMPLETED")).to_be_visible()  # the latest on top
    expect(completed.locator(".show-more")).to_be_visible()  # it let go of its tail
    assert completed.locator(".card").count() <= 400
    scroll_to_end(page, "COMPLETED")
    assert shown_ids(page, "COMPLETED") == orm(expected_order, ["COMPLETED", "QUEUED"])["COMPLETED"]


def test_a_long_column_draws_only_the_cards_near_its_view_and_keeps_the_others_in_order(open_board, orm):
    """Virtualized columns (issue 31): scrolled to the end of 1,000 cards, the column holds every
    id in the server's order but draws only the chunks near its view (static/board/render.js,
    chunks of 100); changes to the tasks it does not draw land in their place, and scrolled back,
    their cards are drawn as the model has them now."""
    total = 1000
    orm(transitions.create, [TaskSpec(id=f"v{i:04d}", title=f"far {i}") for i in range(total)])
    page = open_board()
    expect(count(page, "QUEUED")).to_have_text(str(total))
    scroll_to_end(page, "QUEUED")
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")
    drawn = page.locator(f"{QUEUED} .card")
    expect(card(page, f"v{total - 1:04d}", "QUEUED")).to_be_visible()
    assert drawn.count() <= 3 * COLUMN_PAGE, f"{drawn.count()} cards drawn of {total}"
    expect(card(page, "v0005")).to_have_count(0)  # far above: not drawn

    def change_far_above():
        transitions.edit("v0005", actor="op", version=0, title="edited while far")
        transitions.create(TaskSpec(id="urgent", title="to the front", priority=10))  # before v0000
        transitions.claim("v0010", "agent-1", 60)
        transitions.create(TaskSpec(id="v0500a", title="in the middle"))  # same rank: by id, after v0500

    orm(change_far_above)
    expect(count(page, "QUEUED")).to_have_text(str(total + 1))
    expect(card(page, "v0010", "RUNNING")).to_be_visible()
    page.wait_for_function("([list, n]) => list.querySelectorAll('.card').length <= n",
                           arg=[page.locator(f"{QUEUED} .cards").element_handle(), 3 * COLUMN_PAGE])
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")
    expect(card(page, "urgent")).to_have_count(0)

    page.locator(f"{QUEUED} .cards").evaluate("list => { list.scrollTop = 0; }")
    expect(card(page, "urgent", "QUEUED")).to_be_visible()
    expect(card(page, "v0005", "QUEUED").locator(".card-title")).to_have_text("edited while far")
    expect(card(page, f"v{total - 1:04d}")).to_have_count(0)  # the end, far below now: not drawn
    assert drawn.count() <= 3 * COLUMN_PAGE
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")
    assert page.locator(f"{QUEUED} .card").first.get_attribute("data-id") == "urgent"
