"""One HTTP agent process of bench/http_claims.py and bench/idle_agents.py (standard library
only, so that a spawned process starts fast and measures nothing but the client side of HTTP).

An agent opens ONE keep-alive ``http.client.HTTPConnection`` to the server, waits at the
barrier with its siblings, then loops for a fixed time:

- ``cycle``: ``POST /api/claim {"ttl_seconds": 60}`` then
  ``POST /api/tasks/{id}/complete {"token": ..., "result": {"ok": true}}``;
- ``next``: complete-and-claim-next, one request per task: a first ``POST /api/claim``, then
  ``POST /api/tasks/{id}/complete {"token", "result", "next": {"ttl_seconds": 60}}`` whose answer
  holds the next lease (a plain claim again when ``next`` is null); once the time is up, the
  last complete carries no ``next`` (the agent ends holding nothing);
- ``batch``: ``POST /api/claim {"ttl_seconds": 60, "max_tasks": BATCH}`` then one
  ``POST /api/complete {"items": [{"id", "token", "result"}, ...]}`` for the batch (every item
  must come back ``ok``);
- ``probe-401``: ``GET /api/tasks/does-not-exist`` without a key (the API answers 401 before
  any database work);
- ``probe-404``: the same with the agent's key (401-free: one AgentKey lookup by its hash,
  one task lookup by primary key, then 404);
- ``probe-bare``: ``GET /api/bare`` (``BARE_PATH``) without a key, expecting 200: the bare Django
  JSON view of bench/bare_urls.py (no database), served by a server running
  ``bench.bare_settings`` (the baseline of the serving stack).

It times every request (send to last byte of the body read) and puts one dict on the result
queue: the claimed task ids, the tasks it completed (``done``), the latencies per kind of request, its start and end times
(``time.perf_counter``, CLOCK_MONOTONIC on Linux, so comparable across processes), whether it
ran out of work, the CPU time it used in the loop, and the error that stopped it, if any.

``run_idle_process`` is something else: one process of bench/idle_agents.py's idle agents, a
number of threads that each loop a *waiting* claim (``wait_seconds``) on a queue that never gets
work, each on its own keep-alive connection, until told to stop (see its docstring).
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from typing import Any

TTL_SECONDS = 60
RESULT = {"ok": True}
BATCH = 10  # tasks per batch claim and batch complete in the ``batch`` mode
CYCLE_MODES = ("cycle", "next", "batch")  # the modes that claim and complete tasks
MISSING_TASK = "/api/tasks/does-not-exist"
# bench/bare_urls.py routes it to the bare view. Under /api/, so that the baseline goes through
# exactly the middleware work an API request does (the latency histogram, the API's error shape,
# no messages: board/api/middleware.py), not more and not less.
BARE_PATH = "/api/bare"


class UnexpectedAnswer(Exception):
    pass


def _connect(port: int, timeout: float = 30) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
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
    report: dict[str, Any] = {"index": index, "ids": [], "claim": [], "complete": [], "probe": [], "done": 0,
                              "start": None, "end": None, "cpu": 0.0, "ran_dry": False, "error": None}
    conn = None
    try:
        conn = _connect(port)
        json_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        probe_headers = {} if mode in ("probe-401", "probe-bare") else {"Authorization": f"Bearer {key}"}
        expected_probe = {"probe-401": 401, "probe-404": 404, "probe-bare": 200}.get(mode)
        if mode not in CYCLE_MODES and expected_probe is None:
            raise ValueError(f"unknown agent mode {mode!r}")
        probe_path = BARE_PATH if mode == "probe-bare" else MISSING_TASK
        barrier.wait(timeout=120)
        cpu_start = time.process_time()
        report["start"] = start = time.perf_counter()
        deadline = start + seconds
        if mode == "cycle":
            _claim_then_complete(conn, json_headers, deadline, report)
        elif mode == "next":
            _complete_and_claim_next(conn, json_headers, deadline, report)
        elif mode == "batch":
            _batches(conn, json_headers, deadline, report)
        else:
            probe_times = report["probe"]
            while time.perf_counter() < deadline:
                status, data, took = _request(conn, "GET", probe_path, probe_headers)
                if status != expected_probe:
                    raise UnexpectedAnswer(_describe("GET", probe_path, status, data))
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


def _claim(conn: http.client.HTTPConnection, headers: dict, body: dict, report: dict) -> dict | None:
    """POST /api/claim: the answer, or None (ran dry) on 204."""
    status, data, took = _request(conn, "POST", "/api/claim", headers, body)
    if status == 204:
        report["ran_dry"] = True
        return None
    if status != 200:
        raise UnexpectedAnswer(_describe("POST", "/api/claim", status, data))
    report["claim"].append(took)
    return json.loads(data)


def _claim_then_complete(conn, headers: dict, deadline: float, report: dict) -> None:
    """(a) Two requests per task: claim, then complete."""
    claim_body = {"ttl_seconds": TTL_SECONDS}
    while time.perf_counter() < deadline:
        answer = _claim(conn, headers, claim_body, report)
        if answer is None:
            break
        task_id, token = answer["task"]["id"], answer["lease"]["token"]
        report["ids"].append(task_id)
        path = f"/api/tasks/{task_id}/complete"
        status, data, took = _request(conn, "POST", path, headers, {"token": token, "result": RESULT})
        if status != 200:
            raise UnexpectedAnswer(_describe("POST", path, status, data))
        report["complete"].append(took)
        report["done"] += 1


def _complete_and_claim_next(conn, headers: dict, deadline: float, report: dict) -> None:
    """(b) One request per task: each complete claims the next task."""
    claim_body = {"ttl_seconds": TTL_SECONDS}
    held = _claim(conn, headers, claim_body, report)
    while held is not None:
        task_id, token = held["task"]["id"], held["lease"]["token"]
        report["ids"].append(task_id)
        body: dict[str, Any] = {"token": token, "result": RESULT}
        more = time.perf_counter() < deadline
        if more:
            body["next"] = {"ttl_seconds": TTL_SECONDS}
        path = f"/api/tasks/{task_id}/complete"
        status, data, took = _request(conn, "POST", path, headers, body)
        if status != 200:
            raise UnexpectedAnswer(_describe("POST", path, status, data))
        report["complete"].append(took)
        report["done"] += 1
        if not more:
            return
        answer = json.loads(data)
        if answer.get("stage") != "COMPLETED" or "next" not in answer:
            raise UnexpectedAnswer(f"POST {path} with next answered without the outcome and next: "
                                   f"{data[:300].decode(errors='replace')}")
        held = answer["next"]
        if held is None:  # nothing was ready then: claim as usual (ran dry when still none)
            held = _claim(conn, headers, claim_body, report)


def _batches(conn, headers: dict, deadline: float, report: dict) -> None:
    """(c) Claim BATCH, complete them in one request."""
    claim_body = {"ttl_seconds": TTL_SECONDS, "max_tasks": BATCH}
    while time.perf_counter() < deadline:
        answer = _claim(conn, headers, claim_body, report)
        if answer is None:
            break
        leases = answer["leases"]
        if not 1 <= len(leases) <= BATCH:
            raise UnexpectedAnswer(f"a batch claim of {BATCH} answered {len(leases)} leases")
        items = [{"id": held["task"]["id"], "token": held["lease"]["token"], "result": RESULT} for held in leases]
        report["ids"] += [item["id"] for item in items]
        status, data, took = _request(conn, "POST", "/api/complete", headers, {"items": items})
        if status != 200:
            raise UnexpectedAnswer(_describe("POST", "/api/complete", status, data))
        outcomes = json.loads(data)["items"]
        refused = [item for item in outcomes if not item.get("ok")]
        if refused or [item["id"] for item in outcomes] != [item["id"] for item in items]:
            raise UnexpectedAnswer(f"POST /api/complete: {len(refused)} of {len(items)} refused, "
                                   f"e.g. {json.dumps(refused[:1])[:300]}")
        report["complete"].append(took)
        report["done"] += len(items)


# ---------------------------------------------------------------------------------------------
# Idle agents (bench/idle_agents.py)


def _idle_thread(port: int, headers: dict, payload: bytes, wait_seconds: float, stop: Any,
                 in_flight: Any, tally: dict) -> None:
    """One idle agent: its own keep-alive connection, waiting claims in a loop until `stop`."""
    conn = None
    try:
        conn = _connect(port, timeout=wait_seconds + 30)
        while not stop.is_set():
            started = time.perf_counter()
            conn.request("POST", "/api/claim", body=payload, headers=headers)
            with in_flight.get_lock():
                in_flight.value += 1
            try:
                response = conn.getresponse()
                data = response.read()
            finally:
                with in_flight.get_lock():
                    in_flight.value -= 1
            took = time.perf_counter() - started
            status = response.status
            tally["statuses"][status] += 1
            low, high = tally["seconds"].get(status, (took, took))
            tally["seconds"][status] = (min(low, took), max(high, took))
            if status == 200:  # work from a queue that has none: reported as a failure
                tally["ids"].append(json.loads(data)["task"]["id"])
            elif status != 204 and len(tally["answers"]) < 5:
                tally["answers"].append(_describe("POST", "/api/claim", status, data))
            if response.will_close:
                raise UnexpectedAnswer(f"the server closed the keep-alive connection after a {status}")
            if status == 503:  # the server's cap on waiting claims: back off as it asks
                stop.wait(float(response.getheader("Retry-After") or 1))
    except BaseException as exc:  # a connection error is a failure of the run, never a result
        tally["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        if conn is not None:
            conn.close()


def run_idle_process(index: int, port: int, key: str, threads: int, queue: str, wait_seconds: float,
                     stop: Any, in_flight: Any, results: Any) -> None:
    """One process of idle agents (bench/idle_agents.py): `threads` threads, each with its own
    keep-alive connection, looping ``POST /api/claim {"ttl_seconds": 60, "queue": queue,
    "wait_seconds": wait_seconds}`` until `stop` (a multiprocessing Event) is set; the request
    then in flight runs to its end (up to `wait_seconds`). `in_flight` (a multiprocessing Value
    shared by all the idle processes) counts the requests sent and not yet answered. After a 503
    a thread waits the Retry-After it was given before asking again.

    Puts one report on `results`: ``statuses`` (status -> answers), ``seconds`` (status ->
    (fastest, slowest) answer), ``ids`` (tasks claimed: there must be none), ``answers`` (the
    first few unexpected answers), ``errors`` (connection errors and the like; each fails the
    run) and ``stuck`` (threads still running when the report was made)."""
    payload = json.dumps({"ttl_seconds": TTL_SECONDS, "queue": queue, "wait_seconds": wait_seconds},
                         separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    tallies = [{"statuses": Counter(), "seconds": {}, "ids": [], "answers": [], "errors": []}
               for _ in range(threads)]
    workers = [threading.Thread(target=_idle_thread, daemon=True,
                                args=(port, headers, payload, wait_seconds, stop, in_flight, tally))
               for tally in tallies]
    for worker in workers:
        worker.start()
    stop.wait()
    deadline = time.monotonic() + wait_seconds + 60
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
    report: dict[str, Any] = {"index": index, "statuses": Counter(), "seconds": {}, "ids": [],
                              "answers": [], "errors": [],
                              "stuck": sum(1 for worker in workers if worker.is_alive())}
    for tally in tallies:
        report["statuses"].update(tally["statuses"])
        for status, (low, high) in tally["seconds"].items():
            old_low, old_high = report["seconds"].get(status, (low, high))
            report["seconds"][status] = (min(low, old_low), max(high, old_high))
        for name in ("ids", "answers", "errors"):
            report[name] += tally[name]
    results.put(report)
