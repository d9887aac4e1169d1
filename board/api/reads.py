"""The API's reads shaped for its pages: the task list in the orders it offers and the key a
page's cursor resumes after, and what a repeated create is compared with. Single queries, no
transaction: a page is as the store is when each query runs."""
from __future__ import annotations

from django.db.models import Q

from board.engine import scopes
from board.engine.lifecycle import Verb
from board.engine.selectors import CLAIM_ORDER, in_scope
from board.models import Task, TaskEvent


# The orders the API's task list offers: oldest first (its default), and the claim order.
LIST_ORDERS = {"created": ("created_at", "pk"), "claim": CLAIM_ORDER}


def task_list(*, stages: list[str] | None = None, queue: str | None = None, owner: str | None = None,
              text: str | None = None, order: str = "created", after: tuple | None = None, count: int,
              scope: scopes.Scope = None, using: str = "default") -> list[Task]:
    """Up to `count` tasks in `order` (LIST_ORDERS: "created", oldest first; "claim", the order
    claim_next takes them in), after the task whose `list_key` is `after` when given, among
    those in `stages`, in `queue`, held by `owner`, whose id or title contains `text`
    (case-insensitive), for each filter given. The caller has checked them. `scope`: a key's
    queue patterns; the others' tasks are not listed."""
    rows = Task.objects.using(using).filter(in_scope(scope))
    if stages:
        rows = rows.filter(stage__in=stages)
    if queue:
        rows = rows.filter(queue=queue)
    if owner:
        rows = rows.filter(owner=owner)
    if text:
        rows = rows.filter(Q(id__icontains=text) | Q(title__icontains=text))
    fields = LIST_ORDERS[order]
    if after is not None:
        rows = rows.filter(_after(fields, after))
    return list(rows.order_by(*fields)[:count])


def list_key(task: Task, order: str) -> tuple:
    """The values of `task` that task_list's `order` sorts by: a page's cursor."""
    return tuple(getattr(task, field.lstrip("-")) for field in LIST_ORDERS[order])


def _after(fields: tuple[str, ...], key: tuple) -> Q:
    """The rows after `key` in the order `fields` ("-name": descending): after on the first
    field, or equal on it and after on the rest."""
    after = Q()
    for position in reversed(range(len(fields))):
        name = fields[position].lstrip("-")
        beyond = Q(**{f"{name}__{'lt' if fields[position].startswith('-') else 'gt'}": key[position]})
        after = beyond if position == len(fields) - 1 else beyond | Q(**{name: key[position]}) & after
    return after


def created_on_hold(task_ids: list[str], *, using: str = "default") -> set[str]:
    """Those of `task_ids` that were created on hold. Their create event records it: the task's
    own `on_hold` is cleared by an admit. (Events written before the rename say "hold".)"""
    return {
        task_id for task_id, detail in TaskEvent.objects.using(using)
        .filter(task_id__in=task_ids, verb=Verb.CREATE).values_list("task_id", "detail")
        if detail and (detail.get("on_hold") or detail.get("hold"))
    }
