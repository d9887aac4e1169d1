"""Bulk jobs (issue 33, item 1; board/bulk/jobs.py) on SQLite and PostgreSQL: every task moved once
by its operator verb held to the version read, a task changed meanwhile counted lost and left as
it is, the reasons of the skipped ones, a stop midway, a crashed runner's job taken over, and a
job racing agents that claim and complete the same tasks (threads released by a barrier, counts
exact, check() clean)."""
from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections

from board.bulk import jobs
from board.engine import errors, selectors, transitions
from board.engine.transitions import TaskSpec
from board.models import BulkJob, Task, TaskEvent
from harness.board_server import server_env, stop_process, wait_until
from tests.support import database_url, race, sql_stores, sqlite_db_mark

ROOT = Path(__file__).resolve().parent.parent

pytestmark = []


def make(using, n, queue="ci-a", prefix="t", **fields):
    transitions.create([TaskSpec(id=f"{prefix}{i:04d}", title=f"task {i}", queue=queue, **fields) for i in range(n)],
                       using=using)
    return [f"{prefix}{i:04d}" for i in range(n)]


def run_job(using, action="cancel", filter=None, **params):
    request = jobs.check_request(filter or {"queue": "ci-*"}, action, "tidy up", **params)
    job = jobs.create(request, actor="op", using=using)
    return jobs.run(job.pk, using=using)


def stages(using, ids):
    return dict(Task.objects.using(using).filter(pk__in=ids).values_list("pk", "stage"))


@pytest.mark.parametrize("using", sql_stores())
def test_a_bulk_cancel_moves_every_unfinished_matching_task_once(using):
    ci = make(using, 12, "ci-a") + make(using, 3, "ci-b", prefix="b")
    other = make(using, 4, "docs", prefix="d")
    claim = transitions.claim("t0000", "w1", 60, using=using)
    transitions.complete("t0000", claim.lease.token, {}, using=using)  # finished: not acted on
    request = jobs.check_request({"queue": "ci-*"}, "cancel", "tidy up")
    assert jobs.count(request, using=using) == {"action": "cancel", "total": 14, "matching": 15,
                                                "description": "cancel 14 tasks in queue ci-*"}
    assert jobs.count(jobs.check_request({"search": "queue:ci-*", "stage": "QUEUED"}, "add-tag", tag="x"),
                      using=using)["description"] == "tag 14 tasks with x in stage QUEUED in queue ci-*"
    assert jobs.count(jobs.check_request({"search": "queue:ci-* tag:x"}, "cancel"),
                      using=using)["description"] == "cancel 0 tasks matching queue:ci-* tag:x"
    job = jobs.run(jobs.create(request, actor="op", using=using).pk, using=using)
    assert (job.state, job.total, job.done, job.skipped, job.lost, job.problems) == ("done", 14, 14, 0, 0, 0)
    assert set(stages(using, ci[1:]).values()) == {"CANCELLED"} and stages(using, ["t0000"]) == {"t0000": "COMPLETED"}
    assert set(stages(using, other).values()) == {"QUEUED"}
    moves = TaskEvent.objects.using(using).filter(verb="cancel")
    assert moves.count() == 14 and {(e.actor, e.detail["reason"]) for e in moves} == {(f"op (bulk {job.pk})", "tidy up")}
    assert job.started_at and job.finished_at and job.runner


@pytest.mark.parametrize("using", sql_stores())
def test_skipped_tasks_are_counted_with_their_reasons(using):
    make(using, 3, "ci-a", max_retries=0)
    for task_id in ("t0000", "t0001"):
        claim = transitions.claim(task_id, "w1", 60, using=using)
        transitions.fail(task_id, claim.lease.token, "boom", using=using)  # no attempt left: FAILED
    job = run_job(using, "requeue", {"queue": "ci-a", "stage": "FAILED"})
    assert (job.total, job.done, job.skipped, job.skipped_reasons) == (2, 0, 2, {"no_attempt_left": 2})
    job = run_job(using, "retry", {"queue": "ci-a"})  # retry resets the attempts
    assert (job.total, job.done, job.skipped) == (2, 2, 0)
    assert set(stages(using, ["t0000", "t0001"]).values()) == {"QUEUED"}
    transitions.edit("t0002", actor="op", version=0, tags=["x"], using=using)
    job = run_job(using, "add-tag", {"queue": "ci-a"}, tag="x")
    assert (job.total, job.done, job.skipped, job.skipped_reasons) == (3, 2, 1, {"unchanged": 1})
    assert {t.pk: t.tags for t in Task.objects.using(using).filter(queue="ci-a")} == {
        "t0000": ["x"], "t0001": ["x"], "t0002": ["x"]}
    job = run_job(using, "set-priority", {"tags": ["x"]}, priority=7)
    assert (job.done, set(Task.objects.using(using).values_list("priority", flat=True))) == (3, {7})
    transitions.create([TaskSpec(id="held", title="h", queue="ci-a", deps=("t0000",))], using=using)
    job = run_job(using, "admit", {"queue": "ci-a"})
    assert (job.total, job.skipped_reasons) == (1, {"blocked": 1})


@pytest.mark.parametrize("using", sql_stores())
def test_a_task_changed_after_the_job_read_it_is_lost_not_overwritten(using):
    make(using, 5)
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op", using=using)
    transitions.edit("t0001", actor="someone", version=0, title="changed", using=using)
    claim = transitions.claim("t0003", "w1", 60, using=using)
    job = jobs.run(job.pk, using=using)
    assert (job.done, job.lost, job.skipped) == (3, 2, 0)
    assert stages(using, ["t0001", "t0003"]) == {"t0001": "QUEUED", "t0003": "RUNNING"}
    transitions.complete("t0003", claim.lease.token, {}, using=using)  # its lease was never touched
    assert selectors.problems(using=using) == []


@pytest.mark.parametrize("using", sql_stores())
def test_a_stop_asked_midway_ends_the_job_at_its_next_progress_write(using, monkeypatch):
    ids = make(using, 60)
    monkeypatch.setattr(jobs, "PROGRESS_TASKS", 10)
    monkeypatch.setattr(jobs, "PAGE_TASKS", 10)
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op", using=using)
    real_act, seen = jobs.act, []

    lock = threading.Lock()

    def act_then_stop(*args, **kwargs):
        with lock:
            seen.append(args[2])
            if len(seen) == 25:  # the operator's stop, a real write, while the runner's workers move a page
                assert jobs.stop(job.pk, using=using).state == "stopping"
        return real_act(*args, **kwargs)

    monkeypatch.setattr(jobs, "act", act_then_stop)
    job = jobs.run(job.pk, using=using)
    assert (job.state, job.done, job.skipped, job.lost, job.position) == ("stopped", 30, 0, 0, 30)
    assert list(stages(using, ids).values()).count("CANCELLED") == 30
    assert jobs.stop(job.pk, using=using).state == "stopped"  # a finished job is answered as it is
    pending = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op", using=using)
    assert jobs.stop(pending.pk, using=using).state == "stopped" and jobs.run(pending.pk, using=using) is None


@pytest.mark.parametrize("using", sql_stores())
def test_a_crashed_runners_job_is_taken_over_and_its_moves_counted_once(using):
    make(using, 20)
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op", using=using)
    crashed = jobs.take(job.pk, "dead-runner", using=using)
    for task_id, version in crashed.items[:7]:  # moved, but the runner died before writing progress
        assert jobs.act(crashed, f"op (bulk {job.pk})", task_id, version, using) == (jobs.DONE, None)
    assert jobs.run_due(using=using) == []  # its heartbeat is fresh: not taken
    assert jobs.take(job.pk, "another", using=using) is None
    BulkJob.objects.using(using).filter(pk=job.pk).update(heartbeat_at=crashed.heartbeat_at - timedelta(minutes=5))
    assert jobs.run_due(using=using) == [job.pk]
    job = jobs.get(job.pk, using)
    assert (job.state, job.done, job.lost, job.skipped, job.problems) == ("done", 20, 0, 0, 0)
    assert TaskEvent.objects.using(using).filter(verb="cancel").count() == 20


@pytest.mark.parametrize("using", sql_stores())
def test_a_bulk_replay_copies_each_finished_task_once_even_across_a_crashed_runner(using):
    done = make(using, 6, prefix="d")
    for task_id in done[:4]:
        claim = transitions.claim(task_id, "agent", 60, using=using)
        transitions.complete(task_id, claim.lease.token, {"ok": task_id}, using=using)
    transitions.cancel(done[4], actor="op", using=using)  # finished too; done[5] stays QUEUED
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "replay"), actor="op", using=using)
    assert job.total == 5  # the unfinished one is not acted on
    crashed = jobs.take(job.pk, "dead-runner", using=using)
    first_id, first_version = crashed.items[0]
    assert jobs.act(crashed, f"op (bulk {job.pk})", first_id, first_version, using) == (jobs.DONE, None)
    BulkJob.objects.using(using).filter(pk=job.pk).update(heartbeat_at=crashed.heartbeat_at - timedelta(minutes=5))
    assert jobs.run_due(using=using) == [job.pk]
    job = jobs.get(job.pk, using)
    assert (job.state, job.done, job.lost, job.skipped) == ("done", 5, 0, 0)
    copies = dict(Task.objects.using(using).filter(replay_of__isnull=False).values_list("replay_of", "pk"))
    assert copies == {task_id: f"{task_id}.r{job.pk}" for task_id in done[:5]}  # one copy each
    assert stages(using, list(copies.values())) == dict.fromkeys(copies.values(), "QUEUED")
    assert stages(using, done) == {**dict.fromkeys(done[:4], "COMPLETED"), done[4]: "CANCELLED", done[5]: "QUEUED"}
    assert jobs.replay_id(job, "x" * 100).endswith(f".r{job.pk}") and len(jobs.replay_id(job, "x" * 100)) == 100


@pytest.mark.parametrize("using", sql_stores())
def test_two_runners_take_a_job_once(using):
    make(using, 3)
    for _ in range(3):
        job = jobs.create(jobs.check_request({"queue": "ci-a"}, "requeue"), actor="op", using=using)
        taken = race([lambda i=i: jobs.take(job.pk, f"r{i}", using=using) for i in range(6)], using)
        assert not [t for t in taken if isinstance(t, BaseException)], taken
        assert len([t for t in taken if t is not None]) == 1


@pytest.mark.parametrize("using", sql_stores())
@pytest.mark.parametrize("action", ["cancel", "pause"])
def test_a_bulk_job_racing_agents_loses_no_update(using, action):
    """200 tasks; a bulk cancel (of the QUEUED ones) or pause (of the 100 RUNNING ones the agents
    hold) runs while four agents claim and complete the same tasks (and, for pause, complete the
    ones they hold), released together by a barrier. Each task ends moved by the job or by the
    agents, never both; an agent's complete fails only with lease_lost on a task the job paused
    first; the job's counts add up exactly and check() is clean."""
    n = 200
    # Claims take the highest priority first: the agents start from the end the job reaches last.
    transitions.create([TaskSpec(id=f"t{i:04d}", title="t", queue="ci-a", priority=i) for i in range(n)], using=using)
    ids = [f"t{i:04d}" for i in range(n)]
    held = {}
    if action == "pause":
        for i, task_id in enumerate(ids[100:]):
            held[task_id] = (f"a{i % 4}", transitions.claim(task_id, f"a{i % 4}", 60, using=using).lease.token)
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, action), actor="op", using=using)
    assert job.total == (n if action == "cancel" else 100)
    completed, lease_lost, other_errors = [], [], []
    lock = threading.Lock()

    def agent(name):
        mine = [(t, token) for t, (holder, token) in held.items() if holder == name]

        def work():
            while True:
                try:
                    if mine:
                        task_id, token = mine.pop()
                    else:
                        claim = transitions.claim_next(name, 60, queue="ci-a", using=using)
                        if claim is None:
                            return
                        task_id, token = claim.task.pk, claim.lease.token
                    transitions.complete(task_id, token, {"by": name}, using=using)
                    with lock:
                        completed.append(task_id)
                except errors.LeaseLost:
                    with lock:
                        lease_lost.append(task_id)
                except errors.BoardError as exc:
                    with lock:
                        other_errors.append(exc)
        return work

    results = race([lambda: jobs.run(job.pk, using=using)] + [agent(f"a{i}") for i in range(4)], using)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert other_errors == []
    job = jobs.get(job.pk, using)
    assert job.state == "done" and job.skipped == 0 and job.done + job.lost == job.total
    by_job = set(TaskEvent.objects.using(using).filter(actor=f"op (bulk {job.pk})").values_list("task_id", flat=True))
    assert len(by_job) == job.done
    final = stages(using, ids)
    assert {t for t, s in final.items() if s == ("CANCELLED" if action == "cancel" else "PAUSED")} == by_job
    assert by_job.isdisjoint(completed) and len(completed) == len(set(completed))
    if action == "cancel":
        assert lease_lost == [] and by_job | set(completed) == set(ids) and job.lost == len(completed)
    else:  # the held tasks: paused by the job (their holder's complete lost) or completed (the job lost)
        assert sorted(lease_lost) == sorted(by_job)
        assert by_job | (set(completed) & set(held)) == set(held) and job.lost == len(set(completed) & set(held))
        assert set(completed) - set(held) == set(ids[:100])  # the QUEUED ones were never the job's
    assert selectors.problems(using=using) == []


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_reapers_loop_runs_a_job_no_server_thread_took():
    """A job created and left pending (the server that accepted it died before its thread took
    it): a real `manage.py reap --loop` process runs it, bounded by a deadline."""
    make("default", 30)
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op")
    connections["default"].close()
    env = server_env(database_url(connections["default"].settings_dict), "test-secret")
    reaper = subprocess.Popen([sys.executable, "manage.py", "reap", "--loop", "--interval", "0.2"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: jobs.get(job.pk).state == "done", 30, "the reaper's bulk job")
    finally:
        stop_process(reaper)
    job = jobs.get(job.pk)
    assert (job.done, job.lost, job.skipped, job.problems) == (30, 0, 0, 0) and job.runner
