"""Bad input under /api/ is answered in the API's JSON error shape with a 4xx, and changes
nothing: NUL characters (PostgreSQL refuses them in text and jsonb) in every string field and
query parameter, cursors that are not the API's, numbers no column holds, NaN and Infinity, text
that is not UTF-8, JSON nested past any parser's depth, repeated query parameters. Each against
the real server (`manage.py serve`) on a real database: SQLite, and PostgreSQL where it matters.
"""
import base64
import http.client
import json

import pytest
from django.db import connections

from board import agent_keys
from board.engine import transitions
from tests.live_server import BoardServer
from tests.support import database_url, db_state, postgres_db_mark, sqlite_db_mark

pytestmark = sqlite_db_mark()


def on_postgres(test):
    for mark in postgres_db_mark():
        test = mark(test)
    return test


def start(alias: str) -> BoardServer:
    return BoardServer(database_url(connections[alias].settings_dict), args=["--workers", "1"]).start()


@pytest.fixture(scope="module")
def sqlite_server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = start("default")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def postgres_server(django_db_setup, django_db_blocker):
    from django.conf import settings

    if not settings.POSTGRES_AVAILABLE:
        yield None  # the postgres mark has already skipped (or failed, in CI) the test
        return
    with django_db_blocker.unblock():
        server = start("postgres")
    try:
        yield server
    finally:
        server.close()


def send(server: BoardServer, method: str, path: str, key: str | None, body: bytes | None = None,
         content_type: str = "application/json", host: str = "127.0.0.1") -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        headers = {"Host": host, "Content-Type": content_type}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def assert_json_4xx(answer: tuple[int, str, bytes], what: str) -> dict:
    status, content_type, data = answer
    assert 400 <= status < 500, f"{what}: {status} {data[:300]!r}"
    assert content_type.startswith("application/json"), f"{what}: {content_type} {data[:300]!r}"
    body = json.loads(data)
    assert set(body) == {"error"}, f"{what}: {body}"
    assert {"code", "message"} <= set(body["error"]), f"{what}: {body}"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class Board:
    """A board with one task of every kind a request below needs, on `alias`."""

    def __init__(self, alias: str):
        self.alias = alias
        self.agent = agent_keys.create_key("agent-a", using=alias)[1]
        self.operator = agent_keys.create_key("ops", is_operator=True, using=alias)[1]
        transitions.create([transitions.TaskSpec(title="queued", id="q1"),
                            transitions.TaskSpec(title="running", id="r1"),
                            transitions.TaskSpec(title="paused", id="p1"),
                            transitions.TaskSpec(title="held", id="h1", on_hold=True)], actor="test", using=alias)
        self.token = transitions.claim("r1", "agent-a", 600, using=alias).lease.token
        paused = transitions.claim("p1", "agent-a", 600, using=alias).lease.token
        transitions.pause("p1", paused, {"at": 1}, using=alias)


def raw_json(text: str) -> bytes:
    return text.encode()


NUL = "\x00"


def nul_requests(board: Board) -> list[tuple[str, str, str, str, bytes | None]]:
    """(what, key, method, path, body) for a NUL in every string field of every endpoint."""
    token, agent, ops = board.token, board.agent, board.operator

    def body(**fields) -> bytes:
        return json.dumps(fields).encode()

    cases = [
        ("create.id", agent, "POST", "/api/tasks", body(id="a" + NUL, title="t")),
        ("create.title", agent, "POST", "/api/tasks", body(title="t" + NUL)),
        ("create.description", agent, "POST", "/api/tasks", body(title="t", description="d" + NUL)),
        ("create.queue", agent, "POST", "/api/tasks", body(title="t", queue="q" + NUL)),
        ("create.deps", agent, "POST", "/api/tasks", body(title="t", deps=["q1" + NUL])),
        ("create.payload value", agent, "POST", "/api/tasks", body(title="t", payload={"k": "v" + NUL})),
        ("create.payload key", agent, "POST", "/api/tasks", body(title="t", payload={"k" + NUL: 1})),
        ("create batch title", agent, "POST", "/api/tasks", json.dumps([{"title": "ok"}, {"title": NUL}]).encode()),
        ("claim_next.queue", agent, "POST", "/api/claim", body(ttl_seconds=60, queue=NUL)),
        ("renew.token", agent, "POST", "/api/tasks/r1/renew", body(token=token + NUL, ttl_seconds=60)),
        ("renew.checkpoint", agent, "POST", "/api/tasks/r1/renew", body(token=token, ttl_seconds=60, checkpoint=[NUL])),
        ("complete.result", agent, "POST", "/api/tasks/r1/complete", body(token=token, result={"r": NUL})),
        ("fail.error", agent, "POST", "/api/tasks/r1/fail", body(token=token, error="boom" + NUL)),
        ("pause.checkpoint", agent, "POST", "/api/tasks/r1/pause", body(token=token, checkpoint={NUL: NUL})),
        ("release.token", agent, "POST", "/api/tasks/r1/release", body(token=NUL)),
        ("complete.next.queue", agent, "POST", "/api/tasks/r1/complete",
         body(token=token, result={}, next={"ttl_seconds": 60, "queue": "q" + NUL})),
        ("fail.next.request_id", agent, "POST", "/api/tasks/r1/fail",
         body(token=token, error="e", next={"ttl_seconds": 60, "request_id": NUL})),
        ("claim batch.queue", agent, "POST", "/api/claim", body(ttl_seconds=60, max_tasks=5, queue=NUL)),
        ("complete batch.id", agent, "POST", "/api/complete", body(items=[{"id": "r1" + NUL, "token": token, "result": {}}])),
        ("complete batch.result", agent, "POST", "/api/complete", body(items=[{"id": "r1", "token": token, "result": [NUL]}])),
        ("admit.reason", ops, "POST", "/api/tasks/h1/admit", body(reason="why" + NUL)),
        ("requeue.reason", ops, "POST", "/api/tasks/p1/requeue", body(reason=NUL)),
        ("cancel.reason", ops, "POST", "/api/tasks/q1/cancel", body(reason=NUL)),
        ("force-release.reason", ops, "POST", "/api/tasks/r1/force-release", body(reason=NUL)),
        ("force-pause.reason", ops, "POST", "/api/tasks/r1/force-pause", body(reason=NUL)),
    ]
    cases += [
        ("path /api/tasks/%00", agent, "GET", "/api/tasks/%00", None),
        ("path events", agent, "GET", "/api/tasks/q%001/events", None),
        ("path claim", agent, "POST", "/api/tasks/q1%00/claim", body(ttl_seconds=60)),
        ("path renew", agent, "POST", "/api/tasks/r1%00/renew", body(token=token, ttl_seconds=60)),
        ("path fail", agent, "POST", "/api/tasks/r1%00/fail", body(token=token, error="e")),
        ("path admit", ops, "POST", "/api/tasks/h1%00/admit", body()),
    ]
    for query in ["queue=%00", "owner=a%00", "text=%00", "stage=%00", "limit=1%00", "cursor=%00",
                  f"cursor={b64(json.dumps(['2020-01-01T00:00:00+00:00', 'q' + NUL]).encode())}",
                  "%00=1"]:
        cases.append((f"list ?{query}", agent, "GET", f"/api/tasks?{query}", None))
    cases.append(("events ?cursor", agent, "GET", f"/api/tasks/q1/events?cursor={b64(b'[0]' + NUL.encode())}", None))
    return cases


@on_postgres
def test_a_nul_in_any_string_field_or_query_parameter_is_a_json_4xx_on_postgresql(postgres_server):
    board = Board("postgres")
    before = db_state("postgres")
    failures = []
    for what, key, method, path, body in nul_requests(board):
        try:
            error = assert_json_4xx(send(postgres_server, method, path, key, body), what)
            assert error["code"] in ("validation_error", "not_found"), f"{what}: {error}"
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)
    assert db_state("postgres") == before


def fuzz_requests(board: Board) -> list[tuple[str, str, str, str, bytes | None]]:
    """(what, key, method, path, body): inputs no client of this API sends on purpose."""
    token, agent, ops = board.token, board.agent, board.operator
    deep = 10_000
    nested_list = b"[" * deep + b"]" * deep
    cases = [
        # cursors: nested past the parser's depth, of the wrong types, with numbers no column holds
        ("deep cursor", agent, "GET", f"/api/tasks?cursor={b64(nested_list)}", None),
        ("deep events cursor", agent, "GET", f"/api/tasks/q1/events?cursor={b64(nested_list)}", None),
        ("cursor of objects", agent, "GET", f"/api/tasks?cursor={b64(b'[{}, {}]')}", None),
        ("cursor with a nested id", agent, "GET",
         f"/api/tasks?cursor={b64(json.dumps(['2020-01-01T00:00:00+00:00', ['x']]).encode())}", None),
        ("cursor with a number id", agent, "GET",
         f"/api/tasks?cursor={b64(json.dumps(['2020-01-01T00:00:00+00:00', 10**30]).encode())}", None),
        ("events cursor past int64", agent, "GET", f"/api/tasks/q1/events?cursor={b64(str([10**30]).encode())}", None),
        ("events cursor NaN", agent, "GET", f"/api/tasks/q1/events?cursor={b64(b'[NaN]')}", None),
        ("events cursor true", agent, "GET", f"/api/tasks/q1/events?cursor={b64(b'[true]')}", None),
        ("cursor not base64", agent, "GET", "/api/tasks?cursor=%FF%FE", None),
        # query parameters: huge, not UTF-8, repeated
        ("limit huge", agent, "GET", f"/api/tasks?limit={10**40}", None),
        ("limit NaN", agent, "GET", "/api/tasks?limit=NaN", None),
        ("queue not UTF-8", agent, "GET", "/api/tasks?queue=%FF%FE", None),
        ("owner not UTF-8", agent, "GET", "/api/tasks?owner=%C3%28", None),
        ("limit repeated", agent, "GET", "/api/tasks?limit=1&limit=2", None),
        ("queue repeated", agent, "GET", "/api/tasks?queue=a&queue=b", None),
        ("events limit repeated", agent, "GET", "/api/tasks/q1/events?limit=1&limit=500", None),
        # bodies: nested 10,000 deep, NaN and Infinity, numbers no column holds, not UTF-8
        ("body nested 10,000 deep", agent, "POST", "/api/tasks", nested_list),
        ("payload nested 10,000 deep", agent, "POST", "/api/tasks",
         b'{"title": "t", "payload": ' + nested_list + b"}"),
        ("payload NaN", agent, "POST", "/api/tasks", raw_json('{"title": "t", "payload": NaN}')),
        ("payload Infinity", agent, "POST", "/api/tasks", raw_json('{"title": "t", "payload": [Infinity]}')),
        ("priority huge", agent, "POST", "/api/tasks", raw_json('{"title": "t", "priority": ' + "9" * 400 + "}")),
        ("max_retries 1e400", agent, "POST", "/api/tasks", raw_json('{"title": "t", "max_retries": 1e400}')),
        ("ttl NaN", agent, "POST", "/api/claim", raw_json('{"ttl_seconds": NaN}')),
        ("ttl Infinity", agent, "POST", "/api/tasks/q1/claim", raw_json('{"ttl_seconds": Infinity}')),
        ("wait NaN", agent, "POST", "/api/claim", raw_json('{"ttl_seconds": 5, "wait_seconds": NaN}')),
        ("progress NaN", agent, "POST", "/api/tasks/r1/renew",
         raw_json(f'{{"token": "{token}", "ttl_seconds": 60, "progress": NaN}}')),
        ("checkpoint -Infinity", agent, "POST", "/api/tasks/r1/renew",
         raw_json(f'{{"token": "{token}", "ttl_seconds": 60, "checkpoint": -Infinity}}')),
        ("result NaN", agent, "POST", "/api/tasks/r1/complete", raw_json(f'{{"token": "{token}", "result": NaN}}')),
        ("next ttl NaN", agent, "POST", "/api/tasks/r1/complete",
         raw_json(f'{{"token": "{token}", "result": {{}}, "next": {{"ttl_seconds": NaN}}}}')),
        ("next wait Infinity", agent, "POST", "/api/tasks/r1/release",
         raw_json(f'{{"token": "{token}", "next": {{"ttl_seconds": 5, "wait_seconds": Infinity}}}}')),
        ("max_tasks huge", agent, "POST", "/api/claim", raw_json('{"ttl_seconds": 5, "max_tasks": ' + "9" * 400 + "}")),
        ("max_tasks 1e400", agent, "POST", "/api/claim", raw_json('{"ttl_seconds": 5, "max_tasks": 1e400}')),
        ("batch result NaN", agent, "POST", "/api/complete",
         raw_json(f'{{"items": [{{"id": "r1", "token": "{token}", "result": NaN}}]}}')),
        ("batch items nested 10,000 deep", agent, "POST", "/api/complete", b'{"items": ' + nested_list + b"}"),
        ("batch of 100,000 items", agent, "POST", "/api/complete",
         json.dumps({"items": [{"id": f"x{i}", "token": "t", "result": {}} for i in range(100_000)]}).encode()),
        ("version past int64", ops, "POST", "/api/tasks/q1/cancel", raw_json('{"version": ' + str(10**30) + "}")),
        ("version negative past int64", ops, "POST", "/api/tasks/h1/admit", raw_json('{"version": ' + str(-(10**30)) + "}")),
        ("title not UTF-8", agent, "POST", "/api/tasks", b'{"title": "\xff\xfe"}'),
        ("title a lone surrogate", agent, "POST", "/api/tasks", raw_json('{"title": "a\\ud800b"}')),
        ("description a lone surrogate", agent, "POST", "/api/tasks",
         raw_json('{"title": "t", "description": "\\udfff"}')),
        ("payload a lone surrogate", agent, "POST", "/api/tasks", raw_json('{"title": "t", "payload": ["\\ud800"]}')),
        ("fail error a lone surrogate", agent, "POST", "/api/tasks/r1/fail",
         raw_json(f'{{"token": "{token}", "error": "\\ud800"}}')),
        ("reason a lone surrogate", ops, "POST", "/api/tasks/q1/cancel", raw_json('{"reason": "\\ud800"}')),
        ("result key a lone surrogate", agent, "POST", "/api/tasks/r1/complete",
         raw_json(f'{{"token": "{token}", "result": {{"\\ud800": 1}}}}')),
        ("body not JSON", agent, "POST", "/api/tasks", b"title=t"),
        ("body empty", agent, "POST", "/api/tasks", b""),
        ("body a number", agent, "POST", "/api/tasks", b"1e999999"),
        ("id in path 10,000 long", agent, "GET", "/api/tasks/" + "a" * 10_000, None),
        ("2,000 query parameters", agent, "GET", "/api/tasks?" + "&".join(f"p{i}=1" for i in range(2000)), None),
        ("2,000 repeats of limit", agent, "GET", "/api/tasks?" + "&".join("limit=1" for _ in range(2000)), None),
        ("path not UTF-8", agent, "GET", "/api/tasks/%FF%FE/events", None),
        ("PUT", agent, "PUT", "/api/tasks/q1", b'{"title": "t"}'),
        ("DELETE", agent, "DELETE", "/api/tasks/q1", None),
        ("PATCH on claim", agent, "PATCH", "/api/claim", b"{}"),
        ("a key of 8 KB", "k" * 8192, "GET", "/api/tasks", None),
        ("path with a dot segment", agent, "GET", "/api/tasks/../check", None),
    ]
    return cases


@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=postgres_db_mark())])
def test_fuzzed_input_is_a_json_4xx_and_changes_nothing(alias, request):
    server = request.getfixturevalue("sqlite_server" if alias == "default" else "postgres_server")
    board = Board(alias)
    before = db_state(alias)
    failures = []
    for what, key, method, path, body in fuzz_requests(board):
        try:
            assert_json_4xx(send(server, method, path, key, body), what)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    for host in ("evil.example", "bad host", "\u00e9.example"):
        try:
            assert_json_4xx(send(server, "POST", "/api/tasks", board.agent, b'{"title": "t"}', host=host), f"Host {host}")
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)
    assert db_state(alias) == before


@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=postgres_db_mark())])
def test_json_nested_10_000_deep_is_422(alias, request):
    # The depth cap itself (64 stored, 65 refused) is tests/test_limits_json_depth.py's.
    server = request.getfixturevalue("sqlite_server" if alias == "default" else "postgres_server")
    board = Board(alias)
    before = db_state(alias)
    too_deep = b"[" * 10_000 + b"]" * 10_000
    error = assert_json_4xx(send(server, "POST", "/api/tasks", board.agent, b'{"title": "t", "payload": ' + too_deep + b"}"),
                            "payload nested 10,000 deep")
    assert error["code"] == "validation_error" and "payload" in error["message"], error
    assert db_state(alias) == before


def test_a_crash_under_api_is_a_json_500_and_its_traceback_is_logged():
    # A store that cannot be reached makes every request crash: the one real crash left to see.
    # No pool: the refused connection fails the request at once (the pool would wait 5 s first).
    server = BoardServer("postgres://postgres@127.0.0.1:1/taskflow", env={"DATABASE_POOL": "0"},
                         args=["--workers", "1"]).start()
    try:
        status, content_type, data = send(server, "GET", "/api/tasks", "tfk_any")
        assert status == 500 and content_type.startswith("application/json"), data[:300]
        assert json.loads(data)["error"]["code"] == "internal_error"
        assert "Internal Server Error: /api/tasks" in server.log_tail(100_000)
        assert "OperationalError" in server.log_tail(100_000)
    finally:
        server.close()
