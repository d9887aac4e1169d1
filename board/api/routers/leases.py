"""Leases: claim (the next ready task, or a named one), resume, and the holder's verbs (renew,
release, complete, fail, pause). Claiming and holding are for agent keys only; each verb is one
call of board.engine.transitions.
"""
from __future__ import annotations

import math
import time

from django.conf import settings
from django.http import HttpResponse
from ninja import Router, Status

from board.api.auth import HOT_AUTH, Principal, in_scope, require_agent
from board.api.errors import ERRORS, respond
from board.api.routers.tasks import render_task
from board.api.schemas import (
    ClaimIn,
    ClaimNextIn,
    ClaimOut,
    CompleteIn,
    FailIn,
    PauseIn,
    ReleaseIn,
    RenewIn,
    ResumeIn,
    TaskOut,
    TokenIn,
)
from board.engine import scopes, selectors, transitions
from board.live import parked
from board.public import public_claim

router = Router()

# How often a waiting claim looks for work again when it is not served by the board's server
# (which parks it instead: board/live/parked.py).
CLAIM_POLL_SECONDS = 0.2


def render_claim(claim: transitions.Claim) -> dict:
    return public_claim(claim, selectors.deps_of_task(claim.task))


def _answer(request, data: dict):
    """The answer of a hot endpoint (claim, renew, complete), rendered as is. `public_task` and
    `public_claim` build exactly the documented shapes (TaskOut, ClaimOut); letting django-ninja
    validate that output again cost about 7% of a request's CPU. tests/test_api.py checks these
    answers against the schemas."""
    return respond(request, data, 200)


# ---------------------------------------------------------------------------------------------
# Claiming


@router.post("/claim", response={200: ClaimOut, 204: None, **ERRORS}, auth=HOT_AUTH,
             summary="Claim the next ready task (first in the claim order: priority, aging, fairness keys); 204 when none")
def claim_next(request, body: ClaimNextIn):
    """With `wait_seconds` the request waits (up to 30 s) for work to become ready instead of
    answering 204 at once. The lease token in the answer is shown only to this caller.

    Served by the board's own server (server/serving.py), a claim that finds nothing
    hands the wait back to the server, which parks the request without a thread or a database
    connection and replays it when a task becomes ready. Under another WSGI server (or Django's
    test client) the view polls by itself, holding its worker for the wait.

    A key limited to some queues takes only from them, without `queue` from any of them; a
    `queue` outside them has no work for it (204)."""
    require_agent(request)
    claim = transitions.claim_next(request.auth.name, body.ttl_seconds, queue=body.queue,
                                   request_id=body.request_id, key_hash=request.auth.key_hash,
                                   scope=request.auth.scope)
    if claim is not None:
        return _answer(request, render_claim(claim))
    if body.queue is not None and not scopes.allows(request.auth.scope, body.queue):
        return Status(204, None)  # (a queue outside a scoped key's queues never has work for it)
    # Ready work held back only by rates (a queue's, a rate key's): say when it opens (Retry-After), and a waiting
    # claim that would see it open within its wait is answered now, to come back then, rather
    # than parked and replayed while the rate keeps it shut.
    opens_in = selectors.seconds_until_rate_opens(body.queue, scope=request.auth.scope)
    if body.wait_seconds <= 0 or (opens_in is not None and opens_in < body.wait_seconds):
        response = HttpResponse(status=204)
        if opens_in is not None:
            response["Retry-After"] = str(max(1, math.ceil(opens_in)))
        return response
    if (parking := parked.parking_of(request)) is not None:  # the server parks it (board/live/parked.py)
        parking.park(body.wait_seconds, body.queue, request.auth.name,
                     body.model_dump_json(exclude_defaults=True).encode())
        return HttpResponse(status=204)
    conf = settings.TASKFLOW
    if not parked.thread_wait_slots.take(request.auth.name, conf["WSGI_MAX_WAITERS"], conf["MAX_WAITERS_PER_KEY"]):
        return _too_many_waiters(request, conf["WSGI_MAX_WAITERS"])
    try:
        return _poll_for_work(request.auth, body)
    finally:
        parked.thread_wait_slots.give_back(request.auth.name)


def _too_many_waiters(request, cap: int):
    """503 + Retry-After: this process already holds its waiting claims' worth of threads."""
    response = respond(request, {"error": {
        "code": "too_many_waiters",
        "message": (f"this server process already holds its cap of waiting claims ({cap}, or this agent's "
                    f"{settings.TASKFLOW['MAX_WAITERS_PER_KEY']}); retry shortly or claim without wait_seconds")}},
        503)
    response["Retry-After"] = "1"
    return response


def _poll_for_work(agent: Principal, body: ClaimNextIn):
    """A waiting claim outside the board's server (which parks it instead): look (without a
    transaction) a few times a second, claim when something is ready. It holds its thread for
    the wait, so the view lets at most WSGI_MAX_WAITERS of them run at once per process."""
    deadline = time.monotonic() + body.wait_seconds
    while (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(CLAIM_POLL_SECONDS, remaining))
        if selectors.has_ready_task(body.queue, scope=agent.scope):
            claim = transitions.claim_next(agent.name, body.ttl_seconds, queue=body.queue, request_id=body.request_id,
                                           key_hash=agent.key_hash, scope=agent.scope)
            if claim is not None:
                return Status(200, render_claim(claim))
    return Status(204, None)


@router.post("/tasks/{task_id}/claim", response={200: ClaimOut, **ERRORS}, summary="Claim this task")
def claim_task(request, task_id: str, body: ClaimIn):
    """With `request_id`, a retry of this claim (same agent, same id) while its lease is live
    gets that lease back instead of `taken`."""
    require_agent(request)
    in_scope(request, task_id)
    return render_claim(transitions.claim(task_id, request.auth.name, body.ttl_seconds,
                                          request_id=body.request_id))


@router.post("/tasks/{task_id}/resume", response={200: ClaimOut, **ERRORS},
             summary="Take a PAUSED task with a new lease; its checkpoint is on the task")
def resume_task(request, task_id: str, body: ResumeIn):
    require_agent(request)
    in_scope(request, task_id)
    return render_claim(transitions.resume(task_id, request.auth.name, body.ttl_seconds))


# ---------------------------------------------------------------------------------------------
# The holder's verbs


@router.post("/tasks/{task_id}/renew", response={200: ClaimOut, **ERRORS}, auth=HOT_AUTH,
             summary="Extend a live lease (same token and fence); optionally save checkpoint/progress")
def renew_task(request, task_id: str, body: RenewIn):
    require_agent(request)
    in_scope(request, task_id)
    claim = transitions.renew(task_id, body.token, body.ttl_seconds, checkpoint=body.checkpoint,
                              progress=body.progress, agent=request.auth.name, key_hash=request.auth.key_hash)
    return _answer(request, render_claim(claim))


@router.post("/tasks/{task_id}/release", response={200: TaskOut, **ERRORS},
             summary="Give the task back to the queue (the attempt is not counted); with retry_after_seconds, snooze it")
def release_task(request, task_id: str, body: ReleaseIn):
    require_agent(request)
    in_scope(request, task_id)
    return render_task(transitions.release(task_id, body.token, retry_after_seconds=body.retry_after_seconds,
                                           agent=request.auth.name))


@router.post("/tasks/{task_id}/complete", response={200: TaskOut, **ERRORS}, auth=HOT_AUTH,
             summary="Commit the result")
def complete_task(request, task_id: str, body: CompleteIn):
    require_agent(request)
    in_scope(request, task_id)
    return _answer(request, render_task(transitions.complete(task_id, body.token, body.result, agent=request.auth.name,
                                                             key_hash=request.auth.key_hash)))


@router.post("/tasks/{task_id}/fail", response={200: TaskOut, **ERRORS},
             summary="Record a failed attempt: back to QUEUED after a backoff while attempts remain "
                     "(and retryable), else FAILED")
def fail_task(request, task_id: str, body: FailIn):
    require_agent(request)
    in_scope(request, task_id)
    return render_task(transitions.fail(task_id, body.token, body.error, retryable=body.retryable,
                                         traceback=body.traceback, agent=request.auth.name))


@router.post("/tasks/{task_id}/pause", response={200: TaskOut, **ERRORS},
             summary="Release the lease and keep a checkpoint for a later resume")
def pause_task(request, task_id: str, body: PauseIn):
    require_agent(request)
    in_scope(request, task_id)
    return render_task(transitions.pause(task_id, body.token, body.checkpoint, agent=request.auth.name))
