"""Tasks: create (one or a DAG), list a page, one task, a task's history, and an operator's edit.
Reads ask the engine's selectors; creating calls transitions.create, editing transitions.edit.
"""
from __future__ import annotations

import json
from datetime import timedelta
from typing import Literal, Optional, Union

from django.core.serializers.json import DjangoJSONEncoder
from ninja import Body, Query, Router, Status

from board.api import reads
from board.api.auth import in_scope, may_create_in, require_creator, require_operator, require_reader, visible
from board.api.errors import ERRORS
from board.api.pagination import (
    cursor_after,
    cursor_of,
    decode_cursor,
    encode_cursor,
    is_event_id,
    page_limit,
)
from board.api.schemas import (
    CreatedTaskOut,
    EventPage,
    TaskBatchIn,
    TaskBatchOut,
    TaskEditIn,
    TaskIn,
    TaskOut,
    TaskPage,
    TaskUsageOut,
    UsageOut,
)
from board.engine import capabilities, clock, deadlines, errors, listing, resources, scopes, selectors, transitions, usage
from board.engine.inputs import json_field
from board.engine.limits import MAX_PAGE, MAX_PAGE_BYTES
from board.engine.transitions import TaskSpec
from board.models import Task
from board.public import public_event, public_task

router = Router()

PAGE_READ_ROWS = 20  # a task page's rows are read this many at a time (_task_page)


def _spec(item: TaskIn) -> TaskSpec:
    # The engine checks it too (for every caller); here, for every task of the batch before
    # the engine looks at any, so that an oversized payload is a 413 whatever else is wrong.
    json_field("payload", item.payload)
    return TaskSpec(title=item.title, id=item.id, description=item.description, payload=item.payload,
                    queue=item.queue, priority=item.priority, deps=tuple(item.deps), on_hold=item.on_hold,
                    max_retries=item.max_retries, concurrency_key=item.concurrency_key,
                    concurrency_limit=item.concurrency_limit, rate_key=item.rate_key, run_at=item.run_at,
                    dedup_key=item.dedup_key, fairness_key=item.fairness_key, fairness_weight=item.fairness_weight,
                    tags=item.tags,
                    resources=None if item.resources is None else [
                        r if isinstance(r, str) else r.model_dump() for r in item.resources],
                    requires=item.requires, prefers=item.prefers,
                    queue_timeout_seconds=item.queue_timeout_seconds,
                    attempt_timeout_seconds=item.attempt_timeout_seconds,
                    progress_timeout_seconds=item.progress_timeout_seconds)


def _same_as_existing(specs: list[TaskSpec]) -> list[Task] | None:
    """The existing tasks when every spec names one with the same creation fields (an
    idempotent retry of a create); otherwise None."""
    if any(spec.id is None for spec in specs):
        return None
    existing = selectors.tasks_by_id([s.id for s in specs])
    deps = selectors.deps_of(list(existing))
    # `on_hold` is compared as created (the create event records it): an admit clears it later.
    created_on_hold = reads.created_on_hold(list(existing))
    for spec in specs:
        task = existing.get(spec.id)
        if task is None or (task.title, task.description, task.payload, task.queue, task.priority,
                            sorted(deps[task.pk]), task.pk in created_on_hold, task.max_retries,
                            task.concurrency_key, task.dedup_key, task.rate_key, task.fairness_key,
                            list(task.tags or [])) != (
                spec.title, spec.description, spec.payload, spec.queue, spec.priority,
                sorted(spec.deps), spec.on_hold, spec.max_retries, spec.concurrency_key, spec.dedup_key, spec.rate_key,
                spec.fairness_key, list(dict.fromkeys(spec.tags or []))):
            return None
        if any(getattr(task, name) != getattr(spec, name) for name in deadlines.TIMEOUTS):
            return None  # its deadlines differ: not a retry of the same create
        if task.resources != resources.declared(spec.resources):
            return None
        if (task.requires, task.prefers) != (capabilities.requires_list(spec.requires),
                                             capabilities.prefers_map(spec.prefers)):
            return None
    for task in existing.values():
        task.deduplicated = False  # the same create again, not another create with its key
    return [existing[spec.id] for spec in specs]


def _refuse_unreadable_stand_ins(request, principal, tasks: list[Task]) -> None:
    """A deduplicated create answers with the live task holding the key: only to a caller who
    may read it (a key's scope may not cover its queue; a session may create without reading)."""
    for task in tasks:
        if task.deduplicated and not (principal.can_read and scopes.allows(request.auth.scope, task.queue)):
            raise errors.DuplicateId(f"a live task you may not read holds the dedup_key {task.dedup_key!r}",
                                     field="dedup_key")


@router.post("/tasks", response={200: Union[CreatedTaskOut, TaskBatchOut], 201: Union[CreatedTaskOut, TaskBatchOut],
                                 **ERRORS},
             summary="Create a task, or a list of tasks forming a DAG (all or nothing)")
def create_tasks(request, body: Union[TaskIn, TaskBatchIn] = Body(...)):
    """An existing id with an identical body returns the existing task (200): a client may
    retry a create safely. A different body under an existing id is `duplicate_id`. A key
    limited to some queues creates only in them (403 `forbidden` otherwise), and a dependency on
    a task outside them is unknown to it.

    A `dedup_key` that a live task holds returns that task with `deduplicated: true` and creates
    nothing (200; in a batch, the batch's dependencies on it depend on that task, and the answer
    is 201 when the batch created any task). Every answered task carries `deduplicated`."""
    principal = require_creator(request)
    batch = isinstance(body, list)
    specs = [_spec(item) for item in (body if batch else [body])]
    if not specs:
        raise errors.InvalidRequest("an empty list creates nothing")
    may_create_in(principal, specs)
    status = 201
    try:
        tasks = transitions.create(specs, actor=request.auth.name)
    except errors.DuplicateId:
        # The retry's answer is the existing task: only for a caller who may read it (a
        # session with board.add_task alone gets duplicate_id, without the task).
        tasks = _same_as_existing(specs) if principal.can_read else None
        if tasks is None:
            raise
        status = 200
    _refuse_unreadable_stand_ins(request, principal, tasks)
    if all(task.deduplicated for task in tasks):
        status = 200
    # The engine answers in the batch's order; a dependency on a deduplicated spec is one on
    # the task that stands in for it.
    stand_in = {spec.id: task.pk for task, spec in zip(tasks, specs)}
    deps = selectors.deps_of([t.pk for t in tasks if t.deduplicated])
    deps.update({task.pk: list(dict.fromkeys(stand_in.get(dep, dep) for dep in spec.deps))
                 for task, spec in zip(tasks, specs) if not task.deduplicated})
    rendered = [{**public_task(t, deps[t.pk]), "deduplicated": t.deduplicated} for t in tasks]
    return Status(status, {"items": rendered} if batch else rendered[0])


def _query(request, allowed: set[str], repeatable: frozenset[str] = frozenset()) -> None:
    """A misspelt filter (?stages=) must not silently return everything, nor a repeated one
    (?limit=1&limit=500) silently pick one of its values."""
    unknown = sorted(set(request.GET) - allowed)
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(allowed))}")
    repeated = sorted(name for name, values in request.GET.lists() if len(values) > 1 and name not in repeatable)
    if repeated:
        raise errors.InvalidRequest(f"query parameter {repeated[0]!r} is given more than once")


# The task list's orders, as the engine names them (its schema lists them as an enum).
ListOrder = Literal[tuple(reads.LIST_ORDERS)]


@router.get("/tasks", response={200: TaskPage, **ERRORS},
         summary="List tasks, oldest first (or in claim order), a page at a time")
def list_tasks(request, stage: list[str] = Query(None), queue: Optional[str] = None,
               owner: Optional[str] = None, text: Optional[str] = None,
               search: Optional[str] = Query(None, description="a search line: words and qualifiers (tag:urgent "
                                             "queue:ci-* owner:w-3 stage:failed error:timeout payload.repo:acme/web "
                                             "created:<2h); every term must match. See docs/api.md, Searching tasks"),
               order: ListOrder = Query("created", description="created: oldest first (the default); claim: the order "
                                  "claim-next takes tasks in (claim_rank, then id: priority, aging, fairness keys); "
                                  "newest: most recently created first; updated: most recently changed first; "
                                  "priority: highest first, oldest first among equals; in_stage: longest in its "
                                  "stage first (RUNNING: the longest running)"),
               cursor: Optional[str] = None, limit: int = 100):
    """A page holds at most `limit` tasks, and ends early (with `next`) before the task that
    would take it past MAX_PAGE_BYTES of JSON: a task carries up to three 256 KiB JSON values
    and a 64 KiB description, so 500 of them could be hundreds of megabytes.

    `order=claim` sorts as claim_next does (selectors.CLAIM_ORDER): with `stage=QUEUED`, the
    tasks claims would take, first one first. A task backing off after a failure (its
    `not_before` still ahead) is listed at its place; claims skip it until then. Its pages go
    on through `next` like the default order's (the cursor carries the claim-order key of the
    page's last task), and a cursor is good only for the order that gave it out."""
    require_reader(request)
    _query(request, {"stage", "queue", "owner", "text", "search", "order", "cursor", "limit"},
           repeatable=frozenset({"stage"}))
    checked = listing.check_filters(stage or (), queue, owner, text, search=search)  # the board's table checks the same
    after = cursor_after(cursor, order) if cursor else None
    filters = {"stages": list(checked.stages), "queue": checked.queue, "owner": checked.owner, "text": checked.text,
               "search": checked.search, "scope": request.auth.scope}
    items, last = _task_page(filters, order, after, page_limit(limit))
    return {"items": items, "next": cursor_of(last, order) if last is not None else None}


def _task_page(filters: dict, order: str, after: tuple | None, limit: int) -> tuple[list[dict], Task | None]:
    """The rendered tasks of one page (in `order`, after the list_key `after`, matching
    `filters`: reads.task_list), and its last task when more follow (None at the end). Rows
    are read PAGE_READ_ROWS at a time, so that a page ending early reads little more."""
    items: list[dict] = []
    size = 0
    last = None
    while True:
        chunk = reads.task_list(**filters, order=order, after=after,
                                    count=min(PAGE_READ_ROWS, limit + 1 - len(items)))
        deps = selectors.deps_of([task.pk for task in chunk])
        for task in chunk:
            if len(items) == limit:
                return items, last
            rendered = public_task(task, deps[task.pk])
            size += len(json.dumps(rendered, cls=DjangoJSONEncoder))
            if items and size > MAX_PAGE_BYTES:
                return items, last
            items.append(rendered)
            last = task
        if len(chunk) < PAGE_READ_ROWS:
            return items, None
        after = reads.list_key(chunk[-1], order)


def _one(task_id: str) -> Task:
    task = selectors.get_task(task_id)
    if task is None:
        raise errors.NotFound(f"no task with id {task_id!r}")
    return task


def render_task(task: Task) -> dict:
    """A task as the API answers it (TaskOut); the other routers answer with it too."""
    return public_task(task, selectors.deps_of_task(task))


@router.get("/tasks/{task_id}", response={200: TaskOut, **ERRORS}, summary="One task")
def get_task(request, task_id: str):
    require_reader(request)
    return render_task(visible(request, _one(task_id)))


@router.patch("/tasks/{task_id}", response={200: TaskOut, **ERRORS},
              summary="Operator: edit a task (title, description, priority, max_retries, payload, tags) at the version seen")
def edit_task(request, task_id: str, body: TaskEditIn):
    """The fields sent (a null: left as it is) replace the task's, in one compare-and-swap held
    to `version`: a task that moved on is refused with 409 `version_conflict` and nothing is
    written; a finished task is not edited (409 `invalid_transition`). Its history row names
    the fields that changed."""
    actor = require_operator(request).name
    in_scope(request, task_id)
    changes = {name: getattr(body, name) for name in ("title", "description", "payload", "priority",
                                                      "max_retries", "tags") if getattr(body, name) is not None}
    if "payload" in changes:
        json_field("payload", changes["payload"])
    return render_task(transitions.edit(task_id, actor=actor, version=body.version, **changes))


@router.get("/tasks/{task_id}/usage", response={200: TaskUsageOut, **ERRORS},
            summary="What the task's attempts reported they used: tokens and cost, in all and by attempt")
def task_usage(request, task_id: str):
    """Each report came with a renew, complete or fail of a lease (`usage`), and is added to
    its attempt's (by fence). `cost_usd` is null when any report gave none: a total is never
    made of some costs and others' silence (`cost_missing` counts them)."""
    require_reader(request)
    visible(request, _one(task_id))
    return usage.of_task(task_id)


@router.get("/usage", response={200: UsageOut, **ERRORS},
            summary="Usage reported in the last `hours` (1-720, default 24), by agent and by queue")
def usage_by_agent_and_queue(request, hours: int = 24):
    require_reader(request)
    _query(request, {"hours"})
    if not 1 <= hours <= 720:
        raise errors.InvalidRequest("hours must be from 1 to 720")
    if request.auth.scope is not None:
        raise errors.Forbidden("usage by agent and queue spans every queue: not for a key limited to some")
    since = clock.now() - timedelta(hours=hours)
    return {"since": since, **usage.by_agent_and_queue(since)}


@router.get("/tasks/{task_id}/events", response={200: EventPage, **ERRORS},
         summary="A task's history, one event per transition, oldest first (or only its last N)")
def task_events(request, task_id: str, cursor: Optional[str] = None, limit: int = 100,
                last: Optional[int] = Query(None, description="only the N most recent events (1-500), oldest "
                                            "first, in one page (next is null); not with cursor or limit")):
    """A page of the task's history, oldest first; `next` is the cursor of the rows after it.
    History retention (`manage.py prune`) deletes old renews and old finished tasks: a cursor
    whose row was deleted resumes at the next surviving row of the task (a cursor means "after
    row N"), and a deleted task is 404 not_found.

    `last=N`: the N most recent events instead (a task renewed every second for a day has ~86,000),
    oldest first, in one page: paging on from them would be paging the whole history again."""
    require_reader(request)
    _query(request, {"cursor", "limit", "last"})
    if last is not None and ("cursor" in request.GET or "limit" in request.GET):
        raise errors.InvalidRequest("last gives the most recent events in one page: send it without cursor or limit")
    visible(request, _one(task_id))
    if last is not None:
        if not 1 <= last <= MAX_PAGE:
            raise errors.InvalidRequest(f"last must be from 1 to {MAX_PAGE}")
        return {"items": [public_event(e) for e in selectors.latest_events(task_id, last)], "next": None}
    after = None
    if cursor:
        (after,) = decode_cursor(cursor, is_event_id)
    limit = page_limit(limit)
    page = selectors.task_events(task_id, after=after, count=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return {"items": [public_event(e) for e in page], "next": encode_cursor(page[-1].id) if more else None}
