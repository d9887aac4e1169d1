"""The history table read as an outbox: a cursor that reads every committed event exactly once.

`Cursor.read` returns the next page of committed events (holes first: ids below the highest seen
that had not committed, asked for again until they arrive or are proven rolled back by the
server's transaction ids); `Cursor.advance` moves the cursor only once the page was handed to the
sockets, so a failed pass reads the same events again. `Removals` reads the prune's records of
deleted tasks the same way. `unseen_below` and `latest_removal_id` serve a snapshot's
`unseen_event_ids` and `last_removal_id`. Why holes exist and how one is given up:
docs/live-protocol.md, "How the server produces them".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connections
from django.db.models import Q

from board.engine import clock, retention
from board.engine.stores import store
from board.models import RemovedTask, TaskEvent

EVENTS_PER_READ = 1000
MAX_HOLE_RUNS = 200  # runs of consecutive missing ids asked for per read (the rest: next pages)


@dataclass
class Page:
    """One read of the outbox: its events (id order) and where the cursor would be after them.
    Nothing moves until `Cursor.advance(page)`, called once the page's frame was handed out."""

    events: list[TaskEvent]
    last_id: int
    holes: dict[int, int | None]
    full: bool  # a whole page came back: more may be waiting, read again at once


@dataclass
class Cursor:
    """Where a tailer is in the event table: the highest id seen, and the holes below it (ids
    not seen yet, each with the transaction horizon that proves when it can be given up)."""

    last_id: int
    holes: dict[int, int | None] = field(default_factory=dict)
    using: str = "default"

    def read(self) -> Page:
        """The next page of new events and of late ones filling holes, in id order. Runs in a
        sync thread; changes nothing (see `advance`)."""
        late_commits = not store(self.using).ids_follow_commit_order
        # Read BEFORE the events: every transaction older than this has ended by the time the
        # events are read, so a hole it left that is still missing then never commits.
        settled = _oldest_running_xid(self.using) if late_commits and self.holes else None
        runs = _runs(sorted(self.holes))[:MAX_HOLE_RUNS]
        wanted = Q(id__gt=self.last_id)
        for first, last in runs:
            wanted |= Q(id__range=(first, last))
        rows = list(TaskEvent.objects.using(self.using).filter(wanted).order_by("id")[:EVENTS_PER_READ])
        full = len(rows) == EVENTS_PER_READ
        holes, last_id, new_holes = dict(self.holes), self.last_id, []
        for event in rows:
            holes.pop(event.id, None)
            if event.id > last_id:
                new_holes.extend(range(last_id + 1, event.id))
                last_id = event.id
        if late_commits:
            if new_holes:
                # Taken AFTER the events were read: the transaction that took a missing id had
                # its xid before a later id committed, so its xid is below this one.
                horizon = _new_xid(self.using)
                holes.update(dict.fromkeys(new_holes, horizon))
            if settled is not None:
                # Only holes this read looked at may be given up (a full page stops early).
                looked_up_to = rows[-1].id if full else last_id
                covered = {i for first, last in runs for i in range(first, min(last, looked_up_to) + 1)}
                holes = {i: h for i, h in holes.items() if not (i in covered and h is not None and h <= settled)}
        else:
            # SQLite hands out ids under the write lock and commits before the next writer
            # starts, and MongoDB's writers take theirs from one counter document in their
            # transaction (the MongoDB store's number_rows): an id below one already read that is not
            # there was rolled back.
            holes = {}
        return Page(rows, last_id, holes, full)

    def advance(self, page: Page) -> None:
        self.last_id, self.holes = page.last_id, page.holes


@dataclass
class Removals:
    """Where a tailer is in the prune's records of deleted tasks (RemovedTask). Their ids follow
    commit order (the prune's batches run one at a time), so "id > last" reads each record
    exactly once, with no holes to keep."""

    last_id: int
    using: str = "default"

    def read(self) -> list[RemovedTask]:
        """The next records, oldest first (at most EVENTS_PER_READ); changes nothing."""
        return list(RemovedTask.objects.using(self.using).filter(id__gt=self.last_id).order_by("id")[:EVENTS_PER_READ])

    def advance(self, records: list[RemovedTask]) -> None:
        if records:
            self.last_id = records[-1].id


def latest_removal_id(using: str = "default") -> int:
    """The newest record of a deleted task so far (0: none): where a starting tailer's Removals
    begin, and what a snapshot already accounts for."""
    return _newest_id(RemovedTask, using)


def latest_event_id(using: str = "default") -> int:
    """The newest event committed so far (0: none)."""
    return _newest_id(TaskEvent, using)


def _newest_id(model, using: str) -> int:
    return model.objects.using(using).order_by("-id").values_list("id", flat=True).first() or 0


# How far below the newest event a starting cursor looks for ids that may still commit.
START_WINDOW = 10_000
# An event this old was written by a transaction that has long ended, and so has every
# transaction that took a lower id (it took it earlier, and the engine's write transactions last
# milliseconds): no id below it can still commit. It is also the shortest age at which the prune
# deletes history rows (board.engine.retention), so every id it deleted is at or below such an
# event.
SETTLED_AFTER = retention.MIN_WINDOW


def starting_cursor(using: str = "default") -> Cursor:
    """The cursor of a tailer starting now: after the newest event committed so far (a socket's
    snapshot covers what came before), with the ids below it that may yet commit as holes
    (`unseen_below`)."""
    newest = latest_event_id(using)
    cursor = Cursor(newest, using=using)
    missing = unseen_below(newest, using)
    if missing:
        # After the read, as in Cursor.read: the writers of the missing ids have lower xids.
        cursor.holes = dict.fromkeys(missing, _new_xid(using))
    return cursor


def unseen_below(newest: int, using: str = "default") -> list[int]:
    """The event ids at or below `newest` that this read does not see but that may yet commit:
    the holes of a tailer that starts at `newest`, and what a snapshot whose last event is
    `newest` does not hold (board.live.frames: the page still applies their changes). Inside a
    read transaction it answers for that transaction's snapshot. Empty where ids follow commit
    order (SQLite, MongoDB).

    On PostgreSQL a transaction running now may have taken an id below the newest one and
    commit later: its change is after every snapshot read before that commit, so the tailer
    must still send it. Every id missing among the last START_WINDOW is one (a rolled-back id
    is given up at the first read of the outbox that proves its writer ended); a transaction
    that is still open after more than START_WINDOW later events committed is the one case left
    out. The window starts above the newest surviving event older than SETTLED_AFTER: on a quiet
    board the last START_WINDOW ids are old, and the prune has deleted many of them (collapsed
    renews); taken for holes, thousands of them would be asked for on every read for as long as
    any older transaction stays open anywhere on the server (a backup, say). Deleted ids above
    that event (every later one deleted too) are still taken, and given up as rolled back."""
    if not newest or store(using).ids_follow_commit_order:
        return []
    first = max(1, newest - START_WINDOW + 1)
    settled = (TaskEvent.objects.using(using)
               .filter(id__gte=first, id__lte=newest, at__lt=clock.now(using) - SETTLED_AFTER)
               .order_by("-id").values_list("id", flat=True).first())
    if settled is not None:
        first = settled + 1
    present = set(TaskEvent.objects.using(using).filter(id__gte=first, id__lte=newest)
                  .values_list("id", flat=True))
    return [i for i in range(first, newest + 1) if i not in present]


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as runs of consecutive ids: a big transaction's missing ids are one range."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _oldest_running_xid(using: str) -> int:
    """The oldest transaction still running on the server (every older one has ended)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return cursor.fetchone()[0]


def _new_xid(using: str) -> int:
    """A transaction id handed out now, so above that of every transaction running already.
    (Not the snapshot's xmax: that is one past the highest *completed* xid, and a running
    transaction may have a higher one.) Costs one xid, only on a read that found new holes."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        return cursor.fetchone()[0]
