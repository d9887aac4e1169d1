"""A batch create is capped (MAX_BATCH_TASKS tasks per request, 413 past it, nothing created),
and the largest batch the server accepts holds the SQLite writers briefly: an agent renewing a
short lease meanwhile is answered well within its lease. Against the real server on SQLite.
"""
import http.client
import json
import threading
import time

import pytest

from board import agent_keys
from board.engine import transitions
from board.engine.limits import (
    MAX_BATCH_DEPENDENCIES,
    MAX_BATCH_TASKS,
    MAX_DESCRIPTION_CHARS,
)
from board.models import Dependency, Task
from tests.live_server import BoardServer, one_process_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark

pytestmark = sqlite_db_mark()

BODY_LIMIT = 1024 * 1024  # the server's body limit (server/serving.py)


@pytest.fixture(scope="module")
def server(one_process_server):
    # One process: the batch and the renews meet on its writer lock as well as SQLite's.
    return one_process_server


@pytest.fixture
def key():
    return agent_keys.create_key("agent-a")[1]


def post(server, path: str, key: str, body: bytes, timeout: float = 120) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize("count", [MAX_BATCH_TASKS + 1, 70_000])
def test_a_batch_over_the_cap_is_413_naming_the_limit_and_creates_nothing(server, key, count):
    body = compact([{"title": "t"} for _ in range(count)])
    assert len(body) < BODY_LIMIT  # refused by the batch cap, not by the body limit
    before = db_state()
    started = time.monotonic()
    status, answer = post(server, "/api/tasks", key, body)
    elapsed = time.monotonic() - started
    assert status == 413, answer
    assert answer["error"]["code"] == "too_large"
    assert str(MAX_BATCH_TASKS) in answer["error"]["message"] and str(count) in answer["error"]["message"]
    assert db_state() == before
    assert elapsed < 10  # refused before any work per task (it took 52 s to create 70,000)


def maximal_batch() -> bytes:
    """The most a create request may write: MAX_BATCH_TASKS tasks, MAX_BATCH_DEPENDENCIES
    dependency rows among them, and the rest of a body just under the server's limit spent on
    descriptions (at most MAX_DESCRIPTION_CHARS each)."""
    tasks = [{"id": f"{i:x}", "title": "t", "deps": [], "description": ""} for i in range(MAX_BATCH_TASKS)]
    deps, distance = 0, 1
    while deps < MAX_BATCH_DEPENDENCIES:  # task i depends on i-1, then i-2, ...: a DAG
        for i in range(distance, MAX_BATCH_TASKS):
            if deps == MAX_BATCH_DEPENDENCIES:
                break
            tasks[i]["deps"].append(f"{i - distance:x}")
            deps += 1
        distance += 1
    room = BODY_LIMIT - 1024 - len(compact(tasks))
    for task in tasks:
        text = min(room, MAX_DESCRIPTION_CHARS)
        if text <= 0:
            break
        task["description"] = "d" * text
        room -= text
    return compact(tasks)


def test_the_largest_batch_holds_the_writers_briefly_and_a_short_lease_renews_meanwhile(server, key):
    transitions.create(transitions.TaskSpec(title="held by an agent", id="leased"), actor="test")
    ttl = 3
    token = transitions.claim("leased", "agent-a", ttl).lease.token
    body = maximal_batch()
    assert len(body) <= BODY_LIMIT

    renewals: list[tuple[float, float, int]] = []  # (sent, answered, status), monotonic seconds
    batch_done = threading.Event()

    def renew_until_the_batch_is_answered():
        while not batch_done.is_set():
            sent = time.monotonic()
            status, _ = post(server, "/api/tasks/leased/renew", key, compact({"token": token, "ttl_seconds": ttl}))
            renewals.append((sent, time.monotonic(), status))

    renewer = threading.Thread(target=renew_until_the_batch_is_answered)
    renewer.start()
    try:
        batch_sent = time.monotonic()
        status, answer = post(server, "/api/tasks", key, body)
        batch_answered = time.monotonic()
    finally:
        batch_done.set()
        renewer.join(60)
    assert status == 201, answer
    assert len(answer["items"]) == MAX_BATCH_TASKS
    assert Task.objects.count() == MAX_BATCH_TASKS + 1
    dependency_rows = Dependency.objects.count()
    assert dependency_rows == MAX_BATCH_DEPENDENCIES

    during = [r for r in renewals if r[0] < batch_answered and r[1] > batch_sent]
    longest = max(answered - sent for sent, answered, _ in during)
    print(f"\nmaximal batch: {len(body)} bytes, {MAX_BATCH_TASKS} tasks, {dependency_rows} dependencies, "
          f"answered in {batch_answered - batch_sent:.2f} s; {len(during)} renewals meanwhile, "
          f"the slowest answered in {longest:.3f} s (lease {ttl} s)")
    assert during, "no renewal overlapped the batch"
    assert all(status == 200 for _, _, status in during), during
    assert longest < ttl / 2, f"a renewal waited {longest:.2f} s for the batch's writers"
    assert Task.objects.get(pk="leased").stage == "RUNNING"
