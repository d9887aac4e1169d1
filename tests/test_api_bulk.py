"""Bulk actions over the API (POST /api/bulk, GET /api/bulk/{id}, POST /api/bulk/{id}/stop; issue
33, item 1) through the whole HTTP stack on SQLite: the count first, a job run in the server's own
thread to its summary, who may, and bad input refused with the one error shape and nothing
written. The engine's guarantees on both SQL stores: tests/test_bulk.py."""
from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Permission, User

from board.models import BulkJob, Task
from tests.support import db_state, sqlite_db_mark
from tests.test_api import agent, assert_error, create, get, http, operator, post  # noqa: F401 (fixtures)

pytestmark = sqlite_db_mark()


def wait_finished(http, key, job_id, seconds=30):  # noqa: F811
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job = get(http, f"/bulk/{job_id}", key).json()
        if job["state"] in ("done", "stopped", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"bulk job {job_id} did not finish in {seconds} s: {job}")


def test_an_operator_counts_then_cancels_every_matching_task(http, agent, operator):  # noqa: F811
    for n in range(6):
        create(http, agent, id=f"ci-{n}", queue="ci-a" if n % 2 else "ci-b", tags=["flaky"] if n < 4 else [])
    create(http, agent, id="docs-1", queue="docs", tags=["flaky"])
    body = {"filter": {"queue": "ci-*", "tags": ["flaky"]}, "action": "cancel", "reason": "flaky run"}
    counted = post(http, "/bulk", {**body, "dry_run": True}, operator)
    assert counted.status_code == 200, counted.content
    assert counted.json() == {"action": "cancel", "total": 4, "matching": 4,
                              "description": "cancel 4 tasks in queue ci-* tagged flaky"}
    assert not BulkJob.objects.exists()  # a count writes nothing
    started = post(http, "/bulk", body, operator)
    assert started.status_code == 202, started.content
    assert (started.json()["total"], started.json()["actor"]) == (4, "operator-1")
    job = wait_finished(http, operator, started.json()["id"])
    assert {k: job[k] for k in ("state", "done", "skipped", "lost", "skipped_reasons", "problems")} == {
        "state": "done", "done": 4, "skipped": 0, "lost": 0, "skipped_reasons": {}, "problems": 0}
    assert dict(Task.objects.values_list("pk", "stage")) == {
        "ci-0": "CANCELLED", "ci-1": "CANCELLED", "ci-2": "CANCELLED", "ci-3": "CANCELLED",
        "ci-4": "QUEUED", "ci-5": "QUEUED", "docs-1": "QUEUED"}
    assert [j["id"] for j in get(http, "/bulk", operator).json()["items"]] == [job["id"]]
    stopped = post(http, f"/bulk/{job['id']}/stop", {}, operator)  # finished: answered as it is
    assert (stopped.status_code, stopped.json()["state"]) == (200, "done")


@pytest.mark.parametrize("body, status, code", [
    ({"filter": {}, "action": "cancel"}, 422, "validation_error"),  # no filter: never "every task" by accident
    ({"filter": {"queue": "ci-*"}, "action": "explode"}, 422, "validation_error"),
    ({"filter": {"queue": "ci-*", "colour": "red"}, "action": "cancel"}, 422, "validation_error"),
    ({"filter": {"search": "created:<soon"}, "action": "cancel"}, 422, "validation_error"),
    ({"filter": {"search": '"unclosed'}, "action": "cancel"}, 422, "validation_error"),
    ({"filter": {"stage": "LOST"}, "action": "cancel"}, 422, "validation_error"),
    ({"filter": {"tags": ["no spaces"]}, "action": "cancel"}, 422, "validation_error"),
    ({"filter": {"queue": "bad queue!"}, "action": "cancel"}, 422, "validation_error"),
    ({"filter": {"queue": "ci-*"}, "action": "set-priority"}, 422, "validation_error"),  # no priority
    ({"filter": {"queue": "ci-*"}, "action": "set-priority", "priority": 2**40}, 422, "validation_error"),
    ({"filter": {"queue": "ci-*"}, "action": "add-tag", "tag": "a b"}, 422, "validation_error"),
    ({"filter": {"queue": "ci-*"}, "action": "cancel", "tag": "x"}, 422, "validation_error"),
    ({"filter": {"queue": "ci-*"}, "action": "cancel", "reason": "x" * 501}, 422, "validation_error"),
    ({"filter": "queue:ci-*", "action": "cancel"}, 422, "validation_error"),
])
def test_bad_input_is_refused_and_writes_nothing(http, agent, operator, body, status, code):  # noqa: F811
    create(http, agent, id="ci-1", queue="ci-a")
    before = db_state()
    assert_error(post(http, "/bulk", body, operator), status, code)
    assert_error(post(http, "/bulk", {**body, "dry_run": True}, operator), status, code)
    assert db_state() == before and not BulkJob.objects.exists()


def test_too_many_tasks_is_413_and_writes_nothing(http, agent, operator, monkeypatch):  # noqa: F811
    from board.bulk import jobs
    for n in range(3):
        create(http, agent, id=f"ci-{n}", queue="ci-a")
    monkeypatch.setattr(jobs, "MAX_BULK_TASKS", 2)
    before = db_state()
    assert_error(post(http, "/bulk", {"filter": {"queue": "ci-a"}, "action": "cancel"}, operator), 413, "too_large")
    assert db_state() == before and not BulkJob.objects.exists()


def staff(http, name, perms):  # noqa: F811
    user = User.objects.create(username=name, is_staff=True)
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="board", codename=perm))
    http.force_login(user)


def test_only_operators_and_staff_who_may_intervene(http, agent, operator):  # noqa: F811
    create(http, agent, id="ci-1", queue="ci-a")
    job = wait_finished(http, operator, post(http, "/bulk", {"filter": {"queue": "ci-a"}, "action": "pause"}, operator).json()["id"])
    assert (job["state"], job["total"]) == ("done", 0)  # nothing RUNNING to pause
    body = {"filter": {"queue": "ci-a"}, "action": "cancel", "dry_run": True}
    before = db_state(), list(BulkJob.objects.values())
    assert_error(post(http, "/bulk", body, agent), 403, "forbidden")
    assert_error(get(http, f"/bulk/{job['id']}", agent), 403, "forbidden")
    assert_error(post(http, f"/bulk/{job['id']}/stop", {}, agent), 403, "forbidden")
    assert_error(get(http, "/bulk/999", operator), 404, "not_found")
    staff(http, "viewer", ["view_task"])
    assert_error(post(http, "/bulk", body, None), 403, "forbidden")
    assert (db_state(), list(BulkJob.objects.values())) == before
    staff(http, "op", ["view_task", "intervene"])
    counted = post(http, "/bulk", body, None)
    assert counted.status_code == 200 and counted.json()["total"] == 1


def test_a_scoped_operator_key_acts_on_its_queues_and_sees_its_own_jobs(http, agent, operator):  # noqa: F811
    from board import agent_keys
    _, scoped = agent_keys.create_key("ci-operator", is_operator=True, queues="ci-*")
    create(http, agent, id="ci-1", queue="ci-a")
    create(http, agent, id="docs-1", queue="docs")
    counted = post(http, "/bulk", {"filter": {"search": "id:*"}, "action": "cancel", "dry_run": True}, scoped)
    assert (counted.json()["total"], counted.json()["matching"]) == (1, 1)  # docs-1 is not its to see
    others = wait_finished(http, operator, post(http, "/bulk", {"filter": {"queue": "docs"}, "action": "pause"},
                                                operator).json()["id"])
    mine = wait_finished(http, scoped, post(http, "/bulk", {"filter": {"search": "id:*"}, "action": "cancel"},
                                            scoped).json()["id"])
    assert (mine["done"], mine["actor"]) == (1, "ci-operator")
    assert dict(Task.objects.values_list("pk", "stage")) == {"ci-1": "CANCELLED", "docs-1": "QUEUED"}
    assert_error(get(http, f"/bulk/{others['id']}", scoped), 404, "not_found")
    assert_error(post(http, f"/bulk/{others['id']}/stop", {}, scoped), 404, "not_found")
    assert [j["id"] for j in get(http, "/bulk", scoped).json()["items"]] == [mine["id"]]
    assert [j["id"] for j in get(http, "/bulk", operator).json()["items"]] == [mine["id"], others["id"]]
