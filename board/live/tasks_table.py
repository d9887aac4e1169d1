"""The board's all-tasks table (/board/tasks/) and its export (/board/tasks/export): every task,
a page at a time, in the orders and with the filters of GET /api/tasks (board.engine.listing: the
same checks, keyset cursors and count), rendered on the server (no script: a page is a link).

Who may see them: whoever may see the board (board.access.may_read; others get the page that says
which permission is missing). They write nothing. An export holds the table's columns (the card
view's, board.live.frames: never a lease token, nor a task's bulky fields) for every task the
filter matches, read a chunk at a time in the page's order, at most EXPORT_MAX_ROWS: a bigger
filter is refused before anything is sent, so an export is never silently cut short.
"""
from __future__ import annotations

import csv
import io
import json
from datetime import datetime

from django.contrib.admin.views.decorators import staff_member_required
from django.core.serializers.json import DjangoJSONEncoder
from django.http import JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from board import access
from board.engine import errors, listing
from board.engine.lifecycle import Stage
from board.engine.selectors import deps_of
from board.live.frames import card_of_listed
from board.live.reads import CARD_COLUMNS
from board.live.views import missing_permission

PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
# An export is made in one request thread (`serve` on SQLite runs one per process) and, under
# `serve`, sent once whole (server/serving.py buffers a response): 20,000 rows took about 4 s and
# 4 MB of CSV (10 MB of JSON lines) on this 2-core machine, so the bound keeps both small.
EXPORT_MAX_ROWS = 20_000
EXPORT_CHUNK_ROWS = 500
ERROR_CHARS = 300  # an export's error column: the first line of the last error, cut here
PARAMETERS = {"stage", "queue", "owner", "text", "search", "order", "cursor", "limit", "start"}
EXPORT_PARAMETERS = {"stage", "queue", "owner", "text", "search", "order", "format"}
FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}
# The table's sortable columns: the order each header link asks for (its label names the sort).
SORTS = (("newest", "newest first"), ("created", "oldest first"), ("updated", "recently updated"),
         ("priority", "priority"), ("in_stage", "run time (longest in stage)"), ("claim", "claim order"))
DEFAULT_ORDER = "newest"
EXPORT_COLUMNS = ("id", "title", "stage", "queue", "priority", "owner", "attempts", "max_retries", "fence",
                  "progress", "created_at", "updated_at", "stage_changed_at", "lease_expires_at", "not_before",
                  "concurrency_key", "rate_key", "dedup_key", "fairness_key", "requires", "deps", "error")


class _Query:
    """A request's checked query: its filters, order, cursor, page size and first row's number."""

    def __init__(self, get, allowed: set[str]):
        unknown = sorted(set(get) - allowed)
        if unknown:
            raise errors.InvalidRequest(f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(allowed))}")
        repeated = sorted(name for name, values in get.lists() if len(values) > 1 and name != "stage")
        if repeated:
            raise errors.InvalidRequest(f"query parameter {repeated[0]!r} is given more than once")
        # A form's empty field is no filter.
        self.filters = listing.check_filters([s for s in get.getlist("stage") if s], get.get("queue") or None,
                                             get.get("owner") or None, get.get("text") or None,
                                             search=get.get("search") or None)
        self.order = listing.check_order(get.get("order") or DEFAULT_ORDER)
        cursor = get.get("cursor") or None
        self.cursor = cursor
        self.after = listing.cursor_after(cursor, self.order) if cursor else None
        self.limit = _number(get, "limit", DEFAULT_PAGE_SIZE)
        if self.limit not in PAGE_SIZES:
            raise errors.InvalidRequest(f"limit is one of {', '.join(map(str, PAGE_SIZES))}")
        self.start = _number(get, "start", 1)  # the first row's number on this page: display only
        if self.start < 1:
            raise errors.InvalidRequest("start is at least 1")

    def link(self, **changes) -> str:
        """This query's URL parameters with `changes` (None: left out)."""
        from urllib.parse import urlencode
        values = {"stage": list(self.filters.stages), "queue": self.filters.queue, "owner": self.filters.owner,
                  "text": self.filters.text, "search": self.filters.search, "order": self.order,
                  "limit": self.limit if self.limit != DEFAULT_PAGE_SIZE else None}
        values.update(changes)
        pairs = [(name, value) for name, value in values.items() if value not in (None, "", [])]
        return urlencode([(name, v) for name, value in pairs for v in (value if isinstance(value, list) else [value])])


def _number(get, name: str, default: int) -> int:
    value = get.get(name)
    if value is None or value == "":
        return default
    if not value.isdigit() or len(value) > 9:
        raise errors.InvalidRequest(f"{name} must be a whole number")
    return int(value)


def _rows(query: _Query, after, count: int) -> list:
    return listing.task_list(stages=list(query.filters.stages), queue=query.filters.queue, owner=query.filters.owner,
                             text=query.filters.text, search=query.filters.search, order=query.order, after=after,
                             count=count,
                             columns=CARD_COLUMNS)


def _refused(request, exc: errors.InvalidRequest, template: bool):
    if not template:
        return JsonResponse({"error": {"code": exc.code, "message": str(exc)}}, status=exc.http_status)
    return render(request, "board/tasks.html", {"error": str(exc), "stages": [s.value for s in Stage],
                                                "sorts": SORTS, "page_sizes": PAGE_SIZES, "rows": [],
                                                "filters": listing.Filters(), "order": DEFAULT_ORDER,
                                                "limit": DEFAULT_PAGE_SIZE}, status=exc.http_status)


@staff_member_required
@require_GET
def tasks_page(request):
    if not access.may_read(request.user):
        return missing_permission(request)
    try:
        query = _Query(request.GET, PARAMETERS)
    except errors.InvalidRequest as exc:
        return _refused(request, exc, template=True)
    page = _rows(query, query.after, query.limit + 1)
    more, page = len(page) > query.limit, page[:query.limit]
    total = listing.count_tasks(query.filters)
    now = timezone.now()
    rows = [{"task": task, "in_stage": _duration(now - (task.stage_changed_at or task.updated_at))} for task in page]
    next_link = (query.link(cursor=listing.cursor_of(page[-1], query.order), start=query.start + len(page))
                 if more else None)
    sorts = [{"order": order, "label": label, "link": query.link(order=order), "current": order == query.order}
             for order, label in SORTS]
    return render(request, "board/tasks.html", {
        "rows": rows, "total": total, "first": query.start, "last": query.start + len(page) - 1,
        "next_link": next_link, "first_link": query.link() if query.cursor else None,
        "filters": query.filters, "order": query.order, "limit": query.limit, "sorts": sorts,
        "stages": [s.value for s in Stage], "page_sizes": PAGE_SIZES,
        "export_csv": query.link(format="csv", limit=None), "export_jsonl": query.link(format="jsonl", limit=None),
        "filtered": bool(query.filters.stages or query.filters.queue or query.filters.owner or query.filters.text
                         or query.filters.search),
    })


def _duration(delta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


@staff_member_required
@require_GET
def tasks_export(request):
    """The tasks the filter matches, in the table's order, as CSV or JSON lines (format=csv|jsonl),
    streamed a chunk at a time. Refused (422, the API's error shape) on a bad parameter, or when
    the filter matches more than EXPORT_MAX_ROWS tasks: nothing is sent then."""
    if not access.may_read(request.user):
        return missing_permission(request)
    try:
        query = _Query(request.GET, EXPORT_PARAMETERS)
        kind = request.GET.get("format") or "csv"
        if kind not in FORMATS:
            raise errors.InvalidRequest(f"format is one of {', '.join(FORMATS)}")
        total = listing.count_tasks(query.filters)
        if total > EXPORT_MAX_ROWS:
            raise errors.InvalidRequest(f"{total} tasks match; an export holds at most {EXPORT_MAX_ROWS}: "
                                        "narrow the filter (a stage, a queue, an owner or text)")
    except errors.InvalidRequest as exc:
        return _refused(request, exc, template=False)
    response = StreamingHttpResponse(_export_lines(query, kind), content_type=FORMATS[kind])
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="tasks-{stamp}.{kind}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _export_lines(query: _Query, kind: str):
    """The export's text, a chunk of rows at a time (keyset pages, as the table's), at most
    EXPORT_MAX_ROWS rows even if tasks were created after the count."""
    out = io.StringIO()
    writer = csv.writer(out)
    if kind == "csv":
        writer.writerow(EXPORT_COLUMNS)
    sent, after = 0, None
    while sent < EXPORT_MAX_ROWS:
        chunk = _rows(query, after, min(EXPORT_CHUNK_ROWS, EXPORT_MAX_ROWS - sent))
        if not chunk:
            break
        deps = deps_of([task.pk for task in chunk])
        for task in chunk:
            row = _export_row(card_of_listed(task, deps[task.pk]))
            if kind == "csv":
                writer.writerow([_cell(row[name]) for name in EXPORT_COLUMNS])
            else:
                out.write(json.dumps(row, cls=DjangoJSONEncoder) + "\n")
        sent += len(chunk)
        after = listing.list_key(chunk[-1], query.order)
        yield out.getvalue()
        out.seek(0)
        out.truncate()
        if len(chunk) < EXPORT_CHUNK_ROWS:
            break
    if out.getvalue():
        yield out.getvalue()


def _export_row(card: dict) -> dict:
    error = (card.get("error") or "").strip().splitlines()
    row = {name: card.get(name) for name in EXPORT_COLUMNS if name not in ("error",)}
    row["error"] = error[0][:ERROR_CHARS] if error else ""
    return row


def _cell(value) -> str:
    """A CSV cell. A text starting like a formula (= + - @, tab, CR) is prefixed with ' so that a
    spreadsheet shows a task's title instead of running it."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return " ".join(value)
    text = str(value)
    if isinstance(value, str) and text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text
