"""How long tasks wait and run, read from the history (TaskEvent: every move, with its time).

Per task, walking its history rows in id order (`task_samples`, pure):

- a **wait** runs from the moment the task became ready (it entered QUEUED: created, admitted,
  retried, released, reclaimed or requeued; when the row records a delay, from the delay's end:
  a retry's `backoff_seconds`, a snooze's `retry_after_seconds`, a create's `run_at`) to the
  claim that took it out of QUEUED;
- a **run** runs from the claim (or resume) that started a lease to the complete or fail that
  ended that lease: one per attempt that ended by its holder's word or a deadline's failure (a
  lease lost and reclaimed, released or paused ends no run).

Per queue (`queue_timings`): the waits and runs that ENDED in the last WINDOW (an hour) before
`now`, with their count and their p50 and p95 (`quantile`: the nearest rank, the smallest value
with at least that share of the samples at or below it; no interpolation, so every figure is
one sample's). Shown by the board's insights panel (board.live.insights) and exported by
/metrics (board.metrics).

Bounded reads. The history has no index on `at`; its primary key follows time (ids are taken
in commit order, give or take the transactions open at once). `first_id_since(moment)` finds
the first row at or after a moment by a binary search on the primary key (about 25 indexed
reads of one row for 30 million rows), and the window is then read as an id range, renews
left out (EXPLAIN on PostgreSQL: an Index Scan using board_taskevent_pkey). The window read
starts SLACK earlier than the hour so that a row committed out of id order near the start is
still read. A wait or run that ended in the window but began before that read has its start
looked up in the task's own older rows, by the (task, id) index `event_task_history`, for those
tasks only."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from board.engine import clock, selectors
from board.engine.lifecycle import Stage, Verb
from board.models import TaskEvent

WINDOW = timedelta(hours=1)
SLACK = timedelta(minutes=5)
QUANTILES = (0.5, 0.95)
WAIT, RUN = "wait", "run"
_CHUNK = 500  # ids per IN list

# The verbs that start a lease (a run) and those that end one with a run's figure.
_RUN_STARTS = frozenset({Verb.CLAIM, Verb.RESUME})
_RUN_ENDS = frozenset({Verb.COMPLETE, Verb.FAIL})
# Each row as read here: (id, task_id, verb, from_stage, to_stage, at, detail).
_COLUMNS = ("id", "task_id", "verb", "from_stage", "to_stage", "at", "detail")


@dataclass(frozen=True)
class Sample:
    kind: str  # WAIT or RUN
    seconds: float
    end: datetime  # the claim (a wait) or the complete/fail (a run)


def task_samples(rows: Iterable[Sequence]) -> tuple[list[Sample], bool]:
    """The waits and runs of one task from its history rows in id order, as
    (id, task_id, verb, from_stage, to_stage, at, detail); and whether an end was met whose start
    is not among the rows (an older row the caller did not read)."""
    samples: list[Sample] = []
    ready_at: datetime | None = None  # when its current stay in QUEUED became claimable
    run_at: datetime | None = None  # a create's run_at, until the task first enters QUEUED
    started: datetime | None = None  # the start of the current lease
    missing = False
    for _, _, verb, from_stage, to_stage, at, detail in rows:
        entered_queue = to_stage == Stage.QUEUED and from_stage != Stage.QUEUED
        if verb == Verb.CREATE or entered_queue:  # only these rows' details matter here
            detail = _as_dict(detail)
            if verb == Verb.CREATE and detail.get("run_at"):
                run_at = datetime.fromisoformat(detail["run_at"])
            if entered_queue:
                delay = detail.get("backoff_seconds") or detail.get("retry_after_seconds")
                ready_at = at + timedelta(seconds=delay) if delay else at
                if run_at is not None:
                    ready_at = max(ready_at, run_at)
                    run_at = None
        if verb in _RUN_STARTS and to_stage == Stage.RUNNING:
            if from_stage == Stage.QUEUED:
                if ready_at is None:
                    missing = True
                else:
                    # Never below 0: on SQLite `at` is each process's clock, and a claim in one
                    # process may read a hair before the retry another process stamped.
                    samples.append(Sample(WAIT, max(0.0, (at - ready_at).total_seconds()), at))
                ready_at = None
            started = at
        elif verb in _RUN_ENDS and from_stage == Stage.RUNNING:
            if started is None:
                missing = True
            else:
                samples.append(Sample(RUN, max(0.0, (at - started).total_seconds()), at))
            started = None
        elif from_stage == Stage.RUNNING and to_stage != Stage.RUNNING:
            started = None  # released, paused, reclaimed, cancelled: no run's figure
    return samples, missing


def _as_dict(detail) -> dict:
    """A history row's detail as a dict: decoded here when it was read as the driver gives it (a
    JSON text on SQLite and PostgreSQL: board.live.reads.history_window leaves most rows'
    undecoded), {} for none."""
    if isinstance(detail, str):
        detail = json.loads(detail)
    return detail if isinstance(detail, dict) else {}


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of `values` (not empty): the smallest value with at least a
    share `q` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values: Sequence[float]) -> dict:
    """{"count", "p50", "p95"} of some seconds (p50 and p95 None when there are none)."""
    if not values:
        return {"count": 0, "p50": None, "p95": None}
    return {"count": len(values), "p50": quantile(values, 0.5), "p95": quantile(values, 0.95)}


def first_id_since(moment: datetime, *, using: str = "default") -> int | None:
    """The id of the first history row stamped at or after `moment` (None: none is), by a binary
    search over the primary key (ids follow time; see the module's docstring)."""
    events = TaskEvent.objects.using(using).order_by("id")
    newest = events.reverse().values_list("id", "at").first()
    if newest is None or newest[1] < moment:
        return None
    low, high = 0, newest[0]  # the answer is in (low, high]
    while high - low > 1:
        middle = (low + high) // 2
        row = events.filter(id__gt=low, id__lte=middle).reverse().values_list("at", flat=True).first()
        if row is not None and row >= moment:
            high = middle
        else:
            low = middle
    return events.filter(id__gt=low).values_list("id", flat=True).first()


def samples_by_queue(now: datetime | None = None, *, using: str = "default",
                     window: timedelta = WINDOW) -> dict[str, dict[str, list[float]]]:
    """{queue: {WAIT: [seconds], RUN: [seconds]}} of the waits and runs that ended in the
    `window` before `now` (default: the store's clock). Queues with none are left out."""
    now = now or clock.now(using)
    since = first_window_id(now, using=using, window=window)
    if since is None:
        return {}
    rows = (TaskEvent.objects.using(using).filter(id__gte=since).exclude(verb=Verb.RENEW)
            .order_by("id").values_list(*_COLUMNS))
    return samples_of_rows(rows, since, now, using=using, window=window)


def first_window_id(now: datetime, *, using: str = "default", window: timedelta = WINDOW) -> int | None:
    """Where the window's read starts: the first history row stamped at or after SLACK before
    the `window` before `now` (None: there is none)."""
    return first_id_since(now - window - SLACK, using=using)


def samples_of_rows(rows: Iterable[Sequence], since: int, now: datetime, *, using: str = "default",
                    window: timedelta = WINDOW,
                    queue_of: dict[str, str] | None = None) -> dict[str, dict[str, list[float]]]:
    """samples_by_queue's figures from the window's rows as read from `since` (first_window_id)
    on, renews left out, in id order, as _COLUMNS (a detail may still be its JSON text). The
    tasks' queues: `queue_of` when the caller read them (the insights panel's one read,
    board.live.insights), else read here by id."""
    start = now - window
    by_task: dict[str, list] = defaultdict(list)
    for row in rows:
        by_task[row[1]].append(row)

    def ends_in_window(samples: list[Sample]) -> list[Sample]:
        return [s for s in samples if start <= s.end <= now]

    found: dict[str, list[Sample]] = {}
    older: list[str] = []
    for task_id, task_rows in by_task.items():
        samples, missing = task_samples(task_rows)
        found[task_id] = samples
        if missing and any(start <= row[5] <= now for row in task_rows):
            older.append(task_id)
    for begin in range(0, len(older), _CHUNK):  # the tasks whose start is before the read
        chunk = older[begin:begin + _CHUNK]
        before: dict[str, list] = defaultdict(list)
        for row in (TaskEvent.objects.using(using).filter(task_id__in=chunk, id__lt=since)
                    .exclude(verb=Verb.RENEW).order_by("task_id", "id").values_list(*_COLUMNS)):
            before[row[1]].append(row)
        for task_id in chunk:
            found[task_id], _ = task_samples(before[task_id] + by_task[task_id])

    kept = {task_id: in_window for task_id, samples in found.items() if (in_window := ends_in_window(samples))}
    if queue_of is None:
        queue_of = selectors.queues_of(sorted(kept), using=using)
    result: dict[str, dict[str, list[float]]] = {}
    for task_id, samples in kept.items():
        queue = queue_of.get(task_id)
        if queue is None:  # pruned since its rows were read
            continue
        figures = result.setdefault(queue, {WAIT: [], RUN: []})
        for sample in samples:
            figures[sample.kind].append(sample.seconds)
    return result


def queue_timings(now: datetime | None = None, *, using: str = "default",
                  window: timedelta = WINDOW) -> dict[str, dict[str, dict]]:
    """{queue: {"wait": summary, "run": summary}} over the `window` before `now` (summary())."""
    return timings_of(samples_by_queue(now, using=using, window=window))


def timings_of(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict]]:
    """queue_timings' figures from samples_by_queue's (or samples_of_rows') samples."""
    return {queue: {kind: summary(values) for kind, values in figures.items()}
            for queue, figures in sorted(samples.items())}


def last_runs(task_ids: Sequence[str], *, using: str = "default") -> dict[str, dict]:
    """For each of `task_ids` that COMPLETED: who held the lease it completed under, how long
    that run took and how long the task waited before it (its last wait), from its own history
    rows (renews left out; the (task, id) index `event_task_history`), as
    {"ran_by", "run_seconds", "wait_seconds"}. A figure whose rows retention has pruned is None;
    a task with no complete row in its history is left out. What a finished card shows
    (board.live.reads)."""
    out: dict[str, dict] = {}
    for begin in range(0, len(task_ids), _CHUNK):
        by_task: dict[str, list] = defaultdict(list)
        for row in (TaskEvent.objects.using(using).filter(task_id__in=task_ids[begin:begin + _CHUNK])
                    .exclude(verb=Verb.RENEW).order_by("task_id", "id").values_list(*_COLUMNS, "actor")):
            by_task[row[1]].append(row)
        for task_id, rows in by_task.items():
            completes = [row for row in rows if row[2] == Verb.COMPLETE]
            if not completes:
                continue
            samples, _ = task_samples(row[:-1] for row in rows)
            runs = [s for s in samples if s.kind == RUN and s.end == completes[-1][5]]
            waits = [s for s in samples if s.kind == WAIT]
            out[task_id] = {"ran_by": completes[-1][-1] or None, "run_seconds": runs[-1].seconds if runs else None,
                            "wait_seconds": waits[-1].seconds if waits else None}
    return out
