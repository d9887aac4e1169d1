"""The all-tasks table, the header's navigation, and cards that breathe, in a real browser (Debian's
Chromium, Playwright) against a real board server (manage.py serve) on the test database.

The server, browser and ORM-thread fixtures are tests/test_browser.py's; every page here fails its
test on a JavaScript error or a console error. Waits are Playwright's `expect(...)` with a bound,
never a sleep. The screenshots (1600x1000, 390x844, dark) land in SCREENSHOTS; those committed
under docs/screenshots/ are copies of them."""
# The fixtures imported from tests/test_browser.py are test parameters by the same names.
# ruff: noqa: F811
from __future__ import annotations

import csv
import io
import re
import tempfile
from pathlib import Path

import pytest

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live.reads import COLUMN_PAGE
from tests.support import sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures, found by pytest by name)
    ARRIVAL,
    SLOW,
    browser,
    card,
    count,
    expected_order,
    open_page,
    orm,
    press_show_more,
    server,
    wait_for_holds,
)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

SCREENSHOTS = Path(tempfile.gettempdir()) / "taskflow-board-screenshots"
SIZES = {"desktop": (1600, 1000, "light"), "phone": (390, 844, "light"), "dark": (1600, 1000, "dark")}


def _many(n: int = 60) -> None:
    transitions.create([TaskSpec(id=f"job-{i:03}", title=f"job {i}", priority=i % 4, queue="ingest" if i % 2 else "render")
                        for i in range(n)], actor="test")


def _rows(page) -> list[str]:
    return page.locator("#tasks-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")


# ---------------------------------------------------------------------------------------------
# 17. The all-tasks table


def test_the_table_pages_sorts_filters_and_exports_what_it_shows(open_page, orm, server):
    orm(_many)
    page = open_page("/board/tasks/?limit=25&order=created")
    expect(page.locator("#tasks-count")).to_have_text("1–25 of 60 tasks (times in UTC)")
    assert _rows(page) == [f"job-{i:03}" for i in range(25)]
    # Each id links to the task's own page.
    expect(page.locator('tr[data-id="job-007"] td.id a')).to_have_attribute("href", "/board/task/job-007")
    page.click("#next-page")
    expect(page.locator("#tasks-count")).to_have_text("26–50 of 60 tasks (times in UTC)")
    assert _rows(page) == [f"job-{i:03}" for i in range(25, 50)]
    page.click("#next-page")
    expect(page.locator("#tasks-count")).to_have_text("51–60 of 60 tasks (times in UTC)")
    assert _rows(page) == [f"job-{i:03}" for i in range(50, 60)]
    expect(page.locator("#next-page")).to_have_count(0)
    page.click("#first-page")
    expect(page.locator("#tasks-count")).to_have_text("1–25 of 60 tasks (times in UTC)")

    # Sorts: the headers' links.
    page.click("#tasks-table th >> text=priority")
    expect(page.locator("#tasks-table th a[aria-current]")).to_have_text("priority ↓")
    assert _rows(page)[:3] == ["job-003", "job-007", "job-011"]  # priority 3, oldest first
    page.click("#tasks-table th >> text=created")  # newest first
    assert _rows(page)[0] == "job-059"
    page.click("#tasks-table th >> text=created")  # then oldest first
    assert _rows(page)[0] == "job-000"

    # A filter (the form): the rows and the count narrow, and the export holds exactly them.
    page.fill('input[name="text"]', "job 1")
    page.fill('input[name="queue"]', "ingest")
    page.check('input[name="stage"][value="QUEUED"]')
    page.click("#tasks-filters button[type=submit]")
    expect(page.locator("#tasks-count")).to_have_text("1–6 of 6 tasks matching the filter (times in UTC)")
    assert _rows(page) == ["job-001", "job-011", "job-013", "job-015", "job-017", "job-019"]
    with page.expect_download() as download:
        page.click("#export-csv")
    exported = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert [row["id"] for row in exported] == _rows(page)
    with page.expect_download() as download:
        page.click("#export-jsonl")
    assert len(Path(download.value.path()).read_text().splitlines()) == 6

    # No match: said so, with a way back.
    page.fill('input[name="text"]', "nothing like it")
    page.click("#tasks-filters button[type=submit]")
    expect(page.locator("#tasks-count")).to_have_text("No task matches the filter. Clear the filter")
    page.click("#tasks-count a")
    expect(page.locator("#tasks-count")).to_have_text("1–50 of 60 tasks (times in UTC)")


def test_a_bad_address_says_what_is_wrong_and_offers_every_task(open_page, orm, server):
    orm(_many, 3)
    page = open_page("/board/tasks/", expected="Failed to load resource: the server responded with a status "
                                               "of 422 (Unprocessable Entity)")
    answer = page.goto(f"{server.url}/board/tasks/?order=fastest")
    assert answer.status == 422
    expect(page.locator("#tasks-error")).to_contain_text("unknown order 'fastest'")
    page.click("#tasks-error a")
    expect(page.locator("#tasks-count")).to_have_text("1–3 of 3 tasks (times in UTC)")


# ---------------------------------------------------------------------------------------------
# 19. The header's navigation


def test_the_header_names_the_user_links_every_page_and_logs_out_with_a_post(open_page, orm, server):
    orm(_many, 3)
    page = open_page("/board/")
    nav = page.locator("#site-nav")
    expect(nav.locator(".nav-user")).to_have_text(page.username)
    links = dict(nav.locator("a").evaluate_all("links => links.map(a => [a.textContent, a.getAttribute('href')])"))
    assert links == {"Board": "/board/", "All tasks": "/board/tasks/", "Queues": "/admin/board/queue/",
                     "Resources": "/admin/board/resource/", "Webhooks": "/admin/board/webhook/",
                     "API docs": "/api/docs", "Admin": "/admin/"}
    expect(nav.locator('a[aria-current="page"]')).to_have_text("Board")
    nav.locator("text=All tasks").click()
    expect(page).to_have_url(f"{server.url}/board/tasks/")
    expect(page.locator('#site-nav a[aria-current="page"]')).to_have_text("All tasks")
    expect(page.locator("#site-nav .nav-user")).to_have_text(page.username)
    page.locator("#site-nav >> text=Queues").click()
    expect(page).to_have_url(f"{server.url}/admin/board/queue/")
    page.go_back()
    # Log out: a POST with the CSRF token (Django 5 refuses a GET), back to the login page.
    page.locator("#site-nav button", has_text="Log out").click()
    expect(page).to_have_url(re.compile(r"/admin/login/\?next=/board/tasks/$"))
    page.goto(f"{server.url}/board/")
    expect(page).to_have_url(re.compile(r"/admin/login/\?next=/board/$"))


# ---------------------------------------------------------------------------------------------
# 21. Cards that breathe; a filter with no match


def _busy_board() -> None:
    """Five stages with cards (PAUSED and CANCELLED empty, as on most boards), long ids."""
    transitions.create([TaskSpec(id=f"ux-run-2026-12-05-build-{i:04}", title=f"build the docs site, part {i}",
                                 queue="docs-builds") for i in range(12)], actor="test")
    transitions.create([TaskSpec(id=f"held-{i}", title="waits for an operator", on_hold=True) for i in range(3)],
                       actor="test")
    for i in range(3):
        transitions.claim(f"ux-run-2026-12-05-build-{i:04}", "agent-with-a-long-name-7", 600)
    lease = transitions.claim("ux-run-2026-12-05-build-0003", "agent-2", 600).lease
    transitions.complete("ux-run-2026-12-05-build-0003", lease.token, {"ok": True})
    lease = transitions.claim("ux-run-2026-12-05-build-0004", "agent-2", 600).lease
    transitions.fail("ux-run-2026-12-05-build-0004", lease.token, "boom", retryable=False)


def test_at_1600_px_cards_are_wide_ids_have_their_line_and_count_pills_stay_whole(open_page, orm):
    orm(_busy_board)
    page = open_page("/board/")
    expect(card(page, "ux-run-2026-12-05-build-0011")).to_be_visible()
    widths = page.locator(".card:visible").evaluate_all("cards => cards.map(c => c.getBoundingClientRect().width)")
    assert min(widths) >= 180, widths  # 158 px before
    # The id has a line of its own; the admin link is not in the id's line.
    head = card(page, "ux-run-2026-12-05-build-0011").locator(".card-head")
    assert head.locator("a.admin-link").count() == 0
    id_box, head_box = head.locator(".card-id").bounding_box(), head.bounding_box()
    assert abs(id_box["width"] - head_box["width"]) < 1 and id_box["height"] < 40  # a block: at most two lines
    # A filtered count ("1 of 8") is one pill on one line in every column.
    page.fill("#filter-text", "build-0011")
    expect(count(page, "QUEUED")).to_have_text("1 of 7")
    for stage in ("PENDING", "QUEUED", "RUNNING", "COMPLETED", "FAILED"):
        box = count(page, stage).bounding_box()
        assert box["height"] < 22, (stage, box)
    page.fill("#filter-text", "")


def test_a_filter_with_no_match_says_so_offers_to_clear_it_and_to_search_every_task(open_page, orm, server):
    orm(_busy_board)
    page = open_page("/board/")
    no_match = page.locator("#no-match")
    expect(no_match).to_be_hidden()
    page.fill("#filter-text", "no-such-thing")
    expect(no_match).to_be_visible()
    expect(no_match).to_contain_text("No task matches the filter.")
    expect(no_match.locator("a.search-all")).to_have_attribute("href", "/board/tasks/?text=no-such-thing")
    no_match.locator("button.clear-filter").click()
    expect(no_match).to_be_hidden()
    expect(page.locator("#filter-text")).to_have_value("")
    expect(card(page, "held-0")).to_be_visible()
    # The same link answers over every task.
    page.fill("#filter-text", "build-0003")
    page.select_option("#filter-stage", "QUEUED")
    expect(no_match).to_be_visible()
    no_match.locator("a.search-all").click()
    expect(page).to_have_url(f"{server.url}/board/tasks/?text=build-0003&stage=QUEUED")
    expect(page.locator("#tasks-count")).to_have_text("No task matches the filter. Clear the filter")


# ---------------------------------------------------------------------------------------------
# Screenshots (committed copies: docs/screenshots/)


def test_screenshots_of_the_table_and_the_board_at_three_sizes(open_page, orm):
    orm(_many, 40)
    orm(_busy_board)  # changed last: the table's "recently updated" shows every stage first
    SCREENSHOTS.mkdir(exist_ok=True)
    for name, (width, height, scheme) in SIZES.items():
        page = open_page("/board/tasks/?order=updated", width=width, height=height, color_scheme=scheme)
        expect(page.locator("#tasks-count")).to_contain_text("of 55 tasks")
        page.screenshot(path=str(SCREENSHOTS / f"tasks-{name}.png"))
        page = open_page("/board/", width=width, height=height, color_scheme=scheme)
        expect(card(page, "held-0")).to_be_visible()
        expect(page.locator("#queues li.queue").first).to_be_visible(timeout=SLOW)  # the strip's first frame
        page.screenshot(path=str(SCREENSHOTS / f"board-{name}.png"))


# ---------------------------------------------------------------------------------------------
# 1. The board's filter over every task, not only the cards loaded; 13. who ran a completed task


def _finish(ids: list[str], owner: str = "agent-1") -> None:
    transitions.create([TaskSpec(id=i, title=f"title of {i}") for i in ids], actor="test")
    for task_id in ids:
        lease = transitions.claim(task_id, owner, 600).lease
        transitions.complete(task_id, lease.token, {"ok": True})


def test_the_filter_counts_every_task_and_loads_the_matching_finished_cards_the_board_lacked(open_page, orm):
    # 230 finished ux-run tasks, then 210 newer others: the snapshot holds the 100 most recent
    # finished, none of them a ux-run one. Before, "/board/?q=ux-run" said "0 of 440" here.
    orm(_finish, [f"ux-run-{i:03}" for i in range(230)])
    orm(_finish, [f"other-{i:03}" for i in range(210)])
    page = open_page("/board/?q=ux-run")
    completed = count(page, "COMPLETED")
    column = page.locator('.column[data-stage="COMPLETED"]')
    expect(completed).to_have_text("230 of 440")
    expect(card(page, "ux-run-229", "COMPLETED")).to_be_visible()
    expect(column.locator(".card:visible")).to_have_count(COLUMN_PAGE)
    more = column.locator(".show-more")
    expect(more).to_have_text(f"show more ({230 - COLUMN_PAGE} older matching)")
    # (What the column holds: the cards near its view, drawn, and the ids of those far from it,
    # static/board/render.js, virtualized columns.)
    matching = "ids.filter(id => id.startsWith('ux-run')).length"
    while more.is_visible():  # a page of matches a click (the last one: 30)
        shown = len([i for i in wait_for_holds(column, "true") if i.startswith("ux-run")])
        more.click()
        wait_for_holds(column, f"{matching} === {min(230, shown + COLUMN_PAGE)}")
    column.locator(".cards").evaluate("list => { list.scrollTop = list.scrollHeight; }")  # the oldest, at the end
    expect(card(page, "ux-run-000", "COMPLETED")).to_be_visible()
    # A matching task that finishes now: the server's count follows (asked again after changes).
    orm(_finish, ["ux-run-new"])
    expect(completed).to_have_text("231 of 441")
    column.locator(".cards").evaluate("list => { list.scrollTop = 0; }")  # the most recent, at the top
    expect(card(page, "ux-run-new", "COMPLETED")).to_be_visible()
    # No task anywhere matches: said so, over every task.
    page.fill("#filter-text", "no-task-has-this")
    expect(page.locator("#no-match")).to_contain_text("No task matches the filter.")
    expect(completed).to_have_text("0 of 441")
    # Without a filter, "show more" pages the column most recent first, as it is drawn: the
    # snapshot's first page, the 231 ux-run ones loaded since, and the others past the window
    # (a page of which may load at once: the column's end can come into view as the cards
    # hidden by the filter show again; and a column of over 400 cards watched at its top lets
    # go of those past 200).
    page.fill("#filter-text", "")
    expect(completed).to_have_text("441")
    expect(more).to_have_text(re.compile(r"^show more \(\d+ older\)$"))
    while True:
        loaded = len(wait_for_holds(column, "true"))
        if not press_show_more(column):
            break
        wait_for_holds(column, f"ids.length !== {loaded}")
    ids = wait_for_holds(column, "ids.length === 441")
    assert ids == orm(expected_order, ["COMPLETED"])["COMPLETED"]  # every one once, in the page's order


def test_a_search_line_in_the_filter_box_shows_the_tasks_the_server_finds(open_page, orm, server):
    def board():
        transitions.create([TaskSpec(id="fix-login", title="fix the login", tags=["urgent"], payload={"repo": "acme/web"}),
                            TaskSpec(id="fix-api", title="fix the api", payload={"repo": "acme/api"}),
                            TaskSpec(id="docs", title="write docs", tags=["urgent", "docs"])], actor="test")
        _finish(["old-urgent"])
        from board.models import Task
        Task.objects.filter(pk="old-urgent").update(tags=["urgent"])  # a finished task the search must find too
        _finish([f"other-{i:03}" for i in range(205)])  # pushes it out of the snapshot's 200
    orm(board)
    refused = "Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"
    page = open_page("/board/?q=tag:urgent", expected=refused)  # the bad line below
    expect(count(page, "QUEUED")).to_have_text("2 of 3")
    expect(count(page, "COMPLETED")).to_have_text("1 of 206")
    expect(card(page, "fix-login")).to_be_visible()
    expect(card(page, "docs")).to_be_visible()
    expect(card(page, "fix-api")).to_be_hidden()
    expect(card(page, "old-urgent", "COMPLETED")).to_be_visible()
    expect(card(page, "docs").locator(".card-head .tag")).to_have_text(["urgent", "docs"])  # its tags, as chips
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "board-search.png")
    page.fill("#filter-text", "payload.repo:acme/web")
    expect(count(page, "QUEUED")).to_have_text("1 of 3")
    expect(card(page, "fix-login")).to_be_visible()
    expect(card(page, "docs")).to_be_hidden()
    # A task created now that matches shows once the server counts again (after changes).
    orm(lambda: transitions.create([TaskSpec(id="fix-css", title="css", payload={"repo": "acme/web"})], actor="test"))
    expect(count(page, "QUEUED")).to_have_text("2 of 4")
    expect(card(page, "fix-css")).to_be_visible()
    # A bad line says what is wrong.
    page.fill("#filter-text", "colour:blue")
    expect(page.locator("#message")).to_contain_text("unknown qualifier 'colour'")
    # The table takes the same line.
    page.goto(f"{server.url}/board/tasks/?search=tag:urgent")
    expect(page.locator("#tasks-count")).to_contain_text("of 3 tasks matching the filter")


def test_a_completed_card_says_who_ran_it_how_long_it_ran_and_how_long_it_waited(open_page, orm):
    orm(_finish, ["done-1"], "agent-with-a-long-name-7")
    page = open_page("/board/")
    done = card(page, "done-1", "COMPLETED")
    expect(done.locator(".owner.ran-by")).to_have_text("agent-with-a-long-name-7")
    expect(done.locator(".card-run")).to_have_text(re.compile(r"^ran \d+s · waited \d+s$"))
    # A task that completes while the page is open: its card says so too (the changes frame).
    orm(_finish, ["done-2"], "agent-3")
    expect(card(page, "done-2", "COMPLETED").locator(".owner.ran-by")).to_have_text("agent-3")
    expect(card(page, "done-2", "COMPLETED").locator(".card-run")).to_contain_text("ran ")


# ---------------------------------------------------------------------------------------------
# 20. The API docs, grouped by area


def test_the_api_docs_show_a_group_per_area_and_no_default_group(open_page):
    page = open_page("/api/docs")
    groups = page.locator(".opblock-tag-section h3 .opblock-tag, .opblock-tag-section h3")
    expect(page.locator(".opblock-tag-section")).to_have_count(14, timeout=SLOW)
    names = page.locator(".opblock-tag-section h3").evaluate_all("hs => hs.map(h => h.dataset.tag)")
    assert names == ["tasks", "leases", "notes", "approvals", "operators", "queues", "rate keys", "fairness keys",
                     "resources", "schedules", "check", "webhooks", "bulk", "board at"], names
    assert groups.filter(has_text="default").count() == 0
    # A group holds its operations: the tasks group lists GET /api/tasks.
    expect(page.locator('.opblock-tag-section:has(h3[data-tag="tasks"]) .opblock-summary-path',
                        has_text="/api/tasks").first).to_be_visible()
