"""The board's count per column for a snapshot, followed from the history rather than counted.

Every snapshot carries each column's count (board.live.reads.board_parts). Counted, that is a
scan of the task table: 120-180 ms at 1,000,000 tasks (bench/big_board.py), for every socket
that connects. A process that has counted once moves its counts by what happened since, as the
page itself does (static/board/socket.js applyMove): each later event's from_stage -> to_stage
and each prune record's stage (RemovedTask). That is a read of the few events since the last
snapshot, in the snapshot's own read, so the counts are those of the tasks it reads.

It counts afresh:
- on a board under FOLLOW_FROM tasks, where counting costs a few milliseconds (one path to trust
  on every ordinary board);
- when its count is older than RECOUNT_AFTER, so that a change that wrote no event (none should:
  check() and the page's counts would drift too) is not carried for long;
- when the history it followed is not there any more (a flushed database: the last event it
  followed is gone or another), or is too long to follow (FOLLOW_MAX), or there is none (a
  board filled without events: nothing would tell it from another).

On PostgreSQL a transaction may take an event id below the newest visible one and commit after
the read (board.live.outbox.unseen_below): those ids are kept as `unseen` and their events are
applied by the read that first sees them, exactly once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from board.engine import listing
from board.live import outbox
from board.models import RemovedTask, TaskEvent

FOLLOW_FROM = 50_000  # tasks: below this many, a count is cheaper than anything to trust
RECOUNT_AFTER = 60.0  # seconds (monotonic): well under the prune's shortest window (1 h), so no
# event followed here can have been deleted by the prune before it was read
FOLLOW_MAX = 20_000  # events or records since the last count: more, and counting is cheaper


@dataclass(frozen=True)
class BoardMark:
    """Where one read of the board stands in the history, and its count per column."""

    counts: dict[str, int]
    last_event_id: int  # the newest event the read sees
    unseen: frozenset[int]  # ids at or below it the read does not see (PostgreSQL: may yet commit)
    last_removal_id: int  # the newest prune record the read sees
    # Kept by the follower only: the last event's (task id, time), to tell the same history from a
    # new one that reused its ids, and when the counts were last counted (time.monotonic()).
    last_event: tuple | None = None
    counted_at: float = 0.0


_followed: dict[str, BoardMark] = {}  # per database alias: the last mark read
_lock = threading.Lock()


def read_mark(using: str = "default") -> BoardMark:
    """The counts per column (every stage, 0 where none) of the board as the current read sees
    it, with where that read stands in the history. Call it inside a read transaction
    (store.read_transaction) whose other queries the counts must agree with."""
    last_event = (TaskEvent.objects.using(using).order_by("-id").values_list("id", "task_id", "at").first())
    last_event_id = last_event[0] if last_event else 0
    unseen = frozenset(outbox.unseen_below(last_event_id, using))
    last_removal_id = outbox.latest_removal_id(using)
    with _lock:
        before = _followed.get(using)
    mark = None
    if before is not None:
        mark = _follow(before, last_event, unseen, last_removal_id, using)
    if mark is None:
        mark = BoardMark(counted(using), last_event_id, unseen, last_removal_id,
                         last_event=_identity(last_event), counted_at=time.monotonic())
    with _lock:
        current = _followed.get(using)
        # Two snapshots at once: keep the one further on (the other's reads were older).
        if current is None or current is before or mark.last_event_id >= current.last_event_id:
            _followed[using] = mark
    return mark


def counted(using: str = "default") -> dict[str, int]:
    """The count per column, counted (one grouped scan of the task table)."""
    return listing.stage_counts(listing.Filters(), using=using)


def forget(using: str | None = None) -> None:
    """Count afresh next time (every alias when None): what the tests call after writing
    stages without events."""
    with _lock:
        if using is None:
            _followed.clear()
        else:
            _followed.pop(using, None)


def _identity(last_event: tuple | None) -> tuple | None:
    return None if last_event is None else (last_event[1], last_event[2])


def _follow(before: BoardMark, last_event: tuple | None, unseen: frozenset[int], last_removal_id: int,
            using: str) -> BoardMark | None:
    """`before`'s counts moved by the history since it, or None where they must be counted."""
    last_event_id = last_event[0] if last_event else 0
    # No history to tell whether it is the same board (one filled without events, say): counted.
    if (not before.last_event_id or sum(before.counts.values()) < FOLLOW_FROM
            or time.monotonic() - before.counted_at > RECOUNT_AFTER
            or last_event_id < before.last_event_id or last_removal_id < before.last_removal_id):
        return None
    # The same history: its last event is still there, and the same one.
    then = TaskEvent.objects.using(using).filter(id=before.last_event_id).values_list("task_id", "at").first()
    if then != before.last_event:
        return None
    history = TaskEvent.objects.using(using).values_list("id", "from_stage", "to_stage")
    events = list(history.filter(id__gt=before.last_event_id, id__lte=last_event_id)[:FOLLOW_MAX + 1])
    # Ids unseen then and not now: committed since (the new read's unseen list holds every id
    # still missing in its window), or below that window, where they are given up as the
    # tailer gives them up (board.live.outbox.unseen_below) unless they are there now.
    late = before.unseen - unseen
    if late:
        events += history.filter(id__in=sorted(late))
    removed = list(RemovedTask.objects.using(using)
                   .filter(id__gt=before.last_removal_id, id__lte=last_removal_id)
                   .values_list("stage", flat=True)[:FOLLOW_MAX + 1])
    if len(events) > FOLLOW_MAX or len(removed) > FOLLOW_MAX:
        return None
    counts = dict(before.counts)
    for _, from_stage, to_stage in events:
        if from_stage == to_stage:
            continue
        if from_stage:
            counts[from_stage] -= 1
        counts[to_stage] += 1
    for stage in removed:
        counts[stage] -= 1
    if min(counts.values()) < 0:  # not the history of these counts
        return None
    return BoardMark(counts, last_event_id, unseen, last_removal_id,
                     last_event=_identity(last_event), counted_at=before.counted_at)

