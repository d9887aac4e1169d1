"""Capabilities on the live board (issue 32, item 3) in a real browser (Debian's Chromium,
Playwright) against a real board server on the test database: a QUEUED card of a task that
requires capabilities says what it needs ("needs python"); when check() finds that no live agent
key used in the last hour holds them all (its unclaimable_requirements problem), the card says
that plainly, with check()'s words in its title, and stops saying it, live, once such an agent is
seen; the details panel and the task's own page list its requires and prefers.

The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` with a bound, never a sleep. Screenshots go to /tmp (never the repo)."""
# The fixtures imported from tests/test_browser.py are test parameters by the same names.
# ruff: noqa: F811
from __future__ import annotations

import json

import pytest

from board import agent_keys
from board.engine import selectors, transitions
from board.engine.invariants import UNCLAIMABLE_REQUIREMENTS
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

# ms: check()'s problems reach the page at most twice a second after a commit, and on a 2 s timer
# (board.live.tailer: an agent's key being used writes no task event); room for a loaded machine.
PROBLEMS = 8000


def seen_agent(name: str, capabilities: str) -> None:
    """An agent with a key holding `capabilities`, seen now (its key used: last_used_at)."""
    _, key = agent_keys.create_key(name, capabilities=capabilities)
    assert agent_keys.authenticate(key) is not None


def unclaimable_text(task_id: str) -> str | None:
    found = [p.text for p in selectors.problems() if p.task == task_id and p.code == UNCLAIMABLE_REQUIREMENTS]
    return found[0] if found else None


def test_a_card_needing_capabilities_nobody_holds_says_so_until_an_agent_with_them_is_seen(open_board, open_page,
                                                                                           orm):
    orm(transitions.create, [
        TaskSpec(id="train", title="train the model", queue="ml", requires=["python", "gpu"],
                 prefers={"model:opus": 3, "fast": 1}),
        TaskSpec(id="lint", title="lint the code", queue="ci", requires=["python"]),
        TaskSpec(id="free", title="needs nothing", queue="docs")])
    orm(seen_agent, "py-agent", "python")
    page = open_board()
    needs_gpu = card(page, "train", "QUEUED").locator(".badge.unclaimable")
    expect(needs_gpu).to_have_text("needs gpu, python: no agent with them seen in the last hour", timeout=PROBLEMS)
    # Its title is check()'s own account, as the problems panel lists it.
    assert needs_gpu.get_attribute("title") == orm(unclaimable_text, "train")
    expect(page.locator(f'#problems li[data-code="{UNCLAIMABLE_REQUIREMENTS}"][data-task="train"]')).to_have_count(1)
    # An agent that holds python was seen: lint only says what it needs.
    expect(card(page, "lint", "QUEUED").locator(".badge.needs-capabilities")).to_have_text("needs python")
    expect(card(page, "lint", "QUEUED").locator(".badge.unclaimable")).to_have_count(0)
    expect(card(page, "free", "QUEUED").locator(".badges")).to_have_count(0)

    # Its colours are readable (WCAG AA), and the picture, to look at.
    measured = page.evaluate(CONTRAST_JS, [".card .badge.unclaimable", ".card .badge.needs-capabilities"])
    low = {sel: m for sel, m in measured.items() if m is None or m["ratio"] < 4.5}
    assert low == {}, json.dumps(low, indent=1)
    card(page, "train", "QUEUED").screenshot(path="/tmp/capui-card-unclaimable.png")

    # The details panel: what it requires (and that nobody seen holds it), what it prefers.
    card(page, "train", "QUEUED").click()
    body = page.locator("#details .details-body")
    expect(body.locator("dd.requires")).to_have_text("gpu, python no agent with them seen in the last hour")
    expect(body.locator("dt", has_text="prefers").locator("xpath=following-sibling::dd[1]")).to_have_text(
        "fast (weight 1), model:opus (weight 3)")
    page.locator("#details").screenshot(path="/tmp/capui-details.png")

    # The task's own page says the same (the server's check when it rendered the page).
    task_page = open_page("/board/task/train")
    fields = task_page.locator(".task-page-fields .details-body")
    expect(fields.locator("dt", has_text="requires")).to_have_count(1, timeout=SLOW)
    expect(fields.locator("dd.requires")).to_have_text("gpu, python no agent with them seen in the last hour")
    expect(fields.locator("dd.requires .badge.unclaimable")).to_have_attribute("title", orm(unclaimable_text, "train"))
    expect(fields).to_contain_text("fast (weight 1), model:opus (weight 3)")
    task_page.screenshot(path="/tmp/capui-taskpage.png", full_page=True)

    # An agent holding both is seen: the card, live, and the open panel only say what it needs.
    orm(seen_agent, "gpu-agent", "gpu,python,model:opus")
    expect(needs_gpu).to_have_count(0, timeout=PROBLEMS)
    expect(card(page, "train", "QUEUED").locator(".badge.needs-capabilities")).to_have_text("needs gpu, python")
    expect(body.locator("dd.requires")).to_have_text("gpu, python")
    assert orm(unclaimable_text, "train") is None
    lint_page = open_page("/board/task/lint")
    expect(lint_page.locator(".task-page-fields dd.requires")).to_have_text("python", timeout=SLOW)

    # Claimed, it needs nothing any more: a RUNNING card does not say it.
    orm(transitions.claim, "train", "gpu-agent", 600, capabilities=("gpu", "python"))
    expect(card(page, "train", "RUNNING")).to_be_visible(timeout=SLOW)
    expect(card(page, "train", "RUNNING").locator(".badge.needs-capabilities")).to_have_count(0)


def test_many_long_capabilities_wrap_inside_their_card_at_390_px(open_board, orm):
    labels = [f"repo:acme/service-number-{n}-with-a-long-name" for n in range(8)]
    orm(transitions.create, [TaskSpec(id="wide", title="w", requires=labels)])
    page = open_board(width=390, height=900)
    badge = card(page, "wide", "QUEUED").locator(".badge.unclaimable")
    expect(badge).to_contain_text("no agent with them seen in the last hour", timeout=PROBLEMS)
    box = card(page, "wide").bounding_box()
    inner = badge.bounding_box()
    assert inner["x"] >= box["x"] and inner["x"] + inner["width"] <= box["x"] + box["width"] + 0.5, (inner, box)
    card(page, "wide", "QUEUED").screenshot(path="/tmp/capui-card-390.png")
