"""The agents' JSON API through the whole HTTP stack (Django test Client -> middleware -> ninja ->
board.engine.transitions) against the real SQLite test database.

Every endpoint's success path with its exact status and shape, every error code with its status
and the one error shape, bad input answered with the right code AND an unchanged database, the
two ways to authenticate (agent keys, a staff session with CSRF), the lease token's secrecy,
the key command and the OpenAPI description.

The test settings are production-like (DEBUG off, so SECURE_SSL_REDIRECT is on): every request
here goes over https, as a real client's would.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.utils import timezone

from board import agent_keys
from board.engine import transitions
from board.models import AgentKey, Task, TaskEvent
from tests.support import db_state, end_backoff, expire_lease, sqlite_db_mark

pytestmark = sqlite_db_mark()

API = "/api"
MiB = 1024 * 1024
FIELD_LIMIT = 256 * 1024

TASK_FIELDS = {
    "id", "title", "description", "payload", "queue", "priority", "deps", "on_hold", "hold", "max_retries",
    "stage", "version", "owner", "fence", "lease_expires_at", "attempts", "not_before",
    "checkpoint", "progress", "result", "error", "created_at", "updated_at", "stage_changed_at",
    "concurrency_key", "rate_key", "dedup_key", "fairness_key", "tags", "claim_rank",
    "concurrency_key", "queue_timeout_seconds", "attempt_timeout_seconds", "progress_timeout_seconds",
    "progress_changed_at", "notes_count", "replay_of", "resources", "awaiting_approval", "approvals_count",
    "requires", "prefers",
}
EVENT_FIELDS = {"id", "task", "verb", "from_stage", "to_stage", "version", "fence", "actor", "at", "detail"}


# ---------------------------------------------------------------------------------------------
# Helpers


class HttpsClient(Client):
    """A test Client whose every request is https (plain http is redirected by the settings)."""

    def generic(self, method, path, data="", content_type="application/octet-stream", secure=False, **extra):
        return super().generic(method, path, data, content_type, True, **extra)


def auth(key: str | None) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}


def post(http: Client, path: str, body, key: str | None = None, **extra):
    """POST JSON (a str or bytes body is sent as is: for malformed or oversized bodies)."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return http.post(API + path, data, content_type="application/json", **auth(key), **extra)


def get(http: Client, path: str, key: str | None = None, **extra):
    return http.get(API + path, **auth(key), **extra)


def assert_error(response, status: int, code: str) -> dict:
    """The one error shape: {"error": {"code", "message", "task"?, "details"?}}; returns the inner dict."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"code", "message"} <= set(error) <= {"code", "message", "task", "details"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    if "task" in error:
        assert set(error["task"]) == TASK_FIELDS
    return error


def when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def key_rows() -> list[dict]:
    return list(AgentKey.objects.order_by("pk").values())


def create(http, key, **fields) -> dict:
    """Create a task (201); returns it as GET shows it (a create's answer adds `deduplicated`)."""
    response = post(http, "/tasks", {"title": fields.pop("title", "a task"), **fields}, key)
    assert response.status_code == 201, response.content
    task = response.json()
    assert task.pop("deduplicated") is False
    return task


def claim(http, key, task_id: str, ttl: float = 60) -> tuple[dict, str]:
    """Claim `task_id`; returns (task, token)."""
    response = post(http, f"/tasks/{task_id}/claim", {"ttl_seconds": ttl}, key)
    assert response.status_code == 200, response.content
    body = response.json()
    return body["task"], body["lease"]["token"]


def current(http, key, task_id: str) -> dict:
    response = get(http, f"/tasks/{task_id}", key)
    assert response.status_code == 200, response.content
    return response.json()


def walk(http, key, path: str, limit: int) -> tuple[list[dict], int]:
    """Follow `next` cursors to the end; returns (every item, number of pages)."""
    items, pages, cursor = [], 0, None
    while True:
        query = f"limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        sep = "&" if "?" in path else "?"
        response = get(http, f"{path}{sep}{query}", key)
        assert response.status_code == 200, response.content
        body = response.json()
        assert set(body) == {"items", "next"}
        assert len(body["items"]) <= limit
        items += body["items"]
        pages += 1
        cursor = body["next"]
        if cursor is None:
            return items, pages
        assert pages < 100, "pagination does not end"


def b64(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def http() -> HttpsClient:
    return HttpsClient()


def used_key(name: str, *, is_operator: bool = False) -> str:
    """A fresh key that has been used once: a key's first use records last_used_at (then at most
    once a minute), so that a refused request in a test provably writes nothing at all."""
    _, key = agent_keys.create_key(name, is_operator=is_operator)
    assert agent_keys.authenticate(key) is not None
    return key


@pytest.fixture
def agent() -> str:
    return used_key("agent-a")


@pytest.fixture
def agent_b() -> str:
    return used_key("agent-b")


@pytest.fixture
def operator() -> str:
    return used_key("operator-1", is_operator=True)


@pytest.fixture
def w(http, agent, agent_b, operator):
    """Everything a scenario needs: the client and the three keys."""
    return SimpleNamespace(http=http, a=agent, b=agent_b, op=operator)


@pytest.fixture
def running(w) -> SimpleNamespace:
    """Task 'run' RUNNING under agent A's lease."""
    create(w.http, w.a, id="run", title="being worked on")
    task, token = claim(w.http, w.a, "run")
    return SimpleNamespace(id="run", token=token, task=task)


def staff_user(username="staff", *, operator=False, is_staff=True, perms=()) -> User:
    """A user; `perms` are codenames of board permissions (board/access.py says what each allows)."""
    user = User.objects.create_user(username, password="unused-in-tests", is_staff=is_staff)
    for codename in (*perms, *(["intervene"] if operator else [])):
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="board"))
    return user


def session_client(user: User) -> tuple[HttpsClient, dict]:
    """A CSRF-enforcing client logged in as `user`, and the headers a browser sends with a POST:
    the token from the csrftoken cookie (set by a GET of the docs page) and, over https, a
    same-origin Referer (Django's CSRF check demands one on secure requests)."""
    client = HttpsClient(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(f"{API}/docs").status_code == 200
    token = client.cookies["csrftoken"].value
    return client, {"HTTP_X_CSRFTOKEN": token, "HTTP_REFERER": "https://testserver/api/docs"}


# ---------------------------------------------------------------------------------------------
# POST /api/tasks


def test_create_one_task_is_201_with_the_public_task(http, agent):
    response = post(http, "/tasks", {"id": "t1", "title": "Write tests", "description": "all of them",
                                     "payload": {"files": ["a.py"]}, "queue": "q1", "priority": 5,
                                     "max_retries": 2}, agent)
    assert response.status_code == 201
    task = response.json()
    assert set(task) == TASK_FIELDS | {"deduplicated"}
    assert task.pop("deduplicated") is False
    assert task | {"created_at": None, "updated_at": None, "stage_changed_at": None} == {
        "id": "t1", "title": "Write tests", "description": "all of them", "payload": {"files": ["a.py"]},
        "queue": "q1", "priority": 5, "deps": [], "on_hold": False, "hold": False, "max_retries": 2, "stage": "QUEUED",
        "version": 0, "owner": "", "fence": 0, "lease_expires_at": None, "attempts": 0,
        "not_before": None, "checkpoint": None, "progress": None, "result": None, "error": "",
        "created_at": None, "updated_at": None, "stage_changed_at": None, "concurrency_key": None,
        "rate_key": None, "dedup_key": None, "fairness_key": None, "tags": [], "resources": None, "requires": None, "prefers": None, "claim_rank": task["claim_rank"],
        "queue_timeout_seconds": None, "attempt_timeout_seconds": None, "progress_timeout_seconds": None,
        "progress_changed_at": None, "notes_count": 0, "replay_of": None,
        "awaiting_approval": False, "approvals_count": 0,
    }
    assert when(task["created_at"]) == when(task["updated_at"]) == when(task["stage_changed_at"])
    # Its place in the line: created now, priority 5 (board.engine.fairness: 60 s a level).
    assert task["claim_rank"] == pytest.approx(when(task["created_at"]).timestamp() - 5 * 60, abs=0.001)
    assert current(http, agent, "t1") == task
    assert list(TaskEvent.objects.values_list("task_id", "verb", "actor")) == [("t1", "create", "agent-a")]


def test_create_without_an_id_generates_one(http, agent):
    task = create(http, agent, title="no id given")
    assert task["id"] and current(http, agent, task["id"])["title"] == "no id given"


def test_create_a_list_forming_a_dag_is_201_with_items(http, agent):
    response = post(http, "/tasks", [
        {"id": "fetch", "title": "fetch"},
        {"id": "parse", "title": "parse", "deps": ["fetch"]},
        {"id": "report", "title": "report", "deps": ["fetch", "parse"]},
    ], agent)
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"items"}
    assert [(t["id"], t["stage"], sorted(t["deps"])) for t in body["items"]] == [
        ("fetch", "QUEUED", []), ("parse", "PENDING", ["fetch"]), ("report", "PENDING", ["fetch", "parse"]),
    ]
    assert all(set(t) == TASK_FIELDS | {"deduplicated"} and t["deduplicated"] is False for t in body["items"])
    assert sorted(current(http, agent, "report")["deps"]) == ["fetch", "parse"]


def test_create_depending_on_a_completed_task_starts_queued(http, agent):
    create(http, agent, id="done")
    _, token = claim(http, agent, "done")
    assert post(http, "/tasks/done/complete", {"token": token, "result": {}}, agent).status_code == 200
    assert create(http, agent, id="next", deps=["done"])["stage"] == "QUEUED"


def test_same_id_and_identical_body_is_200_with_the_existing_task_and_writes_nothing(http, agent):
    body = {"id": "t1", "title": "x", "payload": {"n": 1, "m": [1, 2]}, "deps": []}
    first = post(http, "/tasks", body, agent)
    assert first.status_code == 201
    before = db_state()
    again = post(http, "/tasks", body, agent)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert db_state() == before


def test_an_idempotent_retry_returns_the_task_as_it_is_now(http, agent):
    body = {"id": "t1", "title": "x"}
    post(http, "/tasks", body, agent)
    claimed, token = claim(http, agent, "t1")
    again = post(http, "/tasks", body, agent)
    assert again.status_code == 200
    assert again.json() == {**claimed, "deduplicated": False} and again.json()["stage"] == "RUNNING"
    assert token.encode() not in again.content


def test_a_batch_sent_twice_is_200_with_the_existing_items(http, agent):
    batch = [{"id": "a", "title": "a"}, {"id": "b", "title": "b", "deps": ["a"]}]
    first = post(http, "/tasks", batch, agent)
    assert first.status_code == 201
    before = db_state()
    again = post(http, "/tasks", batch, agent)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert db_state() == before


@pytest.mark.parametrize("different", [
    {"title": "y"}, {"description": "other"}, {"payload": {"n": 2}}, {"queue": "q2"}, {"priority": 1},
    {"on_hold": True}, {"hold": True}, {"max_retries": 0}, {"deps": ["other"]},
])
def test_a_different_body_under_an_existing_id_is_duplicate_id(http, agent, different):
    create(http, agent, id="other")
    existing = create(http, agent, id="t1", title="x", payload={"n": 1})
    before = db_state()
    response = post(http, "/tasks", {"id": "t1", "title": "x", "payload": {"n": 1}} | different, agent)
    error = assert_error(response, 409, "duplicate_id")
    assert error["task"] == existing == current(http, agent, "t1")
    assert db_state() == before


def test_a_batch_naming_one_existing_id_creates_nothing(http, agent):
    create(http, agent, id="taken", title="x")
    before = db_state()
    response = post(http, "/tasks", [{"id": "fresh", "title": "x"}, {"id": "taken", "title": "other"}], agent)
    assert_error(response, 409, "duplicate_id")
    assert db_state() == before


@pytest.mark.parametrize("batch", [
    pytest.param([{"id": "a", "title": "a", "deps": ["b"]}, {"id": "b", "title": "b", "deps": ["a"]}], id="cycle"),
    pytest.param([{"id": "a", "title": "a", "deps": ["c"]}, {"id": "b", "title": "b", "deps": ["a"]},
                  {"id": "c", "title": "c", "deps": ["b"]}], id="long-cycle"),
    pytest.param([{"id": "ok", "title": "ok"}, {"id": "a", "title": "a", "deps": ["a"]}], id="self-dep"),
    pytest.param([{"id": "ok", "title": "ok"}, {"id": "a", "title": "a", "deps": ["ghost"]}], id="unknown-dep"),
    pytest.param([{"id": "a", "title": "a"}, {"id": "a", "title": "a"}], id="same-id-twice"),
    pytest.param([{"id": "a", "title": "a", "deps": ["x", "x"]}, {"id": "x", "title": "x"}], id="dep-listed-twice"),
    pytest.param([], id="empty-list"),
])
def test_a_refused_batch_is_422_and_creates_nothing(http, agent, batch):
    create(http, agent, id="existing")
    before = db_state()
    assert_error(post(http, "/tasks", batch, agent), 422, "validation_error")
    assert db_state() == before


@pytest.mark.parametrize("path, body, message, loc, kind", [
    ("/tasks", {"title": ""}, "title: String should have at least 1 character", ["title"], "string_too_short"),
    ("/tasks", {"title": "x", "bogus": 1}, "bogus: Extra inputs are not permitted", ["bogus"], "extra_forbidden"),
    ("/tasks", [{"title": "x"}, {"title": ""}], "1.title: String should have at least 1 character", [1, "title"],
     "string_too_short"),
    ("/claim", {"ttl_seconds": "60"}, "ttl_seconds: Input should be a valid number", ["ttl_seconds"], "float_type"),
    ("/claim", 5, "Input should be a valid dictionary or object to extract fields from", [], "model_attributes_type"),
    ("/tasks", 5, "Input should be a valid dictionary or object to extract fields from", [],
     "model_attributes_type"),
])
def test_a_validation_error_names_the_field_as_the_client_wrote_it(http, agent, path, body, message, loc, kind):
    """The error's message and details are the API's contract: the location is the client's own
    path to the field (no schema or union-branch names), and the message names no class of ours."""
    create(http, agent, id="existing")
    before = db_state()
    error = assert_error(post(http, path, body, agent), 422, "validation_error")
    assert error["message"] == message
    assert (error["details"][0]["loc"], error["details"][0]["type"]) == (loc, kind)
    assert db_state() == before


def test_an_input_body_is_validated_once(monkeypatch):
    """django-ninja's Schema validates a body with extra="forbid" twice; board.api.schemas.StrictIn
    replaces that validator so each field of a request body is checked once (about 8% of a hot
    request's CPU: bench/api_cost.py)."""
    from board.api import schemas

    checked = []
    monkeypatch.setattr(schemas, "unstorable_text", lambda value: checked.append(value))
    schemas.CompleteIn.model_validate({"token": "t", "result": {"n": 1}})
    assert sorted(checked, key=repr) == sorted(["t", {"n": 1}], key=repr)


def test_a_single_task_depending_on_itself_or_on_an_unknown_task_is_422(http, agent):
    before = db_state()
    assert_error(post(http, "/tasks", {"id": "a", "title": "a", "deps": ["a"]}, agent), 422, "validation_error")
    assert_error(post(http, "/tasks", {"id": "a", "title": "a", "deps": ["nope"]}, agent), 422, "validation_error")
    assert db_state() == before


def test_1000_dependencies_are_accepted_and_1001_refused(http, agent):
    ids = [f"d{i}" for i in range(1001)]
    for batch in (ids[:1000], ids[1000:]):  # a batch creates at most 1000 tasks
        assert post(http, "/tasks", [{"id": i, "title": i} for i in batch], agent).status_code == 201
    assert create(http, agent, id="wide", deps=ids[:1000])["stage"] == "PENDING"
    before = db_state()
    assert_error(post(http, "/tasks", {"id": "wider", "title": "x", "deps": ids}, agent), 422, "validation_error")
    assert db_state() == before


# ---------------------------------------------------------------------------------------------
# GET /api/tasks


@pytest.fixture
def listed(http, agent, agent_b):
    """Six tasks in several stages, queues and owners."""
    create(http, agent, id="q-build", title="Build the wheel", queue="build")
    create(http, agent, id="q-test", title="Run TESTS", queue="test")
    create(http, agent, id="r-a", title="running for a", queue="build")
    create(http, agent, id="r-b", title="running for b", queue="test")
    create(http, agent, id="held", title="waiting for an operator", on_hold=True)
    create(http, agent, id="done", title="finished")
    claim(http, agent, "r-a")
    claim(http, agent_b, "r-b")
    _, token = claim(http, agent, "done")
    assert post(http, "/tasks/done/complete", {"token": token, "result": 1}, agent).status_code == 200


@pytest.mark.parametrize("query, expected", [
    ("", ["q-build", "q-test", "r-a", "r-b", "held", "done"]),
    ("?stage=QUEUED", ["q-build", "q-test"]),
    ("?stage=RUNNING&stage=PENDING", ["r-a", "r-b", "held"]),
    ("?stage=COMPLETED", ["done"]),
    ("?stage=FAILED", []),
    ("?queue=build", ["q-build", "r-a"]),
    ("?owner=agent-b", ["r-b"]),
    ("?owner=agent-a", ["r-a"]),
    ("?text=tests", ["q-test"]),          # title, case-insensitive
    ("?text=Q-", ["q-build", "q-test"]),  # id, case-insensitive
    ("?stage=RUNNING&queue=test", ["r-b"]),
    ("?stage=QUEUED&stage=RUNNING&queue=build&text=build", ["q-build"]),
])
def test_list_filters(http, agent, listed, query, expected):
    response = get(http, f"/tasks{query}", agent)
    assert response.status_code == 200
    body = response.json()
    assert body["next"] is None
    assert [t["id"] for t in body["items"]] == expected
    assert all(set(t) == TASK_FIELDS for t in body["items"])


def test_listing_walks_every_task_exactly_once_two_at_a_time(http, agent):
    create(http, agent, id="first")
    # A batch shares one created_at: the cursor must break the tie by id.
    post(http, "/tasks", [{"id": i, "title": i} for i in ("m3", "m1", "m2", "m0")], agent)
    create(http, agent, id="last")
    create(http, agent, id="after-last")
    items, pages = walk(http, agent, "/tasks", limit=2)
    ids = [t["id"] for t in items]
    assert sorted(ids) == sorted(["first", "m0", "m1", "m2", "m3", "last", "after-last"])
    assert len(ids) == len(set(ids)) == 7
    assert ids == ["first", "m0", "m1", "m2", "m3", "last", "after-last"]
    assert pages == 4


def test_pagination_keeps_the_filter(http, agent):
    for i in range(5):
        create(http, agent, id=f"q{i}", queue="wanted")
        create(http, agent, id=f"x{i}", queue="other")
    items, pages = walk(http, agent, "/tasks?queue=wanted", limit=2)
    assert [t["id"] for t in items] == [f"q{i}" for i in range(5)] and pages == 3


def test_a_full_last_page_ends_with_next_null(http, agent):
    for i in range(4):
        create(http, agent, id=f"t{i}")
    items, pages = walk(http, agent, "/tasks", limit=2)
    assert len(items) == 4 and pages == 2


@pytest.mark.parametrize("limit", ["1", "500"])
def test_limit_bounds_are_accepted(http, agent, limit):
    assert get(http, f"/tasks?limit={limit}", agent).status_code == 200


@pytest.mark.parametrize("query", [
    "limit=0", "limit=501", "limit=-1", "limit=abc", "limit=1.5",
    "cursor=garbage", "cursor=%21%21%21", f"cursor={b64({'a': 1})}", f"cursor={b64(['2026-01-01T00:00:00+00:00'])}",
    f"cursor={b64(['not a date', 'x'])}", f"cursor={b64([5, 'x'])}", f"cursor={b64([1, 2, 3])}",
    "stage=queued", "stage=RUNNING&stage=BOGUS",
])
def test_bad_list_parameters_are_422(http, agent, query):
    create(http, agent, id="t")
    assert_error(get(http, f"/tasks?{query}", agent), 422, "validation_error")


# ---------------------------------------------------------------------------------------------
# GET /api/tasks/{id} and its events


def test_get_one_task(http, agent):
    created = create(http, agent, id="one", payload=[1, 2, 3])
    response = get(http, "/tasks/one", agent)
    assert response.status_code == 200
    assert response.json() == created


@pytest.mark.parametrize("path", ["/tasks/nope", "/tasks/nope/events", "/tasks/bad%20id", f"/tasks/{'a' * 101}"])
def test_an_unknown_task_is_404_not_found(http, agent, path):
    error = assert_error(get(http, path, agent), 404, "not_found")
    assert "task" not in error


def test_events_are_the_history_in_order(http, agent):
    create(http, agent, id="t")
    _, token = claim(http, agent, "t", ttl=60)
    post(http, "/tasks/t/renew", {"token": token, "ttl_seconds": 120, "progress": 0.5}, agent)
    post(http, "/tasks/t/pause", {"token": token, "checkpoint": {"step": 1}}, agent)
    resumed = post(http, "/tasks/t/resume", {"ttl_seconds": 60}, agent).json()
    post(http, "/tasks/t/complete", {"token": resumed["lease"]["token"], "result": "ok"}, agent)
    response = get(http, "/tasks/t/events", agent)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"items", "next"} and body["next"] is None
    assert all(set(e) == EVENT_FIELDS for e in body["items"])
    assert [(e["verb"], e["from_stage"], e["to_stage"], e["version"], e["fence"], e["actor"])
            for e in body["items"]] == [
        ("create", "", "QUEUED", 0, 0, "agent-a"),
        ("claim", "QUEUED", "RUNNING", 1, 1, "agent-a"),
        ("renew", "RUNNING", "RUNNING", 2, 1, "agent-a"),
        ("pause", "RUNNING", "PAUSED", 3, 1, "agent-a"),
        ("resume", "PAUSED", "RUNNING", 4, 2, "agent-a"),
        ("complete", "RUNNING", "COMPLETED", 5, 2, "agent-a"),
    ]
    assert {e["task"] for e in body["items"]} == {"t"}
    ats = [when(e["at"]) for e in body["items"]]
    assert ats == sorted(ats)


def test_events_are_paginated(http, agent):
    create(http, agent, id="t")
    create(http, agent, id="noise")  # another task's history interleaved with this one's
    for _ in range(3):
        for task_id in ("t", "noise"):
            _, token = claim(http, agent, task_id)
            assert post(http, f"/tasks/{task_id}/release", {"token": token}, agent).status_code == 200
    everything = get(http, "/tasks/t/events?limit=500", agent).json()["items"]
    assert [e["verb"] for e in everything] == ["create"] + ["claim", "release"] * 3
    paged, pages = walk(http, agent, "/tasks/t/events", limit=2)
    assert paged == everything and pages == 4


@pytest.mark.parametrize("cursor", ["garbage", b64(["2026-01-01T00:00:00+00:00", "t"]), b64(["1"]), b64([1.5])])
def test_a_bad_events_cursor_is_422(http, agent, cursor):
    create(http, agent, id="t")
    assert_error(get(http, f"/tasks/t/events?cursor={cursor}", agent), 422, "validation_error")


@pytest.mark.parametrize("limit", ["0", "501"])
def test_a_bad_events_limit_is_422(http, agent, limit):
    create(http, agent, id="t")
    assert_error(get(http, f"/tasks/t/events?limit={limit}", agent), 422, "validation_error")


def claim_order_board(http, agent) -> list[str]:
    """QUEUED tasks of mixed priorities, some created in one batch (one created_at: the id breaks
    the tie), and tasks in other stages; returns the QUEUED ids in the order claims take them."""
    create(http, agent, id="low-old", priority=-1)
    create(http, agent, id="mid-old", priority=5)
    post(http, "/tasks", [{"id": i, "title": i, "priority": 5} for i in ("mid-b3", "mid-b1", "mid-b2")], agent)
    create(http, agent, id="high-new", priority=9)
    create(http, agent, id="zero", priority=0)
    create(http, agent, id="held", priority=100, on_hold=True)
    create(http, agent, id="running", priority=100)
    claim(http, agent, "running")
    return ["high-new", "mid-old", "mid-b1", "mid-b2", "mid-b3", "zero", "low-old"]


def test_order_claim_lists_queued_tasks_in_the_order_claim_next_takes_them(http, agent):
    expected = claim_order_board(http, agent)
    body = get(http, "/tasks?stage=QUEUED&order=claim&limit=500", agent).json()
    assert [t["id"] for t in body["items"]] == expected and body["next"] is None
    top = get(http, "/tasks?stage=QUEUED&order=claim&limit=3", agent).json()
    assert [t["id"] for t in top["items"]] == expected[:3] and top["next"]
    # Paged through its cursor (which carries the claim-order key), the same order.
    paged, pages = walk(http, agent, "/tasks?stage=QUEUED&order=claim", limit=2)
    assert [t["id"] for t in paged] == expected and pages == 4
    # The default order is unchanged (oldest first), and `order=created` names it.
    oldest_first = [t["id"] for t in get(http, "/tasks?stage=QUEUED", agent).json()["items"]]
    assert oldest_first == ["low-old", "mid-old", "mid-b1", "mid-b2", "mid-b3", "high-new", "zero"]
    assert [t["id"] for t in get(http, "/tasks?stage=QUEUED&order=created", agent).json()["items"]] == oldest_first
    # What the claims take, one after another, is the listed order.
    taken = []
    while (response := post(http, "/claim", {"ttl_seconds": 60}, agent)).status_code == 200:
        taken.append(response.json()["task"]["id"])
    assert taken == expected


@pytest.mark.parametrize("query", [
    "order=bogus", "order=CLAIM", "order=", "order=claim&order=claim", "order=claim&order=created",
])
def test_a_bad_order_is_422(http, agent, query):
    create(http, agent, id="t")
    before = db_state()
    assert_error(get(http, f"/tasks?stage=QUEUED&{query}", agent), 422, "validation_error")
    assert db_state() == before


def test_a_cursor_is_good_only_for_the_order_that_gave_it_out(http, agent):
    claim_order_board(http, agent)
    by_claim = get(http, "/tasks?stage=QUEUED&order=claim&limit=1", agent).json()["next"]
    by_age = get(http, "/tasks?stage=QUEUED&limit=1", agent).json()["next"]
    assert by_claim and by_age
    assert_error(get(http, f"/tasks?stage=QUEUED&cursor={by_claim}", agent), 422, "validation_error")
    assert_error(get(http, f"/tasks?stage=QUEUED&order=claim&cursor={by_age}", agent), 422, "validation_error")
    for forged in (b64(["claim", "5", "2026-01-01T00:00:00+00:00", "t"]), b64(["claim", 2**40, "2026-01-01T00:00:00+00:00", "t"]),
                   b64(["claim", 5, "not a date", "t"]), b64(["claim", 5, "2026-01-01T00:00:00+00:00", "bad id"])):
        assert_error(get(http, f"/tasks?order=claim&cursor={forged}", agent), 422, "validation_error")


def history_of_seven(http, agent) -> list[str]:
    create(http, agent, id="t")
    create(http, agent, id="noise")  # another task's history interleaved with this one's
    for _ in range(3):
        for task_id in ("t", "noise"):
            _, token = claim(http, agent, task_id)
            assert post(http, f"/tasks/{task_id}/release", {"token": token}, agent).status_code == 200
    return ["create"] + ["claim", "release"] * 3


def test_events_last_gives_the_most_recent_in_chronological_order(http, agent):
    verbs = history_of_seven(http, agent)
    everything = get(http, "/tasks/t/events?limit=500", agent).json()["items"]
    for last in (1, 3, 7, 500):
        body = get(http, f"/tasks/t/events?last={last}", agent).json()
        assert set(body) == {"items", "next"} and body["next"] is None
        assert body["items"] == everything[-last:], last
        assert [e["verb"] for e in body["items"]] == verbs[-last:]
        assert [e["id"] for e in body["items"]] == sorted(e["id"] for e in body["items"])


@pytest.mark.parametrize("query", [
    "last=0", "last=501", "last=-1", "last=abc", "last=1.5", "last=", "last=1&last=2",
    "last=2&limit=2", f"last=2&cursor={b64([1])}",
])
def test_a_bad_events_last_is_422(http, agent, query):
    create(http, agent, id="t")
    before = db_state()
    assert_error(get(http, f"/tasks/t/events?{query}", agent), 422, "validation_error")
    assert db_state() == before


# ---------------------------------------------------------------------------------------------
# POST /api/claim (the next ready task)


def test_claim_next_is_200_with_task_and_lease(http, agent):
    create(http, agent, id="t", title="work")
    before = timezone.now()
    response = post(http, "/claim", {"ttl_seconds": 60}, agent)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"task", "lease"}
    assert set(body["lease"]) == {"token", "fence", "expires_at"}
    assert set(body["task"]) == TASK_FIELDS
    lease, task = body["lease"], body["task"]
    assert isinstance(lease["token"], str) and len(lease["token"]) >= 32
    assert lease["fence"] == task["fence"] == 1
    assert task["id"] == "t" and task["stage"] == "RUNNING" and task["owner"] == "agent-a"
    assert task["attempts"] == 1 and task["version"] == 1
    expires = when(lease["expires_at"])
    assert when(task["lease_expires_at"]) == expires
    assert before + timedelta(seconds=59) <= expires <= timezone.now() + timedelta(seconds=61)
    assert current(http, agent, "t") == task


def test_claim_next_takes_the_highest_priority_then_the_oldest(http, agent):
    create(http, agent, id="old-low", priority=0)
    create(http, agent, id="old-high", priority=9)
    create(http, agent, id="new-high", priority=9)
    order = [post(http, "/claim", {"ttl_seconds": 60}, agent).json()["task"]["id"] for _ in range(3)]
    assert order == ["old-high", "new-high", "old-low"]


def test_claim_next_in_a_queue_takes_only_from_that_queue(http, agent):
    create(http, agent, id="elsewhere", queue="other", priority=9)
    create(http, agent, id="here", queue="gpu")
    response = post(http, "/claim", {"ttl_seconds": 60, "queue": "gpu"}, agent)
    assert response.json()["task"]["id"] == "here"
    assert post(http, "/claim", {"ttl_seconds": 60, "queue": "gpu"}, agent).status_code == 204


def test_claim_next_is_204_with_an_empty_body_when_nothing_is_ready(http, agent):
    create(http, agent, id="held", on_hold=True)
    create(http, agent, id="blocked", deps=["held"])
    before = db_state()
    response = post(http, "/claim", {"ttl_seconds": 60}, agent)
    assert response.status_code == 204
    assert response.content == b""
    assert db_state() == before


def test_claim_next_skips_a_task_backing_off(http, agent):
    create(http, agent, id="t")
    _, token = claim(http, agent, "t")
    post(http, "/tasks/t/fail", {"token": token, "error": "flaky"}, agent)
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 204
    end_backoff("t")
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).json()["task"]["id"] == "t"


def test_a_waiting_claim_returns_a_task_created_during_the_wait(http, agent, agent_b, monkeypatch):
    # Know (not guess) that the claim has looked once and found nothing before the task exists.
    looked_in_vain = threading.Event()
    real_claim_next = transitions.claim_next

    def spying_claim_next(*args, **kwargs):
        claim_ = real_claim_next(*args, **kwargs)
        if claim_ is None:
            looked_in_vain.set()
        return claim_

    monkeypatch.setattr(transitions, "claim_next", spying_claim_next)
    outcome: dict = {}

    def waiting_agent():
        try:
            started = time.monotonic()
            outcome["response"] = post(HttpsClient(), "/claim", {"ttl_seconds": 60, "wait_seconds": 20}, agent)
            outcome["elapsed"] = time.monotonic() - started
        except BaseException as exc:  # reported by the test thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=waiting_agent)
    thread.start()
    try:
        assert looked_in_vain.wait(10), "the waiting claim never looked for work"
        create(http, agent_b, id="late", title="arrives during the wait")
    finally:
        thread.join(30)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    response = outcome["response"]
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["task"]["id"] == "late" and body["task"]["owner"] == "agent-a"
    assert outcome["elapsed"] < 20
    assert current(http, agent, "late")["stage"] == "RUNNING"


def test_a_wait_with_nothing_arriving_is_204_after_wait_seconds(http, agent):
    started = time.monotonic()
    response = post(http, "/claim", {"ttl_seconds": 60, "wait_seconds": 1}, agent)
    elapsed = time.monotonic() - started
    assert response.status_code == 204 and response.content == b""
    assert elapsed >= 1
    assert elapsed < 10


# ---------------------------------------------------------------------------------------------
# POST /api/tasks/{id}/claim and /resume


def test_claim_by_id_is_200_with_task_and_lease(http, agent):
    create(http, agent, id="low", priority=0)
    create(http, agent, id="high", priority=9)
    response = post(http, "/tasks/low/claim", {"ttl_seconds": 30}, agent)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"task", "lease"} and set(body["lease"]) == {"token", "fence", "expires_at"}
    assert body["task"]["id"] == "low" and body["task"]["stage"] == "RUNNING"
    assert body["lease"]["fence"] == 1


def test_taking_over_an_expired_lease_gives_a_higher_fence(http, agent, agent_b):
    create(http, agent, id="t")
    _, old_token = claim(http, agent, "t")
    expire_lease("t")
    task, new_token = claim(http, agent_b, "t")
    assert task["fence"] == 2 and task["owner"] == "agent-b" and new_token != old_token
    assert_error(post(http, "/tasks/t/complete", {"token": old_token, "result": 1}, agent), 409, "lease_lost")


def test_pause_then_resume_returns_the_checkpoint_and_a_higher_fence(http, agent):
    create(http, agent, id="t")
    _, token = claim(http, agent, "t")
    paused = post(http, "/tasks/t/pause", {"token": token, "checkpoint": {"page": 7}}, agent)
    assert paused.status_code == 200
    assert paused.json()["stage"] == "PAUSED" and paused.json()["checkpoint"] == {"page": 7}
    assert paused.json()["owner"] == "" and paused.json()["lease_expires_at"] is None
    response = post(http, "/tasks/t/resume", {"ttl_seconds": 60}, agent)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"task", "lease"}
    assert body["task"]["checkpoint"] == {"page": 7}
    assert body["task"]["stage"] == "RUNNING" and body["task"]["attempts"] == 1
    assert body["lease"]["fence"] == body["task"]["fence"] == 2
    assert body["lease"]["token"] != token
    assert_error(post(http, "/tasks/t/renew", {"token": token, "ttl_seconds": 60}, agent), 409, "lease_lost")


# ---------------------------------------------------------------------------------------------
# The holder's verbs


def test_renew_extends_the_lease_keeps_token_and_fence_and_saves_progress(http, agent, running):
    response = post(http, "/tasks/run/renew", {"token": running.token, "ttl_seconds": 3600,
                                               "checkpoint": {"done": 3}, "progress": 0.25}, agent)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"task", "lease"}
    assert body["lease"]["token"] == running.token
    assert body["lease"]["fence"] == running.task["fence"] == body["task"]["fence"]
    assert when(body["lease"]["expires_at"]) > when(running.task["lease_expires_at"])
    assert when(body["lease"]["expires_at"]) == when(body["task"]["lease_expires_at"])
    saved = current(http, agent, "run")
    assert saved["checkpoint"] == {"done": 3} and saved["progress"] == 0.25
    assert saved["version"] == running.task["version"] + 1 and saved["stage"] == "RUNNING"


def test_renew_without_checkpoint_keeps_the_saved_one(http, agent, running):
    post(http, "/tasks/run/renew", {"token": running.token, "ttl_seconds": 60, "checkpoint": [1]}, agent)
    post(http, "/tasks/run/renew", {"token": running.token, "ttl_seconds": 60}, agent)
    assert current(http, agent, "run")["checkpoint"] == [1]


def test_renew_of_an_expired_lease_is_lease_lost_and_changes_nothing(http, agent, running):
    expire_lease("run")
    before = db_state()
    error = assert_error(post(http, "/tasks/run/renew", {"token": running.token, "ttl_seconds": 60}, agent),
                         409, "lease_lost")
    assert error["task"] == current(http, agent, "run")
    assert db_state() == before


def test_release_puts_the_task_back_and_gives_the_attempt_back(http, agent, running):
    response = post(http, "/tasks/run/release", {"token": running.token}, agent)
    assert response.status_code == 200
    task = response.json()
    assert set(task) == TASK_FIELDS
    assert (task["stage"], task["owner"], task["lease_expires_at"], task["attempts"]) == ("QUEUED", "", None, 0)
    assert task == current(http, agent, "run")


def test_complete_stores_the_result(http, agent, running):
    response = post(http, "/tasks/run/complete", {"token": running.token, "result": {"answer": 42}}, agent)
    assert response.status_code == 200
    task = response.json()
    assert task["stage"] == "COMPLETED" and task["result"] == {"answer": 42}
    assert task["owner"] == "" and task["lease_expires_at"] is None
    assert task == current(http, agent, "run")


@pytest.mark.parametrize("result", [{}, [], 0, False, "", "text"])
def test_complete_accepts_any_json_but_null(http, agent, running, result):
    response = post(http, "/tasks/run/complete", {"token": running.token, "result": result}, agent)
    assert response.status_code == 200 and response.json()["result"] == result


def test_complete_admits_the_dependents_it_unblocks(http, agent):
    post(http, "/tasks", [{"id": "a", "title": "a"}, {"id": "b", "title": "b"},
                          {"id": "needs-a", "title": "x", "deps": ["a"]},
                          {"id": "needs-both", "title": "y", "deps": ["a", "b"]}], agent)
    _, token = claim(http, agent, "a")
    assert post(http, "/tasks/a/complete", {"token": token, "result": 1}, agent).status_code == 200
    assert current(http, agent, "needs-a")["stage"] == "QUEUED"
    assert current(http, agent, "needs-both")["stage"] == "PENDING"
    _, token = claim(http, agent, "b")
    post(http, "/tasks/b/complete", {"token": token, "result": 2}, agent)
    assert current(http, agent, "needs-both")["stage"] == "QUEUED"


def test_a_retryable_failure_goes_back_to_the_queue_after_a_backoff(http, agent, running):
    response = post(http, "/tasks/run/fail", {"token": running.token, "error": "network down"}, agent)
    assert response.status_code == 200
    task = response.json()
    assert task["stage"] == "QUEUED" and task["error"] == "network down" and task["attempts"] == 1
    assert task["not_before"] is not None and when(task["not_before"]) > timezone.now()
    assert task["owner"] == "" and task["lease_expires_at"] is None
    assert [e["verb"] for e in get(http, "/tasks/run/events", agent).json()["items"]][-2:] == ["fail", "retry"]
    assert_error(post(http, "/tasks/run/claim", {"ttl_seconds": 60}, agent), 409, "blocked")


def test_a_failure_marked_not_retryable_is_failed(http, agent, running):
    response = post(http, "/tasks/run/fail", {"token": running.token, "error": "bad input", "retryable": False}, agent)
    assert response.status_code == 200
    task = response.json()
    assert task["stage"] == "FAILED" and task["error"] == "bad input" and task["not_before"] is None


def test_a_failure_on_the_last_attempt_is_failed(http, agent):
    create(http, agent, id="once", max_retries=0)
    _, token = claim(http, agent, "once")
    assert post(http, "/tasks/once/fail", {"token": token, "error": "x"}, agent).json()["stage"] == "FAILED"


# ---------------------------------------------------------------------------------------------
# The operators' verbs


def test_admit_a_held_task(http, agent, operator):
    create(http, agent, id="held", on_hold=True)
    response = post(http, "/tasks/held/admit", {}, operator)
    assert response.status_code == 200
    task = response.json()
    assert set(task) == TASK_FIELDS and task["stage"] == "QUEUED" and task["on_hold"] is task["hold"] is False
    assert get(http, "/tasks/held/events", agent).json()["items"][-1]["actor"] == "operator-1"


def test_admit_with_unfinished_dependencies_is_blocked(http, agent, operator):
    post(http, "/tasks", [{"id": "dep", "title": "d"}, {"id": "t", "title": "t", "deps": ["dep"], "on_hold": True}], agent)
    before = db_state()
    error = assert_error(post(http, "/tasks/t/admit", {}, operator), 409, "blocked")
    assert error["task"] == current(http, agent, "t")
    assert db_state() == before


def test_requeue_a_failed_task(http, agent, operator, running):
    post(http, "/tasks/run/fail", {"token": running.token, "error": "x", "retryable": False}, agent)
    response = post(http, "/tasks/run/requeue", {"reason": "fixed the input"}, operator)
    assert response.status_code == 200
    assert response.json()["stage"] == "QUEUED"
    last = get(http, "/tasks/run/events", agent).json()["items"][-1]
    assert (last["verb"], last["actor"], last["detail"]) == ("requeue", "operator-1", {"reason": "fixed the input"})


def test_requeue_a_paused_task_keeps_its_checkpoint(http, agent, operator, running):
    post(http, "/tasks/run/pause", {"token": running.token, "checkpoint": {"at": 3}}, agent)
    task = post(http, "/tasks/run/requeue", {}, operator).json()
    assert task["stage"] == "QUEUED" and task["checkpoint"] == {"at": 3}


def test_cancel_a_running_task_ends_its_lease(http, agent, operator, running):
    response = post(http, "/tasks/run/cancel", {"reason": "not needed"}, operator)
    assert response.status_code == 200
    task = response.json()
    assert task["stage"] == "CANCELLED" and task["owner"] == "" and task["lease_expires_at"] is None
    last = get(http, "/tasks/run/events", agent).json()["items"][-1]
    assert (last["verb"], last["detail"]) == ("cancel", {"reason": "not needed"})
    assert_error(post(http, "/tasks/run/complete", {"token": running.token, "result": 1}, agent), 409, "lease_lost")


def test_cancel_with_the_current_version_succeeds(http, agent, operator):
    task = create(http, agent, id="t")
    response = post(http, "/tasks/t/cancel", {"version": task["version"]}, operator)
    assert response.status_code == 200 and response.json()["version"] == task["version"] + 1


def test_cancel_with_a_stale_version_is_version_conflict(http, agent, operator):
    stale = create(http, agent, id="t")
    claim(http, agent, "t")
    before = db_state()
    error = assert_error(post(http, "/tasks/t/cancel", {"version": stale["version"]}, operator), 409, "version_conflict")
    assert error["task"] == current(http, agent, "t") and error["task"]["stage"] == "RUNNING"
    assert db_state() == before


@pytest.mark.parametrize("verb", ["admit", "requeue", "cancel"])
def test_operator_verbs_are_forbidden_to_a_plain_agent_key(http, agent, verb):
    create(http, agent, id="t", on_hold=True)
    before = db_state()
    assert_error(post(http, f"/tasks/t/{verb}", {}, agent), 403, "forbidden")
    assert db_state() == before


# ---------------------------------------------------------------------------------------------
# GET /api/check


def test_check_of_a_sound_board_is_an_empty_list(http, agent, running):
    response = get(http, "/check", agent)
    assert response.status_code == 200
    assert response.json() == {"problems": []}


def test_check_lists_problems(http, agent, running):
    expire_lease("run")  # RUNNING past its expiry until the reaper passes
    response = get(http, "/check", agent)
    assert response.status_code == 200
    problems = response.json()["problems"]
    assert problems and all(set(p) == {"task", "code", "text"} for p in problems)
    assert ("run", "lease_expired") in [(p["task"], p["code"]) for p in problems]


# ---------------------------------------------------------------------------------------------
# Every error code, with its status and shape; the database unchanged. Each scenario builds the
# state and returns the request that must be refused.


def _running(w, task_id="t", key=None) -> str:
    create(w.http, w.a, id=task_id)
    return claim(w.http, key or w.a, task_id)[1]


def _not_found(w):
    return lambda: post(w.http, "/tasks/ghost/claim", {"ttl_seconds": 60}, w.a)


def _taken(w):
    _running(w)
    return lambda: post(w.http, "/tasks/t/claim", {"ttl_seconds": 60}, w.b)


def _blocked_by_dependency(w):
    post(w.http, "/tasks", [{"id": "dep", "title": "d"}, {"id": "t", "title": "t", "deps": ["dep"]}], w.a)
    return lambda: post(w.http, "/tasks/t/claim", {"ttl_seconds": 60}, w.a)


def _blocked_by_hold(w):
    create(w.http, w.a, id="t", on_hold=True)
    return lambda: post(w.http, "/tasks/t/claim", {"ttl_seconds": 60}, w.a)


def _terminal(w):
    token = _running(w)
    post(w.http, "/tasks/t/complete", {"token": token, "result": 1}, w.a)
    return lambda: post(w.http, "/tasks/t/claim", {"ttl_seconds": 60}, w.a)


def _terminal_cancel(w):
    create(w.http, w.a, id="t")
    post(w.http, "/tasks/t/cancel", {}, w.op)
    return lambda: post(w.http, "/tasks/t/cancel", {}, w.op)


def _lease_lost(w):
    _running(w)
    return lambda: post(w.http, "/tasks/t/complete", {"token": "not-the-token", "result": 1}, w.a)


def _version_conflict(w):
    create(w.http, w.a, id="t")
    return lambda: post(w.http, "/tasks/t/cancel", {"version": 7}, w.op)


def _invalid_transition(w):
    create(w.http, w.a, id="t")
    return lambda: post(w.http, "/tasks/t/resume", {"ttl_seconds": 60}, w.a)


def _invalid_requeue(w):
    create(w.http, w.a, id="t")
    return lambda: post(w.http, "/tasks/t/requeue", {}, w.op)


def _duplicate_id(w):
    create(w.http, w.a, id="t", title="one")
    return lambda: post(w.http, "/tasks", {"id": "t", "title": "another"}, w.a)


def _validation_error(w):
    return lambda: post(w.http, "/tasks", {"title": "x", "unknown": 1}, w.a)


def _unauthorized(w):
    return lambda: post(w.http, "/tasks", {"title": "x"})


def _forbidden_operator(w):
    create(w.http, w.a, id="t")
    return lambda: post(w.http, "/tasks/t/cancel", {}, w.a)


def _forbidden_other_agent(w):
    token = _running(w)
    return lambda: post(w.http, "/tasks/t/complete", {"token": token, "result": 1}, w.b)


def _too_large_body(w):
    return lambda: post(w.http, "/tasks", {"title": "x", "payload": "x" * MiB}, w.a)


def _too_large_field(w):
    token = _running(w)
    return lambda: post(w.http, "/tasks/t/complete", {"token": token, "result": "x" * FIELD_LIMIT}, w.a)


ERROR_CASES = [
    # (code, status, scenario, the error carries the task)
    ("not_found", 404, _not_found, False),
    ("taken", 409, _taken, True),
    ("blocked", 409, _blocked_by_dependency, True),
    ("blocked", 409, _blocked_by_hold, True),
    ("terminal", 409, _terminal, True),
    ("terminal", 409, _terminal_cancel, True),
    ("lease_lost", 409, _lease_lost, True),
    ("version_conflict", 409, _version_conflict, True),
    ("invalid_transition", 409, _invalid_transition, True),
    ("invalid_transition", 409, _invalid_requeue, True),
    ("duplicate_id", 409, _duplicate_id, True),
    ("validation_error", 422, _validation_error, False),
    ("unauthorized", 401, _unauthorized, False),
    ("forbidden", 403, _forbidden_operator, False),
    ("forbidden", 403, _forbidden_other_agent, True),
    ("too_large", 413, _too_large_body, False),
    ("too_large", 413, _too_large_field, False),
]


@pytest.mark.parametrize("code, status, scenario, with_task", ERROR_CASES,
                         ids=[case[2].__name__.strip("_") for case in ERROR_CASES])
def test_every_error_code(w, code, status, scenario, with_task):
    refused = scenario(w)
    before, keys = db_state(), key_rows()
    error = assert_error(refused(), status, code)
    assert db_state() == before
    assert key_rows() == keys
    assert ("task" in error) == with_task
    if with_task:
        assert error["task"] == current(w.http, w.a, error["task"]["id"])


# ---------------------------------------------------------------------------------------------
# Bad input: the right code, and nothing written. `TOKEN` is replaced by the live lease token of
# task 'run' (held by agent A, who sends every request here; operator verbs use the operator key).

TOKEN = "<token>"


def _fill(body, token: str):
    if isinstance(body, str):
        return body.replace(TOKEN, token)
    if isinstance(body, dict):
        return {k: _fill(v, token) for k, v in body.items()}
    if isinstance(body, list):
        return [_fill(v, token) for v in body]
    return body


BAD_INPUT = [
    # creation: unknown fields, wrong types, limits
    ("/tasks", {"title": "x", "unknown": 1}, 422),
    ("/tasks", [{"title": "ok"}, {"title": "x", "unknown": 1}], 422),
    ("/tasks", {"title": 5}, 422),
    ("/tasks", {"title": None}, 422),
    ("/tasks", {}, 422),
    ("/tasks", {"title": ""}, 422),
    ("/tasks", {"title": "   "}, 422),
    ("/tasks", {"title": "x" * 301}, 422),
    ("/tasks", {"title": "x", "description": 5}, 422),
    ("/tasks", {"title": "x", "priority": "5"}, 422),
    ("/tasks", {"title": "x", "priority": 5.5}, 422),
    ("/tasks", {"title": "x", "priority": True}, 422),
    ("/tasks", {"title": "x", "priority": 2**31}, 422),
    ("/tasks", {"title": "x", "max_retries": "3"}, 422),
    ("/tasks", {"title": "x", "max_retries": -1}, 422),
    ("/tasks", {"title": "x", "max_retries": 101}, 422),
    ("/tasks", {"title": "x", "hold": "yes"}, 422),
    ("/tasks", {"title": "x", "hold": 1}, 422),
    ("/tasks", {"title": "x", "on_hold": "yes"}, 422),
    ("/tasks", {"title": "x", "on_hold": 1}, 422),
    ("/tasks", {"title": "x", "on_hold": True, "hold": False}, 422),
    ("/tasks", {"title": "x", "deps": "run"}, 422),
    ("/tasks", {"title": "x", "deps": {"run": True}}, 422),
    ("/tasks", {"title": "x", "deps": [5]}, 422),
    ("/tasks", {"title": "x", "deps": ["bad id"]}, 422),
    ("/tasks", {"title": "x", "deps": [f"d{i}" for i in range(1001)]}, 422),
    ("/tasks", {"title": "x", "queue": "bad queue"}, 422),
    ("/tasks", {"title": "x", "queue": 5}, 422),
    ("/tasks", {"id": "bad id", "title": "x"}, 422),
    ("/tasks", {"id": "-starts-with-dash", "title": "x"}, 422),
    ("/tasks", {"id": "a" * 101, "title": "x"}, 422),
    ("/tasks", {"id": 5, "title": "x"}, 422),
    ("/tasks", {"title": "x", "payload": "x" * (FIELD_LIMIT - 1)}, 413),  # 256 KiB + 1 byte of JSON
    ("/tasks", [{"title": "ok"}, {"title": "x", "payload": ["x" * FIELD_LIMIT]}], 413),
    ("/tasks", "{not json", 422),
    ("/tasks", "", 422),
    ("/tasks", "null", 422),
    ("/tasks", "5", 422),
    ("/tasks", '"a task"', 422),
    # claiming
    ("/claim", {}, 422),
    ("/claim", {"ttl_seconds": 0}, 422),
    ("/claim", {"ttl_seconds": 0.5}, 422),
    ("/claim", {"ttl_seconds": 86401}, 422),
    ("/claim", {"ttl_seconds": -5}, 422),
    ("/claim", {"ttl_seconds": "60"}, 422),
    ("/claim", {"ttl_seconds": True}, 422),
    ("/claim", {"ttl_seconds": None}, 422),
    ("/claim", {"ttl_seconds": 60, "wait_seconds": 31}, 422),
    ("/claim", {"ttl_seconds": 60, "wait_seconds": -1}, 422),
    ("/claim", {"ttl_seconds": 60, "wait_seconds": "1"}, 422),
    ("/claim", {"ttl_seconds": 60, "queue": 5}, 422),
    ("/claim", {"ttl_seconds": 60, "queue": "bad queue"}, 422),
    ("/claim", {"ttl_seconds": 60, "unknown": 1}, 422),
    ("/claim", [{"ttl_seconds": 60}], 422),
    ("/claim", "{not json", 422),
    ("/tasks/run/claim", {"ttl_seconds": 0}, 422),
    ("/tasks/run/claim", {"ttl_seconds": 86401}, 422),
    ("/tasks/run/claim", {"ttl_seconds": 60, "token": TOKEN}, 422),
    ("/tasks/run/claim", [], 422),
    ("/tasks/run/resume", {"ttl_seconds": 0}, 422),
    ("/tasks/run/resume", {"ttl_seconds": 60, "checkpoint": {}}, 422),
    # the holder's verbs
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 0}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 86401}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": "60"}, 422),
    ("/tasks/run/renew", {"token": TOKEN}, 422),
    ("/tasks/run/renew", {"ttl_seconds": 60}, 422),
    ("/tasks/run/renew", {"token": 5, "ttl_seconds": 60}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 60, "progress": 1.5}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 60, "progress": -0.1}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 60, "progress": "0.5"}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 60, "until": "2030-01-01T00:00:00Z"}, 422),
    ("/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 60, "checkpoint": "x" * FIELD_LIMIT}, 413),
    ("/tasks/run/release", {}, 422),
    ("/tasks/run/release", {"token": TOKEN, "unknown": 1}, 422),
    ("/tasks/run/release", [TOKEN], 422),
    ("/tasks/run/release", {"token": [TOKEN]}, 422),
    ("/tasks/run/complete", {"token": TOKEN}, 422),
    ("/tasks/run/complete", {"token": TOKEN, "result": None}, 422),
    ("/tasks/run/complete", {"token": TOKEN, "result": 1, "unknown": 1}, 422),
    ("/tasks/run/complete", {"token": TOKEN, "result": "x" * FIELD_LIMIT}, 413),
    ("/tasks/run/complete", {"token": TOKEN, "result": {"big": "x" * FIELD_LIMIT}}, 413),
    ("/tasks/run/fail", {"token": TOKEN}, 422),
    ("/tasks/run/fail", {"token": TOKEN, "error": 5}, 422),
    ("/tasks/run/fail", {"token": TOKEN, "error": None}, 422),
    ("/tasks/run/fail", {"token": TOKEN, "error": "x", "retryable": "false"}, 422),
    ("/tasks/run/fail", {"token": TOKEN, "error": "x", "retryable": 0}, 422),
    ("/tasks/run/fail", {"token": TOKEN, "error": "x" * 10_001}, 422),
    ("/tasks/run/pause", {"token": TOKEN}, 422),
    ("/tasks/run/pause", {"token": TOKEN, "checkpoint": None}, 422),
    ("/tasks/run/pause", {"token": TOKEN, "checkpoint": "x" * FIELD_LIMIT}, 413),
    # operators' verbs (sent with the operator key)
    ("/tasks/run/cancel", {"version": "1"}, 422),
    ("/tasks/run/cancel", {"version": 1.5}, 422),
    ("/tasks/run/cancel", {"reason": 5}, 422),
    ("/tasks/run/cancel", {"reason": "x" * 501}, 422),
    ("/tasks/run/cancel", {"unknown": 1}, 422),
    ("/tasks/run/cancel", [], 422),
    ("/tasks/run/cancel", "{not json", 422),
    ("/tasks/run/admit", {"version": "0"}, 422),
    ("/tasks/run/admit", {"reset_attempts": True}, 422),
    ("/tasks/run/requeue", {"reset_attempts": "yes"}, 422),
    ("/tasks/run/requeue", {"version": None, "unknown": 1}, 422),
    # over 1 MiB of body, wherever it is sent
    ("/tasks", {"title": "x", "payload": "x" * MiB}, 413),
    ("/tasks", "x" * (MiB + 1), 413),
    ("/claim", {"ttl_seconds": 60, "queue": "x" * MiB}, 413),
    ("/tasks/run/complete", {"token": TOKEN, "result": "x" * MiB}, 413),
    ("/tasks/run/cancel", {"reason": "x" * MiB}, 413),
]


@pytest.mark.parametrize("path, body, status", BAD_INPUT,
                         ids=[f"{i}:{path}" for i, (path, _, _) in enumerate(BAD_INPUT)])
def test_bad_input_is_refused_and_nothing_changes(w, running, path, body, status):
    key = w.op if path.rsplit("/", 1)[-1] in ("admit", "requeue", "cancel") else w.a
    before, keys = db_state(), key_rows()
    response = post(w.http, path, _fill(body, running.token), key)
    assert_error(response, status, {422: "validation_error", 413: "too_large"}[status])
    assert db_state() == before
    assert key_rows() == keys
    assert running.token.encode() not in response.content


def test_a_json_field_of_exactly_256_kib_is_accepted(http, agent):
    payload = "x" * (FIELD_LIMIT - 2)  # + 2 quotes = 262,144 bytes of JSON
    assert len(json.dumps(payload)) == FIELD_LIMIT
    assert post(http, "/tasks", {"id": "big", "title": "x", "payload": payload}, agent).status_code == 201


def test_a_body_of_exactly_1_mib_is_accepted(http, agent):
    head, tail = '{"id": "big", "title": "x"', "}"
    body = head + " " * (MiB - len(head) - len(tail)) + tail
    assert len(body.encode()) == MiB
    assert post(http, "/tasks", body, agent).status_code == 201


@pytest.mark.parametrize("path", ["/tasks/bad%20id/claim", "/tasks/ghost/claim", f"/tasks/{'a' * 101}/claim"])
def test_claiming_a_bad_or_unknown_task_id_is_404(w, path):
    before = db_state()
    assert_error(post(w.http, path, {"ttl_seconds": 60}, w.a), 404, "not_found")
    assert db_state() == before


@pytest.mark.parametrize("verb, extra", [
    ("renew", {"ttl_seconds": 60}), ("release", {}), ("complete", {"result": 1}),
    ("fail", {"error": "x"}), ("pause", {"checkpoint": {}}),
])
def test_a_holder_verb_with_a_wrong_token_is_lease_lost(w, running, verb, extra):
    before = db_state()
    error = assert_error(post(w.http, f"/tasks/run/{verb}", {"token": running.token[:-1] + "x", **extra}, w.a),
                         409, "lease_lost")
    assert error["task"] == current(w.http, w.a, "run")
    assert db_state() == before


@pytest.mark.parametrize("verb, extra", [
    ("renew", {"ttl_seconds": 60}), ("release", {}), ("complete", {"result": 1}),
    ("fail", {"error": "x"}), ("pause", {"checkpoint": {}}),
])
def test_another_agents_key_with_the_holders_token_is_forbidden(w, running, verb, extra):
    before = db_state()
    response = post(w.http, f"/tasks/run/{verb}", {"token": running.token, **extra}, w.b)
    error = assert_error(response, 403, "forbidden")
    assert error["task"] == current(w.http, w.a, "run") and error["task"]["owner"] == "agent-a"
    assert db_state() == before
    assert running.token.encode() not in response.content


# ---------------------------------------------------------------------------------------------
# Authentication: agent keys


ENDPOINTS = [
    ("post", "/tasks", {"title": "x"}),
    ("get", "/tasks", None),
    ("get", "/tasks/run", None),
    ("get", "/tasks/run/events", None),
    ("post", "/claim", {"ttl_seconds": 60}),
    ("post", "/tasks/run/claim", {"ttl_seconds": 60}),
    ("post", "/tasks/run/renew", {"token": TOKEN, "ttl_seconds": 60}),
    ("post", "/tasks/run/release", {"token": TOKEN}),
    ("post", "/tasks/run/complete", {"token": TOKEN, "result": 1}),
    ("post", "/tasks/run/fail", {"token": TOKEN, "error": "x"}),
    ("post", "/tasks/run/pause", {"token": TOKEN, "checkpoint": {}}),
    ("post", "/tasks/run/resume", {"ttl_seconds": 60}),
    ("post", "/tasks/run/admit", {}),
    ("post", "/tasks/run/requeue", {}),
    ("post", "/tasks/run/cancel", {}),
    ("get", "/check", None),
]


def _call(http, method, path, body, token, **headers):
    if method == "get":
        return http.get(API + path, **headers)
    return http.post(API + path, json.dumps(_fill(body, token)), content_type="application/json", **headers)


@pytest.mark.parametrize("method, path, body", ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_every_endpoint_without_credentials_is_401(w, running, method, path, body):
    before, keys = db_state(), key_rows()
    response = _call(w.http, method, path, body, running.token)
    assert_error(response, 401, "unauthorized")
    assert db_state() == before and key_rows() == keys
    assert running.token.encode() not in response.content


@pytest.fixture
def revoked_key() -> str:
    row, key = agent_keys.create_key("gone", is_operator=True)
    assert agent_keys.revoke(row.pk)
    return key


@pytest.mark.parametrize("header", [
    "Bearer nope",
    "Bearer tfk_" + "A" * 43,
    "Bearer ",
    "Bearer",
    "Basic YWdlbnQtYTpzZWNyZXQ=",
    "Token {agent}",
    "Bearer {agent}x",
    "Bearer {revoked}",
    "Bearer " + "tfk_" + "x" * 300,
])
@pytest.mark.parametrize("method, path, body", [ENDPOINTS[0], ENDPOINTS[1], ENDPOINTS[4], ENDPOINTS[14]],
                         ids=["create", "list", "claim-next", "cancel"])
def test_a_bad_or_revoked_key_is_401(w, running, revoked_key, header, method, path, body):
    before, keys = db_state(), key_rows()
    header = header.format(agent=w.a, revoked=revoked_key)
    response = _call(w.http, method, path, body, running.token, HTTP_AUTHORIZATION=header)
    assert_error(response, 401, "unauthorized")
    assert db_state() == before
    assert key_rows() == keys  # not even last_used_at moves for a refused key


def test_a_key_this_process_trusts_but_another_revoked_is_refused_by_the_hot_verbs(w, running):
    """claim_next, renew and complete take a key verified in the last minute without looking it
    up again (board.agent_keys.authenticate_deferred); the move checks it. Revoked by another
    server process (the row alone: this process still remembers the key as live), the very
    next hot request is 401 like any bad key, and nothing is written."""
    create(w.http, w.a, id="ready", title="ready to claim")
    row = AgentKey.objects.get(name="agent-a")
    assert AgentKey.objects.filter(pk=row.pk).update(revoked_at=timezone.now()) == 1
    before, keys = db_state(), key_rows()
    assert_error(post(w.http, "/claim", {"ttl_seconds": 60}, w.a), 401, "unauthorized")
    assert_error(post(w.http, "/claim", {"ttl_seconds": 60, "wait_seconds": 1}, w.a), 401, "unauthorized")
    assert_error(post(w.http, f"/tasks/{running.id}/renew", {"token": running.token, "ttl_seconds": 60}, w.a),
                 401, "unauthorized")
    response = post(w.http, f"/tasks/{running.id}/complete", {"token": running.token, "result": {}}, w.a)
    assert_error(response, 401, "unauthorized")
    assert running.token.encode() not in response.content
    assert db_state() == before and key_rows() == keys
    # Another agent's trusted key is unaffected.
    assert post(w.http, "/claim", {"ttl_seconds": 60}, w.b).json()["task"]["id"] == "ready"


def test_the_agent_name_comes_from_the_key(http, agent, agent_b):
    create(http, agent, id="t")
    task = post(http, "/claim", {"ttl_seconds": 60}, agent_b).json()["task"]
    assert task["owner"] == "agent-b"
    assert TaskEvent.objects.filter(task_id="t").values_list("actor", flat=True)[0] == "agent-a"


def test_a_key_records_when_it_was_last_used(http):
    row, key = agent_keys.create_key("fresh")
    assert row.last_used_at is None
    before = timezone.now()
    assert get(http, "/tasks", key).status_code == 200
    used = AgentKey.objects.get(pk=row.pk).last_used_at
    assert used is not None and before <= used <= timezone.now()


def test_create_agent_key_command_prints_a_working_key_stored_only_as_its_hash(http):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_agent_key", "cli-bot", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert key and "\n" not in key and key not in err.getvalue()
    row = AgentKey.objects.get(name="cli-bot")
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert not row.is_operator
    for column, value in AgentKey.objects.filter(pk=row.pk).values().first().items():
        assert key not in str(value), f"the key is stored in AgentKey.{column}"
    assert row.last_used_at is None
    task = create(http, key, id="by-cli")
    assert task["id"] == "by-cli"
    assert AgentKey.objects.get(pk=row.pk).last_used_at is not None
    assert_error(post(http, "/tasks/by-cli/cancel", {}, key), 403, "forbidden")


def test_create_agent_key_command_with_operator_rights(http, agent):
    out = io.StringIO()
    call_command("create_agent_key", "cli-op", "--operator", stdout=out, stderr=io.StringIO())
    create(http, agent, id="t")
    assert post(http, "/tasks/t/cancel", {}, out.getvalue().strip()).json()["stage"] == "CANCELLED"


# ---------------------------------------------------------------------------------------------
# Authentication: a staff user's browser session (CSRF-checked)


def test_a_staff_session_post_without_the_csrf_token_is_forbidden(db):
    client = HttpsClient(enforce_csrf_checks=True)
    client.force_login(staff_user())
    before = db_state()
    assert_error(post(client, "/tasks", {"title": "x"}), 403, "forbidden")
    assert_error(post(client, "/claim", {"ttl_seconds": 60}), 403, "forbidden")
    assert db_state() == before


def test_a_staff_session_with_the_csrf_token_works(agent):
    client, csrf = session_client(staff_user(perms=["view_task", "add_task"]))
    task = post(client, "/tasks", {"id": "by-staff", "title": "x"}, **csrf)
    assert task.status_code == 201
    assert TaskEvent.objects.get(task_id="by-staff").actor == "staff"
    # Claiming is for agents' keys, never a session (tests/test_access_api.py has the rest).
    before = db_state()
    assert_error(post(client, "/claim", {"ttl_seconds": 60}, **csrf), 403, "forbidden")
    assert db_state() == before


def test_a_staff_session_reads_without_a_csrf_token(http, agent):
    create(http, agent, id="t")
    client = HttpsClient(enforce_csrf_checks=True)
    client.force_login(staff_user(perms=["view_task"]))
    assert [t["id"] for t in get(client, "/tasks").json()["items"]] == ["t"]
    assert get(client, "/tasks/t").status_code == 200
    assert get(client, "/check").json() == {"problems": []}


def test_a_wrong_csrf_token_is_forbidden(db):
    client, csrf = session_client(staff_user())
    before = db_state()
    assert_error(post(client, "/tasks", {"title": "x"}, **{**csrf, "HTTP_X_CSRFTOKEN": "x" * 32}), 403, "forbidden")
    assert db_state() == before


def test_a_non_staff_session_is_401(http, agent):
    create(http, agent, id="t")
    client, csrf = session_client(staff_user("visitor", is_staff=False))
    before = db_state()
    assert_error(get(client, "/tasks"), 401, "unauthorized")
    assert_error(post(client, "/tasks", {"title": "x"}, **csrf), 401, "unauthorized")
    assert_error(post(client, "/claim", {"ttl_seconds": 60}, **csrf), 401, "unauthorized")
    assert db_state() == before


def test_an_inactive_staff_session_is_401(db):
    user = staff_user()
    client, csrf = session_client(user)
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert_error(get(client, "/tasks"), 401, "unauthorized")


@pytest.mark.parametrize("verb", ["admit", "requeue", "cancel"])
def test_operator_verbs_need_the_intervene_permission(http, agent, verb):
    create(http, agent, id="t", on_hold=True)
    if verb == "requeue":
        post(http, "/tasks/t/admit", {}, agent_keys.create_key("op", is_operator=True)[1])
        _, token = claim(http, agent, "t")
        post(http, "/tasks/t/fail", {"token": token, "error": "x", "retryable": False}, agent)
    plain, plain_csrf = session_client(staff_user("staff"))
    before = db_state()
    assert_error(post(plain, f"/tasks/t/{verb}", {}, **plain_csrf), 403, "forbidden")
    assert db_state() == before
    allowed, allowed_csrf = session_client(staff_user("boss", operator=True))
    response = post(allowed, f"/tasks/t/{verb}", {"reason": "operator says so"} if verb != "admit" else {},
                    **allowed_csrf)
    assert response.status_code == 200, response.content
    assert response.json()["stage"] == {"admit": "QUEUED", "requeue": "QUEUED", "cancel": "CANCELLED"}[verb]
    assert TaskEvent.objects.filter(task_id="t").last().actor == "boss"


# ---------------------------------------------------------------------------------------------
# The lease token is shown only to its holder, in the answers to its own claim/resume/renew


def test_the_lease_token_appears_only_in_the_holders_claim_resume_and_renew_answers(w):
    http, a, b = w.http, w.a, w.b
    create(http, a, id="t", title="secret work")
    shown, others = [], []

    claimed = post(http, "/claim", {"ttl_seconds": 60}, a)
    shown.append(claimed)
    t1 = claimed.json()["lease"]["token"]
    shown.append(post(http, "/tasks/t/renew", {"token": t1, "ttl_seconds": 120, "checkpoint": {"n": 1}}, a))
    stored_hashes = {Task.objects.get(pk="t").lease_token_hash}
    others += [
        get(http, "/tasks", a), get(http, "/tasks?owner=agent-a", a), get(http, "/tasks?text=t", a),
        get(http, "/tasks/t", a), get(http, "/tasks/t/events", a), get(http, "/check", a),
        post(http, "/tasks", {"id": "t", "title": "secret work"}, a),                 # 200 (idempotent)
        post(http, "/tasks", {"id": "t", "title": "other"}, a),                       # duplicate_id
        post(http, "/tasks/t/claim", {"ttl_seconds": 60}, b),                         # taken
        post(http, "/tasks/t/resume", {"ttl_seconds": 60}, b),                        # taken
        post(http, "/tasks/t/complete", {"token": t1, "result": 1}, b),               # forbidden
        post(http, "/tasks/t/renew", {"token": t1, "ttl_seconds": 60}, b),            # forbidden
        post(http, "/tasks/t/complete", {"token": t1 + "x", "result": 1}, a),         # lease_lost
        post(http, "/tasks/t/renew", {"token": t1, "ttl_seconds": 0}, a),             # validation_error
        post(http, "/tasks/t/renew", {"token": t1, "ttl_seconds": 60, "x": t1}, a),   # unknown field
        post(http, "/tasks/t/complete", {"token": t1, "result": "x" * FIELD_LIMIT}, a),  # too_large
        post(http, "/tasks/t/cancel", {}, a),                                         # forbidden
        post(http, "/tasks/t/complete", {"token": t1, "result": 1}),                  # unauthorized
        post(http, "/tasks/t/pause", {"token": t1, "checkpoint": {"n": 2}}, a),       # the holder's pause
    ]
    resumed = post(http, "/tasks/t/resume", {"ttl_seconds": 60}, a)
    shown.append(resumed)
    t2 = resumed.json()["lease"]["token"]
    stored_hashes.add(Task.objects.get(pk="t").lease_token_hash)
    others += [
        get(http, "/tasks/t", a), get(http, "/tasks/t/events", a),
        post(http, "/tasks/t/renew", {"token": t1, "ttl_seconds": 60}, a),            # lease_lost: old token
        post(http, "/tasks/t/release", {"token": t2}, a),
    ]
    reclaimed = post(http, "/claim", {"ttl_seconds": 60}, a)
    shown.append(reclaimed)
    t3 = reclaimed.json()["lease"]["token"]
    stored_hashes.add(Task.objects.get(pk="t").lease_token_hash)
    expire_lease("t")
    others += [
        get(http, "/check", a),                                                        # lease_expired problem
        post(http, "/tasks/t/renew", {"token": t3, "ttl_seconds": 60}, a),             # lease_lost: expired
        post(http, "/tasks/t/complete", {"token": t3, "result": "done"}, a),
        get(http, "/tasks", a), get(http, "/tasks/t", a), get(http, "/tasks/t/events?limit=1", a),
        get(http, "/check", a),
    ]

    tokens = [t1, t2, t3]
    assert len(set(tokens)) == 3 and None not in stored_hashes
    assert stored_hashes == {hashlib.sha256(t.encode()).hexdigest() for t in tokens}
    assert [r.status_code for r in shown] == [200] * 4
    assert t1.encode() in shown[0].content and t1.encode() in shown[1].content
    for response in others:
        for secret in tokens + sorted(stored_hashes):
            assert secret.encode() not in response.content, (response.status_code, response.content[:300])
    for response in shown:
        for secret in stored_hashes:
            assert secret.encode() not in response.content
    assert {r.status_code for r in others} >= {200, 401, 403, 409, 413, 422}


# ---------------------------------------------------------------------------------------------
# OpenAPI


OPERATIONS = {
    ("/api/tasks", "post"), ("/api/tasks", "get"), ("/api/tasks/{task_id}", "get"),
    ("/api/tasks/{task_id}/events", "get"), ("/api/claim", "post"),
    *(("/api/tasks/{task_id}/" + verb, "post") for verb in (
        "claim", "renew", "release", "complete", "fail", "pause", "resume", "admit", "requeue", "cancel")),
    ("/api/check", "get"),
}


def test_openapi_lists_every_operation_with_bearer_auth(http):
    response = http.get(f"{API}/openapi.json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    spec = response.json()
    operations = {(path, method) for path, methods in spec["paths"].items() for method in methods}
    assert OPERATIONS <= operations, OPERATIONS - operations
    bearer = [name for name, scheme in spec["components"]["securitySchemes"].items()
              if scheme.get("type") == "http" and scheme.get("scheme", "").lower() == "bearer"]
    assert len(bearer) == 1
    for path, method in OPERATIONS:
        operation = spec["paths"][path][method]
        assert {bearer[0]: []} in operation["security"], (path, method)
    assert {"200", "204"} <= set(spec["paths"]["/api/claim"]["post"]["responses"])
    assert {"201", "200", "409", "422"} <= set(spec["paths"]["/api/tasks"]["post"]["responses"])


def test_the_docs_page_is_html(http):
    response = http.get(f"{API}/docs")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"/api/openapi.json" in response.content


# ---------------------------------------------------------------------------------------------
# Regressions: bugs found while writing these tests, fixed since (NaN/Infinity taken for an id
# collision or answered 500, admit's reason dropped, a held create's retry refused after
# admission, HTML 404/405 under /api/, misspelt query parameters ignored).


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_payload_with_a_non_finite_number_is_a_validation_error(http, agent, number):
    before = db_state()
    response = post(http, "/tasks", '{"id": "fresh", "title": "x", "payload": {"v": %s}}' % number, agent)
    assert db_state() == before
    assert_error(response, 422, "validation_error")


@pytest.mark.parametrize("verb, body", [
    ("complete", '{"token": "%s", "result": NaN}'),
    ("complete", '{"token": "%s", "result": [1, Infinity]}'),
    ("pause", '{"token": "%s", "checkpoint": {"at": NaN}}'),
    ("renew", '{"token": "%s", "ttl_seconds": 60, "checkpoint": NaN}'),
])
def test_a_result_or_checkpoint_with_a_non_finite_number_is_a_validation_error(agent, running, verb, body):
    http = HttpsClient(raise_request_exception=False)
    before = db_state()
    response = post(http, f"/tasks/run/{verb}", body % running.token, agent)
    assert db_state() == before
    assert_error(response, 422, "validation_error")


def test_admit_records_the_operators_reason(http, agent, operator):
    create(http, agent, id="held", on_hold=True)
    assert post(http, "/tasks/held/admit", {"reason": "approved by QA"}, operator).status_code == 200
    last = get(http, "/tasks/held/events", agent).json()["items"][-1]
    assert last["verb"] == "admit"
    assert last["detail"] == {"reason": "approved by QA"}


@pytest.mark.parametrize("gate", ["on_hold", "hold"])
def test_retrying_a_held_create_after_admission_is_still_idempotent(http, agent, operator, gate):
    body = {"id": "held", "title": "x", gate: True}
    assert post(http, "/tasks", body, agent).status_code == 201
    assert post(http, "/tasks/held/admit", {}, operator).status_code == 200
    again = post(http, "/tasks", body, agent)
    assert again.status_code == 200, again.content
    assert again.json()["stage"] == "QUEUED"


def test_a_create_event_written_before_the_rename_still_says_on_hold(http, agent, operator):
    """Create events written before on_hold (migration 0018) record {"hold": true}: a retry of
    such a create after its admission is still the same create."""
    body = {"id": "held", "title": "x", "on_hold": True}
    assert post(http, "/tasks", body, agent).status_code == 201
    TaskEvent.objects.filter(task_id="held", verb="create").update(detail={"hold": True})
    assert post(http, "/tasks/held/admit", {}, operator).status_code == 200
    again = post(http, "/tasks", body, agent)
    assert again.status_code == 200, again.content


def test_hold_is_on_hold_under_its_former_name(http, agent):
    """Clients written before the rename send `hold` and read `hold`: both still work, and name
    the same gate; given both, they must agree (the disagreeing body is in the 422 table above)."""
    task = post(http, "/tasks", {"id": "old", "title": "x", "hold": True}, agent).json()
    assert (task["stage"], task["on_hold"], task["hold"]) == ("PENDING", True, True)
    task = post(http, "/tasks", {"id": "both", "title": "x", "hold": True, "on_hold": True}, agent).json()
    assert (task["stage"], task["on_hold"], task["hold"]) == ("PENDING", True, True)
    task = post(http, "/tasks", {"id": "new", "title": "x"}, agent).json()
    assert (task["stage"], task["on_hold"], task["hold"]) == ("QUEUED", False, False)


def test_an_unknown_api_path_answers_in_the_error_shape(http, agent):
    assert_error(get(http, "/nothing-here", agent), 404, "no_such_endpoint")


def test_api_requests_skip_the_messages_store_that_pages_still_get(http, agent):
    """board.api.middleware.MessagesOutsideApi: an API answer never carries a message, so no
    message store is built for one; the admin's pages (whose actions report through messages)
    still get theirs."""
    api_answer = get(http, "/tasks", agent)
    assert api_answer.status_code == 200
    assert not hasattr(api_answer.wsgi_request, "_messages")
    http.force_login(staff_user("messages-reader"))
    page = http.get("/admin/login/")
    assert hasattr(page.wsgi_request, "_messages")


def test_a_wrong_method_answers_in_the_error_shape(http, agent):
    response = get(http, "/claim", agent)
    assert response.status_code == 405
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    assert set(response.json()) == {"error"}


@pytest.mark.parametrize("query", ["stages=RUNNING", "limt=1", "owner=agent-a&queu=x"])
def test_an_unknown_query_parameter_is_refused(http, agent, query):
    create(http, agent, id="t")
    assert_error(get(http, f"/tasks?{query}", agent), 422, "validation_error")


def test_the_hot_endpoints_answer_exactly_the_documented_shapes(http, agent):
    """claim, renew and complete render their answers without django-ninja's output validation
    (board.api.routers.leases._answer): what they send must still be exactly ClaimOut / TaskOut, and the same
    as the validated endpoints send for the same task."""
    from board.api.schemas import ClaimOut, LeaseOut, TaskOut

    def same_shape(body, schema):
        schema.model_validate(body)
        # A lease's hand-offs (inputs, notes, the last approval) are there only for a task that has some.
        handoffs = {"inputs", "inputs_omitted", "notes", "approval"} if schema is LeaseOut else set()
        assert set(body) == set(schema.model_fields) - handoffs

    create(http, agent, id="shape", payload={"n": 1})
    claimed = post(http, "/claim", {"ttl_seconds": 60}, agent)
    assert claimed.status_code == 200 and claimed["Content-Type"].startswith("application/json")
    body = claimed.json()
    same_shape(body, ClaimOut)
    same_shape(body["task"], TaskOut)
    same_shape(body["lease"], LeaseOut)
    token = body["lease"]["token"]
    renewed = post(http, "/tasks/shape/renew", {"token": token, "ttl_seconds": 60, "progress": 0.5}, agent).json()
    same_shape(renewed, ClaimOut)
    assert renewed["task"] == current(http, agent, "shape")  # as GET /tasks/{id} (validated) renders it
    done = post(http, "/tasks/shape/complete", {"token": token, "result": {"ok": True}}, agent)
    assert done.status_code == 200
    same_shape(done.json(), TaskOut)
    assert done.json() == current(http, agent, "shape")
