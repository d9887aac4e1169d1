"""The health endpoint and the supervised reaper (issue 9, item 15), against real servers started
as `make run` starts them (`manage.py serve`, with its reaper unless a test says otherwise).

/healthz is what a load balancer polls: 200 when the database answers, a reaper has finished a
pass recently and (when configured) Redis answers; 503 otherwise, with the failing part named.
"""
import http.client
import json
import os
import signal
import socket
import sys
import threading

import pytest
from django.db import connections

from board.engine import transitions
from board.models import ReaperPass
from tests.live_server import BoardServer, free_port, wait_until
from tests.support import (
    database_url,
    expire_lease,
    postgres_db_mark,
    row,
    sqlite_db_mark,
)

pytestmark = sqlite_db_mark()


def healthz(server: BoardServer) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        body = response.read()
        assert response.getheader("Content-Type", "").startswith("application/json"), body[:200]
        return response.status, json.loads(body)
    finally:
        conn.close()


def healthz_when(server: BoardServer, condition, what: str, timeout: float = 30) -> dict:
    """Poll /healthz until `condition(status, body)` holds; return that body."""
    def answer():
        status, body = healthz(server)
        return body if condition(status, body) else None
    return wait_until(answer, timeout, what)


def reaper_pid(body: dict) -> int | None:
    return body["checks"]["reaper"].get("pid")


def serve_with_reaper(alias: str = "default", **env) -> BoardServer:
    """`manage.py serve` with its reaper (passes every 0.2 s), as `make run` runs it."""
    url = database_url(connections[alias].settings_dict)
    command = [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", "{port}",
               "--workers", "1"]
    return BoardServer(url, env={"TASKFLOW_REAP_INTERVAL": "0.2", **env}, command=command).start()


def test_healthz_reports_the_database_and_the_reapers_last_pass():
    server = serve_with_reaper()
    try:
        body = healthz_when(server, lambda status, _: status == 200, "a healthy answer once the reaper has passed")
        assert body["status"] == "ok"
        assert body["checks"]["database"] == {"ok": True}
        reaper = body["checks"]["reaper"]
        assert reaper["ok"] is True and 0 <= reaper["last_pass_age_seconds"] < 10
        assert reaper["pid"] > 0 and reaper["passes"] >= 1
        assert "redis" not in body["checks"]  # not configured
    finally:
        server.close()


def test_a_dead_reaper_is_restarted_and_still_takes_back_expired_leases():
    server = serve_with_reaper()
    try:
        first = reaper_pid(healthz_when(server, lambda status, _: status == 200, "the reaper's first pass"))
        os.kill(first, signal.SIGKILL)
        healthz_when(server, lambda status, body: status == 200 and reaper_pid(body) != first,
                     "a new reaper process passing")
        # ...and it works: a lease that expires now comes back.
        [task] = transitions.create(transitions.TaskSpec(title="after the restart"))
        claim = transitions.claim(task.id, "agent-1", ttl_seconds=60)
        expire_lease(claim.task.id)
        wait_until(lambda: row(task.id)["stage"] == "QUEUED", 30, "the expired lease reclaimed")
        assert "reaper exited" in server.log_tail()
    finally:
        server.close()


def test_no_reaper_pass_is_unhealthy():
    """A server whose reaper never ran (none anywhere: `--no-reaper` and no `reap --loop`)."""
    ReaperPass.objects.all().delete()
    server = BoardServer(database_url(connections["default"].settings_dict), args=["--workers", "1"]).start()
    try:
        status, body = healthz(server)
        assert status == 503 and body["status"] == "fail"
        assert body["checks"]["database"] == {"ok": True}
        assert body["checks"]["reaper"]["ok"] is False
        assert "no reaper" in body["checks"]["reaper"]["error"]
    finally:
        server.close()


def test_a_stale_reaper_pass_is_unhealthy():
    """The last pass is older than TASKFLOW_REAPER_STALE_SECONDS: the reaper is stuck (stopped
    here with SIGSTOP, so that its supervisor does not replace it)."""
    server = serve_with_reaper(TASKFLOW_REAPER_STALE_SECONDS="3")
    try:
        pid = reaper_pid(healthz_when(server, lambda status, _: status == 200, "a first healthy answer"))
        os.kill(pid, signal.SIGSTOP)
        try:
            body = healthz_when(server, lambda status, _: status == 503, "the stuck reaper reported")
            assert body["status"] == "fail" and body["checks"]["database"] == {"ok": True}
            assert body["checks"]["reaper"]["ok"] is False
            assert body["checks"]["reaper"]["last_pass_age_seconds"] >= 3
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: healthz(server)[0] == 200, 30, "healthy again once the reaper runs")
    finally:
        server.close()


class SilentPort:
    """A TCP port that accepts connections and never answers (a hung Redis)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(50)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.parametrize("redis", ["refusing", "hung"])
def test_a_configured_redis_that_does_not_answer_is_unhealthy(redis):
    silent = SilentPort() if redis == "hung" else None
    port = silent.port if silent else free_port()
    server = serve_with_reaper(REDIS_URL=f"redis://127.0.0.1:{port}/0")
    try:
        body = healthz_when(server, lambda _, body: body["checks"]["reaper"]["ok"], "the reaper's first pass")
        assert healthz(server)[0] == 503 and body["status"] == "fail"
        assert body["checks"]["redis"]["ok"] is False and body["checks"]["redis"]["error"]
        assert body["checks"]["database"] == {"ok": True}
    finally:
        server.close()
        if silent:
            silent.close()


@pytest.mark.redis
def test_a_configured_redis_that_answers_is_healthy():
    from django.conf import settings
    server = serve_with_reaper(REDIS_URL=settings.REDIS_TEST_URL)
    try:
        body = healthz_when(server, lambda status, _: status == 200, "healthy")
        assert body["checks"]["redis"] == {"ok": True}
    finally:
        server.close()


def test_an_unreachable_database_is_unhealthy():
    """PostgreSQL at a port where nothing listens (no PostgreSQL server needed): /healthz still
    answers, in the JSON shape, 503 naming the database."""
    server = BoardServer(f"postgres://postgres@127.0.0.1:{free_port()}/nothing", args=["--workers", "1"]).start()
    try:
        status, body = healthz(server)
        assert status == 503 and body["status"] == "fail"
        assert body["checks"]["database"]["ok"] is False and body["checks"]["database"]["error"]
    finally:
        server.close()


def on_postgres(test):
    for mark in postgres_db_mark():
        test = mark(test)
    return test


@on_postgres
def test_healthz_on_postgresql():
    server = serve_with_reaper("postgres")
    try:
        body = healthz_when(server, lambda status, _: status == 200, "healthy")
        assert body["checks"]["reaper"]["ok"] is True
    finally:
        server.close()
