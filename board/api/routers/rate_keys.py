"""Rate keys as a resource (issue 29, item 2): a rate shared by the tasks of many queues naming one
key (a provider's requests per minute), set by the operators who may change queues
(board.engine.flow.change_rate_key), each change kept in the key's history."""
from __future__ import annotations

from ninja import Router

from board.api.auth import require_queue_changer, require_reader
from board.api.errors import ERRORS
from board.api.schemas import RateKeyIn, RateKeyList, RateKeyOut
from board.engine import errors, flow, selectors
from board.models import RateKey, Task

router = Router()


@router.get("/rate-keys", response={200: RateKeyList, **ERRORS},
            summary="Every rate key: its rate and when it lets the next claim start")
def list_rate_keys(request):
    """The rate keys tasks have named or operators have set, by name. A key limited to some
    queues sees the rate keys the tasks of those queues name."""
    require_reader(request)
    keys = RateKey.objects.all()
    if request.auth.scope is not None:
        named = (Task.objects.filter(selectors.in_scope(request.auth.scope), rate_key__isnull=False)
                 .order_by().values_list("rate_key", flat=True).distinct())
        keys = keys.filter(name__in=list(named))
    return {"items": [flow.describe_rate_key(key) for key in keys.order_by("name")]}


@router.put("/rate-keys/{path:name}", response={200: RateKeyOut, **ERRORS},
            summary="Operator: set a rate key's rate")
def change_rate_key(request, name: str, body: RateKeyIn):
    """`{"rate": {"count": C, "per_seconds": S}}`: at most C claims of the tasks naming the key
    start in any S seconds, spaced evenly, whatever their queues; `"rate": null` removes it. The
    change, with its actor and `reason`, goes to the key's history. Operators who may change
    queues may change rate keys; a key limited to some queues may not (a rate key spans them)."""
    actor = require_queue_changer(request).name
    if request.auth.scope is not None:
        raise errors.Forbidden("a key limited to some queues cannot change a rate key: tasks of any queue may name it")
    key = flow.change_rate_key(name, actor=actor, reason=body.reason,
                               rate=body.rate.model_dump() if body.rate is not None else None)
    return flow.describe_rate_key(key)
