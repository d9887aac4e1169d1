"""What a new user meets in the first minutes, against the real server as `make run` starts it
(DEBUG on): a quiet log under the banner (a browser's /favicon.ico and other expected 4xx are
not logged), and a staff user without the board's permission told what is missing and whom to ask."""
import http.client
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tests.live_server import sessions_server  # noqa: F401  (fixture)
from tests.support import sqlite_db_mark

pytestmark = sqlite_db_mark()


@pytest.fixture(scope="module")
def server(sessions_server):  # noqa: F811  (the fixture imported above)
    return sessions_server


def get(server, path: str, cookie: str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Cookie": f"sessionid={cookie}"} if cookie else {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_the_favicon_is_served_and_expected_4xx_leave_the_log_quiet(server):
    status, headers, body = get(server, "/favicon.ico")
    assert status == 200 and headers["content-type"] == "image/x-icon"
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO file
    assert "max-age" in headers.get("cache-control", "")
    before = server.log_tail(10**6)
    for path in ("/admin/login/", "/no-such-page", "/api/no-such-endpoint", "/favicon.ico"):
        get(server, path)
    status, _, _ = get(server, "/no-such-page")
    assert status == 404
    marker = get(server, "/healthz")  # the last request: its answer means the others are done
    assert marker[0] in (200, 503)
    added = server.log_tail(10**6)[len(before):]
    assert "Not Found" not in added and "favicon" not in added, added[-2000:]


def test_a_staff_user_without_the_permission_is_told_what_is_missing_and_whom_to_ask(server):
    users = get_user_model().objects
    users.create_superuser("root-ops", "root@example.com", "x")
    viewer = users.create_user(f"newcomer-{time.monotonic_ns()}", password="x", is_staff=True)
    status, headers, body = get(server, "/board/", session_of(viewer))
    page = body.decode()
    assert status == 403 and headers["content-type"].startswith("text/html")
    assert "board.view_task" in page and "Can view task" in page
    assert viewer.username in page and "root-ops" in page  # who is asking, and whom to ask
    assert 'action="/admin/logout/"' in page and 'href="/admin/"' in page
    # With the permission, the same session sees the board.
    viewer.user_permissions.add(Permission.objects.get(codename="view_task", content_type__app_label="board"))
    assert get(server, "/board/", session_of(viewer))[0] == 200
