"""The store's own housekeeping: admission of PENDING tasks whose dependencies have completed,
the reclaim of expired leases and the deadlines beside the lease (the reaper's sweep). Each task
is its own CAS."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from board.engine import clock, deadlines, outcomes, selectors, tracing
from board.engine.lifecycle import Stage, Verb, attempts_left
from board.engine.stores import retry_conflicts, store
from board.engine.transitions.cas import NO_LEASE, _swap
from board.models import Task


@retry_conflicts
def admit_ready(task_ids: Iterable[str] | None = None, *, using: str = "default") -> list[str]:
    """Admit every PENDING task, not on hold, whose dependencies are all COMPLETED (only among
    `task_ids` when given). Each admission is its own CAS; returns the ids admitted.

    Called after a completion commits, after a creation commits, and by the reaper's sweep, so
    a task can never stay blocked on a dependency that has completed."""
    candidates = selectors.admission_candidates(task_ids, using=using)
    admitted = []
    for task_id in candidates:
        with store(using).write_transaction():
            task = Task.objects.using(using).filter(pk=task_id).first()
            if task is None or task.stage != Stage.PENDING or task.on_hold:
                continue
            if selectors.unfinished_deps(task_id, using=using):
                continue
            if _swap(using, task, Verb.ADMIT, now=clock.now(using), actor="system", guard=Q(on_hold=False)):
                admitted.append(task_id)
    return admitted


# ---------------------------------------------------------------------------------------------
# The store's own housekeeping


@dataclass(frozen=True)
class Reclaimed:
    task_id: str
    to_stage: Stage


@retry_conflicts
def reclaim_expired(*, now: datetime | None = None, limit: int = 500, task_ids: Iterable[str] | None = None,
                    actor: str = "system:reaper", using: str = "default") -> list[Reclaimed]:
    """Take back every lease that expired by `now` (default: this store's clock): the task goes
    back to QUEUED, or to FAILED when its attempts are spent. Live leases are never touched.
    Each task is its own CAS; returns what was moved."""
    now = now or clock.now(using)
    moved = []
    for task_id in selectors.expired_leases(now, limit=limit, task_ids=task_ids, using=using):
        with tracing.moving(Verb.RECLAIM, task_id) as span, store(using).write_transaction():
            task = Task.objects.using(using).filter(pk=task_id).first()
            if task is None or task.stage != Stage.RUNNING or not task.lease_expires_at or task.lease_expires_at > now:
                continue  # renewed or finished meanwhile
            # The reason, as a failure's error is: the attempt timeline shows why the attempt ended.
            detail = {"previous_owner": task.owner, "lease_expired_at": task.lease_expires_at.isoformat(),
                      "reason": "lease expired"}
            ok = _take_lease_back(using, task, now, actor, detail, "lease expired on the last attempt",
                                  "lease_expired", guard=Q(lease_expires_at__lte=now))
            if ok:
                span.made(task)
                outcomes.record(using, Verb.RECLAIM if task.stage == Stage.QUEUED else Verb.FAIL,
                                outcomes.EXPIRED, "reaper")
                moved.append(Reclaimed(task_id, Stage(task.stage)))
    return moved


@dataclass(frozen=True)
class Enforced:
    """A task moved by the deadline pass: where to, and why (the history's reason)."""

    task_id: str
    to_stage: Stage
    reason: str


@retry_conflicts
def enforce_deadlines(*, now: datetime | None = None, limit: int = 500, task_ids: Iterable[str] | None = None,
                      actor: str = "system:reaper", using: str = "default") -> list[Enforced]:
    """Apply every deadline (board.engine.deadlines) that has passed by `now` (default: this
    store's clock): a task QUEUED past its queue timeout goes to FAILED ("not started in time");
    a RUNNING task past its attempt or progress timeout loses its lease as an expired one does
    (back to QUEUED, or FAILED when its attempts are spent), however recently it renewed. Each
    task is its own CAS, recorded in the history with its reason; returns what was moved.

    Each CAS is held to what its deadline was computed from, not to the version: the task's
    stage and the time it entered it (and not_before for the queue clock; the lease's fence and
    token and progress_changed_at for the RUNNING ones). So a renew that only repeats its
    progress does not save the lease, while a claim, a release, a completion or a renew that
    made progress, committed first, makes the move refuse (and the next pass judges afresh). The
    lease's token goes with the move: the holder's later renew, complete, fail, pause or release
    is LeaseLost."""
    now = now or clock.now(using)
    moved = []
    for task_id in selectors.overdue_deadlines(now, limit=limit, task_ids=task_ids, using=using):
        with store(using).write_transaction():
            task = Task.objects.using(using).filter(pk=task_id).first()
            late = deadlines.overdue(task, now) if task is not None else None
            if late is None:
                continue  # claimed, finished, or made progress meanwhile
            detail = {"reason": late.reason, deadlines.TIMEOUT_FIELDS[late.kind]: late.timeout_seconds,
                      "due_at": late.at.isoformat()}
            if late.kind == deadlines.QUEUE:
                ok = _expire(using, task, now, actor, detail)
            else:
                ok = _take_back(using, task, late, now, actor, detail)
            if ok:
                moved.append(Enforced(task_id, Stage(task.stage), late.reason))
    return moved


def _expire(using: str, task: Task, now: datetime, actor: str, detail: dict) -> bool:
    """QUEUED -> FAILED: not started within its queue timeout. Terminal as a failure without
    retries is: an operator may requeue it."""
    error = f"not started in time: claimable for {detail['queue_timeout_seconds']} s without starting"
    guard = Q(stage_changed_at=task.stage_changed_at, not_before=task.not_before)
    with tracing.moving(Verb.EXPIRE, task.pk) as span:
        ok = _swap(using, task, Verb.EXPIRE, now=now, actor=actor, guard=guard, pin_version=False,
                   detail={**detail, "error": error, "retryable": False}, last_error=error)
        if ok:
            span.made(task)
            outcomes.record(using, Verb.EXPIRE, outcomes.TERMINAL, "deadline")
    return ok


def _take_back(using: str, task: Task, late: deadlines.Overdue, now: datetime, actor: str,
               detail: dict) -> bool:
    """RUNNING -> QUEUED (RECLAIM), or FAILED on the last attempt, as reclaim_expired moves an
    expired lease, with the deadline's reason."""
    detail = {"previous_owner": task.owner, **detail}
    guard = Q(stage_changed_at=task.stage_changed_at, fence=task.fence)
    if late.kind == deadlines.PROGRESS:
        guard &= Q(progress_changed_at=task.progress_changed_at)
    with tracing.moving(Verb.RECLAIM, task.pk) as span:
        ok = _take_lease_back(using, task, now, actor, detail, f"{late.reason} on the last attempt", "deadline",
                              guard=guard, token_hash=task.lease_token_hash, pin_version=False)
        if ok:
            span.made(task)
    return ok


def _take_lease_back(using: str, task: Task, now: datetime, actor: str, detail: dict, last_error: str,
                     terminal_reason: str, **held) -> bool:
    """The reaper's move of a lease it takes back (expired, or past a deadline): RUNNING -> QUEUED
    (RECLAIM), or FAILED with `last_error` when the task's attempts are spent. `held`: what the
    CAS is held to besides the stage (guard, token hash, version)."""
    if attempts_left(task.attempts, task.max_retries):
        return _swap(using, task, Verb.RECLAIM, now=now, actor=actor, detail=detail, **held, **NO_LEASE)
    ok = _swap(using, task, Verb.FAIL, now=now, actor=actor, detail={**detail, "error": last_error, "retryable": False},
               last_error=last_error, **held, **NO_LEASE)
    if ok:
        outcomes.record(using, Verb.FAIL, outcomes.TERMINAL, terminal_reason)
    return ok
