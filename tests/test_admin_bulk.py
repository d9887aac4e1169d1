"""Bulk jobs from the admin (issue 33, item 1; board/admin/bulk.py) on SQLite: the Tasks list's
"Bulk job" action over every task its filters match ("Select all"), asked first with the count of
each action, then run in the background to its summary on the Bulk jobs page; stopping a job;
who may."""
from __future__ import annotations

import time

from django.urls import reverse

from board.bulk import jobs
from board.models import BulkJob, Task
from tests.support import db_state, sqlite_db_mark
from tests.test_admin import CHANGELIST, HttpsClient, client_for, make_user, messages_of, new, op, viewer  # noqa: F401

pytestmark = sqlite_db_mark()
JOBS = reverse("admin:board_bulkjob_changelist")


def wait_finished(job_id: int, seconds: float = 30) -> BulkJob:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job = jobs.get(job_id)
        if job.state in ("done", "stopped", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"bulk job {job_id} did not finish")


def test_select_all_then_a_bulk_job_cancels_every_task_the_filter_matches(op):  # noqa: F811
    for n in range(150):  # more than a page of the list (100)
        new(f"ci-{n:03d}", queue="ci-a")
    new("docs-1", queue="docs")
    url = f"{CHANGELIST}?queue=ci-a"
    asked = op.post(url, {"action": "bulk_job", "select_across": "1", "index": "0",
                          "_selected_action": ["ci-000"], "reason": "bad image"})
    assert asked.status_code == 200 and asked.templates[0].name == "admin/board/task/bulk_job.html"
    counts = {name: n for name, _, n in asked.context["counts"]}
    assert (counts["cancel"], counts["retry"], counts["admit"], asked.context["matching"]) == (150, 0, 0, 150)
    assert asked.context["form"].initial["bulk_reason"] == "bad image" and not BulkJob.objects.exists()
    done = op.post(url, {"action": "bulk_job", "select_across": "1", "_selected_action": ["ci-000"], "bulk": "yes",
                         "bulk_action": "cancel", "bulk_reason": "bad image"}, follow=True)
    [message] = messages_of(done)
    job = BulkJob.objects.get()
    assert f">{job.pk}</a> started: cancel 150 tasks" in message and message.startswith("Bulk job <a href=")
    job = wait_finished(job.pk)
    assert (job.state, job.done, job.lost, job.skipped, job.reason, job.actor) == ("done", 150, 0, 0, "bad image", "op")
    assert job.filter == {"admin": "every task of the Tasks list where queue=ci-a"}
    assert set(Task.objects.filter(queue="ci-a").values_list("stage", flat=True)) == {"CANCELLED"}
    assert Task.objects.get(pk="docs-1").stage == "QUEUED"
    page = op.get(JOBS)
    assert page.status_code == 200 and b"150 / 0 / 0 of 150" in page.content


def test_a_bad_choice_asks_again_and_writes_nothing(op):  # noqa: F811
    new("ci-1", queue="ci-a")
    before = db_state()
    again = op.post(CHANGELIST, {"action": "bulk_job", "_selected_action": ["ci-1"], "bulk": "yes",
                                 "bulk_action": "add-tag", "tag": "no spaces"})
    assert again.status_code == 200 and again.context["form"].errors == {"tag": ["Enter a valid value."]}
    refused = op.post(CHANGELIST, {"action": "bulk_job", "_selected_action": ["ci-1"], "bulk": "yes",
                                   "bulk_action": "set-priority"}, follow=True)
    assert "Bulk job refused: set-priority needs priority" in messages_of(refused)[0]
    assert db_state() == before and not BulkJob.objects.exists()


def test_stop_from_the_bulk_jobs_page_and_who_sees_it(op, viewer):  # noqa: F811
    new("ci-1", queue="ci-a")
    pending = jobs.create(jobs.check_request({"queue": "ci-a"}, "cancel"), actor="op")
    stopped = op.post(JOBS, {"action": "stop", "_selected_action": [str(pending.pk)], "index": "0"}, follow=True)
    assert messages_of(stopped) == [f"bulk job {pending.pk}: stopped"]
    assert jobs.get(pending.pk).state == "stopped" and Task.objects.get(pk="ci-1").stage == "QUEUED"
    assert viewer.get(JOBS).status_code == 403  # board.view_task alone: no bulk jobs
    assert viewer.get(CHANGELIST).context["action_form"] is None  # no action at all, the bulk job neither
