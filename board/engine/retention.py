"""History retention: what may be deleted from the board, and how (`manage.py prune`, and the
reaper's schedule: TASKFLOW["PRUNE_INTERVAL_SECONDS"]).

`prune` deletes old terminal tasks (COMPLETED, CANCELLED, FAILED with no attempt left; untouched
for `terminal_after`; never one that a remaining task depends on, down the chain) with their
history and dependency rows, and collapses renew rows older than `renews_after` into the last one
of each lease (`{"collapsed": n, "since": ...}`), in bounded write transactions; each batch
records the tasks it deleted (RemovedTask) for the live boards, and moves the history's horizon
(HistoryHorizon: the board at a moment before it may miss a deleted task, docs/board-at.md). Neither window is under
MIN_WINDOW. What goes, and why every race with creators, tailers and event cursors is safe:
docs/retention.md.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max

from board.engine import clock
from board.engine.stores import retry_conflicts, store
from board.engine.lifecycle import Stage, Verb, attempts_left
from board.engine.tokens import hash_token
from board.models import Dependency, HistoryHorizon, RemovedTask, Task, TaskEvent

# Defaults (settings.TASKFLOW: PRUNE_RENEWS_AFTER_SECONDS, PRUNE_TERMINAL_AFTER_SECONDS).
RENEWS_AFTER = timedelta(hours=24)
TERMINAL_AFTER = timedelta(days=30)
# The shortest window accepted: see the outbox argument in the module docstring, and the live
# board's insights, which read the last hour of history.
MIN_WINDOW = timedelta(hours=1)

# Bounds of one write transaction: every other writer waits while it runs (on SQLite the whole
# board's writers queue behind it), so each is small; the report prints the longest.
TASKS_PER_BATCH = 200
EVENTS_PER_BATCH = 2000
# Passes over the old terminal tasks: a task depended on goes one pass after its dependents
# (its flag is cleared first), so a chain of n tasks takes up to about 2n passes. The rest
# waits for the next run.
MAX_PASSES = 50
# After a pass cleared flags, the next one deletes those tasks only once every transaction that
# was open when they were cleared has ended (a create that read a flag as true, see the module
# docstring), waiting at most this long; past it they wait for the next run.
OPEN_TRANSACTIONS_PATIENCE_SECONDS = 10.0

TERMINAL_ISH = (Stage.COMPLETED, Stage.CANCELLED, Stage.FAILED)
# Concurrent prunes queue on this key (serialise_on wants hex digits).
_PRUNE_KEY = hash_token("board.engine.retention")


@dataclass
class PruneReport:
    """What a prune deleted (or, in a dry run, would delete)."""

    dry_run: bool
    now: datetime
    renew_cutoff: datetime
    terminal_cutoff: datetime
    tasks_deleted: Counter = field(default_factory=Counter)  # by stage
    task_events_deleted: int = 0  # history rows of the deleted tasks
    dependencies_deleted: int = 0
    renews_collapsed: int = 0  # renew rows deleted, counted in the kept row of their lease
    leases_collapsed: int = 0  # leases whose old renews now are one row
    kept_depended_on: int = 0  # old terminal tasks kept: something that stays depends on them
    passes: int = 0
    batches: int = 0
    longest_batch_seconds: float = 0.0

    @property
    def pruned_anything(self) -> bool:
        return bool(sum(self.tasks_deleted.values()) or self.task_events_deleted or self.dependencies_deleted
                    or self.renews_collapsed)

    def lines(self) -> list[str]:
        """The report as `manage.py prune` prints it: the same lines, in the same order, every run."""
        delete, collapse = ("would delete", "would collapse") if self.dry_run else ("deleted", "collapsed")
        tasks = sum(self.tasks_deleted.values())
        stages = ", ".join(f"{stage} {n}" for stage, n in sorted(self.tasks_deleted.items()))
        lines = [
            f"prune at {self.now.isoformat()}" + (" (dry run: nothing written)" if self.dry_run else ""),
            (f"terminal tasks older than {self.terminal_cutoff.isoformat()}: {delete} {tasks}"
             + (f" ({stages})" if stages else "")
             + f", with {self.task_events_deleted} history rows and {self.dependencies_deleted} dependency rows"),
            f"terminal tasks kept because other tasks depend on them: {self.kept_depended_on}",
            (f"renews older than {self.renew_cutoff.isoformat()}: {collapse} {self.renews_collapsed} rows "
             f"into the last renew of each of {self.leases_collapsed} leases"),
        ]
        if self.dry_run:
            lines.append("write batches: none (dry run)")
        else:
            lines.append(f"write batches: {self.batches}, longest {self.longest_batch_seconds:.3f} s")
        return lines


def default_windows() -> tuple[timedelta, timedelta]:
    """(renews_after, terminal_after) from settings.TASKFLOW, or this module's defaults."""
    knobs = getattr(settings, "TASKFLOW", {})
    renews = knobs.get("PRUNE_RENEWS_AFTER_SECONDS")
    terminal = knobs.get("PRUNE_TERMINAL_AFTER_SECONDS")
    return (timedelta(seconds=renews) if renews is not None else RENEWS_AFTER,
            timedelta(seconds=terminal) if terminal is not None else TERMINAL_AFTER)


def prune(*, renews_after: timedelta | None = None, terminal_after: timedelta | None = None,
          dry_run: bool = False, now: datetime | None = None, using: str = "default") -> PruneReport:
    """Delete old terminal tasks, then collapse old renews (module docstring). `now` defaults to
    the store's clock; the windows to default_windows(). A dry run reads the same batches and
    counts what they would delete, writing nothing."""
    default_renews, default_terminal = default_windows()
    renews_after = default_renews if renews_after is None else renews_after
    terminal_after = default_terminal if terminal_after is None else terminal_after
    for name, window in (("renews_after", renews_after), ("terminal_after", terminal_after)):
        if window < MIN_WINDOW:
            raise ValueError(f"{name} is {window}; the shortest window is {MIN_WINDOW} "
                             "(rows younger than that may not have reached the live board yet)")
    now = clock.now(using) if now is None else now
    report = PruneReport(dry_run=dry_run, now=now, renew_cutoff=now - renews_after,
                         terminal_cutoff=now - terminal_after)
    run = _Run(report, using)
    run.delete_terminal_tasks()
    run.collapse_renews()
    return report


class _Run:
    """One prune: its report, and in a dry run what the batches would have deleted so far (so
    that later batches read the board as the real run would find it)."""

    def __init__(self, report: PruneReport, using: str):
        self.report = report
        self.using = using
        self.dry_run = report.dry_run
        self.gone: set[str] = set()  # dry run: tasks deleted so far
        self.cleared: set[str] = set()  # dry run: tasks whose has_dependents was cleared
        self.kept_rows: set[int] = set()  # renew rows kept for a lease, counted once each

    def _timed(self, batch, *args):
        started = time.perf_counter()
        result = batch(*args, using=self.using)
        self.report.batches += 1
        self.report.longest_batch_seconds = max(self.report.longest_batch_seconds, time.perf_counter() - started)
        return result

    # -----------------------------------------------------------------------------------------
    # Old terminal tasks

    def _old_terminal(self):
        return Task.objects.using(self.using).filter(stage__in=TERMINAL_ISH,
                                                     updated_at__lt=self.report.terminal_cutoff)

    @staticmethod
    def _deletable_stage(stage: str, attempts: int, max_retries: int) -> bool:
        return stage != Stage.FAILED or not attempts_left(attempts, max_retries)

    def _plan(self, rows: list[tuple]) -> tuple[list[str], list[str], dict[str, str]]:
        """Of old terminal `rows` (pk, stage, attempts, max_retries, has_dependents): those to
        delete now (no dependent and the flag false), those whose flag to clear (every
        dependent goes in this batch or is gone), and the stage of each."""
        stages = {pk: stage for pk, stage, attempts, max_retries, _ in rows
                  if pk not in self.gone and self._deletable_stage(stage, attempts, max_retries)}
        flagged = {pk for pk, *_, has_dependents in rows
                   if pk in stages and has_dependents and pk not in self.cleared}
        dependents: dict[str, set[str]] = defaultdict(set)
        for task_id, dep in (Dependency.objects.using(self.using)
                             .filter(depends_on_id__in=list(stages)).values_list("task_id", "depends_on_id")):
            if task_id not in self.gone:
                dependents[dep].add(task_id)
        delete = [pk for pk in stages if pk not in flagged and not dependents[pk]]
        going = set(delete)
        clear = [pk for pk in flagged if dependents[pk] <= going]
        return delete, clear, stages

    def delete_terminal_tasks(self) -> None:
        for _ in range(MAX_PASSES):
            self.report.passes += 1
            changed, kept, cleared = self._terminal_pass()
            if not changed:
                self.report.kept_depended_on = kept
                return
            if cleared and not self.dry_run and not self._older_transactions_ended():
                break
        # Out of passes (or of patience): what is left is counted as kept; the next run goes on.
        self.report.kept_depended_on = self._terminal_pass(count_only=True)[1]

    def _older_transactions_ended(self) -> bool:
        """Whether every transaction open now (just after a pass cleared flags) has ended,
        waiting up to OPEN_TRANSACTIONS_PATIENCE_SECONDS: a create in one of them may have read
        a cleared flag as true, and written a dependency the next pass must see."""
        moment = clock.now(self.using)
        deadline = time.monotonic() + OPEN_TRANSACTIONS_PATIENCE_SECONDS
        while store(self.using).transactions_open_before(moment):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)  # other sessions' transactions: nothing to wait on but the clock
        return True

    def _terminal_pass(self, *, count_only: bool = False) -> tuple[bool, int, bool]:
        """One pass over the old terminal tasks in id order, a batch at a time. Returns whether
        it deleted or cleared anything, how many old terminal tasks it left, and whether it
        cleared a flag."""
        changed, kept, cleared_any, last = False, 0, False, None
        while True:
            page = self._old_terminal().order_by("pk")
            if last is not None:
                page = page.filter(pk__gt=last)
            ids = list(page.values_list("pk", flat=True)[:TASKS_PER_BATCH])
            if not ids:
                return changed, kept, cleared_any
            last = ids[-1]
            if count_only:
                kept += len(self._plan(self._rows(ids))[2])
                continue
            if not self.dry_run:
                # Read first, without a transaction: a batch with nothing to delete or clear (the
                # tasks kept for their dependents, every run) takes no write lock at all.
                delete, clear, stages = self._plan(self._rows(ids))
                if not delete and not clear:
                    kept += len(stages)
                    continue
            while True:  # the same batch again while its history is deleted in parts
                if self.dry_run:
                    done, deleted, cleared, left = self._dry_terminal_batch(ids)
                else:
                    done, deleted, cleared, left = self._timed(self._terminal_batch, ids)
                changed = changed or bool(deleted or cleared)
                cleared_any = cleared_any or bool(cleared)
                if done:
                    kept += left
                    break

    def _rows(self, ids: list[str]) -> list[tuple]:
        return list(self._old_terminal().filter(pk__in=ids).values_list(
            "pk", "stage", "attempts", "max_retries", "has_dependents"))

    def _dry_terminal_batch(self, ids: list[str]) -> tuple[bool, int, int, int]:
        delete, clear, stages = self._plan(self._rows(ids))
        report = self.report
        if delete:
            report.task_events_deleted += TaskEvent.objects.using(self.using).filter(task_id__in=delete).count()
            report.dependencies_deleted += Dependency.objects.using(self.using).filter(task_id__in=delete).count()
        report.tasks_deleted.update(stages[pk] for pk in delete)
        self.gone.update(delete)
        self.cleared.update(clear)
        return True, len(delete), len(clear), len(stages) - len(delete)

    @retry_conflicts
    def _terminal_batch(self, ids: list[str], *, using: str) -> tuple[bool, int, int, int]:
        """One write transaction over the batch `ids`: re-read them (locked where the store has
        row locks) and their dependents, delete what may go, clear the flags that may be
        cleared. When the history of the tasks to delete exceeds EVENTS_PER_BATCH rows, only
        that many of their history rows go, and the caller runs the batch again (done=False)."""
        events_deleted = dependencies_deleted = 0
        with store(self.using).write_transaction():
            store(self.using).serialise_on(_PRUNE_KEY)
            rows = list(store(self.using).lock_rows(self._old_terminal().filter(pk__in=ids)).values_list(
                "pk", "stage", "attempts", "max_retries", "has_dependents"))
            delete, clear, stages = self._plan(rows)
            if delete or clear:
                store(self.using).conflict_with_writers()
            events = TaskEvent.objects.using(self.using).filter(task_id__in=delete)
            event_ids = list(events.values_list("pk", flat=True)[:EVENTS_PER_BATCH + 1])
            if len(event_ids) > EVENTS_PER_BATCH:
                # Only the history of tasks about to go: a run that stops here leaves them
                # terminal with part of their history, and the next run deletes the rest.
                delete, clear = [], []
                part = TaskEvent.objects.using(self.using).filter(pk__in=event_ids[:EVENTS_PER_BATCH])
                _move_horizon(part, self.using)
                events_deleted = part.delete()[0]
            elif delete:
                _move_horizon(events, self.using)
                events_deleted = events.delete()[0]
                dependencies_deleted = Dependency.objects.using(self.using).filter(task_id__in=delete).delete()[0]
                Task.objects.using(self.using).filter(pk__in=delete).delete()
                _record_removals(delete, stages, self.using)
            if clear:
                Task.objects.using(self.using).filter(pk__in=clear, has_dependents=True).update(
                    has_dependents=False)
        # Counted once committed (a conflict runs the whole batch again).
        report = self.report
        report.task_events_deleted += events_deleted
        report.dependencies_deleted += dependencies_deleted
        report.tasks_deleted.update(stages[pk] for pk in delete)
        if len(event_ids) > EVENTS_PER_BATCH:
            return False, 0, 0, 0
        return True, len(delete), len(clear), len(stages) - len(delete)

    # -----------------------------------------------------------------------------------------
    # Old renews

    def collapse_renews(self) -> None:
        """One pass over the history in id order, EVENTS_PER_BATCH rows at a time, up to the
        newest row when it starts (rows added during the pass are younger than the window)."""
        history = TaskEvent.objects.using(self.using)
        newest = history.order_by("-pk").values_list("pk", flat=True).first() or 0
        cutoff = self.report.renew_cutoff
        last = 0
        while last < newest:
            rows = list(history.filter(pk__gt=last, pk__lte=newest).order_by("pk")
                        .values_list("pk", "task_id", "verb", "fence", "at")[:EVENTS_PER_BATCH])
            if not rows:
                return
            last = rows[-1][0]
            old: dict[tuple[str, int], list[int]] = defaultdict(list)
            for pk, task_id, verb, fence, at in rows:
                if verb == Verb.RENEW and at < cutoff and task_id not in self.gone:
                    old[(task_id, fence)].append(pk)
            if not old:
                continue
            # The last old renew of each lease, when it lies beyond this page.
            later = {
                (task_id, fence): keep for task_id, fence, keep in
                history.filter(task_id__in=sorted({task_id for task_id, _ in old}), verb=Verb.RENEW,
                               at__lt=cutoff, pk__gt=last)
                .order_by().values_list("task_id", "fence").annotate(keep=Max("pk")).values_list(
                    "task_id", "fence", "keep")
            }
            plan: dict[int, list[int]] = {}  # kept row -> rows folded into it
            for lease, pks in old.items():
                keep = later.get(lease)
                if keep is None:
                    keep, pks = pks[-1], pks[:-1]
                if pks:
                    plan[keep] = pks
            if not plan:
                continue
            if self.dry_run:
                self.report.renews_collapsed += sum(len(pks) for pks in plan.values())
                self._count_lease(plan)
            else:
                self._timed(self._collapse_batch, plan)

    def _count_lease(self, plan: dict[int, list[int]]) -> None:
        # A lease spread over several pages keeps the same row: count each kept row once.
        self.report.leases_collapsed += len(plan.keys() - self.kept_rows)
        self.kept_rows.update(plan)

    @retry_conflicts
    def _collapse_batch(self, plan: dict[int, list[int]], *, using: str) -> None:
        """Delete the renews of `plan` and fold them into the kept row of their lease: its
        detail counts every renew it stands for (those folded into a row deleted now included)
        and the `at` of the first."""
        history = TaskEvent.objects.using(self.using)
        with store(self.using).write_transaction():
            store(self.using).serialise_on(_PRUNE_KEY)
            folded = {pk: (at, detail) for pk, at, detail in history.filter(
                pk__in=[pk for pks in plan.values() for pk in pks], verb=Verb.RENEW).values_list("pk", "at", "detail")}
            kept = dict(history.filter(pk__in=list(plan), verb=Verb.RENEW).values_list("pk", "detail"))
            deleted = 0
            for keep, pks in plan.items():
                rows = [folded[pk] for pk in pks if pk in folded]
                if keep not in kept or not rows:
                    continue  # another prune got here first
                count, since = _summary(kept[keep])
                for at, detail in rows:
                    more, first = _summary(detail)
                    count += 1 + more
                    since = min(filter(None, (since, first or at)))
                history.filter(pk=keep).update(detail={"collapsed": count, "since": since.isoformat()})
                deleted += history.filter(pk__in=pks, verb=Verb.RENEW).delete()[0]
        self.report.renews_collapsed += deleted
        self._count_lease({keep: pks for keep, pks in plan.items() if keep in kept})


HORIZON = "tasks"  # the one HistoryHorizon row


def _move_horizon(events, using: str) -> None:
    """Inside the batch that deletes `events` (history rows of finished tasks): move the
    history's horizon (HistoryHorizon, read by board.engine.moments) up to the newest `at` among
    them, so that the board at a moment before it says it may miss a deleted task. Never moved
    back: the update is held to the row being older (the prune's batches also run one at a time:
    serialise_on)."""
    newest = events.aggregate(newest=Max("at"))["newest"]
    if newest is None:
        return
    rows = HistoryHorizon.objects.using(using).filter(name=HORIZON)
    now = clock.now(using)
    if not rows.exists():
        HistoryHorizon.objects.using(using).create(name=HORIZON, exact_from=newest, updated_at=now)
    else:
        rows.filter(exact_from__lt=newest).update(exact_from=newest, updated_at=now)


def _record_removals(deleted: list[str], stages: dict[str, str], using: str) -> None:
    """Inside the batch that deleted them: a RemovedTask per task, which every open live board
    reads (board.live.outbox) to drop the task's card and count it out of its column. Records
    older than MIN_WINDOW are deleted here too, a batch's worth at a time: every tailer has read
    them long ago, as with history rows (module docstring). So a record is kept at least an
    hour, and until later batches that delete tasks trim it."""
    now = clock.now(using)
    records = RemovedTask.objects.using(using)
    old = list(records.filter(at__lt=now - MIN_WINDOW).order_by("pk").values_list("pk", flat=True)[:TASKS_PER_BATCH])
    if old:
        records.filter(pk__in=old).delete()
    records.bulk_create([RemovedTask(task_id=pk, stage=stages[pk], at=now) for pk in deleted])


def _summary(detail) -> tuple[int, datetime | None]:
    """(renews a kept row already stands for, the `at` of the first) from its detail."""
    if isinstance(detail, dict) and "collapsed" in detail:
        return int(detail["collapsed"]), datetime.fromisoformat(detail["since"])
    return 0, None
