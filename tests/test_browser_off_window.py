"""A tab left open on a busy board stays bounded, in a real browser against the real server: the
page keeps the newest state of each changed task it does not show (below a column's loaded
window), and past TASKFLOW_BOARD_OFF_WINDOW_MAX of them it takes a fresh snapshot, which starts
it over (docs/live-protocol.md, "Applying frames"). The server here keeps KEPT."""
from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connections

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live.reads import COLUMN_PAGE
from tests.live_server import BoardServer
from tests.support import database_url, sqlite_db_mark
from tests.test_browser import browser, card, count, open_board, orm, scroll_to_end  # noqa: F401  (fixtures)
from tests.test_browser_columns import QUEUED, db_column, shown_ids

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

KEPT = 5


@pytest.fixture(scope="module")
def server(django_db_setup):
    """The board's server (as tests.test_browser's) keeping at most KEPT changes off the windows."""
    url = database_url(connections["default"].settings_dict)
    started = BoardServer(url, secret_key=settings.SECRET_KEY,
                          env={"TASKFLOW_BOARD_OFF_WINDOW_MAX": str(KEPT)}).start()
    yield started
    started.close()


def test_a_page_keeping_too_many_changes_below_its_windows_starts_over_from_a_snapshot(open_board, orm):
    orm(transitions.create, [TaskSpec(id=f"w{i:03d}", title=f"waiting {i}") for i in range(COLUMN_PAGE + 20)])
    page = open_board()
    connection = page.locator("#connection")
    expect(page.locator(f"{QUEUED} .card")).to_have_count(COLUMN_PAGE)
    expect(connection).to_have_attribute("data-snapshots", "1")
    below = [f"w{COLUMN_PAGE + i:03d}" for i in range(KEPT + 1)]

    # KEPT edits of tasks past the window, then a move the page shows: frames come in commit
    # order, so once the cancelled card is drawn every edit before it has been kept.
    for task_id in below[:KEPT]:
        orm(transitions.edit, task_id, actor="op", version=0, title=f"edited {task_id}")
    orm(transitions.cancel, "w000", actor="op")
    expect(card(page, "w000", "CANCELLED")).to_be_visible()
    assert connection.get_attribute("data-snapshots") == "1"
    assert card(page, below[0]).count() == 0  # kept, not drawn

    # One more: the page asks for a snapshot and starts over from it.
    orm(transitions.edit, below[KEPT], actor="op", version=0, title=f"edited {below[KEPT]}")
    expect(connection).to_have_attribute("data-snapshots", "2")
    expect(connection).to_have_attribute("data-state", "live")
    expect(count(page, "QUEUED")).to_have_text(str(COLUMN_PAGE + 19))
    expect(count(page, "CANCELLED")).to_have_text("1")
    # Nothing was lost by starting over: scrolled to its end, the column is the database's,
    # with every edit.
    scroll_to_end(page, "QUEUED")
    assert shown_ids(page, "QUEUED") == orm(db_column, "QUEUED")
    for task_id in below:
        expect(card(page, task_id, "QUEUED").locator(".card-title")).to_have_text(f"edited {task_id}")
