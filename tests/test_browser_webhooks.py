"""Webhooks in a real browser (issue 33, item 6): a staff user who may see webhooks goes from the
board to a webhook's delivery log in two clicks (the header's "Webhooks", then the webhook), and
sees a delivery that failed while the receiver was down, then delivered once it came back.

The receiver is real (tests/webhook_receiver.py: it fails its first delivery); the delivery
passes run in the test's ORM thread with `now` given (the reaper's loop runs the same functions),
never slept for. The server and browser fixtures are tests/test_browser.py's. Screenshots go to
the temporary directory (taskflow-board-screenshots/), never into the repository."""
from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from board.engine import clock
from board.engine.limits import WEBHOOK_BACKOFF_BASE_SECONDS
from board.webhooks import sending
from tests.support import sqlite_db_mark
from tests.test_browser import SLOW, _session_cookie, browser, orm, server  # noqa: F401  (fixtures)
from tests.test_webhooks import fail_task, receivers, subscribe  # noqa: F401  (a fixture)

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

SCREENSHOTS = Path(tempfile.gettempdir()) / "taskflow-board-screenshots"


def _webhook_watcher():
    user = get_user_model().objects.create_user("hook-watcher", password="x", is_staff=True)
    for codename in ("view_task", "view_webhook", "add_webhook"):
        user.user_permissions.add(Permission.objects.get(content_type__app_label="board", codename=codename))
    return user


def test_a_staff_user_sees_a_delivery_arrive_after_the_receiver_came_back(server, browser, orm, receivers,
                                                                          settings):
    settings.TASKFLOW_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = receivers(fail_first=1)
    webhook = orm(subscribe, receiver, events=["task.failed"])
    orm(fail_task, "nightly-build")
    now = orm(clock.now)
    first = orm(sending.deliver, now=now)
    assert [(s.state, s.status) for s in first] == [("pending", 500)]  # the receiver is down

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        context.add_cookies([{"name": "sessionid", "value": orm(lambda: _session_cookie(_webhook_watcher())),
                              "url": server.url}])
        page = context.new_page()
        page.goto(f"{server.url}/board/")
        expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
        # Click 1: the header's Webhooks link, beside Queues.
        page.locator("#site-nav a", has_text="Webhooks").click()
        expect(page).to_have_url(f"{server.url}/admin/board/webhook/")
        row = page.locator("#result_list tbody tr", has_text=receiver.url())
        expect(row).to_contain_text("0 delivered · 1 pending · 0 failed")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "webhooks-list.png"), full_page=True)
        # Click 2: the webhook, with its delivery log.
        row.locator("a", has_text=receiver.url()).click()
        expect(page).to_have_url(f"{server.url}/admin/board/webhook/{webhook.pk}/change/")
        log = page.locator("#delivery-log")
        expect(log.locator("tr.delivery-pending")).to_contain_text("HTTP 500")
        page.screenshot(path=str(SCREENSHOTS / "webhook-receiver-down.png"), full_page=True)

        # The receiver is back; the next attempt after the backoff delivers it.
        later = now + timedelta(seconds=WEBHOOK_BACKOFF_BASE_SECONDS)
        assert [(s.state, s.status) for s in orm(sending.send_due, now=later)] == [("delivered", 200)]
        page.reload()
        delivered = page.locator("#delivery-log tr.delivery-delivered")
        expect(delivered).to_contain_text("✓ delivered")
        expect(delivered).to_contain_text("HTTP 200")
        expect(delivered).to_contain_text("task.failed")
        expect(page.locator(".field-deliveries_summary")).to_contain_text("1 delivered · 0 pending · 0 failed")
        assert receiver.secret not in page.content()
        page.screenshot(path=str(SCREENSHOTS / "webhook-delivered.png"), full_page=True)
    finally:
        context.close()
    assert len(receiver.accepted) == 1 and receiver.bad_signatures == 0

