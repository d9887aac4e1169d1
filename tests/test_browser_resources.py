"""Resource leases on the live board (issue 32, item 1) in a real browser (Debian's Chromium,
Playwright) against a real board server on the test database: a QUEUED card whose resource is
held by another task says so ("waiting: merge-slot held by worker-3"), from the "queues" frame,
with the engine's own words in its title; the holder's complete takes the badge away live; a
RUNNING card says what it holds; a directory's node waits for a hold inside it; the
details panel and the task's own page say what it needs and who holds it.

The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` with a bound, never a sleep. Screenshots go to /tmp (never the repo)."""
# The fixtures imported from tests/test_browser.py are test parameters by the same names.
# ruff: noqa: F811
from __future__ import annotations

import json

import pytest

from board import agent_keys
from board.engine import resources, selectors, transitions
from board.engine.transitions import TaskSpec
from tests.support import sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures, found by pytest by name)
    SLOW,
    browser,
    card,
    open_board,
    open_page,
    orm,
    server,
)
from tests.test_browser_cards import CONTRAST_JS

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

# ms: the "queues" frame is read at most twice a second after a commit (board.live.tailer), and
# may come a pass after the cards; room for a loaded machine.
STRIP = 5000


def api(page, method: str, path: str, key: str, body: dict):
    """An agent's call (its key, no session), from the page's browser context."""
    return page.request.fetch(f"{page.url.split('/board/')[0]}{path}", method=method, data=json.dumps(body),
                              headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})


def why_waiting(task_id: str) -> str | None:
    return resources.why_waiting("default", selectors.get_task(task_id))


def test_a_queued_card_says_which_resource_it_waits_for_and_who_holds_it_live(open_board, orm):
    orm(transitions.create, [TaskSpec(id="merge-a", title="merge feature a", queue="merge", resources=["merge-slot"]),
                             TaskSpec(id="merge-b", title="merge feature b", queue="merge", resources=["merge-slot"]),
                             TaskSpec(id="free", title="needs nothing", queue="docs")])
    key = orm(lambda: agent_keys.create_key("worker-3")[1])
    page = open_board()
    waiting_b = card(page, "merge-b", "QUEUED").locator(".badge.resource-held")
    expect(card(page, "merge-b", "QUEUED")).to_be_visible()
    expect(waiting_b).to_have_count(0)  # nothing held yet

    # worker-3 claims over the API: merge-a, first in the claim order, takes merge-slot.
    claimed = api(page, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "merge"})
    assert claimed.status == 200, claimed.text()
    lease = claimed.json()
    assert lease["task"]["id"] == "merge-a"
    expect(waiting_b).to_have_text("waiting: merge-slot held by worker-3", timeout=STRIP)
    # The badge's title is the engine's own account (resources.why_waiting): the page's port of
    # the hierarchy agrees with it.
    assert waiting_b.get_attribute("title") == orm(why_waiting, "merge-b") == \
        "resource merge-slot held by worker-3 (task merge-a)"
    expect(card(page, "free", "QUEUED").locator(".badge.resource-held")).to_have_count(0)
    lock = card(page, "merge-a", "RUNNING").locator(".badge.holds-resources")
    expect(lock).to_have_text("holds merge-slot")
    expect(lock).to_have_attribute("title", "holds merge-slot (exclusive)")

    # Its colours are readable (WCAG AA), and the picture, to look at.
    measured = page.evaluate(CONTRAST_JS, [".card .badge.resource-held", ".card .badge.holds-resources"])
    low = {sel: m for sel, m in measured.items() if m is None or m["ratio"] < 4.5}
    assert low == {}, json.dumps(low, indent=1)
    page.screenshot(path="/tmp/resboard-card.png")

    # The details panel: what it needs, what keeps it waiting, the holder a link to its page.
    card(page, "merge-b", "QUEUED").click()
    details = page.locator("#details")
    expect(details.locator(".details-body")).to_contain_text("merge-slot (exclusive)")
    expect(details.locator(".resource-wait")).to_contain_text("resource merge-slot held by worker-3 (task merge-a)")
    expect(details.locator(".resource-holders a")).to_have_attribute("href", "/board/task/merge-a")
    details.screenshot(path="/tmp/resboard-details.png")

    # The holder completes: the badge goes, live, and the panel says it no longer waits.
    done = api(page, "POST", "/api/tasks/merge-a/complete", key, {"token": lease["lease"]["token"], "result": {}})
    assert done.status == 200, done.text()
    expect(card(page, "merge-a", "COMPLETED")).to_be_visible(timeout=STRIP)
    expect(waiting_b).to_have_count(0, timeout=STRIP)
    expect(details.locator(".resource-wait")).to_have_count(0)
    assert orm(why_waiting, "merge-b") is None


def test_a_directory_waits_for_a_hold_inside_it_and_the_task_page_names_the_holder(open_board, open_page, orm):
    orm(transitions.create, [TaskSpec(id="edit-x", title="edit one file", queue="edit",
                                      resources=["file:src/app/x.py"]),
                             TaskSpec(id="reformat", title="reformat src", queue="edit", resources=["file:src/**"]),
                             TaskSpec(id="other", title="edit lib", queue="edit", resources=["file:lib/**"])])
    orm(transitions.claim, "edit-x", "worker-5", 60)
    page = open_board()
    badge = card(page, "reformat", "QUEUED").locator(".badge.resource-held")
    expect(badge).to_have_text("waiting: file:src/ (by file:src/app/x.py) held by worker-5", timeout=STRIP)
    assert badge.get_attribute("title") == orm(why_waiting, "reformat")
    expect(card(page, "other", "QUEUED").locator(".badge.resource-held")).to_have_count(0)  # beside it: free

    task_page = open_page("/board/task/reformat")
    section = task_page.locator(".task-page-deps")
    expect(section.locator(".resource-wait")).to_have_text(
        "waiting: resource file:src/ (by file:src/app/x.py) held by worker-5 (task edit-x)")
    expect(section.locator('.task-resources li[data-name="file:src/**"]')).to_contain_text(
        "file:src/** exclusive (holds file:src/): not held")
    task_page.screenshot(path="/tmp/resboard-taskpage.png", full_page=True)
    holder_page = open_page("/board/task/edit-x")
    expect(holder_page.locator('.task-resources li[data-name="file:src/app/x.py"]')).to_contain_text(
        "held by edit-x (worker-5)")
    expect(holder_page.locator(".details-body")).to_contain_text("file:src/app/x.py (exclusive): held", timeout=SLOW)


def test_the_admin_resources_page_lists_the_holders(open_page, orm):
    orm(transitions.create, [TaskSpec(id="merge-a", title="m", resources=["merge-slot"]),
                             TaskSpec(id="train", title="t", resources=[{"name": "gpu", "units": 2}]),
                             TaskSpec(id="edit-x", title="e", resources=["file:src/app/x.py"])])
    orm(resources.change_capacity, "gpu", 4, actor="op")
    for task, agent in (("merge-a", "worker-3"), ("train", "worker-4"), ("edit-x", "worker-5")):
        orm(transitions.claim, task, agent, 600)
    listing = open_page("/board/")
    listing.locator("#site-nav a", has_text="Resources").click()
    row = listing.locator("#result_list tbody tr", has_text="merge-slot")
    expect(row).to_contain_text("exclusive")
    expect(row.locator("a", has_text="merge-a")).to_have_attribute("href", "/admin/board/task/merge-a/change/")
    expect(listing.locator("#result_list tbody tr", has_text="gpu")).to_contain_text("2 of 4")
    listing.screenshot(path="/tmp/resboard-admin.png", full_page=True)
    row.locator("th a").click()
    expect(listing.locator("table.resource-holders")).to_contain_text("worker-3")
    expect(listing.locator('input[name="capacity"]')).to_have_value("1")
    listing.screenshot(path="/tmp/resboard-admin-page.png", full_page=True)


NAMES = ["merge-slot", "branch:main", "branch:feat-*", "file:src/app/**", "file:src/app/*.py", "file:src/app/x.py",
         "file:src/", "file:", "a/b/c", "a/b/", "x?y", "[ab]", "*", "file:src/a[0-9]/b", "s3:bucket/key/part",
         "host:db:5432", "gpu", "file:/abs/path/**"]


def test_the_pages_port_of_the_hierarchy_agrees_with_the_engine(open_board, orm):
    page = open_board()
    ported = page.evaluate("""async (names) => {
        const { nodeOf, ancestorsOf } = await import(document.querySelector('script[type=module]').src
          .replace(/main\\.js.*$/, 'page.js'));
        return names.map((n) => [nodeOf(n), ancestorsOf(nodeOf(n))]);
    }""", NAMES)
    assert ported == [[resources.node_of(n), resources.ancestors(resources.node_of(n))] for n in NAMES]


def test_a_shared_resource_at_capacity_keeps_a_card_waiting_as_the_engine_says(open_board, orm):
    orm(transitions.create, [TaskSpec(id="train-1", title="t", queue="gpu", resources=[{"name": "gpu", "units": 2}]),
                             TaskSpec(id="train-2", title="t", queue="gpu", resources=[{"name": "gpu", "units": 1}]),
                             TaskSpec(id="exclusive", title="x", queue="gpu", resources=["gpu"]),
                             TaskSpec(id="under", title="u", queue="gpu", resources=["branch:main"]),
                             TaskSpec(id="all-branches", title="b", queue="gpu", resources=["branch:*"])])
    orm(resources.change_capacity, "gpu", 3, actor="op")
    orm(transitions.claim, "train-1", "worker-4", 600)
    page = open_board()
    # 2 of 3 held: one more unit fits, an exclusive hold does not.
    expect(card(page, "exclusive", "QUEUED").locator(".badge.resource-held")).to_have_text(
        "waiting: gpu held by worker-4", timeout=STRIP)
    expect(card(page, "train-2", "QUEUED").locator(".badge.resource-held")).to_have_count(0)
    assert orm(why_waiting, "train-2") is None
    # The whole scheme held (branch:* holds the node branch:): a name under it waits, named as the
    # engine names it (its intent on branch: is the first need not free).
    orm(transitions.claim, "all-branches", "worker-7", 600)
    badge = card(page, "under", "QUEUED").locator(".badge.resource-held")
    expect(badge).to_have_text("waiting: branch: held by worker-7", timeout=STRIP)
    for task in ("exclusive", "under"):
        shown = card(page, task, "QUEUED").locator(".badge.resource-held").get_attribute("title")
        assert shown == orm(why_waiting, task)


def test_a_long_resource_name_wraps_inside_its_card_at_390_px(open_board, orm):
    long = "file:services/payments/reconciliation/adapters/" + "very-long-directory-name/" * 3 + "settlement.py"
    orm(transitions.create, [TaskSpec(id="hold-long", title="h", resources=[long]),
                             TaskSpec(id="wait-long", title="w", resources=[long])])
    orm(transitions.claim, "hold-long", "worker-with-a-rather-long-agent-name-9", 600)
    page = open_board(width=390, height=900)
    badge = card(page, "wait-long", "QUEUED").locator(".badge.resource-held")
    expect(badge).to_contain_text(f"waiting: {long} held by", timeout=STRIP)
    for task, selector in (("wait-long", ".badge.resource-held"), ("hold-long", ".badge.holds-resources")):
        box = card(page, task).bounding_box()
        inner = card(page, task).locator(selector).bounding_box()
        inside = inner["x"] >= box["x"] and inner["x"] + inner["width"] <= box["x"] + box["width"] + 0.5
        assert inside, (task, inner, box)
    card(page, "wait-long", "QUEUED").screenshot(path="/tmp/resboard-card-390.png")
