"""Queues as a resource (issue 29): each queue's limit, pause and running count beside what waits
in it, and operators' changes to them (board.engine.flow), each kept in the queue's history."""
from __future__ import annotations

from ninja import Router

from board.api.auth import require_queue_changer, require_reader
from board.api.errors import ERRORS
from board.api.schemas import QueueHistory, QueueIn, QueueList, QueueOut
from board.engine import errors, flow, scopes, selectors
from board.engine.inputs import is_valid_task_id
from board.models import QueueChange

router = Router()


def _named(request, name: str) -> str:
    """`name`, when it is a queue name the caller's scope covers; else 404 (a scoped key sees only
    its queues, as it sees only their tasks)."""
    if not is_valid_task_id(name) or not scopes.allows(request.auth.scope, name):
        raise errors.NotFound(f"no queue named {name!r}")
    return name


@router.get("/queues", response={200: QueueList, **ERRORS},
            summary="Every queue: its limit, pause and running count, and its tasks per stage")
def list_queues(request):
    """The queues that have settings or tasks, by name. A key limited to some queues sees those."""
    require_reader(request)
    items = selectors.queue_overview()
    return {"items": [item for item in items if scopes.allows(request.auth.scope, item["name"])]}


@router.get("/queues/{name}", response={200: QueueOut, **ERRORS}, summary="One queue")
def get_queue(request, name: str):
    """A queue nobody has set and no task names has no limit and is not paused: it is answered
    as such, with no tasks."""
    require_reader(request)
    return selectors.queue_overview([_named(request, name)])[0]


@router.put("/queues/{name}", response={200: QueueOut, **ERRORS},
            summary="Operator: set a queue's concurrency limit or rate, pause or resume it")
def change_queue(request, name: str, body: QueueIn):
    """Only the fields sent change (`"concurrency": null` removes the limit, `"rate": null` the
    rate: `{"count": C, "per_seconds": S}`, at most C claims start in any S seconds). Lowering the limit
    below the running count stops new claims until there is room; running tasks go on. Pausing
    stops new claims at once; leases already held renew and complete as usual. The change, with
    its actor and `reason`, goes to the queue's history (`GET /api/queues/{name}/history`)."""
    actor = require_queue_changer(request).name
    _named(request, name)
    sent = body.model_fields_set
    if "paused" in sent and body.paused is None:
        raise errors.InvalidRequest("paused must be true or false", field="paused")
    flow.change_queue(name, actor=actor, reason=body.reason,
                      concurrency=body.concurrency if "concurrency" in sent else flow.UNSET,
                      paused=body.paused if "paused" in sent else flow.UNSET,
                      rate=(body.rate.model_dump() if body.rate is not None else None) if "rate" in sent else flow.UNSET,
                      budget=(body.budget.model_dump() if body.budget is not None else None)
                      if "budget" in sent else flow.UNSET)
    return selectors.queue_overview([name])[0]


@router.get("/queues/{name}/history", response={200: QueueHistory, **ERRORS},
            summary="Who changed a queue's settings, when and why (newest first, the last 200)")
def queue_history(request, name: str):
    require_reader(request)
    rows = QueueChange.objects.filter(queue=_named(request, name)).order_by("-at", "-pk")[:200]
    return {"items": [{"actor": r.actor, "reason": r.reason, "changes": r.changes, "at": r.at} for r in rows]}
