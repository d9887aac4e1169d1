"""The board at any moment (issue 33, item 4): every task's stage, version and owner at a time T,
the counts, and check()'s problems, rebuilt from the history (TaskEvent). Reads only; the design,
the retention rule and the limits: docs/board-at.md.

A task's state at T is its last history row with `at <= T` (rows of one task are in id order,
which is version order: every move is one compare-and-swap). Its owner is the actor of the last
claim or resume row at or before T when that state is RUNNING (a takeover is a reclaim row and
then a claim row), else none. A task whose first row (its create) is after T is absent.

On the SQL stores the counts are one statement grouping the history by task ("the latest row per
task at or before T"); a page walks the tasks in id order, each task's last row at or before T
found through the event_task_history index (task, id), and stops after the page; the first page
(with the problems) reads every task's state once and derives the counts and the page from it.
MongoDB folds the rows at or before T in Python: exact, slower on a big board.

The prune (board.engine.retention) deletes old finished tasks whole, and moves the history's
horizon (HistoryHorizon.exact_from) to the newest row it deleted: before it a deleted task may be
missing, so every answer says whether it is exact. Collapsed renews change nothing here but the
version inside a collapsed span (a renew moves only the version): see docs/board-at.md.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

from django.db.models import Count, Max, OuterRef, Subquery

from board.engine import scopes
from board.engine.invariants import Problem, TaskSnapshot, check, tasks_on_cycles
from board.engine.lifecycle import Stage, Verb
from board.engine.retention import HORIZON  # HistoryHorizon's one row, which the prune writes
from board.engine.stores import store
from board.models import Dependency, HistoryHorizon, Queue, Task, TaskEvent

# The rows that start a RUNNING stint: their actor is its owner.
STARTS_RUNNING = (Verb.CLAIM, Verb.RESUME)
# A lease's expiry is not in the history: a rebuilt RUNNING task gets this one, so check()'s
# lease_expired never fires at a past moment (docs/board-at.md, Problems).
_UNKNOWN_EXPIRY = datetime.max.replace(tzinfo=timezone.utc)
_CHUNK = 2000


@dataclass(frozen=True)
class Card:
    id: str
    stage: str
    version: int
    owner: str


@dataclass
class Moment:
    """The board at `at`, one page of it: `tasks` in id order after the caller's cursor, `last`
    the id to continue after (None: the last page). `counts` and `exact` are the whole board's
    (as far as the scope reaches)."""

    at: datetime
    counts: dict[str, int]
    tasks: list[Card]
    last: str | None
    exact_from: datetime | None  # None: the prune never deleted a task's history
    exact: bool
    first_event_at: datetime | None = None
    problems: list[Problem] = field(default_factory=list)


def horizon(*, using: str = "default") -> datetime | None:
    """The oldest moment the board can be rebuilt exactly at (None: any moment)."""
    return HistoryHorizon.objects.using(using).filter(name=HORIZON).values_list("exact_from", flat=True).first()


def board_at(at: datetime, *, scope: scopes.Scope = None, after: str | None = None, limit: int = 500,
             with_problems: bool = False, using: str = "default") -> Moment:
    """One page of the board at `at` (tasks with ids after `after`), the counts of the whole board
    at `at`, and (with_problems) check()'s problems of the rebuilt board. `scope`: a key's queue
    patterns; only their tasks are counted and listed. One read transaction."""
    with store(using).read_transaction():
        queues = _queues(scope, using)
        exact_from = horizon(using=using)
        history = TaskEvent.objects.using(using)
        first = history.order_by("pk").values_list("at", flat=True).first()
        stages = None
        if store(using).speaks_sql:
            if with_problems:  # every task's state, read once: the counts, the page and check() share it
                states = _sql_states(at, using)
                stages = {task_id: stage for task_id, (stage, _) in states.items()}
                counts, rows = _from_states(states, queues, after, limit, using)
            else:
                counts = _sql_counts(at, queues, using)
                rows = _sql_page(at, queues, after, limit, using)
            owners = _sql_owners(at, [r[0] for r in rows if r[1] == Stage.RUNNING], using)
        else:
            counts, rows, owners = _folded(at, queues, after, limit, using)
        found = problems_at(at, scope=scope, stages=stages, using=using) if with_problems else []
    last = rows[limit - 1][0] if len(rows) > limit else None
    cards = [Card(task_id, stage, version, owners.get(task_id, "") if stage == Stage.RUNNING else "")
             for task_id, stage, version in rows[:limit]]
    return Moment(at=at, counts={stage.value: counts.get(stage.value, 0) for stage in Stage}, tasks=cards,
                  last=last, exact_from=exact_from, exact=exact_from is None or at >= exact_from,
                  first_event_at=first, problems=found)


def events_around(at: datetime, *, scope: scopes.Scope = None, using: str = "default") -> tuple[datetime | None, datetime | None]:
    """The time of the last history row before `at` and of the first after it: a step back or
    forward one event on the board's time control."""
    rows = TaskEvent.objects.using(using)
    queues = _queues(scope, using)
    if queues is not None:
        rows = rows.filter(task_id__in=Task.objects.using(using).filter(queue__in=queues).values("pk"))
    # On the event_at index (a scoped key's: its queues' tasks, per row walked).
    before = rows.filter(at__lt=at).order_by("-at").values_list("at", flat=True).first()
    following = rows.filter(at__gt=at).order_by("at").values_list("at", flat=True).first()
    return before, following


def problems_at(at: datetime, *, scope: scopes.Scope = None, stages: dict[str, str] | None = None,
                using: str = "default") -> list[Problem]:
    """check() of the board rebuilt at `at` (`stages`: every task's stage then, when the caller
    has read them). What the history does not keep is given as harmless (docs/board-at.md): a
    RUNNING task holds its lease with an unknown expiry, a PAUSED one its checkpoint, a COMPLETED
    one its result, attempts are not counted, ranks not read. So only the dependency rules can
    find anything, and only through a dependency that had not completed at `at` (or one on the
    task itself, or a cycle): check() judges the tasks at the ends of those edges, with those
    edges, and its answer equals check() of the whole rebuilt board (tests/test_board_at.py
    holds it to that). A scoped key hears of its queues' tasks."""
    # Fetched whole (a server-side cursor's round trips cost more on PostgreSQL than the memory).
    edges = list(Dependency.objects.using(using).values_list("task_id", "depends_on_id"))
    if not edges:
        return []
    if stages is None:
        stages = _sql_stages(at, using) if store(using).speaks_sql else _stages_of(
            at, sorted({t for t, _ in edges} | {d for _, d in edges}), using)
    # The edges between tasks on a cycle are judged too (for dep_cycle; normally none). An edge
    # lies on one only if something depends on its task and its dependency depends on something
    # (as selectors' _CYCLE_CANDIDATE_EDGES): only those are searched.
    depended_on = {d for _, d in edges}
    depending = {t for t, _ in edges}
    cyclic = tasks_on_cycles((t, d) for t, d in edges if t != d and t in depended_on and d in depending
                             and t in stages and d in stages)
    on_cycles = {(t, d) for t, d in edges if t in cyclic and d in cyclic}
    deps: dict[str, list[str]] = defaultdict(list)
    for task_id, dep in edges:
        if task_id in stages and (dep == task_id or stages.get(dep, Stage.COMPLETED) != Stage.COMPLETED
                                  or (task_id, dep) in on_cycles):
            deps[task_id].append(dep)
    wanted = {t for t in set(deps).union(*deps.values()) if t in stages}
    running = [t for t in wanted if stages[t] == Stage.RUNNING]
    owners = _sql_owners(at, running, using) if store(using).speaks_sql else _folded_owners(at, running, using)
    snapshots = [TaskSnapshot(id=task_id, stage=stages[task_id], deps=tuple(deps.get(task_id, ())),
                              owner=owners.get(task_id, "?") if stages[task_id] == Stage.RUNNING else "",
                              has_token=stages[task_id] == Stage.RUNNING,
                              lease_expires_at=_UNKNOWN_EXPIRY if stages[task_id] == Stage.RUNNING else None,
                              has_checkpoint=True, has_result=True)
                 for task_id in sorted(wanted)]
    found = check(snapshots, at)
    if scope is not None:
        queues = dict(Task.objects.using(using).filter(pk__in=sorted({p.task for p in found})).values_list("pk", "queue"))
        found = [p for p in found if p.task in queues and scopes.allows(scope, queues[p.task])]
    return found


# ---------------------------------------------------------------------------------------------
# The SQL stores: each read one statement over the history grouped by task.

def _latest(at: datetime, queues: list[str] | None, using: str, **where):
    """The ids of each task's last row at or before `at` (a subquery)."""
    rows = TaskEvent.objects.using(using).filter(at__lte=at, **where)
    if queues is not None:
        rows = rows.filter(task__queue__in=queues)
    return rows.order_by().values("task_id").annotate(last=Max("pk")).values("last")


def _sql_counts(at: datetime, queues: list[str] | None, using: str) -> dict[str, int]:
    return dict(TaskEvent.objects.using(using).filter(pk__in=_latest(at, queues, using))
                .order_by().values("to_stage").annotate(n=Count("pk")).values_list("to_stage", "n"))


def _sql_states(at: datetime, using: str) -> dict[str, tuple[str, int]]:
    """Every task's (stage, version) at `at`: one statement (the tasks created later are absent)."""
    return {task_id: (stage, version) for task_id, stage, version in
            TaskEvent.objects.using(using).filter(pk__in=_latest(at, None, using))
            .values_list("task_id", "to_stage", "version")}


def _sql_stages(at: datetime, using: str) -> dict[str, str]:
    return {task_id: stage for task_id, (stage, _) in _sql_states(at, using).items()}


def _from_states(states: dict[str, tuple[str, int]], queues: list[str] | None, after: str | None, limit: int,
                 using: str) -> tuple[dict[str, int], list[tuple]]:
    """The counts and a page from every task's state (a scoped key's: its queues' tasks only)."""
    if queues is not None:
        allowed = set(Task.objects.using(using).filter(queue__in=queues).values_list("pk", flat=True))
        states = {task_id: state for task_id, state in states.items() if task_id in allowed}
    page = sorted(task_id for task_id in states if after is None or task_id > after)[:limit + 1]
    return Counter(stage for stage, _ in states.values()), [(task_id, *states[task_id]) for task_id in page]


def _sql_page(at: datetime, queues: list[str] | None, after: str | None, limit: int, using: str) -> list[tuple]:
    """A page: the tasks after `after` in id order, each with its last row at or before `at`
    (found through the event_task_history index, newest first), skipping those created later;
    stops after `limit` + 1 tasks."""
    tasks = Task.objects.using(using)
    if after is not None:
        tasks = tasks.filter(pk__gt=after)
    if queues is not None:
        tasks = tasks.filter(queue__in=queues)
    last = TaskEvent.objects.using(using).filter(task_id=OuterRef("pk"), at__lte=at).order_by("-pk").values("pk")[:1]
    ids = list(tasks.annotate(last=Subquery(last)).filter(last__isnull=False).order_by("pk")
               .values_list("last", flat=True)[:limit + 1])
    return list(TaskEvent.objects.using(using).filter(pk__in=ids).order_by("task_id")
                .values_list("task_id", "to_stage", "version"))


def _sql_owners(at: datetime, task_ids: list[str], using: str) -> dict[str, str]:
    owners: dict[str, str] = {}
    for start in range(0, len(task_ids), _CHUNK):
        chunk = task_ids[start:start + _CHUNK]
        starts = (TaskEvent.objects.using(using).filter(task_id__in=chunk, at__lte=at, verb__in=STARTS_RUNNING)
                  .order_by().values("task_id").annotate(last=Max("pk")).values("last"))
        owners.update(TaskEvent.objects.using(using).filter(pk__in=starts).values_list("task_id", "actor"))
    return owners


def _stages_of(at: datetime, task_ids: list[str], using: str) -> dict[str, str]:
    """MongoDB: the stage at `at` of each of `task_ids` that existed then."""
    stages: dict[str, str] = {}
    for start in range(0, len(task_ids), _CHUNK):
        chunk = task_ids[start:start + _CHUNK]
        for task_id, stage in (TaskEvent.objects.using(using).filter(task_id__in=chunk, at__lte=at)
                               .order_by("pk").values_list("task_id", "to_stage")):
            stages[task_id] = stage
    return stages


# ---------------------------------------------------------------------------------------------
# MongoDB (any store without SQL): the rows at or before `at`, folded in id order.

def _folded(at: datetime, queues: list[str] | None, after: str | None, limit: int, using: str):
    rows = TaskEvent.objects.using(using).filter(at__lte=at)
    if queues is not None:
        rows = rows.filter(task_id__in=Task.objects.using(using).filter(queue__in=queues).values("pk"))
    state: dict[str, tuple[str, int]] = {}
    owners: dict[str, str] = {}
    for task_id, verb, stage, version, actor in rows.order_by("pk").values_list(
            "task_id", "verb", "to_stage", "version", "actor").iterator(_CHUNK):
        state[task_id] = (stage, version)
        if verb in STARTS_RUNNING:
            owners[task_id] = actor
    counts = Counter(stage for stage, _ in state.values())
    page = sorted(t for t in state if after is None or t > after)[:limit + 1]
    return counts, [(t, *state[t]) for t in page], owners


def _folded_owners(at: datetime, task_ids: list[str], using: str) -> dict[str, str]:
    owners: dict[str, str] = {}
    for task_id, actor in (TaskEvent.objects.using(using).filter(task_id__in=task_ids, at__lte=at,
                                                                  verb__in=STARTS_RUNNING)
                           .order_by("pk").values_list("task_id", "actor")):
        owners[task_id] = actor
    return owners


def _queues(scope: scopes.Scope, using: str) -> list[str] | None:
    """The queues a scope reaches (None: every queue). Every queue with a task has a Queue row
    (made by its first create)."""
    if scope is None:
        return None
    names = set(Queue.objects.using(using).values_list("name", flat=True))
    return sorted(name for name in names if scopes.allows(scope, name))
