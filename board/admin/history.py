"""A task's whole history on its admin page, a page at a time, with the heartbeats collapsed.

A long task renews thousands of times: the page used to show the last 200 rows, all renews, and
lose the create and the claims. Here the pages are made of the other moves (HISTORY_PAGE of them
a page, oldest first; the last page by default), and each lease's renews within a page are ONE
row, "renewed 8 times, 05:21:03–05:21:28", placed where its first renew fell: one grouped query
over the page's id range (served by the event_task_history index), never the renews themselves.
Times keep their seconds; a move's detail is shown as text (its reason, its error, its traceback
folded, the rest as indented JSON), not as escaped JSON. The live board groups renews the same
way (static/board/timeline.js)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Max, Min

from board.engine.lifecycle import Verb
from board.models import TaskEvent

HISTORY_PAGE = 100  # moves other than renews, a page


@dataclass
class Row:
    """One row of the history: a move (`event`), or a lease's renews (`renewals` > 0)."""

    at: datetime
    verb: str
    event: TaskEvent | None = None
    renewals: int = 0
    until: datetime | None = None
    fence: int | None = None
    actor: str = ""
    reason: str = ""
    error: str = ""
    traceback: str = ""
    rest: str = ""  # the rest of the detail, as indented JSON
    operator: bool = False
    sort_id: int = 0


OPERATOR_VERBS = {Verb.ADMIT, Verb.REQUEUE, Verb.CANCEL, Verb.FORCE_RELEASE, Verb.FORCE_PAUSE, Verb.EDIT}


def _row(event: TaskEvent) -> Row:
    detail = event.detail if isinstance(event.detail, dict) else ({} if event.detail is None else {"detail": event.detail})
    rest = {k: v for k, v in detail.items() if k not in ("reason", "error", "traceback")}
    return Row(
        at=event.at, verb=event.verb, event=event, fence=event.fence, actor=event.actor,
        reason=str(detail.get("reason") or ""), error=str(detail.get("error") or ""),
        traceback=str(detail.get("traceback") or ""),
        rest=json.dumps(rest, indent=2, ensure_ascii=False, sort_keys=True) if rest else "",
        operator=event.verb in OPERATOR_VERBS and event.actor != "system", sort_id=event.id,
    )


@dataclass
class HistoryPage:
    rows: list[Row]
    number: int  # 1 = the oldest moves
    pages: int
    moves: int  # moves other than renews, in all
    renewals: int  # renews on this page

    @property
    def page_numbers(self) -> list[int]:
        return list(range(1, self.pages + 1))


def history_page(task_id: str, number: int | None = None, *, using: str = "default") -> HistoryPage:
    """Page `number` (1-based; None or out of range: the last) of the task's history."""
    events = TaskEvent.objects.using(using).filter(task_id=task_id)
    moves = events.exclude(verb=Verb.RENEW)
    total = moves.count()
    pages = max(1, -(-total // HISTORY_PAGE))
    if number is None or not 1 <= number <= pages:
        number = pages
    page_events = list(moves.order_by("id")[(number - 1) * HISTORY_PAGE: number * HISTORY_PAGE])
    rows = [_row(e) for e in page_events]
    # The id range this page covers: from its first move (from the start on page 1) to the next
    # page's first move (to the end on the last page).
    renews = events.filter(verb=Verb.RENEW)
    if number > 1 and page_events:
        renews = renews.filter(id__gt=page_events[0].id)
    if number < pages and page_events:
        following = moves.filter(id__gt=page_events[-1].id).order_by("id").values_list("id", flat=True)[:1]
        if following:
            renews = renews.filter(id__lt=following[0])
    groups = (renews.values("fence").annotate(n=Count("id"), first=Min("at"), last=Max("at"), first_id=Min("id"),
                                              actor=Max("actor")).order_by())
    renewed = 0
    for g in groups:
        renewed += g["n"]
        rows.append(Row(at=g["first"], until=g["last"], verb=Verb.RENEW, renewals=g["n"], fence=g["fence"],
                        actor=g["actor"] or "", sort_id=g["first_id"]))
    rows.sort(key=lambda r: r.sort_id)
    return HistoryPage(rows=rows, number=number, pages=pages, moves=total, renewals=renewed)
