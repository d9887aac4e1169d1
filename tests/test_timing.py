"""board.engine.timing on SQLite and PostgreSQL: each task's waits and runs, and each queue's count,
p50 and p95 over the last hour, exact, from a scripted history whose rows are stamped with chosen
times (never waited for) and read at a chosen `now`; the window's reads on PostgreSQL use the
history's primary key (EXPLAIN)."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connections

from board.engine import timing, transitions
from board.engine.transitions import TaskSpec
from board.live import insights
from board.models import Task, TaskEvent
from tests.support import end_backoff, expire_lease, plan_node_names, postgres_db_mark, sql_stores
from tests.test_insights import NOW, Script, ago

STORES = sql_stores()


def run_script(using: str) -> None:
    """Every step in time order (the history's ids follow time, as in a real store)."""
    s = Script(using)

    def create(*specs):
        return lambda: transitions.create(list(specs), actor="maker", using=using)

    def claim(task_id: str):
        return lambda: transitions.claim(task_id, "ann", 3600, using=using)

    def complete(task_id: str, lease):
        return lambda: transitions.complete(task_id, lease.token, {}, using=using)

    s.at(ago(200), create(TaskSpec(id="t3", title="old", queue="alpha")))
    s.at(ago(120), create(TaskSpec(id="t4", title="long run", queue="alpha")))
    s.at(ago(100), create(TaskSpec(id="t5", title="all before", queue="alpha")))
    t4 = s.at(ago(90), claim("t4")).lease
    t5 = s.at(ago(80), claim("t5")).lease
    s.at(ago(79), complete("t5", t5))
    s.at(ago(50), create(TaskSpec(id="t1", title="quick", queue="alpha"), TaskSpec(id="t2", title="retried", queue="alpha")))
    t1 = s.at(ago(48), claim("t1")).lease
    s.at(ago(47), complete("t1", t1))
    t2 = s.at(ago(45), claim("t2")).lease
    s.at(ago(44), lambda: transitions.fail("t2", t2.token, "flaky", using=using))  # and its retry
    retry = TaskEvent.objects.using(using).get(task_id="t2", verb="retry")
    retry.detail = {"backoff_seconds": 30}  # the engine's backoff has jitter: fixed here
    retry.save(using=using)
    end_backoff("t2", using=using)
    t2 = s.at(ago(40), claim("t2")).lease
    s.at(ago(35), create(TaskSpec(id="t6", title="lost lease", queue="alpha")))
    s.at(ago(30), claim("t6"))
    s.at(ago(30), create(TaskSpec(id="t7", title="scheduled", queue="alpha", run_at=ago(20))))
    s.at(ago(30), complete("t2", t2))
    expire_lease("t6", using=using)
    s.at(ago(25), lambda: transitions.reclaim_expired(task_ids=["t6"], using=using))
    s.at(ago(20), complete("t4", t4))
    s.at(ago(15), claim("t6"))
    s.at(ago(12), claim("t7"))
    t3 = s.at(ago(10), claim("t3")).lease
    s.at(ago(5), complete("t3", t3))
    s.at(ago(5), create(TaskSpec(id="t8", title="paused", queue="beta")))
    t8 = s.at(ago(4), claim("t8")).lease
    s.at(ago(3), lambda: transitions.pause("t8", t8.token, {"step": 1}, using=using))
    t8 = s.at(ago(2), lambda: transitions.resume("t8", "bob", 3600, using=using)).lease
    s.at(ago(1), complete("t8", t8))


@pytest.fixture
def scripted(request):
    run_script(request.param)
    return request.param


def test_a_tasks_waits_and_runs_from_its_rows():
    def row(verb, from_stage, to_stage, minute, detail=None):
        return (0, "t", verb, from_stage, to_stage, NOW + timedelta(minutes=minute), detail)

    rows = [row("create", "", "QUEUED", 0), row("claim", "QUEUED", "RUNNING", 2),
            row("renew", "RUNNING", "RUNNING", 3), row("fail", "RUNNING", "FAILED", 5),
            row("retry", "FAILED", "QUEUED", 5, {"backoff_seconds": 60}), row("claim", "QUEUED", "RUNNING", 10),
            row("release", "RUNNING", "QUEUED", 11, {"retry_after_seconds": 120}),
            row("claim", "QUEUED", "RUNNING", 14), row("complete", "RUNNING", "COMPLETED", 20)]
    samples, missing = timing.task_samples(rows)
    assert [(s.kind, s.seconds) for s in samples] == [
        ("wait", 120), ("run", 180),  # created, claimed at 2, failed at 5
        ("wait", 240),  # ready at 6 (the backoff's end), claimed at 10; the release ends no run
        ("wait", 60),  # snoozed until 13, claimed at 14
        ("run", 360)]
    assert not missing
    # A detail as the driver gives it (JSON text: the insights panel's read leaves it undecoded).
    as_text = [(*r[:6], json.dumps(r[6])) for r in rows]
    assert timing.task_samples(as_text) == (samples, False)
    # A run's start not among the rows read: said, for the caller to read older rows.
    assert timing.task_samples(rows[3:4]) == ([], True)


def test_quantiles_are_the_nearest_rank():
    assert timing.quantile([5], 0.95) == 5
    assert [timing.quantile([1, 2, 3, 4], q) for q in (0.5, 0.95)] == [2, 4]
    assert [timing.quantile(list(range(100, 0, -1)), q) for q in (0.5, 0.95)] == [50, 95]
    assert timing.summary([]) == {"count": 0, "p50": None, "p95": None}


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_per_queue_waits_and_runs_over_the_last_hour_are_exact(scripted):
    assert_exact(scripted)


def assert_exact(using: str) -> None:
    """After run_script() (tests/mongodb runs it on MongoDB too)."""
    figures = timing.samples_by_queue(NOW, using=using)
    # alpha's waits: t1 2 min, t2 5 min then 3.5 min (ready 30 s after its failure), t3 190 min
    # (created long before the hour: its start read from its older rows), t6 5 min then 10 min
    # (waiting again from its reclaim), t7 8 min (from its run_at, not its creation). t4's
    # claim, 90 min ago, ended its wait before the hour.
    assert sorted(figures["alpha"]["wait"]) == [120, 210, 300, 300, 480, 600, 11400]
    # alpha's runs: t1 1 min, t2 1 min (failed) then 10 min, t3 5 min, t4 70 min (claimed
    # before the hour). t5 ran and ended before it; t6's lost lease ended no run.
    assert sorted(figures["alpha"]["run"]) == [60, 60, 300, 600, 4200]
    # beta: t8 waited 1 min, and ran 1 min from its resume.
    assert figures["beta"] == {"wait": [60], "run": [60]}
    assert timing.queue_timings(NOW, using=using) == {
        "alpha": {"wait": {"count": 7, "p50": 300, "p95": 11400}, "run": {"count": 5, "p50": 300, "p95": 4200}},
        "beta": {"wait": {"count": 1, "p50": 60, "p95": 60}, "run": {"count": 1, "p50": 60, "p95": 60}},
    }
    # The insights panel computes them from the read of the history it makes for the rest (one
    # read for both; details left as JSON text): the same figures.
    assert insights.compute(NOW, using=using)[0]["timing"] == timing.queue_timings(NOW, using=using)
    # Forty minutes later the hour starts after t1's and t2's ends: alpha keeps t6, t7, t3, t4.
    later = timing.samples_by_queue(NOW + timedelta(minutes=40), using=using)
    assert sorted(later["alpha"]["wait"]) == [480, 600, 11400] and sorted(later["alpha"]["run"]) == [300, 4200]
    assert timing.samples_by_queue(NOW + timedelta(hours=3), using=using) == {}


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_a_completed_tasks_last_run_says_who_ran_it_how_long_and_how_long_it_waited(scripted):
    assert_last_runs(scripted)


def assert_last_runs(using: str) -> None:
    """After run_script(): what a COMPLETED card shows (tests/mongodb runs it on MongoDB too)."""
    runs = timing.last_runs(["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "no-such-task"], using=using)
    # t6 and t7 never completed: left out, like a task with no history.
    assert runs == {
        "t1": {"ran_by": "ann", "run_seconds": 60, "wait_seconds": 120},
        # t2 failed once: the run that completed it (10 min) and the wait before it (3.5 min).
        "t2": {"ran_by": "ann", "run_seconds": 600, "wait_seconds": 210},
        "t3": {"ran_by": "ann", "run_seconds": 300, "wait_seconds": 11400},
        "t4": {"ran_by": "ann", "run_seconds": 4200, "wait_seconds": 1800},
        "t5": {"ran_by": "ann", "run_seconds": 60, "wait_seconds": 1200},
        # t8 was paused and resumed by bob: he ran it, 1 min from his resume.
        "t8": {"ran_by": "bob", "run_seconds": 60, "wait_seconds": 60},
    }
    # Retention pruned t4's claim: the run's start is gone, so its length is unknown, not made up.
    TaskEvent.objects.using(using).filter(task_id="t4", verb="claim").delete()
    assert timing.last_runs(["t4"], using=using) == {"t4": {"ran_by": "ann", "run_seconds": None, "wait_seconds": None}}


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_the_first_row_of_a_moment_is_found_by_the_primary_key(scripted):
    events = TaskEvent.objects.using(scripted)
    for minutes in (300, 200, 120, 50.5, 44, 30, 1, 0.5):
        expected = events.filter(at__gte=ago(minutes)).order_by("id").values_list("id", flat=True).first()
        assert timing.first_id_since(ago(minutes), using=scripted) == expected, minutes
    assert timing.first_id_since(ago(0.5), using=scripted) is None


def plan_nodes(queryset) -> list[str]:
    return plan_node_names(json.loads(queryset.explain(format="json")))


def on_postgres(test):
    for mark in postgres_db_mark():
        test = mark(test)
    return test


@on_postgres
def test_on_postgresql_the_windows_reads_use_the_primary_key():
    """30,000 history rows over ten hours: the window's reads (the binary search's probes, the
    hour's rows by id range) are index scans of board_taskevent_pkey, not a scan of the table."""
    using = "postgres"
    transitions.create(TaskSpec(id="busy", title="busy", queue="q"), using=using)
    start = NOW - timedelta(hours=10)
    TaskEvent.objects.using(using).filter(task_id="busy").update(at=start - timedelta(seconds=1))
    TaskEvent.objects.using(using).bulk_create(
        TaskEvent(task_id="busy", verb="edit", from_stage="QUEUED", to_stage="QUEUED", version=0,
                  at=start + timedelta(seconds=1.2 * i)) for i in range(30_000))
    with connections[using].cursor() as cursor:
        cursor.execute("ANALYZE board_taskevent")
    since = timing.first_id_since(NOW - timedelta(hours=1, minutes=5), using=using)
    assert since == TaskEvent.objects.using(using).filter(at__gte=NOW - timedelta(hours=1, minutes=5)) \
        .order_by("id").values_list("id", flat=True).first()
    events = TaskEvent.objects.using(using)
    window = events.filter(id__gte=since).exclude(verb="renew").order_by("id").values_list("id", "at")
    probe = events.filter(id__gt=0, id__lte=since).order_by("-id").values_list("at", flat=True)[:1]
    for queryset in (window, probe):
        nodes = plan_nodes(queryset)
        assert any(node.startswith("Index") and node.endswith("board_taskevent_pkey") for node in nodes), nodes
        assert not any(node.startswith("Seq Scan") for node in nodes), nodes
    assert Task.objects.using(using).count() == 1
