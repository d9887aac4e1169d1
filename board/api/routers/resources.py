"""Resource leases (issue 32, item 1; board.engine.resources): who holds what until when, a
resource's capacity, and whether a lease still holds a resource (what a downstream system such
as examples/git-hooks/pre-push asks before it accepts a write)."""
from __future__ import annotations

from ninja import Router

from board.api.auth import require_queue_changer, require_reader
from board.api.errors import ERRORS
from board.api.pagination import page_limit
from board.api.schemas import ResourceCheckOut, ResourceIn, ResourceList, ResourceOut
from board.engine import errors, resources

router = Router()


@router.get("/resources", response={200: ResourceList, **ERRORS},
            summary="Every resource tasks have named: its capacity and who holds it until when")
def list_resources(request, after: str | None = None, limit: int = 100):
    """Each resource (and each directory a pattern holds, e.g. `file:src/app/`) by name, with
    its holders: the RUNNING tasks whose claims took it, their agents, fences and lease expiries
    (a hold ends with its lease). A page at a time (`limit`, at most 500): `next_after` is the
    `after` of the next page. A key limited to some queues sees none: a resource spans them."""
    require_reader(request)
    limit = page_limit(limit)
    if request.auth.scope is not None:
        return {"items": [], "next_after": None}
    page = resources.holders(after=after, limit=limit + 1)
    more = len(page) > limit
    return {"items": page[:limit], "next_after": page[limit - 1]["name"] if more else None}


@router.put("/resources/{path:name}", response={200: ResourceOut, **ERRORS},
            summary="Operator: set a resource's capacity")
def change_resource(request, name: str, body: ResourceIn):
    """`{"capacity": N}`: shared holders (`{"name", "units"}`) may hold N units together; an
    exclusive hold takes the resource whole. A lowered capacity applies to the next claims.
    Operators who may change queues may change resources; a key limited to some queues may not."""
    actor = require_queue_changer(request).name
    if request.auth.scope is not None:
        raise errors.Forbidden("a key limited to some queues cannot change a resource: tasks of any queue may name it")
    row = resources.change_capacity(name, body.capacity, actor=actor, reason=body.reason)
    return resources.holders(names=[row.name])[0]


@router.get("/resource-holder", response={200: ResourceCheckOut, **ERRORS},
            summary="Whether a lease (task and fence) holds a resource now")
def resource_holder(request, name: str, task: str, fence: int):
    """`?name=branch:main&task=ID&fence=N`: `holds` is true when that task is RUNNING under fence N with a live
    lease and declared a resource the name is (or whose pattern holds it). A holder whose lease
    was taken over (a higher fence now) or ended is told false: refuse its write."""
    require_reader(request)
    if request.auth.scope is not None:
        raise errors.Forbidden("a key limited to some queues cannot read resources: they span queues")
    return resources.holder_of("default", resources.resource_name(name), task, fence)
