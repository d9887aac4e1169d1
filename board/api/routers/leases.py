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
    ClaimBatchOut,
    ClaimIn,
    ClaimNextIn,
    ClaimOut,
    CompleteBatchIn,
    CompleteBatchOut,
    CompleteIn,
    FailIn,
    NextIn,
    PauseIn,
    ReleaseIn,
    RenewIn,
    ResumeIn,
    TaskNextOut,
    TaskOut,
)
from board import metrics
from board.engine import capabilities, errors, handoffs, scopes, selectors, transitions, usage
from board.live import parked
from board.public import public_claim

router = Router()

# How often a waiting claim looks for work again when it is not served by the board's server
# (which parks it instead: board/live/parked.py).
CLAIM_POLL_SECONDS = 0.2


def render_claim(claim: transitions.Claim, *, handoff: bool = True) -> dict:
    """A claim's answer, with the hand-offs (the dependencies' results, the notes) unless it
    answers a renew (`handoff=False`: the holder has them)."""
    deps = selectors.deps_of_task(claim.task)
    return public_claim(claim, deps, handoffs.for_claim(claim.task, deps) if handoff else None)


def _answer(request, data: dict):
    """The answer of a hot endpoint (claim, renew, complete), rendered as is. `public_task` and
    `public_claim` build exactly the documented shapes (TaskOut, ClaimOut); letting django-ninja
    validate that output again cost about 7% of a request's CPU. tests/test_api.py checks these
    answers against the schemas."""
    return respond(request, data, 200)


# ---------------------------------------------------------------------------------------------
# Claiming


def document_batch_claim(schema: dict) -> None:
    """Add the answer of a batch claim (max_tasks) to the API's OpenAPI document (BoardAPI).
    OpenAPI cannot tie an answer's shape to a request field, and ClaimOut stays the 200 answer of
    every claim sent without max_tasks (a client written against it never sees another): the
    batch's shape, ClaimBatchOut, is documented beside it, as an extension of the 200 answer."""
    batch = ClaimBatchOut.model_json_schema(ref_template="#/components/schemas/{model}")
    batch.pop("$defs", None)  # ClaimOut and its parts are in the document already
    schema["components"]["schemas"]["ClaimBatchOut"] = batch
    responses = schema["paths"]["/api/claim"]["post"]["responses"]
    responses[200 if 200 in responses else "200"]["x-with-max-tasks"] = {
        "description": "the answer when the request sent max_tasks: up to that many leases, in claim order",
        "schema": {"$ref": "#/components/schemas/ClaimBatchOut"}}


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
    `queue` outside them has no work for it (204).

    With `max_tasks` the answer is `{"leases": [{task, lease}, ...]}`: up to that many claims in
    claim order, each its own lease, in one transaction on SQLite and PostgreSQL (204 when none;
    a waiting batch is answered as soon as one task is ready)."""
    require_agent(request)
    caps = _capabilities(request.auth, body)
    if body.max_tasks is not None:
        return _claim_batch(request, body, caps)
    claim = transitions.claim_next(request.auth.name, body.ttl_seconds, queue=body.queue,
                                   request_id=body.request_id, key_hash=request.auth.key_hash,
                                   scope=request.auth.scope, capabilities=caps)
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
    return _wait_for_work(request, body, lambda: transitions.claim_next(
        request.auth.name, body.ttl_seconds, queue=body.queue, request_id=body.request_id,
        key_hash=request.auth.key_hash, scope=request.auth.scope, capabilities=caps), lambda claim: render_claim(claim))


def _capabilities(auth: Principal, body) -> tuple[str, ...]:
    """The claim's capabilities (board.engine.capabilities): its key's, or the subset `body`
    names (a label the key lacks: 403 before anything is read)."""
    return capabilities.narrowed(auth.capabilities, body.capabilities)


def _claim_batch(request, body: ClaimNextIn, caps: tuple[str, ...]):
    """POST /api/claim with max_tasks: {"leases": [...]}, or 204 (after waiting, as a claim waits)."""
    auth = request.auth

    def claim_batch():
        return transitions.claim_batch(auth.name, body.ttl_seconds, body.max_tasks, queue=body.queue,
                                       request_id=body.request_id, key_hash=auth.key_hash, scope=auth.scope,
                                       capabilities=caps) or None

    claims = claim_batch()
    if claims:
        return _answer(request, _render_leases(claims))
    if body.queue is not None and not scopes.allows(auth.scope, body.queue):
        return Status(204, None)
    return _wait_for_work(request, body, claim_batch, _render_leases)


def _render_leases(claims: list[transitions.Claim]) -> dict:
    return {"leases": [render_claim(claim) for claim in claims]}


def _wait_for_work(request, body: ClaimNextIn, claim, render):
    """A claim (or a batch: `claim`, which answers None for nothing) that found no ready work:
    204 at once, or (wait_seconds) wait for work and claim it then, answering render(claim)."""
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
                     body.model_dump_json(exclude_defaults=True).encode(), _capabilities(request.auth, body))
        return HttpResponse(status=204)
    conf = settings.TASKFLOW
    if not parked.thread_wait_slots.take(request.auth.name, conf["WSGI_MAX_WAITERS"], conf["MAX_WAITERS_PER_KEY"]):
        return _too_many_waiters(request, conf["WSGI_MAX_WAITERS"])
    try:
        found = _poll_for_work(request.auth, body, claim)
    finally:
        parked.thread_wait_slots.give_back(request.auth.name)
    return Status(204, None) if found is None else _answer(request, render(found))


def _too_many_waiters(request, cap: int):
    """503 + Retry-After: this process already holds its waiting claims' worth of threads."""
    response = respond(request, {"error": {
        "code": "too_many_waiters",
        "message": (f"this server process already holds its cap of waiting claims ({cap}, or this agent's "
                    f"{settings.TASKFLOW['MAX_WAITERS_PER_KEY']}); retry shortly or claim without wait_seconds")}},
        503)
    response["Retry-After"] = "1"
    return response


def _poll_for_work(agent: Principal, body: NextIn, claim):
    """A waiting claim outside the board's server (which parks it instead), or the claim that
    follows a finishing move (`next` with wait_seconds): look (without a transaction) a few
    times a second, `claim()` when something is ready; what it got, or None when the wait ended
    with nothing. It holds its thread for the wait, so its callers let at most WSGI_MAX_WAITERS
    of them run at once per process (parked.thread_wait_slots)."""
    deadline = time.monotonic() + body.wait_seconds
    while (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(CLAIM_POLL_SECONDS, remaining))
        if selectors.has_ready_task(body.queue, scope=agent.scope, capabilities=_capabilities(agent, body)):
            found = claim()
            if found is not None:
                return found
    return None


@router.post("/tasks/{task_id}/claim", response={200: ClaimOut, **ERRORS}, summary="Claim this task")
def claim_task(request, task_id: str, body: ClaimIn):
    """With `request_id`, a retry of this claim (same agent, same id) while its lease is live
    gets that lease back instead of `taken`."""
    require_agent(request)
    caps = _capabilities(request.auth, body)
    in_scope(request, task_id)
    # Rendered as is, as the hot claims are: through ClaimOut the hand-off fields a task
    # without dependencies or notes does not have would come back as nulls.
    return _answer(request, render_claim(transitions.claim(task_id, request.auth.name, body.ttl_seconds,
                                                           request_id=body.request_id, capabilities=caps)))


@router.post("/tasks/{task_id}/resume", response={200: ClaimOut, **ERRORS},
             summary="Take a PAUSED task with a new lease; its checkpoint is on the task")
def resume_task(request, task_id: str, body: ResumeIn):
    require_agent(request)
    caps = _capabilities(request.auth, body)
    in_scope(request, task_id)
    return _answer(request, render_claim(transitions.resume(task_id, request.auth.name, body.ttl_seconds,
                                                            capabilities=caps)))


# ---------------------------------------------------------------------------------------------
# The holder's verbs


@router.post("/tasks/{task_id}/renew", response={200: ClaimOut, **ERRORS}, auth=HOT_AUTH,
             summary="Extend a live lease (same token and fence); optionally save checkpoint/progress")
def renew_task(request, task_id: str, body: RenewIn):
    require_agent(request)
    in_scope(request, task_id)
    reported = _usage_of(body.usage)
    claim = transitions.renew(task_id, body.token, body.ttl_seconds, checkpoint=body.checkpoint,
                              progress=body.progress, agent=request.auth.name, key_hash=request.auth.key_hash)
    _record_usage(request, claim.task, claim.lease.fence, reported)
    return _answer(request, render_claim(claim, handoff=False))


@router.post("/tasks/{task_id}/release", response={200: TaskNextOut, **ERRORS},
             summary="Give the task back to the queue (the attempt is not counted); with retry_after_seconds, snooze it")
def release_task(request, task_id: str, body: ReleaseIn):
    """With `next`, then claim the next ready task (see complete)."""
    require_agent(request)
    in_scope(request, task_id)
    if body.next is not None:
        return _then_next(request, body.next, lambda next_claim, caps: transitions.release_and_claim(
            task_id, body.token, next_claim, retry_after_seconds=body.retry_after_seconds, agent=request.auth.name,
            key_hash=request.auth.key_hash, scope=request.auth.scope, capabilities=caps))
    # Rendered as is (not through TaskNextOut, which would add "next": null to an answer that
    # never had it).
    return _answer(request, render_task(transitions.release(
        task_id, body.token, retry_after_seconds=body.retry_after_seconds, agent=request.auth.name)))


@router.post("/tasks/{task_id}/complete", response={200: TaskNextOut, **ERRORS}, auth=HOT_AUTH,
             summary="Commit the result; with `next`, claim the next task in the same call")
def complete_task(request, task_id: str, body: CompleteIn):
    """With `next` ({ttl_seconds, queue?, wait_seconds?, request_id?}: POST /api/claim's
    fields), the next ready task is claimed for this agent once the task is completed, and the
    answer (the completed task, as without it) gains `next`: {task, lease}, or null when no task
    was ready (after waiting up to wait_seconds, which starts once the completion has committed).
    A refused completion claims nothing and answers its error. On SQLite and PostgreSQL the
    completion and the claim are one transaction; on MongoDB two (docs/api.md)."""
    require_agent(request)
    in_scope(request, task_id)
    reported = _usage_of(body.usage)
    if body.next is not None:
        return _then_next(request, body.next, lambda next_claim, caps: transitions.complete_and_claim(
            task_id, body.token, body.result, next_claim, agent=request.auth.name, key_hash=request.auth.key_hash,
            scope=request.auth.scope, capabilities=caps), reported)
    task = transitions.complete(task_id, body.token, body.result, agent=request.auth.name, key_hash=request.auth.key_hash)
    _record_usage(request, task, task.fence, reported)
    return _answer(request, render_task(task))


@router.post("/tasks/{task_id}/fail", response={200: TaskNextOut, **ERRORS},
             summary="Record a failed attempt: back to QUEUED after a backoff while attempts remain "
                     "(and retryable), else FAILED")
def fail_task(request, task_id: str, body: FailIn):
    """With `next`, then claim the next ready task (see complete)."""
    require_agent(request)
    in_scope(request, task_id)
    reported = _usage_of(body.usage)
    if body.next is not None:
        return _then_next(request, body.next, lambda next_claim, caps: transitions.fail_and_claim(
            task_id, body.token, body.error, next_claim, retryable=body.retryable, traceback=body.traceback,
            agent=request.auth.name, key_hash=request.auth.key_hash, scope=request.auth.scope,
            capabilities=caps), reported)
    task = transitions.fail(task_id, body.token, body.error, retryable=body.retryable, traceback=body.traceback,
                            agent=request.auth.name)
    _record_usage(request, task, task.fence, reported)
    return _answer(request, render_task(task))  # as is: see release


def _usage_of(body_usage) -> dict | None:
    """A usage report as the engine takes it (board.engine.usage), checked before the move."""
    return None if body_usage is None else usage.checked(body_usage.model_dump())


def _record_usage(request, task, fence: int, reported: dict | None) -> None:
    """After the holder's move was accepted: write its usage report, count it for /metrics."""
    if reported is not None:
        usage.record(task, fence, request.auth.name, reported)
        metrics.on_usage(reported)


def _then_next(request, body: NextIn, move, reported: dict | None = None):
    """A finishing move with `next`: `move(NextClaim)` makes it and the claim (the engine,
    board.engine.transitions.batches); then, when nothing was ready and the agent may wait, the
    wait, after the move's commit (no transaction is held meanwhile), under the same caps as
    a waiting claim's thread (parked.thread_wait_slots). When every slot is taken the answer
    comes at once with next null: the move has committed, so it is never refused now."""
    auth = request.auth
    caps = _capabilities(auth, body)
    next_claim = transitions.NextClaim(ttl_seconds=body.ttl_seconds, queue=body.queue, request_id=body.request_id)
    task, claim = move(next_claim, caps)
    _record_usage(request, task, task.fence, reported)
    if (claim is None and body.wait_seconds > 0
            and (body.queue is None or scopes.allows(auth.scope, body.queue))):
        conf = settings.TASKFLOW
        if parked.thread_wait_slots.take(auth.name, conf["WSGI_MAX_WAITERS"], conf["MAX_WAITERS_PER_KEY"]):
            try:
                claim = _poll_for_work(auth, body, lambda: transitions.claim_next(
                    auth.name, body.ttl_seconds, queue=body.queue, request_id=body.request_id,
                    key_hash=auth.key_hash, scope=auth.scope, capabilities=caps))
            finally:
                parked.thread_wait_slots.give_back(auth.name)
    answer = render_task(task)
    answer["next"] = None if claim is None else render_claim(claim)
    return _answer(request, answer)


@router.post("/complete", response={200: CompleteBatchOut, **ERRORS}, auth=HOT_AUTH,
             summary="Complete several tasks: each item its own move; per-item outcomes in order")
def complete_batch(request, body: CompleteBatchIn):
    """Each item ({id, token, result, usage?}) is completed as POST /api/tasks/{id}/complete would,
    each its own compare-and-swap: the answer has one entry per item, in order, `{"id", "ok": true,
    "task"}` or `{"id", "ok": false, "error": {"code", "message"}}`; one refused item writes and
    undoes nothing. A bad batch (empty, over 100 items, a task named twice, a null result) is refused
    whole with 422 and nothing is written."""
    require_agent(request)
    auth = request.auth
    hidden: set[str] = set()
    if auth.scope is not None:  # a task outside a scoped key's queues is absent to it (in_scope)
        ids = [item.id for item in body.items]
        queues = selectors.queues_of(ids)
        hidden = {task_id for task_id in ids if task_id not in queues or not scopes.allows(auth.scope, queues[task_id])}
    # Each item's usage report is checked before anything moves (a bad one refuses the batch,
    # 422), and written after its own completion was accepted, as complete's is.
    reports = {item.id: _usage_of(item.usage) for item in body.items}
    items = [transitions.CompleteItem(item.id, item.token, item.result) for item in body.items
             if item.id not in hidden]
    outcomes = iter(transitions.complete_batch(items, agent=auth.name, key_hash=auth.key_hash) if items else ())
    answer = []
    for item in body.items:
        if item.id in hidden:
            outcome: object = errors.NotFound(f"no task with id {item.id!r}")
        else:
            outcome = next(outcomes)
        if isinstance(outcome, errors.BoardError):
            answer.append({"id": item.id, "ok": False, "error": {"code": outcome.code, "message": outcome.message}})
        else:
            _record_usage(request, outcome, outcome.fence, reports[item.id])
            answer.append({"id": item.id, "ok": True, "task": render_task(outcome)})
    return _answer(request, {"items": answer})


@router.post("/tasks/{task_id}/pause", response={200: TaskOut, **ERRORS},
             summary="Release the lease and keep a checkpoint for a later resume")
def pause_task(request, task_id: str, body: PauseIn):
    require_agent(request)
    in_scope(request, task_id)
    return render_task(transitions.pause(task_id, body.token, body.checkpoint, agent=request.auth.name))
