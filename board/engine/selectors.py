"""Read-only queries: snapshots for `check`, task lists and histories. Nothing here writes."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime

from django.db import connections
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q
from django.utils import timezone

from board.engine import clock
from board.engine.db import read_transaction, speaks_sql
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
from board.engine.lifecycle import DEAD_ENDS, LEASED, TERMINAL, Stage
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
    with read_transaction(using):
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
    if not speaks_sql(using):
        # A store without SQL (MongoDB): check() of the whole snapshot, which this is defined
        # as. Slower on a big board (every task is read), exact on any.
        return sorted(check(snapshot(using=using), now))
    with read_transaction(using):
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


# What a card shows of a task (board.live.events.card_task): every public field but the bulky ones
# (description, payload, checkpoint, result), which the board never reads.
CARD_COLUMNS = ("id", "title", "queue", "priority", "hold", "max_retries", "stage", "version", "owner",
                "fence", "lease_expires_at", "attempts", "not_before", "progress", "last_error",
                "created_at", "updated_at", "stage_changed_at")


def board_parts(*, terminal_limit: int = 200, part_size: int = 1000, using: str = "default") -> Iterator:
    """The live board as one consistent read (read_transaction: no write lock), a part at a
    time so that a board of any size is never all in memory: first a head {"counts" (per
    stage), "last_event_id" (the last event the read includes)}, then lists of up to `part_size`
    (row, deps) pairs: every unfinished task (best first, as claim_next orders them), then the
    `terminal_limit` most recently finished per terminal stage (the page asks for more on
    demand). A row is a dict of CARD_COLUMNS as JSON values (datetimes as the API writes them,
    `json_time`), streamed from the database without building a model instance or a datetime
    per task. Close the generator (or exhaust it) to end the read."""
    with read_transaction(using):
        tasks = Task.objects.using(using)
        last_event_id = TaskEvent.objects.using(using).order_by("-id").values_list("id", flat=True).first() or 0
        counts = {stage.value: 0 for stage in Stage}
        for stage, n in tasks.values_list("stage").annotate(n=Count("id")).order_by():
            counts[stage] = n
        yield {"counts": counts, "last_event_id": last_event_id}
        queries = [tasks.exclude(stage__in=list(TERMINAL)).order_by("-priority", "created_at", "id")]
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
    if not speaks_sql(using):  # MongoDB: the ORM's values, streamed in batches
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
    if wanted and not speaks_sql(using):
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


def ready_tasks(now: datetime, queue: str | None = None, *, using: str = "default"):
    """QUEUED tasks past their retry backoff (in `queue` when given), best first: highest
    priority, then oldest. The order claim_next takes them in."""
    rows = Task.objects.using(using).filter(stage=Stage.QUEUED).filter(
        Q(not_before__isnull=True) | Q(not_before__lte=now))
    if queue is not None:
        rows = rows.filter(queue=queue)
    return rows.order_by("-priority", "created_at", "pk")


def has_ready_task(queue: str | None = None, *, using: str = "default") -> bool:
    """Whether some task is ready to claim, read without a transaction: a waiting claim asks
    this first, so that idle agents do not take SQLite's write lock several times a second."""
    return ready_tasks(timezone.now(), queue, using=using).exists()


# ---------------------------------------------------------------------------------------------
# Reads for the admin (board/admin/): its filters' choices, the rows an action is held to, what
# a stale edit missed, a task's dependencies and latest history. Its change lists are Django's
# own querysets over Task; everything else it reads is here.


def queue_names(*, using: str = "default") -> list[str]:
    """Every queue that holds a task (one DISTINCT, served by the queue index)."""
    return list(Task.objects.using(using).order_by("queue").values_list("queue", flat=True).distinct())


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


def stage_of(task_id: str, *, using: str = "default") -> str | None:
    """The task's stage, or None when there is no such task."""
    return Task.objects.using(using).filter(pk=task_id).values_list("stage", flat=True).first()
