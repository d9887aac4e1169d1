"""The board's server (`manage.py serve`, as `make run` starts it) under what agents do at scale:
oversize bodies, more waiting claims than it parks, revoked keys on every worker process, and
waiting claims that hold no database connection. Each against a real server on a real database.
"""
import http.client
import json
import select
import socket
import threading
import time

import pytest
from django.db import connections

from board import agent_keys
from board.engine.limits import MAX_WAIT_SECONDS
from board.engine import transitions
from board.models import Task, TaskEvent
from tests.live_server import BoardServer, wait_until
from tests.support import database_url, db_state, postgres_db_mark, sql_stores, sqlite_db_mark

LIMIT = 1024 * 1024

pytestmark = sqlite_db_mark()


def on_postgres(test):
    """The test runs on the PostgreSQL alias too (its marks on top of the module's)."""
    for mark in postgres_db_mark():
        test = mark(test)
    return test


def request(server: BoardServer, method: str, path: str, key: str | None = None, body=None,
            timeout: float = 30) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def board_rows() -> tuple[int, int]:
    return Task.objects.count(), TaskEvent.objects.count()


def start_server(alias: str = "default", **env) -> BoardServer:
    url = database_url(connections[alias].settings_dict)
    workers = env.pop("workers", None)
    return BoardServer(url, env=env, args=["--workers", str(workers)] if workers else []).start()


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = start_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def key(server):
    return agent_keys.create_key("agent-a")[1]


# ---------------------------------------------------------------------------------------------
# Bodies over the limit are refused before they are read


def read_answer(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data


def assert_413(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    error = json.loads(body)["error"]
    assert error["code"] == "too_large" and str(LIMIT) in error["message"]


@pytest.mark.parametrize("path", ["/api/tasks", "/api/tasks/x/complete", "/admin/login/"])
def test_a_content_length_over_the_limit_is_413_before_a_byte_of_body_is_read(server, path):
    before = board_rows()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        # 400 MB announced, not one byte sent: an answer can only come from the header.
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {400 * LIMIT}\r\n\r\n".encode())
        assert_413(read_answer(sock, timeout=10))
    assert board_rows() == before


def test_a_chunked_body_is_413_as_soon_as_it_passes_the_limit(server, key):
    before = board_rows()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + key.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        # Just past the limit, and then the body never ends: only a server that stops reading
        # at the limit can answer.
        for _ in range(LIMIT // len(chunk) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        assert_413(read_answer(sock, timeout=10))
    assert board_rows() == before


def test_a_body_at_the_limit_still_reaches_the_api(server, key):
    # Exactly 1 MiB of JSON: read in full and judged by the API (a payload over 256 KiB: 413 from
    # the API's own field limit, with its own message), not by the server's body limit.
    payload = "x" * (LIMIT - 100)
    body = json.dumps({"title": "big", "payload": payload})
    body = body[:-2] + " " * (LIMIT - len(body)) + body[-2:]
    assert len(body) == LIMIT
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/api/tasks", body=body,
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    response = conn.getresponse()
    error = json.loads(response.read())["error"]
    conn.close()
    assert response.status == 413 and "payload" in error["message"]


# ---------------------------------------------------------------------------------------------
# Waiting claims


def waiting_claim(server, key, queue, wait, outcome: list) -> threading.Thread:
    def run():
        try:
            for _ in range(200):  # as a client would: a 503 (the cap) means try again shortly
                started = time.monotonic()
                status, headers, data = request(server, "POST", "/api/claim", key,
                                                {"ttl_seconds": 60, "queue": queue, "wait_seconds": wait},
                                                timeout=wait + 30)
                if status != 503:
                    break
                time.sleep(0.05)
            outcome.append((status, headers, data, time.monotonic() - started))
        except Exception as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_wait_that_finds_nothing_is_a_plain_204_after_its_time(server, key):
    outcome: list = []
    waiting_claim(server, key, "never", 1, outcome).join(30)
    (status, headers, data, elapsed), = outcome
    assert status == 204 and data == b""
    assert not any(name.lower().startswith("x-taskflow") for name in headers)
    assert 1 <= elapsed < 10


def park(server, key, queue: str, n: int, wait: float) -> tuple[list, list[threading.Thread]]:
    """Start `n` waiting claims on `queue` and return once all are parked: on a server whose cap
    is `n`, that is when one more wait is refused (503) — known, not guessed. (A probe that
    parks briefly may push a starting claim past the cap; that claim tries again.)"""
    outcome: list = []
    threads = [waiting_claim(server, key, queue, wait, outcome) for _ in range(n)]

    def one_more_refused():
        status, headers, data = request(server, "POST", "/api/claim", key,
                                        {"ttl_seconds": 60, "queue": queue, "wait_seconds": 0.2})
        return (status, headers, data) if status == 503 else None

    status, headers, data = wait_until(one_more_refused, 15, f"{n} claims parked")
    assert headers.get("retry-after") == "1"
    assert json.loads(data)["error"]["code"] == "too_many_waiters"
    assert not outcome, outcome  # nobody has answered yet: all are parked
    return outcome, threads


# Claims parked by a test that then wakes them (wake_the_rest): long enough that none runs out
# first on a loaded machine, and costing nothing, since they are woken.
LONG_WAIT = MAX_WAIT_SECONDS


def wake_the_rest(server, key, queue: str, outcome: list, threads: list[threading.Thread], n: int) -> list[str]:
    """Create `n` tasks in `queue` for the `n` claims still parked there, wait for every claim
    to answer, and return the ids of the tasks the `n` got (sorted). Each must answer 200: one
    that answered early (a 204 before its time) or failed is still in `outcome` and fails this
    check. (Waking them, instead of waiting out their long wait, keeps the test short.)"""
    answered = len(outcome)
    for i in range(n):
        status, _, data = request(server, "POST", "/api/tasks", key, {"id": f"{queue}-{i}", "title": "w", "queue": queue})
        assert status == 201, data
    for thread in threads:
        thread.join(LONG_WAIT)
        assert not thread.is_alive(), "a parked claim never answered"
    rest = outcome[answered:]
    assert len(rest) == n and all(not isinstance(o, Exception) and o[0] == 200 for o in rest), rest
    return sorted(json.loads(o[2])["task"]["id"] for o in rest)


@pytest.fixture
def capped_server(django_db_setup, django_db_blocker):
    """One worker process that parks at most 3 waiting claims."""
    with django_db_blocker.unblock():
        server = start_server(TASKFLOW_MAX_WAITERS="3", workers=1)
    try:
        yield server
    finally:
        server.close()


def test_past_the_cap_a_wait_is_503_with_retry_after_and_other_requests_are_unaffected(capped_server, key):
    server = capped_server
    outcome, threads = park(server, key, "idle", 3, LONG_WAIT)
    # Everything else still works at once: create, claim without waiting, complete.
    before = time.monotonic()
    assert request(server, "POST", "/api/tasks", key, {"id": "busy", "title": "work", "queue": "busy"})[0] == 201
    status, _, data = request(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "busy"})
    assert status == 200
    token = json.loads(data)["lease"]["token"]
    assert request(server, "POST", "/api/tasks/busy/complete", key, {"token": token, "result": {}})[0] == 200
    assert time.monotonic() - before < 5
    # One task in the waited queue wakes exactly one of the three.
    assert request(server, "POST", "/api/tasks", key, {"id": "for-a-waiter", "title": "w", "queue": "idle"})[0] == 201
    wait_until(lambda: len(outcome) >= 1, 15, "a parked claim got the new task")
    first = outcome[0]
    assert not isinstance(first, Exception), first
    assert first[0] == 200 and json.loads(first[2])["task"]["id"] == "for-a-waiter"
    assert wake_the_rest(server, key, "idle", outcome, threads, 2) == ["idle-0", "idle-1"]


def test_the_python_client_waits_out_a_full_server_instead_of_failing(capped_server, key):
    from taskflow_client import Client

    outcome, threads = park(capped_server, key, "idle", 3, 20)
    started = time.monotonic()
    with Client(capped_server.url, key, timeout=10) as client:
        assert client.claim_next(60, queue="idle", wait_seconds=2) is None  # 503s, retried, then no work
    assert 1 <= time.monotonic() - started < 10
    assert not outcome  # the three parked claims were not disturbed
    transitions.create([transitions.TaskSpec(title="t", id=f"t{i}", queue="idle") for i in range(3)], actor="test")
    for thread in threads:
        thread.join(40)
    assert sorted(o[0] for o in outcome) == [200, 200, 200]


def test_a_client_that_leaves_while_parked_is_forgotten_and_never_claims(capped_server, key):
    server = capped_server
    body = json.dumps({"ttl_seconds": 60, "queue": "ghosts", "wait_seconds": 20}).encode()

    def ghost() -> socket.socket:
        """A waiting claim on a raw socket, so that the test can drop the connection."""
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST /api/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return sock

    def probe() -> int:
        return request(server, "POST", "/api/claim", key,
                       {"ttl_seconds": 60, "queue": "ghosts", "wait_seconds": 0.2})[0]

    socks = [ghost() for _ in range(3)]

    def all_parked() -> bool:
        # A probe parks for a moment and may push a starting claim past the cap (503): that
        # claim is sent again, as a client would, until the three are parked and one more is not.
        for i, sock in enumerate(socks):
            if select.select([sock], [], [], 0)[0]:
                assert b" 503 " in sock.recv(65536).split(b"\r\n", 1)[0]
                sock.close()
                socks[i] = ghost()
        return probe() == 503 and not any(select.select(socks, [], [], 0)[0])

    wait_until(all_parked, 15, "the three claims parked")
    for sock in socks:
        sock.close()
    # Their places free up as the server sees them go (a probe parks, then answers 204).
    wait_until(lambda: probe() == 204, 15, "the departed claims were forgotten")
    transitions.create(transitions.TaskSpec(title="for a live agent", id="real", queue="ghosts"), actor="test")
    status, _, data = request(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "ghosts"})
    assert status == 200 and json.loads(data)["task"]["id"] == "real"
    assert TaskEvent.objects.filter(task_id="real", verb="claim").count() == 1


def test_a_parked_claim_is_woken_by_a_commit_made_in_another_process(capped_server, key):
    server = capped_server
    outcome, threads = park(server, key, "late-work", 3, LONG_WAIT)
    started = time.monotonic()
    # Created by this process, not the server's: only the outbox (its tailer) can tell it.
    transitions.create(transitions.TaskSpec(title="arrives", id="late", queue="late-work"), actor="test")
    wait_until(lambda: len(outcome) >= 1, 15, "a parked claim got the task")
    assert time.monotonic() - started < 5  # the commit woke it; the wait had 30 s to go
    status, headers, data, _ = outcome[0]
    assert status == 200, data
    assert json.loads(data)["task"]["id"] == "late"
    assert not any(name.lower().startswith("x-taskflow") for name in headers)
    assert wake_the_rest(server, key, "late-work", outcome, threads, 2) == ["late-work-0", "late-work-1"]


@pytest.mark.parametrize("alias", sql_stores())
def test_a_revoked_key_is_refused_on_its_next_request_by_every_server_process(django_db_blocker, alias):
    """Two one-process servers on the same database: each has seen the key live, and holds a
    lease taken with it, so each remembers the key as verified (the hot verbs then take it on
    trust and check it in the move itself: board.agent_keys.authenticate_deferred). After the
    revoke, every request with it is refused on both, the hot verbs included, and nothing is
    written."""
    with django_db_blocker.unblock():
        servers = [start_server(alias, workers=1), start_server(alias, workers=1)]
    try:
        row, key = agent_keys.create_key("soon-revoked", using=alias)
        transitions.create([transitions.TaskSpec(title=f"t{i}", id=f"t{i}") for i in range(4)], using=alias)
        leases = []
        for server in servers:
            assert request(server, "GET", "/api/tasks/nothing", key)[0] == 404
            status, _, data = request(server, "POST", "/api/claim", key, {"ttl_seconds": 60})
            assert status == 200, data
            leases.append(json.loads(data))
        assert agent_keys.revoke(row.pk, using=alias)
        before = db_state(alias)
        for server, lease in zip(servers, leases, strict=True):
            task_id, token = lease["task"]["id"], lease["lease"]["token"]
            assert request(server, "GET", "/api/tasks/nothing", key)[0] == 401
            assert request(server, "POST", "/api/claim", key, {"ttl_seconds": 60})[0] == 401
            assert request(server, "POST", f"/api/tasks/{task_id}/renew", key,
                           {"token": token, "ttl_seconds": 60})[0] == 401
            assert request(server, "POST", f"/api/tasks/{task_id}/complete", key,
                           {"token": token, "result": {}})[0] == 401
        assert db_state(alias) == before
    finally:
        for server in servers:
            server.close()


# ---------------------------------------------------------------------------------------------
# PostgreSQL: parked claims hold no connection, so they cannot starve the pool


@pytest.fixture
def small_pool_server(django_db_setup, django_db_blocker):
    """One worker process, 2 request threads, a pool of 6 connections (the least serve takes), parking
    up to 25 claims."""
    with django_db_blocker.unblock():
        server = start_server("postgres", workers=1, TASKFLOW_HTTP_THREADS="2", DATABASE_POOL_MAX="6",
                              TASKFLOW_MAX_WAITERS="25")
    try:
        yield server
    finally:
        server.close()


@on_postgres
def test_more_waiting_claims_than_pool_connections_starve_nobody(small_pool_server):
    server = small_pool_server
    _, key = agent_keys.create_key("pg-agent", using="postgres")
    outcome, threads = park(server, key, "idle", 25, LONG_WAIT)
    started = time.monotonic()
    for i in range(10):  # ordinary work beside 25 parked claims and a pool of 6
        status, _, data = request(server, "POST", "/api/tasks", key, {"id": f"w{i}", "title": "w", "queue": "work"})
        assert status == 201, data
        status, _, data = request(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "work"})
        assert status == 200, data
        token = json.loads(data)["lease"]["token"]
        status, _, data = request(server, "POST", f"/api/tasks/w{i}/complete", key, {"token": token, "result": {}})
        assert status == 200, data
    assert time.monotonic() - started < 5  # no request waited for a connection (the pool waits 5 s)
    assert not outcome, outcome  # the 25 are still parked
    # All 25 woken at once claim through the same pool of 6, each its own task.
    assert wake_the_rest(server, key, "idle", outcome, threads, 25) == sorted(f"idle-{i}" for i in range(25))
    assert Task.objects.using("postgres").filter(stage="COMPLETED").count() == 10
