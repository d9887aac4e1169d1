"""check(tasks, now): the board's invariants over a snapshot. Pure: no ORM, no clock, no I/O.

It judges whether a snapshot contradicts itself, not whether a policy is wise, so it can run
at any moment (the `check_board` command, the API, the live board's problems panel, and after
every contract test). Problems come back sorted by (task, code), so two runs over the same
snapshot print the same lines.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from board.engine.lifecycle import DEAD_ENDS, LEASED, TERMINAL, Stage

# The ten codes of the taskboard contract.
EMPTY_ID = "empty_id"
DUPLICATE_ID = "duplicate_id"
UNKNOWN_STATE = "unknown_state"
UNKNOWN_DEP = "unknown_dep"
SELF_DEP = "self_dep"
DEP_CYCLE = "dep_cycle"
CLAIMED_WITHOUT_LEASE = "claimed_without_lease"
LEASE_WITHOUT_CLAIM = "lease_without_claim"
BLOCKED_CLAIM = "blocked_claim"
TERMINAL_CLAIMED = "terminal_claimed"
# What the seven-stage lifecycle adds.
LEASE_EXPIRED = "lease_expired"  # RUNNING past its expiry: the reaper is behind or not running
QUEUED_BLOCKED = "queued_blocked"  # QUEUED although a dependency is not COMPLETED
PAUSED_WITHOUT_CHECKPOINT = "paused_without_checkpoint"
COMPLETED_WITHOUT_RESULT = "completed_without_result"
# A live task waits for a CANCELLED or FAILED task, directly or through live tasks that wait
# for one (down the chain): it cannot proceed.
DEAD_DEP = "dead_dep"
ATTEMPTS_EXCEEDED = "attempts_exceeded"  # more claims than 1 + max_retries
# A waiting task (PENDING or QUEUED) ranked earlier in the line than its creation allows
# (board.engine.fairness): it would jump every task created before it.
RANK_BEFORE_CREATION = "rank_before_creation"

ALL_CODES = (
    EMPTY_ID, DUPLICATE_ID, UNKNOWN_STATE, UNKNOWN_DEP, SELF_DEP, DEP_CYCLE,
    CLAIMED_WITHOUT_LEASE, LEASE_WITHOUT_CLAIM, BLOCKED_CLAIM, TERMINAL_CLAIMED,
    LEASE_EXPIRED, QUEUED_BLOCKED, PAUSED_WITHOUT_CHECKPOINT, COMPLETED_WITHOUT_RESULT,
    DEAD_DEP, ATTEMPTS_EXCEEDED, RANK_BEFORE_CREATION,
)  # fmt: skip


# Flow control's (board.engine.flow), over the queues' and concurrency keys' rows: `check_limits`.
# Their problems name the limited thing ("queue:NAME", "key:NAME") where the others name a task.
OVER_CONCURRENCY = "over_concurrency"  # more RUNNING than the limit, and one of them started under it
RUNNING_COUNT_DRIFT = "running_count_drift"  # the row's running count is not its RUNNING tasks
CLAIMABLE_WHILE_PAUSED = "claimable_while_paused"  # a task of a paused queue started after the pause
# More claims started in the last `per_seconds` (since the rate last changed) than a queue's
# rate allows: named "queue:NAME". Found by check_rates. A rate key's claims (Task.rate_key) closer
# together than its interval, or more in its window than its rate allows: "rate_key:NAME", found
# by check_rate_keys.
OVER_RATE = "over_rate"
# Live tasks sharing a dedup key (the live tasks' unique index on Task.dedup_key forbids it):
# named "dedup:KEY". Found by check_dedup_keys.
SHARED_DEDUP_KEY = "shared_dedup_key"
FLOW_CODES = (OVER_CONCURRENCY, RUNNING_COUNT_DRIFT, CLAIMABLE_WHILE_PAUSED, OVER_RATE, SHARED_DEDUP_KEY)

# Notes' (board.engine.transitions.notes), over the tasks' note counts and the notes' rows:
# `check_notes`. A task's count is not its notes' rows (the count and the row are written in one
# transaction), or is over the cap the count's guarded update keeps.
NOTES_MISCOUNTED = "notes_miscounted"
NOTE_CODES = (NOTES_MISCOUNTED,)

# Resource leases' (board.engine.resources), over the Resource rows and the RUNNING tasks' needs:
# `check_resources`. Problems are named "resource:NAME".
# Two RUNNING tasks hold what only one may (an exclusive hold beside another, shared holds over
# the capacity, a hold of a node beside a hold inside it):
RESOURCE_DOUBLE_HELD = "resource_double_held"
# A row's counts are not its RUNNING holders' (a hold left behind by a task that is no longer
# RUNNING, or one never counted): the claim and every move out of RUNNING write both together.
RESOURCE_ORPHANED = "resource_orphaned"
RESOURCE_CODES = (RESOURCE_DOUBLE_HELD, RESOURCE_ORPHANED)

# Approval gates' (board.engine.approvals), over the tasks awaiting an answer and the waiting
# Approval rows: `check_approvals`. A task marked awaiting_approval that is not PAUSED, or without
# exactly one waiting approval; or a waiting approval whose task is not awaiting one. (The ask,
# the answer, the timeout and the cancel write both in one transaction.)
APPROVAL_UNPAIRED = "approval_unpaired"
# A task's approvals_count is not its Approval rows (the ask writes both in one transaction; the
# count spares a claim a read of the approvals: board.engine.handoffs). Found by check_approval_counts.
APPROVALS_MISCOUNTED = "approvals_miscounted"

# Capabilities' (board.engine.capabilities), over the QUEUED tasks that require some and the
# capabilities of the agent keys seen lately: `check_requirements`. A task whose required labels no
# live key used within limits.CAPABLE_KEY_SEEN holds all of: nobody alive can take it.
UNCLAIMABLE_REQUIREMENTS = "unclaimable_requirements"

# Budgets' (board.engine.budgets): a task of a queue (or a fairness key) whose budget is spent
# started RUNNING after the report that spent it (no claim may start then). Named "queue:NAME"
# (or "fairness_key:NAME").
CLAIMED_OVER_BUDGET = "claimed_over_budget"

# Schedules' (board.engine.schedules), over their rows: `check_schedules`. Their problems name the
# schedule ("schedule:NAME").
SCHEDULE_MISSED = "schedule_missed"  # not paused, and its next tick long past: no reaper fires it
SCHEDULE_CODES = (SCHEDULE_MISSED,)


# Stages a task can only reach through a claim, hence only once its dependencies completed
# (dependencies never leave COMPLETED, so one unfinished now means it was claimed too early).
CLAIMED_AT_LEAST_ONCE = frozenset({Stage.RUNNING, Stage.PAUSED, Stage.COMPLETED, Stage.FAILED})

# Stages in which a task still waits for its dependencies, so that a dead end among them (or
# further down the chain) strands it. FAILED and COMPLETED ran already; CANCELLED waits for
# nothing.
WAITING = frozenset({Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED})


@dataclass(frozen=True)
class TaskSnapshot:
    """The fields of a task that the invariants read. `has_token` says whether a lease token
    (its hash) is stored; the token itself never reaches this layer."""

    id: str
    stage: str
    deps: Sequence[str] = ()
    owner: str = ""
    has_token: bool = False
    lease_expires_at: datetime | None = None
    attempts: int = 0
    max_retries: int = 0
    has_checkpoint: bool = False
    has_result: bool = False
    # The line (board.engine.fairness): None when the snapshot does not carry it.
    claim_rank: float | None = None
    earliest_rank: float | None = None  # its creation's rank: created_at - priority x AGING_SECONDS
    # PAUSED waiting for a person's answer (board.engine.approvals): it is never resumed (the
    # answer queues it), so it needs no checkpoint.
    awaiting_approval: bool = False


@dataclass(frozen=True, order=True)
class Problem:
    task: str
    code: str
    text: str = field(compare=False)


def check(tasks: Iterable[TaskSnapshot], now: datetime) -> list[Problem]:
    """Every invariant violation in `tasks` at time `now`, sorted by (task, code)."""
    tasks = list(tasks)
    problems: dict[tuple[str, str], str] = {}

    def report(task_id: str, code: str, text: str) -> None:
        # One problem per (task, code); the smallest text wins so that output never depends
        # on the order of the snapshot (duplicate ids can word the same problem twice).
        key = (task_id, code)
        problems[key] = min(text, problems.get(key, text))

    counts = Counter(t.id for t in tasks)
    by_id = {t.id: t for t in tasks}
    for task_id, n in counts.items():
        if n > 1:
            report(task_id, DUPLICATE_ID, f"{n} tasks share the id {task_id!r}")

    for t in tasks:
        if t.id == "":
            report(t.id, EMPTY_ID, "a task has an empty id")
        try:
            stage = Stage(t.stage)
        except ValueError:
            report(t.id, UNKNOWN_STATE, f"unknown stage {t.stage!r}")
            stage = None
        _check_deps(t, stage, by_id, report)
        if stage is not None:
            _check_lease(t, stage, now, report)
            _check_payloads(t, stage, report)
            _check_rank(t, stage, report)

    # One dependency list per id (the last copy's, when ids are duplicated).
    graph = {t.id: [d for d in t.deps if d in by_id and d != t.id] for t in tasks}
    for task_id in tasks_on_cycles((task_id, dep) for task_id, deps in graph.items() for dep in deps):
        cycle = cycle_problem(task_id)
        report(cycle.task, cycle.code, cycle.text)
    _check_stranded(graph, by_id, report)
    return [Problem(task_id, code, text) for (task_id, code), text in sorted(problems.items())]


def _check_deps(t: TaskSnapshot, stage: Stage | None, by_id: dict, report) -> None:
    for dep in t.deps:
        if dep == t.id:
            report(t.id, SELF_DEP, f"task {t.id} depends on itself")
            continue
        other = by_id.get(dep)
        if other is None:
            report(t.id, UNKNOWN_DEP, f"task {t.id} depends on unknown task {dep!r}")
            continue
        if stage is None or stage == Stage.CANCELLED or other.stage == Stage.COMPLETED:
            continue
        if stage in CLAIMED_AT_LEAST_ONCE:
            report(t.id, BLOCKED_CLAIM, f"task {t.id} is {stage} but {dep} is {other.stage}")
        elif stage == Stage.QUEUED:
            report(t.id, QUEUED_BLOCKED, f"task {t.id} is QUEUED but {dep} is {other.stage}")
        if other.stage in DEAD_ENDS and stage not in (Stage.FAILED, Stage.COMPLETED):
            report(t.id, DEAD_DEP, f"task {t.id} waits for {dep}, which is {other.stage}")


def _check_stranded(graph: dict[str, list[str]], by_id: dict, report) -> None:
    """dead_dep down the chain: a waiting task none of whose dependencies is itself a dead end
    (those are reported by _check_deps), but one of which is stranded. Each stranded task is
    worded with the smallest dead end it is stranded behind, so the text does not depend on the
    snapshot's order. Walked from each dead end through the waiting tasks that depend on it."""
    dependents: dict[str, list[str]] = defaultdict(list)
    for task_id, deps in graph.items():
        for dep in deps:
            dependents[dep].append(task_id)
    root_of: dict[str, str] = {}  # stranded task -> the smallest dead end behind it
    for root in sorted(t for t in by_id if by_id[t].stage in DEAD_ENDS):
        todo = [root]
        while todo:
            for task_id in dependents.get(todo.pop(), ()):
                if task_id not in root_of and by_id[task_id].stage in WAITING:
                    root_of[task_id] = root
                    todo.append(task_id)
    for task_id, root in root_of.items():
        deps = graph[task_id]
        if any(by_id[dep].stage in DEAD_ENDS for dep in deps):
            continue  # stranded directly: already reported, naming the dead end itself
        for dep in deps:
            if dep in root_of:
                report(task_id, DEAD_DEP,
                       f"task {task_id} waits for {dep}, which cannot run: {root_of[dep]} is {by_id[root_of[dep]].stage}")


def _check_lease(t: TaskSnapshot, stage: Stage, now: datetime, report) -> None:
    has_any = bool(t.owner) or t.has_token or t.lease_expires_at is not None
    if stage in LEASED:
        missing = [name for name, ok in (("owner", bool(t.owner)), ("token", t.has_token),
                                         ("expiry", t.lease_expires_at is not None)) if not ok]
        if missing:
            report(t.id, CLAIMED_WITHOUT_LEASE, f"task {t.id} is {stage} without lease {', '.join(missing)}")
        elif t.lease_expires_at <= now:
            report(t.id, LEASE_EXPIRED,
                   f"task {t.id}'s lease (held by {t.owner}) expired at {t.lease_expires_at.isoformat()}")
    elif has_any:
        code = TERMINAL_CLAIMED if stage in TERMINAL else LEASE_WITHOUT_CLAIM
        holder = f" (owner {t.owner!r})" if t.owner else ""
        report(t.id, code, f"task {t.id} is {stage} but still holds a lease{holder}")


# A stored rank is a float made from the same datetime as created_at, which a store may keep to
# the millisecond only (SQLite's julianday() in the check's SQL): below this, equal.
RANK_SLACK_SECONDS = 0.01


def _check_rank(t: TaskSnapshot, stage: Stage, report) -> None:
    if (stage in (Stage.PENDING, Stage.QUEUED) and t.claim_rank is not None and t.earliest_rank is not None
            and t.claim_rank < t.earliest_rank - RANK_SLACK_SECONDS):
        report(t.id, RANK_BEFORE_CREATION,
               f"task {t.id} is ranked {t.earliest_rank - t.claim_rank:.3f} s before its creation allows")


def _check_payloads(t: TaskSnapshot, stage: Stage, report) -> None:
    if stage == Stage.PAUSED and not t.has_checkpoint and not t.awaiting_approval:
        report(t.id, PAUSED_WITHOUT_CHECKPOINT, f"task {t.id} is PAUSED without a checkpoint")
    if stage == Stage.COMPLETED and not t.has_result:
        report(t.id, COMPLETED_WITHOUT_RESULT, f"task {t.id} is COMPLETED without a result")
    if t.attempts > t.max_retries + 1:
        report(t.id, ATTEMPTS_EXCEEDED,
               f"task {t.id} ran {t.attempts} times; max_retries {t.max_retries} allows {t.max_retries + 1}")


def cycle_problem(task_id: str) -> Problem:
    return Problem(task_id, DEP_CYCLE, f"task {task_id} is on a dependency cycle")


def tasks_on_cycles(edges: Iterable[tuple[str, str]]) -> set[str]:
    """Ids on a dependency cycle of length >= 2, given the graph as (task, dependency) pairs
    between known tasks, without self-dependencies (those are reported as self_dep). Tarjan's
    strongly connected components, iteratively so deep chains do not overflow. Only ids are
    held, so board.engine.selectors can search the store's dependencies without reading its tasks."""
    graph: dict[str, list[str]] = defaultdict(list)
    for task_id, dep in edges:
        graph[task_id].append(dep)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    on_cycle: set[str] = set()
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child_i = work.pop()
            if child_i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = graph.get(node, ())
            if child_i < len(children):
                work.append((node, child_i + 1))
                child = children[child_i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    on_cycle.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return on_cycle


# ---------------------------------------------------------------------------------------------
# Flow control


@dataclass(frozen=True)
class LimitSnapshot:
    """A queue's or a concurrency key's row as check_limits reads it: `kind` "queue" or "key",
    its limit (None: none), its running count, and when its limit last changed."""

    kind: str
    name: str
    concurrency: int | None
    running: int
    changed_at: datetime | None = None
    paused_at: datetime | None = None  # a paused queue's: when the brake was pulled


def check_limits(limits: Iterable[LimitSnapshot],
                 running: Iterable[tuple[str, str | None, datetime | None]]) -> list[Problem]:
    """The flow-control problems of one consistent snapshot: `limits` (every queue and key row)
    and `running` (each RUNNING task's queue, concurrency key and when it started running).

    A limit lowered below the running count is not broken by the tasks already running: they
    finish, and no claim starts until there is room. So over_concurrency is reported only when
    a task started after the limit last changed: such a claim found room, so the count could
    only have grown past the limit by a claim the limit should have refused."""
    queues: dict[str, list[datetime | None]] = defaultdict(list)
    keys: dict[str, list[datetime | None]] = defaultdict(list)
    for queue, key, started in running:
        queues[queue].append(started)
        if key is not None:
            keys[key].append(started)
    problems = []
    for limit in limits:
        starts = (queues if limit.kind == "queue" else keys).get(limit.name, [])
        name = f"{limit.kind}:{limit.name}"
        if limit.running != len(starts) and (limit.kind == "key" or limit.concurrency is not None):  # counted
            problems.append(Problem(name, RUNNING_COUNT_DRIFT,
                                    f"{limit.kind} {limit.name} counts {limit.running} running; {len(starts)} are"))
        since = limit.changed_at
        if limit.concurrency is not None and len(starts) > limit.concurrency and (
                since is None or any(started is None or started > since for started in starts)):
            problems.append(Problem(name, OVER_CONCURRENCY,
                                    f"{len(starts)} tasks of {limit.kind} {limit.name} are running; "
                                    f"its limit is {limit.concurrency}"))
        # The pause holds off the task writers before it reads its time (flow.change_queue), so
        # every claim it did not stop started before paused_at.
        late = [s for s in starts if s is not None and limit.paused_at is not None and s > limit.paused_at]
        if late:
            problems.append(Problem(name, CLAIMABLE_WHILE_PAUSED,
                                    f"{len(late)} tasks of paused queue {limit.name} started after the pause"))
    return sorted(problems)


def check_dedup_keys(live_keyed: Iterable[tuple[str, str]]) -> list[Problem]:
    """`live_keyed`: (task id, dedup key) of live tasks. A key held by two or more is a problem:
    a create with it could return either, and the second was created although it should not."""
    holders: dict[str, list[str]] = defaultdict(list)
    for task_id, key in live_keyed:
        holders[key].append(task_id)
    return [Problem(f"dedup:{key}", SHARED_DEDUP_KEY,
                    f"{len(ids)} live tasks share the dedup key {key!r}: {', '.join(sorted(ids))}")
            for key, ids in sorted(holders.items()) if len(ids) > 1]


def check_notes(counts: Iterable[tuple[str, int, int]], cap: int) -> list[Problem]:
    """`counts`: (task id, the task's notes_count, its notes' rows). A count that is not the
    rows, or rows over `cap`, is a problem: a note was written outside its transaction's guard."""
    return [Problem(task_id, NOTES_MISCOUNTED, f"task {task_id} counts {counted} notes and has {rows} (at most {cap})")
            for task_id, counted, rows in sorted(counts) if counted != rows or rows > cap]


def check_approval_counts(counts: Iterable[tuple[str, int, int]]) -> list[Problem]:
    """`counts`: (task id, the task's approvals_count, its Approval rows)."""
    return [Problem(task_id, APPROVALS_MISCOUNTED, f"task {task_id} counts {counted} approvals and has {rows}")
            for task_id, counted, rows in sorted(counts) if counted != rows]


def check_approvals(awaiting: Iterable[tuple[str, str]], waiting: Iterable[tuple[str, int]]) -> list[Problem]:
    """`awaiting`: (task id, stage) of the tasks marked awaiting_approval; `waiting`: (task id,
    approval id) of the approvals in state "waiting"."""
    asked: dict[str, list[int]] = defaultdict(list)
    for task_id, approval_id in waiting:
        asked[task_id].append(approval_id)
    marked = dict(awaiting)
    problems = []
    for task_id in sorted(marked.keys() | asked.keys()):
        stage, ids = marked.get(task_id), sorted(asked.get(task_id, []))
        if stage is None:
            problems.append(Problem(task_id, APPROVAL_UNPAIRED, f"approval {ids[0]} of task {task_id} waits for an "
                                                                "answer, but its task is not waiting for one"))
        elif stage != Stage.PAUSED or len(ids) != 1:
            problems.append(Problem(task_id, APPROVAL_UNPAIRED, f"task {task_id} is {stage}, awaiting an approval, "
                                                                f"with {len(ids)} waiting (one, and PAUSED, expected)"))
    return problems


def check_requirements(requiring: Iterable[tuple[str, Sequence[str]]],
                       capable: Iterable[Sequence[str]]) -> list[Problem]:
    """`requiring`: (task id, requires) of the QUEUED tasks that require capabilities; `capable`:
    the capabilities of each live agent key used lately."""
    holders = [frozenset(labels) for labels in capable]
    problems = []
    judged: dict[frozenset, bool] = {}
    for task_id, requires in requiring:
        needed = frozenset(requires or ())
        if needed not in judged:
            judged[needed] = any(needed <= held for held in holders)
        if not judged[needed]:
            problems.append(Problem(task_id, UNCLAIMABLE_REQUIREMENTS,
                                    f"task {task_id} requires {', '.join(sorted(needed))}: no agent key used in the "
                                    "last hour holds all of them, so nobody alive can claim it"))
    return sorted(problems)


def check_resources(rows: Iterable[tuple[str, int, int, int]],
                    running_needs: Iterable[tuple[str, str, int]], exclusive: int) -> list[Problem]:
    """`rows`: (name, capacity, held, intents) of every Resource; `running_needs`: (task id, node,
    units) of every RUNNING task's needs (units `exclusive`, shared units, or 0 for an intent on a
    node above its hold). One consistent snapshot of both."""
    held: dict[str, list[tuple[str, int]]] = defaultdict(list)
    intents: dict[str, list[str]] = defaultdict(list)
    for task_id, node, units in running_needs:
        if units:
            held[node].append((task_id, units))
        else:
            intents[node].append(task_id)
    problems = []
    for name, capacity, held_units, intent_count in rows:
        holds, below = held.get(name, []), intents.get(name, [])
        counted = sum(units for _, units in holds)
        if (held_units, intent_count) != (counted, len(below)):
            problems.append(Problem(f"resource:{name}", RESOURCE_ORPHANED,
                                    f"resource {name} counts {held_units} held and {intent_count} held below it; "
                                    f"its RUNNING holders make {counted} and {len(below)}"))
        shared = sum(units for _, units in holds if units < exclusive)
        exclusives = sum(1 for _, units in holds if units >= exclusive)
        if (exclusives and len(holds) > 1) or shared > capacity or (holds and below):
            tasks = sorted({task_id for task_id, _ in holds} | set(below))
            problems.append(Problem(f"resource:{name}", RESOURCE_DOUBLE_HELD,
                                    f"resource {name} is held by {', '.join(tasks)} at once "
                                    f"({exclusives} exclusive, {shared} of {capacity} shared units, "
                                    f"{len(below)} inside it)"))
    return sorted(problems)


def check_budgets(closed: Iterable[tuple[str, float]], running: Iterable[tuple[str, float]],
                  kind: str = "queue") -> list[Problem]:
    """`closed`: (name, when its budget was reached, Unix seconds) of the queues (or, with
    `kind` "fairness_key", the fairness keys) closed now; `running`: (name, when the task
    started RUNNING) of their RUNNING tasks."""
    since = dict(closed)
    late: dict[str, int] = defaultdict(int)
    for name, started in running:
        if name in since and started > since[name]:
            late[name] += 1
    words = kind.replace("_", " ")
    return [Problem(f"{kind}:{name}", CLAIMED_OVER_BUDGET,
                    f"{count} tasks of {words} {name} started after its budget was spent")
            for name, count in sorted(late.items())]


def check_rates(rates: Iterable[tuple[str, int, int, int]]) -> list[Problem]:
    """`rates`: (queue, count, per_seconds, claims started in the last per_seconds since the
    rate last changed). More claims than `count` is a problem: the rate let one through."""
    return [Problem(f"queue:{queue}", OVER_RATE,
                    f"queue {queue} started {started} claims in {per_seconds} s; its rate allows {count}")
            for queue, count, per_seconds, started in sorted(rates) if started > count]


# ---------------------------------------------------------------------------------------------
# Schedules


@dataclass(frozen=True)
class ScheduleSnapshot:
    """A schedule's row as check_schedules reads it."""

    name: str
    paused: bool
    next_tick_at: datetime


def check_schedules(schedules: Iterable[ScheduleSnapshot], now: datetime, grace: timedelta) -> list[Problem]:
    """schedule_missed: a schedule not paused whose next tick is more than `grace` before `now`.
    The reaper's pass (every second) fires a due tick and moves the next one past now, so a tick
    that old means no reaper is firing (or its fire keeps being refused: the reaper logs why)."""
    problems = [Problem(f"schedule:{s.name}", SCHEDULE_MISSED,
                        f"schedule {s.name}'s tick of {s.next_tick_at.isoformat()} has not fired "
                        f"({int((now - s.next_tick_at).total_seconds())} s late): is a reaper running?")
                for s in schedules if not s.paused and s.next_tick_at < now - grace]
    return sorted(problems)


def check_rate_keys(rates: Iterable[tuple[str, int, int, Sequence[float]]], slack: float) -> list[Problem]:
    """`rates`: (rate key, count, per_seconds, the Unix times of the claims of its tasks in its
    last per_seconds since its rate last changed, newest first: at most count + 1 of them). Two
    claims closer together than the interval (per_seconds / count, less `slack` for the times'
    rounding), or more than `count` of them, is a problem: the rate let one through."""
    problems = []
    for key, count, per_seconds, times in sorted(rates):
        interval = per_seconds / count
        gaps = [newer - older for newer, older in zip(times, times[1:])]
        if len(times) > count or (gaps and min(gaps) < interval - slack):
            closest = f"; two {min(gaps):.3f} s apart" if gaps else ""
            problems.append(Problem(f"rate_key:{key}", OVER_RATE,
                                    f"rate key {key} started {len(times)}{'+' if len(times) > count else ''} claims "
                                    f"in {per_seconds} s{closest}; its rate allows {count}, one every {interval:g} s"))
    return problems
