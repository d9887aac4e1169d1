"""The server's log (issue 27, item 4): every 5xx reaches the output of `manage.py serve` with
its traceback, secrets scrubbed, DEBUG on or off; LOG_FORMAT=json writes one JSON object per line
with the request's id, method, path, status and duration; X-Request-ID is honoured when
well-formed, minted otherwise, and echoed in the response.

The crash is a real one: a server whose PostgreSQL cannot be reached fails every request that
touches the database (as tests/test_limits_bad_input.py provokes its internal_error 500)."""
import http.client
import json

import pytest

from tests.live_server import BoardServer, free_port, wait_until

# Production settings: DEBUG off, plain HTTP on local names.
PRODUCTION = {"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1,localhost", "SECURE_SSL_REDIRECT": "0"}
LEAKED_KEY = "tfk_leakedAgentKey0123456789"


def crashing_server(**env) -> BoardServer:
    # No pool (DATABASE_POOL=0): a refused connection fails the request at once, where the pool
    # would first wait its 5 s for a connection (the crash, not the wait, is what these test).
    return BoardServer(f"postgres://postgres@127.0.0.1:{free_port()}/nothing",
                       env={**PRODUCTION, "DATABASE_POOL": "0", **env}, args=["--workers", "1"]).start()


def get(server: BoardServer, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {LEAKED_KEY}", **(headers or {})})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("debug", ["0", "1"])
def test_a_crash_is_logged_with_its_traceback_and_no_secret_debug_on_or_off(debug):
    server = crashing_server(DEBUG=debug)
    try:
        # The agent key is in the Authorization header AND in the path, which the log names.
        status, _, data = get(server, f"/api/tasks/{LEAKED_KEY}?token=lease-token-value-42")
        assert status == 500, data[:300]
        log = server.log_tail(10**7)
        assert "Traceback (most recent call last)" in log, log[-2000:]
        assert "OperationalError" in log and "Internal Server Error: /api/tasks/tfk_********" in log
        assert LEAKED_KEY not in log and "lease-token-value-42" not in log
        # A line break in the URL never starts a line of its own (a forged log line).
        status, _, _ = get(server, "/api/tasks/x%0A2026-01-01T00:00:00.000Z%20ERROR%20forged")
        assert status == 500
        log = server.log_tail(10**7)
        assert "x\\n2026-01-01" in log
        assert not [line for line in log.splitlines() if line.startswith("2026-01-01T00:00:00.000Z ERROR forged")]
    finally:
        server.close()


def json_lines(log: str) -> list[dict]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def test_log_format_json_writes_one_object_per_line_with_the_requests_fields():
    server = crashing_server(LOG_FORMAT="json")
    try:
        status, headers, _ = get(server, f"/api/tasks/{LEAKED_KEY}", {"X-Request-ID": "probe-4.2_a"})
        assert status == 500
        assert headers.get("x-request-id") == "probe-4.2_a"
        # Every line but serve's banner (its stdout, between two rules of "=") is one JSON object:
        # the traceback is inside one, never loose. The banner may reach the file after the
        # server answers (its stdout is a file, block-buffered): wait for its second rule.
        wait_until(lambda: server.log_tail(10**7).count("=" * 20 + "\n") >= 2, 15, "serve's banner")
        log = server.log_tail(10**7)
        lines = log.splitlines()
        rules = [i for i, line in enumerate(lines) if line.startswith("=" * 20)]
        assert len(rules) == 2, log[:3000]
        loose = [line for line in lines[:rules[0]] + lines[rules[1] + 1:] if not line.startswith("{")]
        assert loose == [], loose[:20]
        mine = [line for line in json_lines(log) if line.get("request_id") == "probe-4.2_a"]
        # Once: the API's reshaped 500 (board/api/middleware.py) is the same answer, not another.
        [crash] = mine
        assert crash["level"] == "ERROR" and crash["logger"] == "django.request"
        assert crash["method"] == "GET" and crash["path"] == "/api/tasks/tfk_********"
        assert crash["status"] == 500 and crash["duration_ms"] >= 0
        assert crash["time"].endswith("Z") and "T" in crash["time"]
        assert "Traceback (most recent call last)" in crash["traceback"] and "OperationalError" in crash["traceback"]
        assert LEAKED_KEY not in log
    finally:
        server.close()


def test_a_request_id_is_minted_when_absent_or_malformed_and_echoed():
    server = crashing_server(LOG_FORMAT="json")
    try:
        minted = []
        for sent in (None, "has spaces in it", "x" * 65, LEAKED_KEY):
            status, headers, _ = get(server, "/api/tasks/t1", {"X-Request-ID": sent} if sent else {})
            assert status == 500
            echoed = headers.get("x-request-id", "")
            assert echoed and echoed != sent and len(echoed) == 32, echoed
            minted.append(echoed)
        assert len(set(minted)) == 4
        logged = {line.get("request_id") for line in json_lines(server.log_tail(10**7))}
        assert set(minted) <= logged
        assert LEAKED_KEY not in server.log_tail(10**7)
    finally:
        server.close()


def test_with_the_access_log_on_json_has_a_line_per_request_too():
    server = crashing_server(LOG_FORMAT="json", TASKFLOW_ACCESS_LOG="1")
    try:
        status, _, _ = get(server, f"/api/tasks/{LEAKED_KEY}?token=lease-token-value-42")
        assert status == 500
        access = [line for line in json_lines(server.log_tail(10**7)) if line["logger"] == "uvicorn.access"
                  and line["path"].startswith("/api/tasks/")]
        assert len(access) == 1, access
        [line] = access
        assert line["method"] == "GET" and line["status"] == 500 and line["level"] == "INFO"
        assert line["path"] == "/api/tasks/tfk_********?token=********", line
        assert LEAKED_KEY not in server.log_tail(10**7) and "lease-token-value-42" not in server.log_tail(10**7)
    finally:
        server.close()
