"""The board's filter answered by the server (GET /board/filter): over every task, not only the
cards a page has loaded, and the pages of a column the page fetches as the user scrolls. A
page holds each column's first page of cards and those it scrolled to (board.live.reads:
COLUMN_PAGE), so a filter counted in the browser would miss the rest: "0 of 2626" for a task
that was there further down.

An answer holds, for the text/owner/queue filter the board's boxes hold (the same matching as
the page's own: id or title contains the text, the holder's name contains the owner text, both
in any case; the queue exactly), or for a search line (`search`, board.engine.search: what the
text box holds when it has a qualifier such as tag:urgent):
  counts   per stage, how many tasks match (exact, one grouped query);
  ids      with a search line only: per unfinished stage, the ids of the matching tasks (the page
           holds their cards but cannot tell which match: a card has no payload);
  tasks    the first page of each column's matching cards, in the column's order (claim order for
           an unfinished column, most recent first for a finished one), CARDS_PER_PAGE per
           column (the socket's cards: no token, no bulky field; a COMPLETED one with who ran
           it and how long);
  more     per column, the cursor of its next page of matches, or null.
With `stage` (and `cursor`), a page of that column only: its next cards as the user scrolls,
filtered or not (no filter: every task of the column; the snapshot's `next_pages` cursors
resume here).

It reads and writes nothing else; who may ask is who may see the board (board.access.may_read).
"""
from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from board import access
from board.engine import errors, listing, timing
from board.engine.lifecycle import TERMINAL, Stage
from board.engine.selectors import deps_of
from board.live.frames import card_of_listed
from board.live.reads import CARD_COLUMNS, COLUMN_PAGE, column_order

CARDS_PER_PAGE = COLUMN_PAGE  # as many as a snapshot holds of each column
PARAMETERS = {"text", "owner", "queue", "search", "stage", "cursor"}
# A search line (board.engine.search) asks things a card cannot answer in the browser (a payload
# path, a tag, an error's text): the answer then also names the matching unfinished tasks, at
# most this many per column (the page holds them all; it shows those named).
MAX_MATCHING_IDS = 20_000


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _checked(get) -> tuple[listing.Filters, str | None, tuple | None]:
    """The filters, the one stage asked for (or None: all of them) and the cursor's key;
    InvalidRequest for anything else."""
    unknown = sorted(set(get) - PARAMETERS)
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(PARAMETERS))}")
    repeated = sorted(name for name, values in get.lists() if len(values) > 1)
    if repeated:
        raise errors.InvalidRequest(f"query parameter {repeated[0]!r} is given more than once")
    filters = listing.check_filters((), get.get("queue") or None, None, (get.get("text") or "").strip() or None,
                                    (get.get("owner") or "").strip() or None, search=get.get("search") or None)
    stage, cursor = get.get("stage") or None, get.get("cursor") or None
    if stage is not None and stage not in {s.value for s in Stage}:
        raise errors.InvalidRequest(f"stage is one of {', '.join(s.value for s in Stage)}")
    if cursor is not None and stage is None:
        raise errors.InvalidRequest("a cursor is given with the stage it pages through")
    return filters, stage, listing.cursor_after(cursor, column_order(stage)) if cursor else None


def _matching_ids(filters: listing.Filters, stage: str) -> list[str]:
    """The ids of `stage`'s tasks the filters match, in the column's order (at most MAX_MATCHING_IDS)."""
    rows = listing.task_list(stages=[stage], queue=filters.queue, text=filters.text, owner_part=filters.owner_part,
                             search=filters.search, order="claim", count=MAX_MATCHING_IDS, columns=("id",))
    return [task.pk for task in rows]


@staff_member_required
@require_GET
def board_filter(request):
    if not access.may_read(request.user):
        return _error(403, "forbidden", "this user may not read tasks (the board.view_task permission)")
    try:
        filters, only_stage, after = _checked(request.GET)
    except errors.InvalidRequest as exc:
        return _error(exc.http_status, exc.code, str(exc))
    stages = [only_stage] if only_stage else [stage.value for stage in Stage]
    answer: dict = {"tasks": [], "more": {}}
    if only_stage is None:
        answer["counts"] = listing.stage_counts(filters)
        if filters.search:
            answer["ids"] = {stage.value: _matching_ids(filters, stage.value) for stage in Stage if stage not in TERMINAL}
    for stage in stages:
        order = column_order(stage)
        rows = listing.task_list(stages=[stage], queue=filters.queue, text=filters.text, owner_part=filters.owner_part,
                                 search=filters.search, order=order, after=after, count=CARDS_PER_PAGE + 1,
                                 columns=CARD_COLUMNS)
        page = rows[:CARDS_PER_PAGE]
        deps = deps_of([task.pk for task in page])
        runs = timing.last_runs([task.pk for task in page]) if stage == Stage.COMPLETED else {}
        answer["tasks"] += [card_of_listed(task, deps[task.pk], runs.get(task.pk)) for task in page]
        answer["more"][stage] = listing.cursor_of(page[-1], order) if len(rows) > CARDS_PER_PAGE else None
    return JsonResponse(answer)
