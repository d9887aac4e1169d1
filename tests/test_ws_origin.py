"""The board socket's Origin check (issue 27, item 13) on the real server with a real websocket
client: an origin is accepted only when its scheme, host and port are those of the page the
socket belongs to (the request's own Host, ws→http / wss→https) or one listed in
CSRF_TRUSTED_ORIGINS; a foreign port or scheme is refused (403 before the handshake)."""
import json
import socket

import pytest
from django.conf import settings
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.live_server import server_for_sessions
from tests.support import sqlite_db_mark
from tests.test_live_board import staff_session

pytestmark = sqlite_db_mark()


def open_board(server, origin: str, session: str, host: str | None = None) -> str:
    """Open the board socket with this Origin (and Host, default the server's address): the
    first frame's type when accepted, "refused <status>" when the handshake is refused."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    uri = f"ws://{host or f'127.0.0.1:{server.port}'}/ws/board/"
    try:
        with connect(uri, sock=sock, origin=origin, additional_headers={"Cookie": f"sessionid={session}"},
                     open_timeout=10, close_timeout=2, max_size=None) as ws:
            return json.loads(ws.recv(timeout=10))["type"]
    except InvalidStatus as refused:
        return f"refused {refused.response.status_code}"
    finally:
        sock.close()


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = server_for_sessions(args=["--workers", "1"])
    try:
        yield server
    finally:
        server.close()


def test_the_pages_own_origin_is_accepted_and_a_foreign_port_or_scheme_is_refused(server):
    _, session = staff_session("default")
    port = server.port
    assert open_board(server, f"http://127.0.0.1:{port}", session) == "snapshot"
    assert open_board(server, f"http://localhost:{port}", session, host=f"localhost:{port}") == "snapshot"
    for foreign in (f"http://127.0.0.1:{port + 1}", "http://127.0.0.1:9999", "http://127.0.0.1",
                    f"https://127.0.0.1:{port}", "https://127.0.0.1"):
        assert open_board(server, foreign, session) == "refused 403", foreign
    # The two: a foreign port and a foreign scheme on a host that ALLOWED_HOSTS allows.
    for foreign in ("http://localhost:9999", "https://localhost"):
        assert open_board(server, foreign, session, host=f"localhost:{port}") == "refused 403", foreign
    # Another allowed host's origin is not this page's.
    assert open_board(server, f"http://localhost:{port}", session) == "refused 403"
    # A Host that ALLOWED_HOSTS does not allow is refused even with its own origin (DNS rebinding).
    assert open_board(server, f"http://evil.example:{port}", session, host=f"evil.example:{port}") == "refused 403"


def test_an_origin_listed_in_csrf_trusted_origins_is_accepted_exactly(django_db_blocker):
    """Behind a proxy that does not say the scheme (no X-Forwarded-Proto), a page served over
    https at board.example:8443 opens its socket: accepted because its origin is listed."""
    with django_db_blocker.unblock():
        trusted = server_for_sessions(args=["--workers", "1"], env={
            "DEBUG": "0", "ALLOWED_HOSTS": "board.example,127.0.0.1", "SECURE_SSL_REDIRECT": "0",
            "CSRF_TRUSTED_ORIGINS": "https://board.example:8443"})
    try:
        _, session = staff_session("default")
        assert settings.SECRET_KEY == trusted.secret_key
        host = "board.example:8443"
        assert open_board(trusted, "https://board.example:8443", session, host=host) == "snapshot"
        for foreign in ("https://board.example", "https://board.example:8444", "https://other.example:8443"):
            assert open_board(trusted, foreign, session, host=host) == "refused 403", foreign
    finally:
        trusted.close()


def scope(host: str, origin: str | None, scheme: str = "ws") -> dict:
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
    return {"type": "websocket", "scheme": scheme, "headers": headers}


def test_the_rule_on_scopes(settings):
    """The rule itself (server.ws_origin.origin_allowed), case by case."""
    from server.ws_origin import origin_allowed

    settings.ALLOWED_HOSTS = ["board.example", "localhost", "[::1]"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.trusted.example", "https://public.example"]
    accepted = [
        scope("board.example", "http://board.example"),
        scope("board.example:80", "http://board.example"),  # default ports filled in
        scope("board.example", "https://board.example", scheme="wss"),
        scope("BOARD.example:8000", "http://board.example:8000"),  # names are case-insensitive
        scope("[::1]:8000", "http://[::1]:8000"),
        scope("localhost:8000", "https://a.trusted.example"),  # listed, by wildcard
        scope("localhost:8000", "https://trusted.example"),  # Django's wildcard takes the domain too
        scope("localhost:8000", "https://public.example:443"),
    ]
    refused = [
        scope("board.example", "https://board.example"),  # scheme
        scope("board.example", "http://board.example", scheme="wss"),
        scope("board.example", "http://board.example:8080"),  # port
        scope("board.example:8000", "http://board.example"),
        scope("board.example", None),  # no Origin
        scope("board.example", "null"),
        scope("board.example", "http://user:pw@board.example"),
        scope("evil.example", "http://evil.example"),  # Host not allowed
        scope("localhost:8000", "http://a.trusted.example"),  # listed with https only
        scope("localhost:8000", "https://public.example:8443"),
        scope("localhost:8000", "https://xtrusted.example"),
    ]
    assert [s["headers"] for s in accepted if not origin_allowed(s)] == []
    assert [s["headers"] for s in refused if origin_allowed(s)] == []
