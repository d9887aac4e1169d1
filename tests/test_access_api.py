"""What a person's session may do through the API and the board page (issue 6), against the real
server (`manage.py serve`) on the real SQLite database, each user logged in through the admin's
login form as a browser does.

The model (board/access.py): reading needs board.view_task, creating board.add_task, the
operators' verbs board.intervene; claiming and the holder's verbs are for agent keys only, even
for a superuser. Every refusal is 403 in the API's error shape and leaves the database as it
was; everything the kanban page calls still works for a user with the permissions it needs.
"""
from __future__ import annotations

import http.client
import json
import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Permission, User

from board import agent_keys
from tests.live_server import BoardServer, board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark

pytestmark = sqlite_db_mark()

PASSWORD = "a long enough password"


class Browser:
    """A browser's session on the real server: cookies, the CSRF header on writes."""

    def __init__(self, server: BoardServer):
        self.server = server
        self.jar = SimpleCookie()

    def request(self, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        try:
            sent = {"Cookie": "; ".join(f"{k}={m.value}" for k, m in self.jar.items()), **(headers or {})}
            if method == "POST" and "csrftoken" in self.jar:
                sent.setdefault("X-CSRFToken", self.jar["csrftoken"].value)
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            for value in response.headers.get_all("Set-Cookie") or []:
                self.jar.load(value)
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def login(self, username: str) -> Browser:
        status, _, page = self.request("GET", "/admin/login/?next=/board/")
        assert status == 200
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
        form = urlencode({"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token,
                          "next": "/board/"})
        status, headers, _ = self.request("POST", "/admin/login/?next=/board/", form,
                                          {"Content-Type": "application/x-www-form-urlencoded"})
        assert (status, headers.get("location")) == (302, "/board/"), status
        return self

    def api(self, method: str, path: str, body=None) -> tuple[int, dict | None]:
        status, _, data = self.request(method, "/api" + path, None if body is None else json.dumps(body),
                                       {"Content-Type": "application/json"})
        return status, (json.loads(data) if data else None)


def person(username: str, perms: list[str] = (), *, superuser: bool = False) -> str:
    """A staff user with these permissions and a password the server's hashers verify."""
    hasher = PBKDF2PasswordHasher()
    user = User.objects.create(username=username, is_staff=True, is_superuser=superuser,
                               password=hasher.encode(PASSWORD, hasher.salt()))
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return username


@pytest.fixture
def board(board_server):  # noqa: F811  (the fixture imported above)
    """The server, with task 'seen' QUEUED and task 'held' RUNNING under an agent's lease."""
    _, key = agent_keys.create_key("agent-a")
    agent = Browser(board_server)
    agent_headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for body in ({"id": "seen", "title": "on the board"}, {"id": "held", "title": "being worked on"}):
        status, _, data = agent.request("POST", "/api/tasks", json.dumps(body), agent_headers)
        assert status == 201, data
    status, _, data = agent.request("POST", "/api/tasks/held/claim", json.dumps({"ttl_seconds": 600}),
                                    agent_headers)
    assert status == 200, data
    return board_server


def forbidden(answer) -> str:
    status, body = answer
    assert status == 403, (status, body)
    assert set(body) == {"error"} and body["error"]["code"] == "forbidden", body
    return body["error"]["message"]


READS = ["/tasks", "/tasks/seen", "/tasks/seen/events", "/check"]
AGENT_VERBS = [
    ("/claim", {"ttl_seconds": 60}),
    ("/tasks/seen/claim", {"ttl_seconds": 60}),
    ("/tasks/seen/resume", {"ttl_seconds": 60}),
    ("/tasks/held/renew", {"token": "x" * 43, "ttl_seconds": 60}),
    ("/tasks/held/complete", {"token": "x" * 43, "result": 1}),
    ("/tasks/held/fail", {"token": "x" * 43, "error": "no"}),
    ("/tasks/held/pause", {"token": "x" * 43, "checkpoint": {}}),
    ("/tasks/held/release", {"token": "x" * 43}),
]


def test_staff_without_board_permissions_reads_nothing_and_changes_nothing(board):
    browser = Browser(board).login(person("nobody"))
    before = db_state()
    for path in READS:
        assert "board.view_task" in forbidden(browser.api("GET", path))
    assert "board.add_task" in forbidden(browser.api("POST", "/tasks", {"id": "mine", "title": "x"}))
    for path, body in AGENT_VERBS:
        assert "agent key" in forbidden(browser.api("POST", path, body))
    forbidden(browser.api("POST", "/tasks/seen/cancel", {}))
    status, _, _ = browser.request("GET", "/board/")
    assert status == 403
    assert db_state() == before


def test_a_viewer_reads_and_watches_but_creates_claims_and_acts_on_nothing(board):
    browser = Browser(board).login(person("viewer", ["board.view_task"]))
    before = db_state()
    for path in READS:
        status, body = browser.api("GET", path)
        assert status == 200, (path, body)
    assert [t["id"] for t in browser.api("GET", "/tasks")[1]["items"]] == ["seen", "held"]
    status, _, page = browser.request("GET", "/board/")
    assert status == 200 and b'data-can-intervene="false"' in page
    forbidden(browser.api("POST", "/tasks", {"id": "mine", "title": "x"}))
    for path, body in AGENT_VERBS:
        forbidden(browser.api("POST", path, body))
    forbidden(browser.api("POST", "/tasks/seen/cancel", {}))
    assert db_state() == before


def test_creating_through_a_session_needs_add_task(board):
    browser = Browser(board).login(person("planner", ["board.view_task", "board.add_task"]))
    status, body = browser.api("POST", "/tasks", {"id": "planned", "title": "x"})
    assert status == 201, body
    assert browser.api("GET", "/tasks/planned/events")[1]["items"][0]["actor"] == "planner"


def test_an_operator_does_what_the_kanban_page_calls_but_claims_nothing(board):
    browser = Browser(board).login(person("oper", ["board.view_task", "board.intervene"]))
    status, _, page = browser.request("GET", "/board/")
    assert status == 200 and b'data-can-intervene="true"' in page
    version = browser.api("GET", "/tasks/held")[1]["version"]
    status, body = browser.api("POST", "/tasks/held/force-pause", {"version": version})
    assert status == 200 and body["stage"] == "PAUSED", body
    status, body = browser.api("POST", "/tasks/held/requeue", {"version": body["version"]})
    assert status == 200 and body["stage"] == "QUEUED", body
    before = db_state()
    forbidden(browser.api("POST", "/tasks", {"id": "mine", "title": "x"}))
    for path, body in AGENT_VERBS:
        forbidden(browser.api("POST", path, body))
    assert db_state() == before
    status, body = browser.api("POST", "/tasks/seen/cancel", {"reason": "not needed"})
    assert status == 200 and body["stage"] == "CANCELLED", body


def test_a_superuser_has_every_permission_but_claiming_stays_with_agents(board):
    browser = Browser(board).login(person("root", superuser=True))
    assert browser.api("GET", "/tasks")[0] == 200
    assert browser.request("GET", "/board/")[0] == 200
    assert browser.api("POST", "/tasks", {"id": "by-root", "title": "x"})[0] == 201
    assert browser.api("POST", "/tasks/by-root/cancel", {})[1]["stage"] == "CANCELLED"
    before = db_state()
    for path, body in AGENT_VERBS:
        forbidden(browser.api("POST", path, body))
    assert db_state() == before
