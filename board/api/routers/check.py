"""The board's health: the invariant problems check() finds, as far as the caller may see them."""
from __future__ import annotations

from ninja import Router

from board.api.auth import require_reader
from board.api.errors import ERRORS
from board.api.schemas import ProblemsOut
from board.engine import scopes, selectors

router = Router()


@router.get("/check", response={200: ProblemsOut, **ERRORS}, summary="Invariant problems found by check()")
def check(request):
    require_reader(request)
    found = selectors.problems()
    scope = request.auth.scope
    if scope is not None:  # a scoped key hears only of its queues' tasks
        queues = selectors.queues_of(sorted({p.task for p in found}))
        found = [p for p in found if p.task in queues and scopes.allows(scope, queues[p.task])]
    return {"problems": [{"task": p.task, "code": p.code, "text": p.text} for p in found]}
