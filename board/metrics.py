"""Prometheus metrics: `/metrics` in the text format (README, "Metrics").

Counters are fed by the engine's outcome hook (board.engine.outcomes: board/apps.py subscribes
`on_outcome`), so the engine never imports prometheus; the API's latency histogram by a
middleware (`api_latency`, in settings.MIDDLEWARE); the websocket gauge by the board's sockets
(board.live.consumers) and the tailer's position by the tailer (board.live.tailer). What the
board holds (tasks by stage and queue, the oldest QUEUED task's age per queue, live leases, the
last hour's waits and runs per queue) is read at scrape time, one grouped query each (the reads
before `_Scrape`, below; the waits and runs: board.engine.timing's bounded reads of the history's
last hour), so no request pays for it. Queues are named up to QUEUE_LABEL_LIMIT, the rest summed (below).

Several processes serve one port (`manage.py serve`: uvicorn workers, and the reaper beside
them). With PROMETHEUS_MULTIPROC_DIR set (serve sets it for its workers and the reaper) every
process writes its values to files there and a scrape, whichever worker answers it, adds them
up (prometheus_client's multi-process mode): the numbers are the whole server's. Without it
(runserver, a test process) a scrape shows this process's.

Who may scrape: a bearer token equal to TASKFLOW_METRICS_TOKEN (the scraper's; compared in
constant time), an operator agent key, or the session of a staff user who may read the board
(board.access.may_read). Nobody else: 401 without credentials, 403 with credentials that do not
allow it.
"""
from __future__ import annotations

import hmac
import os
import time
from collections import Counter as Tally  # `Counter` here is prometheus_client's metric
from collections.abc import Mapping
from datetime import datetime

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.db.models import Count, Min
from django.db.models.functions import Coalesce
from django.http import HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector

from board import access, agent_keys
from board.engine import clock, outcomes, timing
from board.engine.lifecycle import Stage, Verb
from board.engine.limits import QUEUE_LABEL_LIMIT
from board.models import Task, TaskEvent

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


# In multi-process mode every inc() and observe() asks os.getpid(), to notice a fork (whose
# child must write files of its own): a system call per increment, about ten per request (no
# gain beyond the noise in bench/http_claims.py, but nothing to pay for either). The pid is read
# once here and again in a forked child.
# Set before the metrics below are made: each takes its value class when it is made.
_pid = os.getpid()


def _this_process() -> int:
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if os.environ.get(MULTIPROC_ENV):
    os.register_at_fork(after_in_child=_forked)
    prometheus_values.ValueClass = prometheus_values.MultiProcessValue(process_identifier=_this_process)

TRANSITIONS = Counter(
    "taskflow_transitions", "Moves made (won), compare-and-swaps lost to another writer (lost_race) "
    "and calls refused (refused, with the error code), by lifecycle verb.", ["verb", "outcome", "code"])
CLAIMS = Counter("taskflow_claims", "Leases made by claim and claim_next (not resume).")
CLAIM_NEXT_EMPTY = Counter("taskflow_claim_next_empty", "claim_next calls that found no ready task.")
LEASE_EXPIRIES = Counter(
    "taskflow_lease_expiries", "Expired leases taken back: by the reaper, or by a claim of the task "
    "(a takeover).", ["by"])
RECLAIMS = Counter("taskflow_reclaims", "Tasks put back in the queue after their lease expired.")
TAKEOVERS = Counter("taskflow_takeovers", "Claims that took a task over from an expired lease.")
RETRIES = Counter("taskflow_retries", "Failed attempts sent back to the queue behind a backoff.")
TERMINAL_FAILURES = Counter(
    "taskflow_terminal_failures", "Failures that left the task FAILED: not_retryable (the holder said so), "
    "attempts_spent, lease_expired (on the last attempt), deadline (a queue timeout, or an attempt or "
    "progress timeout on the last attempt).", ["reason"])
# Django's handling of one /api/ request (a parked claim's wait is not in it: serving.py holds it
# without a thread and replays the request, each replay measured again).
API_LATENCY = Histogram(
    "taskflow_api_request_duration_seconds", "API requests by method and route (the URL pattern, "
    "never the raw path).", ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
# SQLite's one writer at a time (board.engine.stores.sqlite.observe_sqlite_writes): how long write
# transactions wait for the writers' locks and hold them. Holds that add up to about a second
# per second mean the file is the board's limit (README, "Serving": PostgreSQL then).
_LOCK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SQLITE_WRITE_WAIT = Histogram(
    "taskflow_sqlite_write_wait_seconds", "SQLite write transactions: time waiting for the writers' "
    "lock (other processes'; a verb waits for its own process's threads before, at its start).",
    buckets=_LOCK_BUCKETS)
SQLITE_WRITE_HOLD = Histogram(
    "taskflow_sqlite_write_hold_seconds", "SQLite write transactions: time holding the writers' lock, "
    "commit included.", buckets=_LOCK_BUCKETS)
WEBSOCKETS = Gauge("taskflow_websocket_clients", "Board sockets connected and watching.",
                   multiprocess_mode="livesum")
BOARD_FRAMES = Counter("taskflow_board_frames", "Frames handed to board sockets: written at once as bytes built "
                       "once for every socket (direct), or queued behind the socket's earlier frames (queued).",
                       ["path"])
# Labelled by the database alias the tailer reads, so that only a process that runs a tailer
# has a sample (an unlabelled gauge starts at 0 in every process, the reaper's too).
TAILER_DELIVERED = Gauge("taskflow_tailer_delivered_event_id",
                         "The last history row this process's tailer handed to its sockets.", ["alias"],
                         multiprocess_mode="liveall")

# Usage reported by the holders (board.engine.usage; issue 32): summed over every report.
USAGE_TOKENS = Counter("taskflow_usage_tokens", "Tokens the holders reported using, by kind (input, output).", ["kind"])
USAGE_COST = Counter("taskflow_usage_cost_usd", "Cost in US dollars the holders reported (reports with a cost).")
USAGE_REPORTS = Counter("taskflow_usage_reports", "Usage reports, by whether they gave a cost (given, missing).",
                        ["cost"])

for _by in ("reaper", "claim"):  # present at 0 from the start, so that rate() has a series
    LEASE_EXPIRIES.labels(by=_by)
for _reason in ("not_retryable", "attempts_spent", "lease_expired", "deadline"):
    TERMINAL_FAILURES.labels(reason=_reason)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def on_usage(report: dict) -> None:
    """One usage report written (board.api.routers.leases): the usage counters."""
    USAGE_TOKENS.labels("input").inc(report["input_tokens"])
    USAGE_TOKENS.labels("output").inc(report["output_tokens"])
    if report["cost_usd"] is None:
        USAGE_REPORTS.labels("missing").inc()
    else:
        USAGE_COST.inc(report["cost_usd"])
        USAGE_REPORTS.labels("given").inc()


def on_outcome(verb: str, outcome: str, code: str, count: int) -> None:
    """board.engine.outcomes' observer: a counter increment or two, nothing else."""
    if outcome in (outcomes.WON, outcomes.LOST_RACE, outcomes.REFUSED):
        TRANSITIONS.labels(verb, outcome, code).inc(count)
        if outcome == outcomes.WON:
            if verb == Verb.CLAIM:
                CLAIMS.inc(count)
            elif verb == Verb.RECLAIM:
                RECLAIMS.inc(count)
            elif verb == Verb.RETRY:
                RETRIES.inc(count)
    elif outcome == outcomes.EMPTY:
        CLAIM_NEXT_EMPTY.inc(count)
    elif outcome == outcomes.EXPIRED:
        LEASE_EXPIRIES.labels(code).inc(count)
        if code == "claim":
            TAKEOVERS.inc(count)
    elif outcome == outcomes.TERMINAL:
        TERMINAL_FAILURES.labels(code).inc(count)


def on_sqlite_write(waited: float, held: float) -> None:
    """board.engine.stores.sqlite's observer of SQLite write transactions."""
    SQLITE_WRITE_WAIT.observe(waited)
    SQLITE_WRITE_HOLD.observe(held)


# ---------------------------------------------------------------------------------------------
# What this process's parts report


def websocket_opened() -> None:
    WEBSOCKETS.inc()


def websocket_closed() -> None:
    WEBSOCKETS.dec()


def board_frames(direct: int, queued: int) -> None:
    """One broadcast's count (board.live.tailer), not one call per socket."""
    if direct:
        BOARD_FRAMES.labels("direct").inc(direct)
    if queued:
        BOARD_FRAMES.labels("queued").inc(queued)


def tailer_delivered(event_id: int, using: str = "default") -> None:
    TAILER_DELIVERED.labels(using).set(event_id)


# board.api.middleware.API_PREFIX, spelt again: the API's layer is above this module's
# (tests/test_layers.py), and tests/test_metrics.py times requests under it.
_API_PREFIX = "/api/"


@sync_and_async_middleware
def api_latency(get_response):
    """Time Django's handling of each /api/ request, labelled by its route (URL pattern)."""

    def observe(request, started: float) -> None:
        match = getattr(request, "resolver_match", None)
        route = f"/{match.route}" if match is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        API_LATENCY.labels(method, route).observe(time.perf_counter() - started)

    if iscoroutinefunction(get_response):
        async def middleware(request):
            if not request.path.startswith(_API_PREFIX):
                return await get_response(request)
            started = time.perf_counter()
            response = await get_response(request)
            observe(request, started)
            return response
    else:
        def middleware(request):
            if not request.path.startswith(_API_PREFIX):
                return get_response(request)
            started = time.perf_counter()
            response = get_response(request)
            observe(request, started)
            return response
    return middleware


# ---------------------------------------------------------------------------------------------
# The scrape

# Queue names are chosen by clients: one series per queue and stage would let anyone with a key
# grow every scrape without bound (5,000 one-task queues made 35,021 series, 2.1 MB). A scrape
# names the QUEUE_LABEL_LIMIT queues holding the most tasks (all stages together, ties broken by
# name) and sums every other queue into one label value, OTHER_QUEUES: sums over all label
# values stay the true totals.
# Not a valid queue name (a queue's name starts with a letter or a digit): never taken for one.
OTHER_QUEUES = "_other"


def named_queues(held: Mapping[str, int], limit: int = QUEUE_LABEL_LIMIT) -> frozenset[str]:
    """The queues a scrape names: of `held` (queue -> tasks it holds, every stage), the `limit`
    holding the most, ties broken by name."""
    ranked = sorted((queue for queue in held if queue != OTHER_QUEUES), key=lambda queue: (-held[queue], queue))
    return frozenset(ranked[:limit])


def queue_label(queue: str, named: frozenset[str]) -> str:
    return queue if queue in named else OTHER_QUEUES


# What the board holds, read at scrape time: one grouped query each, nothing kept between scrapes.


def tasks_by_stage_and_queue(*, using: str = "default") -> dict[tuple[str, str], int]:
    """How many tasks are in each (stage, queue) that has any."""
    rows = Task.objects.using(using).values_list("stage", "queue").annotate(n=Count("id")).order_by()
    return {(stage, queue): n for stage, queue, n in rows}


def oldest_queued_by_queue(*, using: str = "default") -> dict[str, datetime]:
    """For each queue with QUEUED tasks, when its longest-waiting one entered QUEUED (backoff
    included: a task waiting out its retry delay is waiting too). A row written outside the
    engine may have no stage_changed_at: its last write bounds it, as in board.public."""
    rows = (Task.objects.using(using).filter(stage=Stage.QUEUED).values_list("queue")
            .annotate(oldest=Min(Coalesce("stage_changed_at", "updated_at"))).order_by())
    return dict(rows)


def live_lease_count(now: datetime | None = None, *, using: str = "default") -> int:
    """RUNNING tasks whose lease has not expired by `now` (default: the store's clock)."""
    now = now or clock.now(using)
    return Task.objects.using(using).filter(stage=Stage.RUNNING, lease_expires_at__gt=now).count()


class _Scrape:
    """One scrape's metrics: every process's (or this process's) counters and gauges, then the
    board's gauges read now, and each tailer's lag behind the newest committed history row."""

    def __init__(self, using: str = "default"):
        self.using = using

    def _process_metrics(self):
        directory = os.environ.get(MULTIPROC_ENV)
        if directory:
            return MultiProcessCollector(None, path=directory).collect()
        return REGISTRY.collect()

    def collect(self):
        delivered: list[tuple[str, float]] = []
        for family in self._process_metrics():
            if family.name == TAILER_DELIVERED._name:
                delivered = [(s.labels.get("pid", str(os.getpid())), s.value) for s in family.samples
                             if s.labels.get("alias") == self.using]
            yield family
        using = self.using

        counts = tasks_by_stage_and_queue(using=using)
        held: Tally[str] = Tally()
        for (_, queue), n in counts.items():
            held[queue] += n
        named = named_queues(held)

        tasks = GaugeMetricFamily("taskflow_tasks", f"Tasks by stage and queue: the {QUEUE_LABEL_LIMIT} "
                                  f"queues holding the most tasks, the rest summed as queue=\"{OTHER_QUEUES}\".",
                                  labels=["stage", "queue"])
        by_label: Tally[tuple[str, str]] = Tally()
        for (stage, queue), n in counts.items():
            by_label[(stage, queue_label(queue, named))] += n
        for label in sorted({label for _, label in by_label}):
            for stage in Stage:  # every stage of a queue that has tasks, 0 included
                tasks.add_metric([stage.value, label], by_label[(stage.value, label)])
        yield tasks

        now = clock.now(using)
        oldest = GaugeMetricFamily("taskflow_oldest_queued_age_seconds",
                                   "Age of the longest-waiting QUEUED task, per queue (the queues of "
                                   f"taskflow_tasks; queue=\"{OTHER_QUEUES}\": the oldest of the rest).",
                                   labels=["queue"])
        since_by_label: dict[str, datetime] = {}
        for queue, since in oldest_queued_by_queue(using=using).items():
            label = queue_label(queue, named)
            since_by_label[label] = min(since, since_by_label.get(label, since))
        for label, since in sorted(since_by_label.items()):
            oldest.add_metric([label], max(0.0, (now - since).total_seconds()))
        yield oldest

        yield from queue_timing_families(timing.samples_by_queue(now, using=using), named)

        yield GaugeMetricFamily("taskflow_live_leases", "RUNNING tasks whose lease has not expired.",
                                value=live_lease_count(now, using=using))

        newest = _newest_event_id(using)
        lag = GaugeMetricFamily("taskflow_tailer_lag_events", "History rows committed that a process's "
                                "tailer has not handed to its sockets yet (newest committed id minus "
                                "the last delivered), per server process.", labels=["pid"])
        for pid, last in sorted(delivered):
            lag.add_metric([pid], max(0.0, newest - last))
        yield lag


def queue_timing_families(figures: Mapping[str, Mapping[str, list[float]]], named: frozenset[str]):
    """taskflow_queue_{wait,run}_seconds{queue,quantile} and taskflow_queue_{waits,runs}_last_hour
    {queue}: the waits and runs that ended in the last hour (board.engine.timing), per queue of
    taskflow_tasks, the other queues' samples pooled into queue="_other" (its quantiles are those
    of the pooled samples, not sums). Gauges, not a summary: the counts are the last hour's, not
    running totals. A queue with none in the hour has no sample (no NaN)."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for queue, kinds in figures.items():
        into = pooled.setdefault(queue_label(queue, named), {timing.WAIT: [], timing.RUN: []})
        for kind, values in kinds.items():
            into[kind].extend(values)
    for kind, what in ((timing.WAIT, "from ready (QUEUED, past any backoff or run_at) to claimed"),
                       (timing.RUN, "from the claim (or resume) to the complete or fail of that lease")):
        quantiles = GaugeMetricFamily(
            f"taskflow_queue_{kind}_seconds", f"Seconds {what}, per queue, over what ended in the last hour: "
            "the nearest-rank p50 and p95 (quantile=\"0.5\", \"0.95\").", labels=["queue", "quantile"])
        counts = GaugeMetricFamily(
            f"taskflow_queue_{kind}s_last_hour", f"How many {kind}s ({what}) ended in the last hour, per queue.",
            labels=["queue"])
        for label in sorted(pooled):
            values = pooled[label][kind]
            if not values:
                continue
            for q in timing.QUANTILES:
                quantiles.add_metric([label, str(q)], timing.quantile(values, q))
            counts.add_metric([label], len(values))
        yield quantiles
        yield counts


def scrape(using: str = "default") -> bytes:
    """The text a scrape answers."""
    registry = CollectorRegistry()
    registry.register(_Scrape(using))
    return generate_latest(registry)


def _refuse(status: int, code: str, message: str) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _refusal(request) -> JsonResponse | None:
    """Why this request may not scrape, or None when it may."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            return _refuse(401, "unauthorized", "send Authorization: Bearer <metrics token or operator key>")
        configured = settings.TASKFLOW.get("METRICS_TOKEN", "")
        if configured and hmac.compare_digest(credential.encode(), configured.encode()):
            return None
        key = agent_keys.authenticate(credential)
        if key is None:
            return _refuse(401, "unauthorized", "unknown or revoked credential")
        if not key.is_operator:
            return _refuse(403, "forbidden", "metrics need an operator key")
        return None
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return _refuse(401, "unauthorized", "send Authorization: Bearer <metrics token or operator key>, "
                                            "or log in as staff")
    if not access.may_read(user):
        return _refuse(403, "forbidden", "metrics need the board.view_task permission")
    return None


def _newest_event_id(using: str) -> int:
    """The newest history row committed (0: none), which the tailers' lag is measured from (read
    here: the live board, which reports its tailer's progress to this module, is a layer above)."""
    return TaskEvent.objects.using(using).order_by("-id").values_list("id", flat=True).first() or 0


@require_GET
def metrics_view(request):
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(scrape(), content_type=CONTENT_TYPE_LATEST)
