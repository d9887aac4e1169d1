"""Bulk jobs (tests/test_bulk.py) on MongoDB, through django-mongodb-backend: the job's row numbered
from the store's counter, its filter (a queue pattern: a regex) read, each task moved by its verb
held to the version read (a task changed meanwhile lost), two runners taking a job once, and a
job racing an agent that claims and completes the same tasks."""
import pytest

from board.bulk import jobs
from board.engine import errors, selectors, transitions
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import race

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def make(n: int) -> list[str]:
    transitions.create([TaskSpec(id=f"t{i:03d}", title="t", queue="ci-a", priority=i) for i in range(n)])
    transitions.create(TaskSpec(id="docs", title="d", queue="docs"))
    return [f"t{i:03d}" for i in range(n)]


def test_a_bulk_cancel_moves_each_task_once_and_loses_a_changed_one():
    make(12)
    request = jobs.check_request({"queue": "ci-*"}, "cancel", "tidy")
    assert jobs.count(request)["total"] == 12
    job = jobs.create(request, actor="op")
    transitions.edit("t003", actor="someone", version=0, title="changed")
    job = jobs.run(job.pk)
    assert (job.state, job.done, job.lost, job.skipped, job.problems) == ("done", 11, 1, 0, 0)
    assert Task.objects.get(pk="t003").stage == "QUEUED" and Task.objects.get(pk="docs").stage == "QUEUED"
    assert TaskEvent.objects.filter(actor=f"op (bulk {job.pk})").count() == 11


def test_two_runners_take_a_job_once_and_a_job_races_an_agent():
    ids = make(40)
    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op")
    taken = race([lambda i=i: jobs.take(job.pk, f"r{i}") for i in range(4)])
    assert not [t for t in taken if isinstance(t, BaseException)] and len([t for t in taken if t]) == 1

    job = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op")
    completed, refused = [], []

    def agent():
        while True:
            try:
                claim = transitions.claim_next("agent", 60, queue="ci-a")
                if claim is None:
                    return
                transitions.complete(claim.task.pk, claim.lease.token, {})
                completed.append(claim.task.pk)
            except errors.BoardError as exc:
                refused.append(exc)

    results = race([lambda: jobs.run(job.pk), agent])
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert refused == []
    job = jobs.get(job.pk)
    by_job = set(TaskEvent.objects.filter(actor=f"op (bulk {job.pk})").values_list("task_id", flat=True))
    assert job.done == len(by_job) and job.lost == len(completed) and job.done + job.lost == job.total == 40
    assert by_job.isdisjoint(completed) and by_job | set(completed) == set(ids)
    assert selectors.problems() == []
