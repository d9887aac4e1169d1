"""The API's reads shaped for its pages: the task list (board.engine.listing), and what a repeated create is compared with. Single queries, no
transaction: a page is as the store is when each query runs."""
from __future__ import annotations

from board.engine import listing
from board.engine.lifecycle import Verb
from board.models import TaskEvent


# The task list (its orders, filters and keyset) is the engine's, shared with the board's all-tasks
# table: board.engine.listing.
LIST_ORDERS = listing.LIST_ORDERS
task_list = listing.task_list
list_key = listing.list_key


def created_on_hold(task_ids: list[str], *, using: str = "default") -> set[str]:
    """Those of `task_ids` that were created on hold. Their create event records it: the task's
    own `on_hold` is cleared by an admit. (Events written before the rename say "hold".)"""
    return {
        task_id for task_id, detail in TaskEvent.objects.using(using)
        .filter(task_id__in=task_ids, verb=Verb.CREATE).values_list("task_id", "detail")
        if detail and (detail.get("on_hold") or detail.get("hold"))
    }
