"""Creating tasks: one task or a batch forming a DAG, all or nothing (field rules, ids,
dependencies, cycles refused)."""
from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction

from board.engine import capabilities, clock, commits, deadlines, errors, fairness, flow, outcomes, resources, search, selectors, tracing
from board.engine.inputs import is_valid_task_id, json_field, key_text, unstorable_text
from board.engine.lifecycle import DEAD_ENDS, Stage, Verb
from board.engine.limits import (
    MAX_BATCH_DEPENDENCIES,
    MAX_BATCH_TASKS,
    MAX_DEDUP_KEY_CHARS,
    MAX_DEADLINE_SECONDS,
    MAX_DEPENDENCIES,
    MAX_DESCRIPTION_CHARS,
    MAX_RETRIES_LIMIT,
    MAX_TITLE_CHARS,
)
from board.engine.stores import TransactionConflict, retry_conflicts, store
from board.engine.transitions.housekeeping import admit_ready
from board.models import LIVE_STAGES, Dependency, Task, TaskEvent


@dataclass
class TaskSpec:
    """What a creator says about a new task. `id` is generated when omitted."""

    title: str
    id: str | None = None
    description: str = ""
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    deps: Sequence[str] = field(default_factory=tuple)
    on_hold: bool = False
    max_retries: int = 3
    # Flow control (board.engine.flow): at most the key's limit of RUNNING tasks share the key;
    # `concurrency_limit` sets that limit (the latest create naming one says it; a new key: 1).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    # Claims of the tasks naming this rate key start no faster than the key's rate (set by
    # operators: flow.change_rate_key), whatever their queues.
    rate_key: str | None = None
    # Not claimable before this time (an aware datetime; the task's not_before, which a retry's
    # backoff later sets too).
    run_at: datetime | None = None
    # While a live task has this key, creating it again returns that task (see `create`).
    dedup_key: str | None = None
    # The claim order (board.engine.fairness): tasks of different keys take turns, a key of
    # weight w getting w turns for another's one (the latest create naming one says it; else 1).
    fairness_key: str | None = None
    fairness_weight: int | None = None
    # Labels to find it by (board.engine.search: `tag:NAME`): at most search.MAX_TAGS.
    tags: Sequence[str] | None = None
    # --- deadlines beside the lease (board.engine.deadlines; issue 29, item 7): whole seconds,
    # 1 to MAX_DEADLINE_SECONDS, or None for none. Applied by the reaper's pass.
    queue_timeout_seconds: int | None = None  # QUEUED (and claimable) this long: FAILED
    attempt_timeout_seconds: int | None = None  # one attempt's wall-clock limit
    progress_timeout_seconds: int | None = None  # no progress/checkpoint change this long: lease taken back
    # The finished task this one runs again (set by `replay` only: its create row says so).
    replay_of: str | None = None
    # Resource leases (board.engine.resources): names (exclusive) and {"name", "units"} (shared)
    # that a claim of the task takes with it, all or none.
    resources: Sequence | None = None
    # Capabilities (board.engine.capabilities): labels a claimer must all hold, and the labels a
    # claimer is preferred for ({label: weight}, or a list: weight 1 each).
    requires: Sequence[str] | None = None
    prefers: Any = None


# ---------------------------------------------------------------------------------------------
# Creating tasks


@tracing.traced(Verb.CREATE, names_task=False)
@outcomes.refusals(Verb.CREATE)
@retry_conflicts
def create(specs: TaskSpec | Sequence[TaskSpec], *, actor: str = "", using: str = "default") -> list[Task]:
    """Create one task or a batch forming a DAG, all or nothing. Returns the batch's tasks in its
    order, each with `deduplicated` set (True: an existing task returned in its place).

    A task starts QUEUED when it is not on hold and every dependency is already COMPLETED, and
    PENDING otherwise. Refused: invalid fields, ids already taken (DuplicateId), unknown
    dependencies, self-dependencies and cycles (InvalidRequest), and a batch over
    MAX_BATCH_TASKS tasks or MAX_BATCH_DEPENDENCIES dependencies (TooLarge), which would hold
    every other writer for too long.

    Dedup keys: a spec whose `dedup_key` a live task (not COMPLETED, FAILED or CANCELLED) holds
    creates nothing; that task is returned in its place, and the batch's dependencies on the
    spec's id depend on it instead. Racing creators of one key make one task: the live tasks'
    unique index on the key refuses the second insert, and the loser runs again and finds the
    winner's task."""
    batch = [specs] if isinstance(specs, TaskSpec) else list(specs)
    if not batch:
        raise errors.InvalidRequest("no task to create")
    if len(batch) > MAX_BATCH_TASKS:
        raise errors.TooLarge(f"a batch creates at most {MAX_BATCH_TASKS} tasks; this one has {len(batch)}")
    dependencies = sum(len(spec.deps) for spec in batch)
    if dependencies > MAX_BATCH_DEPENDENCIES:
        raise errors.TooLarge(f"a batch holds at most {MAX_BATCH_DEPENDENCIES} dependencies in all; "
                              f"this one has {dependencies}")
    for spec in batch:
        _validate_spec(spec)
        if spec.id is None:
            spec.id = secrets.token_hex(8)
    ids = [spec.id for spec in batch]
    order = list(ids)  # the answer's order (deduplicated specs leave `batch` below)
    seen: set[str] = set()
    for task_id in ids:
        if task_id in seen:
            raise errors.InvalidRequest(f"task id {task_id!r} appears twice in the batch", field="id")
        seen.add(task_id)
    _refuse_cycles(batch)
    keys = [spec.dedup_key for spec in batch if spec.dedup_key is not None]
    if len(set(keys)) != len(keys):
        raise errors.InvalidRequest("a dedup_key appears twice in the batch", field="dedup_key")

    flow.ensure_rows(using, (spec.queue for spec in batch),
                     (spec.concurrency_key for spec in batch if spec.concurrency_key is not None),
                     (spec.rate_key for spec in batch if spec.rate_key is not None))
    resources.ensure_rows(using, (node for spec in batch for node, _ in resources.needs(spec.resources)))

    now = clock.now(using)
    with store(using).write_transaction():
        stand_ins = _live_with_keys(using, batch) if keys else {}
        if stand_ins:
            batch = _without_deduplicated(batch, stand_ins)
            ids = [spec.id for spec in batch]
            seen = set(ids)
            if not batch:
                return [stand_ins[spec_id] for spec_id in order]
        external = {dep for spec in batch for dep in spec.deps if dep not in seen}
        depended_on = {dep for spec in batch for dep in spec.deps}
        taken = Task.objects.using(using).filter(pk__in=ids).first()
        if taken is not None:
            raise errors.DuplicateId(f"a task with id {taken.pk!r} already exists", task=taken, field="id")
        if external:
            # Mark the existing tasks these depend on, in this transaction, before reading their
            # stages: completing a task looks for dependents only when its row says it has
            # some. The race with a concurrent complete of such a task D:
            # - SQLite: transactions are serialised (BEGIN IMMEDIATE); either this commits
            #   first and the completion reads has_dependents = true, or the completion
            #   commits first and this reads D as COMPLETED.
            # - PostgreSQL: this UPDATE and the completion's CAS both write D's row, so one
            #   waits for the other. If this goes first, the completion's CAS re-reads the row
            #   after this commits, sees the flag and admits after its own commit, when these
            #   tasks are visible. If the completion goes first, it did not look (the flag was
            #   false), but then the stage read below runs after it committed and sees D
            #   COMPLETED (or, at the latest, the after-commit admit_ready of this creation
            #   does). The ORM path's CAS pins has_dependents for the same reason (complete).
            # A flag already true needs no write: the completion looks anyway, and the
            # after-commit pass of this creation covers a look that came too early.
            Task.objects.using(using).filter(pk__in=external, has_dependents=False).update(has_dependents=True)
        dep_stages = dict(
            Task.objects.using(using).filter(pk__in=external).values_list("pk", "stage")
        )
        unknown = sorted(external - dep_stages.keys())
        if unknown:
            raise errors.InvalidRequest(f"unknown dependencies: {', '.join(unknown)}", field="deps", unknown=unknown)
        flow.set_key_limits(using, {spec.concurrency_key: spec.concurrency_limit for spec in batch
                                    if spec.concurrency_limit is not None})
        fairness.set_weights(using, {spec.fairness_key: spec.fairness_weight for spec in batch
                                     if spec.fairness_weight is not None})
        tasks = []
        for spec in batch:
            ready = not spec.on_hold and all(dep_stages.get(dep) == Stage.COMPLETED for dep in spec.deps)
            tasks.append(
                Task(
                    id=spec.id,
                    title=spec.title,
                    description=spec.description,
                    payload=spec.payload,
                    queue=spec.queue,
                    priority=spec.priority,
                    on_hold=spec.on_hold,
                    max_retries=spec.max_retries,
                    concurrency_key=spec.concurrency_key,
                    rate_key=spec.rate_key,
                    not_before=spec.run_at,
                    dedup_key=spec.dedup_key,
                    fairness_key=spec.fairness_key,
                    tags=search.tags_list(list(spec.tags) if spec.tags is not None else None),
                    replay_of=spec.replay_of,
                    resources=spec.resources,
                    requires=spec.requires,
                    has_requires=spec.requires is not None,
                    prefers=spec.prefers,
                    **{name: getattr(spec, name) for name in deadlines.TIMEOUTS},
                    has_deps=bool(spec.deps),
                    has_dependents=spec.id in depended_on,
                    stage=Stage.QUEUED if ready else Stage.PENDING,
                    version=0,
                    created_at=now,
                    updated_at=now,
                    stage_changed_at=now,
                )
            )
        fairness.assign_ranks(using, tasks, now)
        try:
            with store(using).savepoint():  # a racing creator of the same id
                Task.objects.using(using).bulk_create(tasks)
        except IntegrityError:
            taken = Task.objects.using(using).filter(pk__in=ids).first()
            if taken is None and keys:
                # A racing creator's live task took one of the keys since the look above:
                # create again, and that look finds it (retry_conflicts runs the verb again).
                raise TransactionConflict("a racing create took a dedup_key of this batch") from None
            if taken is None:  # not an id collision: let the real error surface
                raise
            raise errors.DuplicateId(
                f"a task with id {getattr(taken, 'pk', ids[0])!r} already exists", task=taken, field="id"
            ) from None
        _insert_dependencies(using, [(spec.id, dep) for spec in batch for dep in spec.deps])
        resources.insert_needs(using, tasks)
        TaskEvent.objects.using(using).bulk_create(
            [
                TaskEvent(task_id=t.pk, verb=Verb.CREATE, from_stage="", to_stage=t.stage,
                          version=0, fence=0, actor=actor, at=now, detail=_create_detail(t))
                for t in tasks
            ]
        )
        commits.after_commit(using)
        outcomes.record(using, Verb.CREATE, outcomes.WON, count=len(tasks))
        # A dependency may complete while this transaction is open; its own admission pass
        # cannot see these uncommitted tasks, so look again once they are committed.
        waiting = [t.pk for t in tasks if t.stage == Stage.PENDING and not t.on_hold]
        if waiting and external:
            transaction.on_commit(lambda: admit_ready(waiting, using=using), using=using, robust=True)
    for task in tasks:
        task.deduplicated = False
    made = {task.pk: task for task in tasks}
    return [stand_ins.get(spec_id) or made[spec_id] for spec_id in order]


def replay(task_id: str, *, actor: str, payload: Any = None, new_id: str | None = None,
           using: str = "default") -> Task:
    """Run a finished task (COMPLETED, FAILED or CANCELLED) again as a new task: a copy of what
    its creator said (title, description, payload, queue, priority, retries, keys, tags,
    deadlines, and its dependencies, so that the copy gets the same inputs), with `payload`
    instead when given, under `new_id` (else a generated id), linked to the original by
    `replay_of` (its create row says so too). Not its dedup_key: the copy is a new run. The
    original is not touched. Refused (InvalidTransition, nothing written) for a task that has
    not finished, or whose dependency is FAILED or CANCELLED (the copy could never run)."""
    original = Task.objects.using(using).filter(pk=task_id).first()
    if original is None:
        raise errors.NotFound(f"no task with id {task_id!r}")
    if original.stage not in TERMINAL_OR_FAILED:
        raise errors.InvalidTransition(f"only a finished task runs again as new; {task_id} is {original.stage}",
                                       task=original)
    deps = selectors.deps_of_task(original, using=using)
    dead = sorted(pk for pk, stage in Task.objects.using(using).filter(pk__in=deps).values_list("pk", "stage")
                  if stage in DEAD_ENDS)
    if dead:
        raise errors.InvalidTransition(f"{task_id} depends on {', '.join(dead)}, which will never complete: "
                                       "a copy could not run", task=original, field="deps")
    spec = TaskSpec(
        id=new_id, title=original.title, description=original.description,
        payload=original.payload if payload is None else payload, queue=original.queue,
        priority=original.priority, deps=tuple(deps), max_retries=original.max_retries,
        concurrency_key=original.concurrency_key, rate_key=original.rate_key, fairness_key=original.fairness_key,
        tags=list(original.tags or []), replay_of=original.pk, resources=original.resources,
        requires=original.requires, prefers=original.prefers,
        **{name: getattr(original, name) for name in deadlines.TIMEOUTS})
    return create(spec, actor=actor, using=using)[0]


# A task that runs again as new has finished: COMPLETED, CANCELLED, or FAILED for good.
TERMINAL_OR_FAILED = frozenset({Stage.COMPLETED, Stage.CANCELLED, Stage.FAILED})


def _live_with_keys(using: str, batch: list[TaskSpec]) -> dict[str, Task]:
    """{spec id: the live task holding the spec's dedup_key} for the specs of `batch` whose key
    a live task holds, each marked `deduplicated`."""
    keyed = {spec.dedup_key: spec.id for spec in batch if spec.dedup_key is not None}
    found = {}
    for task in Task.objects.using(using).filter(dedup_key__in=list(keyed), stage__in=LIVE_STAGES):
        task.deduplicated = True
        found[keyed[task.dedup_key]] = task
    return found


def _without_deduplicated(batch: list[TaskSpec], stand_ins: dict[str, Task]) -> list[TaskSpec]:
    """The specs left to create, their dependencies on a deduplicated spec pointing at the live
    task that stands in for it (which exists, so it cannot close a cycle)."""
    rest = []
    for spec in batch:
        if spec.id in stand_ins:
            continue
        deps = tuple(dict.fromkeys(stand_ins[dep].pk if dep in stand_ins else dep for dep in spec.deps))
        rest.append(dataclasses.replace(spec, deps=deps))
    return rest


def _insert_dependencies(using: str, pairs: list[tuple[str, str]]) -> None:
    """Insert (task, depends_on) rows in one executemany. Every other writer waits while a batch
    is written: bulk_create spent ~50 us of Python per row building and compiling models, so
    MAX_BATCH_DEPENDENCIES rows held the writers for ~0.5 s; this takes a few ms."""
    if not pairs:
        return
    if not store(using).speaks_sql:
        Dependency.objects.using(using).bulk_create(
            [Dependency(task_id=task_id, depends_on_id=dep) for task_id, dep in pairs])
        return
    table = connections[using].ops.quote_name(Dependency._meta.db_table)
    task_col, dep_col = (connections[using].ops.quote_name(Dependency._meta.get_field(name).column)
                         for name in ("task", "depends_on"))
    with connections[using].cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({task_col}, {dep_col}) VALUES (%s, %s)", pairs)


def _validate_spec(spec: TaskSpec) -> None:
    if spec.id is not None and not is_valid_task_id(spec.id):
        raise errors.InvalidRequest(
            f"invalid task id {spec.id!r}: 1-100 characters of letters, digits and ._:- "
            "starting with a letter or digit", field="id",
        )
    if not isinstance(spec.title, str) or not spec.title.strip() or len(spec.title) > MAX_TITLE_CHARS:
        raise errors.InvalidRequest(f"title must be non-empty text of at most {MAX_TITLE_CHARS} characters",
                                    field="title")
    if not isinstance(spec.description, str) or len(spec.description) > MAX_DESCRIPTION_CHARS:
        raise errors.InvalidRequest(f"description must be text of at most {MAX_DESCRIPTION_CHARS} characters",
                                    field="description")
    for name in ("title", "description", "payload"):
        if problem := unstorable_text(getattr(spec, name)):
            raise errors.InvalidRequest(f"{name} {problem}", field=name)
    if not is_valid_task_id(spec.queue):
        raise errors.InvalidRequest(f"invalid queue name {spec.queue!r}", field="queue")
    if isinstance(spec.priority, bool) or not isinstance(spec.priority, int) or abs(spec.priority) > 2**31 - 1:
        raise errors.InvalidRequest("priority must be a 32-bit integer", field="priority")
    if (
        isinstance(spec.max_retries, bool)
        or not isinstance(spec.max_retries, int)
        or not 0 <= spec.max_retries <= MAX_RETRIES_LIMIT
    ):
        raise errors.InvalidRequest(f"max_retries must be an integer from 0 to {MAX_RETRIES_LIMIT}",
                                    field="max_retries")
    if not isinstance(spec.on_hold, bool):
        raise errors.InvalidRequest("on_hold must be true or false", field="on_hold")
    json_field("payload", spec.payload)
    if spec.run_at is not None and (not isinstance(spec.run_at, datetime) or spec.run_at.tzinfo is None
                                    or spec.run_at.utcoffset() is None):
        raise errors.InvalidRequest("run_at must be a time with its zone (ISO 8601, e.g. 2026-12-04T14:05:00Z)",
                                    field="run_at")
    _validate_deadlines(spec)
    flow.concurrency_key(spec.concurrency_key)
    flow.rate_key(spec.rate_key)
    key_text(spec.dedup_key, "dedup_key", MAX_DEDUP_KEY_CHARS)
    fairness.fairness_key(spec.fairness_key)
    fairness.fairness_weight(spec.fairness_weight)
    if spec.tags is not None and not isinstance(spec.tags, (list, tuple)):
        raise errors.InvalidRequest("tags must be a list of tags", field="tags")
    search.tags_list(list(spec.tags) if spec.tags is not None else None)
    spec.resources = resources.declared(spec.resources)
    spec.requires = capabilities.requires_list(spec.requires)
    spec.prefers = capabilities.prefers_map(spec.prefers)
    if spec.fairness_weight is not None and spec.fairness_key is None:
        raise errors.InvalidRequest("fairness_weight needs a fairness_key", field="fairness_weight")
    flow.concurrency_limit(spec.concurrency_limit, "concurrency_limit")
    if spec.concurrency_limit is not None and spec.concurrency_key is None:
        raise errors.InvalidRequest("concurrency_limit needs a concurrency_key", field="concurrency_limit")
    deps = list(spec.deps)
    if len(deps) > MAX_DEPENDENCIES:
        raise errors.InvalidRequest(f"at most {MAX_DEPENDENCIES} dependencies", field="deps")
    for dep in deps:
        if not is_valid_task_id(dep):
            raise errors.InvalidRequest(f"invalid dependency id {dep!r}", field="deps")
    if len(set(deps)) != len(deps):
        raise errors.InvalidRequest("a dependency is listed twice", field="deps")
    if spec.id is not None and spec.id in deps:
        raise errors.InvalidRequest(f"task {spec.id} depends on itself", field="deps")
    spec.deps = tuple(deps)


def _validate_deadlines(spec: TaskSpec) -> None:
    """Each deadline is None or a whole number of seconds from 1 to MAX_DEADLINE_SECONDS (a bool
    is not a number here, nor is 1.5: a deadline of a fraction of a second is a mistake)."""
    for name in deadlines.TIMEOUTS:
        value = getattr(spec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_DEADLINE_SECONDS):
            raise errors.InvalidRequest(f"{name} must be a whole number of seconds from 1 to {MAX_DEADLINE_SECONDS}",
                                        field=name)


def _refuse_cycles(batch: list[TaskSpec]) -> None:
    """Existing tasks cannot depend on new ones, so a cycle can only lie inside the batch."""
    graph = {spec.id: [d for d in spec.deps] for spec in batch}
    white, grey, black = 0, 1, 2
    colour = {task_id: white for task_id in graph}
    for root in graph:
        if colour[root] != white:
            continue
        stack = [(root, iter(graph[root]))]
        colour[root] = grey
        path = [root]
        while stack:
            node, children = stack[-1]
            child = next((c for c in children if c in graph), None)
            if child is None:
                colour[node] = black
                stack.pop()
                path.pop()
            elif colour[child] == grey:
                cycle = path[path.index(child):] + [child]
                raise errors.InvalidRequest(
                    f"dependency cycle: {' -> '.join(cycle)}", field="deps", cycle=cycle
                )
            elif colour[child] == white:
                colour[child] = grey
                stack.append((child, iter(graph[child])))
                path.append(child)



def _create_detail(task: Task) -> dict | None:
    """The create row's detail: on_hold, and a run_at (the time its wait counts from, for
    board.engine.timing; the task's not_before is cleared by its claim)."""
    detail = {}
    if task.on_hold:
        detail["on_hold"] = True
    if task.not_before is not None:
        detail["run_at"] = task.not_before.isoformat()
    if task.replay_of is not None:
        detail["replay_of"] = task.replay_of
    return detail or None
