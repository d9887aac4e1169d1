"""The collecting pass: from the history (the board's outbox) to each webhook's deliveries.

Each active webhook has its own cursor in TaskEvent, read with the live board's cursor
(board.live.outbox.Cursor: every committed event exactly once, in id order, late commits on
PostgreSQL included, through its holes). For each page, one write transaction inserts a
WebhookDelivery per event the webhook wants (task.failed, task.deadline_missed, after its filter)
and moves the webhook's cursor, held to the row's `version` as read: a pass that lost the race to
another reaper commits nothing, and the unique (webhook, event_id) pair refuses a second copy.
So an event is never lost (the cursor moves only with its deliveries) nor collected twice, across
restarts and reapers, and the engine is not touched: its transitions already write the history.

check.problem: at most every PROBLEMS_EVERY_SECONDS (the reaper's loop says when), check() is run
once (selectors.problems) and each webhook that wants it gets one delivery per (code, task) pair
that was not in its `problems_seen`; a pair that disappears is forgotten, so its return is
announced again. No spam from a lasting problem, and at most WEBHOOK_PROBLEMS_PER_PASS new ones
per pass.

queue.budget_exhausted: each pass reads the queues whose budget is spent now (few: an indexed
nothing on most boards) and gives each webhook that wants it one delivery per closing: the
event's id names the queue and when its budget was reached (Queue.budget_closed_at), so the
unique (webhook, event_id) pair makes it once however many passes see the queue closed, and a
queue that closes again (the next window, a lowered budget) is a new event."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.db.models import F

from board.engine import clock, selectors
from board.engine.limits import WEBHOOK_PROBLEMS_PER_PASS
from board.engine.stores import TransactionConflict, store
from board.live import outbox
from board.models import Queue, Task, TaskEvent, Webhook, WebhookDelivery
from board.webhooks import events
from board.webhooks.subscriptions import matches, matches_queue

log = logging.getLogger("board.webhooks")

PAGES_PER_PASS = 10  # pages of the history one webhook reads per pass (the rest: the next pass)
PROBLEMS_EVERY_SECONDS = 10.0  # how often the reaper's loop runs check() for check.problem


@dataclass
class Collected:
    deliveries: int = 0  # inserted by this pass
    lost_races: int = 0  # pages another collector committed first (read again next pass)


def collect(*, now: datetime | None = None, problems: bool = True, using: str = "default") -> Collected:
    """One pass over every active webhook: the history since its cursor, and (with `problems`)
    the check() problems that are new to it."""
    now = now or clock.now(using)
    done = Collected()
    hooks = list(Webhook.objects.using(using).filter(active=True).order_by("id"))
    for webhook in hooks:
        if set(webhook.events) & set(events.FROM_HISTORY):
            _collect_history(webhook, now, done, using)
    budgeted = [w for w in hooks if events.BUDGET_EXHAUSTED in w.events]
    if budgeted:
        closed = list(Queue.objects.using(using).filter(budget_closed_at__isnull=False,
                                                        budget_closed_until__gt=now.timestamp()))
        for webhook in budgeted if closed else ():
            _collect_budgets(Webhook.objects.using(using).get(pk=webhook.pk), closed, now, done, using)
    wanting = [w for w in hooks if events.CHECK_PROBLEM in w.events]
    if problems and wanting:
        found = selectors.problems(now=now, using=using)
        for webhook in wanting:
            _collect_problems(Webhook.objects.using(using).get(pk=webhook.pk), found, now, done, using)
    return done


def _collect_history(webhook: Webhook, now: datetime, done: Collected, using: str) -> None:
    for _ in range(PAGES_PER_PASS):
        cursor = outbox.Cursor(webhook.cursor, {int(i): h for i, h in (webhook.holes or {}).items()}, using=using)
        page = cursor.read()
        rows = _deliveries(webhook, page.events, now, using)
        holes = {str(i): h for i, h in page.holes.items()}
        if page.last_id == webhook.cursor and holes == (webhook.holes or {}) and not rows:
            return  # caught up, nothing changed
        if not _commit(webhook, rows, done, using, cursor=page.last_id, holes=holes):
            return
        webhook.cursor, webhook.holes, webhook.version = page.last_id, holes, webhook.version + 1
        if not page.full:
            return


def _commit(webhook: Webhook, rows: list[WebhookDelivery], done: Collected, using: str, **values: Any) -> bool:
    """Insert `rows` and write `values` on the webhook, together, if the webhook is still the row
    read (its version); False when another collector was first (nothing written)."""
    try:
        with store(using).write_transaction():
            if not Webhook.objects.using(using).filter(pk=webhook.pk, version=webhook.version).update(
                    version=F("version") + 1, **values):
                done.lost_races += 1
                return False
            if rows:  # (none of them should exist: the version says nobody collected them; but never twice)
                have = set(WebhookDelivery.objects.using(using).filter(
                    webhook_id=webhook.pk, event_id__in=[r.event_id for r in rows]).values_list("event_id", flat=True))
                rows = [r for r in rows if r.event_id not in have]
                WebhookDelivery.objects.using(using).bulk_create(rows)
    except (IntegrityError, TransactionConflict):  # another collector wrote first: read again next pass
        done.lost_races += 1
        return False
    done.deliveries += len(rows)
    return True


def _deliveries(webhook: Webhook, page: list[TaskEvent], now: datetime, using: str) -> list[WebhookDelivery]:
    """The deliveries a page of history makes for `webhook`."""
    wanted = set(webhook.events) & set(events.FROM_HISTORY)
    failed = [e for e in page if e.to_stage == "FAILED"]
    retried: set[tuple[str, int]] = set()
    if failed:  # a FAIL followed, in its transaction, by the RETRY that sent the task back
        retried = set(TaskEvent.objects.using(using).filter(task_id__in={e.task_id for e in failed}, verb="retry")
                      .values_list("task_id", "version"))
    found = []
    for event in page:
        names = [n for n in events.history_events(event, (event.task_id, event.version + 1) in retried) if n in wanted]
        if names:
            found.append((event, names))
    if not found:
        return []
    tasks = Task.objects.using(using).in_bulk({event.task_id for event, _ in found})
    rows = []
    for event, names in found:
        task = tasks.get(event.task_id)
        if not matches(webhook.filter, task):
            continue
        for name in names:
            body = events.history_body(name, event, task)
            rows.append(_row(webhook, name, body, now))
    return rows


def _collect_problems(webhook: Webhook, found: list, now: datetime, done: Collected, using: str) -> None:
    current = {f"{p.code}:{p.task}": p for p in found}
    seen = set(webhook.problems_seen or [])
    new = [key for key in sorted(current) if key not in seen][:WEBHOOK_PROBLEMS_PER_PASS]
    if not new and seen <= set(current):
        return
    tasks = Task.objects.using(using).in_bulk({current[key].task for key in new})
    rows = []
    stamp = int(now.timestamp() * 1000)
    for key in new:
        problem = current[key]
        task = tasks.get(problem.task)
        if matches(webhook.filter, task):
            body = events.problem_body(events.CHECK_PROBLEM, f"{key}:{stamp}", problem, task, now)
            rows.append(_row(webhook, events.CHECK_PROBLEM, body, now))
    _commit(webhook, rows, done, using, problems_seen=sorted((seen & set(current)) | set(new)))


def _collect_budgets(webhook: Webhook, closed: list[Queue], now: datetime, done: Collected, using: str) -> None:
    """One delivery per closing of a queue's budget the webhook has not been given yet."""
    bodies = [events.budget_body(queue, now) for queue in closed if matches_queue(webhook.filter, queue.name)]
    have = set(WebhookDelivery.objects.using(using).filter(
        webhook_id=webhook.pk, event_id__in=[b["id"] for b in bodies]).values_list("event_id", flat=True))
    rows = [_row(webhook, events.BUDGET_EXHAUSTED, body, now) for body in bodies if body["id"] not in have]
    if rows:
        _commit(webhook, rows, done, using)


def _row(webhook: Webhook, name: str, body: dict, now: datetime) -> WebhookDelivery:
    return WebhookDelivery(webhook_id=webhook.pk, event_id=body["id"], event=name, body=body,
                           state=WebhookDelivery.PENDING, next_attempt_at=now, created_at=now)
