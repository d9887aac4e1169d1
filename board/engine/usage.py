"""Usage (issue 32, item 5, its first half): what an attempt reports it used, tokens and cost,
sent with a renew, complete or fail (`usage: {model, input_tokens, output_tokens, cost_usd?,
source}`). The budgets of a queue and of a fairness key count them (board.engine.budgets).

A report is what was used since the lease's previous report (each one is added, never a running
total). It is written after the holder's move was accepted, in a transaction of its own, with
the fence of the lease it came with: a stale holder's move is refused, so its report is never
written. A move that succeeded whose report's write then failed leaves that report missing.
Cost is summed only when every report gave one: a total is never made of some reports' costs
and others' silence (`cost_usd` None, `cost_missing` says how many reports lacked it).
"""
from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.db.models import Count, Sum

from board.engine import clock, errors
from board.engine.inputs import unstorable_text
from board.engine.stores import retry_conflicts, store
from board.models import Task, TaskUsage

SOURCES = ("reported", "estimated")
MAX_MODEL_CHARS = 100
MAX_TOKENS = 10**12  # one report's tokens of each kind
MAX_COST_USD = 10**6  # one report's cost
FIELDS = ("model", "input_tokens", "output_tokens", "cost_usd", "source")


def checked(usage: Any) -> dict[str, Any]:
    """A usage report as the engine takes it: {model, input_tokens, output_tokens, cost_usd,
    source}; InvalidRequest (field "usage") for anything else."""
    def bad(message: str):
        raise errors.InvalidRequest(f"usage: {message}", field="usage")

    if not isinstance(usage, dict):
        bad("must be an object")
    unknown = sorted(set(usage) - set(FIELDS))
    if unknown:
        bad(f"unknown field {unknown[0]!r}; known: {', '.join(FIELDS)}")
    model = usage.get("model", "")
    if not isinstance(model, str) or len(model) > MAX_MODEL_CHARS or unstorable_text(model):
        bad(f"model is a name of at most {MAX_MODEL_CHARS} characters")
    out: dict[str, Any] = {"model": model}
    for name in ("input_tokens", "output_tokens"):
        value = usage.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS:
            bad(f"{name} is a whole number from 0 to {MAX_TOKENS}")
        out[name] = value
    cost = usage.get("cost_usd")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float))
                             or not math.isfinite(cost) or not 0 <= cost <= MAX_COST_USD):
        bad(f"cost_usd is a number from 0 to {MAX_COST_USD}, or absent")
    out["cost_usd"] = None if cost is None else float(cost)
    source = usage.get("source", "reported")
    if source not in SOURCES:
        bad(f"source is one of {', '.join(SOURCES)}")
    out["source"] = source
    if not out["input_tokens"] and not out["output_tokens"] and out["cost_usd"] is None:
        bad("reports nothing: give input_tokens, output_tokens or cost_usd")
    return out


@retry_conflicts
def record(task: Task, fence: int, agent: str, usage: dict[str, Any], *, using: str = "default") -> TaskUsage:
    """Write a report (already `checked`) for `task`'s lease of `fence`, after its move."""
    from board.engine import budgets

    with store(using).write_transaction():
        now = clock.now(using)
        row = TaskUsage(task_id=task.pk, fence=fence, agent=agent, queue=task.queue, at=now, **usage)
        TaskUsage.objects.using(using).bulk_create([row])
        # The task's row before the queue's, as a claim locks them (its pick, then its queue):
        # the report's reference to the task is checked now, not at COMMIT after the queue's row
        # is held (a claim holding the task's row and waiting for the queue's deadlocked with it:
        # tests/test_usage_locks.py).
        store(using).check_references_now()
        # The budgets of its queue and its fairness key (board.engine.budgets) count it in the
        # same transaction.
        budgets.spend(using, task.queue, task.fairness_key, usage["input_tokens"] + usage["output_tokens"],
                      usage["cost_usd"], now)
    return row


def _totals(rows) -> dict[str, Any]:
    """Sums of a queryset of reports: tokens, cost (None unless every report gave one), counts."""
    sums = rows.aggregate(input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
                          cost_usd=Sum("cost_usd"), reports=Count("pk"))
    missing = rows.filter(cost_usd__isnull=True).count() if sums["reports"] else 0
    return {"input_tokens": sums["input_tokens"] or 0, "output_tokens": sums["output_tokens"] or 0,
            "cost_usd": None if missing or not sums["reports"] else round(sums["cost_usd"], 6),
            "cost_missing": missing, "reports": sums["reports"]}


def of_task(task_id: str, *, using: str = "default") -> dict[str, Any]:
    """A task's usage: its total and each attempt's (by fence, in order); NotFound for no task."""
    if not Task.objects.using(using).filter(pk=task_id).exists():
        raise errors.NotFound(f"no task with id {task_id!r}")
    with store(using).read_transaction():
        rows = TaskUsage.objects.using(using).filter(task_id=task_id)
        fences = sorted(set(rows.values_list("fence", flat=True)))
        attempts = []
        for fence in fences:
            mine = rows.filter(fence=fence)
            agent = mine.order_by("pk").values_list("agent", flat=True).first()
            models = sorted(set(mine.exclude(model="").values_list("model", flat=True)))
            attempts.append({"fence": fence, "agent": agent, "models": models, **_totals(mine)})
        return {"task": task_id, "total": _totals(rows), "attempts": attempts}


def by_agent_and_queue(since: datetime, *, using: str = "default") -> dict[str, list[dict[str, Any]]]:
    """Usage reported since `since`, by agent and by queue (most tokens first): two grouped
    queries per grouping, however many agents or queues."""
    with store(using).read_transaction():
        rows = TaskUsage.objects.using(using).filter(at__gte=since)
        out = {}
        for key in ("agent", "queue"):
            sums = rows.values(key).annotate(input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
                                             cost_usd=Sum("cost_usd"), reports=Count("pk")).order_by()
            missing = dict(rows.filter(cost_usd__isnull=True).values(key).annotate(n=Count("pk")).order_by()
                           .values_list(key, "n"))
            groups = [{key: g[key], "input_tokens": g["input_tokens"] or 0, "output_tokens": g["output_tokens"] or 0,
                       "cost_usd": None if missing.get(g[key]) else round(g["cost_usd"] or 0.0, 6),
                       "cost_missing": missing.get(g[key], 0), "reports": g["reports"]} for g in sums]
            out[key] = sorted(groups, key=lambda g: (-(g["input_tokens"] + g["output_tokens"]), g[key]))
        return out
