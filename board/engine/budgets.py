"""Budgets (issue 32, item 5, its second half): a queue, and a fairness key, may have a budget of
tokens and/or cost per window (a UTC day, a UTC month, or in total), kept on its row (Budgeted). The usage its tasks' attempts report
(board.engine.usage) is added to the queue's `spent_*` in the report's own transaction; the
report that reaches a budget closes the queue to claims (`budget_closed_until`: the window's end)
in that same transaction; a task's fairness key likewise, after its queue. A claim of the
queue's (or the key's) tasks starts only while it is open, checked in the claim's own statement
or transaction as a pause is (board.engine.flow.take_slot; the SQL stores' statements:
open_for_claims, and PostgreSQL's queue_budget and fairness_slot, which lock the row of a queue or
key with a budget so that a claim and the closing report are serialised). Locks are taken queue
then fairness key, by the claim and by the report alike.

The bound (docs/api.md, Budgets): no claim starts after the report that reached the budget, so
the usage spent past it is at most what the attempts already RUNNING when it was reached report
afterwards. Reports carry what was used since the lease's previous one; a report without a cost
counts toward a token budget only (a cost budget sees the reports that give a cost).
"""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import F, Q

from board.engine import clock, errors
from board.models import Budgeted, FairnessKey, Queue

PERIODS = ("day", "month", "total")
FOREVER = 32503680000.0  # 3000-01-01 in Unix seconds: a total budget's window never ends
MAX_BUDGET_TOKENS = 10**15
MAX_BUDGET_COST_USD = 10**9


def setting(value: Any) -> dict | None:
    """A budget as the API takes it, `{"tokens"?, "cost_usd"?, "per"}` with at least one of the
    two amounts; None: no budget. InvalidRequest (field "budget") for anything else."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"tokens", "cost_usd", "per"} or "per" not in value:
        raise _bad('budget must be {"tokens"?: N, "cost_usd"?: X, "per": "day"|"month"|"total"}, or null for none')
    if value["per"] not in PERIODS:
        raise _bad(f"budget.per must be one of {', '.join(PERIODS)}")
    tokens, cost = value.get("tokens"), value.get("cost_usd")
    if tokens is None and cost is None:
        raise _bad("a budget needs tokens, cost_usd or both")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not 1 <= tokens <= MAX_BUDGET_TOKENS):
        raise _bad(f"budget.tokens must be a whole number from 1 to {MAX_BUDGET_TOKENS}")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float))
                             or not 0 < cost <= MAX_BUDGET_COST_USD):
        raise _bad(f"budget.cost_usd must be a number above 0 and at most {MAX_BUDGET_COST_USD}")
    return {"tokens": tokens, "cost_usd": None if cost is None else float(cost), "per": value["per"]}


def _bad(message: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(message, field="budget")


def window(per: str, now: datetime) -> tuple[float, float]:
    """The window `now` falls in: (start, end) in Unix seconds, UTC days and months."""
    if per == "total":
        return 0.0, FOREVER
    now = now.astimezone(UTC)
    if per == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        end = datetime.fromtimestamp(start.timestamp() + 86400, UTC)
    else:
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start.timestamp(), end.timestamp()


def of(row: Budgeted) -> dict | None:
    if row.budget_per is None:
        return None
    return {"tokens": row.budget_tokens, "cost_usd": row.budget_cost_usd, "per": row.budget_per}


def describe(row: Budgeted, now: datetime) -> dict[str, Any]:
    """A queue's or a fairness key's budget as the API and the board show it."""
    budget = of(row)
    current = budget is not None and row.budget_window == window(row.budget_per, now)[0]
    closed = row.budget_closed_until is not None and row.budget_closed_until > now.timestamp()
    return {
        "budget": budget,
        "spent": None if budget is None else {"tokens": row.spent_tokens if current else 0,
                                              "cost_usd": round(row.spent_cost_usd, 6) if current else 0.0},
        "budget_exhausted_until": (None if not closed else None if row.budget_closed_until >= FOREVER
                                   else datetime.fromtimestamp(row.budget_closed_until, UTC)),
        "budget_exhausted": closed,
    }


def exhausted(row: Budgeted | None, now: datetime) -> bool:
    return row is not None and row.budget_closed_until is not None and row.budget_closed_until > now.timestamp()


def refusal(row: Budgeted, now: datetime) -> str:
    budget = of(row) or {}
    amounts = " and ".join(part for part in (
        f"{budget['tokens']:,} tokens" if budget.get("tokens") is not None else "",
        f"${budget['cost_usd']:,}" if budget.get("cost_usd") is not None else "") if part)
    per = "in total" if budget.get("per") == "total" else f"a {budget.get('per')}"
    until = ("" if row.budget_closed_until is None or row.budget_closed_until >= FOREVER
             else f"; claims start again at {datetime.fromtimestamp(row.budget_closed_until, UTC).isoformat()}")
    what = "queue" if isinstance(row, Queue) else "fairness key"
    return f"{what} {row.name} has spent its budget ({amounts} {per}){until}"


def hold_open(rows, now: datetime) -> bool:
    """Inside a claim's transaction: whether the budget of the queue or key `rows` selects is
    open, checked by a write on its row (nothing changes), so that the claim and a usage report
    closing it conflict (MongoDB) or queue on the row (PostgreSQL) instead of passing each other."""
    at = now.timestamp()
    return bool(rows.filter(Q(budget_closed_until__isnull=True) | Q(budget_closed_until__lte=at)).update(
        budget_window=F("budget_window")))


def spend(using: str, queue: str, fairness_key: str | None, tokens: int, cost: float | None, now: datetime) -> None:
    """Inside a usage report's transaction: add it to the window of its task's queue, then of its
    fairness key (the order a claim locks them in), each closed to claims when it reaches its
    budget. A row without a budget is not written."""
    _spend(Queue.objects.using(using).filter(name=queue, budget_per__isnull=False), using, tokens, cost, now)
    if fairness_key is not None:
        _spend(FairnessKey.objects.using(using).filter(name=fairness_key, budget_per__isnull=False),
               using, tokens, cost, now)


def _spend(rows, using: str, tokens: int, cost: float | None, now: datetime) -> None:
    per = rows.values_list("budget_per", flat=True).first()
    if per is None:
        return
    start, end = window(per, now)
    # A window that has ended: start the new one from zero, open (a compare-and-swap on the
    # window: two reports starting it both run this, one matches).
    rows.exclude(budget_window=start).update(budget_window=start, spent_tokens=0, spent_cost_usd=0.0,
                                             budget_closed_until=None, budget_closed_at=None)
    rows.update(spent_tokens=F("spent_tokens") + tokens, spent_cost_usd=F("spent_cost_usd") + (cost or 0.0))
    over = rows.filter(Q(budget_tokens__isnull=False, spent_tokens__gte=F("budget_tokens"))
                       | Q(budget_cost_usd__isnull=False, spent_cost_usd__gte=F("budget_cost_usd")),
                       budget_closed_until__isnull=True)
    if over.exists():
        # When it closed: read now that this transaction holds the row (PostgreSQL: a claim that
        # committed before it began under an earlier time), as check()'s claimed_over_budget
        # compares the claims' times with it.
        over.update(budget_closed_until=end, budget_closed_at=clock.now(using).timestamp())


def changed_values(row: Budgeted, budget: dict | None, now: datetime) -> dict[str, Any]:
    """The columns a change of a queue's or a key's budget writes: the setting, and whether it
    is spent now (a raised budget opens it at once; a new period starts from zero)."""
    if budget is None:
        return dict(budget_tokens=None, budget_cost_usd=None, budget_per=None, budget_window=None,
                    spent_tokens=0, spent_cost_usd=0.0, budget_closed_until=None, budget_closed_at=None)
    start, end = window(budget["per"], now)
    keep = row.budget_per == budget["per"] and row.budget_window == start
    spent_tokens, spent_cost = (row.spent_tokens, row.spent_cost_usd) if keep else (0, 0.0)
    over = ((budget["tokens"] is not None and spent_tokens >= budget["tokens"])
            or (budget["cost_usd"] is not None and spent_cost >= budget["cost_usd"]))
    return dict(budget_tokens=budget["tokens"], budget_cost_usd=budget["cost_usd"], budget_per=budget["per"],
                budget_window=start, spent_tokens=spent_tokens, spent_cost_usd=spent_cost,
                budget_closed_until=end if over else None,
                budget_closed_at=(row.budget_closed_at or now.timestamp()) if over else None)
