"""/metrics (board/metrics.py) against the real server: `manage.py serve` with two worker
processes and PROMETHEUS_MULTIPROC_DIR, as a deployment runs it, the reaper a process of its own
on the same directory. A scripted run of agents over HTTP, then one scrape shows exact counter
values, summed over every process (the reaper's reclaim is counted in the server's scrape), and
the gauges read from the database. Who may scrape: the scraper's token, an operator key, a
staff session with board.view_task; 401 / 403 for everyone else. Parsed with
prometheus_client.parser, never regexes."""
from __future__ import annotations

import http.client
import json
import os
import secrets
import subprocess
import sys
import threading

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from board import agent_keys
from board.engine import flow, transitions
from board.models import Task, TaskEvent
from tests.live_server import (
    ROOT,
    BoardServer,
    api_call,
    server_env,
    server_for_sessions,
    wait_until,
)
from tests.support import database_url, expire_lease, postgres_db_mark, sqlite_db_mark
from tests.test_live_board import BoardSocket, staff_session

pytestmark = sqlite_db_mark()


def on_postgres(test):
    """The test runs on the PostgreSQL alias too (its marks on top of the module's)."""
    for mark in postgres_db_mark():
        test = mark(test)
    return test


TOKEN = "scraper-" + secrets.token_urlsafe(24)
PG = "postgres"
WAIT = 60


def get(server: BoardServer, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def call(server: BoardServer, method: str, path: str, key: str, body=None) -> tuple[int, dict | None]:
    return api_call(server, method, path, key, body, timeout=WAIT)


def scrape(server: BoardServer, headers: dict | None = None) -> dict:
    """{(sample name, frozenset of its labels): value} of one scrape."""
    status, head, body = get(server, "/metrics", headers or {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body
    assert head["content-type"].startswith("text/plain; version=")  # the exposition format
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(body.decode()) for sample in family.samples}


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def labelled(samples: dict, name: str) -> dict:
    """{frozenset(labels): value} of one sample name."""
    return {labels: v for (sample, labels), v in samples.items() if sample == name}


def metrics_server(alias: str, directory) -> BoardServer:
    return server_for_sessions(alias, env={"PROMETHEUS_MULTIPROC_DIR": str(directory), "TASKFLOW_METRICS_TOKEN": TOKEN},
                               args=["--workers", "2"])


def reap_once(alias: str, secret_key: str, directory) -> str:
    """One reaper pass (`manage.py reap`) as a process of its own, on the server's metrics
    directory, as `serve` starts it."""
    env = server_env(database_url(connections[alias].settings_dict), secret_key,
                     PROMETHEUS_MULTIPROC_DIR=str(directory))
    done = subprocess.run([sys.executable, "manage.py", "reap"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def waiting_on_a_row_lock(alias: str) -> bool:
    """Another backend of this test database waits for a row lock (the server's CAS)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0] > 0


def test_a_server_of_one_process_counts_what_it_does(django_db_setup, django_db_blocker, tmp_path):
    # `serve --workers 1` (the default on a one-core machine): the process that serves must
    # write its counts where the scrape adds them up, as every worker of several does. It did
    # not: serve named the metrics directory after Django (and so prometheus_client) was loaded,
    # and ran its one worker in that process, whose counts stayed in memory, never scraped.
    with django_db_blocker.unblock():
        server = server_for_sessions("default", env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
                                                     "TASKFLOW_METRICS_TOKEN": TOKEN},
                                     args=["--workers", "1"])
        try:
            _, key = agent_keys.create_key("one-process")
            assert call(server, "POST", "/api/tasks", key, {"id": "one", "title": "one"})[0] == 201
            samples = scrape(server)
        finally:
            server.close()
    created = {tuple(sorted(labels)): v for labels, v in labelled(samples, "taskflow_transitions_total").items()}
    assert created == {(("code", ""), ("outcome", "won"), ("verb", "create")): 1}, created
    assert value(samples, "taskflow_api_request_duration_seconds_count", method="POST", route="/api/tasks") == 1


# ---------------------------------------------------------------------------------------------
# The scripted run: exact counts, summed over the workers and the reaper


@pytest.fixture
def pg_metrics_server(django_db_setup, django_db_blocker, tmp_path):
    # Its tests carry the postgres marker: conftest reports a missing server (and fails in CI).
    with django_db_blocker.unblock():
        server = metrics_server(PG, tmp_path)
    try:
        yield server, tmp_path
    finally:
        server.close()


@on_postgres
def test_a_scripted_run_shows_exact_counts_from_every_process(pg_metrics_server):
    server, directory = pg_metrics_server
    _, key = agent_keys.create_key("m-agent", using=PG)
    _, other = agent_keys.create_key("m-other", using=PG)
    ids = [f"m{i}" for i in range(1, 7)]
    status, created = call(server, "POST", "/api/tasks", key, [{"id": i, "title": i, "queue": "mq"} for i in ids])
    assert status == 201, created

    claims = []
    for _ in range(4):
        status, answer = call(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "mq"})
        assert status == 200, answer
        claims.append((answer["task"]["id"], answer["lease"]["token"]))
    assert {task for task, _ in claims} <= set(ids[:4])
    (done1, tok1), (done2, tok2), (failed, tok3), (expired, _) = claims
    for task, token in ((done1, tok1), (done2, tok2)):
        assert call(server, "POST", f"/api/tasks/{task}/complete", key, {"token": token, "result": {}})[0] == 200
    status, answer = call(server, "POST", f"/api/tasks/{failed}/fail", key, {"token": tok3, "error": "flaky"})
    assert status == 200 and answer["stage"] == "QUEUED", answer  # retried, behind its backoff
    status, answer = call(server, "POST", f"/api/tasks/{expired}/complete", key, {"token": "wrong", "result": {}})
    assert status == 409 and answer["error"]["code"] == "lease_lost", answer

    # A lease expires (its row written into the past) and the reaper, another process, takes it back.
    expire_lease(expired, using=PG)
    assert reap_once(PG, server.secret_key, directory).split("\n")[0] == f"reclaimed {expired} -> QUEUED"

    # A takeover: m5's lease expires and another agent claims the task.
    status, answer = call(server, "POST", "/api/tasks/m5/claim", key, {"ttl_seconds": 60})
    assert status == 200, answer
    expire_lease("m5", using=PG)
    status, answer = call(server, "POST", "/api/tasks/m5/claim", other, {"ttl_seconds": 60})
    assert status == 200 and answer["lease"]["fence"] == 2, answer
    status, answer = call(server, "POST", "/api/tasks/m5/fail", other,
                          {"token": answer["lease"]["token"], "error": "bad input", "retryable": False})
    assert status == 200 and answer["stage"] == "FAILED", answer

    assert call(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "empty"})[0] == 204

    # A lost race, made certain: this test holds m6's row lock while the server's claim reads
    # m6 QUEUED and blocks in its compare-and-swap; a rival claims m6 and commits; the server's
    # CAS then matches no row, it re-reads and is refused (taken).
    answers = []
    with transaction.atomic(using=PG):
        Task.objects.using(PG).select_for_update().get(pk="m6")
        racer = threading.Thread(target=lambda: answers.append(
            call(server, "POST", "/api/tasks/m6/claim", key, {"ttl_seconds": 60})))
        racer.start()
        wait_until(lambda: waiting_on_a_row_lock(PG), WAIT, "the server's claim waits for m6's row lock")
        transitions.claim("m6", "rival", 60, using=PG)  # in this process: not the server's count
    racer.join(WAIT)
    assert answers[0][0] == 409 and answers[0][1]["error"]["code"] == "taken", answers

    samples = scrape(server)
    transitions_total = {tuple(sorted(labels)): v for labels, v in labelled(samples, "taskflow_transitions_total").items()}

    def key_of(verb, outcome, code=""):
        return (("code", code), ("outcome", outcome), ("verb", verb))

    assert transitions_total == {
        key_of("create", "won"): 6,
        key_of("claim", "won"): 6,  # 4 claim_next, m5's claim and its takeover
        key_of("complete", "won"): 2,
        key_of("fail", "won"): 2,
        key_of("retry", "won"): 1,
        key_of("reclaim", "won"): 2,  # the reaper's and the takeover's
        key_of("complete", "refused", "lease_lost"): 1,
        key_of("claim", "lost_race"): 1,
        key_of("claim", "refused", "taken"): 1,
    }
    # Every move counted is a history row the server's processes wrote (the rival's is this test's).
    events = TaskEvent.objects.using(PG).exclude(actor="rival")
    for verb in ("create", "claim", "complete", "fail", "retry", "reclaim"):
        assert transitions_total[key_of(verb, "won")] == events.filter(verb=verb).count(), verb

    assert value(samples, "taskflow_claims_total") == 6
    assert value(samples, "taskflow_claim_next_empty_total") == 1
    assert labelled(samples, "taskflow_lease_expiries_total") == {
        frozenset({("by", "reaper")}): 1, frozenset({("by", "claim")}): 1}
    assert value(samples, "taskflow_reclaims_total") == 2
    assert value(samples, "taskflow_takeovers_total") == 1
    assert value(samples, "taskflow_retries_total") == 1
    assert labelled(samples, "taskflow_terminal_failures_total") == {
        frozenset({("reason", "not_retryable")}): 1, frozenset({("reason", "attempts_spent")}): 0,
        frozenset({("reason", "lease_expired")}): 0, frozenset({("reason", "deadline")}): 0}

    # The latency histogram by route, never by raw path: 3 completes (one refused), 5 claim_next.
    count = "taskflow_api_request_duration_seconds_count"
    assert value(samples, count, method="POST", route="/api/tasks/<task_id>/complete") == 3
    assert value(samples, count, method="POST", route="/api/claim") == 5
    assert value(samples, count, method="POST", route="/api/tasks/<task_id>/claim") == 3
    assert not any("m1" in dict(labels).get("route", "") for labels in labelled(samples, count))

    # Gauges read at scrape time.
    stages = {dict(labels)["stage"]: v for labels, v in labelled(samples, "taskflow_tasks").items()
              if dict(labels)["queue"] == "mq"}
    assert stages == {"PENDING": 0, "QUEUED": 2, "RUNNING": 1, "PAUSED": 0, "COMPLETED": 2, "FAILED": 1,
                      "CANCELLED": 0}
    assert value(samples, "taskflow_live_leases") == 1  # the rival's
    oldest = Task.objects.using(PG).filter(stage="QUEUED").order_by("stage_changed_at").first()
    age = value(samples, "taskflow_oldest_queued_age_seconds", queue="mq")
    assert 0 <= age <= (timezone.now() - oldest.stage_changed_at).total_seconds()
    # The last hour's waits (7 claims out of QUEUED: 4 claim_next, m5's claim and its takeover
    # (written as a reclaim and a claim: a wait of 0), the rival's m6) and runs (2 completes,
    # 2 fails; a lease reclaimed ends none).
    assert value(samples, "taskflow_queue_waits_last_hour", queue="mq") == 7
    assert value(samples, "taskflow_queue_runs_last_hour", queue="mq") == 4
    assert {dict(labels)["quantile"] for labels in labelled(samples, "taskflow_queue_run_seconds")} == {"0.5", "0.95"}

    # Two processes at least wrote what this scrape added up: a worker and the reaper.
    pids = {name[:-3].rsplit("_", 1)[1] for name in os.listdir(directory) if name.startswith("counter_")}
    assert len(pids) >= 2, pids


@on_postgres
def test_websocket_clients_and_the_tailer_lag(pg_metrics_server):
    server, _ = pg_metrics_server
    _, session = staff_session(PG)
    socket = BoardSocket(server, session)
    try:
        wait_until(lambda: value(scrape(server), "taskflow_websocket_clients") == 1, WAIT, "one socket counted")
        wait_until(lambda: socket.snapshots >= 1, WAIT, "the socket's snapshot")
        _, key = agent_keys.create_key("lag-agent", using=PG)
        assert call(server, "POST", "/api/tasks", key, {"id": "w1", "title": "w"})[0] == 201
        newest = TaskEvent.objects.using(PG).order_by("-id").first().id
        wait_until(lambda: socket.max_event_id >= newest, WAIT, "the socket saw the creation")
        # It came as bytes built once for every socket, written at once (the socket was idle:
        # its snapshot was out), not through the socket's queue.
        frames = labelled(scrape(server), "taskflow_board_frames_total")
        assert frames.get(frozenset({("path", "direct")}), 0) >= 1, frames
        # The socket's process has a tailer, caught up: lag 0 (per process: a pid label).
        lags = wait_until(lambda: labelled(scrape(server), "taskflow_tailer_lag_events"), WAIT, "a tailer lag")
        assert len(lags) == 1 and list(lags.values()) == [0], lags
    finally:
        socket.close()
    wait_until(lambda: value(scrape(server), "taskflow_websocket_clients") == 0, WAIT, "the socket left the count")


# ---------------------------------------------------------------------------------------------
# Who may scrape


@pytest.fixture(scope="module")
def sqlite_server(django_db_setup, django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock():
        server = metrics_server("default", tmp_path_factory.mktemp("metrics"))
    try:
        yield server
    finally:
        server.close()


def assert_refused(server, headers, status, code):
    got, head, body = get(server, "/metrics", headers)
    assert got == status, body
    assert json.loads(body)["error"]["code"] == code
    return head


def test_without_credentials_a_scrape_is_401(sqlite_server):
    head = assert_refused(sqlite_server, {}, 401, "unauthorized")
    assert head["www-authenticate"].startswith("Bearer")
    assert_refused(sqlite_server, {"Authorization": "Bearer not-the-token"}, 401, "unauthorized")
    assert_refused(sqlite_server, {"Authorization": f"Basic {TOKEN}"}, 401, "unauthorized")


def test_an_agent_key_that_is_not_an_operator_is_403_and_an_operator_key_may_scrape(sqlite_server):
    _, key = agent_keys.create_key("plain-agent")
    assert_refused(sqlite_server, {"Authorization": f"Bearer {key}"}, 403, "forbidden")
    _, operator = agent_keys.create_key("ops", is_operator=True)
    assert "taskflow_live_leases" in {name for name, _ in scrape(sqlite_server, {"Authorization": f"Bearer {operator}"})}


def test_the_token_setting_lets_the_scraper_in(sqlite_server):
    samples = scrape(sqlite_server)  # Authorization: Bearer TOKEN (TASKFLOW_METRICS_TOKEN)
    assert value(samples, "taskflow_live_leases") == 0


def test_usage_reports_are_counted_from_the_servers_processes(sqlite_server):
    """Two reports through the real server (a renew's and a complete's): the usage counters are
    their sums, whichever worker process took each request."""
    _, key = agent_keys.create_key("usage-agent")
    transitions.create(transitions.TaskSpec(id="usage-1", title="u"))
    status, claimed = call(sqlite_server, "POST", "/api/tasks/usage-1/claim", key, {"ttl_seconds": 60})
    assert status == 200, claimed
    token = claimed["lease"]["token"]
    assert call(sqlite_server, "POST", "/api/tasks/usage-1/renew", key, {"token": token, "ttl_seconds": 60, "usage": {
        "model": "opus", "input_tokens": 300, "output_tokens": 20, "cost_usd": 0.25}})[0] == 200
    assert call(sqlite_server, "POST", "/api/tasks/usage-1/complete", key, {"token": token, "result": {}, "usage": {
        "input_tokens": 5, "output_tokens": 1}})[0] == 200
    samples = scrape(sqlite_server)
    assert (value(samples, "taskflow_usage_tokens_total", kind="input"),
            value(samples, "taskflow_usage_tokens_total", kind="output")) == (305, 21)
    assert value(samples, "taskflow_usage_cost_usd_total") == 0.25
    assert (value(samples, "taskflow_usage_reports_total", cost="given"),
            value(samples, "taskflow_usage_reports_total", cost="missing")) == (1, 1)


def test_a_staff_session_needs_view_permission(sqlite_server):
    _, without = staff_session("default", permission=False)
    assert_refused(sqlite_server, {"Cookie": f"sessionid={without}"}, 403, "forbidden")
    _, allowed = staff_session("default")
    assert value(scrape(sqlite_server, {"Cookie": f"sessionid={allowed}"}), "taskflow_live_leases") == 0


def test_a_refused_scrape_changes_nothing(sqlite_server):
    before = (Task.objects.count(), TaskEvent.objects.count())
    assert_refused(sqlite_server, {}, 401, "unauthorized")
    assert (Task.objects.count(), TaskEvent.objects.count()) == before



@pytest.mark.django_db
def test_a_queued_task_written_outside_the_engine_is_aged_by_its_last_write():
    """A row with no stage_changed_at (written outside the engine: bench/big_board.py does) must
    not break the scrape: its age counts from its last write, as its public view says."""
    from board import metrics
    from board.engine.transitions import TaskSpec

    transitions.create(TaskSpec(id="outside", title="t", queue="oq"))
    Task.objects.filter(pk="outside").update(stage_changed_at=None)
    ages = {sample.labels["queue"]: sample.value
            for family in text_string_to_metric_families(metrics.scrape().decode())
            for sample in family.samples if sample.name == "taskflow_oldest_queued_age_seconds"}
    assert set(ages) == {"oq"} and ages["oq"] >= 0


@pytest.mark.parametrize("using", ["default", pytest.param(PG, marks=postgres_db_mark())])
def test_the_last_hours_waits_and_runs_per_queue_are_exported_exact(using, monkeypatch):
    """taskflow_queue_{wait,run}_seconds{queue,quantile} (nearest-rank p50/p95) and the counts,
    from history rows stamped at chosen times; with one queue named, the others' samples are
    pooled into queue="_other" (their quantiles, not a sum); what ended over an hour ago is out."""
    from datetime import timedelta

    from board import metrics
    from board.engine import clock
    from board.engine.transitions import TaskSpec
    from tests.test_insights import Script

    named_queues = metrics.named_queues
    monkeypatch.setattr(metrics, "named_queues", lambda held: named_queues(held, limit=1))
    now = clock.now(using)
    s = Script(using)

    def at(seconds_ago: float, step):
        return s.at(now - timedelta(seconds=seconds_ago), step)

    def claim(task_id):
        return lambda: transitions.claim(task_id, "ann", 3600, using=using).lease

    def complete(task_id, lease):
        return lambda: transitions.complete(task_id, lease.token, {}, using=using)

    def create(queue, *ids):
        return lambda: transitions.create([TaskSpec(id=i, title=i, queue=queue) for i in ids], using=using)

    at(3 * 3600, create("small1", "o1"))
    o1 = at(2 * 3600, claim("o1"))
    at(2 * 3600 - 60, complete("o1", o1))  # waited and ran over an hour ago: not exported
    at(600, create("big", "b1", "b2", "b3"))
    b1, b2, b3 = at(590, claim("b1")), at(580, claim("b2")), at(570, claim("b3"))  # waits 10, 20, 30
    at(560, complete("b1", b1))  # runs 30,
    at(550, complete("b2", b2))  # 30
    at(500, lambda: transitions.fail("b3", b3.token, "bad", retryable=False, using=using))  # and 70
    at(400, create("small1", "s1"))
    at(400, create("small2", "s2"))
    s1 = at(300, claim("s1"))  # wait 100
    at(290, complete("s1", s1))  # run 10
    s2 = at(200, claim("s2"))  # wait 200
    at(100, complete("s2", s2))  # run 100

    samples = {(sample.name, frozenset(sample.labels.items())): sample.value
               for family in text_string_to_metric_families(metrics.scrape(using).decode())
               for sample in family.samples if sample.name.startswith("taskflow_queue_")}

    def of(name: str) -> dict:
        return {tuple(sorted(dict(labels).items())): v for (n, labels), v in samples.items() if n == name}

    assert of("taskflow_queue_wait_seconds") == {
        (("quantile", "0.5"), ("queue", "big")): 20, (("quantile", "0.95"), ("queue", "big")): 30,
        (("quantile", "0.5"), ("queue", "_other")): 100, (("quantile", "0.95"), ("queue", "_other")): 200}
    assert of("taskflow_queue_run_seconds") == {
        (("quantile", "0.5"), ("queue", "big")): 30, (("quantile", "0.95"), ("queue", "big")): 70,
        (("quantile", "0.5"), ("queue", "_other")): 10, (("quantile", "0.95"), ("queue", "_other")): 100}
    assert of("taskflow_queue_waits_last_hour") == {(("queue", "big"),): 3, (("queue", "_other"),): 2}
    assert of("taskflow_queue_runs_last_hour") == {(("queue", "big"),): 3, (("queue", "_other"),): 2}


# ---------------------------------------------------------------------------------------------
# SQLite's writers: how long each write transaction waited for the lock and held it


def _sqlite_write_counts() -> tuple[float, float]:
    from prometheus_client import REGISTRY

    return (REGISTRY.get_sample_value("taskflow_sqlite_write_wait_seconds_count") or 0.0,
            REGISTRY.get_sample_value("taskflow_sqlite_write_hold_seconds_count") or 0.0)


def test_every_outermost_sqlite_write_transaction_is_timed_once_committed_or_not():
    from board.engine.stores import sqlite, store

    flow.ensure_rows("default", ["default"], [])  # the queue's row: its own transaction, not counted below
    seen: list[tuple[float, float]] = []
    observer = lambda waited, held: seen.append((waited, held))  # noqa: E731
    sqlite.observe_sqlite_writes(observer)
    try:
        before = _sqlite_write_counts()
        transitions.create(transitions.TaskSpec(id="w1", title="timed"))  # one transaction
        claim = transitions.claim_next("agent", 60)  # one (the hot path's)
        transitions.complete(claim.task.id, claim.lease.token, {"ok": True})  # one
        with store().write_transaction():  # nested ones are the outer one's
            with store().write_transaction():
                pass
        with pytest.raises(ZeroDivisionError), store().write_transaction():
            1 / 0  # rolled back: still held the lock, still timed
        assert len(seen) == 5
        assert all(waited >= 0 and held > 0 for waited, held in seen)
        # The metrics subscribe at startup (board/apps.py): the same five in this process's histograms.
        after = _sqlite_write_counts()
        assert (after[0] - before[0], after[1] - before[1]) == (5.0, 5.0)
    finally:
        sqlite._sqlite_write_observers.remove(observer)


def test_a_write_made_by_a_commit_hook_counts_in_its_writers_hold_not_apart():
    """On the ORM path, complete admits the dependents from an on-commit hook of its own
    transaction, while the locks are still held: one write for the metrics, as it is one hold."""
    from django.test import override_settings

    from board.engine.stores import sqlite

    transitions.create([transitions.TaskSpec(id="up", title="up"),
                        transitions.TaskSpec(id="down", title="down", deps=["up"])])
    seen: list = []
    observer = lambda waited, held: seen.append(held)  # noqa: E731
    with override_settings(TASKFLOW={**settings.TASKFLOW, "HOT_PATH": "orm"}):
        claim = transitions.claim_next("agent", 60)
        sqlite.observe_sqlite_writes(observer)
        try:
            transitions.complete("up", claim.lease.token, {"ok": True})
        finally:
            sqlite._sqlite_write_observers.remove(observer)
    assert Task.objects.get(pk="down").stage == "QUEUED"  # the hook's write happened
    assert len(seen) == 1


def test_the_latency_middleware_times_the_api_under_the_apis_own_prefix():
    """metrics spells the prefix itself (it sits below the API's layer): the two must agree."""
    from board import metrics
    from board.api.middleware import API_PREFIX

    assert metrics._API_PREFIX == API_PREFIX


# ---------------------------------------------------------------------------------------------
# The pid the multi-process values are filed under: read once, and again in a forked child

FORKED_COUNTS = """
import os, sys
import django
django.setup()
from board import metrics
metrics.CLAIMS.inc()
child = os.fork()
if child == 0:
    metrics.CLAIMS.inc(2)  # into a file of its own: the parent's one is not overwritten
    os._exit(0)
os.waitpid(child, 0)
metrics.CLAIMS.inc()
print(os.getpid(), child)
"""


def test_a_forked_process_files_its_counts_under_its_own_pid(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", FORKED_COUNTS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    parent, child = done.stdout.split()[-2:]
    assert sorted(p.name for p in tmp_path.glob("counter_*.db")) == sorted(
        [f"counter_{parent}.db", f"counter_{child}.db"])
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    assert registry.get_sample_value("taskflow_claims_total") == 4  # 2 in the parent, 2 in the child
