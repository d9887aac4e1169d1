"""The task lifecycle: stages, verbs, the transition table, and the limits every caller meets
(sizes of texts and batches, leases, retries). Pure: no Django, no I/O.

`transitions.py` asks this table whether a move is legal before it writes, and the invariant
checker and the tests read it too, so the lifecycle is written down exactly once. The limits are
here once too: the engine's verbs enforce those of a task's own fields and of a batch for every
caller (the API, commands, the admin), raising `errors.InvalidRequest` / `errors.TooLarge` with
the offending `field`; the API's schemas check them as well, to answer before reading further.

Words: a task created with `hold` (the field's name in the API, the table and TaskSpec) is *on
hold*: it stays PENDING until an operator admits it. *Holding* a task, its *holder*, *held by*
are about a lease only (an agent holds a RUNNING task; the Python client's `hold()` holds one
while it works). The engine's code and messages keep to these words.
"""
from __future__ import annotations

import enum
import json
import re
from datetime import datetime
from typing import Any

from board.engine import errors


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


# Limits every caller meets. The engine (board/engine/transitions.py) enforces the caps on a
# task's own fields (title, description, payload, result, checkpoint, error, traceback, an
# operator's reason) and on a batch, whoever calls it; the API's schemas check them all before a
# request reaches the engine. The README's "Limits" table lists each with the error that refuses it.
MIN_TTL_SECONDS = 1
MAX_TTL_SECONDS = 24 * 3600
MAX_DEPENDENCIES = 1000  # of one task
MAX_RETRIES_LIMIT = 100
# One create request is one write transaction, and every other writer (a renew too) waits for
# it: these keep the largest one well under the shortest lease (tests/test_limits_batch.py).
MAX_BATCH_TASKS = 1000
MAX_BATCH_DEPENDENCIES = 10_000  # summed over the batch's tasks
# Text, in characters. Ids, queue and agent names are at most 100 (TASK_ID_RE); an owner may
# also be a staff user's name.
MAX_TITLE_CHARS = 300
MAX_DESCRIPTION_CHARS = 64 * 1024
MAX_ERROR_CHARS = 10_000
# A failure's traceback (kept in its history row, shown in the board's attempt timeline): room
# for a deep stack, small enough that a page of history stays light.
MAX_TRACEBACK_CHARS = 64 * 1024
MAX_REASON_CHARS = 500
MAX_OWNER_CHARS = 200
MAX_TOKEN_CHARS = 100  # a lease token is 43; a longer one cannot match
# payload, result and checkpoint: each at most this many bytes as compact JSON (a task's row,
# its history and every card of it stay small enough to read and send whole).
MAX_JSON_FIELD_BYTES = 256 * 1024
# ... and nest at most this many arrays/objects deep. Past a few hundred levels Python's JSON
# encoder (and the admin's rendering) runs out of recursion: a 500, not a refusal. 64 is room
# for any real document.
MAX_JSON_DEPTH = 64

# A task id, and a queue or agent name: 1-100 letters, digits and ._:-, starting with a letter or
# digit. Written here only: the API's schemas take TASK_ID_PATTERN, the engine TASK_ID_RE.
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$"
TASK_ID_RE = re.compile(TASK_ID_PATTERN)


def is_valid_task_id(task_id: object) -> bool:
    return isinstance(task_id, str) and TASK_ID_RE.fullmatch(task_id) is not None


def unstorable_text(value: object) -> str | None:
    """Why `value` (a string, or any JSON value: its strings and keys) cannot be stored, or None.
    PostgreSQL refuses NUL in text and jsonb, and no database takes a lone UTF-16 surrogate
    (which JSON's \\uD800 escapes can produce): refusing them here keeps both stores alike."""
    pending = [value]
    while pending:  # not recursive: JSON nested as deep as the parser allows is walked too
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "holds a NUL character (\\u0000)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "holds a lone UTF-16 surrogate (not Unicode text)"
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return None


def retry_backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff before the next attempt after `attempt` failed: base, 2*base, ..."""
    exponent = min(max(0, attempt - 1), 64)  # 2**64 * base exceeds any sane cap; no overflow
    return min(cap, base * 2.0**exponent)


def attempts_left(attempts: int, max_retries: int) -> bool:
    """`attempts` counts claims made (a released claim is given back); a task may run
    1 + max_retries times in all."""
    return attempts < max_retries + 1


def json_too_deep(value: Any) -> str | None:
    """Why `value` nests too deep (more than MAX_JSON_DEPTH arrays/objects), or None. Walked
    without recursion, so a value nested as deep as any parser takes is judged, not crashed on."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return f"nests arrays/objects more than {MAX_JSON_DEPTH} deep"
        pending.extend((child, depth + 1) for child in children)
    return None


def limit_json_size(name: str, value: Any) -> None:
    """Refuse a payload, result or checkpoint nested more than MAX_JSON_DEPTH deep
    (InvalidRequest, 422 through the API), or over MAX_JSON_FIELD_BYTES of compact JSON
    (TooLarge, 413). The depth first: encoding a value nested ~1,000 deep raises RecursionError.
    `name` is the field, carried by the error."""
    if value is None:
        return
    if problem := json_too_deep(value):
        raise errors.InvalidRequest(f"{name} {problem}", field=name)
    try:
        size = len(json.dumps(value, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:  # not JSON at all (a Python caller's set, a cycle)
        raise errors.InvalidRequest(f"{name} is not valid JSON: {exc}", field=name) from None
    if size > MAX_JSON_FIELD_BYTES:
        raise errors.TooLarge(f"{name} is {size} bytes of JSON; the limit is {MAX_JSON_FIELD_BYTES}", field=name)


def lease_expired(expires_at: datetime | None, now: datetime) -> bool:
    """The store's rule for a lease: live strictly before its expiry, expired from that instant
    on (the reaper may take it back, a renew is refused, a claim takes it over). No expiry at
    all is no live lease either."""
    return expires_at is None or expires_at <= now
