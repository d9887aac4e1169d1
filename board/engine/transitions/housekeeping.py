"""The store's own housekeeping: admission of PENDING tasks whose dependencies have completed,
and the reclaim of expired leases (the reaper's sweep). Each task is its own CAS."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from board.engine import clock, outcomes, selectors, tracing
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
            if task is None or task.stage != Stage.PENDING or task.hold:
                continue
            if selectors.unfinished_deps(task_id, using=using):
                continue
            if _swap(using, task, Verb.ADMIT, now=clock.now(using), actor="system", guard=Q(hold=False)):
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
            guard = Q(lease_expires_at__lte=now)
            if attempts_left(task.attempts, task.max_retries):
                ok = _swap(using, task, Verb.RECLAIM, now=now, actor=actor, guard=guard,
                           detail=detail, **NO_LEASE)
            else:
                error = "lease expired on the last attempt"
                ok = _swap(using, task, Verb.FAIL, now=now, actor=actor, guard=guard,
                           detail={**detail, "error": error, "retryable": False}, last_error=error, **NO_LEASE)
                if ok:
                    outcomes.record(using, Verb.FAIL, outcomes.TERMINAL, "lease_expired")
            if ok:
                span.made(task)
                outcomes.record(using, Verb.RECLAIM if task.stage == Stage.QUEUED else Verb.FAIL,
                                outcomes.EXPIRED, "reaper")
                moved.append(Reclaimed(task_id, Stage(task.stage)))
    return moved
