"""The task lifecycle: stages, verbs, the transition table, retries' backoff and a lease's
expiry. Pure: no Django, no I/O.

`board.engine.transitions` asks this table whether a move is legal before it writes, and the
invariant checker and the tests read it too, so the lifecycle is written down exactly once. The
caps every caller meets are in board.engine.limits, the input rules in board.engine.inputs.

Words: a task created with `hold` (the field's name in the API, the table and TaskSpec) is *on
hold*: it stays PENDING until an operator admits it. *Holding* a task, its *holder*, *held by*
are about a lease only (an agent holds a RUNNING task; the Python client's `hold()` holds one
while it works). The engine's code and messages keep to these words.
"""
from __future__ import annotations

import enum
from datetime import datetime


class Stage(enum.StrEnum):
    PENDING = "PENDING"  # accepted; dependencies unfinished, or on hold until an operator admits it
    QUEUED = "QUEUED"  # ready: any agent may claim it
    RUNNING = "RUNNING"  # owned by exactly one lease (token, fence, expiry)
    PAUSED = "PAUSED"  # lease released, checkpoint kept for resume
    COMPLETED = "COMPLETED"  # result committed; terminal
    FAILED = "FAILED"  # failed with no attempt left (or not retryable); operator may requeue
    CANCELLED = "CANCELLED"  # terminal


class Verb(enum.StrEnum):
    CREATE = "create"
    ADMIT = "admit"
    CLAIM = "claim"
    RESUME = "resume"
    RENEW = "renew"
    RELEASE = "release"
    FORCE_RELEASE = "force_release"
    COMPLETE = "complete"
    FAIL = "fail"
    RETRY = "retry"  # FAILED -> QUEUED right after a retryable failure, with backoff
    PAUSE = "pause"
    REQUEUE = "requeue"
    CANCEL = "cancel"
    RECLAIM = "reclaim"  # a lost (expired) lease taken back by the store
    FORCE_PAUSE = "force_pause"  # an operator pauses a running task, keeping its last checkpoint
    EDIT = "edit"  # an operator edits title, description, priority, max_retries or payload
    EXPIRE = "expire"  # QUEUED -> FAILED: not started within its queue_timeout_seconds (the reaper)
    # Approval gates (board.engine.approvals): the holder asks a person and gives its lease up
    # (RUNNING -> PAUSED, waiting for the answer); the answer puts the task back in the line.
    ASK = "ask"
    ANSWER = "answer"


# Stages no transition leaves. FAILED is not here: an operator may requeue it.
TERMINAL = frozenset({Stage.COMPLETED, Stage.CANCELLED})

# Stages after which a task makes no more progress by itself: a live task that depends on one
# of them is stuck until an operator acts.
DEAD_ENDS = frozenset({Stage.CANCELLED, Stage.FAILED})

# Stages that must hold a lease (owner, token, expiry); every other stage must hold none.
LEASED = frozenset({Stage.RUNNING})

# The whole lifecycle: (from stage, verb) -> to stage. A pair missing here is an illegal move.
#
# A lost lease whose attempts are spent is not a RECLAIM: the store FAILs it (RUNNING -> FAILED).
# A retryable failure with attempts left is two moves in one transaction: FAIL, then RETRY.
TRANSITIONS: dict[tuple[Stage, Verb], Stage] = {
    (Stage.PENDING, Verb.ADMIT): Stage.QUEUED,
    (Stage.PENDING, Verb.CANCEL): Stage.CANCELLED,
    (Stage.QUEUED, Verb.CLAIM): Stage.RUNNING,
    (Stage.QUEUED, Verb.CANCEL): Stage.CANCELLED,
    (Stage.QUEUED, Verb.EXPIRE): Stage.FAILED,  # its queue timeout passed (board.engine.deadlines)
    (Stage.RUNNING, Verb.RENEW): Stage.RUNNING,
    (Stage.RUNNING, Verb.COMPLETE): Stage.COMPLETED,
    (Stage.RUNNING, Verb.FAIL): Stage.FAILED,
    (Stage.RUNNING, Verb.PAUSE): Stage.PAUSED,
    (Stage.RUNNING, Verb.RELEASE): Stage.QUEUED,
    (Stage.RUNNING, Verb.FORCE_RELEASE): Stage.QUEUED,
    (Stage.RUNNING, Verb.RECLAIM): Stage.QUEUED,
    (Stage.RUNNING, Verb.CANCEL): Stage.CANCELLED,
    (Stage.PAUSED, Verb.RESUME): Stage.RUNNING,
    (Stage.PAUSED, Verb.REQUEUE): Stage.QUEUED,
    (Stage.PAUSED, Verb.CANCEL): Stage.CANCELLED,
    (Stage.FAILED, Verb.RETRY): Stage.QUEUED,
    (Stage.FAILED, Verb.REQUEUE): Stage.QUEUED,
    (Stage.FAILED, Verb.CANCEL): Stage.CANCELLED,
    (Stage.RUNNING, Verb.FORCE_PAUSE): Stage.PAUSED,
    # An approval (board.engine.approvals): asked by the holder, answered by a person (or by its
    # timeout: approve, or EXPIRE when it says fail; a timeout that says cancel is CANCEL).
    (Stage.RUNNING, Verb.ASK): Stage.PAUSED,
    (Stage.PAUSED, Verb.ANSWER): Stage.QUEUED,
    (Stage.PAUSED, Verb.EXPIRE): Stage.FAILED,
    # Editing keeps the stage (but, like every write, bumps the version). Finished tasks are
    # history and are not edited.
    (Stage.PENDING, Verb.EDIT): Stage.PENDING,
    (Stage.QUEUED, Verb.EDIT): Stage.QUEUED,
    (Stage.RUNNING, Verb.EDIT): Stage.RUNNING,
    (Stage.PAUSED, Verb.EDIT): Stage.PAUSED,
    (Stage.FAILED, Verb.EDIT): Stage.FAILED,
}


def target(stage: Stage | str, verb: Verb) -> Stage | None:
    """The stage `verb` moves a task in `stage` to, or None when the move is illegal."""
    try:
        return TRANSITIONS.get((Stage(stage), verb))
    except ValueError:  # an unknown stage allows nothing
        return None


def retry_backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff before the next attempt after `attempt` failed: base, 2*base, ..."""
    exponent = min(max(0, attempt - 1), 64)  # 2**64 * base exceeds any sane cap; no overflow
    return min(cap, base * 2.0**exponent)


def attempts_left(attempts: int, max_retries: int) -> bool:
    """`attempts` counts claims made (a released claim is given back); a task may run
    1 + max_retries times in all."""
    return attempts < max_retries + 1


def lease_expired(expires_at: datetime | None, now: datetime) -> bool:
    """The store's rule for a lease: live strictly before its expiry, expired from that instant
    on (the reaper may take it back, a renew is refused, a claim takes it over). No expiry at
    all is no live lease either."""
    return expires_at is None or expires_at <= now
