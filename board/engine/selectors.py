"""Read-only queries, the board's read path: check() of the store, the live board's snapshot in
parts, a task and its dependencies, what claim_next takes first; then, at the end, the reads of
the engine's moves and passes, of the API (task lists, histories) and of the commands. Nothing
here writes; a read that needs several queries to agree opens `read_transaction`."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import closing
from datetime import UTC, datetime

from django.db import connections
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from board.engine import clock, scopes
from board.engine.stores import store
from board.engine.invariants import (
    CLAIMED_AT_LEAST_ONCE,
    DEP_CYCLE,
    WAITING,
    Problem,
    TaskSnapshot,
    check,
    cycle_problem,
    tasks_on_cycles,
)
from board.engine.lifecycle import DEAD_ENDS, LEASED, TERMINAL, Stage, Verb
from board.models import Dependency, Task, TaskEvent

# What check() reads of a task: presence only for checkpoint and result (either may be large,
# and check() needs no content).
_CHECK_COLUMNS = ("id", "stage", "owner", "lease_token_hash", "lease_expires_at", "attempts",
                  "max_retries", "has_checkpoint", "has_result")
_CHUNK = 2000  # rows fetched at a time when streaming


def _check_rows(tasks):
    return tasks.annotate(
        has_checkpoint=ExpressionWrapper(Q(checkpoint__isnull=False), BooleanField()),
        has_result=ExpressionWrapper(Q(result__isnull=False), BooleanField()),
    ).values_list(*_CHECK_COLUMNS)


def _task_snapshots(rows, deps: dict[str, list[str]]) -> Iterator[TaskSnapshot]:
    for (task_id, stage, owner, token_hash, expires, attempts, max_retries, has_checkpoint, has_result) in rows:
        yield TaskSnapshot(
            id=task_id, stage=stage, deps=tuple(deps.get(task_id, ())), owner=owner,
            has_token=bool(token_hash), lease_expires_at=expires, attempts=attempts,
            max_retries=max_retries, has_checkpoint=bool(has_checkpoint), has_result=bool(has_result),
        )


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
        return sorted(check(snapshot(using=using), now))
    with store(using).read_transaction():
        suspects = _suspects(now, using)
        deps = deps_of(sorted(suspects), using=using)
        wanted = sorted(suspects.union(*deps.values()))  # with the tasks they depend on
        rows = []
        for start in range(0, len(wanted), _CHUNK):
            rows += _check_rows(Task.objects.using(using).filter(pk__in=wanted[start:start + _CHUNK]))
        on_cycles = _tasks_on_cycles(using)
    found = [p for p in check(_task_snapshots(rows, deps), now) if p.task in suspects and p.code != DEP_CYCLE]
    return sorted(found + [cycle_problem(task_id) for task_id in on_cycles])


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
        | Q(stage=Stage.PAUSED, checkpoint__isnull=True)
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
    return found


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


def get_task(task_id: str, *, using: str = "default") -> Task | None:
    return Task.objects.using(using).filter(pk=task_id).first()


# What a card shows of a task (board.live.frames.card_task): every public field but the bulky ones
# (NOT_ON_CARDS: up to 256 KiB each), which the board never reads. The live board's reads (the
# snapshot's, `board_parts`, and the tailer's, `live_tasks`) select these columns and no other.
CARD_COLUMNS = ("id", "title", "queue", "priority", "hold", "max_retries", "stage", "version", "owner",
                "fence", "lease_expires_at", "attempts", "not_before", "progress", "last_error",
                "created_at", "updated_at", "stage_changed_at")
NOT_ON_CARDS = ("description", "payload", "checkpoint", "result")


def board_parts(*, terminal_limit: int = 200, part_size: int = 1000, using: str = "default") -> Iterator:
    """The live board as one consistent read (read_transaction: no write lock), a part at a
    time so that a board of any size is never all in memory: first a head {"counts" (per
    stage), "last_event_id" (the last event the read includes)}, then lists of up to `part_size`
    (row, deps) pairs: every unfinished task (best first, as claim_next orders them), then the
    `terminal_limit` most recently finished per terminal stage (the page asks for more on
    demand). A row is a dict of CARD_COLUMNS as JSON values (datetimes as the API writes them,
    `json_time`), streamed from the database without building a model instance or a datetime
    per task. Close the generator (or exhaust it) to end the read."""
    with store(using).read_transaction():
        tasks = Task.objects.using(using)
        last_event_id = TaskEvent.objects.using(using).order_by("-id").values_list("id", flat=True).first() or 0
        counts = {stage.value: 0 for stage in Stage}
        for stage, n in tasks.values_list("stage").annotate(n=Count("id")).order_by():
            counts[stage] = n
        yield {"counts": counts, "last_event_id": last_event_id}
        queries = [tasks.exclude(stage__in=list(TERMINAL)).order_by(*CLAIM_ORDER)]
        queries += [tasks.filter(stage=stage).order_by("-updated_at", "-id")[:terminal_limit] for stage in sorted(TERMINAL)]
        part: list[dict] = []
        # closing(): the cursor is closed inside the read even when the caller stops early.
        with closing(_values_of(queries, part_size, using)) as rows:
            for values in rows:
                part.append(_card_row(values))
                if len(part) == part_size:
                    yield _with_deps(part, using)
                    part = []
        if part:
            yield _with_deps(part, using)


def _values_of(queries: list, batch: int, using: str) -> Iterator[tuple]:
    """The _ROW_COLUMNS of every row of `queries`, in order, fetched `batch` rows at a time."""
    if not store(using).speaks_sql:  # MongoDB: the ORM's values, streamed in batches
        for query in queries:
            yield from query.values_list(*_ROW_COLUMNS).iterator(batch)
        return
    # A server-side cursor on PostgreSQL (psycopg's default one fetches every row at once).
    with connections[using].chunked_cursor() as cursor:
        for query in queries:
            # The ORM's SQL, fetched by the driver: no ORM converter per value (with them a
            # 100,000-task snapshot took 2.8 s on SQLite, most of it converting values).
            cursor.execute(*query.values_list(*_ROW_COLUMNS).query.sql_with_params())
            while rows := cursor.fetchmany(batch):
                yield from rows


_ROW_COLUMNS = (*CARD_COLUMNS, "has_deps")  # has_deps: whether to look up its dependencies
_CARD_TIMES = ("lease_expires_at", "not_before", "created_at", "updated_at", "stage_changed_at")


def _card_row(values: tuple) -> dict:
    row = dict(zip(_ROW_COLUMNS, values, strict=True))
    row["hold"] = bool(row["hold"])  # SQLite: 0/1
    for name in _CARD_TIMES:
        row[name] = json_time(row[name])
    return row


def json_time(value: datetime | None) -> str | None:
    """A stored datetime as the API's JSON writes it (DjangoJSONEncoder: ISO 8601 in UTC, to the
    millisecond, "Z"), from what the driver returns: naive UTC on SQLite (USE_TZ), aware on
    PostgreSQL. Formatted here: the encoder's hook cost as much again as the snapshot's SQL."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    text = value.isoformat()
    return f"{text[:23] if value.microsecond else text}Z"


def _with_deps(rows: list[dict], using: str) -> list[tuple[dict, list[str]]]:
    """Rows paired with their dependencies: one query, for the rows that have some (has_deps)."""
    wanted = [row["id"] for row in rows if row.pop("has_deps")]
    deps: dict[str, list[str]] = defaultdict(list)
    if wanted and not store(using).speaks_sql:
        for task_id, dep in (Dependency.objects.using(using).filter(task_id__in=wanted)
                             .order_by("pk").values_list("task_id", "depends_on_id")):
            deps[task_id].append(dep)
    elif wanted:
        with connections[using].cursor() as cursor:
            cursor.execute(f"{_DEPS_OF} ({_placeholders(wanted)}) ORDER BY id", wanted)
            for task_id, dep in cursor.fetchall():
                deps[task_id].append(dep)
    return [(row, deps.get(row["id"], [])) for row in rows]


# Params: task ids. Each task's dependencies in the order they were written.
_DEPS_OF = f"SELECT task_id, depends_on_id FROM {Dependency._meta.db_table} WHERE task_id IN"


def board_tasks(*, terminal_limit: int = 200, using: str = "default") -> dict:
    """board_parts() all at once, for small boards (bench/board.py): {"counts", "last_event_id",
    "tasks": [row, ...], "deps": {id: [dep, ...]}}."""
    parts = board_parts(terminal_limit=terminal_limit, using=using)
    board = {**next(parts), "tasks": [], "deps": {}}
    for part in parts:
        for row, deps in part:
            board["tasks"].append(row)
            board["deps"][row["id"]] = deps
    return board


# The order claim_next takes ready tasks in: highest priority, then oldest, then id. Written here
# once: ready_tasks (claim_next's ORM path), the live board's snapshot and the API's
# `?order=claim` sort by it; the SQL stores' claim statements spell it in SQL ("ORDER BY priority
# DESC, created_at, id"), and tests/test_api.py holds the listed order to what claims take.
CLAIM_ORDER = ("-priority", "created_at", "pk")
# The orders the API's task list offers: oldest first (its default), and the claim order.
LIST_ORDERS = {"created": ("created_at", "pk"), "claim": CLAIM_ORDER}


def in_scope(scope: scopes.Scope) -> Q:
    """The tasks a key with this queue scope may see (issue 27; board.engine.scopes): each
    pattern as an anchored regex (the same in SQLite's Python REGEXP, PostgreSQL and MongoDB),
    a plain name as an equality. Q() for an unscoped key."""
    if scope is None:
        return Q()
    match = Q(pk__in=[])
    for pattern in scope:
        match |= Q(queue__regex=scopes.as_regex(pattern)) if any(c in pattern for c in "*?") else Q(queue=pattern)
    return match


def ready_tasks(now: datetime, queue: str | None = None, *, scope: scopes.Scope = None, using: str = "default"):
    """QUEUED tasks past their retry backoff (in `queue` when given, in a key's `scope` when
    given), best first: highest priority, then oldest. The order claim_next takes them in."""
    rows = Task.objects.using(using).filter(stage=Stage.QUEUED).filter(
        Q(not_before__isnull=True) | Q(not_before__lte=now))
    if queue is not None:
        rows = rows.filter(queue=queue)
    if scope is not None:
        rows = rows.filter(in_scope(scope))
    return rows.order_by(*CLAIM_ORDER)


def has_ready_task(queue: str | None = None, *, scope: scopes.Scope = None, using: str = "default") -> bool:
    """Whether some task is ready to claim, read without a transaction: a waiting claim asks
    this first, so that idle agents do not take SQLite's write lock several times a second."""
    return ready_tasks(timezone.now(), queue, scope=scope, using=using).exists()


# ---------------------------------------------------------------------------------------------
# Reads for the live board (board.live: its frames, parked claims and insights panel). The
# outbox's own cursor query is not here: it is a read path of its own (board.live.outbox).


def live_tasks(task_ids: list[str], *, using: str = "default") -> dict[str, tuple[dict, list[str]]]:
    """The tasks `task_ids` as they are now, as card rows (dicts of CARD_COLUMNS as JSON values,
    as `board_parts` yields them), each with its dependencies, for the live board's changes frame
    (board.live.frames.changes_for). A task no longer there is left out. Only the card columns
    are read: a page of 1000 events of tasks with 256 KiB checkpoints would otherwise load
    hundreds of MB into every server process."""
    rows = Task.objects.using(using).filter(pk__in=task_ids).values_list(*_ROW_COLUMNS)
    return {row["id"]: (row, deps) for row, deps in _with_deps([_card_row(values) for values in rows], using)}


def queues_of_queued(task_ids: list[str], *, using: str = "default") -> dict[str, str]:
    """The queue of each of `task_ids` that is QUEUED now (one query): which parked claims a
    batch of events may wake (board.live.parked.newly_ready)."""
    return dict(Task.objects.using(using).filter(pk__in=set(task_ids), stage=Stage.QUEUED)
                .values_list("pk", "queue"))


def ready_counts(wanted: dict[str | None, int], *, using: str = "default") -> dict[str | None, int]:
    """How many ready tasks each queue of `wanted` has (None: any queue), counting no further
    than `wanted[queue]`: the parked claims' poll (board.live.parked). One bounded query per
    queue, without a transaction, like has_ready_task."""
    now = timezone.now()
    return {queue: len(ready_tasks(now, queue, using=using).values_list("pk", flat=True)[:n])
            for queue, n in wanted.items()}


# The insights panel's reads (board.live.insights.compute). Each is one query and they are not
# one transaction, on purpose: see that module's docstring (a read transaction over both
# tables deadlocked with a TRUNCATE of them).

# What counts as an agent's heartbeat: a claim, a resume or a renew.
HEARTBEAT_VERBS = (Verb.CLAIM, Verb.RESUME, Verb.RENEW)


def history_window(start: datetime, *, since_id: int = 0, using: str = "default") -> tuple[list[tuple], dict, int | None]:
    """The history from `start` on (ids from `since_id` on: the window only moves forward, and
    the history has no index on `at`): (every move but renews, the bulk of a busy history, oldest
    first, as (id, task_id, verb, from_stage, to_stage, actor, at) rows; each actor's latest
    heartbeat; the id of the first renew, or None)."""
    in_window = TaskEvent.objects.using(using).filter(id__gte=since_id, at__gte=start)
    moves = list(in_window.exclude(verb=Verb.RENEW).order_by("id").values_list(
        "id", "task_id", "verb", "from_stage", "to_stage", "actor", "at"))
    heartbeats = dict(in_window.filter(verb__in=HEARTBEAT_VERBS).order_by()
                      .values_list("actor").annotate(last=Max("at")).values_list("actor", "last"))
    first_renew = in_window.filter(verb=Verb.RENEW).order_by("id").values_list("id", flat=True).first()
    return moves, heartbeats, first_renew


def held_tasks(*, using: str = "default") -> list[tuple[str, str]]:
    """(owner, task id) of every RUNNING task, by owner then id."""
    return list(Task.objects.using(using).filter(stage=Stage.RUNNING).exclude(owner="")
                .order_by("owner", "id").values_list("owner", "id"))


def queued_per_queue(*, using: str = "default") -> dict[str, int]:
    """How many tasks each queue has QUEUED now (queues with none are left out)."""
    return dict(Task.objects.using(using).filter(stage=Stage.QUEUED).order_by()
                .values_list("queue").annotate(n=Count("id")).values_list("queue", "n"))


def queues_of(task_ids: list[str], *, using: str = "default") -> dict[str, str]:
    """The queue of each task (fixed at creation), by primary key: the join, made here so that
    it is an indexed read on every store (the store's joins_cheaply)."""
    queues: dict[str, str] = {}
    for begin in range(0, len(task_ids), _CHUNK):  # bounded IN lists, however many ids
        queues.update(Task.objects.using(using).filter(pk__in=task_ids[begin:begin + _CHUNK])
                      .values_list("pk", "queue"))
    return queues


# ---------------------------------------------------------------------------------------------
# Reads for the engine's moves and passes (board.engine.transitions). Inside a move's write
# transaction they read what that transaction sees; the passes (admission, the reaper) read
# their candidates first, without a transaction, and each move then re-reads its own row.


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
    rows = Task.objects.using(using).filter(stage=Stage.PENDING, hold=False)
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
    return list(Dependency.objects.using(using).filter(depends_on_id=task_id).values_list("task_id", flat=True))


def expired_leases(now: datetime, *, limit: int, task_ids: Iterable[str] | None = None,
                   using: str = "default") -> list[str]:
    """Ids of up to `limit` RUNNING tasks whose lease expired by `now` (only among `task_ids`
    when given), longest expired first: what the reaper takes back."""
    expired = Task.objects.using(using).filter(stage=Stage.RUNNING, lease_expires_at__lte=now)
    if task_ids is not None:
        expired = expired.filter(pk__in=list(task_ids))
    return list(expired.order_by("lease_expires_at").values_list("pk", flat=True)[:limit])


# ---------------------------------------------------------------------------------------------
# Reads for the API (board.api.endpoints). Single queries, no transaction: a page is as the
# store is when each query runs.


def tasks_by_id(task_ids: list[str], *, using: str = "default") -> dict[str, Task]:
    """The existing tasks among `task_ids`, by id."""
    return {task.pk: task for task in Task.objects.using(using).filter(pk__in=task_ids)}


def created_on_hold(task_ids: list[str], *, using: str = "default") -> set[str]:
    """Those of `task_ids` that were created on hold. Their create event records it: the task's
    own `hold` is cleared by an admit."""
    return {
        task_id for task_id, detail in TaskEvent.objects.using(using)
        .filter(task_id__in=task_ids, verb=Verb.CREATE).values_list("task_id", "detail")
        if detail and detail.get("hold")
    }


def task_list(*, stages: list[str] | None = None, queue: str | None = None, owner: str | None = None,
              text: str | None = None, order: str = "created", after: tuple | None = None, count: int,
              scope: scopes.Scope = None, using: str = "default") -> list[Task]:
    """Up to `count` tasks in `order` (LIST_ORDERS: "created", oldest first; "claim", the order
    claim_next takes them in), after the task whose `list_key` is `after` when given, among
    those in `stages`, in `queue`, held by `owner`, whose id or title contains `text`
    (case-insensitive), for each filter given. The caller has checked them. `scope`: a key's
    queue patterns; the others' tasks are not listed."""
    rows = Task.objects.using(using).filter(in_scope(scope))
    if stages:
        rows = rows.filter(stage__in=stages)
    if queue:
        rows = rows.filter(queue=queue)
    if owner:
        rows = rows.filter(owner=owner)
    if text:
        rows = rows.filter(Q(id__icontains=text) | Q(title__icontains=text))
    fields = LIST_ORDERS[order]
    if after is not None:
        rows = rows.filter(_after(fields, after))
    return list(rows.order_by(*fields)[:count])


def list_key(task: Task, order: str) -> tuple:
    """The values of `task` that task_list's `order` sorts by: a page's cursor."""
    return tuple(getattr(task, field.lstrip("-")) for field in LIST_ORDERS[order])


def _after(fields: tuple[str, ...], key: tuple) -> Q:
    """The rows after `key` in the order `fields` ("-name": descending): after on the first
    field, or equal on it and after on the rest."""
    after = Q()
    for position in reversed(range(len(fields))):
        name = fields[position].lstrip("-")
        beyond = Q(**{f"{name}__{'lt' if fields[position].startswith('-') else 'gt'}": key[position]})
        after = beyond if position == len(fields) - 1 else beyond | Q(**{name: key[position]}) & after
    return after


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
# Reads for commands (board.management.commands: the demo follows its own run by id prefix).


def stage_of(task_id: str, *, using: str = "default") -> str | None:
    """The task's stage, or None when there is no such task."""
    return Task.objects.using(using).filter(pk=task_id).values_list("stage", flat=True).first()


def ids_starting_with(prefix: str, *, stage: str, using: str = "default") -> list[str]:
    """Ids of the tasks in `stage` whose id starts with `prefix`."""
    return list(Task.objects.using(using).filter(pk__startswith=prefix, stage=stage).values_list("pk", flat=True))


def count_starting_with(prefix: str, *, excluding: Iterable[str] = (), using: str = "default") -> int:
    """How many tasks whose id starts with `prefix` are in none of the stages `excluding`."""
    return Task.objects.using(using).filter(pk__startswith=prefix).exclude(stage__in=list(excluding)).count()


# ---------------------------------------------------------------------------------------------
# Reads for the admin (board/admin/): its filters' choices, the rows an action is held to, what
# a stale edit missed, a task's dependencies and latest history. Its change lists are Django's
# own querysets over Task; everything else it reads is here.


def queue_names(limit: int | None = None, *, using: str = "default") -> list[str]:
    """The queues that hold a task, by name, at most `limit` of them (one DISTINCT, served by
    the queue index)."""
    names = Task.objects.using(using).order_by("queue").values_list("queue", flat=True).distinct()
    return list(names if limit is None else names[:limit])


def running_owners(limit: int, *, using: str = "default") -> list[str]:
    """The agents holding leases now (only RUNNING tasks have an owner), by name, at most `limit`."""
    return list(
        Task.objects.using(using).filter(stage=Stage.RUNNING).exclude(owner="")
        .order_by("owner").values_list("owner", flat=True).distinct()[:limit]
    )


def lease_filter(state: str, now) -> Q | None:
    """Tasks whose lease is `state` at `now` (a datetime or the store's clock as an expression,
    `clock.in_query()`): "live", "expired" (a RUNNING task's lease from its expiry on, the rule
    of lifecycle.lease_expired that the reaper applies), "none"; None for any other state."""
    if state == "live":
        return Q(stage=Stage.RUNNING, lease_expires_at__gt=now)
    if state == "expired":
        return Q(stage=Stage.RUNNING, lease_expires_at__lte=now)
    if state == "none":
        return Q(lease_expires_at__isnull=True)
    return None


# What an operator's action reads of each selected task: the version (or lease) its verb is held
# to, and what its report says of the task.
ACTION_ROW_FIELDS = (
    "id", "title", "stage", "version", "owner", "lease_expires_at", "fence", "attempts", "max_retries",
    "has_checkpoint",
)


def action_rows(tasks, limit: int) -> list[dict]:
    """The tasks of the queryset `tasks` as they are now, by id, as dicts of ACTION_ROW_FIELDS
    (`has_checkpoint`: whether one is saved, without reading it); at most `limit` + 1, so that
    the caller can tell a selection over its limit."""
    return list(
        tasks.annotate(has_checkpoint=ExpressionWrapper(Q(checkpoint__isnull=False), BooleanField()))
        .order_by("pk").values(*ACTION_ROW_FIELDS)[: limit + 1]
    )


def moves_since(task_id: str, version: int, limit: int, *, using: str = "default") -> list[tuple[str, str]]:
    """(verb, actor) of the task's moves after `version`, oldest first, at most `limit`."""
    return list(
        TaskEvent.objects.using(using).filter(task_id=task_id, version__gt=version)
        .order_by("id").values_list("verb", "actor")[:limit]
    )


def dependencies_with_stages(task_id: str, *, using: str = "default") -> list[tuple[str, str]]:
    """(id, stage) of each task `task_id` depends on, by id."""
    return list(
        Dependency.objects.using(using).filter(task_id=task_id)
        .order_by("depends_on_id").values_list("depends_on_id", "depends_on__stage")
    )


def latest_event_ids(task_id: str, limit: int, *, using: str = "default") -> list[int]:
    """The ids of the task's `limit` most recent history rows. Ids, not a sliced Subquery to
    filter by: MongoDB's backend drops a subquery's slice."""
    return list(
        TaskEvent.objects.using(using).filter(task_id=task_id).order_by("-id").values_list("id", flat=True)[:limit]
    )


# ---------------------------------------------------------------------------------------------
# Reads for metrics (board.metrics computes its gauges from these at scrape time: one grouped
# query each, nothing kept between scrapes).


def tasks_by_stage_and_queue(*, using: str = "default") -> dict[tuple[str, str], int]:
    """How many tasks are in each (stage, queue) that has any."""
    rows = Task.objects.using(using).values_list("stage", "queue").annotate(n=Count("id")).order_by()
    return {(stage, queue): n for stage, queue, n in rows}


def oldest_queued_by_queue(*, using: str = "default") -> dict[str, datetime]:
    """For each queue with QUEUED tasks, when its longest-waiting one entered QUEUED (backoff
    included: a task waiting out its retry delay is waiting too). A row written outside the
    engine may have no stage_changed_at: its last write bounds it, as in board.public."""
    rows = (Task.objects.using(using).filter(stage=Stage.QUEUED).values_list("queue")
            .annotate(oldest=Min(Coalesce("stage_changed_at", "updated_at"))).order_by())
    return dict(rows)


def live_lease_count(now: datetime | None = None, *, using: str = "default") -> int:
    """RUNNING tasks whose lease has not expired by `now` (default: the store's clock)."""
    now = now or clock.now(using)
    return Task.objects.using(using).filter(stage=Stage.RUNNING, lease_expires_at__gt=now).count()
