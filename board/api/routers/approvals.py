"""Approval gates (issue 32, item 2; board.engine.approvals): a holder asks a person and gives its
lease up (`POST /api/tasks/{id}/request-approval`), an allowed approver answers (`POST
/api/tasks/{id}/answer`), and anyone who reads tasks lists them (`GET /api/approvals`). The
engine moves the task (board.engine.transitions.approvals); the board's Needs-you lane and the
admin answer through the same verb.
"""
from __future__ import annotations

from typing import Literal

from django.db.models import Q
from ninja import Router

from board import access
from board.api.auth import in_scope, require_agent, require_reader
from board.api.errors import ERRORS
from board.api.pagination import page_limit
from board.api.schemas import ApprovalAnswerIn, ApprovalPage, ApprovalRequestIn, ApprovalTaskOut
from board.engine import approvals, errors, selectors, transitions
from board.models import Approval
from board.public import public_task

router = Router()


def _task_and_approval(task, approval) -> dict:
    return {"task": public_task(task, selectors.deps_of_task(task)), "approval": approvals.public_approval(approval)}


@router.post("/tasks/{task_id}/request-approval", response={200: ApprovalTaskOut, **ERRORS},
             summary="Ask a person and give the lease up until the answer (the holder, with its token)")
def request_approval(request, task_id: str, body: ApprovalRequestIn):
    """The task moves to PAUSED waiting for the answer (`awaiting_approval`): the lease ends (its
    slots and resources are given back) and it shows in the board's Needs-you lane. The answer
    puts it back in QUEUED, kept for this agent for 60 s (claim it by id: `POST
    /api/tasks/{id}/claim`); its next claim carries the answer as `lease.approval`. Refused as a
    pause is: 409 `lease_lost` when the token is not the task's current lease."""
    require_agent(request)
    in_scope(request, task_id)
    task, approval = transitions.request_approval(
        task_id, body.token, body.question, form=body.form, approvers=body.approvers,
        timeout_seconds=body.timeout_seconds, on_timeout=body.on_timeout, checkpoint=body.checkpoint,
        agent=request.auth.name)
    return _task_and_approval(task, approval)


def _may_answer(request):
    """The permission rule (board.engine.approvals.may_answer) for this caller, judged by the
    engine on the approval as it reads it in the answer's transaction."""
    principal = request.auth
    if principal.agent:
        if not principal.operator:  # an agent's own key never answers: refused before anything is read
            raise errors.Forbidden("answering an approval needs an --operator key or a named approver's session")
        return None  # an operator key answers any approval
    return access.answer_rule(request.user)


@router.post("/tasks/{task_id}/answer", response={200: ApprovalTaskOut, **ERRORS},
             summary="Answer a task's waiting approval (its approvers, or operators)")
def answer(request, task_id: str, body: ApprovalAnswerIn):
    """An approver (a staff user named in `approvers`, by username or group; operators when it
    names none) or an operator key answers. One compare-and-swap: of two answers sent at once
    exactly one is written, the other is 409 `already_answered`. `values` must match the
    approval's form when approving (422 otherwise). The task goes back to QUEUED with the answer."""
    require_reader(request)
    in_scope(request, task_id)
    task, approval = transitions.answer(task_id, body.approve, actor=request.auth.name, values=body.values,
                                        comment=body.comment, approval_id=body.approval_id,
                                        may_answer=_may_answer(request))
    return _task_and_approval(task, approval)


@router.get("/tasks/{task_id}/approvals", response={200: ApprovalPage, **ERRORS},
            summary="Every approval a task asked for, oldest first")
def task_approvals(request, task_id: str):
    require_reader(request)
    in_scope(request, task_id)
    if not selectors.queues_of([task_id]):
        raise errors.NotFound(f"no task with id {task_id!r}")
    rows = Approval.objects.filter(task_id=task_id).order_by("id")
    return {"items": [approvals.public_approval(a) for a in rows], "next_after": None}


@router.get("/approvals", response={200: ApprovalPage, **ERRORS},
            summary="Approvals waiting for an answer (or answered, or all), oldest first")
def list_approvals(request, state: Literal["waiting", "answered", "all"] = "waiting", queue: str | None = None,
                   after: int | None = None, limit: int = 50):
    """`state=answered`: those that are no longer waiting (approved, rejected, timed out,
    cancelled). A key limited to some queues sees only their tasks' approvals."""
    require_reader(request)
    limit = page_limit(limit)
    rows = Approval.objects.all()
    if state == "waiting":
        rows = rows.filter(state=Approval.WAITING)
    elif state == "answered":
        rows = rows.exclude(state=Approval.WAITING)
    if queue is not None:
        rows = rows.filter(task__queue=queue)
    if request.auth.scope is not None:
        rows = rows.filter(selectors.in_scope(request.auth.scope, queue="task__queue"))
    if after is not None:
        rows = rows.filter(Q(pk__gt=after))
    page = list(rows.order_by("id")[:limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return {"items": [approvals.public_approval(a) for a in page], "next_after": page[-1].id if more else None}
