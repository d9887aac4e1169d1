"""OpenTelemetry traces (server/tracing.py, board/engine/tracing.py, the client's
traceparent): on with OTEL_EXPORTER_OTLP_ENDPOINT, and then the request's span, the engine's
move and the database's statements form one tree in the agent's trace; off (the default)
nothing of OpenTelemetry is loaded.

- The span tree: the board's own HTTP stack (taskflow_site.asgi under uvicorn) with the SDK's
  InMemorySpanExporter in its process (harness/traced_board.py), on the PostgreSQL test
  database; this process is the agent (the real client, under a span of its own). A process of
  its own because the API works on the "default" alias, SQLite in this session, and because
  psycopg's instrumentation traces only the connections opened after it.
- The real server (`manage.py serve`, its uvicorn workers) and the reaper (`manage.py reap`)
  started with the variable pointing at a small OTLP/HTTP receiver here, which decodes what
  arrives (opentelemetry-proto).
- The MCP server passes the trace of an MCP client's tool call on to the board.
- Off: a fresh interpreter runs requests through the server's application and lists the
  opentelemetry modules it loaded (none); the same probe with the variable set finds them.
- The client's header, and the engine's spans of refusals, reclaims and operators' verbs.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connections
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from board import agent_keys
from board.engine import errors, transitions
from board.engine import tracing as engine_tracing
from board.models import Task
from taskflow_client import Client
from tests.live_server import ROOT, BoardServer, server_env, wait_until
from tests.support import database_url, end_backoff, expire_lease, postgres_db_mark, sqlite_db_mark

pytestmark = sqlite_db_mark()

PG = "postgres"
AGENT = "traced-agent"
# The agent's own span: the trace the board's spans must join.
AGENT_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
AGENT_SPAN_ID = 0x00F067AA0BA902B7


def on_postgres(test):
    for mark in postgres_db_mark():
        test = mark(test)
    return test


def agent_span():
    """The calling program's current span (as an agent using OpenTelemetry has one)."""
    return trace.use_span(NonRecordingSpan(SpanContext(
        AGENT_TRACE_ID, AGENT_SPAN_ID, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))))


def children(spans: list[dict], parent: dict) -> list[dict]:
    return [span for span in spans if span["parent_id"] == parent["span_id"]]


def assert_no_secret(spans: list[dict], *secrets: str) -> None:
    text = json.dumps(spans)
    for secret in secrets:
        assert secret not in text


# ---------------------------------------------------------------------------------------------
# The span tree of claim -> complete, in-process exporter


class TracedBoard:
    """harness/traced_board.py as a child process: the board's HTTP stack with its spans in memory."""

    def __init__(self, url: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DJANGO_SETTINGS_MODULE"))}
        env.update(DATABASE_URL=url, SECRET_KEY="traced-board-test", DEBUG="1", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([sys.executable, "-m", "harness.traced_board"], cwd=ROOT, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()  # ends when the child prints or exits
        assert line.startswith("ready "), f"the traced board did not start: {line!r}"
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def spans(self) -> list[dict]:
        self.process.stdin.write("spans\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("stop\n")
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def traced_board():
    board = TracedBoard(database_url(connections[PG].settings_dict))
    try:
        yield board
    finally:
        board.close()


def assert_move_tree(spans: list[dict], path: str, verb_span: str, verb: str, task_id: str, fence: int) -> dict:
    """The request's server span (child of the agent's span) -> the engine's move span -> the
    database's spans; returns the move span."""
    server = [s for s in spans if s["kind"] == "SERVER" and s["attributes"].get("http.route") == path]
    assert len(server) == 1, [(s["name"], s["attributes"]) for s in spans]
    server = server[0]
    assert server["trace_id"] == f"{AGENT_TRACE_ID:032x}"
    assert (server["parent_id"], server["parent_is_remote"]) == (f"{AGENT_SPAN_ID:016x}", True)
    moves = [s for s in children(spans, server) if s["name"] == verb_span]
    assert len(moves) == 1, [s["name"] for s in children(spans, server)]
    move = moves[0]
    assert move["kind"] == "INTERNAL"
    assert move["attributes"] == {"taskflow.verb": verb, "taskflow.task.id": task_id, "taskflow.queue": "work",
                                  "taskflow.fence": fence, "taskflow.outcome": "won"}
    statements = children(spans, move)
    assert statements, f"no database span under {verb_span}"
    assert {s["kind"] for s in statements} == {"CLIENT"}
    assert {s["attributes"]["db.system"] for s in statements} == {"postgresql"}
    assert any("UPDATE" in s["attributes"].get("db.statement", "") for s in statements)
    return move


@on_postgres
def test_claim_then_complete_make_one_tree_in_the_agents_trace(traced_board):
    _, key = agent_keys.create_key(AGENT, using=PG)
    transitions.create(transitions.TaskSpec(id="traced-1", title="t", queue="work"), using=PG)
    client = Client(traced_board.url, key)
    with agent_span():
        lease = client.claim_next(30, queue="work")
        lease.complete({"done": True})
    spans = traced_board.spans()
    assert {s["trace_id"] for s in spans} == {f"{AGENT_TRACE_ID:032x}"}
    assert_move_tree(spans, "api/claim", "taskflow.claim_next", "claim", "traced-1", 1)
    assert_move_tree(spans, "api/tasks/<task_id>/complete", "taskflow.complete", "complete", "traced-1", 1)
    assert_no_secret(spans, lease.token, key)
    assert Task.objects.using(PG).get(pk="traced-1").stage == "COMPLETED"


# ---------------------------------------------------------------------------------------------
# The real server exports through OTLP/HTTP


class OtlpReceiver:
    """A plain HTTP server that keeps every POST (path, content type, body): what a collector
    would get from the board's exporter."""

    def __init__(self):
        self.posts: list[tuple[str, str, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.posts.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[dict]:
        """Every span received, decoded."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []
        for path, content_type, body in list(self.posts):
            assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex() or None, "service": resource.get("service.name"),
                            "attributes": {a.key: _any_value(a.value) for a in span.attributes},
                        })
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _any_value(value):
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
def receiver():
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture
def exporting_server(receiver, django_db_blocker):
    """`manage.py serve` (two workers) on the PostgreSQL test database, exporting to `receiver`."""
    with django_db_blocker.unblock():
        url = database_url(connections[PG].settings_dict)
    server = BoardServer(url, env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"})
    server.start()
    try:
        yield server
    finally:
        server.close()


def spans_of_trace(receiver: OtlpReceiver, trace_id: int, names: set[str]) -> list[dict]:
    """Wait (bounded) until the spans named `names` of this trace have arrived; all of the trace's."""
    def arrived():
        spans = [s for s in receiver.spans() if s["trace_id"] == f"{trace_id:032x}"]
        return spans if names <= {s["name"] for s in spans} else None

    return wait_until(arrived, 20, f"spans {sorted(names)} exported")


@on_postgres
def test_the_real_server_exports_its_spans_over_otlp_http(receiver, exporting_server):
    _, key = agent_keys.create_key(AGENT, using=PG)
    transitions.create(transitions.TaskSpec(id="exported-1", title="t", queue="work"), using=PG)
    client = Client(exporting_server.url, key)
    with agent_span():
        lease = client.claim_next(30, queue="work")
        lease.complete({})
    spans = spans_of_trace(receiver, AGENT_TRACE_ID, {"taskflow.claim_next", "taskflow.complete"})
    assert {s["service"] for s in spans} == {"taskflow-board"}
    complete = next(s for s in spans if s["name"] == "taskflow.complete")
    request = next(s for s in spans if s["span_id"] == complete["parent_id"])
    assert request["attributes"]["http.route"] == "api/tasks/<task_id>/complete"
    assert request["parent_id"] == f"{AGENT_SPAN_ID:016x}"
    assert complete["attributes"]["taskflow.task.id"] == "exported-1"
    assert any(s["parent_id"] == complete["span_id"] and s["attributes"].get("db.system") == "postgresql"
               for s in spans)
    assert_no_secret(spans, lease.token, key)


@on_postgres
def test_with_tracing_on_a_disallowed_host_still_gets_the_apis_error_shape(receiver, exporting_server):
    """Django's instrumentation reads the request's host (build_absolute_uri) as it starts:
    below the API's error shape, so that a disallowed Host is refused as any other request is."""
    import http.client

    _, key = agent_keys.create_key(AGENT, using=PG)
    before = Task.objects.using(PG).count()
    conn = http.client.HTTPConnection("127.0.0.1", exporting_server.port, timeout=30)
    try:
        conn.request("POST", "/api/tasks", body=b'{"title": "t"}', headers={
            "Host": "evil.example", "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        status, content_type, body = response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()
    assert status == 400 and content_type.startswith("application/json"), (status, content_type, body[:300])
    assert set(json.loads(body)["error"]) >= {"code", "message"}
    assert Task.objects.using(PG).count() == before


@on_postgres
def test_the_mcp_server_carries_the_mcp_clients_trace_to_the_board(receiver, exporting_server):
    from anyio.from_thread import start_blocking_portal
    from mcp import Client as McpClient
    from mcp import StdioServerParameters

    _, key = agent_keys.create_key(AGENT, using=PG)
    transitions.create(transitions.TaskSpec(id="mcp-1", title="t", queue="work"), using=PG)
    tool_trace, tool_span = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    meta = {"traceparent": f"00-{tool_trace:032x}-{tool_span:016x}-01"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskflow_client.mcp"], cwd=str(ROOT), env={
        "TASKFLOW_URL": exporting_server.url, "TASKFLOW_KEY": key, "PYTHONPATH": str(ROOT)})
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(McpClient(params)) as mcp:
        claimed = portal.call(functools.partial(mcp.call_tool, "claim", {"queue": "work", "ttl_seconds": 30},
                                                meta=meta))
        assert not claimed.is_error, claimed.content
        done = portal.call(functools.partial(mcp.call_tool, "complete", {"task_id": "mcp-1"}, meta=meta))
        assert not done.is_error, done.content
    spans = spans_of_trace(receiver, tool_trace, {"taskflow.claim_next", "taskflow.complete"})
    requests = [s for s in spans if s["attributes"].get("http.route")]
    assert {s["attributes"]["http.route"] for s in requests} == {"api/claim", "api/tasks/<task_id>/complete"}
    # The MCP server records no span of its own (no SDK there): the board's request spans are
    # the children of the MCP client's.
    assert {s["parent_id"] for s in requests} == {f"{tool_span:016x}"}


@on_postgres
def test_the_reaper_exports_a_span_per_lease_it_takes_back_and_nothing_else(receiver):
    """`manage.py reap` with the variable set: one `taskflow.reclaim` span per lease taken back,
    with its statements under it; the pass's other statements (the scan for expired leases, the
    admission sweep, the pass's record) start no trace of their own."""
    transitions.create(transitions.TaskSpec(id="lost-1", title="t", queue="work"), using=PG)
    held = transitions.claim("lost-1", AGENT, 30, using=PG)
    expire_lease("lost-1", using=PG)
    env = server_env(database_url(connections[PG].settings_dict), "reaper-test",
                     OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
    done = subprocess.run([sys.executable, "manage.py", "reap"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["reclaimed lost-1 -> QUEUED"]
    spans = receiver.spans()  # the exporter flushed as the command ended
    reclaim = [s for s in spans if s["name"] == "taskflow.reclaim"]
    assert len(reclaim) == 1, [s["name"] for s in spans]
    assert reclaim[0]["parent_id"] is None
    assert reclaim[0]["attributes"] == {"taskflow.verb": "reclaim", "taskflow.task.id": "lost-1",
                                        "taskflow.queue": "work", "taskflow.fence": 1, "taskflow.outcome": "won"}
    others = [s for s in spans if s is not reclaim[0]]
    assert others and all(s["trace_id"] == reclaim[0]["trace_id"] and s["parent_id"] == reclaim[0]["span_id"]
                          for s in others), [(s["name"], s["parent_id"]) for s in others]
    assert_no_secret(spans, held.lease.token)


# ---------------------------------------------------------------------------------------------
# Off by default: nothing loaded


OFF_PROBE = """
import asyncio, json, os, sys
from taskflow_site.asgi import application
import taskflow_client

async def call(method, path, body=None):
    sent = []
    data = json.dumps(body).encode() if body is not None else b""
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"authorization", f"Bearer {os.environ['PROBE_KEY']}".encode()),
                         (b"content-type", b"application/json"), (b"host", b"127.0.0.1"),
                         (b"content-length", str(len(data)).encode()),
                         (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1234), "scheme": "http", "http_version": "1.1"}
    async def receive():
        return {"type": "http.request", "body": data, "more_body": False}
    async def send(message):
        sent.append(message)
    await application(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"] or b"null")

async def main():
    status, claim = await call("POST", "/api/claim", {"ttl_seconds": 30})
    token = claim["lease"]["token"]
    done, _ = await call("POST", f"/api/tasks/{claim['task']['id']}/complete", {"token": token, "result": {}})
    from django.conf import settings
    print(json.dumps({"statuses": [status, done],
                      "opentelemetry": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"),
                      "middleware": [m for m in settings.MIDDLEWARE if "opentelemetry" in m]}))

asyncio.run(main())
"""


@pytest.mark.parametrize("tracing", [False, True], ids=["off", "on"])
@pytest.mark.django_db(transaction=True, databases=["default"])
def test_without_the_variable_no_opentelemetry_module_is_loaded(tracing, receiver):
    """A request through the server's application (taskflow_site.asgi), a claim and a complete,
    in a fresh interpreter: without OTEL_EXPORTER_OTLP_ENDPOINT not one opentelemetry module is
    loaded and no middleware added; with it (the probe's other half, so that the check can fail)
    the instrumentation is there."""
    _, key = agent_keys.create_key(AGENT)
    transitions.create(transitions.TaskSpec(id="plain-1", title="t"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DJANGO_SETTINGS_MODULE"))}
    env.update(DATABASE_URL=database_url(connections["default"].settings_dict), SECRET_KEY="probe", DEBUG="1",
               PROBE_KEY=key, DJANGO_SETTINGS_MODULE="taskflow_site.settings")
    if tracing:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
    done = subprocess.run([sys.executable, "-c", OFF_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["statuses"] == [200, 200]
    if not tracing:
        assert found["opentelemetry"] == []
        assert found["middleware"] == []
    else:
        assert "opentelemetry.sdk.trace" in found["opentelemetry"]
        assert found["middleware"] == [
            "opentelemetry.instrumentation.django.middleware.otel_middleware._DjangoMiddleware"]
    assert Task.objects.get(pk="plain-1").stage == "COMPLETED"


# ---------------------------------------------------------------------------------------------
# The client's traceparent


class HeaderCatcher:
    """A plain HTTP server that answers every request 200 `{}` and keeps its headers."""

    def __init__(self):
        self.headers: list[dict[str, str]] = []
        catcher = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                catcher.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def test_the_client_sends_its_callers_trace_or_a_fresh_one_of_its_own():
    catcher = HeaderCatcher()
    try:
        client = Client(catcher.url, "key")
        client.request("GET", "/x")
        client.request("GET", "/x")
        state = TraceState([("vendor", "v1")])
        with trace.use_span(NonRecordingSpan(SpanContext(AGENT_TRACE_ID, AGENT_SPAN_ID, is_remote=False,
                                                         trace_flags=TraceFlags(0), trace_state=state))):
            client.request("GET", "/x")
    finally:
        catcher.close()
    first, second, traced = catcher.headers
    fresh = [TRACEPARENT.match(h["traceparent"]) for h in (first, second)]
    assert all(fresh), (first, second)
    # Each request a trace of its own, sampled so that a tracing board records it.
    assert fresh[0][1] != fresh[1][1] and fresh[0][2] != fresh[1][2]
    assert {m[3] for m in fresh} == {"01"}
    assert "tracestate" not in first
    # Under the caller's span: its ids and flags (not sampled here: the board then records nothing).
    assert traced["traceparent"] == f"00-{AGENT_TRACE_ID:032x}-{AGENT_SPAN_ID:016x}-00"
    assert traced["tracestate"] == "vendor=v1"


# ---------------------------------------------------------------------------------------------
# The engine's spans: refusals, the reaper's reclaim, an operator's verb


@pytest.fixture
def engine_spans():
    """The engine's spans on, into memory (no HTTP, no database instrumentation)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine_tracing.enable(provider.get_tracer("test"))
    try:
        yield exporter
    finally:
        engine_tracing.disable()
        provider.shutdown()


def named(exporter, name: str) -> list[dict]:
    return [dict(span.attributes) for span in exporter.get_finished_spans() if span.name == name]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_engine_spans_of_a_refusal_a_reclaim_and_an_operators_cancel(engine_spans):
    transitions.create([transitions.TaskSpec(id="e1", title="t", queue="q"),
                        transitions.TaskSpec(id="e2", title="t", queue="q")])
    held = transitions.claim("e1", "a", 30)
    with pytest.raises(errors.Taken):
        transitions.claim("e1", "b", 30)
    Task.objects.filter(pk="e1").update(lease_expires_at=held.task.lease_expires_at - timedelta(hours=1))
    assert [r.task_id for r in transitions.reclaim_expired()] == ["e1"]
    transitions.cancel("e2", actor="operator")
    assert transitions.claim_next("a", 30, queue="empty") is None

    assert named(engine_spans, "taskflow.create") == [
        {"taskflow.verb": "create", "taskflow.task.count": 2, "taskflow.outcome": "won"}]
    assert named(engine_spans, "taskflow.claim") == [
        {"taskflow.verb": "claim", "taskflow.task.id": "e1", "taskflow.queue": "q", "taskflow.fence": 1,
         "taskflow.outcome": "won"},
        {"taskflow.verb": "claim", "taskflow.task.id": "e1", "taskflow.error.code": "taken", "taskflow.queue": "q",
         "taskflow.fence": 1, "taskflow.outcome": "refused"}]
    assert named(engine_spans, "taskflow.reclaim") == [
        {"taskflow.verb": "reclaim", "taskflow.task.id": "e1", "taskflow.queue": "q", "taskflow.fence": 1,
         "taskflow.outcome": "won"}]
    assert named(engine_spans, "taskflow.cancel") == [
        {"taskflow.verb": "cancel", "taskflow.task.id": "e2", "taskflow.queue": "q", "taskflow.fence": 0,
         "taskflow.outcome": "won"}]
    assert named(engine_spans, "taskflow.claim_next") == [{"taskflow.verb": "claim", "taskflow.outcome": "empty"}]
    assert held.lease.token not in json.dumps([dict(s.attributes) for s in engine_spans.get_finished_spans()])
    # A refusal is an answer, not an error of the board; its span's status stays unset.
    assert {span.status.status_code.name for span in engine_spans.get_finished_spans()} == {"UNSET"}


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_every_verb_of_holders_and_operators_makes_its_span(engine_spans):
    transitions.create([transitions.TaskSpec(id="v1", title="t", queue="q"),
                        transitions.TaskSpec(id="v2", title="t", queue="q", on_hold=True)])
    lease = transitions.claim("v1", "a", 30).lease
    transitions.renew("v1", lease.token, 30)
    transitions.pause("v1", lease.token, {"step": 1})
    lease = transitions.resume("v1", "a", 30).lease
    transitions.fail("v1", lease.token, "boom")
    end_backoff("v1")
    lease = transitions.claim_next("a", 30, queue="q").lease
    transitions.release("v1", lease.token)
    lease = transitions.claim("v1", "a", 30).lease
    transitions.force_pause("v1", actor="op")
    transitions.requeue("v1", actor="op")
    transitions.claim("v1", "a", 30)
    transitions.force_release("v1", actor="op")
    lease = transitions.claim("v1", "a", 30).lease
    transitions.complete("v1", lease.token, {})
    transitions.edit("v2", actor="op", version=0, title="renamed")
    transitions.admit("v2", actor="op")

    spans = engine_spans.get_finished_spans()
    assert [span.name for span in spans] == [f"taskflow.{name}" for name in (
        "create", "claim", "renew", "pause", "resume", "fail", "claim_next", "release", "claim", "force_pause",
        "requeue", "claim", "force_release", "claim", "complete", "edit", "admit")]
    assert {span.attributes["taskflow.outcome"] for span in spans} == {"won"}
    assert {span.attributes["taskflow.task.id"] for span in spans[1:]} == {"v1", "v2"}
    fences = [span.attributes["taskflow.fence"] for span in spans if span.attributes.get("taskflow.task.id") == "v1"]
    assert fences == [1, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6]  # rises with each new holder, never on renew


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_engine_verbs_make_no_span_while_tracing_is_off(engine_spans):
    engine_tracing.disable()
    transitions.create(transitions.TaskSpec(id="quiet", title="t"))
    transitions.claim("quiet", "a", 30)
    assert engine_spans.get_finished_spans() == ()



@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_batch_of_completions_on_sqlite_makes_one_span_and_a_span_per_item_it_did_not_make(engine_spans):
    transitions.create([transitions.TaskSpec(id=f"b{i}", title="t", queue="q") for i in range(3)])
    claims = transitions.claim_batch("a", 30, 3)
    items = [transitions.CompleteItem(c.task.pk, c.lease.token, {}) for c in claims]
    items[1] = transitions.CompleteItem(items[1].task_id, "stale", {})
    done = transitions.complete_batch(items, agent="a")
    assert [getattr(t, "stage", type(t).__name__) for t in done] == ["COMPLETED", "LeaseLost", "COMPLETED"]
    assert named(engine_spans, "taskflow.complete_batch") == [
        {"taskflow.verb": "complete", "taskflow.task.count": 3, "taskflow.outcome": "won"}]
    assert named(engine_spans, "taskflow.complete") == [
        {"taskflow.verb": "complete", "taskflow.task.id": claims[1].task.pk, "taskflow.error.code": "lease_lost",
         "taskflow.queue": "q", "taskflow.fence": 1, "taskflow.outcome": "refused"}]
