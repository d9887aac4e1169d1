"""The operators' verbs: admit (a PENDING task, on hold or not), requeue, cancel,
force_release, force_pause, edit. Each is held to the `version` the operator saw when given
(VersionConflict if the task changed since); without it, applied to the task as it is now, if
still legal. An operator's reason is checked here for every caller."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.db.models import Q

from board.engine import approvals, clock, errors, outcomes, search, selectors, tracing
from board.engine.inputs import reason_text
from board.engine.lifecycle import Stage, Verb, attempts_left, target
from board.engine.stores import TransactionConflict, retry_conflicts, store
from board.engine.transitions import approvals as approval_moves
from board.engine.transitions.cas import NO_LEASE, RACE_RETRIES, _get, _illegal, _swap
from board.engine.transitions.creation import TaskSpec, _validate_spec
from board.models import LIVE_STAGES, Task


# ---------------------------------------------------------------------------------------------
# Admission: PENDING -> QUEUED


@tracing.traced(Verb.ADMIT)
@outcomes.refusals(Verb.ADMIT)
@retry_conflicts
def admit(task_id: str, *, actor: str, version: int | None = None, reason: str = "",
          using: str = "default") -> Task:
    """Operator: admit a PENDING task (on hold or not) whose dependencies are all COMPLETED."""
    reason_text(reason)

    def move(task: Task, now: datetime) -> bool:
        if task.stage != Stage.PENDING:
            raise _illegal(task, Verb.ADMIT)
        unfinished = selectors.unfinished_deps(task.pk, using=using)
        if unfinished:
            raise errors.Blocked(f"waiting for {', '.join(sorted(unfinished))}", task=task)
        return _swap(using, task, Verb.ADMIT, now=now, actor=actor, detail=_reason(reason), on_hold=False)

    return _operator_move(using, task_id, version, move)


# ---------------------------------------------------------------------------------------------
# Operators' verbs: requeue, cancel, force_release (and admit, above). With `version` the move
# is refused with VersionConflict if the task changed since; without it, the move is applied
# to the task as it is now, if still legal.


def _operator_move(using: str, task_id: str, version: int | None, move) -> Task:
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            if version is not None and task.version != version:
                raise errors.VersionConflict(
                    f"task {task.pk} is at version {task.version}, not {version}", task=task
                )
            if move(task, now):
                return task
            if version is not None:
                raise errors.VersionConflict(f"task {task.pk} changed meanwhile", task=_get(using, task_id))
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


@tracing.traced(Verb.REQUEUE)
@outcomes.refusals(Verb.REQUEUE)
@retry_conflicts
def requeue(
    task_id: str, *, actor: str, version: int | None = None, reset_attempts: bool = False,
    reason: str = "", using: str = "default",
) -> Task:
    """Operator: put a FAILED or PAUSED task back in the queue (PAUSED keeps its checkpoint).
    With no attempt left it is refused unless `reset_attempts`."""
    reason_text(reason)

    def move(task: Task, now: datetime) -> bool:
        if task.stage not in (Stage.FAILED, Stage.PAUSED):
            raise _illegal(task, Verb.REQUEUE, "only FAILED or PAUSED tasks are requeued")
        approvals.refuse_awaiting(task, Verb.REQUEUE)
        attempts = 0 if reset_attempts else task.attempts
        if not attempts_left(attempts, task.max_retries):
            raise errors.InvalidTransition(
                f"task {task.pk} has no attempt left; requeue with reset_attempts", task=task,
                field="reset_attempts",
            )
        # A FAILED task's dedup_key is free for a new task: taking it back is refused while
        # another live task holds it. The look gives the clear answer; the live tasks' unique
        # index on the key refuses a holder that arrives after it (the verb then runs again).
        _refuse_held_dedup_key(using, task)
        try:
            with store(using).savepoint():
                return _swap(using, task, Verb.REQUEUE, now=now, actor=actor, attempts=attempts,
                             not_before=None, detail=_reason(reason, reset_attempts=reset_attempts))
        except IntegrityError:
            if task.dedup_key is None:
                raise
            raise TransactionConflict(f"a live task took dedup_key {task.dedup_key!r} meanwhile") from None

    return _operator_move(using, task_id, version, move)


def _refuse_held_dedup_key(using: str, task: Task) -> None:
    if task.dedup_key is None or task.stage in LIVE_STAGES:
        return
    holder = Task.objects.using(using).filter(dedup_key=task.dedup_key, stage__in=LIVE_STAGES).first()
    if holder is not None:
        raise errors.InvalidTransition(
            f"task {task.pk} cannot be requeued: its dedup_key {task.dedup_key!r} is held by the live "
            f"task {holder.pk}", task=task, field="dedup_key", held_by=holder.pk)


@tracing.traced(Verb.CANCEL)
@outcomes.refusals(Verb.CANCEL)
@retry_conflicts
def cancel(task_id: str, *, actor: str, version: int | None = None, reason: str = "", using: str = "default") -> Task:
    """Operator: cancel a task that has not finished. A live lease is ended: its holder's
    later calls get LeaseLost."""
    reason_text(reason)

    def move(task: Task, now: datetime) -> bool:
        if target(task.stage, Verb.CANCEL) is None:
            raise _illegal(task, Verb.CANCEL)
        awaiting = task.awaiting_approval
        if not _swap(using, task, Verb.CANCEL, now=now, actor=actor, detail=_reason(reason), awaiting_approval=False,
                     **NO_LEASE):
            return False
        if awaiting:  # its question is withdrawn with it (board.engine.approvals)
            approval_moves.cancel_waiting(using, task, now, actor)
        return True

    return _operator_move(using, task_id, version, move)


# -- force release held to the lease the operator saw -----------------------------------------
# An operator who decides to take a task from its holder decides about that holder's lease, not
# about one version of the row: every renew bumps the version, so a confirmation held to the
# version lost to any holder renewing while the operator read the page. With `held_by=(owner,
# fence)` the move applies while that same lease (same holder, same fence) is still the task's,
# however often it was renewed; a lease that changed hands (a new fence, even under the same
# agent name) or a task no longer RUNNING is a VersionConflict carrying the current row.
#
# It is one compare-and-swap like every other move, on (stage, owner, fence, attempts) instead
# of the version: a renew committed between the read and the CAS leaves the lease the same, so
# the CAS still matches (on PostgreSQL it waits for the renew's row lock and re-checks the row
# as renewed); the holder's renew after it finds its lease gone. No row lock is taken.


def _refuse_another_lease(task: Task, held_by: tuple[str, int] | None) -> None:
    if held_by is None:
        return
    owner, fence = held_by
    if task.stage != Stage.RUNNING or task.owner != owner or task.fence != fence:
        raise errors.VersionConflict(
            f"task {task.pk} no longer holds the lease you saw ({owner}'s, fence {fence})", task=task,
        )


@tracing.traced(Verb.FORCE_RELEASE)
@outcomes.refusals(Verb.FORCE_RELEASE)
@retry_conflicts
def force_release(task_id: str, *, actor: str, version: int | None = None, reason: str = "",
                  held_by: tuple[str, int] | None = None, using: str = "default") -> Task:
    """Operator: take a RUNNING task from its holder, live lease or not, back to QUEUED. The
    holder's later calls get LeaseLost and the next claim gets a higher fence. `held_by`:
    only while that (owner, fence) still holds it (see above)."""
    reason_text(reason)

    def move(task: Task, now: datetime) -> bool:
        _refuse_another_lease(task, held_by)
        if task.stage != Stage.RUNNING:
            raise _illegal(task, Verb.FORCE_RELEASE, "only a RUNNING task holds a lease")
        detail = _reason(reason, previous_owner=task.owner)
        # Held to the lease (and to the attempts its claim counted, which the release gives
        # back), not to the version, unless the caller also gave a version.
        to_lease = held_by is not None and version is None
        guard = Q(owner=task.owner, fence=task.fence, attempts=task.attempts) if to_lease else None
        return _swap(using, task, Verb.FORCE_RELEASE, now=now, actor=actor, detail=detail, guard=guard,
                     pin_version=not to_lease, attempts=max(0, task.attempts - 1), **NO_LEASE)

    return _operator_move(using, task_id, version, move)


@tracing.traced(Verb.FORCE_PAUSE)
@outcomes.refusals(Verb.FORCE_PAUSE)
@retry_conflicts
def force_pause(task_id: str, *, actor: str, version: int | None = None, reason: str = "",
                using: str = "default") -> Task:
    """Operator: stop a RUNNING task and keep its last saved checkpoint (from its renewals) for
    a later resume. With none saved the checkpoint is {}: a resume starts over. The holder's
    later calls get LeaseLost."""
    reason_text(reason)

    def move(task: Task, now: datetime) -> bool:
        if task.stage != Stage.RUNNING:
            raise _illegal(task, Verb.FORCE_PAUSE, "only a RUNNING task can be paused")
        checkpoint = task.checkpoint if task.checkpoint is not None else {}
        detail = _reason(reason, previous_owner=task.owner, checkpoint_was_empty=task.checkpoint is None)
        return _swap(using, task, Verb.FORCE_PAUSE, now=now, actor=actor, detail=detail,
                     checkpoint=checkpoint, **NO_LEASE)

    return _operator_move(using, task_id, version, move)


EDITABLE = ("title", "description", "priority", "max_retries", "payload", "tags")


@tracing.traced(Verb.EDIT)
@outcomes.refusals(Verb.EDIT)
@retry_conflicts
def edit(task_id: str, *, actor: str, version: int, using: str = "default", **fields: Any) -> Task:
    """Operator: change what a task is (title, description, priority, max_retries, payload,
    tags), only if it is still at `version`; otherwise VersionConflict and nothing is written.
    Values equal to the task's are no change; an edit with none writes nothing."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise errors.InvalidRequest(f"not editable: {', '.join(sorted(unknown))}", field=min(unknown))
    if "tags" in fields:  # as create keeps them: in order, repeats dropped (None: none)
        fields["tags"] = search.tags_list(fields["tags"])

    def move(task: Task, now: datetime) -> bool:
        if target(task.stage, Verb.EDIT) is None:
            raise _illegal(task, Verb.EDIT, "finished tasks are not edited")
        merged = TaskSpec(**{name: getattr(task, name) for name in EDITABLE}, id=task.pk, queue=task.queue)
        for name, value in fields.items():
            setattr(merged, name, value)
        _validate_spec(merged)
        if merged.max_retries + 1 < task.attempts:
            raise errors.InvalidRequest(
                f"task {task.pk} has run {task.attempts} times; max_retries cannot go below {task.attempts - 1}",
                field="max_retries",
            )
        changed = {name: value for name, value in fields.items() if getattr(task, name) != value}
        if not changed:
            return True  # an edit that changes nothing writes nothing (no version, no history row)
        return _swap(using, task, Verb.EDIT, now=now, actor=actor, detail={"changed": sorted(changed)}, **changed)

    return _operator_move(using, task_id, version, move)


def _reason(reason: str, **extra: Any) -> dict | None:
    detail = {k: v for k, v in extra.items() if v}
    if reason:
        detail["reason"] = reason
    return detail or None

