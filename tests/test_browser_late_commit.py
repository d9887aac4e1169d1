"""The live board in a real browser on PostgreSQL, where a change can commit after a snapshot
whose last event id is above its own.

PostgreSQL hands out event ids when a transaction inserts its history row, not when it commits:
a transaction that took id N and commits after another one that took N+1 leaves N missing
until then. A page whose snapshot was read in that moment has `last_event_id` >= N+1 and does
not hold N's change; the server's tailer delivers N once it commits (board/live/outbox.py), and
the page must apply it even though its id is below the snapshot's. Before the fix the page took
every change with an id at or below the snapshot's for one the snapshot already held, and the
task never appeared until the next reload.

Without /usr/bin/chromium, the playwright package or PostgreSQL these tests fail in CI (CI=true)
and are skipped elsewhere with a NOT RUN line."""
from __future__ import annotations

import threading

import pytest
from django.db import connections

from board.engine import transitions
from board.engine.stores import store
from board.engine.transitions import TaskSpec
from board.models import TaskEvent
from harness.browser import launch_chromium
from tests.support import postgres_db_mark
from tests.test_browser import ARRIVAL, SLOW, card, count, orm  # noqa: F401  (orm: a fixture)
from tests.test_live_board import pg_server, staff_session  # noqa: F401  (pg_server: a fixture)

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = sync_playwright = None

ALIAS = "postgres"
pytestmark = [pytest.mark.browser, *postgres_db_mark()]

WAIT = 60  # s: bound for the holding transaction's steps


def last_event_id() -> int:
    return TaskEvent.objects.using(ALIAS).order_by("-id").values_list("id", flat=True).first() or 0


def test_a_task_committed_after_the_snapshot_with_a_lower_event_id_appears(pg_server, orm):
    inserted, release, failures = threading.Event(), threading.Event(), []
    ids: dict[str, int] = {}

    def late_create():
        # Takes its event id first and commits last: the snapshot below is read in between.
        try:
            with store(ALIAS).write_transaction():
                transitions.create([TaskSpec(id="late", title="committed after the snapshot")], using=ALIAS)
                ids["late"] = last_event_id()
                inserted.set()
                assert release.wait(timeout=WAIT), "the test never released the transaction"
        except BaseException as exc:  # judged by the test
            failures.append(exc)
            inserted.set()
        finally:
            connections[ALIAS].close()

    holder = threading.Thread(target=late_create)
    holder.start()
    try:
        assert inserted.wait(timeout=WAIT) and not failures, failures
        orm(transitions.create, [TaskSpec(id="early", title="committed first")], using=ALIAS)
        ids["early"] = orm(last_event_id)
        assert ids["late"] < ids["early"], ids  # the hole the snapshot is read across

        _, session = orm(staff_session, ALIAS)
        with sync_playwright() as playwright:
            chromium = launch_chromium(playwright)
            try:
                context = chromium.new_context(viewport={"width": 1800, "height": 1000})
                context.add_cookies([{"name": "sessionid", "value": session, "url": pg_server.url}])
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(f"{pg_server.url}/board/")
                expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
                expect(card(page, "early", "QUEUED")).to_be_visible(timeout=ARRIVAL)
                # The snapshot the page holds was read while "late" was uncommitted.
                assert card(page, "late", "QUEUED").count() == 0
                expect(count(page, "QUEUED")).to_have_text("1")

                release.set()
                holder.join(timeout=WAIT)
                assert failures == []
                expect(card(page, "late", "QUEUED")).to_be_visible(timeout=ARRIVAL)
                expect(count(page, "QUEUED")).to_have_text("2")
                # Taken by the change frame, not by a repairing snapshot.
                assert page.locator("#connection").get_attribute("data-snapshots") == "1"
                assert errors == []
            finally:
                chromium.close()
    finally:
        release.set()
        holder.join(timeout=WAIT)
