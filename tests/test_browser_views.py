"""The board page's session, URL and links in a real browser (Debian's Chromium, Playwright)
against real board servers on the test database. The fixtures and helpers are
tests/test_browser.py's.

- A lost session ends the page's stream: "Your session ended — log in again" with a link to the
  login page (next = this board view), no more reconnecting. Each way a session can end is
  driven through the path that really carries it: a logout handled by the page's own server
  process (the logout signal closes the socket at once), a logout handled by another process
  (only the socket's periodic re-check can see it: the default period), an expired session
  (the re-check) and a session that ended while the server was away (the reconnect's refusal).
- While reconnecting, the cards the page can no longer vouch for are greyed out.
- Filters and the open task live in the URL: restored on load and on back/forward; the column
  counts follow the filters; every card and the details link to the task's admin page."""
from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.utils import timezone

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live.reads import COLUMN_PAGE
from tests import test_browser as shared
from tests.live_server import BoardServer, server_for_sessions
from tests.support import sqlite_db_mark
from tests.test_browser import ARRIVAL, SLOW, _session_cookie, _user, card, count

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

# tests/test_browser.py's fixtures, here under the same names (its server is one per module).
server, browser, orm, open_board = shared.server, shared.browser, shared.orm, shared.open_board

# The re-check period of a server started without TASKFLOW_SOCKET_RECHECK in its env (it reads
# the same settings from the same environment as this test run): a logout handled by another
# process is seen by the socket's next re-check.
DEFAULT_RECHECK_MS = settings.TASKFLOW["SOCKET_RECHECK_SECONDS"] * 1000
SESSION_ENDED = "Your session ended — log in again"


# ---------------------------------------------------------------------------------------------
# Servers: one process each, so that which process handles a logout is known


def _one_process_server(**env) -> BoardServer:
    return server_for_sessions(env=env, args=["--workers", "1"])


@pytest.fixture(scope="module")
def signal_server(django_db_setup, django_db_blocker):
    """Re-checks far beyond the tests' patience: only a logout in this process (its signal) or
    a refused reconnect can end a page's stream in time."""
    with django_db_blocker.unblock():
        server_ = _one_process_server(TASKFLOW_SOCKET_RECHECK="3600")
    yield server_
    server_.close()


@pytest.fixture(scope="module")
def default_server(django_db_setup, django_db_blocker):
    """The default re-check period (TASKFLOW_SOCKET_RECHECK unset)."""
    with django_db_blocker.unblock():
        server_ = _one_process_server()
    yield server_
    server_.close()


@pytest.fixture
def shared_session(browser, orm):
    """shared_session() -> (session key, new_page(server, path)): pages in separate browser
    contexts (as two browser windows) with the same session of one staff user."""
    key = orm(lambda: _session_cookie(_user()))
    contexts, page_errors = [], []

    def new_page(on: BoardServer, path: str = "/board/"):
        context = browser.new_context(viewport={"width": 1600, "height": 900})
        contexts.append(context)
        context.add_cookies([{"name": "sessionid", "value": key, "url": on.url}])
        page = context.new_page()
        page.on("pageerror", lambda error: page_errors.append(str(error)))
        page.goto(f"{on.url}{path}")
        return page

    yield key, new_page
    for context in contexts:
        context.close()
    assert page_errors == [], f"JavaScript errors on the page: {page_errors}"


def live(page):
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
    return page


def log_out_in_the_admin(page):
    """What a person does in another window: the admin's "Log out" button."""
    page.locator("#logout-form button").click()
    expect(page).to_have_url(re.compile(r"/admin/logout/$"))


def assert_session_ended(page, timeout: float, query: str = ""):
    """The message with its login link (back to this board view), and no reconnecting."""
    ended = page.locator("#session-ended")
    expect(ended).to_be_visible(timeout=timeout)
    expect(ended).to_have_text(SESSION_ENDED)
    expect(ended.locator("a")).to_have_attribute("href", "/admin/login/?next=" + _quoted(f"/board/{query}"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "ended")
    # No socket open or opening, and no reconnect scheduled.
    assert page.locator("#connection").get_attribute("data-socket") == "none"


def _quoted(path: str) -> str:
    from urllib.parse import quote
    return quote(path, safe="/")


# ---------------------------------------------------------------------------------------------
# Session


def test_a_logout_in_another_window_of_the_same_process_ends_the_board_at_once(signal_server, shared_session):
    _, new_page = shared_session
    board = live(new_page(signal_server, "/board/?q=build"))
    sockets = []
    board.on("websocket", lambda ws: sockets.append(ws))
    admin = new_page(signal_server, "/admin/")
    log_out_in_the_admin(admin)
    # The logout signal closes the socket in the process that handled it: no re-check involved.
    assert_session_ended(board, timeout=ARRIVAL, query="?q=build")
    assert sockets == [], "the page tried to reconnect after its session ended"
    board.locator("#session-ended a").click()
    expect(board).to_have_url(re.compile(r"/admin/login/\?next=/board/%3Fq%3Dbuild$"))


def test_a_logout_handled_by_another_process_ends_the_board_within_the_default_recheck(
        signal_server, default_server, shared_session):
    _, new_page = shared_session
    board = live(new_page(default_server))
    admin = new_page(signal_server, "/admin/")  # another server process: its signal cannot reach
    log_out_in_the_admin(admin)
    assert_session_ended(board, timeout=DEFAULT_RECHECK_MS + ARRIVAL)


def test_an_expired_session_ends_the_board_within_the_default_recheck(default_server, shared_session, orm):
    key, new_page = shared_session
    board = live(new_page(default_server))
    orm(lambda: Session.objects.filter(session_key=key).update(expire_date=timezone.now() - timedelta(seconds=1)))
    assert_session_ended(board, timeout=DEFAULT_RECHECK_MS + ARRIVAL)


def test_reconnecting_greys_out_the_cards_until_a_fresh_snapshot(signal_server, shared_session, orm):
    orm(transitions.create, TaskSpec(id="grey-1", title="greyed while away"))
    _, new_page = shared_session
    board = live(new_page(signal_server))
    columns = board.locator("#columns")
    expect(card(board, "grey-1")).to_be_visible()
    expect(columns).not_to_have_class(re.compile(r"\bstale\b"))
    signal_server.stop()
    try:
        expect(board.locator("#connection")).to_have_attribute("data-state", "reconnecting", timeout=SLOW)
        expect(columns).to_have_class(re.compile(r"\bstale\b"))
    finally:
        signal_server.start()  # same port: the page reconnects
    live(board)
    expect(columns).not_to_have_class(re.compile(r"\bstale\b"))


def test_a_session_deleted_while_the_server_was_away_ends_the_board_on_reconnect(signal_server, shared_session, orm):
    key, new_page = shared_session
    board = live(new_page(signal_server))
    signal_server.stop()
    try:
        expect(board.locator("#connection")).to_have_attribute("data-state", "reconnecting", timeout=SLOW)
        orm(lambda: Session.objects.filter(session_key=key).delete())
    finally:
        signal_server.start()
    # The reconnect is refused with 4403 after the handshake (the browser sees the code).
    assert_session_ended(board, timeout=SLOW + ARRIVAL)


# ---------------------------------------------------------------------------------------------
# Views you can share


def _query(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlsplit(page.url).query).items()}


def _some_tasks(orm):
    orm(transitions.create, [TaskSpec(id="alpha", title="Alpha report", queue="reports"),
                             TaskSpec(id="beta", title="Beta build", queue="ci"),
                             TaskSpec(id="gamma", title="Gamma build", queue="ci"),
                             TaskSpec(id="delta", title="Delta build", queue="ci")])
    orm(transitions.claim, "gamma", "carol", 60)


def test_filters_and_the_open_task_are_in_the_url_and_restored_on_reload(open_board, orm):
    _some_tasks(orm)
    page = open_board()
    visible = page.locator(".card:visible")
    expect(visible).to_have_count(4)
    page.fill("#filter-text", "build")
    page.select_option("#filter-queue", "ci")
    page.fill("#filter-owner", "car")
    expect(visible).to_have_count(1)
    expect(page).to_have_url(re.compile(r"owner=car"))
    assert _query(page) == {"q": "build", "queue": "ci", "owner": "car"}
    card(page, "gamma").click()
    expect(page.locator("#details")).to_be_visible()
    expect(page).to_have_url(re.compile(r"task=gamma"))

    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
    expect(page.locator("#filter-text")).to_have_value("build")
    expect(page.locator("#filter-owner")).to_have_value("car")
    expect(page.locator("#filter-queue")).to_have_value("ci")
    expect(visible).to_have_count(1)
    expect(card(page, "gamma")).to_be_visible()
    expect(page.locator("#details")).to_have_attribute("data-id", "gamma")
    expect(page.locator("#details")).to_be_visible()


def test_back_and_forward_walk_the_opened_tasks_and_typing_adds_no_history(open_board, orm):
    _some_tasks(orm)
    page = open_board()
    details = page.locator("#details")
    page.fill("#filter-text", "b")
    page.fill("#filter-text", "bu")  # typing replaces the entry: no history step per key
    expect(page).to_have_url(re.compile(r"q=bu"))
    card(page, "beta").click()
    expect(details).to_have_attribute("data-id", "beta")
    card(page, "delta").click()
    expect(details).to_have_attribute("data-id", "delta")
    details.locator(".close").click()
    expect(details).to_be_hidden()
    assert "task" not in _query(page)

    page.go_back()
    expect(details).to_have_attribute("data-id", "delta")
    expect(details).to_be_visible()
    page.go_back()
    expect(details).to_have_attribute("data-id", "beta")
    page.go_back()
    expect(details).to_be_hidden()
    assert _query(page) == {"q": "bu"}
    expect(page.locator("#filter-text")).to_have_value("bu")
    page.go_forward()
    expect(details).to_have_attribute("data-id", "beta")
    expect(details).to_be_visible()
    assert _query(page) == {"q": "bu", "task": "beta"}


def test_counts_follow_the_filters_and_a_stage_shows_only_its_column(open_board, orm, server):
    _some_tasks(orm)
    page = open_board()
    expect(count(page, "QUEUED")).to_have_text("3")
    expect(count(page, "RUNNING")).to_have_text("1")
    page.select_option("#filter-queue", "ci")
    expect(count(page, "QUEUED")).to_have_text("2 of 3")
    expect(count(page, "RUNNING")).to_have_text("1 of 1")
    page.fill("#filter-text", "zzz")
    expect(count(page, "QUEUED")).to_have_text("0 of 3")
    # A change that arrives while filtered is counted under the filter too.
    orm(transitions.create, TaskSpec(id="zzz-1", title="late", queue="ci"))
    expect(count(page, "QUEUED")).to_have_text("1 of 4", timeout=ARRIVAL)
    page.fill("#filter-text", "")
    page.select_option("#filter-queue", "")
    expect(count(page, "QUEUED")).to_have_text("4")

    page.goto(f"{server.url}/board/?stage=RUNNING")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
    expect(page.locator("#filter-stage")).to_have_value("RUNNING")
    expect(page.locator(".column:visible")).to_have_count(1)
    expect(page.locator('.column[data-stage="RUNNING"]')).to_be_visible()
    page.select_option("#filter-stage", "")
    expect(page.locator('.column[data-stage="QUEUED"]')).to_be_visible()
    assert "stage" not in _query(page)


def test_a_task_in_the_url_opens_even_when_it_is_not_among_the_loaded_cards(open_board, orm, server):
    def make():
        transitions.create([TaskSpec(id=f"old{i:03d}", title=f"old {i}") for i in range(201)])
        for i in range(201):
            transitions.cancel(f"old{i:03d}", actor="op")

    orm(make)
    page = open_board()
    cancelled = page.locator('.column[data-stage="CANCELLED"]')
    expect(cancelled.locator(".card")).to_have_count(COLUMN_PAGE)
    expect(card(page, "old000")).to_have_count(0)  # the oldest is beyond the snapshot
    page.goto(f"{server.url}/board/?task=old000")
    details = page.locator("#details")
    expect(details).to_be_visible(timeout=SLOW)
    expect(details).to_have_attribute("data-id", "old000")
    expect(details.locator(".details-title")).to_contain_text("old 0")
    expect(count(page, "CANCELLED")).to_have_text("201")  # counted once, not twice

    page.goto(f"{server.url}/board/?task=no-such-task")
    expect(page.locator("#message")).to_contain_text("no-such-task", timeout=SLOW)
    expect(details).to_be_hidden()


def test_cards_and_details_link_to_the_admin_page_quoted_as_the_admin_quotes(open_board, orm):
    odd = "ns:build_7.x-1"
    orm(transitions.create, TaskSpec(id=odd, title="odd id"))
    page = open_board()
    link = card(page, odd).locator("a.admin-link")
    expect(link).to_have_attribute("href", "/admin/board/task/ns_3Abuild_5F7.x-1/change/")
    card(page, odd).click(position={"x": 3, "y": 3})  # a click on the card opens the details ...
    details = page.locator("#details")
    expect(details).to_have_attribute("data-id", odd)
    expect(details.locator("a.admin-link")).to_have_attribute("href", "/admin/board/task/ns_3Abuild_5F7.x-1/change/")
    link.click()  # ... and the link opens the admin's change page of that task
    expect(page).to_have_url(re.compile(r"/admin/board/task/ns_3Abuild_5F7\.x-1/change/$"))
    expect(page.locator("#content > h2")).to_have_text(f"{odd} [QUEUED v0]")  # its change page, not another's
