"""One HTTP agent process of bench/http_claims.py (standard library only, so that a spawned
process starts fast and measures nothing but the client side of HTTP).

An agent opens ONE keep-alive ``http.client.HTTPConnection`` to the server, waits at the
barrier with its siblings, then loops for a fixed time:

- ``cycle``: ``POST /api/claim {"ttl_seconds": 60}`` then
  ``POST /api/tasks/{id}/complete {"token": ..., "result": {"ok": true}}``;
- ``probe-401``: ``GET /api/tasks/does-not-exist`` without a key (the API answers 401 before
  any database work);
- ``probe-404``: the same with the agent's key (401-free: one AgentKey lookup by its hash,
  one task lookup by primary key, then 404).

It times every request (send to last byte of the body read) and puts one dict on the result
queue: the claimed task ids, the latencies per kind of request, its start and end times
(``time.perf_counter``, CLOCK_MONOTONIC on Linux, so comparable across processes), whether it
ran out of work, the CPU time it used in the loop, and the error that stopped it, if any.
"""
from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any

TTL_SECONDS = 60
RESULT = {"ok": True}
MISSING_TASK = "/api/tasks/does-not-exist"


class UnexpectedAnswer(Exception):
    pass


def _connect(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.connect()
    # Request line, headers and body go out in one send (http.client joins them for a bytes
    # body); no Nagle delay on the small writes either way.
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _request(conn: http.client.HTTPConnection, method: str, path: str, headers: dict,
             body: Any = None) -> tuple[int, bytes, float]:
    """One request on the kept-alive connection: (status, body, seconds)."""
    payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    started = time.perf_counter()
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - started
    if response.will_close:
        raise UnexpectedAnswer(f"{method} {path}: the server closed the keep-alive connection")
    return response.status, data, elapsed


def _describe(method: str, path: str, status: int, data: bytes) -> str:
    return f"{method} {path} answered {status}: {data[:300].decode(errors='replace')}"


def run_agent(index: int, port: int, key: str, mode: str, seconds: float, barrier: Any,
              results: Any) -> None:
    """The body of one agent process (see the module docstring)."""
    report: dict[str, Any] = {"index": index, "ids": [], "claim": [], "complete": [], "probe": [],
                              "start": None, "end": None, "cpu": 0.0, "ran_dry": False, "error": None}
    conn = None
    try:
        conn = _connect(port)
        json_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        probe_headers = {} if mode == "probe-401" else {"Authorization": f"Bearer {key}"}
        expected_probe = 401 if mode == "probe-401" else 404
        claim_body = {"ttl_seconds": TTL_SECONDS}
        barrier.wait(timeout=120)
        cpu_start = time.process_time()
        report["start"] = start = time.perf_counter()
        deadline = start + seconds
        ids, claim_times, complete_times, probe_times = (
            report["ids"], report["claim"], report["complete"], report["probe"])
        while time.perf_counter() < deadline:
            if mode == "cycle":
                status, data, took = _request(conn, "POST", "/api/claim", json_headers, claim_body)
                if status == 204:
                    report["ran_dry"] = True
                    break
                if status != 200:
                    raise UnexpectedAnswer(_describe("POST", "/api/claim", status, data))
                claim_times.append(took)
                answer = json.loads(data)
                task_id, token = answer["task"]["id"], answer["lease"]["token"]
                ids.append(task_id)
                path = f"/api/tasks/{task_id}/complete"
                status, data, took = _request(conn, "POST", path, json_headers,
                                              {"token": token, "result": RESULT})
                if status != 200:
                    raise UnexpectedAnswer(_describe("POST", path, status, data))
                complete_times.append(took)
            else:
                status, data, took = _request(conn, "GET", MISSING_TASK, probe_headers)
                if status != expected_probe:
                    raise UnexpectedAnswer(_describe("GET", MISSING_TASK, status, data))
                probe_times.append(took)
        report["cpu"] = time.process_time() - cpu_start
    except BaseException as exc:  # reported, and fails the run: a fault is never a result
        report["error"] = f"{type(exc).__name__}: {exc}"
        try:
            barrier.abort()
        except Exception:
            pass
    finally:
        report["end"] = time.perf_counter()
        if conn is not None:
            conn.close()
        results.put(report)
