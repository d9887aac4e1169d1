"""Operators' verbs: admit, requeue, cancel, force-release, force-pause, and replay (run a finished
task again as new). Each needs operator rights
(a key created with --operator, or the board.intervene permission) and names the version it saw.
"""
from __future__ import annotations

from ninja import Router, Status

from board.api.auth import in_scope, require_operator
from board.api.errors import ERRORS
from board.api.routers.tasks import render_task
from board.api.schemas import OperatorIn, ReplayIn, RequeueIn, TaskOut
from board.engine import transitions
from board.engine.inputs import json_field

router = Router()


@router.post("/tasks/{task_id}/admit", response={200: TaskOut, **ERRORS}, summary="Operator: admit a PENDING task (on hold, or whose dependencies have completed)")
def admit_task(request, task_id: str, body: OperatorIn):
    actor = require_operator(request).name
    in_scope(request, task_id)
    return render_task(transitions.admit(task_id, actor=actor, version=body.version, reason=body.reason))


@router.post("/tasks/{task_id}/requeue", response={200: TaskOut, **ERRORS},
             summary="Operator: FAILED or PAUSED back to QUEUED")
def requeue_task(request, task_id: str, body: RequeueIn):
    actor = require_operator(request).name
    in_scope(request, task_id)
    return render_task(transitions.requeue(task_id, actor=actor, version=body.version,
                                           reset_attempts=body.reset_attempts, reason=body.reason))


@router.post("/tasks/{task_id}/cancel", response={200: TaskOut, **ERRORS}, summary="Operator: cancel a task")
def cancel_task(request, task_id: str, body: OperatorIn):
    actor = require_operator(request).name
    in_scope(request, task_id)
    return render_task(transitions.cancel(task_id, actor=actor, version=body.version, reason=body.reason))


@router.post("/tasks/{task_id}/force-release", response={200: TaskOut, **ERRORS},
             summary="Operator: take a RUNNING task from its holder back to QUEUED")
def force_release_task(request, task_id: str, body: OperatorIn):
    actor = require_operator(request).name
    in_scope(request, task_id)
    return render_task(transitions.force_release(task_id, actor=actor, version=body.version, reason=body.reason))


@router.post("/tasks/{task_id}/force-pause", response={200: TaskOut, **ERRORS},
             summary="Operator: pause a RUNNING task, keeping its last saved checkpoint")
def force_pause_task(request, task_id: str, body: OperatorIn):
    actor = require_operator(request).name
    in_scope(request, task_id)
    return render_task(transitions.force_pause(task_id, actor=actor, version=body.version, reason=body.reason))


@router.post("/tasks/{task_id}/replay", response={201: TaskOut, **ERRORS},
             summary="Operator: run a finished task again as a new task (a copy linked by replay_of)")
def replay_task(request, task_id: str, body: ReplayIn):
    """A COMPLETED, FAILED or CANCELLED task runs again as a new task: a copy of what its
    creator said (title, description, payload, queue, priority, retries, keys, tags, deadlines,
    dependencies), with `payload` instead when given, under `id` (else generated); its
    `replay_of` names the original, which is not touched (its replays: `search=replay_of:ID`).
    409 `invalid_transition` for a task that has not finished, or whose dependency never will."""
    actor = require_operator(request).name
    in_scope(request, task_id)
    json_field("payload", body.payload)
    copy = transitions.replay(task_id, actor=actor, payload=body.payload, new_id=body.id)
    return Status(201, render_task(copy))
