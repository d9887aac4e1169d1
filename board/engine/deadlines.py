"""Deadlines beside the lease (issue 29, item 7): when a task's queue, attempt or progress
timeout falls due, and why. Pure: no Django, no I/O; the reaper's pass
(transitions.enforce_deadlines) applies them through the CAS, the selector reads its candidates
with `overdue`, and the task's public form shows the deadlines it has (`due`).

The clocks, all from fields the engine writes in the move that starts them:
- queue: from the moment the task may start, `max(stage_changed_at, not_before)` while QUEUED.
  A run_at, a snooze or a retry's backoff is waiting the creator or the holder asked for, not the
  board failing to start the task: it does not count against the queue timeout.
- attempt: from `stage_changed_at` while RUNNING (the claim, resume or takeover that began this
  lease: a renew keeps the stage, so it keeps the clock).
- progress: from `max(stage_changed_at, progress_changed_at)` while RUNNING; progress_changed_at
  is set by a renew whose progress differs from the stored one or that saves a checkpoint, and by
  a pause (which saves one).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from board.engine.lifecycle import Stage

QUEUE, ATTEMPT, PROGRESS = "queue", "attempt", "progress"

# The fields each deadline is computed from (what the selector reads of a candidate).
FIELDS = ("stage", "stage_changed_at", "not_before", "progress_changed_at",
          "queue_timeout_seconds", "attempt_timeout_seconds", "progress_timeout_seconds")
TIMEOUT_FIELDS = {QUEUE: "queue_timeout_seconds", ATTEMPT: "attempt_timeout_seconds",
                  PROGRESS: "progress_timeout_seconds"}
# The task's fields a creator sets (TaskSpec, the API's TaskIn, the client's create).
TIMEOUTS = tuple(TIMEOUT_FIELDS.values())


@dataclass(frozen=True)
class Overdue:
    """A deadline that has passed: which (`kind`), when it fell due (`at`), and the reason the
    history and last_error record."""

    kind: str
    at: datetime
    reason: str
    timeout_seconds: int


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


def due(task: Any) -> dict[str, datetime]:
    """The deadlines `task` (anything with FIELDS as attributes) has in its current stage, by
    kind: {"queue": ...} while QUEUED, {"attempt": ..., "progress": ...} while RUNNING (each only
    when set). A task without the time a clock starts from (a row written outside the engine)
    has none."""
    out: dict[str, datetime] = {}
    started = task.stage_changed_at
    if started is None:
        return out
    if task.stage == Stage.QUEUED and task.queue_timeout_seconds:
        out[QUEUE] = _later(started, task.not_before) + timedelta(seconds=task.queue_timeout_seconds)
    elif task.stage == Stage.RUNNING:
        if task.attempt_timeout_seconds:
            out[ATTEMPT] = started + timedelta(seconds=task.attempt_timeout_seconds)
        if task.progress_timeout_seconds:
            out[PROGRESS] = _later(started, task.progress_changed_at) + timedelta(
                seconds=task.progress_timeout_seconds)
    return out


def overdue(task: Any, now: datetime) -> Overdue | None:
    """The deadline of `task` that has passed by `now` (due at or before it), or None. When both
    RUNNING deadlines have passed, the one that fell due first is the reason (the attempt's on a
    tie: the harder limit)."""
    passed = [(at, kind) for kind, at in due(task).items() if at <= now]
    if not passed:
        return None
    at, kind = min(passed, key=lambda item: (item[0], item[1] != ATTEMPT))
    seconds = getattr(task, TIMEOUT_FIELDS[kind])
    return Overdue(kind, at, REASONS[kind](seconds), seconds)


REASONS = {
    QUEUE: lambda seconds: "not started in time",
    ATTEMPT: lambda seconds: "attempt took too long",
    PROGRESS: lambda seconds: f"no progress in {seconds} s",
}
