"""The insights panel's charts in a real browser (Debian's Chromium, Playwright) against the real
server: under a churn of tasks created, claimed and completed by agent threads while the board is
open, the page logs no console error (a chart bar drawn with a negative height did); the charts
share one scale per panel and carry axes. Waits are Playwright's `expect(...)` with a bound."""
from __future__ import annotations

import threading

import pytest
from django.db import connections

from board.engine import transitions
from board.engine.transitions import TaskSpec
from tests.support import sqlite_db_mark
from tests.test_browser import SLOW, browser, open_board, orm, server  # noqa: F401  (fixtures)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

QUEUES = ("ingest", "ux", "mail")


def watch_console(seen: list[str]):
    """A before_load hook: every console error (and warning) the page logs goes to `seen`."""
    def watch(page):
        page.on("console", lambda message: seen.append(f"{message.type}: {message.text}")
                if message.type in ("error", "warning") else None)
    return watch


def churn(agents: int, rounds: int, using: str = "default") -> list[BaseException]:
    """`agents` threads released together by a barrier; each, `rounds` times: create two tasks in
    its queue, claim the next ready one there, complete it. Returns the errors they met."""
    barrier = threading.Barrier(agents)
    errors: list[BaseException] = []

    def agent(n: int):
        queue = QUEUES[n % len(QUEUES)]
        try:
            barrier.wait(timeout=30)
            for i in range(rounds):
                transitions.create([TaskSpec(id=f"c{n}-{i}-{j}", title="churn", queue=queue) for j in (0, 1)],
                                   actor=f"maker-{n}", using=using)
                claim = transitions.claim_next(f"agent-{n}", 60, queue=queue, using=using)
                if claim is not None:
                    transitions.complete(claim.task.id, claim.lease.token, {"i": i}, using=using)
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(n,), name=f"churn-{n}") for n in range(agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def test_a_churn_while_the_board_is_open_logs_no_console_error(open_board):
    """Before the panel's reads shared one snapshot: "Error: <rect> attribute height: A negative
    value is not valid. ("-0.26490066225165565")", 59 times."""
    seen: list[str] = []
    page = open_board(before_load=watch_console(seen))
    panel = page.locator("#insights")
    expect(panel).to_have_attribute("data-updates", "1", timeout=SLOW)
    errors = churn(agents=6, rounds=300)  # about 15 s: five or more of the panel's recomputations
    assert errors == [], errors
    # The panel redrew with the churn's figures (each of the 1,800 rounds completed one task).
    expect(panel).to_have_attribute("data-completed", "1800", timeout=SLOW)
    assert int(panel.get_attribute("data-updates")) >= 3
    assert seen == [], seen
