"""The task list, one way for every reader: its filters (checked as client input), its orders, the
keyset cursor a page resumes after, and the exact count a filter matches. The API's
`GET /api/tasks` (board.api.routers.tasks) and the board's all-tasks table and export
(board.live.tasks_table) both page through here, so that an order, a filter or a cursor means the
same on both. Single queries, no transaction: a page is as the store is when each query runs.

A cursor is the sort key of a page's last task, as URL-safe base64 JSON, led by its order's name
(except the oldest "created" order's, which predates the others: its cursors stay as they were
given out). It is client input like any other: decoding checks every part and refuses anything
not given out here, and a cursor passed with another order than its own.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from datetime import datetime

from django.db.models import Count, Q
from django.db.models.functions import Coalesce

from board.engine import errors, scopes
from board.engine.inputs import is_valid_task_id
from board.engine.lifecycle import Stage
from board.engine.search import parse as parse_search
from board.engine.limits import MAX_CURSOR_CHARS, MAX_OWNER_CHARS, MAX_TITLE_CHARS
from board.engine.selectors import CLAIM_ORDER, in_scope
from board.models import Task

# The orders of the task list: the fields it sorts by ("-": descending), each ending in the id so
# that a key is unique and a cursor resumes exactly after its task.
#   created   oldest first (the API's default)
#   claim     the order claim_next takes QUEUED tasks in (selectors.CLAIM_ORDER)
#   newest    most recently created first
#   updated   most recently changed first
#   priority  highest priority first, the oldest first among equals
#   in_stage  longest in its current stage first: for RUNNING tasks the longest running (run
#             time so far), for QUEUED the longest waiting. `stage_since` is the stage's start,
#             or the last write for a row written outside the engine (as board.public says).
LIST_ORDERS = {
    "created": ("created_at", "pk"),
    "claim": CLAIM_ORDER,
    "newest": ("-created_at", "-pk"),
    "updated": ("-updated_at", "-pk"),
    "priority": ("-priority", "created_at", "pk"),
    "in_stage": ("stage_since", "pk"),
}
# Each order's cursor parts after its leading name, checked on the way in.


def _is_timestamp(value) -> bool:
    try:
        return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def _is_rank(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_int(value) -> bool:
    return type(value) is int and -2**63 <= value < 2**63


_PART_CHECKS = {"created_at": _is_timestamp, "updated_at": _is_timestamp, "stage_since": _is_timestamp,
                "claim_rank": _is_rank, "priority": _is_int, "pk": is_valid_task_id}


@dataclass(frozen=True)
class Filters:
    """What a list is narrowed to: each given filter must match (stages: any of them)."""
    stages: tuple[str, ...] = ()
    queue: str | None = None
    owner: str | None = None
    text: str | None = None
    owner_part: str | None = None  # the board's owner box: a part of the holder's name, any case
    search: str | None = None  # a search line (board.engine.search), checked


def check_filters(stages=(), queue: str | None = None, owner: str | None = None,
                  text: str | None = None, owner_part: str | None = None, search: str | None = None) -> Filters:
    """The filters, or InvalidRequest naming the first bad one."""
    unknown = [s for s in stages if s not in Stage.__members__]
    if unknown:
        raise errors.InvalidRequest(f"unknown stage {unknown[0]!r}; one of {', '.join(Stage)}")
    if queue and not is_valid_task_id(queue):
        raise errors.InvalidRequest(f"invalid queue name {queue!r}")
    if (owner and len(owner) > MAX_OWNER_CHARS) or (owner_part and len(owner_part) > MAX_OWNER_CHARS):
        raise errors.InvalidRequest(f"owner is at most {MAX_OWNER_CHARS} characters")
    if text and len(text) > MAX_TITLE_CHARS:
        raise errors.InvalidRequest(f"text is at most {MAX_TITLE_CHARS} characters")
    parse_search(search)
    return Filters(tuple(dict.fromkeys(stages)), queue or None, owner or None, text or None, owner_part or None,
                   search if search and search.strip() else None)


def check_order(order: str) -> str:
    if order not in LIST_ORDERS:
        raise errors.InvalidRequest(f"unknown order {order!r}; one of {', '.join(LIST_ORDERS)}")
    return order


def _matching(filters: Filters, scope: scopes.Scope, using: str):
    rows = Task.objects.using(using).filter(in_scope(scope))
    if filters.stages:
        rows = rows.filter(stage__in=filters.stages)
    if filters.queue:
        rows = rows.filter(queue=filters.queue)
    if filters.owner:
        rows = rows.filter(owner=filters.owner)
    if filters.owner_part:
        rows = rows.filter(owner__icontains=filters.owner_part)
    if filters.search:
        rows = rows.filter(parse_search(filters.search).q(using))
    if filters.text:
        rows = rows.filter(Q(id__icontains=filters.text) | Q(title__icontains=filters.text))
    return rows


def matching(filters: Filters, *, scope: scopes.Scope = None, using: str = "default"):
    """The tasks the (checked) filters match, as a queryset: for a reader that narrows it further
    (board.bulk lists the ids and versions of those an action applies to)."""
    return _matching(filters, scope, using)


def task_list(*, stages: list[str] | None = None, queue: str | None = None, owner: str | None = None,
              text: str | None = None, owner_part: str | None = None, search: str | None = None,
              order: str = "created", after: tuple | None = None, count: int,
              scope: scopes.Scope = None, using: str = "default", columns: tuple[str, ...] = ()) -> list[Task]:
    """Up to `count` tasks in `order` (LIST_ORDERS), after the task whose `list_key` is `after`
    when given, among those in `stages`, in `queue`, held by `owner`, whose id or title contains
    `text` (case-insensitive), whose holder's name contains `owner_part` (case-insensitive),
    matching the search line `search` (board.engine.search), for each filter given. The caller
    has checked them. `scope`: a
    key's queue patterns; the others' tasks are not listed. `columns`: read only these (and the
    sort key's), for a reader that needs few of a task's up to 256 KiB fields."""
    rows = _matching(Filters(tuple(stages or ()), queue, owner, text, owner_part, search), scope, using)
    fields = LIST_ORDERS[order]
    if "stage_since" in fields:
        rows = rows.annotate(stage_since=Coalesce("stage_changed_at", "updated_at"))
    if after is not None:
        rows = rows.filter(_after(fields, after))
    if columns:
        rows = rows.only(*columns, *(name.lstrip("-") for name in fields if name not in ("pk", "stage_since")))
    return list(rows.order_by(*fields)[:count])


def count_tasks(filters: Filters, *, scope: scopes.Scope = None, using: str = "default") -> int:
    """How many tasks the filters match: the exact total a list's pages add up to."""
    return _matching(filters, scope, using).count()


def stage_counts(filters: Filters, *, scope: scopes.Scope = None, using: str = "default") -> dict[str, int]:
    """Per stage (every one, 0 where none), how many tasks the filters match: one grouped query."""
    counts = {stage.value: 0 for stage in Stage}
    for stage, n in _matching(filters, scope, using).values_list("stage").annotate(n=Count("pk")).order_by():
        counts[stage] = n
    return counts


def list_key(task: Task, order: str) -> tuple:
    """The values of `task` that task_list's `order` sorts by: a page's cursor."""
    return tuple(_value(task, field.lstrip("-")) for field in LIST_ORDERS[order])


def _value(task: Task, name: str):
    if name == "stage_since":  # annotated by task_list; computed the same way for any task
        return getattr(task, "stage_since", None) or task.stage_changed_at or task.updated_at
    return getattr(task, name)


def _after(fields: tuple[str, ...], key: tuple) -> Q:
    """The rows after `key` in the order `fields` ("-name": descending): after on the first
    field, or equal on it and after on the rest. Written as "at or after on the first field, and
    (after on it, or after on the rest)": the same rows, but the leading range stands alone in
    the WHERE clause, so that SQLite and PostgreSQL scan the order's index from the cursor on.
    (As "after, or equal and after on the rest" SQLite sorted every remaining row per page: a
    50,000-task export took 58 s.)"""
    after = Q()
    for position in reversed(range(len(fields))):
        name = fields[position].lstrip("-")
        down = fields[position].startswith("-")
        beyond = Q(**{f"{name}__{'lt' if down else 'gt'}": key[position]})
        if position == len(fields) - 1:
            after = beyond
        else:
            after = Q(**{f"{name}__{'lte' if down else 'gte'}": key[position]}) & (beyond | after)
    return after


# -- cursors -----------------------------------------------------------------------------------


def encode_cursor(*parts) -> str:
    return base64.urlsafe_b64encode(_json_list(parts).encode()).decode().rstrip("=")


def _json_list(parts: tuple) -> str:
    """json.dumps(list(parts)), written directly for a cursor's few strings and numbers: every
    card of a live snapshot carries a cursor, and json.dumps builds its encoder on each call
    (a third of a 700-card snapshot's cursor time). Anything else goes to json.dumps."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(encode_basestring_ascii(part))
        elif type(part) is int:
            out.append(int.__repr__(part))
        elif type(part) is float and math.isfinite(part):
            out.append(float.__repr__(part))
        else:
            return json.dumps(list(parts))
    return "[" + ", ".join(out) + "]"


def decode_cursor(cursor: str, *checks) -> list:
    """The parts of a cursor given out here, each passing its check, or InvalidRequest."""
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


def _named(order: str) -> bool:
    return order != "created"  # the first order's cursors were given out without a name


def cursor_after(cursor: str, order: str) -> tuple:
    """The list_key a cursor of `order` resumes after."""
    fields = [field.lstrip("-") for field in LIST_ORDERS[order]]
    checks = [_PART_CHECKS[field] for field in fields]
    parts = decode_cursor(cursor, *([order.__eq__] if _named(order) else []), *checks)
    key = parts[1:] if _named(order) else parts
    return tuple(datetime.fromisoformat(value) if check is _is_timestamp
                 else float(value) if check is _is_rank else value
                 for check, value in zip(checks, key, strict=True))


def cursor_of(task: Task, order: str) -> str:
    key = [value.isoformat() if isinstance(value, datetime) else value for value in list_key(task, order)]
    return encode_cursor(*([order, *key] if _named(order) else key))
