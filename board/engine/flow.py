"""Flow control (issue 29): queue concurrency limits, concurrency keys, rates (a queue's, and a
rate key's shared by the tasks of many queues) and the queue brake.

A rule is enforced inside the move that enters RUNNING, never checked before it
(../shared/DESIGN.md section 7). The move that takes a task into RUNNING takes a slot in the
same transaction with a conditional update (`running < capacity`, the queue not paused): when
it matches no row the rule said no, the transaction is rolled back (`AtLimit`) and the claim takes
the next candidate. Every move out of RUNNING gives the slot back in its own transaction. The ORM
path does both in `board.engine.transitions.cas._swap`; the SQL stores' hot statements do the same
in SQL (board.engine.stores). `check()` compares the counts with the tasks (board.engine.invariants).

A queue's limit and its rate are split over a few rows, its shards (board.models.QueueShard; how
many: the store's queue_shards): a claim takes a slot of any shard with room (skipping one
another transaction holds, where the store can), notes its number on the task (Task.slot) and
moves any open rate shard; a move out of RUNNING gives the slot back to that shard. The shares
add up to the setting, so the queue never goes over it, and on PostgreSQL the claims and
completions of one queue hold different rows until their commits instead of taking turns on
one. A limit lowered below what runs leaves the tasks over it holding no slot, counted as the
queue's debt: each pays one back as it leaves RUNNING, and no claim starts while any is left.
A concurrency key keeps one row (ConcurrencyKey.running).

A queue is counted only while it has a limit (only then has it run shards), so that the claims
of a queue without one write nothing of it; each change of a limit makes its shards again from
the RUNNING tasks, with the task writers held off (`change_queue`).

A queue without a row has no limit and is not paused, exactly as one whose row has no setting.
Rows are made just before the first create into a queue or naming a key (`ensure_rows`), or by an
operator's first change of a queue's settings (`change_queue`).

A rate key (board.models.RateKey; Task.rate_key) is a queue's rate without the queue: a
provider's requests per minute, shared by the tasks of every queue that names the key. A claim
of such a task moves the key's `rate_open_at` one interval past its own time in the claim's own
transaction, as it moves one of its queue's rate shards; a key whose rate is unset holds nothing
back (and its row is not written by claims). Operators set it (`change_rate_key`).
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db.models import F, Q

from board.engine import budgets, clock, errors, fairness
from board.engine.inputs import is_valid_task_id, key_text, reason_text
from board.engine.limits import MAX_CONCURRENCY, MAX_CONCURRENCY_KEY_CHARS, MAX_RATE_COUNT, MAX_RATE_PER_SECONDS
from board.engine.stores import store
from board.models import (
    ConcurrencyKey,
    FairnessKey,
    FairnessKeyChange,
    Queue,
    QueueChange,
    QueueShard,
    RateKey,
    RateKeyChange,
    Task,
)


class AtLimit(Exception):
    """A move into RUNNING found its queue paused or at a limit: raised inside the move's
    transaction, so that the task's own update is rolled back with it. `budget`: the queue's
    budget is spent (errors.BudgetExhausted, not Blocked, for a claim of that task)."""

    def __init__(self, task: Task, why: str, budget: bool = False):
        super().__init__(why)
        self.task = task
        self.why = why
        self.budget = budget


# ---------------------------------------------------------------------------------------------
# Inputs


def concurrency_key(value: Any, field: str = "concurrency_key") -> str | None:
    return key_text(value, field, MAX_CONCURRENCY_KEY_CHARS)


def rate_key(value: Any, field: str = "rate_key") -> str | None:
    return key_text(value, field, MAX_CONCURRENCY_KEY_CHARS)


def concurrency_limit(value: Any, field: str = "concurrency") -> int | None:
    """A limit: a whole number from 1 to MAX_CONCURRENCY (None: no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise errors.InvalidRequest(f"{field} must be a whole number from 1 to {MAX_CONCURRENCY}", field=field)
    return value


def rate_setting(value: Any) -> tuple[int, int] | None:
    """A rate, `{"count": C, "per_seconds": S}`: at most C claims start in any S seconds (None:
    no rate limit). Both are whole numbers; a rate without its window (its unit) is refused."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"count", "per_seconds"}:
        raise errors.InvalidRequest('rate must be {"count": C, "per_seconds": S} (e.g. 60 per 60: one a second '
                                    'on average), or null for none', field="rate")
    count, per_seconds = value["count"], value["per_seconds"]
    for name, number, top in (("count", count, MAX_RATE_COUNT), ("per_seconds", per_seconds, MAX_RATE_PER_SECONDS)):
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= top:
            raise errors.InvalidRequest(f"rate.{name} must be a whole number from 1 to {top}", field="rate")
    return count, per_seconds


# ---------------------------------------------------------------------------------------------
# Rows, made with the tasks that need them


def ensure_rows(using: str, queues: Iterable[str], keys: Iterable[str], rate_keys: Iterable[str] = ()) -> None:
    """Before a create's transaction: a ConcurrencyKey row (limit 1) for each key where missing,
    committed before the tasks that name it exist, so that its count starts right; and a Queue
    row (no setting) for each new queue, so that operators find it listed (the admin lists rows),
    and a RateKey row (no rate) for each new rate key, for the same reason.
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
    rate_keys = sorted(set(rate_keys))
    missing_rate_keys = set(rate_keys) - set(RateKey.objects.using(using).filter(name__in=rate_keys)
                                             .values_list("name", flat=True)) if rate_keys else set()
    if not (missing_queues or missing_keys or missing_rate_keys):
        return
    with s.write_transaction():
        now = clock.now(using)
        s.insert_missing(Queue, [Queue(name=name) for name in sorted(missing_queues)])
        s.insert_missing(ConcurrencyKey, [ConcurrencyKey(name=name, updated_at=now) for name in sorted(missing_keys)])
        s.insert_missing(RateKey, [RateKey(name=name) for name in sorted(missing_rate_keys)])


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


def take_slot(using: str, task: Task, now: datetime) -> None:
    """Count `task` (just moved into RUNNING by this transaction) against its queue's limit and
    its key's, or raise AtLimit to roll the move back. A queue without a limit only has to be
    open (not paused): it is not counted (see change_queue for when its count starts)."""
    queue = Queue.objects.using(using).filter(name=task.queue).values_list(
        "concurrency", "paused", "rate_count", "budget_per").first()
    if queue is not None:  # no row: no limit, not paused
        concurrency, paused, rate_count, budget_per = queue
        if paused:
            raise AtLimit(task, f"queue {task.queue} is paused")
        if budget_per is not None:
            # The budget (board.engine.budgets): open, checked by a write on the queue's row.
            if not budgets.hold_open(Queue.objects.using(using).filter(name=task.queue), now):
                raise AtLimit(task, budgets.refusal(Queue.objects.using(using).get(name=task.queue), now), budget=True)
        shards = QueueShard.objects.using(using).filter(queue=task.queue)
        slot = None
        if concurrency is not None:
            # A lowered limit's debt holds every claim back until it is paid (see give_back_slot).
            if shards.filter(kind=QueueShard.DEBT, running__gt=0).exists() or (slot := _write_a_shard(
                    using, shards.filter(kind=QueueShard.RUN, running__lt=F("capacity")), running=F("running") + 1)) is None:
                raise AtLimit(task, _queue_refusal(_counted(using, task.queue)))
        if slot != task.slot:  # the slot it holds, given back to the same shard
            Task.objects.using(using).filter(pk=task.pk).update(slot=slot)
            task.slot = slot
        if rate_count is not None:
            # The rate: this claim starts only if a rate shard is open, and moves it one interval
            # past its own time (a compare-and-swap on that shard: two claimers for one opening
            # both run it, one matches).
            at = now.timestamp()  # the move's own time: what its history row says
            if _write_a_shard(using, shards.filter(Q(open_at__isnull=True) | Q(open_at__lte=at),
                                                   kind=QueueShard.RATE), open_at=at + F("spacing")) is None:
                raise AtLimit(task, _queue_refusal(_counted(using, task.queue), at))
    if task.fairness_key is not None:
        # Its fairness key's budget, as the queue's (after it: the order a usage report locks
        # them in). A key without a budget is not written.
        key = FairnessKey.objects.using(using).filter(name=task.fairness_key, budget_per__isnull=False)
        if key.exists() and not budgets.hold_open(key, now):
            raise AtLimit(task, budgets.refusal(key.get(), now), budget=True)
    if task.concurrency_key is not None:
        keys = ConcurrencyKey.objects.using(using).filter(name=task.concurrency_key)
        if not keys.filter(running__lt=F("concurrency")).update(running=F("running") + 1):
            key = keys.first()
            if key is not None:
                raise AtLimit(task, f"{key.name} is at its limit {key.running}/{key.concurrency}")
    if task.rate_key is not None:
        # The rate key's rate, as the queue's above (a key with no rate is not written).
        interval = RateKey.objects.using(using).filter(name=task.rate_key).values_list(
            "rate_interval", flat=True).first()
        if interval is not None:
            at = now.timestamp()
            if not RateKey.objects.using(using).filter(
                    Q(rate_open_at__isnull=True) | Q(rate_open_at__lte=at), name=task.rate_key,
                    rate_interval=interval).update(rate_open_at=at + interval):
                raise AtLimit(task, _rate_key_refusal(RateKey.objects.using(using).get(name=task.rate_key), at))


def give_back_slot(using: str, task: Task) -> None:
    """`task` has just left RUNNING in this transaction: its queue (when counted: the shard whose
    slot it held, or its debt for a task over a lowered limit) and its key have a slot more."""
    shards = QueueShard.objects.using(using).filter(queue=task.queue)
    # Read again, not taken from `task`: a limit changed since it was read may have given the
    # task another slot (change_queue writes `slot` without a new version; this transaction's
    # move of the task waited for it, and reads it now).
    slot = Task.objects.using(using).filter(pk=task.pk).values_list("slot", flat=True).first()
    if slot is not None:
        shards.filter(kind=QueueShard.RUN, number=slot, running__gt=0).update(running=F("running") - 1)
    else:
        shards.filter(kind=QueueShard.DEBT, running__gt=0).update(running=F("running") - 1)
    if task.concurrency_key is not None:
        ConcurrencyKey.objects.using(using).filter(name=task.concurrency_key, running__gt=0).update(
            running=F("running") - 1)


def _write_a_shard(using: str, shards, **values) -> int | None:
    """Update one of `shards` (the condition re-checked by the update itself) and answer its
    number (None: none matched): the first not locked by another transaction where the store
    can skip those; else, every candidate locked (or a store that cannot skip), each in turn,
    waiting for its holder (a claim refused only because others held the shards would be
    refused wrongly: READ COMMITTED checks each again as its holder left it)."""
    candidates = shards.order_by("number")
    if store(using).skips_locked_rows:
        picked = list(candidates.select_for_update(skip_locked=True).values_list("pk", "number")[:1])
        if picked and shards.filter(pk=picked[0][0]).update(**values):
            return picked[0][1]
    for pk, number in candidates.values_list("pk", "number"):
        if shards.filter(pk=pk).update(**values):
            return number
    return None


def _counted(using: str, name: str) -> Queue:
    queue = Queue.objects.using(using).get(name=name)
    with_counts([queue], using=using)
    return queue


def _queue_refusal(queue: Queue, now: float | None = None) -> str:
    if queue.paused:
        return f"queue {queue.name} is paused"
    if queue.concurrency is not None and queue.running >= queue.concurrency:
        return f"queue {queue.name} is at its limit {queue.running}/{queue.concurrency}"
    if queue.rate_open_at is not None and now is not None and queue.rate_open_at > now:
        return (f"queue {queue.name} is at its rate {queue.rate_count} per {queue.rate_per_seconds} s: "
                f"next claim in {queue.rate_open_at - now:.1f} s")
    return f"queue {queue.name} took no claim"  # changed meanwhile: the claim may be tried again


# ---------------------------------------------------------------------------------------------
# The counts, read from the shards


def with_counts(queues: list[Queue], *, using: str = "default") -> list[Queue]:
    """Set each queue's `running` (its RUNNING tasks counted against its limit: 0 without one)
    and `rate_open_at` (when its rate lets the next claim start, Unix seconds; None: no rate,
    or a shard never taken) from its shards, in one read."""
    names = [queue.name for queue in queues]
    running, opens = counts(names, using=using)
    for queue in queues:
        queue.running = running.get(queue.name, 0)
        queue.rate_open_at = opens.get(queue.name)
    return queues


def without_row(name: str) -> Queue:
    """A queue only tasks name (no row: no setting, no shard), with its counts."""
    queue = Queue(name=name)
    queue.running, queue.rate_open_at = 0, None
    return queue


def counts(names: list[str] | None = None, *, using: str = "default") -> tuple[dict[str, int], dict[str, float]]:
    """Of the queues `names` (None: all): the running count of each counted queue, and the
    time each rated queue's rate next lets a claim start (the earliest of its rate shards'; one
    never taken leaves the queue out: a claim may start now)."""
    shards = QueueShard.objects.using(using)
    if names is not None:
        shards = shards.filter(queue__in=names)
    running: dict[str, int] = {}
    opens: dict[str, float] = {}
    never: set[str] = set()
    for queue, kind, taken, open_at in shards.values_list("queue", "kind", "running", "open_at"):
        if kind == QueueShard.RATE:
            if open_at is None:
                never.add(queue)
            else:
                opens[queue] = min(open_at, opens.get(queue, open_at))
        else:
            running[queue] = running.get(queue, 0) + taken
    return running, {queue: at for queue, at in opens.items() if queue not in never}


def closed_queues(at: float, *, using: str = "default") -> tuple[list[str], dict[str, float]]:
    """The queues whose claims wait now: the limited ones with no shard room (full), and the
    rated ones with no rate shard open by `at` (Unix seconds), with when their first opens."""
    limited = set(Queue.objects.using(using).filter(concurrency__isnull=False).values_list("name", flat=True))
    rated = set(Queue.objects.using(using).filter(rate_count__isnull=False).values_list("name", flat=True))
    shards = QueueShard.objects.using(using)
    roomy = set(shards.filter(kind=QueueShard.RUN, running__lt=F("capacity")).values_list("queue", flat=True)) \
        - set(shards.filter(kind=QueueShard.DEBT, running__gt=0).values_list("queue", flat=True)) if limited else set()
    held: dict[str, float] = {}
    if rated:
        open_now = set(shards.filter(Q(open_at__isnull=True) | Q(open_at__lte=at), kind=QueueShard.RATE)
                       .values_list("queue", flat=True))
        for queue, open_at in shards.filter(kind=QueueShard.RATE, open_at__gt=at).values_list("queue", "open_at"):
            if queue in rated and queue not in open_now:
                held[queue] = min(open_at, held.get(queue, open_at))
    return sorted(limited - roomy), held


def limit_shards(name: str, concurrency: int | None, running: int, shards: int) -> list[QueueShard]:
    """A limit's run shards, `running` tasks taken in the first ones, and what is over the limit
    as debt."""
    if concurrency is None:
        return []
    rows, left = [], running
    for number, capacity in enumerate(_split(concurrency, min(concurrency, shards))):
        taken = min(capacity, left)
        left -= taken
        rows.append(QueueShard(queue=name, kind=QueueShard.RUN, number=number, capacity=capacity, running=taken))
    if left > 0:
        rows.append(QueueShard(queue=name, kind=QueueShard.DEBT, number=0, running=left))
    return rows


# A rate is split over a shard per this many claims a second it allows (up to the store's
# queue_shards): a slower one keeps one row, which spaces its claims evenly, and whose lock its
# claims (fewer than this a second) hardly wait on. Split, the shards may start one claim each
# at once; no window of per_seconds ever holds more than `count` (each shard's share).
RATE_PER_SHARD = 100


def rate_shards(name: str, rate: tuple[int, int] | None, shards: int) -> list[QueueShard]:
    """A rate's shards, each open: `count` claims per `per_seconds` split between them."""
    if rate is None:
        return []
    count, per_seconds = rate
    parts = max(1, min(shards, count // (per_seconds * RATE_PER_SHARD)))
    return [QueueShard(queue=name, kind=QueueShard.RATE, number=number, capacity=share, spacing=per_seconds / share)
            for number, share in enumerate(_split(count, parts))]


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _rate_key_refusal(key: RateKey, now: float) -> str:
    if key.rate_open_at is not None and key.rate_count is not None and key.rate_open_at > now:
        return (f"{key.name} is at its rate {key.rate_count} per {key.rate_per_seconds} s: "
                f"next claim in {key.rate_open_at - now:.1f} s")
    return f"{key.name} took no claim"  # changed meanwhile: the claim may be tried again


# ---------------------------------------------------------------------------------------------
# Operators' changes


UNSET: Any = object()


def change_queue(name: str, *, actor: str, reason: str = "", concurrency: Any = UNSET, paused: Any = UNSET,
                 rate: Any = UNSET, budget: Any = UNSET, using: str = "default") -> Queue:
    """Set a queue's limit (None: no limit), its rate (`{"count", "per_seconds"}`, None: none)
    and/or pause or resume it; the change and its reason
    go to the queue's audit history (QueueChange) in the same transaction. A queue with no row
    yet gets one. A limit set on a queue without one starts its count (see the module's
    docstring); a limit removed stops it. Nothing changed: nothing recorded."""
    from board.engine import commits

    if not is_valid_task_id(name):
        raise errors.InvalidRequest(f"invalid queue name {name!r}", field="name")
    if concurrency is not UNSET:
        concurrency = concurrency_limit(concurrency)
    if rate is not UNSET:
        rate = rate_setting(rate)
    if budget is not UNSET:
        budget = budgets.setting(budget)
    if paused is not UNSET and not isinstance(paused, bool):
        raise errors.InvalidRequest("paused must be true or false", field="paused")
    reason_text(reason)
    s = store(using)
    with s.write_transaction():
        s.insert_missing(Queue, [Queue(name=name)])
        queue = Queue.objects.using(using).get(name=name)
        changes: dict[str, list] = {}
        values: dict[str, Any] = {}
        shards = QueueShard.objects.using(using).filter(queue=name)
        if concurrency is not UNSET and concurrency != queue.concurrency:
            changes["concurrency"] = [queue.concurrency, concurrency]
            values["concurrency"] = concurrency
            # The limit's shards are made again from the RUNNING tasks (none without a limit: a
            # queue without one is not counted, and its claims write nothing of it). Every move
            # of a task is held off until this commits, so the count read now stays exact.
            s.hold_off_task_writers()
            running = list(Task.objects.using(using).filter(queue=name, stage="RUNNING").order_by(
                "stage_changed_at", "pk").values_list("pk", flat=True))
            shards.filter(kind__in=(QueueShard.RUN, QueueShard.DEBT)).delete()
            made = limit_shards(name, concurrency, len(running), s.queue_shards)
            QueueShard.objects.using(using).bulk_create(made)
            # Each RUNNING task holds a slot of the shard it is counted in; the rest are the debt.
            for shard in made:
                if shard.kind == QueueShard.RUN:
                    taken, running = running[:shard.running], running[shard.running:]
                    Task.objects.using(using).filter(pk__in=taken).update(slot=shard.number)
            Task.objects.using(using).filter(pk__in=running).update(slot=None)
        if rate is not UNSET and rate != _rate_of(queue):
            changes["rate"] = [_rate_json(_rate_of(queue)), _rate_json(rate)]
            count, per_seconds = rate or (None, None)
            # A new rate starts open (its shards made anew); the claims already made keep no
            # window (a lowered rate applies from the next claim on).
            values.update(rate_count=count, rate_per_seconds=per_seconds)
            shards.filter(kind=QueueShard.RATE).delete()
            QueueShard.objects.using(using).bulk_create(rate_shards(name, rate, s.queue_shards))
        if paused is True and not queue.paused:
            # The brake stops claims at once: the claims under way end first, and the pause's
            # time is read after them (check()'s claimable_while_paused holds to it).
            s.hold_off_task_writers()
        # Read after the writers are held off: a claim that committed while this waited started
        # before this time, as check()'s over_concurrency and
        # claimable_while_paused rules need (it was counted above).
        now = clock.now(using)
        if paused is not UNSET and paused != queue.paused:
            changes["paused"] = [queue.paused, paused]
            values.update(paused=paused, paused_by=actor if paused else "", paused_reason=reason if paused else "",
                          paused_at=now if paused else None)
        if budget is not UNSET and budget != budgets.of(queue):
            changes["budget"] = [budgets.of(queue), budget]
            values.update(budgets.changed_values(queue, budget, now))
        if not changes:
            return with_counts([queue], using=using)[0]
        values["updated_at"] = now
        Queue.objects.using(using).filter(name=name).update(**values)
        QueueChange.objects.using(using).create(queue=name, actor=actor, reason=reason, changes=changes, at=now)
        commits.after_commit(using)
        for attribute, value in values.items():
            setattr(queue, attribute, value)
    return with_counts([queue], using=using)[0]


def change_rate_key(name: str, *, actor: str, rate: Any, reason: str = "", using: str = "default") -> RateKey:
    """Set a rate key's rate (`{"count", "per_seconds"}`; None: none), recorded with its reason
    in the key's audit history (RateKeyChange) in the same transaction. A key no task named yet
    gets its row. A new rate starts open, as a queue's does (change_queue). Nothing changed:
    nothing recorded."""
    from board.engine import commits

    rate_key(name, "name")
    rate = rate_setting(rate)
    reason_text(reason)
    s = store(using)
    with s.write_transaction():
        s.insert_missing(RateKey, [RateKey(name=name)])
        key = RateKey.objects.using(using).get(name=name)
        if rate == _rate_of_key(key):
            return key
        now = clock.now(using)
        count, per_seconds = rate or (None, None)
        values = dict(rate_count=count, rate_per_seconds=per_seconds, rate_open_at=None,
                      rate_interval=per_seconds / count if rate else None, updated_at=now)
        RateKey.objects.using(using).filter(name=name).update(**values)
        RateKeyChange.objects.using(using).create(
            key=name, actor=actor, reason=reason, at=now,
            changes={"rate": [_rate_json(_rate_of_key(key)), _rate_json(rate)]})
        commits.after_commit(using)
        for attribute, value in values.items():
            setattr(key, attribute, value)
    return key


def change_fairness_key(name: str, *, actor: str, budget: Any, reason: str = "",
                        using: str = "default") -> FairnessKey:
    """Set a fairness key's budget (`{"tokens"?, "cost_usd"?, "per"}`; None: none), recorded
    with its reason in the key's audit history (FairnessKeyChange) in the same transaction. A key
    no task named yet gets its row (weight 1). A raised budget opens the key's tasks to claims at
    once (board.engine.budgets.changed_values). Nothing changed: nothing recorded."""
    from board.engine import commits

    if fairness.fairness_key(name, "name") is None:
        raise errors.InvalidRequest("a fairness key's name is required", field="name")
    budget = budgets.setting(budget)
    reason_text(reason)
    s = store(using)
    with s.write_transaction():
        s.insert_missing(FairnessKey, [FairnessKey(name=name)])
        key = FairnessKey.objects.using(using).get(name=name)
        if budget == budgets.of(key):
            return key
        now = clock.now(using)
        values = {**budgets.changed_values(key, budget, now), "updated_at": now}
        FairnessKey.objects.using(using).filter(name=name).update(**values)
        FairnessKeyChange.objects.using(using).create(key=name, actor=actor, reason=reason, at=now,
                                                      changes={"budget": [budgets.of(key), budget]})
        commits.after_commit(using)
        for attribute, value in values.items():
            setattr(key, attribute, value)
    return key


def describe_fairness_key(key: FairnessKey) -> dict[str, Any]:
    """A fairness key's weight and budget as the API and the board show them."""
    return {"name": key.name, "weight": key.weight, **budgets.describe(key, datetime.now(UTC))}


def describe_rate_key(key: RateKey) -> dict[str, Any]:
    """A rate key's setting as the API shows it."""
    return {
        "name": key.name,
        "rate": _rate_json(_rate_of_key(key)),
        "next_claim_at": (datetime.fromtimestamp(key.rate_open_at, UTC)
                          if key.rate_open_at is not None and key.rate_count is not None else None),
    }


def _rate_of_key(key: RateKey) -> tuple[int, int] | None:
    return None if key.rate_count is None else (key.rate_count, key.rate_per_seconds)


def describe(queue: Queue) -> dict[str, Any]:
    """A queue's settings as the API and the board show them (its counts: with_counts)."""
    return {
        "name": queue.name,
        "concurrency": queue.concurrency,
        "running": queue.running,
        "paused": queue.paused,
        "paused_by": queue.paused_by or None,
        "paused_reason": queue.paused_reason or None,
        "paused_at": queue.paused_at,
        "rate": _rate_json(_rate_of(queue)),
        # When the rate lets the next claim start (None: no rate, or a claim may start now).
        "next_claim_at": (datetime.fromtimestamp(queue.rate_open_at, UTC)
                          if queue.rate_open_at is not None and queue.rate_count is not None else None),
        # Its budget, what the window spent, and whether claims are closed (board.engine.budgets).
        **budgets.describe(queue, datetime.now(UTC)),
    }


def _rate_of(queue: Queue) -> tuple[int, int] | None:
    return None if queue.rate_count is None else (queue.rate_count, queue.rate_per_seconds)


def _rate_json(value: tuple[int, int] | None) -> dict | None:
    return None if value is None else {"count": value[0], "per_seconds": value[1]}

