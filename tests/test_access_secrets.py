"""No agent key and no lease token ever reaches the server's log or an error answer (issue 9).

Against the real server started as `make run` starts it (DEBUG on) with its access log on: a key
sent without "Bearer", a key or token put in a query string, and a 500 (a real fault in the
database: a trigger refusing the write) while handling a holder's verb. The whole log and every
answer are searched for the secrets.
"""
import http.client
import json
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.db import connection

from board import agent_keys
from tests.live_server import BoardServer, wait_until
from tests.support import database_url, sqlite_db_mark

pytestmark = sqlite_db_mark()

FAULT_TRIGGER = "taskflow_test_refuse_completion"


@pytest.fixture(scope="module")
def debug_server(django_db_setup, django_db_blocker):
    """The server as `make run` starts it (DEBUG=1), with every request logged."""
    with django_db_blocker.unblock():
        url = database_url(connection.settings_dict)
    server = BoardServer(url, env={"DEBUG": "1"}, args=["--workers", "1", "--access-log"]).start()
    try:
        yield server
    finally:
        server.close()


def send_full(server: BoardServer, method: str, path: str, headers: dict, body=None) -> tuple[int, dict, bytes]:
    """One request (a dict or list body is sent as JSON); the status, headers (lower-case names)
    and body of the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def send(server: BoardServer, method: str, path: str, headers: dict, body=None) -> tuple[int, bytes]:
    status, _, answer = send_full(server, method, path, headers, body)
    return status, answer


def whole_log(server: BoardServer) -> str:
    return server.log_tail(chars=10**8)


def assert_nowhere(secrets: list[str], server: BoardServer, answers: list[bytes]) -> None:
    log = whole_log(server)
    for secret in secrets:
        assert secret not in log, f"the server's log holds a secret:\n{log[-3000:]}"
        for answer in answers:
            assert secret.encode() not in answer, answer[:2000]


def test_a_key_sent_without_bearer_or_in_the_query_string_is_never_logged(debug_server):
    _, key = agent_keys.create_key("leaky")
    answers = []
    status, body = send(debug_server, "GET", "/api/tasks", {"Authorization": key})
    assert status == 401, body
    answers.append(body)
    status, body = send(debug_server, "GET", "/api/tasks", {"Authorization": f"Token {key}"})
    assert status == 401, body
    answers.append(body)
    status, body = send(debug_server, "GET", f"/api/tasks?key={key}", {"Authorization": f"Bearer {key}"})
    assert status == 422, body
    answers.append(body)
    # The marker request proves the log was written up to here (access log on).
    send(debug_server, "GET", "/api/check?marker=keys-done", {})
    wait_until(lambda: "marker=keys-done" in whole_log(debug_server), 30, "the access log line")
    assert_nowhere([key, key[len(agent_keys.KEY_PREFIX):]], debug_server, answers)


def test_a_500_while_completing_shows_no_token_nor_key(debug_server):
    _, key = agent_keys.create_key("worker")
    auth = {"Authorization": f"Bearer {key}"}
    assert send(debug_server, "POST", "/api/tasks", auth, {"id": "doomed", "title": "x"})[0] == 201
    status, body = send(debug_server, "POST", "/api/tasks/doomed/claim", auth, {"ttl_seconds": 60})
    assert status == 200, body
    token = json.loads(body)["lease"]["token"]
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER {FAULT_TRIGGER} BEFORE UPDATE ON board_task "
                       "WHEN NEW.stage = 'COMPLETED' BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
    try:
        answers = []
        for accept in ("application/json", "text/html"):
            status, body = send(debug_server, "POST", "/api/tasks/doomed/complete",
                                {**auth, "Accept": accept}, {"token": token, "result": {"n": 1}})
            assert status == 500, body
            answers.append(body)
        status, body = send(debug_server, "GET", f"/api/tasks?token={token}", auth)
        assert status == 422, body
        answers.append(body)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {FAULT_TRIGGER}")
    wait_until(lambda: "injected fault" in whole_log(debug_server), 30, "the 500's log lines")
    send(debug_server, "GET", "/api/check?marker=fault-done", {})
    wait_until(lambda: "marker=fault-done" in whole_log(debug_server), 30, "the access log line")
    assert_nowhere([token, key], debug_server, answers)


def test_a_500_outside_the_api_shows_no_key(debug_server):
    """Django's own error page (DEBUG) lists the request's headers and each frame's variables:
    here a login that fails in the database, sent by a client that also sends its agent key."""
    _, key = agent_keys.create_key("browser-agent")
    password = "a long enough password"
    User.objects.create(username="op", is_staff=True,
                        password=PBKDF2PasswordHasher().encode(password, PBKDF2PasswordHasher().salt()))
    status, headers, page = send_full(debug_server, "GET", "/admin/login/", {})
    assert status == 200
    csrf = SimpleCookie(headers["set-cookie"])["csrftoken"].value
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER {FAULT_TRIGGER} BEFORE UPDATE ON auth_user "
                       "BEGIN SELECT RAISE(ABORT, 'injected login fault'); END")
    try:
        form = urlencode({"username": "op", "password": password, "next": "/admin/"})
        status, _, page = send_full(
            debug_server, "POST", "/admin/login/",
            {"Authorization": f"Bearer {key}", "Cookie": f"csrftoken={csrf}", "X-CSRFToken": csrf,
             "Content-Type": "application/x-www-form-urlencoded", "Accept": "text/html"}, form)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {FAULT_TRIGGER}")
    assert status == 500, page[:500]
    assert b"injected login fault" in page  # Django's debug page, with the request's details
    wait_until(lambda: "injected login fault" in whole_log(debug_server), 30, "the 500's log lines")
    assert_nowhere([key, password], debug_server, [page])
