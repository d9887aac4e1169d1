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
import time

import pytest
from django.db import connections

from board import agent_keys
from board.engine import transitions
from board.models import ReaperPass
from tests.live_server import BoardServer, api_call, free_port, wait_until
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


# ---------------------------------------------------------------------------------------------
# Issue 27, item 2: /healthz must never hold the threads that serve the agents.


def loop_on_healthz(server: BoardServer, clients: int, stop: threading.Event) -> list:
    """`clients` threads, released together, each GETting /healthz in a loop until `stop`;
    returns the list they append their statuses to."""
    statuses: list = []
    barrier = threading.Barrier(clients)

    def poll():
        barrier.wait(timeout=30)
        while not stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            try:
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                statuses.append(response.status)
            except OSError:
                statuses.append(None)
            finally:
                conn.close()

    for _ in range(clients):
        threading.Thread(target=poll, daemon=True).start()
    return statuses


def agent_get_latencies(server: BoardServer, key: str, task_id: str, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        status, body = api_call(server, "GET", f"/api/tasks/{task_id}", key)
        latencies.append(time.perf_counter() - started)
        assert status == 200 and body["id"] == task_id, body
    return latencies


@on_postgres
@pytest.mark.timing
@pytest.mark.parametrize("clients", [12, 40])
def test_healthz_polled_hard_while_redis_hangs_does_not_slow_an_agent(clients):
    """A Redis that accepts and never answers, 12 or 40 clients looping on /healthz, one agent
    reading a task: the agent's GET stays far below the 0.5 s Redis timeout (the issue saw
    1.1-1.6 s with 12 clients, 4.6-4.9 s with 40)."""
    silent = SilentPort()
    [task] = transitions.create(transitions.TaskSpec(title="read me"), using="postgres")
    key = agent_keys.create_key("reader", using="postgres")[1]
    server = serve_with_reaper("postgres", REDIS_URL=f"redis://127.0.0.1:{silent.port}/0")
    stop = threading.Event()
    try:
        healthz_when(server, lambda _, body: body["checks"]["reaper"]["ok"], "the reaper's first pass")
        statuses = loop_on_healthz(server, clients, stop)
        wait_until(lambda: len(statuses) >= clients, 30, "every client's first answer")
        latencies = sorted(agent_get_latencies(server, key, task.id, 20))
        median, p90, worst = latencies[10], latencies[17], latencies[-1]
        figures = f"agent GET median {median * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, worst {worst * 1000:.1f} ms"
        print(f"{clients} clients on /healthz: {figures}")
        # The probes still cost CPU (a Django request each) on a shared 2-core machine: the bound
        # is on the median and p90, far below the 0.5 s a probe used to hold a thread for. With 40
        # clients the median is 80-92 ms alone on this machine kind (before and after session 16)
        # and passed 0.1 s beside another test's worker: 0.15 s keeps it far below the regression.
        assert median < 0.15 and p90 < 0.3, figures
        # ...and every probe still said what is wrong: Redis does not answer.
        assert set(statuses) == {503}, set(statuses)
    finally:
        stop.set()
        server.close()
        silent.close()


class PausableRelay:
    """A TCP relay to a real server that can stop passing bytes: a database that stops answering
    (a network partition) without closing anything."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.flowing = threading.Event()
        self.flowing.set()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(50)
        self.port = self.sock.getsockname()[1]
        self.open: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source, sink):
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.flowing.set()
        self.sock.close()
        for conn in self.open:
            conn.close()


def timed_healthz(server: BoardServer) -> tuple[float, int, dict]:
    started = time.perf_counter()
    status, body = healthz(server)
    return time.perf_counter() - started, status, body


@on_postgres
@pytest.mark.timing
def test_a_database_that_stops_answering_is_reported_within_about_a_second_and_never_holds_the_probe():
    """The answers come from checks run beside the requests; a result older than 1 s is never
    served as current: once PostgreSQL stops answering, /healthz says so (503, the database
    unknown) within about a second of the last check that passed, and answers at once."""
    settings_dict = connections["postgres"].settings_dict
    relay = PausableRelay(settings_dict["HOST"] or "127.0.0.1", int(settings_dict["PORT"] or 5432))
    url = database_url(settings_dict).replace(f":{settings_dict['PORT'] or 5432}/", f":{relay.port}/")
    server = serve_with_reaper("postgres", DATABASE_URL=url)
    try:
        healthz_when(server, lambda status, _: status == 200, "healthy through the relay")
        relay.flowing.clear()
        paused_at = time.monotonic()
        while True:
            took, status, body = timed_healthz(server)
            assert took < 0.3, f"/healthz took {took:.3f} s while the database hangs"
            if status == 503:
                break
            assert time.monotonic() - paused_at < 5, "still healthy 5 s after the database stopped answering"
            time.sleep(0.05)  # a probe's pace; the condition is bounded above
        assert body["checks"]["database"]["ok"] is False, body
        assert "unknown" in body["checks"]["database"]["error"], body
        assert time.monotonic() - paused_at < 2.5
        relay.flowing.set()
        body = healthz_when(server, lambda status, _: status == 200, "healthy again once the database answers")
        assert 0 <= body["checked_seconds_ago"] <= 1.0, body  # how fresh the answer is
    finally:
        relay.flowing.set()
        server.close()
        relay.close()


def test_a_checker_pauses_without_probes_and_a_probe_restarts_it_with_a_fresh_result(monkeypatch):
    """The checks run only while probes come (IDLE_AFTER_SECONDS, shortened here); the probe
    that finds them paused waits (bounded) for a result made after it arrived."""
    from board import health

    monkeypatch.setattr(health, "IDLE_AFTER_SECONDS", 0.3)
    runs = []

    def check():
        runs.append(time.monotonic())
        return {"probe": {"ok": True, "run": len(runs)}}

    checker = health.Checker("test", check, ("probe",))
    checker.ask(time.monotonic())
    results, age = checker.results(time.monotonic())
    assert results["probe"]["ok"] is True and age <= health.MAX_AGE_SECONDS
    wait_until(lambda: not checker.wake.is_set(), 10, "the checker pausing without probes")
    paused_after = len(runs)
    asked = time.monotonic()
    checker.ask(asked)
    results, _ = checker.results(asked)
    assert results["probe"]["run"] > paused_after and runs[results["probe"]["run"] - 1] >= asked
