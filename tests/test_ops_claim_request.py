"""A claim whose reply is lost does not strand its task (issue 9, item 14).

Against the REAL server (manage.py serve) on the test database: a claim sent with a
`request_id` whose answer the agent never reads, then retried with the same id, gets the same
lease (token, fence, expiry) and the task's history shows one claim; concurrent retries with one
id make one lease that they all get; a bad id is refused with 422 and changes nothing. (The
engine's side, on every store and path, is in tests/test_contract.py; the Python client's retry
through a proxy that drops the answer, in tests/test_client.py.)
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import secrets

import pytest

from board import agent_keys
from board.engine import claim_requests, transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.live_server import api_call, board_server  # noqa: F401  (fixture)
from tests.support import db_state, race, sqlite_db_mark

pytestmark = sqlite_db_mark()

TTL = 60


@pytest.fixture
def keys(board_server):
    return {name: agent_keys.create_key(name)[1] for name in ("alice", "bob")}


def post(server, path: str, key: str, body: dict) -> tuple[int, dict | None]:
    return api_call(server, "POST", path, key, body)


def claims_of(task_id: str) -> int:
    return TaskEvent.objects.filter(task_id=task_id, verb="claim").count()


def create(server, key: str, *task_ids: str) -> None:
    for task_id in task_ids:
        status, body = post(server, "/api/tasks", key, {"id": task_id, "title": task_id})
        assert status == 201, body


def test_a_claim_retried_with_its_request_id_gets_the_same_lease(board_server, keys):
    create(board_server, keys["alice"], "lost-reply")
    path = "/api/tasks/lost-reply/claim"
    first = post(board_server, path, keys["alice"], {"ttl_seconds": TTL, "request_id": "req-1"})
    # The agent never saw that answer (lost on the way back); it retries with the same id.
    status, again = post(board_server, path, keys["alice"], {"ttl_seconds": TTL, "request_id": "req-1"})
    assert status == 200, again
    assert first[0] == 200 and again["lease"] == first[1]["lease"]
    assert claims_of("lost-reply") == 1
    assert Task.objects.get(pk="lost-reply").fence == 1
    # Another agent with the same id is not the same request: the task is taken.
    status, body = post(board_server, path, keys["bob"], {"ttl_seconds": TTL, "request_id": "req-1"})
    assert (status, body["error"]["code"]) == (409, "taken")
    # Without an id a retry is a second claim, refused as before: the lease is live.
    status, body = post(board_server, path, keys["alice"], {"ttl_seconds": TTL})
    assert (status, body["error"]["code"]) == (409, "taken")
    # The token the retry returned is the lease: it completes the task.
    token = again["lease"]["token"]
    status, done = post(board_server, "/api/tasks/lost-reply/complete", keys["alice"], {"token": token, "result": {}})
    assert (status, done["stage"]) == (200, "COMPLETED")
    # Once the lease has ended the id no longer names it: a retry is an ordinary claim.
    status, body = post(board_server, path, keys["alice"], {"ttl_seconds": TTL, "request_id": "req-1"})
    assert (status, body["error"]["code"]) == (409, "terminal")
    assert claims_of("lost-reply") == 1


def test_claim_next_retried_with_its_request_id_gets_the_same_task_and_lease(board_server, keys):
    create(board_server, keys["alice"], "n1", "n2")
    body = {"ttl_seconds": TTL, "request_id": "next-1"}
    status, first = post(board_server, "/api/claim", keys["alice"], body)
    assert status == 200, first
    status, again = post(board_server, "/api/claim", keys["alice"], body)
    assert status == 200, again
    assert (again["task"]["id"], again["lease"]) == (first["task"]["id"], first["lease"])
    assert Task.objects.filter(stage="RUNNING").count() == 1 and claims_of(first["task"]["id"]) == 1
    # A new id is a new claim: the other task.
    status, other = post(board_server, "/api/claim", keys["alice"], {"ttl_seconds": TTL, "request_id": "next-2"})
    assert status == 200 and other["task"]["id"] != first["task"]["id"]
    assert other["lease"]["token"] != first["lease"]["token"]


def test_concurrent_retries_with_one_request_id_make_one_lease_that_all_get(board_server, keys):
    create(board_server, keys["alice"], *[f"c{i}" for i in range(4)])
    body = {"ttl_seconds": TTL, "request_id": "same-request"}
    answers = race([lambda: post(board_server, "/api/claim", keys["alice"], body)] * 8)
    assert all(not isinstance(a, BaseException) and a[0] == 200 for a in answers), answers
    assert len({(a[1]["task"]["id"], a[1]["lease"]["token"], a[1]["lease"]["fence"]) for a in answers}) == 1
    assert Task.objects.filter(stage="RUNNING").count() == 1
    assert TaskEvent.objects.filter(verb="claim").count() == 1


@pytest.mark.parametrize("request_id", ["", "x" * 65, "has space", "tab\there", "line\n", "é-accent", 7])
def test_a_bad_request_id_is_refused_and_changes_nothing(board_server, keys, request_id):
    create(board_server, keys["alice"], "v")
    before = db_state()
    for path in ("/api/claim", "/api/tasks/v/claim"):
        status, body = post(board_server, path, keys["alice"], {"ttl_seconds": TTL, "request_id": request_id})
        assert status == 422 and body["error"]["code"] == "validation_error", body
        assert body["error"]["details"][0]["loc"] == ["request_id"]
    assert db_state() == before


def test_the_longest_printable_request_id_is_accepted(board_server, keys):
    create(board_server, keys["alice"], "long")
    request_id = "".join(chr(c) for c in range(0x21, 0x7F))[:64]
    status, body = post(board_server, "/api/tasks/long/claim", keys["alice"],
                        {"ttl_seconds": TTL, "request_id": request_id})
    assert status == 200, body


def test_no_token_starts_with_a_dash_so_that_the_command_line_takes_each_one(monkeypatch):
    """`python -m taskflow_client complete ID TOKEN` reads a token starting with "-" as an
    option: 1 token in 64 did. Neither a minted nor a derived token starts with one."""
    dash = bytes([0xF8]) + bytes(31)  # its base64 starts with "-"
    assert base64.urlsafe_b64encode(dash).decode()[0] == "-"
    transitions.create([TaskSpec(id="plain", title="p"), TaskSpec(id="derived", title="d")])
    with monkeypatch.context() as patched:
        patched.setattr(secrets, "token_bytes", lambda n: dash)
        plain = transitions.claim("plain", "alice", TTL)
    assert plain.lease.token[0] == "_" and plain.lease.token[1:] == base64.urlsafe_b64encode(dash).decode()[1:43]
    assert Task.objects.get(pk="plain").lease_token_hash == transitions.hash_token(plain.lease.token)

    def derived_text(seed: str) -> str:
        return base64.urlsafe_b64encode(hmac.new(b"req", seed.encode(), hashlib.sha256).digest()).decode()

    seed = next(s for s in (f"seed-{i}" for i in itertools.count()) if derived_text(s)[0] == "-")
    with monkeypatch.context() as patched:
        patched.setattr(claim_requests.secrets, "token_urlsafe", lambda n: seed)
        derived = transitions.claim("derived", "alice", TTL, request_id="req")
    assert derived.lease.token[0] == "_"
    assert transitions.claim("derived", "alice", TTL, request_id="req").lease == derived.lease
    for task_id, lease in (("plain", plain.lease), ("derived", derived.lease)):
        assert transitions.complete(task_id, lease.token, {}, agent="alice").stage == "COMPLETED"
