"""The agents' JSON API (django-ninja), under /api/. Handlers are thin: they authenticate, call
one verb of `board.engine.transitions` or a query of `board.engine.selectors`, and render `board.api.schemas`.

Every error has one shape, `{"error": {"code", "message", "task"?, "details"?}}`, and an error
never changes the database (the engine raises before or instead of writing).

Who may call: an agent with `Authorization: Bearer <key>` (its name comes from the key), or a
logged-in staff user's browser session with the CSRF token. Each endpoint's first line checks
what the caller may do (board/access.py): a session reads with board.view_task and creates
with board.add_task; claiming and the holder's verbs take an agent key only; operators' verbs
(admit, requeue, cancel, force-release, force-pause) need a key created with --operator or the
board.intervene permission.
"""
from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Optional, Union

from django.conf import settings
from django.core.exceptions import (
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse
from ninja import Body, NinjaAPI, Query, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer, SessionAuth

from board import access, agent_keys
from board.api.docs import LocalSwagger
from board.api.json_body import BodyParser
from board.api.schemas import (
    ClaimIn,
    ClaimNextIn,
    ClaimOut,
    CompleteIn,
    ErrorOut,
    EventPage,
    FailIn,
    OperatorIn,
    PauseIn,
    ProblemsOut,
    RenewIn,
    RequeueIn,
    ResumeIn,
    TaskBatchIn,
    TaskBatchOut,
    TaskIn,
    TaskOut,
    TaskPage,
    TokenIn,
)
from board.engine import errors, scopes, selectors, transitions
from board.engine.lifecycle import (
    MAX_BATCH_TASKS,
    MAX_OWNER_CHARS,
    MAX_TITLE_CHARS,
    Stage,
    is_valid_task_id,
    limit_json_size,
)
from board.engine.transitions import TaskSpec
from board.live import parked
from board.models import Task
from board.public import public_claim, public_event, public_task

# How often a waiting claim looks for work again when it is not served by the board's server
# (which parks it instead: board/live/parked.py).
CLAIM_POLL_SECONDS = 0.2
MAX_PAGE = 500  # tasks or events per page
MAX_PAGE_BYTES = 4 * 1024 * 1024  # of a task page's JSON; the largest task renders to under 3 MB
PAGE_READ_ROWS = 20


@dataclass(frozen=True)
class Principal:
    """Who is calling: the name every verb records, and what it may do (board/access.py)."""

    name: str
    operator: bool
    agent: bool = True  # an agent key; False for a person's session
    can_read: bool = True
    can_create: bool = True
    # Set by AgentKeyAuth(deferred=True), whose key may not have been looked up for this
    # request: the verb must check it in its move (transitions' key_hash).
    key_hash: str | None = None
    # The queues an agent key is limited to (board.engine.scopes); None: every queue.
    scope: scopes.Scope = None


class AgentKeyAuth(HttpBearer):
    """An agent key in `Authorization: Bearer`. `deferred=True` (the hot verbs only: claim_next,
    renew, complete): a key this process verified in the last minute is taken without a query,
    and the Principal carries its hash for the verb to check in its own statement (the endpoint
    passes `request.auth.key_hash` on). Every other endpoint looks the key up."""

    def __init__(self, *, deferred: bool = False):
        super().__init__()
        self.deferred = deferred

    def __call__(self, request):
        # django-ninja's own parsing logs a header without "Bearer" (the whole key) when DEBUG
        # is on; this one never logs it. Read from META: `request.headers` would first copy every
        # header of the request into a new dict, for this one.
        scheme, _, credential = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != self.openapi_scheme or not credential:
            return None
        return self.authenticate(request, credential.strip())

    def authenticate(self, request, token):
        if self.deferred:
            known = agent_keys.authenticate_deferred(token)
            return Principal(known.name, known.is_operator, key_hash=known.key_hash, scope=known.scope) if known else None
        key = agent_keys.authenticate(token)
        return Principal(key.name, key.is_operator, scope=agent_keys.scope_of(key)) if key else None


class StaffSessionAuth(SessionAuth):
    """A staff user's session, CSRF-checked. Without a session cookie the CSRF check is skipped
    so that a request with no credentials at all gets 401, not 403."""

    def _get_key(self, request):
        if settings.SESSION_COOKIE_NAME not in request.COOKIES:
            return None
        return super()._get_key(request)

    def authenticate(self, request, key):
        user = request.user
        if access.is_board_user(user):
            return Principal(user.get_username(), access.may_intervene(user), agent=False,
                             can_read=access.may_read(user), can_create=access.may_create(user))
        return None


api = NinjaAPI(
    title="TaskFlow board",
    version="1",
    description=(
        "Coordinate work between agents: create tasks (with dependencies), claim ready work "
        "with a lease, renew it while working, then complete, fail, pause or release it. "
        "Every error is `{\"error\": {\"code\", \"message\", \"task\"?}}`.\n\n"
        "**Queue scopes.** An agent key may be limited to some queues (glob patterns such as "
        "`ci-*,docs`: `create_agent_key --queues`, or the Keys admin). Such a key lists, reads, "
        "claims and acts only on tasks of those queues: any other task is absent to it (404 "
        "`not_found`, the answer an unknown id gets; left out of lists and of `/api/check`; a "
        "dependency on it is unknown), and a claim without `queue` takes from any of its queues, "
        "with a `queue` outside them answers 204. Creating a task in another queue is 403 `forbidden`."
    ),
    auth=[AgentKeyAuth(), StaffSessionAuth()],
    urls_namespace="api",
    docs=LocalSwagger(),  # from this server's own files (board/api/docs.py)
    parser=BodyParser(),  # reads a body of any depth, for the schemas to judge (board/api/json_body.py)
)

ERRORS = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 413: ErrorOut, 422: ErrorOut}


# ---------------------------------------------------------------------------------------------
# Errors


def error_response(request, status: int, code: str, message: str, *, task: Task | None = None, details=None):
    body: dict = {"code": code, "message": message}
    if task is not None:
        body["task"] = public_task(task, selectors.deps_of([task.pk])[task.pk])
    if details is not None:
        body["details"] = details
    return api.create_response(request, {"error": body}, status=status)


def _may_see(request, task: Task | None) -> bool:
    """Whether the caller may be shown `task` in an error (issue 27): only a principal that may
    read tasks (a session without board.view_task may not), and, for a key limited to some
    queues, only a task of those queues. Everyone else gets the refusal without the task."""
    principal = getattr(request, "auth", None)
    return (task is not None and isinstance(principal, Principal) and principal.can_read
            and scopes.allows(principal.scope, task.queue))


@api.exception_handler(errors.BoardError)
def on_board_error(request, exc: errors.BoardError):
    # Machine-readable specifics the engine gives (a cycle's path, unknown dependency ids).
    details = exc.details or None
    task = exc.task if _may_see(request, exc.task) else None
    return error_response(request, exc.http_status, exc.code, exc.message, task=task, details=details)


def _field_path(loc) -> list:
    """A field's location as the client wrote it: without ninja's 'body' wrappers and
    pydantic's names for the branches of a union (`function-wrap[...]`, `list[...]`)."""
    return [part for part in loc if part != "body" and not (isinstance(part, str) and "[" in part)]


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    details = [{"loc": _field_path(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
               for e in exc.errors]
    # A body that may be one task or a list fails both branches; report the branch it was meant
    # for (the one whose error is not merely "wrong container type").
    specific = [d for d in details
                if d["type"] not in ("list_type", "model_type", "dict_type", "model_attributes_type")]
    details = specific or details
    batch_too_long = next((e for e in exc.errors
                           if e.get("type") == "too_long" and not _field_path(e.get("loc", ()))), None)
    if batch_too_long is not None:  # the create body's list, judged by its length alone
        count = batch_too_long.get("ctx", {}).get("actual_length")
        return error_response(request, errors.TooLarge.http_status, errors.TooLarge.code,
                              f"a batch creates at most {MAX_BATCH_TASKS} tasks; this one has {count}")
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(part) for part in first["loc"])
    return error_response(request, errors.InvalidRequest.http_status, errors.InvalidRequest.code, f"{where + ': ' if where else ''}{first['msg']}",
                          details=details)


# A verb that found its deferred key gone (errors.KeyRevoked) answers as any bad key does.
@api.exception_handler(errors.KeyRevoked)
@api.exception_handler(AuthenticationError)
def on_unauthorized(request, exc):
    return error_response(request, 401, "unauthorized", "send 'Authorization: Bearer <agent key>' "
                          "(or log in as staff and send the CSRF token)")


@api.exception_handler(RequestDataTooBig)
def on_too_big(request, exc):
    return error_response(request, errors.TooLarge.http_status, errors.TooLarge.code,
                          f"request body over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


@api.exception_handler(SuspiciousOperation)
def on_suspicious(request, exc: SuspiciousOperation):
    """What Django refuses while reading a request (it would answer an HTML 400 or, raised
    inside a view, a 500)."""
    if isinstance(exc, TooManyFieldsSent):
        return error_response(request, errors.TooLarge.http_status, errors.TooLarge.code, f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} "
                              "query parameters or form fields")
    return error_response(request, 400, "bad_request", str(exc) or "malformed request")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    # django-ninja's own 400 (a body it cannot parse) is the engine's InvalidRequest on the wire.
    codes = {400: errors.InvalidRequest.code, 401: "unauthorized", 403: errors.Forbidden.code,
             404: errors.NotFound.code, 413: errors.TooLarge.code}
    status = errors.InvalidRequest.http_status if exc.status_code == 400 else exc.status_code
    return error_response(request, status, codes.get(exc.status_code, "error"), str(exc))


# Permission checks, one per endpoint, first thing in its body (before anything is read or
# written). Agent keys pass all but the operator check; sessions get what board/access.py says.


def _require(request, right: str, refusal: str) -> Principal:
    """The caller, if its Principal has `right`; otherwise 403 `forbidden` with `refusal`."""
    principal: Principal = request.auth
    if not getattr(principal, right):
        raise errors.Forbidden(refusal)
    return principal


def _operator(request) -> Principal:
    return _require(request, "operator", "this needs operator rights (a key created with --operator, "
                                         "or the board.intervene permission)")


def _reader(request) -> Principal:
    return _require(request, "can_read", "reading tasks needs the board.view_task permission")


def _creator(request) -> Principal:
    return _require(request, "can_create", "creating tasks needs the board.add_task permission")


def _agent(request) -> Principal:
    return _require(request, "agent", "claiming and holding tasks is for agents: send an agent key "
                                      "('Authorization: Bearer <key>'), not a browser session")


# Queue scopes (issue 27; board.engine.scopes): a scoped agent key sees and acts only on tasks
# of its queues. Every other task is absent to it: the very 404 an id that exists nowhere gets.
# Claim-next filters in its own statement (transitions.claim_next's `scope`); the reads filter
# in their query; a verb on one task reads the task's queue first, which cannot go stale before
# the verb's move: a task's queue is fixed at creation (transitions.EDITABLE leaves it out).


def _absent(task_id: str) -> errors.NotFound:
    return errors.NotFound(f"no task with id {task_id!r}")


def _visible(request, task: Task) -> Task:
    """`task`, if the caller's scope covers its queue; else 404 as if absent."""
    if not scopes.allows(request.auth.scope, task.queue):
        raise _absent(task.pk)
    return task


def _in_scope(request, task_id: str) -> None:
    """Before a verb on `task_id`: 404 as if absent unless the caller's scope covers its queue.
    One indexed read, for scoped keys only."""
    scope = request.auth.scope
    if scope is None:
        return
    queue = selectors.queues_of([task_id]).get(task_id)
    if queue is None or not scopes.allows(scope, queue):
        raise _absent(task_id)


def _may_create_in(principal: Principal, specs: list[TaskSpec]) -> None:
    """A scoped key creates only in its queues (403: its own scope is no secret to it), and a
    dependency on a task it cannot see is unknown to it, as an absent one is."""
    scope = principal.scope
    if scope is None:
        return
    foreign = sorted({spec.queue for spec in specs if not scopes.allows(scope, spec.queue)})
    if foreign:
        raise errors.Forbidden(f"this key may create tasks only in queues matching {scopes.stored(scope)}; "
                               f"not in {', '.join(foreign)}")
    batch = {spec.id for spec in specs if spec.id is not None}
    external = sorted({dep for spec in specs for dep in spec.deps} - batch)
    if external:
        queues = selectors.queues_of(external)
        hidden = [dep for dep in external if dep in queues and not scopes.allows(scope, queues[dep])]
        if hidden:  # reported as the engine reports absent ones, together with them
            unknown = sorted(set(hidden) | {dep for dep in external if dep not in queues})
            raise errors.InvalidRequest(f"unknown dependencies: {', '.join(unknown)}", field="deps", unknown=unknown)


# ---------------------------------------------------------------------------------------------
# Tasks


def _spec(item: TaskIn) -> TaskSpec:
    # The engine checks it too (for every caller); here, for every task of the batch before
    # the engine looks at any, so that an oversized payload is a 413 whatever else is wrong.
    limit_json_size("payload", item.payload)
    return TaskSpec(title=item.title, id=item.id, description=item.description, payload=item.payload,
                    queue=item.queue, priority=item.priority, deps=tuple(item.deps), hold=item.hold,
                    max_retries=item.max_retries)


def _same_as_existing(specs: list[TaskSpec]) -> list[Task] | None:
    """The existing tasks when every spec names one with the same creation fields (an
    idempotent retry of a create); otherwise None."""
    if any(spec.id is None for spec in specs):
        return None
    existing = selectors.tasks_by_id([s.id for s in specs])
    deps = selectors.deps_of(list(existing))
    # `hold` is compared as created (the create event records it): an admit clears it later.
    created_on_hold = selectors.created_on_hold(list(existing))
    for spec in specs:
        task = existing.get(spec.id)
        if task is None or (task.title, task.description, task.payload, task.queue, task.priority,
                            sorted(deps[task.pk]), task.pk in created_on_hold, task.max_retries) != (
                spec.title, spec.description, spec.payload, spec.queue, spec.priority,
                sorted(spec.deps), spec.hold, spec.max_retries):
            return None
    return [existing[spec.id] for spec in specs]


@api.post("/tasks", response={200: Union[TaskOut, TaskBatchOut], 201: Union[TaskOut, TaskBatchOut], **ERRORS},
          summary="Create a task, or a list of tasks forming a DAG (all or nothing)")
def create_tasks(request, body: Union[TaskIn, TaskBatchIn] = Body(...)):
    """An existing id with an identical body returns the existing task (200): a client may
    retry a create safely. A different body under an existing id is `duplicate_id`. A key
    limited to some queues creates only in them (403 `forbidden` otherwise), and a dependency on
    a task outside them is unknown to it."""
    principal = _creator(request)
    batch = isinstance(body, list)
    specs = [_spec(item) for item in (body if batch else [body])]
    if not specs:
        raise errors.InvalidRequest("an empty list creates nothing")
    _may_create_in(principal, specs)
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
    deps = {spec.id: list(spec.deps) for spec in specs}
    rendered = [public_task(t, deps[t.pk]) for t in tasks]
    return Status(status, {"items": rendered} if batch else rendered[0])


def _encode_cursor(*parts) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


MAX_CURSOR_CHARS = 1000  # the API's own cursors are under 200


def _decode_cursor(cursor: str, *checks) -> list:
    """The parts of a cursor this API gave out, each passing its check, or InvalidRequest: a
    cursor is client input like any other."""
    parts = None
    if len(cursor) <= MAX_CURSOR_CHARS:
        try:
            parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        except (ValueError, binascii.Error, RecursionError):  # RecursionError: nested [[[[...]]]]
            parts = None
    if isinstance(parts, list) and len(parts) == len(checks) and all(
            check(part) for check, part in zip(checks, parts, strict=True)):
        return parts
    raise errors.InvalidRequest("cursor is not one this API gave out")


def _is_event_id(value) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _is_timestamp(value) -> bool:
    try:
        return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def _query(request, allowed: set[str], repeatable: frozenset[str] = frozenset()) -> None:
    """A misspelt filter (?stages=) must not silently return everything, nor a repeated one
    (?limit=1&limit=500) silently pick one of its values."""
    unknown = sorted(set(request.GET) - allowed)
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(allowed))}")
    repeated = sorted(name for name, values in request.GET.lists() if len(values) > 1 and name not in repeatable)
    if repeated:
        raise errors.InvalidRequest(f"query parameter {repeated[0]!r} is given more than once")


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise errors.InvalidRequest(f"limit must be from 1 to {MAX_PAGE}")
    return limit


def _filter_text(name: str, value: str, max_chars: int) -> str:
    if len(value) > max_chars:
        raise errors.InvalidRequest(f"{name} is at most {max_chars} characters")
    return value


def _is_priority(value) -> bool:
    return type(value) is int and abs(value) < 2**31


# A page's cursor is the sort key of its last task: (created_at, id) for the default order,
# ("claim", priority, created_at, id) for order=claim. The leading "claim" (and the length)
# keep a cursor to the order that gave it out: passed with the other order it is refused.
_CURSOR_CHECKS = {
    "created": (_is_timestamp, is_valid_task_id),
    "claim": ("claim".__eq__, _is_priority, _is_timestamp, is_valid_task_id),
}


def _cursor_after(cursor: str, order: str) -> tuple:
    """The list_key (selectors) a cursor of `order` resumes after."""
    parts = _decode_cursor(cursor, *_CURSOR_CHECKS[order])
    if order == "claim":
        _, priority, created_at, last_id = parts
        return priority, datetime.fromisoformat(created_at), last_id
    created_at, last_id = parts
    return datetime.fromisoformat(created_at), last_id


def _cursor_of(task: Task, order: str) -> str:
    key = [value.isoformat() if isinstance(value, datetime) else value for value in selectors.list_key(task, order)]
    return _encode_cursor(*(["claim", *key] if order == "claim" else key))


# The task list's orders, as the engine names them (its schema lists them as an enum).
ListOrder = Literal[tuple(selectors.LIST_ORDERS)]


@api.get("/tasks", response={200: TaskPage, **ERRORS},
         summary="List tasks, oldest first (or in claim order), a page at a time")
def list_tasks(request, stage: list[str] = Query(None), queue: Optional[str] = None,
               owner: Optional[str] = None, text: Optional[str] = None,
               order: ListOrder = Query("created", description="created: oldest first (the default); claim: the order "
                                  "claim-next takes tasks in (highest priority, then oldest, then id)"),
               cursor: Optional[str] = None, limit: int = 100):
    """A page holds at most `limit` tasks, and ends early (with `next`) before the task that
    would take it past MAX_PAGE_BYTES of JSON: a task carries up to three 256 KiB JSON values
    and a 64 KiB description, so 500 of them could be hundreds of megabytes.

    `order=claim` sorts as claim_next does (selectors.CLAIM_ORDER): with `stage=QUEUED`, the
    tasks claims would take, first one first. A task backing off after a failure (its
    `not_before` still ahead) is listed at its place; claims skip it until then. Its pages go
    on through `next` like the default order's (the cursor carries the claim-order key of the
    page's last task), and a cursor is good only for the order that gave it out."""
    _reader(request)
    _query(request, {"stage", "queue", "owner", "text", "order", "cursor", "limit"}, repeatable=frozenset({"stage"}))
    if stage:
        unknown = [s for s in stage if s not in Stage.__members__]
        if unknown:
            raise errors.InvalidRequest(f"unknown stage {unknown[0]!r}; one of {', '.join(Stage)}")
    if queue and not is_valid_task_id(queue):
        raise errors.InvalidRequest(f"invalid queue name {queue!r}")
    if owner:
        _filter_text("owner", owner, MAX_OWNER_CHARS)
    if text:
        _filter_text("text", text, MAX_TITLE_CHARS)
    after = _cursor_after(cursor, order) if cursor else None
    filters = {"stages": stage, "queue": queue, "owner": owner, "text": text, "scope": request.auth.scope}
    items, last = _task_page(filters, order, after, _limit(limit))
    return {"items": items, "next": _cursor_of(last, order) if last is not None else None}


def _task_page(filters: dict, order: str, after: tuple | None, limit: int) -> tuple[list[dict], Task | None]:
    """The rendered tasks of one page (in `order`, after the list_key `after`, matching
    `filters`: selectors.task_list), and its last task when more follow (None at the end). Rows
    are read PAGE_READ_ROWS at a time, so that a page ending early reads little more."""
    items: list[dict] = []
    size = 0
    last = None
    while True:
        chunk = selectors.task_list(**filters, order=order, after=after,
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
        after = selectors.list_key(chunk[-1], order)


def _one(task_id: str) -> Task:
    task = selectors.get_task(task_id)
    if task is None:
        raise errors.NotFound(f"no task with id {task_id!r}")
    return task


def _render(task: Task) -> dict:
    return public_task(task, selectors.deps_of_task(task))


def _render_claim(claim: transitions.Claim) -> dict:
    return public_claim(claim, selectors.deps_of_task(claim.task))


def _answer(request, data: dict):
    """The answer of a hot endpoint (claim, renew, complete), rendered as is. `public_task` and
    `public_claim` build exactly the documented shapes (TaskOut, ClaimOut); letting django-ninja
    validate that output again cost about 7% of a request's CPU. tests/test_api.py checks these
    answers against the schemas."""
    return api.create_response(request, data, status=200)


@api.get("/tasks/{task_id}", response={200: TaskOut, **ERRORS}, summary="One task")
def get_task(request, task_id: str):
    _reader(request)
    return _render(_visible(request, _one(task_id)))


@api.get("/tasks/{task_id}/events", response={200: EventPage, **ERRORS},
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
    _reader(request)
    _query(request, {"cursor", "limit", "last"})
    if last is not None and ("cursor" in request.GET or "limit" in request.GET):
        raise errors.InvalidRequest("last gives the most recent events in one page: send it without cursor or limit")
    _visible(request, _one(task_id))
    if last is not None:
        if not 1 <= last <= MAX_PAGE:
            raise errors.InvalidRequest(f"last must be from 1 to {MAX_PAGE}")
        return {"items": [public_event(e) for e in selectors.latest_events(task_id, last)], "next": None}
    after = None
    if cursor:
        (after,) = _decode_cursor(cursor, _is_event_id)
    limit = _limit(limit)
    page = selectors.task_events(task_id, after=after, count=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return {"items": [public_event(e) for e in page], "next": _encode_cursor(page[-1].id) if more else None}


# ---------------------------------------------------------------------------------------------
# Claiming


# The hot verbs' authentication: a key verified in the last minute is checked by the move itself.
HOT_AUTH = [AgentKeyAuth(deferred=True), StaffSessionAuth()]


@api.post("/claim", response={200: ClaimOut, 204: None, **ERRORS}, auth=HOT_AUTH,
          summary="Claim the next ready task (highest priority, then oldest); 204 when none")
def claim_next(request, body: ClaimNextIn):
    """With `wait_seconds` the request waits (up to 30 s) for work to become ready instead of
    answering 204 at once. The lease token in the answer is shown only to this caller.

    Served by the board's own server (taskflow_site/serving.py), a claim that finds nothing
    hands the wait back to the server, which parks the request without a thread or a database
    connection and replays it when a task becomes ready. Under another WSGI server (or Django's
    test client) the view polls by itself, holding its worker for the wait.

    A key limited to some queues takes only from them, without `queue` from any of them; a
    `queue` outside them has no work for it (204)."""
    _agent(request)
    claim = transitions.claim_next(request.auth.name, body.ttl_seconds, queue=body.queue,
                                   request_id=body.request_id, key_hash=request.auth.key_hash,
                                   scope=request.auth.scope)
    if claim is not None:
        return _answer(request, _render_claim(claim))
    if body.wait_seconds <= 0 or (body.queue is not None and not scopes.allows(request.auth.scope, body.queue)):
        return Status(204, None)  # (a queue outside a scoped key's queues never has work for it)
    if (parking := parked.parking_of(request)) is not None:  # the server parks it (board/live/parked.py)
        parking.park(body.wait_seconds, body.queue, request.auth.name,
                     body.model_dump_json(exclude_defaults=True).encode())
        return HttpResponse(status=204)
    conf = settings.TASKFLOW
    if not parked.thread_wait_slots.take(request.auth.name, conf["WSGI_MAX_WAITERS"], conf["MAX_WAITERS_PER_KEY"]):
        return _too_many_waiters(request, conf["WSGI_MAX_WAITERS"])
    try:
        return _poll_for_work(request.auth, body)
    finally:
        parked.thread_wait_slots.give_back(request.auth.name)


def _too_many_waiters(request, cap: int):
    """503 + Retry-After: this process already holds its waiting claims' worth of threads."""
    response = api.create_response(request, {"error": {
        "code": "too_many_waiters",
        "message": (f"this server process already holds its cap of waiting claims ({cap}, or this agent's "
                    f"{settings.TASKFLOW['MAX_WAITERS_PER_KEY']}); retry shortly or claim without wait_seconds")}},
        status=503)
    response["Retry-After"] = "1"
    return response


def _poll_for_work(agent: Principal, body: ClaimNextIn):
    """A waiting claim outside the board's server (which parks it instead): look (without a
    transaction) a few times a second, claim when something is ready. It holds its thread for
    the wait, so the view lets at most WSGI_MAX_WAITERS of them run at once per process."""
    deadline = time.monotonic() + body.wait_seconds
    while (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(CLAIM_POLL_SECONDS, remaining))
        if selectors.has_ready_task(body.queue, scope=agent.scope):
            claim = transitions.claim_next(agent.name, body.ttl_seconds, queue=body.queue, request_id=body.request_id,
                                           key_hash=agent.key_hash, scope=agent.scope)
            if claim is not None:
                return Status(200, _render_claim(claim))
    return Status(204, None)


@api.post("/tasks/{task_id}/claim", response={200: ClaimOut, **ERRORS}, summary="Claim this task")
def claim_task(request, task_id: str, body: ClaimIn):
    """With `request_id`, a retry of this claim (same agent, same id) while its lease is live
    gets that lease back instead of `taken`."""
    _agent(request)
    _in_scope(request, task_id)
    return _render_claim(transitions.claim(task_id, request.auth.name, body.ttl_seconds,
                                           request_id=body.request_id))


@api.post("/tasks/{task_id}/resume", response={200: ClaimOut, **ERRORS},
          summary="Take a PAUSED task with a new lease; its checkpoint is on the task")
def resume_task(request, task_id: str, body: ResumeIn):
    _agent(request)
    _in_scope(request, task_id)
    return _render_claim(transitions.resume(task_id, request.auth.name, body.ttl_seconds))


# ---------------------------------------------------------------------------------------------
# The holder's verbs


@api.post("/tasks/{task_id}/renew", response={200: ClaimOut, **ERRORS}, auth=HOT_AUTH,
          summary="Extend a live lease (same token and fence); optionally save checkpoint/progress")
def renew_task(request, task_id: str, body: RenewIn):
    _agent(request)
    _in_scope(request, task_id)
    claim = transitions.renew(task_id, body.token, body.ttl_seconds, checkpoint=body.checkpoint,
                              progress=body.progress, agent=request.auth.name, key_hash=request.auth.key_hash)
    return _answer(request, _render_claim(claim))


@api.post("/tasks/{task_id}/release", response={200: TaskOut, **ERRORS},
          summary="Give the task back to the queue (the attempt is not counted)")
def release_task(request, task_id: str, body: TokenIn):
    _agent(request)
    _in_scope(request, task_id)
    return _render(transitions.release(task_id, body.token, agent=request.auth.name))


@api.post("/tasks/{task_id}/complete", response={200: TaskOut, **ERRORS}, auth=HOT_AUTH,
          summary="Commit the result")
def complete_task(request, task_id: str, body: CompleteIn):
    _agent(request)
    _in_scope(request, task_id)
    return _answer(request, _render(transitions.complete(task_id, body.token, body.result, agent=request.auth.name,
                                                         key_hash=request.auth.key_hash)))


@api.post("/tasks/{task_id}/fail", response={200: TaskOut, **ERRORS},
          summary="Record a failed attempt: back to QUEUED after a backoff while attempts remain "
                  "(and retryable), else FAILED")
def fail_task(request, task_id: str, body: FailIn):
    _agent(request)
    _in_scope(request, task_id)
    return _render(transitions.fail(task_id, body.token, body.error, retryable=body.retryable,
                                    traceback=body.traceback, agent=request.auth.name))


@api.post("/tasks/{task_id}/pause", response={200: TaskOut, **ERRORS},
          summary="Release the lease and keep a checkpoint for a later resume")
def pause_task(request, task_id: str, body: PauseIn):
    _agent(request)
    _in_scope(request, task_id)
    return _render(transitions.pause(task_id, body.token, body.checkpoint, agent=request.auth.name))


# ---------------------------------------------------------------------------------------------
# Operators' verbs


@api.post("/tasks/{task_id}/admit", response={200: TaskOut, **ERRORS}, summary="Operator: admit a PENDING task (on hold, or whose dependencies have completed)")
def admit_task(request, task_id: str, body: OperatorIn):
    actor = _operator(request).name
    _in_scope(request, task_id)
    return _render(transitions.admit(task_id, actor=actor, version=body.version, reason=body.reason))


@api.post("/tasks/{task_id}/requeue", response={200: TaskOut, **ERRORS},
          summary="Operator: FAILED or PAUSED back to QUEUED")
def requeue_task(request, task_id: str, body: RequeueIn):
    actor = _operator(request).name
    _in_scope(request, task_id)
    return _render(transitions.requeue(task_id, actor=actor, version=body.version,
                                       reset_attempts=body.reset_attempts, reason=body.reason))


@api.post("/tasks/{task_id}/cancel", response={200: TaskOut, **ERRORS}, summary="Operator: cancel a task")
def cancel_task(request, task_id: str, body: OperatorIn):
    actor = _operator(request).name
    _in_scope(request, task_id)
    return _render(transitions.cancel(task_id, actor=actor, version=body.version, reason=body.reason))


@api.post("/tasks/{task_id}/force-release", response={200: TaskOut, **ERRORS},
          summary="Operator: take a RUNNING task from its holder back to QUEUED")
def force_release_task(request, task_id: str, body: OperatorIn):
    actor = _operator(request).name
    _in_scope(request, task_id)
    return _render(transitions.force_release(task_id, actor=actor, version=body.version, reason=body.reason))


@api.post("/tasks/{task_id}/force-pause", response={200: TaskOut, **ERRORS},
          summary="Operator: pause a RUNNING task, keeping its last saved checkpoint")
def force_pause_task(request, task_id: str, body: OperatorIn):
    actor = _operator(request).name
    _in_scope(request, task_id)
    return _render(transitions.force_pause(task_id, actor=actor, version=body.version, reason=body.reason))


# ---------------------------------------------------------------------------------------------
# The board's health


@api.get("/check", response={200: ProblemsOut, **ERRORS}, summary="Invariant problems found by check()")
def check(request):
    _reader(request)
    found = selectors.problems()
    scope = request.auth.scope
    if scope is not None:  # a scoped key hears only of its queues' tasks
        queues = selectors.queues_of(sorted({p.task for p in found}))
        found = [p for p in found if p.task in queues and scopes.allows(scope, queues[p.task])]
    return {"problems": [{"task": p.task, "code": p.code, "text": p.text} for p in found]}
