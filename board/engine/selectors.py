"""The engine's reads, by subject: tasks and the order claims take them in, dependencies, leases,
history, and the problems check() finds in the store. Nothing here writes. A read sees what its
caller's transaction sees (a move re-reads its rows inside its own); one that needs several
queries to agree opens the store's `read_transaction`. A read shaped for one caller (a page, a
panel, a filter) lives beside that caller, not here."""
from __future__ import annotations

import heapq
from collections import defaultdict, namedtuple
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.db import connections
from django.db.models import (
    BooleanField,
    Count,
    Min,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
)
from django.utils import timezone

from board.engine import capabilities as capabilities_module
from board.engine import clock, deadlines, fairness, resources, scopes
from board.engine.stores import store
from board.engine.invariants import (
    CLAIMED_AT_LEAST_ONCE,
    DEP_CYCLE,
    RANK_SLACK_SECONDS,
    RUNNING_COUNT_DRIFT,
    WAITING,
    LimitSnapshot,
    Problem,
    ScheduleSnapshot,
    TaskSnapshot,
    check,
    check_dedup_keys,
    check_notes,
    check_approvals,
    check_approval_counts,
    check_rate_keys,
    check_budgets,
    check_rates,
    check_requirements,
    check_resources,
    check_limits,
    check_schedules,
    cycle_problem,
    tasks_on_cycles,
)
from board.engine.lifecycle import DEAD_ENDS, LEASED, Stage
from board.engine.limits import CAPABLE_KEY_SEEN, MAX_NOTES_PER_TASK, SCHEDULE_MISSED_GRACE
from board.models import (
    LIVE_STAGES,
    AgentKey,
    Approval,
    ConcurrencyKey,
    Dependency,
    FairnessKey,
    Queue,
    QueueShard,
    RateKey,
    Resource,
    Schedule,
    Task,
    TaskEvent,
    TaskNote,
)

_CHUNK = 2000  # rows fetched at a time when streaming


# ---------------------------------------------------------------------------------------------
# Tasks, and the order claims take them in.


def get_task(task_id: str, *, using: str = "default") -> Task | None:
    return Task.objects.using(using).filter(pk=task_id).first()


def tasks_by_id(task_ids: list[str], *, using: str = "default") -> dict[str, Task]:
    """The existing tasks among `task_ids`, by id."""
    return {task.pk: task for task in Task.objects.using(using).filter(pk__in=task_ids)}


def stage_of(task_id: str, *, using: str = "default") -> str | None:
    """The task's stage, or None when there is no such task."""
    return Task.objects.using(using).filter(pk=task_id).values_list("stage", flat=True).first()


def queues_of(task_ids: list[str], *, using: str = "default") -> dict[str, str]:
    """The queue of each task (fixed at creation), by primary key: the join, made here so that
    it is an indexed read on every store (the store's joins_cheaply)."""
    queues: dict[str, str] = {}
    for begin in range(0, len(task_ids), _CHUNK):  # bounded IN lists, however many ids
        queues.update(Task.objects.using(using).filter(pk__in=task_ids[begin:begin + _CHUNK])
                      .values_list("pk", "queue"))
    return queues


# The order claim_next takes ready tasks in: the line's (board.engine.fairness: priority, aging
# and fairness keys in one stored rank), then id. Written here once: ready_tasks (claim_next's
# ORM path), the live board's snapshot and the API's `?order=claim` sort by it; the SQL stores'
# claim statements spell it in SQL ("ORDER BY claim_rank, id"), and tests/test_api.py holds the
# listed order to what claims take.
CLAIM_ORDER = ("claim_rank", "pk")


def in_scope(scope: scopes.Scope, queue: str = "queue") -> Q:
    """The tasks a key with this queue scope may see (issue 27; board.engine.scopes): each
    pattern as an anchored regex (the same in SQLite's Python REGEXP, PostgreSQL and MongoDB),
    a plain name as an equality. Q() for an unscoped key. `queue`: the lookup of the task's
    queue, for rows reached through their task ("task__queue": an approval's)."""
    if scope is None:
        return Q()
    match = Q(pk__in=[])
    for pattern in scope:
        match |= (Q(**{f"{queue}__regex": scopes.as_regex(pattern)}) if any(c in pattern for c in "*?")
                  else Q(**{queue: pattern}))
    return match


def ready_tasks(now: datetime, queue: str | None = None, *, scope: scopes.Scope = None, using: str = "default"):
    """QUEUED tasks past their retry backoff (in `queue` when given, in a key's `scope` when
    given), best first (CLAIM_ORDER). The order claim_next takes them in."""
    rows = Task.objects.using(using).filter(stage=Stage.QUEUED).filter(
        Q(not_before__isnull=True) | Q(not_before__lte=now))
    if queue is not None:
        rows = rows.filter(queue=queue)
    if scope is not None:
        rows = rows.filter(in_scope(scope))
    return rows.order_by(*CLAIM_ORDER)


class ClosedToClaims(NamedTuple):
    queues: list[str]
    keys: list[str]
    rate_keys: list[str]
    fairness_keys: list[str]


def closed_to_claims(now: datetime, *, using: str = "default") -> ClosedToClaims:
    """The queues that take no claim now (paused, full, waiting for their rate's next opening, or
    their budget spent), the full concurrency keys, the rate keys waiting for their rate's next
    opening (board.engine.flow) and the fairness keys whose budget is spent
    (board.engine.budgets): what claim_next's ORM path leaves out of its pick (a read in its
    transaction; the slot decides) and what a waiting claim does not wait on."""
    from board.engine import flow

    full, rate_held = flow.closed_queues(now.timestamp(), using=using)
    queues = sorted({*full, *rate_held, *Queue.objects.using(using).filter(
        Q(paused=True) | Q(budget_closed_until__gt=now.timestamp())).values_list("name", flat=True)})
    keys = list(ConcurrencyKey.objects.using(using).filter(running__gte=F("concurrency"))
                .values_list("name", flat=True))
    rate_keys = list(RateKey.objects.using(using).filter(rate_open_at__gt=now.timestamp())
                     .values_list("name", flat=True))
    fairness_keys = list(FairnessKey.objects.using(using).filter(budget_closed_until__gt=now.timestamp())
                         .values_list("name", flat=True))
    return ClosedToClaims(queues, keys, rate_keys, fairness_keys)


def claimable_tasks(now: datetime, queue: str | None = None, *, scope: scopes.Scope = None,
                    capabilities: tuple[str, ...] = (), using: str = "default"):
    """ready_tasks without those of a queue or key closed to claims now (closed_to_claims), and
    without those requiring a capability the claimer lacks (board.engine.capabilities)."""
    rows = store(using).takeable(ready_tasks(now, queue, scope=scope, using=using), capabilities)
    closed_queues, full_keys, held_rate_keys, spent_fairness_keys = closed_to_claims(now, using=using)
    if closed_queues:
        rows = rows.exclude(queue__in=closed_queues)
    if full_keys:
        rows = rows.exclude(concurrency_key__in=full_keys)
    if held_rate_keys:
        rows = rows.exclude(rate_key__in=held_rate_keys)
    if spent_fairness_keys:
        rows = rows.exclude(fairness_key__in=spent_fairness_keys)
    waiting = resources.waiting_tasks(using)  # a resource they need is held (board.engine.resources)
    if not isinstance(waiting, list) or waiting:  # a subquery, or ids (never evaluated here)
        rows = rows.exclude(pk__in=waiting)
    return rows


def has_ready_task(queue: str | None = None, *, scope: scopes.Scope = None, capabilities: tuple[str, ...] = (),
                   using: str = "default") -> bool:
    """Whether some task is ready to claim, read without a transaction: a waiting claim asks
    this first, so that idle agents do not take SQLite's write lock several times a second (nor
    for work a paused, full or rate-held queue keeps back)."""
    return claimable_tasks(timezone.now(), queue, scope=scope, capabilities=capabilities, using=using).exists()


def seconds_until_rate_opens(queue: str | None = None, *, scope: scopes.Scope = None,
                             using: str = "default") -> float | None:
    """After a claim found nothing: when the first ready task held back only by rates (its
    queue's, not paused nor full, and/or its rate key's; its concurrency key not full) may be
    claimed, in seconds from now; None when no ready work waits for a rate (in `queue`, in
    `scope`). What a 204's Retry-After says."""
    from board.engine import flow

    now = clock.now(using)
    at = now.timestamp()
    full, rate_held = flow.closed_queues(at, using=using)
    paused = set(Queue.objects.using(using).filter(paused=True, name__in=list(rate_held))
                 .values_list("name", flat=True))
    opens = {name: open_at for name, open_at in rate_held.items()
             if name not in full and name not in paused and queue in (None, name)}
    key_opens = dict(RateKey.objects.using(using).filter(rate_open_at__gt=at).values_list("name", "rate_open_at"))
    if not (opens or key_opens):
        return None
    closed_queues, full_keys, _, spent_fairness_keys = closed_to_claims(now, using=using)
    waiting = ready_tasks(now, queue, scope=scope, using=using).filter(
        Q(queue__in=list(opens)) | Q(rate_key__in=list(key_opens)))
    waiting = waiting.exclude(queue__in=[name for name in closed_queues if name not in opens])
    if full_keys:
        waiting = waiting.exclude(concurrency_key__in=full_keys)
    if spent_fairness_keys:
        waiting = waiting.exclude(fairness_key__in=spent_fairness_keys)
    # A task waits for the later of its queue's opening and its rate key's.
    pairs = set(waiting.order_by().values_list("queue", "rate_key").distinct())
    if not pairs:
        return None
    return max(0.0, min(max(opens.get(name, at), key_opens.get(key, at)) for name, key in pairs) - at)


# ---------------------------------------------------------------------------------------------
# Queues: their settings (board.engine.flow) beside what waits and runs in them.


def queue_overview(names: Iterable[str] | None = None, *, now: datetime | None = None, live_only: bool = False,
                   using: str = "default") -> list[dict]:
    """Every queue (those with a row, and those only tasks name), or those of `names`, by name:
    its settings and running count (flow.describe), tasks per stage, and how long its oldest QUEUED
    task has waited (seconds, None when none waits). One consistent read. `live_only`: count the
    unfinished tasks only (the finished ones' stages stay 0, and a queue only finished tasks name
    is left out): the live board's strip, which never shows them, reads a fraction of the rows."""
    from board.engine import flow

    now = now or clock.now(using)
    with store(using).read_transaction():
        rows = Queue.objects.using(using).all()
        tasks = Task.objects.using(using).all()
        if names is not None:
            names = list(names)
            rows, tasks = rows.filter(name__in=names), tasks.filter(queue__in=names)
        settings = {queue.name: flow.describe(queue) for queue in flow.with_counts(list(rows), using=using)}
        depth: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys((s.value for s in Stage), 0))
        counted = tasks.filter(stage__in=LIVE_STAGES) if live_only else tasks
        for queue, stage, n in counted.values_list("queue", "stage").annotate(n=Count("pk")).order_by():
            depth[queue][stage] = n
        oldest = dict(tasks.filter(stage=Stage.QUEUED).values_list("queue").annotate(
            since=Min("stage_changed_at")).order_by())
    # A row with no settings and no task (a limit set, then removed, on a queue since emptied)
    # is listed only when asked for by name.
    bare = {name for name, item in settings.items()
            if item["concurrency"] is None and item["rate"] is None and not item["paused"] and item["budget"] is None}
    out = []
    for name in sorted((settings.keys() - bare) | depth.keys() | set(names or ())):
        described = settings.get(name) or flow.describe(flow.without_row(name))
        since = oldest.get(name)
        stages = depth[name] if name in depth else dict.fromkeys((s.value for s in Stage), 0)
        # The tasks RUNNING now, from the same read: a queue without a limit is not counted on
        # its row (flow), and a counted one's row equals this (check()'s running_count_drift).
        out.append({**described, "running": stages[Stage.RUNNING.value], "depth": stages,
                    "oldest_queued_seconds": max(0.0, (now - since).total_seconds()) if since else None})
    return out


def key_overview(limit: int, *, using: str = "default") -> tuple[list[dict], int]:
    """The concurrency keys RUNNING tasks name, at most `limit`: those at their limit first (they
    hold work back), then the others, each by name, with its limit and running count; and how
    many more there are. Read from the keys' own rows (the engine's counts), never the tasks: a
    key nothing runs under holds nothing back. One consistent read."""
    with store(using).read_transaction():
        keys = ConcurrencyKey.objects.using(using).filter(running__gt=0)
        full = list(keys.filter(running__gte=F("concurrency")).order_by("name").values_list(
            "name", "concurrency", "running")[:limit])
        others: list[tuple[str, int, int]] = []
        if len(full) < limit:
            others = list(keys.filter(running__lt=F("concurrency")).order_by("name").values_list(
                "name", "concurrency", "running")[:limit - len(full)])
        total = keys.count()
    shown = [{"name": n, "concurrency": c, "running": r} for n, c, r in full + others]
    return shown, max(0, total - len(shown))


def rate_key_overview(limit: int, *, using: str = "default") -> tuple[list[dict], int]:
    """The rate keys with a rate, at most `limit`, by name (flow.describe_rate_key each), and how
    many more there are. A key without a rate holds nothing back. One consistent read."""
    from board.engine import flow

    with store(using).read_transaction():
        rated = RateKey.objects.using(using).filter(rate_count__isnull=False)
        shown = [flow.describe_rate_key(key) for key in rated.order_by("name")[:limit]]
        total = rated.count()
    return shown, max(0, total - len(shown))


def fairness_key_overview(limit: int, *, using: str = "default") -> tuple[list[dict], int]:
    """The fairness keys with a budget, at most `limit`, the spent ones first, then by name
    (flow.describe_fairness_key each), and how many more there are. One consistent read."""
    from board.engine import flow

    with store(using).read_transaction():
        budgeted = FairnessKey.objects.using(using).filter(budget_per__isnull=False)
        now = clock.now(using).timestamp()
        spent = Q(budget_closed_until__gt=now)
        keys = [*budgeted.filter(spent).order_by("name")[:limit], *budgeted.exclude(spent).order_by("name")[:limit]]
        shown = [flow.describe_fairness_key(key) for key in keys[:limit]]
        total = budgeted.count()
    return shown, max(0, total - len(shown))


# ---------------------------------------------------------------------------------------------
# Dependencies: written with their task, never changed. The passes (admission, the reaper) read
# their candidates without a transaction; each move then re-reads its own row.


def deps_of(task_ids: list[str], *, using: str = "default") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {task_id: [] for task_id in task_ids}
    for start in range(0, len(task_ids), _CHUNK):  # bounded IN lists, however many ids
        for task_id, dep in Dependency.objects.using(using).filter(
            task_id__in=task_ids[start:start + _CHUNK]
        ).values_list("task_id", "depends_on_id"):
            out[task_id].append(dep)
    return out


def deps_of_task(task: Task, *, using: str = "default") -> list[str]:
    """Ids of the tasks `task` depends on; no query for a task without any (Task.has_deps,
    set at creation with the dependency rows, which never change)."""
    return deps_of([task.pk], using=using)[task.pk] if task.has_deps else []


def unfinished_deps(task_id: str, *, using: str = "default") -> list[str]:
    """Ids of the tasks `task_id` depends on that have not COMPLETED."""
    if not store(using).joins_cheaply:
        return unfinished_deps_of([task_id], using=using).get(task_id, [])
    return list(
        Dependency.objects.using(using)
        .filter(task_id=task_id)
        .exclude(depends_on__stage=Stage.COMPLETED)
        .values_list("depends_on_id", flat=True)
    )


def unfinished_deps_of(task_ids: list[str], *, using: str = "default") -> dict[str, list[str]]:
    """The dependencies of each of `task_ids` that have not COMPLETED (tasks without any are
    left out), joined here from two indexed reads: where joins are dear (the store's joins_cheaply)."""
    pairs = []
    for start in range(0, len(task_ids), 1000):
        pairs += Dependency.objects.using(using).filter(task_id__in=task_ids[start:start + 1000]).values_list(
            "task_id", "depends_on_id")
    targets = sorted({dep for _, dep in pairs})
    done: set[str] = set()
    for start in range(0, len(targets), 1000):
        done.update(Task.objects.using(using).filter(pk__in=targets[start:start + 1000], stage=Stage.COMPLETED)
                    .values_list("pk", flat=True))
    unfinished: dict[str, list[str]] = {}
    for task_id, dep in pairs:
        if dep not in done:
            unfinished.setdefault(task_id, []).append(dep)
    return unfinished


def admission_candidates(task_ids: Iterable[str] | None = None, *, using: str = "default") -> list[str]:
    """Ids of the PENDING tasks not on hold whose dependencies have all COMPLETED (only among
    `task_ids` when given): what transitions.admit_ready tries to admit."""
    rows = Task.objects.using(using).filter(stage=Stage.PENDING, on_hold=False)
    if task_ids is not None:
        rows = rows.filter(pk__in=list(task_ids))
    if store(using).joins_cheaply:
        unfinished = Dependency.objects.filter(task_id=OuterRef("pk")).exclude(depends_on__stage=Stage.COMPLETED)
        return list(rows.exclude(Exists(unfinished)).values_list("pk", flat=True))
    pending = list(rows.values_list("pk", flat=True))
    blocked = unfinished_deps_of(pending, using=using)
    return [task_id for task_id in pending if task_id not in blocked]


def dependents_of(task_id: str, *, using: str = "default") -> list[str]:
    """Ids of the tasks that depend on `task_id`."""
    return dependents_of_all([task_id], using=using)


def dependents_of_all(task_ids: list[str], *, using: str = "default") -> list[str]:
    """Ids of the tasks that depend on any of `task_ids` (a task once per dependency it has among them)."""
    out: list[str] = []
    for start in range(0, len(task_ids), _CHUNK):  # bounded IN lists, however many ids
        out += Dependency.objects.using(using).filter(depends_on_id__in=task_ids[start:start + _CHUNK]).values_list(
            "task_id", flat=True)
    return out


# ---------------------------------------------------------------------------------------------
# Leases.


def expired_leases(now: datetime, *, limit: int, task_ids: Iterable[str] | None = None,
                   using: str = "default") -> list[str]:
    """Ids of up to `limit` RUNNING tasks whose lease expired by `now` (only among `task_ids`
    when given), longest expired first: what the reaper takes back."""
    expired = Task.objects.using(using).filter(stage=Stage.RUNNING, lease_expires_at__lte=now)
    if task_ids is not None:
        expired = expired.filter(pk__in=list(task_ids))
    return list(expired.order_by("lease_expires_at").values_list("pk", flat=True)[:limit])


# ---------------------------------------------------------------------------------------------
# Deadlines beside the lease (board.engine.deadlines).

# A candidate as the deadline rules read it: the task's id and deadlines.FIELDS.
_DeadlineRow = namedtuple("_DeadlineRow", ("pk", *deadlines.FIELDS))


def overdue_deadlines(now: datetime, *, limit: int, task_ids: Iterable[str] | None = None,
                      using: str = "default") -> list[str]:
    """Ids of up to `limit` tasks one of whose deadlines has passed by `now` (only among
    `task_ids` when given), earliest due first: what the reaper's deadline pass moves.

    The database finds the tasks that have a deadline in their stage (QUEUED with a queue
    timeout, RUNNING with an attempt or progress timeout); whether it has passed is computed here,
    by deadlines.overdue, from the few columns read: "a time column + a seconds column" is spelt
    differently by SQLite, PostgreSQL and MongoDB, and the rule (the later of two clocks) is
    written once. Only tasks whose creator set a timeout are read: the QUEUED ones through a
    partial index of those alone (a backlog of 100,000 QUEUED tasks without one cost this read
    80-120 ms a pass before it), the RUNNING ones are as many as the leases."""
    rows = Task.objects.using(using).filter(
        Q(stage=Stage.QUEUED, queue_timeout_seconds__gte=1)  # the partial index task_queue_deadline
        | Q(stage=Stage.RUNNING) & (Q(attempt_timeout_seconds__isnull=False) | Q(progress_timeout_seconds__isnull=False)))
    if task_ids is not None:
        rows = rows.filter(pk__in=list(task_ids))
    late = []
    for values in rows.values_list("pk", *deadlines.FIELDS).iterator(_CHUNK):
        candidate = _DeadlineRow(*values)
        found = deadlines.overdue(candidate, now)
        if found is not None:
            late.append((found.at, candidate.pk))
    return [task_id for _, task_id in heapq.nsmallest(limit, late)]


# ---------------------------------------------------------------------------------------------
# History: a task's events, oldest first.


def task_events(task_id: str, *, after: int | None = None, count: int, using: str = "default") -> list[TaskEvent]:
    """Up to `count` history rows of `task_id`, oldest first, after the row numbered `after`."""
    rows = TaskEvent.objects.using(using).filter(task_id=task_id)
    if after is not None:
        rows = rows.filter(id__gt=after)
    return list(rows.order_by("id")[:count])


def latest_events(task_id: str, count: int, *, using: str = "default") -> list[TaskEvent]:
    """The `count` most recent history rows of `task_id`, oldest first (read newest first
    through the (task, id) index, then turned around)."""
    return list(TaskEvent.objects.using(using).filter(task_id=task_id).order_by("-id")[:count])[::-1]


# ---------------------------------------------------------------------------------------------
# Problems: check() of the store, and the snapshot it is defined over.


# What check() reads of a task: presence only for checkpoint and result (either may be large,
# and check() needs no content).
_CHECK_COLUMNS = ("id", "stage", "owner", "lease_token_hash", "lease_expires_at", "attempts",
                  "max_retries", "has_checkpoint", "has_result", "claim_rank", "priority", "created_at",
                  "awaiting_approval")


def _check_rows(tasks):
    return tasks.annotate(
        has_checkpoint=ExpressionWrapper(Q(checkpoint__isnull=False), BooleanField()),
        has_result=ExpressionWrapper(Q(result__isnull=False), BooleanField()),
    ).values_list(*_CHECK_COLUMNS)


def _task_snapshots(rows, deps: dict[str, list[str]]) -> Iterator[TaskSnapshot]:
    for (task_id, stage, owner, token_hash, expires, attempts, max_retries, has_checkpoint, has_result,
         claim_rank, priority, created_at, awaiting_approval) in rows:
        yield TaskSnapshot(
            id=task_id, stage=stage, deps=tuple(deps.get(task_id, ())), owner=owner,
            has_token=bool(token_hash), lease_expires_at=expires, attempts=attempts,
            max_retries=max_retries, has_checkpoint=bool(has_checkpoint), has_result=bool(has_result),
            claim_rank=claim_rank, earliest_rank=fairness.rank(_epoch(created_at), priority),
            awaiting_approval=bool(awaiting_approval),
        )


def _epoch(value: datetime) -> float:
    """Unix seconds of a stored datetime: naive UTC on SQLite (USE_TZ), aware elsewhere."""
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()


def snapshot(*, using: str = "default") -> list[TaskSnapshot]:
    """All tasks with their dependencies, read as one consistent snapshot (read_transaction: no
    write lock), for the criteria of board.engine.contract and for tests. Every task is in memory:
    `problems()` is what checks the store."""
    with store(using).read_transaction():
        deps: dict[str, list[str]] = defaultdict(list)
        for task_id, dep in Dependency.objects.using(using).values_list("task_id", "depends_on_id").iterator(_CHUNK):
            deps[task_id].append(dep)
        return list(_task_snapshots(_check_rows(Task.objects.using(using)).iterator(_CHUNK), deps))


def problems(*, now: datetime | None = None, using: str = "default") -> list[Problem]:
    """`check()` over the current board, without reading the board into Python.

    One consistent read (read_transaction: no write lock, so a check never holds up a renew):
    indexed SQL finds the tasks that break a rule on their own row or through a dependency
    (normally none: `_suspects`), and check() judges exactly those, with the tasks they depend
    on, and words their problems. Cycles are searched in the dependency graph alone (ids, not
    tasks; `invariants.tasks_on_cycles`). The result is check() of the full snapshot, which
    tests/test_scale_reads.py holds it to for every problem. At the store's clock (board.engine.clock)
    unless `now` is given."""
    now = now or clock.now(using)
    if not store(using).speaks_sql:
        # A store without SQL (MongoDB): check() of the whole snapshot, which this is defined
        # as. Slower on a big board (every task is read), exact on any.
        with store(using).read_transaction():
            tasks = snapshot(using=using)
            flow = flow_problems(using=using) + schedule_problems(now, using=using)
        return sorted(check(tasks, now) + flow)
    with store(using).read_transaction():
        suspects = _suspects(now, using)
        deps = deps_of(sorted(suspects), using=using)
        wanted = sorted(suspects.union(*deps.values()))  # with the tasks they depend on
        rows = []
        for start in range(0, len(wanted), _CHUNK):
            rows += _check_rows(Task.objects.using(using).filter(pk__in=wanted[start:start + _CHUNK]))
        on_cycles = _tasks_on_cycles(using)
        flow = flow_problems(using=using) + schedule_problems(now, using=using)
    found = [p for p in check(_task_snapshots(rows, deps), now) if p.task in suspects and p.code != DEP_CYCLE]
    return sorted(found + [cycle_problem(task_id) for task_id in on_cycles] + flow)


def flow_problems(*, using: str = "default") -> list[Problem]:
    """Every check over the rows of flow control and its kin (limits, rates, rate keys, dedup
    keys, notes, resources, budgets, approvals), read in the caller's transaction."""
    return (limit_problems(using=using) + _rate_problems(using) + _rate_key_problems(using)
            + _dedup_problems(using) + _note_problems(using) + _resource_problems(using) + _budget_problems(using)
            + _approval_problems(using) + _requirement_problems(using))


def limit_problems(*, using: str = "default") -> list[Problem]:
    """check_limits over the queues' and concurrency keys' rows and the RUNNING tasks, read in
    the caller's transaction (one snapshot: the counts and the tasks are written together)."""
    from board.engine import flow

    counted, _ = flow.counts(using=using)
    limits = [LimitSnapshot("queue", name, concurrency, counted.get(name, 0), changed, paused_at if paused else None)
              for name, concurrency, changed, paused, paused_at in Queue.objects.using(using).values_list(
                  "name", "concurrency", "updated_at", "paused", "paused_at")]
    limits += [LimitSnapshot("key", name, concurrency, running, changed)
               for name, concurrency, running, changed in ConcurrencyKey.objects.using(using).values_list(
                   "name", "concurrency", "running", "updated_at")]
    running = Task.objects.using(using).filter(stage=Stage.RUNNING).values_list(
        "queue", "concurrency_key", "stage_changed_at")
    # A shard counting more than its share (or less than none) would let the queue go over its
    # limit (or hold its claims back) even while the sum is right.
    broken = [Problem(f"queue:{queue}", RUNNING_COUNT_DRIFT,
                      f"queue {queue}'s shard {number} counts {taken} running of its {capacity}")
              for queue, number, taken, capacity in QueueShard.objects.using(using).filter(
                  Q(running__gt=F("capacity")) | Q(running__lt=0), kind=QueueShard.RUN).values_list(
                  "queue", "number", "running", "capacity")]
    return sorted(check_limits(limits, running.iterator(_CHUNK)) + broken)


def _approval_problems(using: str) -> list[Problem]:
    """check_approvals over the tasks awaiting an answer and the waiting approvals (normally few)."""
    awaiting = Task.objects.using(using).filter(awaiting_approval=True).values_list("pk", "stage")
    waiting = Approval.objects.using(using).filter(state=Approval.WAITING).values_list("task_id", "pk")
    rows = dict(Approval.objects.using(using).values("task_id").annotate(n=Count("pk")).values_list("task_id", "n"))
    counted = dict(Task.objects.using(using).filter(approvals_count__gte=1).values_list("pk", "approvals_count"))
    return check_approvals(awaiting, waiting) + check_approval_counts(
        [(task_id, counted.get(task_id, 0), rows.get(task_id, 0)) for task_id in counted.keys() | rows.keys()])


def _requirement_problems(using: str) -> list[Problem]:
    """check_requirements over the QUEUED tasks that require capabilities (an index of them:
    normally few) and the live keys used within CAPABLE_KEY_SEEN."""
    requiring = Task.objects.using(using).filter(stage=Stage.QUEUED, has_requires=True).values_list(
        "pk", "requires")
    requiring = list(requiring.iterator(_CHUNK))
    if not requiring:
        return []
    return check_requirements(requiring, recent_capabilities(using=using))


def recent_capabilities(*, using: str = "default") -> list[capabilities_module.Capabilities]:
    """The capabilities of each live agent key used within CAPABLE_KEY_SEEN (keys with none left
    out): who alive could take a task that requires some (check()'s unclaimable_requirements, and
    a task's own page, board.live.views)."""
    seen = clock.now(using) - CAPABLE_KEY_SEEN
    return [capabilities_module.parse(text) for text in AgentKey.objects.using(using).filter(
        store(using).live_keys(), last_used_at__gte=seen).exclude(capabilities="").values_list("capabilities", flat=True)]


def unclaimable_why(task: Task, *, using: str = "default") -> str | None:
    """check()'s unclaimable_requirements text for `task` (QUEUED, requiring capabilities that no
    live key used lately holds all of), or None: the same rule, for one task."""
    if task.stage != Stage.QUEUED or not task.requires:
        return None
    found = check_requirements([(task.pk, task.requires)], recent_capabilities(using=using))
    return found[0].text if found else None


def _budget_problems(using: str) -> list[Problem]:
    """check_budgets over the queues and the fairness keys whose budget is spent now and their
    RUNNING tasks."""
    now = clock.now(using).timestamp()
    problems = []
    for model, field, kind in ((Queue, "queue", "queue"), (FairnessKey, "fairness_key", "fairness_key")):
        closed = list(model.objects.using(using).filter(budget_closed_until__gt=now, budget_closed_at__isnull=False)
                      .values_list("name", "budget_closed_at"))
        if closed:
            running = Task.objects.using(using).filter(
                stage=Stage.RUNNING, **{f"{field}__in": [name for name, _ in closed]}).values_list(
                field, "stage_changed_at")
            problems += check_budgets(closed, [(name, started.timestamp()) for name, started in running
                                               if started is not None], kind)
    return problems


def _resource_problems(using: str) -> list[Problem]:
    """check_resources over the Resource rows and the needs of the RUNNING tasks that declare
    resources (one read of the needs; the tasks' stages read by id)."""
    needs = [(task_id, node, units) for node, units, task_id, *_ in resources.running_needs(using)]
    # Every row a RUNNING task needs, and every row whose counts say something is held (a hold
    # left behind: resource_orphaned). Rows that hold nothing and nobody needs have nothing to say.
    nodes = sorted({node for _, node, _ in needs})
    rows = list(Resource.objects.using(using).filter(Q(name__in=nodes) | Q(held__gt=0) | Q(intents__gt=0))
                .values_list("name", "capacity", "held", "intents"))
    return check_resources(rows, needs, resources.EXCLUSIVE)


def _note_problems(using: str) -> list[Problem]:
    """check_notes over the tasks that count notes or have some (normally few: one grouped count
    of the notes, and the counts of the tasks that have any)."""
    rows = dict(TaskNote.objects.using(using).values("task_id").annotate(n=Count("pk")).values_list("task_id", "n"))
    counted = dict(Task.objects.using(using).filter(notes_count__gt=0).values_list("pk", "notes_count"))
    return check_notes([(task_id, counted.get(task_id, 0), rows.get(task_id, 0))
                        for task_id in counted.keys() | rows.keys()], MAX_NOTES_PER_TASK)


# A claim's history row and its rate's opening are written from one time, but the row keeps it to
# the microsecond: claims exactly one interval apart may look a hair closer.
_RATE_SLACK = timedelta(milliseconds=1)


def _rate_problems(using: str) -> list[Problem]:
    """check_rates over the queues with a rate: the claims (moves into RUNNING) of each in its
    last window, since its rate last changed (normally a few queues: one count each)."""
    now = clock.now(using)
    rates = []
    for name, count, per_seconds, changed in Queue.objects.using(using).filter(rate_count__isnull=False).values_list(
            "name", "rate_count", "rate_per_seconds", "updated_at"):
        since = now - timedelta(seconds=per_seconds) + _RATE_SLACK
        if changed is not None and changed > since:
            since = changed
        started = (TaskEvent.objects.using(using).filter(task__queue=name, to_stage=Stage.RUNNING, at__gt=since)
                   .exclude(from_stage=Stage.RUNNING).count())
        rates.append((name, count, per_seconds, started))
    return check_rates(rates)


# A rate key's claims are read back this many at most (a rate of more claims per window is checked
# on its latest claims only).
_RATE_KEY_CLAIMS_READ = 1000


def _rate_key_problems(using: str) -> list[Problem]:
    """check_rate_keys over the rate keys with a rate: the latest claims (moves into RUNNING) of
    their tasks in each key's last window, since its rate last changed. The history rows keep the
    claim's time to the microsecond (MongoDB: the millisecond): hence the slack."""
    now = clock.now(using)
    rates = []
    for name, count, per_seconds, changed in RateKey.objects.using(using).filter(
            rate_count__isnull=False).values_list("name", "rate_count", "rate_per_seconds", "updated_at"):
        since = now - timedelta(seconds=per_seconds) + _RATE_SLACK
        if changed is not None and changed > since:
            since = changed
        times = (TaskEvent.objects.using(using).filter(task__rate_key=name, to_stage=Stage.RUNNING, at__gt=since)
                 .exclude(from_stage=Stage.RUNNING).order_by("-at").values_list("at", flat=True)
                 [:min(count, _RATE_KEY_CLAIMS_READ) + 1])
        rates.append((name, count, per_seconds, [at.timestamp() for at in times]))
    return check_rate_keys(rates, slack=2 * _RATE_SLACK.total_seconds())


def _dedup_problems(using: str) -> list[Problem]:
    """check_dedup_keys over the live tasks of the keys two of them hold (normally none: the
    database counts, and only such keys' tasks are read)."""
    live = Task.objects.using(using).filter(stage__in=LIVE_STAGES, dedup_key__isnull=False)
    shared = [row["dedup_key"] for row in live.values("dedup_key").annotate(n=Count("pk")).filter(n__gt=1)]
    if not shared:
        return []
    return check_dedup_keys(live.filter(dedup_key__in=shared).values_list("pk", "dedup_key"))


def schedule_problems(now: datetime, *, using: str = "default") -> list[Problem]:
    """check_schedules over the schedules that are due for longer than the grace (normally none:
    an indexed-or-tiny read), at `now`."""
    late = Schedule.objects.using(using).filter(paused=False, next_tick_at__lt=now - SCHEDULE_MISSED_GRACE)
    return check_schedules([ScheduleSnapshot(name, paused, next_tick_at) for name, paused, next_tick_at
                            in late.values_list("name", "paused", "next_tick_at")], now, SCHEDULE_MISSED_GRACE)


def _suspects(now: datetime, using: str) -> set[str]:
    """Ids of the tasks that may have a problem other than a cycle: a superset of those check()
    reports (it judges them), found by the database: one scan of the tasks' own columns, and the
    dependencies that could be wrong."""
    tasks = Task.objects.using(using)
    no_owner = Q(owner="") | Q(owner__isnull=True)
    no_token = Q(lease_token_hash="") | Q(lease_token_hash__isnull=True)
    leased = [stage.value for stage in LEASED]
    own = (
        Q(id="")
        | ~Q(stage__in=[stage.value for stage in Stage])
        # claimed_without_lease, lease_expired
        | Q(stage__in=leased) & (no_owner | no_token | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        # lease_without_claim, terminal_claimed
        | ~Q(stage__in=leased) & (~no_owner | ~no_token | Q(lease_expires_at__isnull=False))
        | Q(stage=Stage.PAUSED, checkpoint__isnull=True, awaiting_approval=False)
        | Q(stage=Stage.COMPLETED, result__isnull=True)
        | Q(attempts__gt=F("max_retries") + 1)
    )
    found = set(tasks.filter(own).values_list("id", flat=True))
    waiting = sorted(CLAIMED_AT_LEAST_ONCE | {Stage.QUEUED})
    dead_ends = sorted(DEAD_ENDS)
    not_waiting_for_dead = [Stage.FAILED, Stage.COMPLETED, Stage.CANCELLED]
    with connections[using].cursor() as cursor:
        cursor.execute(_SUSPECTS_THROUGH_DEPS.format(
            waiting=_placeholders(waiting), dead_ends=_placeholders(dead_ends),
            not_waiting_for_dead=_placeholders(not_waiting_for_dead),
        ), [Stage.COMPLETED, *waiting, *dead_ends, *not_waiting_for_dead])
        found.update(task_id for (task_id,) in cursor.fetchall())
        waiting_now = sorted(WAITING)
        cursor.execute(_STRANDED.format(dead_ends=_placeholders(dead_ends), waiting=_placeholders(waiting_now)),
                       [*dead_ends, *waiting_now, *waiting_now])
        found.update(task_id for (task_id,) in cursor.fetchall())
        for stage in (Stage.PENDING, Stage.QUEUED):
            cursor.execute(_RANKED_BEFORE_CREATION.format(epoch=store(using).epoch_of_column.format(column="created_at")),
                           [stage, LINE_HEAD_CHECKED, fairness.AGING_SECONDS, RANK_SLACK_SECONDS])
            found.update(task_id for (task_id,) in cursor.fetchall())
    return found


# rank_before_creation (board.engine.fairness) on the SQL stores: among the first LINE_HEAD_CHECKED
# tasks of each waiting stage's line (an index seek: task_line_any_queue), those ranked before
# their creation's rank. A rank that jumps the line lands at its head, where claims take it next;
# the whole line would be a scan of the backlog on every check (snapshot() checks every task).
# Params: the stage, the head's length, AGING_SECONDS, the slack.
LINE_HEAD_CHECKED = 100
_RANKED_BEFORE_CREATION = (f"SELECT id FROM (SELECT id, claim_rank, priority, created_at FROM {Task._meta.db_table}"
                           " WHERE stage = %s ORDER BY claim_rank, id LIMIT %s) AS head"
                           " WHERE claim_rank + priority * %s < {epoch} - %s")


# Tasks with a dependency check() may object to: a self-dependency or one on an unknown task
# (index lookups only), or one on a task that has not completed and that the dependent should
# not be waiting for in its stage (reached from the unfinished tasks, a third of a real board:
# joining every dependency to both of its tasks cost 0.9 s at 100,000 tasks on SQLite).
# Params: COMPLETED, the waiting stages, the dead ends, the stages a dead end does not hold up.
_SUSPECTS_THROUGH_DEPS = (
    f"SELECT d.task_id FROM {Dependency._meta.db_table} d"
    " WHERE d.task_id = d.depends_on_id"  # self_dep
    f" OR NOT EXISTS (SELECT 1 FROM {Task._meta.db_table} o WHERE o.id = d.depends_on_id)"  # unknown_dep
    " UNION "
    # CROSS JOIN: SQLite then reads the tasks first (PostgreSQL plans the joins as it likes)
    f"SELECT d.task_id FROM {Task._meta.db_table} o"
    f" CROSS JOIN {Dependency._meta.db_table} d CROSS JOIN {Task._meta.db_table} t"
    " WHERE d.depends_on_id = o.id AND t.id = d.task_id AND o.stage <> %s"
    # blocked_claim, queued_blocked: claimed or queued before a dependency completed
    " AND (t.stage IN ({waiting})"
    # dead_dep
    " OR o.stage IN ({dead_ends}) AND t.stage NOT IN ({not_waiting_for_dead}))"
)


# dead_dep down the chain: the waiting tasks that depend on a dead end, then, recursively, the
# waiting tasks that depend on one of those (check() words them; it needs each link, and every
# link is a suspect, so its dependencies are read). UNION drops repeats, so a stranded cycle
# ends. Starts from the dead ends' dependents only (index on depends_on), a handful on a board.
# Params: the dead ends, the waiting stages, the waiting stages.
_STRANDED = (
    "WITH RECURSIVE stranded(id) AS ("
    f" SELECT d.task_id FROM {Task._meta.db_table} o"
    f" CROSS JOIN {Dependency._meta.db_table} d CROSS JOIN {Task._meta.db_table} t"
    " WHERE d.depends_on_id = o.id AND t.id = d.task_id AND o.stage IN ({dead_ends}) AND t.stage IN ({waiting})"
    " UNION"
    f" SELECT d.task_id FROM stranded s CROSS JOIN {Dependency._meta.db_table} d"
    f" CROSS JOIN {Task._meta.db_table} t"
    " WHERE d.depends_on_id = s.id AND t.id = d.task_id AND t.stage IN ({waiting})"
    ") SELECT id FROM stranded"
)


def _placeholders(values: list) -> str:
    return ", ".join(["%s"] * len(values))


def _tasks_on_cycles(using: str) -> set[str]:
    """Ids of the tasks on a dependency cycle, as check() finds them. The search reads only the
    dependencies that could lie on one (`_CYCLE_CANDIDATE_EDGES`); that both ends are tasks is
    checked only for what it finds (normally nothing): an edge to or from an unknown task is on
    no cycle in check()."""
    with connections[using].cursor() as cursor:
        cursor.execute(_CYCLE_CANDIDATE_EDGES)
        edges = cursor.fetchall()
    on_cycles = tasks_on_cycles(edges)
    if on_cycles:
        known = set(Task.objects.using(using).filter(pk__in=sorted(on_cycles)).values_list("id", flat=True))
        if known != on_cycles:
            on_cycles = tasks_on_cycles((a, b) for a, b in edges if a in known and b in known)
    return on_cycles


# An edge t -> d can lie on a cycle only if something depends on t and d depends on something:
# most of a real board's edges start at a task nobody waits for or end at one that waits for
# nothing. Self-dependencies are not cycles (they are self_dep). Index lookups on the
# dependency table only.
_CYCLE_CANDIDATE_EDGES = (
    f"SELECT d.task_id, d.depends_on_id FROM {Dependency._meta.db_table} d"
    " WHERE d.task_id <> d.depends_on_id"
    f" AND EXISTS (SELECT 1 FROM {Dependency._meta.db_table} i WHERE i.depends_on_id = d.task_id)"
    f" AND EXISTS (SELECT 1 FROM {Dependency._meta.db_table} x WHERE x.task_id = d.depends_on_id)"
)
