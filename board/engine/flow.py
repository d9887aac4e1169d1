"""Flow control (issue 29): queue concurrency limits, concurrency keys and the queue brake.

A rule is enforced inside the move that enters RUNNING, never checked before it
(../shared/DESIGN.md section 7). Each limited thing has a small row with a `running` count
(board.models.Queue, ConcurrencyKey). The move that takes a task into RUNNING takes a slot in the
same transaction with a conditional update (`running < concurrency`, the queue not paused): when
it matches no row the rule said no, the transaction is rolled back (`AtLimit`) and the claim takes
the next candidate. Every move out of RUNNING gives the slot back in its own transaction. The ORM
path does both in `board.engine.transitions.cas._swap`; the SQL stores' hot statements do the same
in SQL (board.engine.stores). `check()` compares the counts with the tasks (board.engine.invariants).

A queue is counted only while it has a limit, so that the claims of a queue without one never
queue on its row (on PostgreSQL that row would serialise every claim and complete of the queue);
setting a limit starts the count with the task writers held off (`change_queue`).

A queue without a row has no limit and is not paused, exactly as one whose row has no setting.
Rows are made just before the first create into a queue or naming a key (`ensure_rows`), or by an
operator's first change of a queue's settings (`change_queue`).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import F, Q

from board.engine import clock, errors
from board.engine.inputs import is_valid_task_id, key_text, reason_text
from board.engine.limits import MAX_CONCURRENCY, MAX_CONCURRENCY_KEY_CHARS
from board.engine.stores import store
from board.models import ConcurrencyKey, Queue, QueueChange, Task


class AtLimit(Exception):
    """A move into RUNNING found its queue paused or at a limit: raised inside the move's
    transaction, so that the task's own update is rolled back with it."""

    def __init__(self, task: Task, why: str):
        super().__init__(why)
        self.task = task
        self.why = why


# ---------------------------------------------------------------------------------------------
# Inputs


def concurrency_key(value: Any, field: str = "concurrency_key") -> str | None:
    return key_text(value, field, MAX_CONCURRENCY_KEY_CHARS)


def concurrency_limit(value: Any, field: str = "concurrency") -> int | None:
    """A limit: a whole number from 1 to MAX_CONCURRENCY (None: no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise errors.InvalidRequest(f"{field} must be a whole number from 1 to {MAX_CONCURRENCY}", field=field)
    return value


# ---------------------------------------------------------------------------------------------
# Rows, made with the tasks that need them


def ensure_rows(using: str, queues: Iterable[str], keys: Iterable[str]) -> None:
    """Before a create's transaction: a ConcurrencyKey row (limit 1) for each key where missing,
    committed before the tasks that name it exist, so that its count starts right; and a Queue
    row (no setting) for each new queue, so that operators find it listed (the admin lists rows).
    A create refused after this leaves rows that hold nothing.

    In a transaction of its own, and only when one is missing (one read otherwise): inside the
    create's, the insert of a new row would make every other create into that queue (naming that
    key) wait for the first create's commit (a unique key being inserted). For the same reason a
    create inside a caller's transaction makes no queue row: a queue needs none until an operator
    gives it a setting (one without is not counted: see the module's docstring)."""
    s = store(using)
    queues = [] if s.in_transaction() else sorted(set(queues))
    keys = sorted(set(keys))
    missing_queues = set(queues) - set(Queue.objects.using(using).filter(name__in=queues)
                                       .values_list("name", flat=True)) if queues else set()
    missing_keys = set(keys) - set(ConcurrencyKey.objects.using(using).filter(name__in=keys)
                                   .values_list("name", flat=True)) if keys else set()
    if not (missing_queues or missing_keys):
        return
    with s.write_transaction():
        now = clock.now(using)
        s.insert_missing(Queue, [Queue(name=name) for name in sorted(missing_queues)])
        s.insert_missing(ConcurrencyKey, [ConcurrencyKey(name=name, updated_at=now) for name in sorted(missing_keys)])


def set_key_limits(using: str, limits: dict[str, int]) -> None:
    """Inside a create's transaction: the limits its tasks give their keys (the latest create
    naming one says it), so that a refused create changes none."""
    if not limits:
        return
    now = clock.now(using)
    for name, limit in sorted(limits.items()):
        ConcurrencyKey.objects.using(using).filter(name=name).exclude(concurrency=limit).update(
            concurrency=limit, updated_at=now)


# ---------------------------------------------------------------------------------------------
# Slots: taken by a move into RUNNING, given back by a move out of it (transitions.cas._swap)


def take_slot(using: str, task: Task) -> None:
    """Count `task` (just moved into RUNNING by this transaction) against its queue's limit and
    its key's, or raise AtLimit to roll the move back. A queue without a limit only has to be
    open (not paused): it is not counted (see change_queue for when its count starts)."""
    queue = Queue.objects.using(using).filter(name=task.queue).values_list("concurrency", "paused").first()
    if queue is not None:  # no row: no limit, not paused
        concurrency, paused = queue
        if paused:
            raise AtLimit(task, f"queue {task.queue} is paused")
        if concurrency is not None and not Queue.objects.using(using).filter(
                name=task.queue, paused=False, concurrency__isnull=False, running__lt=F("concurrency")).update(
                running=F("running") + 1):
            raise AtLimit(task, _queue_refusal(Queue.objects.using(using).get(name=task.queue)))
    if task.concurrency_key is not None:
        keys = ConcurrencyKey.objects.using(using).filter(name=task.concurrency_key)
        if not keys.filter(running__lt=F("concurrency")).update(running=F("running") + 1):
            key = keys.first()
            if key is not None:
                raise AtLimit(task, f"{key.name} is at its limit {key.running}/{key.concurrency}")


def give_back_slot(using: str, task: Task) -> None:
    """`task` has just left RUNNING in this transaction: its queue (when counted) and key have a
    slot more."""
    Queue.objects.using(using).filter(name=task.queue, concurrency__isnull=False, running__gt=0).update(
        running=F("running") - 1)
    if task.concurrency_key is not None:
        ConcurrencyKey.objects.using(using).filter(name=task.concurrency_key, running__gt=0).update(
            running=F("running") - 1)


def _queue_refusal(queue: Queue) -> str:
    if queue.paused:
        return f"queue {queue.name} is paused"
    return f"queue {queue.name} is at its limit {queue.running}/{queue.concurrency}"


def closed(*, using: str) -> tuple[list[str], list[str]]:
    """The queues that take no claim now (paused or full) and the full keys: what claim_next's ORM
    path leaves out of its pick (a read in its transaction; take_slot decides)."""
    queues = list(Queue.objects.using(using).filter(
        Q(paused=True) | Q(concurrency__isnull=False, running__gte=F("concurrency"))).values_list("name", flat=True))
    keys = list(ConcurrencyKey.objects.using(using).filter(running__gte=F("concurrency"))
                .values_list("name", flat=True))
    return queues, keys


# ---------------------------------------------------------------------------------------------
# Operators' changes


UNSET: Any = object()


def change_queue(name: str, *, actor: str, reason: str = "", concurrency: Any = UNSET, paused: Any = UNSET,
                 using: str = "default") -> Queue:
    """Set a queue's limit (None: no limit) and/or pause or resume it; the change and its reason
    go to the queue's audit history (QueueChange) in the same transaction. A queue with no row
    yet gets one. A limit set on a queue without one starts its count (see the module's
    docstring); a limit removed stops it. Nothing changed: nothing recorded."""
    from board.engine import commits

    if not is_valid_task_id(name):
        raise errors.InvalidRequest(f"invalid queue name {name!r}", field="name")
    if concurrency is not UNSET:
        concurrency = concurrency_limit(concurrency)
    if paused is not UNSET and not isinstance(paused, bool):
        raise errors.InvalidRequest("paused must be true or false", field="paused")
    reason_text(reason)
    s = store(using)
    with s.write_transaction():
        s.insert_missing(Queue, [Queue(name=name)])
        queue = Queue.objects.using(using).get(name=name)
        changes: dict[str, list] = {}
        values: dict[str, Any] = {}
        if concurrency is not UNSET and concurrency != queue.concurrency:
            changes["concurrency"] = [queue.concurrency, concurrency]
            values["concurrency"] = concurrency
            if queue.concurrency is None:
                # A queue is counted only while it has a limit (claims of the others do not
                # write its row: no hot row for them). Its count starts here: every move of a
                # task is held off until this commits, so the count read now stays exact.
                s.hold_off_task_writers()
                values["running"] = Task.objects.using(using).filter(queue=name, stage="RUNNING").count()
            elif concurrency is None:
                values["running"] = 0  # no longer counted: a count left as it was would only mislead
        # Read after the writers are held off: a claim that committed while this waited started
        # before this time, as check()'s over_concurrency rule needs (it was counted above).
        now = clock.now(using)
        if paused is not UNSET and paused != queue.paused:
            changes["paused"] = [queue.paused, paused]
            values.update(paused=paused, paused_by=actor if paused else "", paused_reason=reason if paused else "",
                          paused_at=now if paused else None)
        if not changes:
            return queue
        values["updated_at"] = now
        Queue.objects.using(using).filter(name=name).update(**values)
        QueueChange.objects.using(using).create(queue=name, actor=actor, reason=reason, changes=changes, at=now)
        commits.after_commit(using)
        for attribute, value in values.items():
            setattr(queue, attribute, value)
    return queue


def describe(queue: Queue) -> dict[str, Any]:
    """A queue's settings as the API and the board show them."""
    return {
        "name": queue.name,
        "concurrency": queue.concurrency,
        "running": queue.running,
        "paused": queue.paused,
        "paused_by": queue.paused_by or None,
        "paused_reason": queue.paused_reason or None,
        "paused_at": queue.paused_at,
    }

