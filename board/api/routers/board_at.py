"""The board at any moment (issue 33, item 4): `GET /api/board?at=<ISO time>`, rebuilt from the
history by board.engine.moments (docs/board-at.md). Reads only; a key limited to some queues
sees only their tasks, counts and problems."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Optional

from ninja import Router

from board.api.auth import require_reader
from board.api.errors import ERRORS
from board.api.pagination import decode_cursor, encode_cursor, page_limit
from board.api.routers.tasks import _query
from board.api.schemas import BoardAtOut
from board.engine import clock, errors, moments
from board.engine.inputs import TASK_ID_PATTERN

router = Router()


def parse_moment(text: str | None) -> datetime:
    """An ISO 8601 time with its offset (or Z), not after the store's clock: else 422."""
    if not text:
        raise errors.InvalidRequest("at is required: an ISO 8601 time such as 2026-12-04T10:15:00Z")
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise errors.InvalidRequest(f"at must be an ISO 8601 time such as 2026-12-04T10:15:00Z, not {text[:40]!r}") from None
    if at.tzinfo is None:
        raise errors.InvalidRequest("at needs its offset from UTC (Z or +01:00): a time without one is ambiguous")
    at = at.astimezone(timezone.utc)
    now = clock.now()
    if at > now:
        raise errors.InvalidRequest(f"at is in the future (the board's clock says {now.isoformat()}); "
                                    "the board is known only up to now")
    return at


def stamp(moment: datetime | None) -> str | None:
    """A time as this endpoint gives it: ISO 8601 in UTC to the microsecond, with Z."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _cursor_part(at_text: str):
    return lambda part: isinstance(part, str) and part == at_text


@router.get("/board", response={200: BoardAtOut, **ERRORS},
            summary="The board as it was at a moment, rebuilt from the history, a page at a time")
def board_at(request, at: Optional[str] = None, cursor: Optional[str] = None, limit: int = 500):
    """Every task that existed at `at` with its stage, version and owner then (a page, in id
    order), the counts of every stage over the whole board, and (first page) the problems
    check() finds on the rebuilt board. `exact` is false for a moment before `exact_from`, the
    history's horizon after the prune deleted old finished tasks: such an answer may miss them.
    A cursor is good for the moment that gave it out only."""
    require_reader(request)
    _query(request, {"at", "cursor", "limit"})
    moment = parse_moment(at)
    limit = page_limit(limit)
    after = None
    if cursor:
        _, after = decode_cursor(cursor, _cursor_part(moment.isoformat()),
                                     lambda part: isinstance(part, str) and re.fullmatch(TASK_ID_PATTERN, part) is not None)
    scope = request.auth.scope
    found = moments.board_at(moment, scope=scope, after=after, limit=limit, with_problems=after is None)
    before, following = moments.events_around(moment, scope=scope)
    return {
        "at": stamp(found.at), "exact": found.exact, "exact_from": stamp(found.exact_from),
        "first_event_at": stamp(found.first_event_at), "previous_event_at": stamp(before),
        "next_event_at": stamp(following),
        "counts": found.counts,
        "tasks": [{"id": c.id, "stage": c.stage, "version": c.version, "owner": c.owner} for c in found.tasks],
        "problems": [{"task": p.task, "code": p.code, "text": p.text} for p in found.problems] if after is None else None,
        "next": encode_cursor(moment.isoformat(), found.last) if found.last is not None else None,
    }
