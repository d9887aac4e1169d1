"""Fairness keys as a resource (issue 32, item 5): a key's weight in the claim order and its
budget, shared by the tasks of every queue naming the key (a plan's, a customer's spend), set by
the operators who may change queues (board.engine.flow.change_fairness_key), each change kept in
the key's history (FairnessKeyChange)."""
from __future__ import annotations

from ninja import Router

from board.api.auth import require_queue_changer, require_reader
from board.api.errors import ERRORS
from board.api.schemas import FairnessKeyIn, FairnessKeyList, FairnessKeyOut
from board.engine import errors, flow, selectors
from board.models import FairnessKey, Task

router = Router()


def _visible(request):
    """The fairness keys the caller may see: every one, or for a key limited to some queues those
    the tasks of its queues name."""
    keys = FairnessKey.objects.all()
    if request.auth.scope is not None:
        named = (Task.objects.filter(selectors.in_scope(request.auth.scope), fairness_key__isnull=False)
                 .order_by().values_list("fairness_key", flat=True).distinct())
        keys = keys.filter(name__in=list(named))
    return keys


@router.get("/fairness-keys", response={200: FairnessKeyList, **ERRORS},
            summary="Every fairness key: its weight, its budget and what the window spent")
def list_fairness_keys(request):
    """The fairness keys that have a row (a create gave one a weight, or an operator set its
    budget), by name. A key limited to some queues sees those the tasks of its queues name."""
    require_reader(request)
    return {"items": [flow.describe_fairness_key(key) for key in _visible(request).order_by("name")]}


@router.get("/fairness-keys/{path:name}", response={200: FairnessKeyOut, **ERRORS}, summary="One fairness key")
def get_fairness_key(request, name: str):
    """404 for a key without a row (no create gave it a weight and no budget was set: weight 1,
    no budget), or one the tasks of a scoped key's queues do not name."""
    require_reader(request)
    key = _visible(request).filter(name=name).first()
    if key is None:
        raise errors.NotFound(f"no fairness key named {name!r}")
    return flow.describe_fairness_key(key)


@router.put("/fairness-keys/{path:name}", response={200: FairnessKeyOut, **ERRORS},
            summary="Operator: set, raise or remove a fairness key's budget")
def change_fairness_key(request, name: str, body: FairnessKeyIn):
    """`{"budget": {"tokens"?: N, "cost_usd"?: X, "per": "day"|"month"|"total"}}`: the usage the
    tasks naming the key may report per window, whatever their queues; at it no claim of them
    starts (claim-next passes them by, a claim by id is 409 `budget_exhausted`) until the window
    ends or the budget is raised; `"budget": null` removes it. The change, with its actor and
    `reason`, goes to the key's history. Operators who may change queues may change fairness
    keys; a key limited to some queues may not (a fairness key spans them)."""
    actor = require_queue_changer(request).name
    if request.auth.scope is not None:
        raise errors.Forbidden("a key limited to some queues cannot change a fairness key: tasks of any queue may "
                               "name it")
    key = flow.change_fairness_key(name, actor=actor, reason=body.reason,
                                   budget=body.budget.model_dump() if body.budget is not None else None)
    return flow.describe_fairness_key(key)
