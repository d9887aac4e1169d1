"""The compare-and-swap every move is made of (`_swap`), and what the verbs share.

`_swap` is one conditional UPDATE filtered on the task's id and the stage and version it was
read at (for a holder's verb also its lease token's hash), setting the new stage with
version + 1, and the move's TaskEvent inserted in the same transaction. A match count of 0
means another writer moved first: the verb reloads and retries or raises the precise error.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q

from board.engine import commits, errors, fairness, flow, outcomes, resources
from board.engine.lifecycle import TERMINAL, Stage, Verb, target
from board.engine.limits import MAX_TTL_SECONDS, MIN_TTL_SECONDS
from board.models import Task, TaskEvent

# How many times a verb reloads and tries again after losing a CAS while its move stays legal.
# Each retry follows a move by another writer, so this bounds work, not correctness.
RACE_RETRIES = 50

NO_LEASE = {"owner": "", "lease_token_hash": None, "lease_expires_at": None,
            "claim_request_hash": None, "claim_token_seed": None}


@dataclass(frozen=True)
class Lease:
    """The right to act on a RUNNING task: its token, fence and expiry (see Claim for the
    names). The token exists only here and in the holder's hands: the database keeps its hash."""

    token: str
    fence: int
    expires_at: datetime


@dataclass(frozen=True)
class Claim:
    """What claim, claim_next, resume and renew return: the task as written and its Lease.

    The server's names follow the wire: a Claim is the API's `ClaimOut` answer `{"task",
    "lease"}` (board.public.public_claim), and a Lease is its `"lease"` object (`LeaseOut`:
    token, fence, expires_at). The Python client names the whole answer a lease:
    `taskflow_client.Lease` is a Claim (its `.task`, and the Lease's `.token`, `.fence`,
    `.expires_at` flattened onto it, with the holder's verbs as methods), and `Lease.as_dict()`
    gives back this shape. The client has no Claim class; its `claim*` methods return a Lease.
    """

    task: Task
    lease: Lease


# ---------------------------------------------------------------------------------------------
# The compare-and-swap and its helpers


def _ttl(ttl_seconds: float) -> timedelta:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)):
        raise errors.InvalidRequest("ttl_seconds must be a number", field="ttl_seconds")
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise errors.InvalidRequest(
            f"ttl_seconds must be between {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS}", field="ttl_seconds"
        )
    return timedelta(seconds=ttl_seconds)


def _get(using: str, task_id: str) -> Task:
    try:
        return Task.objects.using(using).get(pk=task_id)
    except Task.DoesNotExist:
        raise errors.NotFound(f"no task with id {task_id!r}") from None


def _swap(
    using: str,
    task: Task,
    verb: Verb,
    *,
    now: datetime,
    actor: str,
    token_hash: str | None = None,
    detail: dict | None = None,
    guard: Q | None = None,
    pin_version: bool = True,
    **changes: Any,
) -> bool:
    """Move `task` (as read at its current stage and version) by `verb`, in one conditional
    UPDATE, and record the TaskEvent. Must run inside `write_transaction(using)`.

    `pin_version=False` is for a move held to something else that `guard` names (force release
    held to a lease's owner and fence): the version is then incremented in the statement and
    read back for the history row.

    Returns False, having written nothing, when the row no longer matches; on success updates
    `task` in memory to the row as written."""
    to = target(task.stage, verb)
    if to is None:  # a programming error: callers check legality first and raise precisely
        raise errors.InvalidTransition(f"{verb} is not allowed from {task.stage}", task=task)
    expected = {"pk": task.pk, "stage": task.stage}
    if pin_version:
        expected["version"] = task.version
    if token_hash is not None:
        expected["lease_token_hash"] = token_hash
    rows = Task.objects.using(using).filter(**expected)
    if guard is not None:
        rows = rows.filter(guard)
    # Plain values, not F(), when the filter pins the version: version + 1 is known here, and
    # the query builds faster.
    changes.update(stage=to, version=task.version + 1 if pin_version else F("version") + 1, updated_at=now)
    if to != task.stage:  # a renew or an edit stays in its stage: the time in it keeps counting
        changes["stage_changed_at"] = now
    if to == Stage.QUEUED:
        # The line (board.engine.fairness): a task entering it (admitted, or requeued or retried
        # after failing) waits from now, one given a delay (a snooze, a retry's backoff) from the
        # delay's end; a plain release or a lost lease keeps its place.
        start = changes.get("not_before")
        if task.stage in (Stage.PENDING, Stage.FAILED):
            start = max(now, start or now)
        if start is not None:
            changes["claim_rank"] = fairness.rank_waiting_from(task, start)
    if rows.update(**changes) != 1:
        outcomes.record(using, verb, outcomes.LOST_RACE)
        return False
    # Flow control (board.engine.flow): a move into RUNNING takes a slot of its queue and key
    # (or raises AtLimit, rolling this transaction back); a move out of it gives the slot back.
    # So do its resources (board.engine.resources), taken all or none.
    if to == Stage.RUNNING and task.stage != Stage.RUNNING:
        flow.take_slot(using, task, now)
        if task.resources:
            resources.take(using, task)
    elif task.stage == Stage.RUNNING and to != Stage.RUNNING:
        flow.give_back_slot(using, task)
        if task.resources:
            resources.give_back(using, task)
    if to in TERMINAL and task.resources:
        resources.forget_needs(using, task)
    if not pin_version:  # this transaction wrote the row last: it reads its own write
        changes["version"] = Task.objects.using(using).filter(pk=task.pk).values_list("version", flat=True).get()
    new_version = changes["version"]
    commits.after_commit(using)
    outcomes.record(using, verb, outcomes.WON)
    from_stage = task.stage
    for name, value in changes.items():
        setattr(task, name, value)
    TaskEvent.objects.using(using).create(
        task_id=task.pk,
        verb=verb,
        from_stage=from_stage,
        to_stage=to,
        version=new_version,
        fence=task.fence,
        actor=actor,
        at=now,
        detail=detail,
    )
    return True


def _illegal(task: Task, verb: Verb, hint: str = "") -> errors.BoardError:
    """The precise error for a verb that the task's stage does not allow."""
    if task.stage in TERMINAL:
        return errors.Terminal(f"task {task.pk} is {task.stage}", task=task)
    message = f"cannot {verb} task {task.pk}: it is {task.stage}"
    return errors.InvalidTransition(f"{message}{'; ' + hint if hint else ''}", task=task)
