"""The claim order (issue 29, item 8): priority, aging and fairness keys, as one stored number.

Every task carries `claim_rank` (seconds, a float): claim_next takes the lowest rank first (ties
by id). The rank is fixed when the task enters QUEUED's line, so the claim's pick stays one index
seek on every store (selectors.CLAIM_ORDER; the SQL stores' ORDER BY claim_rank, id):

    claim_rank = turn - priority * AGING_SECONDS

- **Aging.** A task's `turn` is when its wait began (its creation, Unix seconds). One priority
  level is worth AGING_SECONDS of waiting: a task of priority p that has waited AGING_SECONDS
  longer than one of priority p + 1 is taken first. Nothing rewrites ranks as time passes: every
  later task's rank starts later, so a low priority is never a never.
- **Fairness keys.** Tasks naming a `fairness_key` (a plan, a person) take turns: a key's next
  task's turn is one FAIR_STEP_SECONDS / weight after the turn of the key's last waiting task,
  or now when the key has none waiting. A 500-task plan submitted together with a 3-task plan
  therefore alternates with it (turns t, t+60, t+120, ... each), instead of holding it back
  for 500 claims. FAIR_STEP_SECONDS equals AGING_SECONDS, so the rule in one line: **each task a
  key already has waiting counts as one priority level (over its weight) against the key's next
  one.** Tasks without a key keep their creation time: among themselves, oldest first.
- A task with `run_at` waits from `run_at`; one admitted later (dependencies done, hold
  released, a FAILED task retried or requeued) from its admission; one given a delay (a snooze,
  a retry's backoff) from the delay's end: none gains priority for time it could not have run.
  A task released back to QUEUED without a delay (a release, a lost lease) keeps its rank: it
  had its turn and goes on waiting from it.

Concurrent creates under one key may read the same last turn and share a turn (ties go by id):
the order is a scheduling rule, not an invariant. What check() holds it to: no waiting task's
rank is earlier than its creation allows (`rank_before_creation`), which would let it jump its
line.

Why stored, not computed at claim time (Hatchet's round robin numbers rows in the claim): the
claim stays one indexed pick under FOR UPDATE SKIP LOCKED, with no window function over the
backlog and no per-key row written by every claim. docs/flow-control.md has the worked figures.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from board.engine import errors
from board.engine.inputs import key_text
from board.engine.limits import AGING_SECONDS, MAX_FAIRNESS_KEY_CHARS, MAX_FAIRNESS_WEIGHT
from board.engine.stores import store
from board.models import FairnessKey, Stage, Task

# A fairness key's consecutive waiting tasks are this many seconds (over the key's weight) apart.
FAIR_STEP_SECONDS = AGING_SECONDS


def fairness_key(value: Any, field: str = "fairness_key") -> str | None:
    return key_text(value, field, MAX_FAIRNESS_KEY_CHARS)


def fairness_weight(value: Any, field: str = "fairness_weight") -> int | None:
    """A key's weight: a whole number from 1 to MAX_FAIRNESS_WEIGHT (None: unchanged, 1 for a
    new key). A key of weight 3 gets three turns for another key's one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FAIRNESS_WEIGHT:
        raise errors.InvalidRequest(f"{field} must be a whole number from 1 to {MAX_FAIRNESS_WEIGHT}", field=field)
    return value


def rank(turn: float, priority: int) -> float:
    return turn - priority * AGING_SECONDS


def rank_waiting_from(task: Task, start: datetime) -> float:
    """The rank of a task (back) in QUEUED whose wait starts at `start`, unless its rank already
    starts later (a key's later turn, a run_at)."""
    return max(task.claim_rank, rank(start.timestamp(), task.priority))



def set_weights(using: str, weights: dict[str, int]) -> None:
    """Inside a create's transaction: the weights its tasks give their keys (the latest create
    naming one says it). A key's row is made by the first create that gives it a weight
    (insert_missing: two first creates racing make one row, neither fails); a key without a row
    has weight 1."""
    if not weights:
        return
    store(using).insert_missing(FairnessKey, [FairnessKey(name=name, weight=weight) for name, weight in sorted(weights.items())])
    for name, weight in sorted(weights.items()):
        FairnessKey.objects.using(using).filter(name=name).exclude(weight=weight).update(weight=weight)


def assign_ranks(using: str, tasks: Iterable[Task], now: datetime) -> None:
    """Set claim_rank on new tasks (unsaved, in a create's order and transaction): each key's
    tasks take consecutive turns after the key's last waiting task (module docstring)."""
    tasks = list(tasks)
    at = now.timestamp()
    keys = sorted({t.fairness_key for t in tasks if t.fairness_key is not None})
    weights = dict(FairnessKey.objects.using(using).filter(name__in=keys).values_list("name", "weight")) if keys else {}
    next_turn = {key: _after_last_waiting(using, key, weights.get(key, 1)) for key in keys}
    for task in tasks:
        start = max(at, task.not_before.timestamp()) if task.not_before is not None else at
        if task.fairness_key is None or task.not_before is not None:
            task.claim_rank = rank(start, task.priority)
            continue
        turn = max(start, next_turn[task.fairness_key] or start)
        task.claim_rank = rank(turn, task.priority)
        next_turn[task.fairness_key] = turn + FAIR_STEP_SECONDS / weights.get(task.fairness_key, 1)


def _after_last_waiting(using: str, key: str, weight: int) -> float | None:
    """The turn after the key's last waiting task's (None: none waits). Waiting: QUEUED or
    PENDING, and not held back by a time of its own (run_at, a retry's backoff), whose turn is
    that time rather than a place in the key's line. One seek down the index task_fairness_line."""
    last = (Task.objects.using(using)
            .filter(fairness_key=key, stage__in=[Stage.QUEUED, Stage.PENDING], not_before__isnull=True)
            .order_by("-claim_rank").values_list("claim_rank", "priority").first())
    if last is None:
        return None
    return last[0] + last[1] * AGING_SECONDS + FAIR_STEP_SECONDS / weight
