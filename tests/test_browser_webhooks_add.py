"""A webhook made from the admin's Webhooks page in Chromium (issue 33, item 6): the Add form, then
the one page that shows its signing secret. Its own module, so its own server: the admin's add
writes a LogEntry naming the Webhook content type, whose id a server that served another test's
admin pages has cached from before the database was emptied."""
from __future__ import annotations

import re

import pytest

from board.models import Webhook
from tests.support import sqlite_db_mark
from tests.test_browser import _session_cookie, browser, orm, server  # noqa: F401  (fixtures)
from tests.test_browser_webhooks import SCREENSHOTS, _webhook_watcher

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]


def test_a_webhook_is_made_in_the_admin_and_its_secret_shown_once(server, browser, orm):
    """From the Webhooks page's Add button: the form (URL, events as boxes, the filter, the
    format), then the one page that shows the signing secret."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        context.add_cookies([{"name": "sessionid", "value": orm(lambda: _session_cookie(_webhook_watcher())),
                              "url": server.url}])
        page = context.new_page()
        page.goto(f"{server.url}/admin/board/webhook/")
        page.locator("a.addlink", has_text="Add webhook").click()
        expect(page).to_have_url(f"{server.url}/admin/board/webhook/add/")
        page.fill("#id_url", "https://hooks.example.com/taskflow")  # (a loopback URL is refused here)
        page.check("input[name=event_list][value='approval.requested']")
        page.check("input[name=event_list][value='queue.budget_exhausted']")
        page.fill("#id_filter_queue", "llm-*")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "webhooks-add.png"), full_page=True)
        page.locator("input[name=_save]").click()
        secret = page.locator("#webhook-secret")
        expect(secret).to_have_value(re.compile(r"^whsec_"))
        page.screenshot(path=str(SCREENSHOTS / "webhooks-created.png"), full_page=True)
        made = orm(lambda: Webhook.objects.get())
        assert (made.events, made.filter) == (["approval.requested", "queue.budget_exhausted"], {"queue": "llm-*"})
        assert secret.input_value() == made.secret
        page.locator("a.button", has_text="See the webhook").click()
        expect(page.locator("#content")).to_contain_text("approval.requested, queue.budget_exhausted")
        assert made.secret not in page.content()
    finally:
        context.close()
