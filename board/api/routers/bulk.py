"""Bulk actions on a filter (issue 33, item 1; board/bulk/, docs/bulk.md): one operator action on
every task a filter matches, run in the background as a job, each task one compare-and-swap held
to the version read when the job was created.

Who may: an operator key (a key limited to some queues acts on its queues' tasks only, and sees
only its own jobs), or staff with board.intervene, the permission every operator verb needs (board/access.py)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional, Union

from ninja import Field, Router, Schema, Status

from board.api.auth import require_operator
from board.api.errors import ERRORS
from board.api.schemas import StrictIn
from board.bulk import jobs
from board.engine import errors
from board.engine.limits import MAX_REASON_CHARS, MAX_TAGS

router = Router()

ActionName = Literal["retry", "requeue", "cancel", "pause", "admit", "release-stale", "set-priority", "add-tag",
                     "replay"]
assert set(ActionName.__args__) == set(jobs.ACTIONS)


class BulkFilterIn(StrictIn):
    search: Optional[str] = Field(None, description="a search line: `tag:urgent queue:ci-* created:>2h`")
    text: Optional[str] = Field(None, description="the id or the title contains it, in any case (the board's text box)")
    owner: Optional[str] = Field(None, description="the holder's name contains it, in any case (the board's owner box)")
    queue: Optional[str] = Field(None, description="a queue's name, or a pattern: `ci-*` (`*` any run, `?` one)")
    stage: Union[str, list[str], None] = Field(None, description="a stage, or a list of stages")
    tags: Optional[list[str]] = Field(None, max_length=MAX_TAGS, description="the task carries every one of them")


class BulkIn(StrictIn):
    filter: BulkFilterIn = Field(..., description="which tasks: every part given must match (at least one part)")
    action: ActionName
    reason: str = Field("", max_length=MAX_REASON_CHARS, description="kept in each task's history")
    priority: Optional[int] = Field(None, description="set-priority: the new priority")
    tag: Optional[str] = Field(None, description="add-tag: the tag added")
    dry_run: bool = Field(False, description="only count: answer how many tasks it would act on, start nothing")


class BulkCountOut(Schema):
    action: str
    total: int = Field(..., description="the tasks it acts on: matching, in a stage the action applies to")
    matching: int = Field(..., description="every task the filter matches, in any stage")
    description: str = Field(..., description='what it does, in words: "cancel 12,408 tasks in queue ci-*"')


class BulkJobOut(Schema):
    id: int
    action: str
    params: dict[str, Any]
    reason: str
    filter: dict[str, Any]
    actor: str
    state: str = Field(..., description="pending, running, stopping, stopped, done or failed")
    total: int
    matching: int
    done: int = Field(..., description="tasks moved")
    skipped: int = Field(..., description="tasks the action did not apply to when reached (skipped_reasons)")
    lost: int = Field(..., description="tasks that changed after the job read them: left as they were")
    skipped_reasons: dict[str, int] = Field(..., description="reason code -> count")
    problems: Optional[int] = Field(..., description="check()'s problems when it ended (null: not yet)")
    error: str
    created_at: datetime
    started_at: Optional[datetime]
    finished_at: Optional[datetime]


class BulkJobList(Schema):
    items: list[BulkJobOut]


@router.post("/bulk", response={200: BulkCountOut, 202: BulkJobOut, **ERRORS},
             summary="Operator: act on every task a filter matches, as a background job (or count them)")
def create_bulk(request, body: BulkIn):
    """With `dry_run`, the count only (200): how many tasks the action would move. Otherwise a job
    (202) that moves each of them once, held to the version read now: a task changed meanwhile is
    `lost` (left as it is), one the action no longer applies to is `skipped` (with its reason).
    Follow it with `GET /api/bulk/{id}` (or the board's "bulk" frames); stop it with
    `POST /api/bulk/{id}/stop`. A bad filter is 422 `validation_error`; more than 100,000 tasks,
    413 `too_large`; nothing is written."""
    principal = require_operator(request)
    checked = jobs.check_request(body.filter.model_dump(exclude_none=True), body.action, body.reason,
                                 body.priority, body.tag)
    if body.dry_run:
        return jobs.count(checked, scope=principal.scope)
    job = jobs.create(checked, actor=principal.name, scope=principal.scope)
    jobs.start_in_thread(job.pk)
    return Status(202, jobs.summary(job))


def _visible(principal, job):
    """A key limited to some queues sees only the jobs it made (another's may act on other
    queues): any other is absent to it, as a task outside its scope is."""
    if principal.scope is not None and job.actor != principal.name:
        raise errors.NotFound(f"no bulk job with id {job.pk}")
    return job


@router.get("/bulk", response={200: BulkJobList, **ERRORS}, summary="Operator: the 50 most recent bulk jobs")
def list_bulk(request):
    principal = require_operator(request)
    mine = principal.name if principal.scope is not None else None
    return {"items": [jobs.summary(job) for job in jobs.latest(50, actor=mine)]}


@router.get("/bulk/{job_id}", response={200: BulkJobOut, **ERRORS}, summary="Operator: a bulk job and its counts")
def get_bulk(request, job_id: int):
    principal = require_operator(request)
    return jobs.summary(_visible(principal, jobs.get(job_id)))


@router.post("/bulk/{job_id}/stop", response={200: BulkJobOut, **ERRORS},
             summary="Operator: stop a bulk job (the tasks it moved stay moved)")
def stop_bulk(request, job_id: int):
    """A pending job stops at once; a running one after the task it is on (`stopping`, then
    `stopped`). A finished job is answered as it is."""
    principal = require_operator(request)
    _visible(principal, jobs.get(job_id))
    return jobs.summary(jobs.stop(job_id))
