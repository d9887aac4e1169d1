"""An agent's hot requests through server/hot_requests.py mean what they mean through Django's full
path: the same requests, sent to the server's WSGI application (server.serving.wsgi_application:
HotRequests in front of Django's handler) and to Django's handler alone, get the same status,
headers, body, log lines and latency metric, and change the database the same way. Each
request runs in two worlds that differ only by name (queue and task ids: "zq1…" and "zq2…"), one
per path, so that the answers compare once names, lease tokens and times are blanked."""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import connections
from django.test import override_settings
from django.urls import resolve

from board import agent_keys
from board.api.main import HOT_ROUTES
from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.metrics import API_LATENCY
from board.models import Task
from server import hot_requests
from server.serving import HttpApp, wsgi_application
from tests.support import sqlite_db_mark

pytestmark = sqlite_db_mark()

REQUEST_ID = "hot-path-test-0001"


@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


def call(app, path: str, body=b"", *, key: str | None = None, method: str = "POST", https: bool = True,
         host: str = "testserver") -> Answer:
    """One request into a WSGI application, its environ built by the server's own
    (server.serving.HttpApp._environ, from the ASGI scope uvicorn would hand it)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    path, _, query = path.partition("?")
    headers = [(b"host", host.encode()), (b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode()), (b"x-request-id", REQUEST_ID.encode())]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    env = HttpApp._environ({
        "type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": headers,
        "scheme": "https" if https else "http", "server": ("testserver", 443 if https else 80),
        "client": ("127.0.0.1", 50000), "http_version": "1.1", "root_path": "",
    }, data)
    started = {}

    def start_response(status, headers, exc_info=None):
        started["status"] = int(status.split(" ", 1)[0])
        started["headers"] = {name.lower(): value for name, value in headers}

    result = app(env, start_response)
    try:
        data = b"".join(result)
    finally:
        result.close()
    return Answer(started["status"], started["headers"], data)


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")
WORLDS = ("zq1", "zq2")  # the two worlds' names: queue and task ids "zq1-0", ...
VARYING = {"token": "<token>", "claim_rank": "<rank>"}  # (the rank is a time too)


def _blank(value, world: str):
    if isinstance(value, dict):
        return {k: VARYING[k] if k in VARYING else _blank(v, world) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v, world) for v in value]
    if isinstance(value, str):
        return _TIME.sub("<time>", value).replace(world, "<w>")
    return value


def blanked(answer: Answer, world: str) -> tuple:
    """The answer with its world's name, the lease tokens and the times blanked."""
    headers = {name: value for name, value in answer.headers.items() if name != "content-length"}
    if answer.body and answer.headers.get("content-type", "").startswith("application/json"):
        return answer.status, headers, _blank(answer.json(), world)
    return answer.status, headers, answer.body.decode().replace(world, "<w>")


@pytest.fixture
def apps():
    """(Django's handler alone, the server's application: HotRequests in front of a handler)."""
    server = wsgi_application()
    assert isinstance(server, hot_requests.HotRequests)
    return WSGIHandler(), server


@pytest.fixture
def key() -> str:
    _, key = agent_keys.create_key("hot-agent")
    assert agent_keys.authenticate(key) is not None  # (its first use is recorded: refusals write nothing)
    return key


def seed(world: str, count: int = 3) -> list[str]:
    ids = [f"{world}-{n}" for n in range(count)]
    transitions.create([TaskSpec(title=f"task {n}", id=task_id, queue=world, priority=count - n)
                             for n, task_id in enumerate(ids)], actor="test")
    return ids


def held(world: str, key: str, task_id: str, apps_pair) -> str:
    """Claim `task_id` (through Django's path) for the key; its lease token."""
    answer = call(apps_pair[0], f"/api/tasks/{task_id}/claim", {"ttl_seconds": 60}, key=key)
    assert answer.status == 200, answer.body
    return answer.json()["lease"]["token"]


def world_state(world: str) -> list[tuple]:
    return [(t.pk.replace(world, "<w>"), t.stage, t.version, t.fence, t.owner, t.result, t.attempts)
            for t in Task.objects.filter(queue=world).order_by("pk")]


def both(apps_pair, request, *, key: str, hold: int | None = 0, seed_count: int = 3):
    """`request(world, ids, token)` -> (path, body) sent in the first world through Django's
    path and in the second through the server's; asserts the same blanked answers and the same rows
    after; returns the two answers."""
    answers, states = [], []
    for app, world in zip(apps_pair, WORLDS):
        ids = seed(world, seed_count)
        token = held(world, key, ids[hold], apps_pair) if hold is not None else None
        path, body = request(world, ids, token)
        answer = call(app, path, body, key=key)
        answers.append(blanked(answer, world))
        states.append(world_state(world))
    assert answers[0] == answers[1]
    assert states[0] == states[1]
    return answers


# ---------------------------------------------------------------------------------------------
# The hot routes, found as Django resolves them


def test_every_hot_route_is_served_and_resolves_as_django_resolves_it():
    prefix, found = hot_requests.hot_routes()
    assert prefix == "/api/"
    routes = {route.route: route for route in found}
    assert set(routes) == {f"api/{route}" for route in HOT_ROUTES}
    for route in routes.values():
        sample = "/" + re.sub(r"<(?:\w+:)?(\w+)>", "x-1", route.route)
        kwargs = route.pattern.match(sample[len("/api/"):])[2]
        ours, django = route.resolver_match(kwargs), resolve(sample)
        assert (ours.func, ours.args, ours.kwargs, ours.url_name, ours.app_names, ours.namespaces, ours.route,
                ours.view_name) == (django.func, django.args, django.kwargs, django.url_name, django.app_names,
                                    django.namespaces, django.route, django.view_name)
        # Each is served straight to its endpoint when the key and the body are accepted.
        assert route.body_schema is not None, route.route


@pytest.mark.parametrize("method,path,extra,hot", [
    ("POST", "/api/tasks/a1/complete", {}, True),
    ("POST", "/api/claim", {}, True),
    ("POST", "/api/complete", {}, True),
    ("POST", "/api/tasks/a1/renew", {}, True),
    ("GET", "/api/tasks/a1/complete", {}, False),
    ("POST", "/api/tasks/a1/complete/", {}, False),  # (Django's 404 / slash rules decide)
    ("POST", "/api/tasks/a1/claim", {}, False),  # not a hot route
    ("POST", "/api/tasks", {}, False),
    ("POST", "/api/tasks/a1/complete", {"QUERY_STRING": "x=1"}, False),
    ("POST", "/api/tasks/a1/complete", {"HTTP_COOKIE": "sessionid=abc"}, False),  # a browser's
    ("POST", "/api/tasks/a1/complete", {"HTTP_AUTHORIZATION": "Token abc"}, False),
    ("POST", "/api/tasks/a1/complete", {"HTTP_AUTHORIZATION": ""}, False),
    ("POST", "/board/", {}, False),
])
def test_which_requests_are_hot(apps, method, path, extra, hot):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "HTTP_AUTHORIZATION": "Bearer k", **extra}
    assert (apps[1].match(environ) is not None) is hot


# ---------------------------------------------------------------------------------------------
# The same answers, the same rows


def test_complete_with_next(apps, key):
    answers = both(apps, lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {
        "token": token, "result": {"n": 1}, "next": {"ttl_seconds": 30, "queue": w}}), key=key)
    status, headers, text = answers[1]
    assert status == 200 and text["next"]["task"]["id"] == "<w>-1"
    # Django's security headers, the request's id, the answer's type: as on Django's path.
    assert {"x-frame-options", "x-content-type-options", "referrer-policy", "cross-origin-opener-policy",
            "x-request-id", "content-type"} <= set(headers)
    assert headers["x-request-id"] == REQUEST_ID


def test_complete_with_next_when_nothing_is_ready(apps, key):
    answers = both(apps, lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {
        "token": token, "result": {}, "next": {"ttl_seconds": 30, "queue": w}}), key=key, seed_count=1)
    assert answers[1][2]["next"] is None


@pytest.mark.parametrize("name,request_of", [
    ("complete", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {"token": token, "result": [1, "two"]})),
    ("complete with usage", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {
        "token": token, "result": {}, "usage": {"input_tokens": 5, "output_tokens": 7}})),
    ("renew", lambda w, ids, token: (f"/api/tasks/{ids[0]}/renew", {"token": token, "ttl_seconds": 90,
                                                                    "progress": 0.5})),
    ("fail", lambda w, ids, token: (f"/api/tasks/{ids[0]}/fail", {"token": token, "error": "boom"})),
    ("fail with next", lambda w, ids, token: (f"/api/tasks/{ids[0]}/fail", {"token": token, "error": "boom",
                                                                            "next": {"ttl_seconds": 30, "queue": w}})),
    ("release", lambda w, ids, token: (f"/api/tasks/{ids[0]}/release", {"token": token})),
    ("complete a batch", lambda w, ids, token: ("/api/complete", {"items": [
        {"id": ids[0], "token": token, "result": 1}, {"id": ids[1], "token": "not-held", "result": 2}]})),
])
def test_the_holders_verbs(apps, key, name, request_of):
    answers = both(apps, request_of, key=key)
    assert answers[0][0] == 200, answers[0]


@pytest.mark.parametrize("body", [
    {"ttl_seconds": 60},
    {"ttl_seconds": 60, "max_tasks": 2},
    {"ttl_seconds": 60, "queue": "nowhere"},  # nothing ready: 204
])
def test_claims(apps, key, body):
    both(apps, lambda w, ids, token: ("/api/claim", {**body, **({"queue": w} if "queue" not in body else {})}),
         key=key, hold=None)


@pytest.mark.parametrize("name,request_of,status", [
    ("a wrong token", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {"token": "nope", "result": 1}), 409),
    ("an unknown task", lambda w, ids, token: (f"/api/tasks/{w}-none/complete", {"token": token, "result": 1}), 404),
    ("no token", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {"result": 1}), 422),
    ("an unknown field", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {"token": token, "color": 1}), 422),
    ("a field of the wrong type", lambda w, ids, token: (f"/api/tasks/{ids[0]}/renew",
                                                         {"token": token, "ttl_seconds": "soon"}), 422),
    ("a body that is not JSON", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", b"{not json"), 422),
    ("a JSON array", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", [1, 2]), 422),
    ("an empty body", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", b""), 422),
    ("a NUL in the path", lambda w, ids, token: (f"/api/tasks/{ids[0]}\x00/complete", {"token": token}), 422),
    ("a next with a bad ttl", lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete",
                                                     {"token": token, "next": {"ttl_seconds": -1}}), 422),
    ("a batch too big", lambda w, ids, token: ("/api/claim", {"ttl_seconds": 60, "max_tasks": 10_000}), 422),
])
def test_refusals(apps, key, name, request_of, status):
    answers = both(apps, request_of, key=key)
    assert answers[0][0] == status, answers[0]


def test_a_key_that_is_not_known(apps, key):
    for world in WORLDS:
        seed(world)
    answers = [blanked(call(app, f"/api/tasks/{w}-0/complete", {"token": "t", "result": 1}, key="not-a-key"), w)
               for app, w in zip(apps, WORLDS)]
    assert answers[0] == answers[1] and answers[0][0] == 401


def test_a_key_limited_to_other_queues(apps, key):
    _, scoped = agent_keys.create_key("scoped-agent", queues="elsewhere")
    answers = []
    for app, world in zip(apps, WORLDS):
        ids = seed(world)
        token = held(world, key, ids[0], apps)
        answers.append(blanked(call(app, f"/api/tasks/{ids[0]}/complete", {"token": token, "result": 1}, key=scoped),
                               world))
    assert answers[0] == answers[1] and answers[0][0] == 404


def test_a_host_not_allowed_and_plain_http_under_ssl_redirect(apps, key):
    seed(WORLDS[0])
    for kwargs, status in (({"host": "evil.example"}, 400), ({"https": False}, 301)):
        with override_settings(SECURE_SSL_REDIRECT=True):
            server = wsgi_application()
            django = WSGIHandler()
            ours = call(server, "/api/tasks/zq1-0/complete", {"token": "t", "result": 1}, key=key, **kwargs)
            theirs = call(django, "/api/tasks/zq1-0/complete", {"token": "t", "result": 1}, key=key, **kwargs)
        assert (ours.status, ours.headers, ours.body) == (theirs.status, theirs.headers, theirs.body)
        assert ours.status == status
    assert world_state(WORLDS[0])[0][1] == "QUEUED"


def test_hsts_over_https(apps, key):
    with override_settings(SECURE_HSTS_SECONDS=3600, SECURE_HSTS_INCLUDE_SUBDOMAINS=True):
        pair = (WSGIHandler(), wsgi_application())
        answers = both(pair, lambda w, ids, token: (f"/api/tasks/{ids[0]}/complete", {"token": token, "result": 1}),
                       key=key)
    assert answers[1][1]["strict-transport-security"].startswith("max-age=3600; includeSubDomains")


def test_a_crash_in_the_endpoint(apps, key, monkeypatch, caplog):
    """An error the endpoint does not expect: Django's 500, reshaped to the API's JSON, logged once."""
    def crash(*args, **kwargs):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(transitions, "complete", crash)
    answers, logged = [], []
    for app, world in zip(apps, WORLDS):
        ids = seed(world)
        token = held(world, key, ids[0], apps)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="django.request"):
            answers.append(blanked(call(app, f"/api/tasks/{ids[0]}/complete", {"token": token, "result": 1}, key=key),
                                   world))
        logged.append([(r.levelname, r.getMessage().replace(world, "<w>")) for r in caplog.records
                       if r.name == "django.request"])
    assert answers[0] == answers[1] and answers[0][0] == 500
    assert logged[0] == logged[1] == [("ERROR", "Internal Server Error: /api/tasks/<w>-0/complete")]


# ---------------------------------------------------------------------------------------------
# What is around the answer: log lines, the latency metric, the request's signals


def test_a_refusal_is_logged_as_on_djangos_path(apps, key, caplog):
    logged = []
    for app, world in zip(apps, WORLDS):
        ids = seed(world)
        held(world, key, ids[0], apps)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="django.request"):
            assert call(app, f"/api/tasks/{ids[0]}/complete", {"token": "nope", "result": 1}, key=key).status == 409
        logged.append([(r.levelname, r.getMessage().replace(world, "<w>"), r.status_code) for r in caplog.records
                       if r.name == "django.request"])
    assert logged[0] == logged[1] == [("WARNING", "Conflict: /api/tasks/<w>-0/complete", 409)]


def _latency_count(route: str) -> float:
    """How many POSTs to `route` the API's latency histogram has observed."""
    for metric in API_LATENCY.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels == {"method": "POST", "route": route}:
                return sample.value
    return 0.0


def test_the_latency_metric_names_the_route(apps, key):
    route = "/api/tasks/<task_id>/complete"
    for app, world in zip(apps, WORLDS):
        ids = seed(world)
        token = held(world, key, ids[0], apps)
        before = _latency_count(route)
        assert call(app, f"/api/tasks/{ids[0]}/complete", {"token": token, "result": 1}, key=key).status == 200
        assert _latency_count(route) == before + 1


def test_a_hot_request_starts_and_finishes_once(apps, key):
    """request_started and request_finished, once each: the log's request context, and the
    database connection closed or given back to its pool when the request ends."""
    seen = []

    def started(sender, **kwargs):
        seen.append("started")

    def finished(sender, **kwargs):
        seen.append("finished")

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        ids = seed(WORLDS[1])
        token = held(WORLDS[1], key, ids[0], apps)
        seen.clear()
        assert call(apps[1], f"/api/tasks/{ids[0]}/complete", {"token": token, "result": 1}, key=key).status == 200
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
    assert seen == ["started", "finished"]


def test_the_hot_handler_leaves_out_only_the_middleware_that_never_acts_on_it(apps):
    from django.conf import settings

    assert hot_requests.SKIPPED_MIDDLEWARE <= set(settings.MIDDLEWARE)  # (a renamed one fails here)
    django, hot = apps[0], apps[1].handler

    def owners(methods) -> set[str]:
        return {type(method.__self__).__name__ for method in methods}

    # Of Django's view middleware only CSRF's is left out (the hot handler calls the others).
    assert owners(django._view_middleware) - owners(hot._view_middleware) == {"CsrfViewMiddleware"}
    assert owners(hot._exception_middleware) == owners(django._exception_middleware)


def test_with_atomic_requests_every_request_takes_djangos_path():
    """ATOMIC_REQUESTS puts each view in a transaction (Django's make_view_atomic): the hot
    handler does not, so it serves nothing then."""
    settings_dict = connections["default"].settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    try:
        assert hot_requests.HotRequests(WSGIHandler()).routes == []
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False
    assert hot_requests.HotRequests(WSGIHandler()).routes


def test_an_accepted_request_skips_django_ninjas_dispatch_and_a_refused_one_takes_it(apps, key, monkeypatch):
    """The point of the path: django-ninja's Operation.run only for what it must judge."""
    from ninja.operation import Operation

    runs = []
    run = Operation.run

    def counted(self, request, **kwargs):
        runs.append(request.path)
        return run(self, request, **kwargs)

    monkeypatch.setattr(Operation, "run", counted)
    ids = seed(WORLDS[1])
    token = held(WORLDS[1], key, ids[0], apps)  # (through Django's path: one run)
    runs.clear()
    assert call(apps[1], f"/api/tasks/{ids[0]}/renew", {"token": token, "ttl_seconds": 60}, key=key).status == 200
    assert runs == []
    assert call(apps[1], f"/api/tasks/{ids[0]}/renew", {"token": token, "ttl_seconds": "soon"}, key=key).status == 422
    assert runs == [f"/api/tasks/{ids[0]}/renew"]
