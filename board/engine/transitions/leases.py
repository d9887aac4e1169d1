"""THE only module that changes a task's stage, version or lease. One function per verb.

Every move is one compare-and-swap: a conditional UPDATE filtered on the task's id, the stage
and version it was read at (and, for a holder's verb, the hash of its lease token), setting the
new stage with version + 1 in the same statement. A match count of 0 means another writer moved
first: the verb reloads the row and either tries again (when the move is still legal) or raises
the precise error from `board.engine.errors`. The TaskEvent of a move is inserted in the same
transaction, so history and state never disagree, and an error leaves the database untouched.

Tokens are minted here (`secrets`; for a claim sent with a request id, derived from a minted
seed: `board.engine.claim_requests`), never by the caller; only their SHA-256 is stored. Lease expiries
come from the store's clock (`board.engine.clock`: PostgreSQL's, or this process's on SQLite) and a TTL
the caller gives. The fence rises by one on every claim, resume and takeover, and never on renew.

On MongoDB a compare-and-swap that races another transaction's write to the same task does not
match 0 rows: the store aborts the transaction (a WriteConflict). Every public verb is wrapped
by `board.engine.stores.retry_conflicts`, which runs it again from the start, where it reads the winner's
row and either moves again or raises the same precise error as after a lost CAS.

Row locks are not the concurrency mechanism (SQLite has none): the CAS is. `claim_next` skips
locked rows where the store can (the store's `skip_locked`) only so that concurrent
claimers pick different candidates instead of queueing behind the same row.

The hot verbs (claim_next, renew, complete) have two implementations of the same move: the
hand-written statements of the SQL stores (`store(using).statements`, board.engine.stores: one
conditional UPDATE with RETURNING each, no read before it), and the ORM path below for any other
store or when settings.TASKFLOW["HOT_PATH"] is "orm". Both raise the same
errors: on a statement that matched nothing the hot path reloads the row and judges it with the
same checks as the ORM path (`_refuse_holder`).

Each public verb wears `tracing.traced` (outermost): a span per call while tracing is on
(board.engine.tracing); off, one test of a global.
"""
from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q

from board.engine import (
    claim_requests,
    clock,
    commits,
    errors,
    outcomes,
    scopes,
    selectors,
    tracing,
)
from board.engine.claim_requests import ClaimRequest
from board.engine.stores.statements import Statements
from board.engine.stores import retry_conflicts, store
from board.engine.lifecycle import (
    MAX_BATCH_DEPENDENCIES,
    MAX_BATCH_TASKS,
    MAX_DEPENDENCIES,
    MAX_DESCRIPTION_CHARS,
    MAX_ERROR_CHARS,
    MAX_REASON_CHARS,
    MAX_RETRIES_LIMIT,
    MAX_TITLE_CHARS,
    MAX_TRACEBACK_CHARS,
    MAX_TTL_SECONDS,
    MIN_TTL_SECONDS,
    TERMINAL,
    Stage,
    Verb,
    attempts_left,
    is_valid_task_id,
    lease_expired,
    limit_json_size,
    retry_backoff_seconds,
    target,
    unstorable_text,
)
from board.engine.tokens import hash_token, token_text
from board.models import AgentKey, Dependency, Task, TaskEvent

log = logging.getLogger("board.engine.transitions")

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
    hold: bool = False
    max_retries: int = 3


# ---------------------------------------------------------------------------------------------
# The compare-and-swap and its helpers


def _mint_token() -> str:
    return token_text(secrets.token_bytes(32))


def _ttl(ttl_seconds: float) -> timedelta:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)):
        raise errors.InvalidRequest("ttl_seconds must be a number", field="ttl_seconds")
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise errors.InvalidRequest(
            f"ttl_seconds must be between {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS}", field="ttl_seconds"
        )
    return timedelta(seconds=ttl_seconds)


def _json_value(name: str, value: Any) -> None:
    """Refuse what is not strict JSON (NaN, Infinity, non-JSON types) before it reaches the
    database, which would refuse it with a less helpful error (or, on SQLite, a CHECK failure)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidRequest(f"{name} is not valid JSON: {exc}", field=name) from None


def _agent_name(agent: str) -> str:
    if not isinstance(agent, str) or not agent.strip() or len(agent) > 200:
        raise errors.InvalidRequest("agent must be a non-empty name of at most 200 characters")
    return agent


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
    if rows.update(**changes) != 1:
        outcomes.record(using, verb, outcomes.LOST_RACE)
        return False
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


# ---------------------------------------------------------------------------------------------
# Creating tasks


@tracing.traced(Verb.CREATE, names_task=False)
@outcomes.refusals(Verb.CREATE)
@retry_conflicts
def create(specs: TaskSpec | Sequence[TaskSpec], *, actor: str = "", using: str = "default") -> list[Task]:
    """Create one task or a batch forming a DAG, all or nothing.

    A task starts QUEUED when it is not on hold and every dependency is already COMPLETED, and
    PENDING otherwise. Refused: invalid fields, ids already taken (DuplicateId), unknown
    dependencies, self-dependencies and cycles (InvalidRequest), and a batch over
    MAX_BATCH_TASKS tasks or MAX_BATCH_DEPENDENCIES dependencies (TooLarge), which would hold
    every other writer for too long."""
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
    seen: set[str] = set()
    for task_id in ids:
        if task_id in seen:
            raise errors.InvalidRequest(f"task id {task_id!r} appears twice in the batch", field="id")
        seen.add(task_id)
    _refuse_cycles(batch)

    now = clock.now(using)
    external = {dep for spec in batch for dep in spec.deps if dep not in seen}
    depended_on = {dep for spec in batch for dep in spec.deps}
    with store(using).write_transaction():
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
        tasks = []
        for spec in batch:
            ready = not spec.hold and all(dep_stages.get(dep) == Stage.COMPLETED for dep in spec.deps)
            tasks.append(
                Task(
                    id=spec.id,
                    title=spec.title,
                    description=spec.description,
                    payload=spec.payload,
                    queue=spec.queue,
                    priority=spec.priority,
                    hold=spec.hold,
                    max_retries=spec.max_retries,
                    has_deps=bool(spec.deps),
                    has_dependents=spec.id in depended_on,
                    stage=Stage.QUEUED if ready else Stage.PENDING,
                    version=0,
                    created_at=now,
                    updated_at=now,
                    stage_changed_at=now,
                )
            )
        try:
            with store(using).savepoint():  # a racing creator of the same id
                Task.objects.using(using).bulk_create(tasks)
        except IntegrityError:
            taken = Task.objects.using(using).filter(pk__in=ids).first()
            if taken is None:  # not an id collision: let the real error surface
                raise
            raise errors.DuplicateId(
                f"a task with id {getattr(taken, 'pk', ids[0])!r} already exists", task=taken, field="id"
            ) from None
        _insert_dependencies(using, [(spec.id, dep) for spec in batch for dep in spec.deps])
        TaskEvent.objects.using(using).bulk_create(
            [
                TaskEvent(task_id=t.pk, verb=Verb.CREATE, from_stage="", to_stage=t.stage,
                          version=0, fence=0, actor=actor, at=now, detail={"hold": True} if t.hold else None)
                for t in tasks
            ]
        )
        commits.after_commit(using)
        outcomes.record(using, Verb.CREATE, outcomes.WON, count=len(tasks))
        # A dependency may complete while this transaction is open; its own admission pass
        # cannot see these uncommitted tasks, so look again once they are committed.
        waiting = [t.pk for t in tasks if t.stage == Stage.PENDING and not t.hold]
        if waiting and external:
            transaction.on_commit(lambda: admit_ready(waiting, using=using), using=using, robust=True)
    return tasks


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
    if not isinstance(spec.hold, bool):
        raise errors.InvalidRequest("hold must be true or false", field="hold")
    limit_json_size("payload", spec.payload)
    _json_value("payload", spec.payload)
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


# ---------------------------------------------------------------------------------------------
# Admission: PENDING -> QUEUED


@tracing.traced(Verb.ADMIT)
@outcomes.refusals(Verb.ADMIT)
@retry_conflicts
def admit(task_id: str, *, actor: str, version: int | None = None, reason: str = "",
          using: str = "default") -> Task:
    """Operator: admit a PENDING task (on hold or not) whose dependencies are all COMPLETED."""
    _check_reason(reason)

    def move(task: Task, now: datetime) -> bool:
        if task.stage != Stage.PENDING:
            raise _illegal(task, Verb.ADMIT)
        unfinished = selectors.unfinished_deps(task.pk, using=using)
        if unfinished:
            raise errors.Blocked(f"waiting for {', '.join(sorted(unfinished))}", task=task)
        return _swap(using, task, Verb.ADMIT, now=now, actor=actor, detail=_reason(reason), hold=False)

    return _operator_move(using, task_id, version, move)


@retry_conflicts
def admit_ready(task_ids: Iterable[str] | None = None, *, using: str = "default") -> list[str]:
    """Admit every PENDING task, not on hold, whose dependencies are all COMPLETED (only among
    `task_ids` when given). Each admission is its own CAS; returns the ids admitted.

    Called after a completion commits, after a creation commits, and by the reaper's sweep, so
    a task can never stay blocked on a dependency that has completed."""
    candidates = selectors.admission_candidates(task_ids, using=using)
    admitted = []
    for task_id in candidates:
        with store(using).write_transaction():
            task = Task.objects.using(using).filter(pk=task_id).first()
            if task is None or task.stage != Stage.PENDING or task.hold:
                continue
            if selectors.unfinished_deps(task_id, using=using):
                continue
            if _swap(using, task, Verb.ADMIT, now=clock.now(using), actor="system", guard=Q(hold=False)):
                admitted.append(task_id)
    return admitted


# ---------------------------------------------------------------------------------------------
# Claiming: QUEUED -> RUNNING, and PAUSED -> RUNNING (resume)


@tracing.traced(Verb.CLAIM)
@outcomes.refusals(Verb.CLAIM)
@retry_conflicts
def claim(task_id: str, agent: str, ttl_seconds: float, *, request_id: str | None = None,
          using: str = "default") -> Claim:
    """Claim this task for `agent` with a new lease of `ttl_seconds`.

    A PENDING task whose dependencies have all completed is admitted on the way; a RUNNING task
    whose lease has expired is reclaimed and taken over (a new token, a higher fence). Refused:
    NotFound, Taken (a live lease), Blocked (dependencies, on hold, backoff), Terminal,
    InvalidTransition (PAUSED: resume it; FAILED: an operator may requeue it).

    With `request_id` (board.engine.claim_requests): when the task's live lease was made by this
    agent's claim with the same id, that lease is returned (same token and fence) and nothing
    is written. Two copies racing: the CAS lets one claim, the other re-reads and returns it."""
    ttl = _ttl(ttl_seconds)
    _agent_name(agent)
    request = claim_requests.of(agent, request_id)
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            if request is not None:
                token = claim_requests.token_if_made_by(task, request, agent, now)
                if token is not None:
                    return _claim_of(task, token)
            task = _claimable(using, task, now)
            if task is not None:
                won = _take(using, task, Verb.CLAIM, agent, ttl, now, request)
                if won is not None:
                    return won
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


def _admit_dependents(task_id: str, using: str) -> list[str]:
    dependents = selectors.dependents_of(task_id, using=using)
    return admit_ready(dependents, using=using) if dependents else []


def _claimable(using: str, task: Task, now: datetime) -> Task | None:
    """`task` as QUEUED and ready to claim, or None when a race was lost (reload and retry);
    raises the precise error when it cannot be claimed."""
    if task.stage == Stage.QUEUED:
        if task.not_before is not None and task.not_before > now:
            raise errors.Blocked(f"retry backoff until {task.not_before.isoformat()}", task=task)
        return task
    if task.stage == Stage.PENDING:
        unfinished = selectors.unfinished_deps(task.pk, using=using)
        if unfinished:
            raise errors.Blocked(f"waiting for {', '.join(sorted(unfinished))}", task=task)
        if task.hold:
            # The wire's message, kept as agents have read it ("held"); the code says "on hold".
            raise errors.Blocked("held until an operator admits it", task=task)
        # Its last dependency has just completed and the admission pass has not reached it yet.
        ok = _swap(using, task, Verb.ADMIT, now=now, actor="system", guard=Q(hold=False))
        return task if ok else None
    if task.stage == Stage.RUNNING:
        if not lease_expired(task.lease_expires_at, now):
            raise errors.Taken(f"task {task.pk} is held by {task.owner}", task=task)
        if not attempts_left(task.attempts, task.max_retries):
            raise errors.InvalidTransition(
                f"task {task.pk}'s lease expired on its last attempt; it is being failed", task=task
            )
        ok = _swap(using, task, Verb.RECLAIM, now=now, actor="system",
                   guard=Q(lease_expires_at__lte=now),
                   detail={"reason": "lease expired", "previous_owner": task.owner}, **NO_LEASE)
        if ok:  # a takeover: this claim takes back a lease that expired
            outcomes.record(using, Verb.RECLAIM, outcomes.EXPIRED, "claim")
        return task if ok else None
    if task.stage == Stage.PAUSED:
        raise _illegal(task, Verb.CLAIM, "resume it to continue from its checkpoint")
    if task.stage == Stage.FAILED:
        raise _illegal(task, Verb.CLAIM, "an operator may requeue it")
    raise _illegal(task, Verb.CLAIM)


def _claim_of(task: Task, token: str) -> Claim:
    """The answer a claim gave: the task as it is and its lease, now."""
    return Claim(task=task, lease=Lease(token=token, fence=task.fence, expires_at=task.lease_expires_at))


def _take(using: str, task: Task, verb: Verb, agent: str, ttl: timedelta, now: datetime,
          request: ClaimRequest | None = None) -> Claim | None:
    """Give `task` a new lease: a freshly minted token and the next fence, in one CAS. With a
    claim request, the token is derived from a minted seed and the request is recorded."""
    token, seed = request.mint() if request is not None else (_mint_token(), None)
    fence = task.fence + 1
    expires_at = now + ttl
    changes = {
        "owner": agent,
        "lease_token_hash": hash_token(token),
        "fence": fence,
        "lease_expires_at": expires_at,
        "not_before": None,
        "claim_request_hash": request.digest if request is not None else None,
        "claim_token_seed": seed,
    }
    if verb == Verb.CLAIM:  # a resume continues the paused attempt
        changes["attempts"] = task.attempts + 1
    if not _swap(using, task, verb, now=now, actor=agent, **changes):
        return None
    return Claim(task=task, lease=Lease(token=token, fence=fence, expires_at=expires_at))


@tracing.traced(Verb.CLAIM, names_task=False)
@outcomes.refusals(Verb.CLAIM)
@retry_conflicts
def claim_next(
    agent: str, ttl_seconds: float, *, queue: str | None = None, request_id: str | None = None,
    key_hash: str | None = None, scope: scopes.Scope = None, using: str = "default",
) -> Claim | None:
    """Claim the best ready task: highest priority, then oldest, among QUEUED tasks past their
    backoff (in `queue` when given). None when there is no ready task.

    With `request_id` (board.engine.claim_requests): when this agent's claim with the same id made a
    lease that is still live, that lease is returned (same task, token and fence) instead of
    claiming another task. Copies of one request are serialised, so they make one lease.

    `key_hash`: the agent key the caller acts with, when nobody checked it for this request
    (_require_live_key): the claim is made only while that key is live; else KeyRevoked.

    `scope`: the queue patterns of a scoped key (board.engine.scopes; issue 27): only a task of
    a matching queue is taken, and the filter is in the query that picks and claims it (the
    hot statement, or the ORM path's pick inside its write transaction), never checked before.
    A `queue` outside the scope has no task for this key: None. (A task's queue never changes,
    and a key's scope neither, so that answer needs no reading.)"""
    ttl = _ttl(ttl_seconds)
    _agent_name(agent)
    if queue is not None and not is_valid_task_id(queue):
        raise errors.InvalidRequest(f"invalid queue name {queue!r}")
    # --- queue scope (issue 27): a named queue is either wholly in scope or has nothing.
    if scope is not None and queue is not None:
        if not scopes.allows(scope, queue):
            _require_live_key(using, key_hash, agent)
            outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
            return None
        scope = None  # `queue = %s` alone picks only that queue's tasks
    request = claim_requests.of(agent, request_id)
    hot = store(using).statements
    if hot is not None:
        return _hot_claim_next(hot, using, agent, ttl, queue, request, key_hash, scope)
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            _require_live_key(using, key_hash, agent)
            if request is not None:
                claim_requests.serialise(using, request)
                made = claim_requests.made_by(using, request, agent)
                if made is not None:
                    return _claim_of(*made)
            now = clock.now(using)
            task = store(using).skip_locked(selectors.ready_tasks(now, queue, scope=scope, using=using)).first()
            if task is None:
                outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
                return None
            won = _take(using, task, Verb.CLAIM, agent, ttl, now, request)
            if won is not None:
                return won
    log.warning("claim_next by %s lost %d races in a row", agent, RACE_RETRIES)
    return None


def _hot_claim_next(hot: Statements, using: str, agent: str, ttl: timedelta,
                    queue: str | None, request: ClaimRequest | None, key_hash: str | None,
                    scope: scopes.Scope = None) -> Claim | None:
    """claim_next as one statement: pick, CAS and history together, nothing read before. On
    SQLite the pick runs under the write lock; on PostgreSQL it skips rows other claimers have
    locked. So a match count of 0 means no ready task (what the ORM path says after losing
    every race, too), never a lost race to retry.

    With a claim request (only then), the statement runs in a write transaction after the
    request is serialised and looked up: a live lease it made is returned instead."""
    if request is None:
        token, seed = _mint_token(), None
        context = hot.transaction()
    else:
        token, seed = request.mint()
        context = store(using).write_transaction()
    with context:
        if request is not None:
            _require_live_key(using, key_hash, agent)
            claim_requests.serialise(using, request)
            made = claim_requests.made_by(using, request, agent)
            if made is not None:
                return _claim_of(*made)
        row = hot.claim_next(agent, hash_token(token), ttl, queue,
                             request.digest if request is not None else None, seed, key_hash, scope)
    if row is None:
        # Nothing was ready, or the key is gone (the statement checks both): say which, out of
        # the transaction (nothing was written; on SQLite it holds the writers' lock).
        _require_live_key(using, key_hash, agent)
        outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
        return None
    _tell_hot_move(using, Verb.CLAIM)
    return _claim_of(hot.task(row), token)  # the task built out of the transaction: see HotStore


@tracing.traced(Verb.RESUME)
@outcomes.refusals(Verb.RESUME)
@retry_conflicts
def resume(task_id: str, agent: str, ttl_seconds: float, *, using: str = "default") -> Claim:
    """Take a PAUSED task with a new lease (new token, higher fence); its checkpoint is on the
    returned task."""
    ttl = _ttl(ttl_seconds)
    _agent_name(agent)
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            if task.stage == Stage.RUNNING and not lease_expired(task.lease_expires_at, now):
                raise errors.Taken(f"task {task.pk} is held by {task.owner}", task=task)
            if task.stage != Stage.PAUSED:
                raise _illegal(task, Verb.RESUME, "only a PAUSED task can be resumed")
            won = _take(using, task, Verb.RESUME, agent, ttl, now)
            if won is not None:
                return won
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


# ---------------------------------------------------------------------------------------------
# The holder's verbs: renew, release, complete, fail, pause. Each is refused with LeaseLost
# unless the token is the task's current lease.


def _holder_move(using: str, task_id: str, token: str, build, *, live_only: bool, agent: str | None,
                 key_hash: str | None = None):
    """Run a holder's verb: check the token against the row, then CAS on (stage, version, token
    hash). `build(task, now)` performs the swap(s) and returns the result, or None on a lost CAS.

    `agent`: when given (the API always gives it), the lease must also have been minted for
    this agent; otherwise Forbidden.

    `live_only`: renew refuses an expired lease (the seed's rule: past its expiry the holder has
    no right left to extend). complete/fail/pause/release accept a lease that has expired but
    has not been taken over: the token still proves nobody else holds the task."""
    token_hash = _token_hash(token)
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            _require_live_key(using, key_hash, agent)
            now = clock.now(using)
            task = _get(using, task_id)
            _refuse_holder(task, token_hash, now, live_only=live_only, agent=agent)
            result = build(task, now, token_hash)
            if result is not None:
                return result
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


def _tell_hot_move(using: str, verb: Verb) -> None:
    """A hot verb's move has been made: tell the board (board.engine.commits) and the counters
    (outcomes). After its transaction, which Django does not see on SQLite
    (db.statement_transaction): outside a caller's transaction both run now, after the move's
    commit; inside one, at the caller's commit."""
    commits.after_commit(using)
    outcomes.record(using, verb, outcomes.WON)


def _require_live_key(using: str, key_hash: str | None, agent: str | None) -> None:
    """KeyRevoked unless a live agent key with this hash, named `agent`, exists (no check when
    `key_hash` is None: the caller checked the key itself).

    Why a verb checks a key at all: the API looks a key up on every request (one query), except
    for the hot verbs (claim_next, renew, complete), which take a key this process verified in
    the last minute on trust and pass its hash here (board.agent_keys.authenticate_deferred).
    The hot statements check it in the move itself (board.engine.stores); this query is for the ORM path
    and for a move that matched nothing, to tell a gone key from the move's own refusal."""
    if key_hash is None:
        return
    if agent is None:
        raise ValueError("a key to check needs the agent's name")
    # Live: no end set, or its end (a rotated key's grace) still ahead by the store's clock.
    live = Q(revoked_at__isnull=True) | Q(revoked_at__gt=clock.in_query(using))
    if not AgentKey.objects.using(using).filter(live, key_hash=key_hash, name=agent).exists():
        raise errors.KeyRevoked()


def _token_hash(token: str) -> str:
    if not isinstance(token, str) or not token:
        raise errors.InvalidRequest("token is required", field="token")
    return hash_token(token)


def _refuse_holder(task: Task, token_hash: str, now: datetime, *, live_only: bool, agent: str | None) -> None:
    """Raise the precise error when the presenter of `token_hash` may not act on `task` as
    read at `now`; return when it may."""
    if task.stage != Stage.RUNNING or not hmac.compare_digest(task.lease_token_hash or "", token_hash):
        raise errors.LeaseLost(f"this token is not task {task.pk}'s current lease", task=task)
    if live_only and lease_expired(task.lease_expires_at, now):
        raise errors.LeaseLost(f"the lease on task {task.pk} has expired", task=task)
    if agent is not None and agent != task.owner:
        # A token is a credential, but it was minted for one agent: another agent presenting
        # it (a leak, a mix-up) acts as nobody.
        raise errors.Forbidden(f"task {task.pk}'s lease belongs to another agent", task=task)


def _hot_holder_move(hot: Statements, using: str, task_id: str, token_hash: str, move, *,
                     live_only: bool, agent: str | None, verb: Verb, key_hash: str | None = None) -> Task:
    """A holder's verb through the store's statements: `move()` runs the verb's one statement and returns
    the row as written, or None when it matched no row. Only then is the row read: it raises
    the error the ORM path would, or, when the move has become legal again (the row changed
    between the statement and the read), the statement runs again."""
    for _ in range(RACE_RETRIES):
        with hot.transaction():
            row = move()
        if row is not None:
            _tell_hot_move(using, verb)
            return hot.task(row)  # out of the transaction: see HotStore
        _require_live_key(using, key_hash, agent)  # the statement checks it too: say which refused
        _refuse_holder(_get(using, task_id), token_hash, clock.now(using), live_only=live_only, agent=agent)
        outcomes.record(using, verb, outcomes.LOST_RACE)  # not refused: the row moved between the two
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


@tracing.traced(Verb.RENEW)
@outcomes.refusals(Verb.RENEW)
@retry_conflicts
def renew(
    task_id: str,
    token: str,
    ttl_seconds: float,
    *,
    checkpoint: Any = None,
    progress: float | None = None,
    agent: str | None = None,
    key_hash: str | None = None,
    using: str = "default",
) -> Claim:
    """Extend a live lease to now + ttl, keeping token and fence; optionally save a checkpoint
    and progress. Wrong token or an expired lease: LeaseLost, nothing changed. `key_hash`: as
    for claim_next (needs `agent`)."""
    ttl = _ttl(ttl_seconds)
    _check_progress(progress)
    limit_json_size("checkpoint", checkpoint)
    _json_value("checkpoint", checkpoint)
    hot = store(using).statements
    if hot is not None:
        token_hash = _token_hash(token)
        task = _hot_holder_move(
            hot, using, task_id, token_hash,
            lambda: hot.renew(task_id, token_hash, agent, ttl, checkpoint, progress, key_hash),
            live_only=True, agent=agent, verb=Verb.RENEW, key_hash=key_hash)
        return Claim(task=task, lease=Lease(token=token, fence=task.fence, expires_at=task.lease_expires_at))

    def build(task: Task, now: datetime, token_hash: str):
        changes: dict[str, Any] = {"lease_expires_at": now + ttl}
        if checkpoint is not None:
            changes["checkpoint"] = checkpoint
        if progress is not None:
            changes["progress"] = progress
        # The guard re-checks expiry in the statement itself: check and extension are one step.
        if _swap(using, task, Verb.RENEW, now=now, actor=task.owner, token_hash=token_hash,
                 guard=Q(lease_expires_at__gt=now), **changes):
            return Claim(task=task, lease=Lease(token=token, fence=task.fence, expires_at=task.lease_expires_at))
        return None

    return _holder_move(using, task_id, token, build, live_only=True, agent=agent, key_hash=key_hash)


@tracing.traced(Verb.RELEASE)
@outcomes.refusals(Verb.RELEASE)
@retry_conflicts
def release(task_id: str, token: str, *, agent: str | None = None, using: str = "default") -> Task:
    """Hand the task back to the queue. The attempt is given back: releasing is not failing."""

    def build(task: Task, now: datetime, token_hash: str):
        ok = _swap(using, task, Verb.RELEASE, now=now, actor=task.owner, token_hash=token_hash,
                   attempts=max(0, task.attempts - 1), **NO_LEASE)
        return task if ok else None

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent)


@tracing.traced(Verb.COMPLETE)
@outcomes.refusals(Verb.COMPLETE)
@retry_conflicts
def complete(task_id: str, token: str, result: Any, *, agent: str | None = None, key_hash: str | None = None,
             using: str = "default") -> Task:
    """Commit the result; then admit the dependents this completion unblocks (after commit, each
    by its own CAS, so that two dependencies completing at once cannot both miss the other).
    `key_hash`: as for claim_next (needs `agent`)."""
    if result is None:
        raise errors.InvalidRequest("result is required (use {} for a task with no output)", field="result")
    limit_json_size("result", result)
    _json_value("result", result)
    hot = store(using).statements
    if hot is not None:
        token_hash = _token_hash(token)
        task = _hot_holder_move(
            hot, using, task_id, token_hash,
            lambda: hot.complete(task_id, token_hash, agent, result, key_hash),
            live_only=False, agent=agent, verb=Verb.COMPLETE, key_hash=key_hash)
        # has_dependents as written, read under the row's lock. Registered after the move's
        # transaction: outside a caller's transaction it runs now (the move has committed),
        # inside one at its commit.
        if task.has_dependents:
            _admit_dependents_after_commit(task.pk, using)
        return task

    def build(task: Task, now: datetime, token_hash: str):
        # Without dependents when read, the CAS also pins has_dependents = false: a dependent
        # created meanwhile (transitions.create sets the flag in its transaction) makes this
        # CAS fail and the retry read the flag, so its admission cannot be skipped.
        guard = None if task.has_dependents else Q(has_dependents=False)
        ok = _swap(using, task, Verb.COMPLETE, now=now, actor=task.owner, token_hash=token_hash,
                   guard=guard, result=result, **NO_LEASE)
        if not ok:
            return None
        if task.has_dependents:
            _admit_dependents_after_commit(task.pk, using)
        return task

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent, key_hash=key_hash)


def _admit_dependents_after_commit(task_id: str, using: str) -> None:
    # Dependents are read after commit, not here: a dependent created concurrently commits
    # either before that read (and is found) or after this commit (and its own after-commit
    # check sees this task COMPLETED). Read now, both could miss each other.
    transaction.on_commit(lambda: _admit_dependents(task_id, using), using=using, robust=True)


@tracing.traced(Verb.FAIL)
@outcomes.refusals(Verb.FAIL)
@retry_conflicts
def fail(
    task_id: str, token: str, error: str, *, retryable: bool = True, traceback: str | None = None,
    agent: str | None = None, using: str = "default",
) -> Task:
    """Record a failed attempt. With attempts left and `retryable`, the task goes straight back
    to QUEUED behind an exponential backoff (FAIL then RETRY, one transaction); otherwise it
    stays FAILED.

    The error (and `traceback`, when given) is kept in this failure's history row, not only in
    the task's `last_error`, which the next failure overwrites: every attempt keeps its own."""
    if not isinstance(error, str):
        raise errors.InvalidRequest("error must be text", field="error")
    if len(error) > MAX_ERROR_CHARS:
        raise errors.InvalidRequest(f"error must be at most {MAX_ERROR_CHARS} characters", field="error")
    if traceback is not None and not isinstance(traceback, str):
        raise errors.InvalidRequest("traceback must be text", field="traceback")
    if traceback is not None and len(traceback) > MAX_TRACEBACK_CHARS:
        raise errors.InvalidRequest(f"traceback must be at most {MAX_TRACEBACK_CHARS} characters", field="traceback")
    for name, text in (("error", error), ("traceback", traceback)):
        if problem := unstorable_text(text):
            raise errors.InvalidRequest(f"{name} {problem}", field=name)
    detail = failure_detail(error, traceback, retryable)

    def build(task: Task, now: datetime, token_hash: str):
        if not _swap(using, task, Verb.FAIL, now=now, actor=task.owner, token_hash=token_hash,
                     detail=detail, last_error=error, **NO_LEASE):
            return None
        if retryable and attempts_left(task.attempts, task.max_retries):
            _retry(using, task, now)
        else:
            outcomes.record(using, Verb.FAIL, outcomes.TERMINAL, "attempts_spent" if retryable else "not_retryable")
        return task

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent)


def failure_detail(error: str, traceback: str | None, retryable: bool) -> dict:
    """What a FAIL event records of the failure (board.live.insights and the board's attempt
    timeline read it)."""
    detail: dict[str, Any] = {"error": error}
    if traceback:
        detail["traceback"] = traceback
    detail["retryable"] = retryable
    return detail


def _retry(using: str, task: Task, now: datetime) -> None:
    conf = settings.TASKFLOW
    delay = retry_backoff_seconds(
        task.attempts, conf["RETRY_BACKOFF_BASE_SECONDS"], conf["RETRY_BACKOFF_MAX_SECONDS"]
    )
    not_before = now + timedelta(seconds=delay)
    # Same transaction as the FAIL just written, so this CAS cannot lose.
    if not _swap(using, task, Verb.RETRY, now=now, actor="system", not_before=not_before,
                 detail={"backoff_seconds": delay}):
        raise errors.VersionConflict("task changed inside its own transaction", task=task)


@tracing.traced(Verb.PAUSE)
@outcomes.refusals(Verb.PAUSE)
@retry_conflicts
def pause(task_id: str, token: str, checkpoint: Any, *, agent: str | None = None, using: str = "default") -> Task:
    """Release the lease and keep `checkpoint`, so that a later resume continues from it."""
    if checkpoint is None:
        raise errors.InvalidRequest("checkpoint is required to pause", field="checkpoint")
    limit_json_size("checkpoint", checkpoint)
    _json_value("checkpoint", checkpoint)

    def build(task: Task, now: datetime, token_hash: str):
        ok = _swap(using, task, Verb.PAUSE, now=now, actor=task.owner, token_hash=token_hash,
                   checkpoint=checkpoint, **NO_LEASE)
        return task if ok else None

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent)


def _check_progress(progress: float | None) -> None:
    if progress is None:
        return
    if isinstance(progress, bool) or not isinstance(progress, (int, float)) or not 0 <= progress <= 1:
        raise errors.InvalidRequest("progress must be a fraction from 0 to 1", field="progress")


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
    _check_reason(reason)

    def move(task: Task, now: datetime) -> bool:
        if task.stage not in (Stage.FAILED, Stage.PAUSED):
            raise _illegal(task, Verb.REQUEUE, "only FAILED or PAUSED tasks are requeued")
        attempts = 0 if reset_attempts else task.attempts
        if not attempts_left(attempts, task.max_retries):
            raise errors.InvalidTransition(
                f"task {task.pk} has no attempt left; requeue with reset_attempts", task=task,
                field="reset_attempts",
            )
        return _swap(using, task, Verb.REQUEUE, now=now, actor=actor, attempts=attempts,
                     not_before=None, detail=_reason(reason, reset_attempts=reset_attempts))

    return _operator_move(using, task_id, version, move)


@tracing.traced(Verb.CANCEL)
@outcomes.refusals(Verb.CANCEL)
@retry_conflicts
def cancel(task_id: str, *, actor: str, version: int | None = None, reason: str = "", using: str = "default") -> Task:
    """Operator: cancel a task that has not finished. A live lease is ended: its holder's
    later calls get LeaseLost."""
    _check_reason(reason)

    def move(task: Task, now: datetime) -> bool:
        if target(task.stage, Verb.CANCEL) is None:
            raise _illegal(task, Verb.CANCEL)
        return _swap(using, task, Verb.CANCEL, now=now, actor=actor, detail=_reason(reason), **NO_LEASE)

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
    _check_reason(reason)

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
    _check_reason(reason)

    def move(task: Task, now: datetime) -> bool:
        if task.stage != Stage.RUNNING:
            raise _illegal(task, Verb.FORCE_PAUSE, "only a RUNNING task can be paused")
        checkpoint = task.checkpoint if task.checkpoint is not None else {}
        detail = _reason(reason, previous_owner=task.owner, checkpoint_was_empty=task.checkpoint is None)
        return _swap(using, task, Verb.FORCE_PAUSE, now=now, actor=actor, detail=detail,
                     checkpoint=checkpoint, **NO_LEASE)

    return _operator_move(using, task_id, version, move)


EDITABLE = ("title", "description", "priority", "max_retries", "payload")


@tracing.traced(Verb.EDIT)
@outcomes.refusals(Verb.EDIT)
@retry_conflicts
def edit(task_id: str, *, actor: str, version: int, using: str = "default", **fields: Any) -> Task:
    """Operator: change what a task is (title, description, priority, max_retries, payload),
    only if it is still at `version`; otherwise VersionConflict and nothing is written."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise errors.InvalidRequest(f"not editable: {', '.join(sorted(unknown))}", field=min(unknown))

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
        detail = {"changed": sorted(changed)} if changed else None
        return _swap(using, task, Verb.EDIT, now=now, actor=actor, detail=detail, **changed)

    return _operator_move(using, task_id, version, move)


def _check_reason(reason: str) -> None:
    """An operator's reason (kept in the history row) meets its cap, whoever calls: the API's
    schema checks it too; a command or the admin does not go through that schema."""
    if not isinstance(reason, str):
        raise errors.InvalidRequest("reason must be text", field="reason")
    if len(reason) > MAX_REASON_CHARS:
        raise errors.InvalidRequest(f"reason must be at most {MAX_REASON_CHARS} characters", field="reason")
    if problem := unstorable_text(reason):
        raise errors.InvalidRequest(f"reason {problem}", field="reason")


def _reason(reason: str, **extra: Any) -> dict | None:
    detail = {k: v for k, v in extra.items() if v}
    if reason:
        detail["reason"] = reason
    return detail or None


# ---------------------------------------------------------------------------------------------
# The store's own housekeeping


@dataclass(frozen=True)
class Reclaimed:
    task_id: str
    to_stage: Stage


@retry_conflicts
def reclaim_expired(*, now: datetime | None = None, limit: int = 500, task_ids: Iterable[str] | None = None,
                    actor: str = "system:reaper", using: str = "default") -> list[Reclaimed]:
    """Take back every lease that expired by `now` (default: this store's clock): the task goes
    back to QUEUED, or to FAILED when its attempts are spent. Live leases are never touched.
    Each task is its own CAS; returns what was moved."""
    now = now or clock.now(using)
    moved = []
    for task_id in selectors.expired_leases(now, limit=limit, task_ids=task_ids, using=using):
        with tracing.moving(Verb.RECLAIM, task_id) as span, store(using).write_transaction():
            task = Task.objects.using(using).filter(pk=task_id).first()
            if task is None or task.stage != Stage.RUNNING or not task.lease_expires_at or task.lease_expires_at > now:
                continue  # renewed or finished meanwhile
            # The reason, as a failure's error is: the attempt timeline shows why the attempt ended.
            detail = {"previous_owner": task.owner, "lease_expired_at": task.lease_expires_at.isoformat(),
                      "reason": "lease expired"}
            guard = Q(lease_expires_at__lte=now)
            if attempts_left(task.attempts, task.max_retries):
                ok = _swap(using, task, Verb.RECLAIM, now=now, actor=actor, guard=guard,
                           detail=detail, **NO_LEASE)
            else:
                error = "lease expired on the last attempt"
                ok = _swap(using, task, Verb.FAIL, now=now, actor=actor, guard=guard,
                           detail={**detail, "error": error, "retryable": False}, last_error=error, **NO_LEASE)
                if ok:
                    outcomes.record(using, Verb.FAIL, outcomes.TERMINAL, "lease_expired")
            if ok:
                span.made(task)
                outcomes.record(using, Verb.RECLAIM if task.stage == Stage.QUEUED else Verb.FAIL,
                                outcomes.EXPIRED, "reaper")
                moved.append(Reclaimed(task_id, Stage(task.stage)))
    return moved
