"""The live board's reads: its snapshot in parts and the cards of changed tasks (the card columns
only, never a task's bulky fields), what parked claims poll, and the insights panel's window of
history. Nothing here writes. The outbox's cursor query is a read path of its own
(board.live.outbox)."""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from types import SimpleNamespace

from django.db import connections
from django.db.models import Count, ExpressionWrapper, F, Field, Max
from django.utils import timezone

from board.engine import selectors, timing
from board.engine.lifecycle import TERMINAL, Stage, Verb
from board.engine.listing import LIST_ORDERS, cursor_of
from board.engine.selectors import claimable_tasks
from board.engine.stores import store
from board.live import column_counts
from board.models import Dependency, Task, TaskEvent


# ---------------------------------------------------------------------------------------------
# The snapshot and the cards (board.live.frames).


# What a card shows of a task (board.live.frames.card_task): every public field but the bulky ones
# (NOT_ON_CARDS: up to 256 KiB each), which the board never reads. The live board's reads (the
# snapshot's, `board_parts`, and the tailer's, `live_tasks`) select these columns and no other.
CARD_COLUMNS = ("id", "title", "queue", "priority", "on_hold", "max_retries", "stage", "version", "owner",
                "fence", "lease_expires_at", "attempts", "not_before", "progress", "last_error",
                "created_at", "updated_at", "stage_changed_at", "concurrency_key", "rate_key", "dedup_key",
                "fairness_key", "tags", "replay_of", "claim_rank", "resources", "requires", "prefers",
                "queue_timeout_seconds", "attempt_timeout_seconds", "progress_timeout_seconds",
                "progress_changed_at", "awaiting_approval", "approvals_count")
NOT_ON_CARDS = ("description", "payload", "checkpoint", "result")
# A note changes no version and writes no event (board.engine.transitions.notes): no frame would
# bring a new count, and a card would show a stale one. The details panel reads the notes.
NOT_LIVE = ("notes_count",)


# Cards a column's page holds: a snapshot sends each column's first page (and every count), the
# page fetches the next ones as the user scrolls (GET /board/filter?stage=&cursor=), so a
# snapshot's size does not grow with the board (docs/live-protocol.md, "A bounded snapshot").
COLUMN_PAGE = 100
# Each column's order and the listing order (board.engine.listing) its pages are read in: an
# unfinished column in claim order (the order claim_next takes them), a finished one most recent first.
LIVE_ORDER = "claim"
FINISHED_ORDER = "updated"


def column_order(stage: str) -> str:
    """The listing order of `stage`'s column (LIVE_ORDER or FINISHED_ORDER)."""
    return FINISHED_ORDER if stage in TERMINAL else LIVE_ORDER


def board_parts(*, page_size: int | None = None, part_size: int = 1000, using: str = "default") -> Iterator:
    """The live board as one consistent read (read_transaction: no write lock): first a head
    {"counts" (per stage: board.live.column_counts), "last_event_id" (the last event the read
    includes), "unseen_event_ids" (those at or below it it does not: they may yet commit),
    "last_removal_id" (the last prune record it accounts for), "next_pages"
    (per stage, the cursor of the column's next page after the `page_size` first, or None when
    they are all of it)}, then lists of up to `part_size` (row, deps) pairs: each column's
    first `page_size` tasks in its order (column_order). A row is a dict of CARD_COLUMNS as
    JSON values (datetimes as the API writes them, `json_time`), read from the database without
    building a model instance or a datetime per task. Close the generator (or exhaust it) to
    end the read: what it yields is bounded (7 pages) however many tasks the board holds."""
    page_size = page_size or COLUMN_PAGE
    with store(using).read_transaction():
        mark = column_counts.read_mark(using)  # counted, or followed from the history since
        by_stage: dict[str, list[tuple]] = defaultdict(list)
        # closing(): the cursor is closed inside the read even when the caller stops early.
        with closing(_values_of(_column_pages(page_size, using), page_size + 1, using)) as values:
            for row in values:
                by_stage[row[_STAGE]].append(row)
        rows: list[dict] = []
        next_pages: dict[str, str | None] = {}
        for stage in Stage:
            column = by_stage.get(stage.value, [])
            cards = [_card_row(row) for row in column[:page_size]]
            # The next page resumes after the last card sent (its page_cursor), when there is one.
            next_pages[stage.value] = cards[-1]["page_cursor"] if len(column) > page_size else None
            rows += cards
        yield {"counts": mark.counts, "last_event_id": mark.last_event_id,
               "unseen_event_ids": sorted(mark.unseen), "last_removal_id": mark.last_removal_id,
               "next_pages": next_pages}
        for start in range(0, len(rows), part_size):
            yield _with_deps(_with_last_runs(rows[start:start + part_size], using), using)


def page_cursor(task) -> str:
    """The listing cursor (board.engine.listing.cursor_of) that resumes `task`'s column right after
    it, in the column's order: what GET /board/filter?stage=&cursor= pages on from. `task` is a
    Task, or any object with its id (`pk`), stage, claim_rank and exact updated_at (not the
    card's milliseconds, or a page would skip a task changed in the same millisecond). Every card
    carries it (`page_cursor`): a page that lets go of the cards past one resumes after it."""
    updated_at = task.updated_at
    if updated_at is not None and updated_at.tzinfo is None:  # SQLite's driver: naive UTC
        updated_at = updated_at.replace(tzinfo=UTC)
    return cursor_of(SimpleNamespace(pk=task.pk, claim_rank=task.claim_rank, updated_at=updated_at),
                     column_order(task.stage))


def _column_pages(page_size: int, using: str) -> list:
    """Each column's first `page_size` + 1 tasks (+ 1: whether a next page exists), in its
    order: the ORM's queries of their _ROW_COLUMNS, or on a SQL store their SQL and parameters,
    compiled once per process (compiling the seven took 8 ms of every snapshot)."""
    key = (using, page_size)
    if key not in _COMPILED_PAGES:
        queries = [Task.objects.using(using).filter(stage=stage).order_by(*LIST_ORDERS[column_order(stage)])
                   .values_list(*_ROW_COLUMNS)[:page_size + 1] for stage in Stage]
        if not store(using).speaks_sql:
            return queries  # MongoDB: run by the ORM
        _COMPILED_PAGES[key] = [query.query.sql_with_params() for query in queries]
    return _COMPILED_PAGES[key]


_COMPILED_PAGES: dict[tuple[str, int], list[tuple[str, tuple]]] = {}


def _values_of(queries: list, batch: int, using: str) -> Iterator[tuple]:
    """The _ROW_COLUMNS of every row of `queries` (values_list querysets, or SQL and parameters
    on a SQL store: _column_pages), in order, fetched `batch` rows at a time."""
    if not store(using).speaks_sql:  # MongoDB: the ORM's values, streamed in batches
        for query in queries:
            yield from query.iterator(batch)
        return
    # A server-side cursor on PostgreSQL (psycopg's default one fetches every row at once).
    with connections[using].chunked_cursor() as cursor:
        for sql, params in queries:
            # The ORM's SQL, fetched by the driver: no ORM converter per value (with them a
            # 100,000-task snapshot took 2.8 s on SQLite, most of it converting values).
            cursor.execute(sql, params)
            while rows := cursor.fetchmany(batch):
                yield from rows


_ROW_COLUMNS = (*CARD_COLUMNS, "has_deps")  # has_deps: whether to look up its dependencies
_STAGE = _ROW_COLUMNS.index("stage")
_CARD_JSON = ("resources", "requires", "prefers")  # null or a list / an object: no default to fill
_CARD_TIMES = ("lease_expires_at", "not_before", "created_at", "updated_at", "stage_changed_at",
               "progress_changed_at")


def _card_row(values: tuple) -> dict:
    row = dict(zip(_ROW_COLUMNS, values, strict=True))
    row["page_cursor"] = page_cursor(SimpleNamespace(pk=row["id"], **row))  # from the exact times
    row["on_hold"] = bool(row["on_hold"])  # SQLite: 0/1
    if isinstance(row["tags"], str):  # SQLite's JSON is text (PostgreSQL's driver decodes jsonb)
        row["tags"] = json.loads(row["tags"])
    elif row["tags"] is None:  # a row written before the column had a value
        row["tags"] = []
    for name in _CARD_JSON:  # as tags: SQLite's JSON is text
        if isinstance(row[name], str):
            row[name] = json.loads(row[name])
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


def _with_last_runs(rows: list[dict], using: str) -> list[dict]:
    """The rows, each COMPLETED one with its `last_run` (who ran it, how long it ran and waited:
    board.engine.timing.last_runs; one query for the part's completed tasks): a finished card
    says so. The others get none."""
    completed = [row["id"] for row in rows if row["stage"] == Stage.COMPLETED]
    runs = timing.last_runs(completed, using=using) if completed else {}
    for row in rows:
        row["last_run"] = runs.get(row["id"])
    return rows


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
            cursor.execute(f"{_DEPS_OF} ({', '.join(['%s'] * len(wanted))}) ORDER BY id", wanted)
            for task_id, dep in cursor.fetchall():
                deps[task_id].append(dep)
    return [(row, deps.get(row["id"], [])) for row in rows]


# Params: task ids. Each task's dependencies in the order they were written.
_DEPS_OF = f"SELECT task_id, depends_on_id FROM {Dependency._meta.db_table} WHERE task_id IN"


def board_tasks(*, page_size: int | None = None, using: str = "default") -> dict:
    """board_parts() all at once (bench/board.py): {"counts", "last_event_id", "next_pages",
    "tasks": [row, ...], "deps": {id: [dep, ...]}}."""
    parts = board_parts(page_size=page_size, using=using)
    board = {**next(parts), "tasks": [], "deps": {}}
    for part in parts:
        for row, deps in part:
            board["tasks"].append(row)
            board["deps"][row["id"]] = deps
    return board


def live_tasks(task_ids: list[str], *, using: str = "default") -> dict[str, tuple[dict, list[str]]]:
    """The tasks `task_ids` as they are now, as card rows (dicts of CARD_COLUMNS as JSON values,
    as `board_parts` yields them), each with its dependencies, for the live board's changes frame
    (board.live.frames.changes_for). A task no longer there is left out. Only the card columns
    are read: a page of 1000 events of tasks with 256 KiB checkpoints would otherwise load
    hundreds of MB into every server process."""
    rows = Task.objects.using(using).filter(pk__in=task_ids).values_list(*_ROW_COLUMNS)
    cards = _with_last_runs([_card_row(values) for values in rows], using)
    return {row["id"]: (row, deps) for row, deps in _with_deps(cards, using)}


# ---------------------------------------------------------------------------------------------
# Parked claims (board.live.parked).


def queues_of_queued(task_ids: list[str], *, using: str = "default") -> dict[str, str]:
    """The queue of each of `task_ids` that is QUEUED now (one query): which parked claims a
    batch of events may wake (board.live.parked.newly_ready)."""
    return dict(Task.objects.using(using).filter(pk__in=set(task_ids), stage=Stage.QUEUED)
                .values_list("pk", "queue"))


def ready_counts(wanted: dict[tuple[str | None, tuple[str, ...]], int], *,
                 using: str = "default") -> dict[tuple[str | None, tuple[str, ...]], int]:
    """How many ready tasks each (queue, capabilities) of `wanted` has (queue None: any queue)
    that a claimer holding those capabilities could take, counting no further than
    `wanted[key]`: the parked claims' poll (board.live.parked). One bounded query per key,
    without a transaction, like has_ready_task."""
    now = timezone.now()
    # Work a paused, full or rate-held queue keeps back wakes nobody: its claim would find nothing.
    return {(queue, caps): len(claimable_tasks(now, queue, capabilities=caps, using=using)
                               .values_list("pk", flat=True)[:n])
            for (queue, caps), n in wanted.items()}


# ---------------------------------------------------------------------------------------------
# The insights panel's reads (board.live.insights.compute). Each is one query and they are not
# one transaction, on purpose: see that module's docstring (a read transaction over both
# tables deadlocked with a TRUNCATE of them).


# What counts as an agent's heartbeat: a claim, a resume or a renew.
HEARTBEAT_VERBS = (Verb.CLAIM, Verb.RESUME, Verb.RENEW)


def history_window(start: datetime, *, since_id: int = 0, using: str = "default",
                   timing_from: int | None = None) -> tuple[list[tuple], dict, int | None, list[tuple] | None]:
    """The history from `start` on (ids from `since_id` on: the window only moves forward):
    (every move but renews, the bulk of a busy history, oldest first, as
    (id, task_id, verb, from_stage, to_stage, actor, at) rows; each actor's latest heartbeat; the
    id of the first renew, or None; None or, with `timing_from`, the rows
    board.engine.timing.samples_of_rows reads).

    `timing_from`: the id where the timing figures' window starts (timing.first_window_id,
    SLACK before the hour, so at or below the first id of this window): the moves are then read
    from there, each with its detail, in ONE read for both (the same 100,000 rows of a busy hour
    were read twice: bench/insights.py); the moves are those of them at `start` and `since_id`
    or later. The details stay as the driver gives them (JSON text on SQLite and PostgreSQL):
    timing decodes only the few rows whose detail it reads."""
    in_window = TaskEvent.objects.using(using).filter(id__gte=since_id, at__gte=start)
    # `at` without Django's per-row conversion (on SQLite a parse, then making it aware through
    # the settings: a large part of this read's Python time at a busy hour's 100,000 rows):
    # the driver's datetime, made aware here where it came naive (SQLite's and MongoDB's are
    # UTC, as the board stores every time). bench/insights.py measures it.
    as_read = {"at_as_read": ExpressionWrapper(F("at"), output_field=Field())}
    columns = ("id", "task_id", "verb", "from_stage", "to_stage", "actor", "at_as_read")
    timing_rows = None
    if timing_from is None:
        rows = in_window.exclude(verb=Verb.RENEW).order_by("id").annotate(**as_read).values_list(*columns)
        moves = [row if row[6].tzinfo is not None else (*row[:6], row[6].replace(tzinfo=UTC)) for row in rows]
    else:
        rows = (TaskEvent.objects.using(using).filter(id__gte=timing_from).exclude(verb=Verb.RENEW).order_by("id")
                .annotate(**as_read, detail_as_read=ExpressionWrapper(F("detail"), output_field=Field()))
                .values_list(*columns, "detail_as_read"))
        moves, timing_rows = [], []
        for id_, task_id, verb, from_stage, to_stage, actor, at, detail in rows:
            if at.tzinfo is None:
                at = at.replace(tzinfo=UTC)
            timing_rows.append((id_, task_id, verb, from_stage, to_stage, at, detail))  # timing's columns
            if id_ >= since_id and at >= start:
                moves.append((id_, task_id, verb, from_stage, to_stage, actor, at))
    heartbeats = dict(in_window.filter(verb__in=HEARTBEAT_VERBS).order_by()
                      .values_list("actor").annotate(last=Max("at")).values_list("actor", "last"))
    first_renew = in_window.filter(verb=Verb.RENEW).order_by("id").values_list("id", flat=True).first()
    return moves, heartbeats, first_renew, timing_rows


# Above this many ids, queues_of_moved reads the tasks by their last change instead of by id.
MOVED_BY_ID_MAX = 1_000


def queues_of_moved(task_ids: list[str], since: datetime, *, using: str = "default") -> dict[str, str]:
    """The queue of each of `task_ids`, tasks that moved at `since` or later. Many of them (a
    busy hour: 100,000) are read as the tasks changed since then, by the index on updated_at
    (every move writes it, at the time its history row says): one range read, where a lookup
    by id takes hundreds of IN lists (bench/insights.py at 120,520 rows: the later computation
    0.856 s by id, 0.680 s so). An id that read misses (none should) is then looked up by id."""
    if len(task_ids) <= MOVED_BY_ID_MAX:
        return selectors.queues_of(task_ids, using=using)
    changed = dict(Task.objects.using(using).filter(updated_at__gte=since).order_by().values_list("pk", "queue"))
    queues = {task_id: changed[task_id] for task_id in task_ids if task_id in changed}
    if len(queues) < len(task_ids):
        queues.update(selectors.queues_of([t for t in task_ids if t not in changed], using=using))
    return queues


def held_tasks(*, using: str = "default") -> list[tuple[str, str]]:
    """(owner, task id) of every RUNNING task, by owner then id."""
    return list(Task.objects.using(using).filter(stage=Stage.RUNNING).exclude(owner="")
                .order_by("owner", "id").values_list("owner", "id"))


def queued_per_queue(*, using: str = "default") -> dict[str, int]:
    """How many tasks each queue has QUEUED now (queues with none are left out)."""
    return dict(Task.objects.using(using).filter(stage=Stage.QUEUED).order_by()
                .values_list("queue").annotate(n=Count("id")).values_list("queue", "n"))
