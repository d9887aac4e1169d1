"""The holder's verbs: claim, claim_next, resume (a new lease: a minted token, the next
fence, an expiry from the store's clock), then renew, release, complete, fail, pause (refused
with LeaseLost unless the token is the task's current lease).

The hot verbs (claim_next, renew, complete) check their inputs, then run on their store's path,
chosen in one place (`_path`): `_StatementPath`, the hand-written statements of the SQL stores
(`store(using).statements`, board.engine.stores: one conditional UPDATE with RETURNING each, no
read before it), or `_OrmPath` for any other store or when settings.TASKFLOW["HOT_PATH"] is
"orm". Both raise the same errors: on a statement that matched nothing the statement path reads
the row and judges it with the same checks as the ORM path (`_refuse_holder`).
"""
from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from board.engine import (
    approvals,
    budgets,
    claim_requests,
    clock,
    commits,
    errors,
    flow,
    outcomes,
    scopes,
    selectors,
    tracing,
)
from board.engine.capabilities import PREFER_WINDOW, Capabilities, refuse_unless_fits, score
from board.engine.claim_requests import ClaimRequest
from board.engine.limits import AGING_SECONDS
from board.engine.stores.statements import LIMIT_FILLED, Statements
from board.engine.stores import retry_conflicts, store
from board.engine.inputs import agent_name, is_valid_task_id, json_field, unstorable_text
from board.engine.lifecycle import Stage, Verb, attempts_left, lease_expired, retry_backoff_seconds
from board.engine.limits import MAX_ERROR_CHARS, MAX_SNOOZE_SECONDS, MAX_TRACEBACK_CHARS
from board.engine.tokens import hash_token, token_text
from board.engine.transitions.cas import (
    NO_LEASE,
    RACE_RETRIES,
    Claim,
    Lease,
    _get,
    _illegal,
    _swap,
    _ttl,
)
from board.engine.transitions.housekeeping import admit_ready
from board.models import AgentKey, Queue, Task

log = logging.getLogger("board.engine.transitions")


def _mint_token() -> str:
    return token_text(secrets.token_bytes(32))


# ---------------------------------------------------------------------------------------------
# Claiming: QUEUED -> RUNNING, and PAUSED -> RUNNING (resume)


@tracing.traced(Verb.CLAIM)
@outcomes.refusals(Verb.CLAIM)
@retry_conflicts
def claim(task_id: str, agent: str, ttl_seconds: float, *, request_id: str | None = None,
          capabilities: Capabilities = (), using: str = "default") -> Claim:
    """Claim this task for `agent` with a new lease of `ttl_seconds`.

    A PENDING task whose dependencies have all completed is admitted on the way; a RUNNING task
    whose lease has expired is reclaimed and taken over (a new token, a higher fence). Refused:
    NotFound, Taken (a live lease), Blocked (dependencies, on hold, backoff), Terminal,
    InvalidTransition (PAUSED: resume it; FAILED: an operator may requeue it).

    With `request_id` (board.engine.claim_requests): when the task's live lease was made by this
    agent's claim with the same id, that lease is returned (same token and fence) and nothing
    is written. Two copies racing: the CAS lets one claim, the other re-reads and returns it.

    `capabilities`: the claimer's labels; a task requiring one it lacks is Forbidden
    (board.engine.capabilities)."""
    ttl = _ttl(ttl_seconds)
    agent_name(agent)
    request = claim_requests.of(agent, request_id)
    for _ in range(RACE_RETRIES):
        with _limits_refuse(using, task_id), store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            if request is not None:
                token = claim_requests.token_if_made_by(task, request, agent, now)
                if token is not None:
                    return _claim_of(task, token)
            refuse_unless_fits(task, capabilities)
            task = _claimable(using, task, now, agent)
            if task is not None:
                won = _take(using, task, Verb.CLAIM, agent, ttl, now, request)
                if won is not None:
                    return won
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


@contextmanager
def _limits_refuse(using: str, task_id: str) -> Iterator[None]:
    """Around a move of one named task into RUNNING (claim, resume): its queue paused or at a
    limit (flow.AtLimit, which rolled the move back) refuses it as Blocked, with the task as it
    is."""
    try:
        yield
    except flow.AtLimit as refused:
        if refused.budget:
            raise errors.BudgetExhausted(refused.why, task=_get(using, task_id)) from None
        raise errors.Blocked(refused.why, task=_get(using, task_id), waiting=refused.why) from None


def _admit_dependents(task_id: str, using: str) -> list[str]:
    dependents = selectors.dependents_of(task_id, using=using)
    return admit_ready(dependents, using=using) if dependents else []


def _claimable(using: str, task: Task, now: datetime, agent: str) -> Task | None:
    """`task` as QUEUED and ready to claim by `agent`, or None when a race was lost (reload and
    retry); raises the precise error when it cannot be claimed."""
    if task.stage == Stage.QUEUED:
        keeper = approvals.kept_for(using, task, now)  # an answered approval's asker (board.engine.approvals)
        if keeper is not None and keeper != agent:
            raise errors.Blocked(f"kept until {task.not_before.isoformat()} for {keeper}, the agent that asked "
                                 "its approval", task=task, waiting=f"not before {task.not_before.isoformat()}")
        if keeper is None and task.not_before is not None and task.not_before > now:
            raise errors.Blocked(f"not claimable before {task.not_before.isoformat()} (a retry's backoff, "
                                 "a run_at or a snooze)", task=task, waiting=f"not before {task.not_before.isoformat()}")
        return task
    if task.stage == Stage.PENDING:
        unfinished = selectors.unfinished_deps(task.pk, using=using)
        if unfinished:
            raise errors.Blocked(f"waiting for {', '.join(sorted(unfinished))}", task=task)
        if task.on_hold:
            # The wire's message, kept as agents have read it ("held"); the code says "on hold".
            raise errors.Blocked("held until an operator admits it", task=task)
        # Its last dependency has just completed and the admission pass has not reached it yet.
        ok = _swap(using, task, Verb.ADMIT, now=now, actor="system", guard=Q(on_hold=False))
        return task if ok else None
    if task.stage == Stage.RUNNING:
        if not lease_expired(task.lease_expires_at, now):
            raise errors.Taken(f"task {task.pk} is held by {task.owner}", task=task)
        if not attempts_left(task.attempts, task.max_retries):
            raise errors.InvalidTransition(
                f"task {task.pk}'s lease expired on its last attempt; it is being failed", task=task
            )
        ok = _swap(using, task, Verb.RECLAIM, now=now, actor="system",
                   guard=Q(lease_expires_at__lte=now),
                   detail={"reason": "lease expired", "previous_owner": task.owner}, **NO_LEASE)
        if ok:  # a takeover: this claim takes back a lease that expired
            outcomes.record(using, Verb.RECLAIM, outcomes.EXPIRED, "claim")
        return task if ok else None
    if task.stage == Stage.PAUSED:
        raise _illegal(task, Verb.CLAIM, "resume it to continue from its checkpoint")
    if task.stage == Stage.FAILED:
        raise _illegal(task, Verb.CLAIM, "an operator may requeue it")
    raise _illegal(task, Verb.CLAIM)


def _claim_of(task: Task, token: str) -> Claim:
    """The answer a claim gave: the task as it is and its lease, now."""
    return Claim(task=task, lease=Lease(token=token, fence=task.fence, expires_at=task.lease_expires_at))


def _take(using: str, task: Task, verb: Verb, agent: str, ttl: timedelta, now: datetime,
          request: ClaimRequest | None = None) -> Claim | None:
    """Give `task` a new lease: a freshly minted token and the next fence, in one CAS. With a
    claim request, the token is derived from a minted seed and the request is recorded."""
    token, seed = request.mint() if request is not None else (_mint_token(), None)
    fence = task.fence + 1
    expires_at = now + ttl
    changes = {
        "owner": agent,
        "lease_token_hash": hash_token(token),
        "fence": fence,
        "lease_expires_at": expires_at,
        "not_before": None,
        "claim_request_hash": request.digest if request is not None else None,
        "claim_token_seed": seed,
    }
    if verb == Verb.CLAIM:  # a resume continues the paused attempt
        changes["attempts"] = task.attempts + 1
    if not _swap(using, task, verb, now=now, actor=agent, **changes):
        return None
    return Claim(task=task, lease=Lease(token=token, fence=fence, expires_at=expires_at))


@tracing.traced(Verb.CLAIM, names_task=False)
@outcomes.refusals(Verb.CLAIM)
@retry_conflicts
def claim_next(
    agent: str, ttl_seconds: float, *, queue: str | None = None, request_id: str | None = None,
    key_hash: str | None = None, scope: scopes.Scope = None, capabilities: Capabilities = (),
    using: str = "default",
) -> Claim | None:
    """Claim the best ready task: first in the line (claim_rank, then id: board.engine.fairness), among QUEUED tasks past their
    backoff (in `queue` when given). None when there is no ready task.

    With `request_id` (board.engine.claim_requests): when this agent's claim with the same id made a
    lease that is still live, that lease is returned (same task, token and fence) instead of
    claiming another task. Copies of one request are serialised, so they make one lease.

    `key_hash`: the agent key the caller acts with, when nobody checked it for this request
    (_require_live_key): the claim is made only while that key is live; else KeyRevoked.

    `scope`: the queue patterns of a scoped key (board.engine.scopes; issue 27): only a task of
    a matching queue is taken, and the filter is in the query that picks and claims it (the
    hot statement, or the ORM path's pick inside its write transaction), never checked before.
    A `queue` outside the scope has no task for this key: None. (A task's queue never changes,
    and a key's scope neither, so that answer needs no reading.)

    `capabilities`: the claimer's labels (board.engine.capabilities): only a task whose
    `requires` are all among them is taken (none: only tasks requiring none), in the same query,
    and the first few it could take are re-ranked by the labels they prefer."""
    ttl = _ttl(ttl_seconds)
    agent_name(agent)
    if queue is not None and not is_valid_task_id(queue):
        raise errors.InvalidRequest(f"invalid queue name {queue!r}")
    # --- queue scope (issue 27): a named queue is either wholly in scope or has nothing.
    if scope is not None and queue is not None:
        if not scopes.allows(scope, queue):
            _require_live_key(using, key_hash, agent)
            outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
            return None
        scope = None  # `queue = %s` alone picks only that queue's tasks
    request = claim_requests.of(agent, request_id)
    claimed = _path(using).claim_next(using, agent, ttl, queue, request, key_hash, scope,
                                      capabilities=capabilities)
    if claimed is None and queue is not None:
        # The claim (its statement or transaction) found nothing: a queue whose budget is spent
        # says so (409 budget_exhausted) rather than "no work". Only the answer's words are read
        # here; the claim itself decided.
        spent = Queue.objects.using(using).filter(name=queue, budget_closed_until__isnull=False).first()
        now = clock.now(using)
        if budgets.exhausted(spent, now):
            raise errors.BudgetExhausted(budgets.refusal(spent, now))
    return claimed


@tracing.traced(Verb.RESUME)
@outcomes.refusals(Verb.RESUME)
@retry_conflicts
def resume(task_id: str, agent: str, ttl_seconds: float, *, capabilities: Capabilities = (),
           using: str = "default") -> Claim:
    """Take a PAUSED task with a new lease (new token, higher fence); its checkpoint is on the
    returned task. A task requiring a capability the claimer lacks is Forbidden."""
    ttl = _ttl(ttl_seconds)
    agent_name(agent)
    for _ in range(RACE_RETRIES):
        with _limits_refuse(using, task_id), store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            if task.stage == Stage.RUNNING and not lease_expired(task.lease_expires_at, now):
                raise errors.Taken(f"task {task.pk} is held by {task.owner}", task=task)
            if task.stage != Stage.PAUSED:
                raise _illegal(task, Verb.RESUME, "only a PAUSED task can be resumed")
            approvals.refuse_awaiting(task, Verb.RESUME)
            refuse_unless_fits(task, capabilities)
            won = _take(using, task, Verb.RESUME, agent, ttl, now)
            if won is not None:
                return won
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


# ---------------------------------------------------------------------------------------------
# The holder's verbs: renew, release, complete, fail, pause. Each is refused with LeaseLost
# unless the token is the task's current lease.


def _holder_move(using: str, task_id: str, token: str, build, *, live_only: bool, agent: str | None,
                 key_hash: str | None = None):
    """Run a holder's verb: check the token against the row, then CAS on (stage, version, token
    hash). `build(task, now)` performs the swap(s) and returns the result, or None on a lost CAS.

    `agent`: when given (the API always gives it), the lease must also have been minted for
    this agent; otherwise Forbidden.

    `live_only`: renew refuses an expired lease (the seed's rule: past its expiry the holder has
    no right left to extend). complete/fail/pause/release accept a lease that has expired but
    has not been taken over: the token still proves nobody else holds the task."""
    token_hash = _token_hash(token)
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            _require_live_key(using, key_hash, agent)
            now = clock.now(using)
            task = _get(using, task_id)
            _refuse_holder(task, token_hash, now, live_only=live_only, agent=agent)
            result = build(task, now, token_hash)
            if result is not None:
                return result
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


def _tell_hot_move(using: str, verb: Verb) -> None:
    """A hot verb's move has been made: tell the board (board.engine.commits) and the counters
    (outcomes). After its transaction, which Django does not see on SQLite
    (db.statement_transaction): outside a caller's transaction both run now, after the move's
    commit; inside one, at the caller's commit."""
    commits.after_commit(using)
    outcomes.record(using, verb, outcomes.WON)


def _require_live_key(using: str, key_hash: str | None, agent: str | None) -> None:
    """KeyRevoked unless a live agent key with this hash, named `agent`, exists (no check when
    `key_hash` is None: the caller checked the key itself).

    Why a verb checks a key at all: the API looks a key up on every request (one query), except
    for the hot verbs (claim_next, renew, complete), which take a key this process verified in
    the last minute on trust and pass its hash here (board.agent_keys.authenticate_deferred).
    The hot statements check it in the move itself (board.engine.stores); this query is for the ORM path
    and for a move that matched nothing, to tell a gone key from the move's own refusal."""
    if key_hash is None:
        return
    if agent is None:
        raise ValueError("a key to check needs the agent's name")
    # Live: no end set, or its end (a rotated key's grace) still ahead by the store's clock.
    live = store(using).live_keys()
    if not AgentKey.objects.using(using).filter(live, key_hash=key_hash, name=agent).exists():
        raise errors.KeyRevoked()


def _token_hash(token: str) -> str:
    if not isinstance(token, str) or not token:
        raise errors.InvalidRequest("token is required", field="token")
    return hash_token(token)


def _refuse_holder(task: Task, token_hash: str, now: datetime, *, live_only: bool, agent: str | None) -> None:
    """Raise the precise error when the presenter of `token_hash` may not act on `task` as
    read at `now`; return when it may."""
    if task.stage != Stage.RUNNING or not hmac.compare_digest(task.lease_token_hash or "", token_hash):
        raise errors.LeaseLost(f"this token is not task {task.pk}'s current lease", task=task)
    if live_only and lease_expired(task.lease_expires_at, now):
        raise errors.LeaseLost(f"the lease on task {task.pk} has expired", task=task)
    if agent is not None and agent != task.owner:
        # A token is a credential, but it was minted for one agent: another agent presenting
        # it (a leak, a mix-up) acts as nobody.
        raise errors.Forbidden(f"task {task.pk}'s lease belongs to another agent", task=task)


def _hot_holder_move(hot: Statements, using: str, task_id: str, token_hash: str, move, *,
                     live_only: bool, agent: str | None, verb: Verb, key_hash: str | None = None) -> Task:
    """A holder's verb through the store's statements: `move()` runs the verb's one statement and returns
    the row as written, or None when it matched no row. Only then is the row read: it raises
    the error the ORM path would, or, when the move has become legal again (the row changed
    between the statement and the read), the statement runs again."""
    for _ in range(RACE_RETRIES):
        with hot.transaction():
            row = move()
        if row is not None:
            _tell_hot_move(using, verb)
            return hot.task(row)  # out of the transaction: see HotStore
        _require_live_key(using, key_hash, agent)  # the statement checks it too: say which refused
        _refuse_holder(_get(using, task_id), token_hash, clock.now(using), live_only=live_only, agent=agent)
        outcomes.record(using, verb, outcomes.LOST_RACE)  # not refused: the row moved between the two
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


@tracing.traced(Verb.RENEW)
@outcomes.refusals(Verb.RENEW)
@retry_conflicts
def renew(
    task_id: str,
    token: str,
    ttl_seconds: float,
    *,
    checkpoint: Any = None,
    progress: float | None = None,
    agent: str | None = None,
    key_hash: str | None = None,
    using: str = "default",
) -> Claim:
    """Extend a live lease to now + ttl, keeping token and fence; optionally save a checkpoint
    and progress. Wrong token or an expired lease: LeaseLost, nothing changed. `key_hash`: as
    for claim_next (needs `agent`)."""
    ttl = _ttl(ttl_seconds)
    _check_progress(progress)
    json_field("checkpoint", checkpoint)
    return _path(using).renew(using, task_id, token, ttl, checkpoint, progress, agent, key_hash)


@tracing.traced(Verb.RELEASE)
@outcomes.refusals(Verb.RELEASE)
@retry_conflicts
def release(task_id: str, token: str, *, retry_after_seconds: float | None = None, agent: str | None = None,
            using: str = "default") -> Task:
    """Hand the task back to the queue. The attempt is given back: releasing is not failing.

    `retry_after_seconds` snoozes it: back to QUEUED, but not claimable for that long (its
    not_before, as a retry's backoff), attempts unchanged. The history row records it."""
    if retry_after_seconds is not None and (
            isinstance(retry_after_seconds, bool) or not isinstance(retry_after_seconds, (int, float))
            or not 1 <= retry_after_seconds <= MAX_SNOOZE_SECONDS):
        raise errors.InvalidRequest(f"retry_after_seconds must be a number from 1 to {MAX_SNOOZE_SECONDS}",
                                    field="retry_after_seconds")

    def build(task: Task, now: datetime, token_hash: str):
        snooze = {}
        if retry_after_seconds is not None:
            snooze = {"not_before": now + timedelta(seconds=retry_after_seconds),
                      "detail": {"retry_after_seconds": retry_after_seconds}}
        ok = _swap(using, task, Verb.RELEASE, now=now, actor=task.owner, token_hash=token_hash,
                   attempts=max(0, task.attempts - 1), **snooze, **NO_LEASE)
        return task if ok else None

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent)


@tracing.traced(Verb.COMPLETE)
@outcomes.refusals(Verb.COMPLETE)
@retry_conflicts
def complete(task_id: str, token: str, result: Any, *, agent: str | None = None, key_hash: str | None = None,
             using: str = "default") -> Task:
    """Commit the result; then admit the dependents this completion unblocks (after commit, each
    by its own CAS, so that two dependencies completing at once cannot both miss the other).
    `key_hash`: as for claim_next (needs `agent`)."""
    if result is None:
        raise errors.InvalidRequest("result is required (use {} for a task with no output)", field="result")
    json_field("result", result)
    return _path(using).complete(using, task_id, token, result, agent, key_hash)


def _admit_dependents_after_commit(task_id: str, using: str) -> None:
    # Dependents are read after commit, not here: a dependent created concurrently commits
    # either before that read (and is found) or after this commit (and its own after-commit
    # check sees this task COMPLETED). Read now, both could miss each other.
    transaction.on_commit(lambda: _admit_dependents(task_id, using), using=using, robust=True)


@tracing.traced(Verb.FAIL)
@outcomes.refusals(Verb.FAIL)
@retry_conflicts
def fail(
    task_id: str, token: str, error: str, *, retryable: bool = True, traceback: str | None = None,
    agent: str | None = None, using: str = "default",
) -> Task:
    """Record a failed attempt. With attempts left and `retryable`, the task goes straight back
    to QUEUED behind an exponential backoff (FAIL then RETRY, one transaction); otherwise it
    stays FAILED.

    The error (and `traceback`, when given) is kept in this failure's history row, not only in
    the task's `last_error`, which the next failure overwrites: every attempt keeps its own."""
    if not isinstance(error, str):
        raise errors.InvalidRequest("error must be text", field="error")
    if len(error) > MAX_ERROR_CHARS:
        raise errors.InvalidRequest(f"error must be at most {MAX_ERROR_CHARS} characters", field="error")
    if traceback is not None and not isinstance(traceback, str):
        raise errors.InvalidRequest("traceback must be text", field="traceback")
    if traceback is not None and len(traceback) > MAX_TRACEBACK_CHARS:
        raise errors.InvalidRequest(f"traceback must be at most {MAX_TRACEBACK_CHARS} characters", field="traceback")
    for name, text in (("error", error), ("traceback", traceback)):
        if problem := unstorable_text(text):
            raise errors.InvalidRequest(f"{name} {problem}", field=name)
    detail = failure_detail(error, traceback, retryable)

    def build(task: Task, now: datetime, token_hash: str):
        if not _swap(using, task, Verb.FAIL, now=now, actor=task.owner, token_hash=token_hash,
                     detail=detail, last_error=error, **NO_LEASE):
            return None
        if retryable and attempts_left(task.attempts, task.max_retries):
            _retry(using, task, now)
        else:
            outcomes.record(using, Verb.FAIL, outcomes.TERMINAL, "attempts_spent" if retryable else "not_retryable")
        return task

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent)


def failure_detail(error: str, traceback: str | None, retryable: bool) -> dict:
    """What a FAIL event records of the failure (board.live.insights and the board's attempt
    timeline read it)."""
    detail: dict[str, Any] = {"error": error}
    if traceback:
        detail["traceback"] = traceback
    detail["retryable"] = retryable
    return detail


def _retry(using: str, task: Task, now: datetime) -> None:
    conf = settings.TASKFLOW
    delay = retry_backoff_seconds(
        task.attempts, conf["RETRY_BACKOFF_BASE_SECONDS"], conf["RETRY_BACKOFF_MAX_SECONDS"]
    )
    not_before = now + timedelta(seconds=delay)
    # Same transaction as the FAIL just written, so this CAS cannot lose.
    if not _swap(using, task, Verb.RETRY, now=now, actor="system", not_before=not_before,
                 detail={"backoff_seconds": delay}):
        raise errors.VersionConflict("task changed inside its own transaction", task=task)


@tracing.traced(Verb.PAUSE)
@outcomes.refusals(Verb.PAUSE)
@retry_conflicts
def pause(task_id: str, token: str, checkpoint: Any, *, agent: str | None = None, using: str = "default") -> Task:
    """Release the lease and keep `checkpoint`, so that a later resume continues from it."""
    if checkpoint is None:
        raise errors.InvalidRequest("checkpoint is required to pause", field="checkpoint")
    json_field("checkpoint", checkpoint)

    def build(task: Task, now: datetime, token_hash: str):
        # A checkpoint saved is progress made (board.engine.deadlines), as for renew.
        ok = _swap(using, task, Verb.PAUSE, now=now, actor=task.owner, token_hash=token_hash,
                   checkpoint=checkpoint, progress_changed_at=now, **NO_LEASE)
        return task if ok else None

    return _holder_move(using, task_id, token, build, live_only=False, agent=agent)


def _check_progress(progress: float | None) -> None:
    if progress is None:
        return
    if isinstance(progress, bool) or not isinstance(progress, (int, float)) or not 0 <= progress <= 1:
        raise errors.InvalidRequest("progress must be a fraction from 0 to 1", field="progress")


# ---------------------------------------------------------------------------------------------
# The hot verbs' two paths: the verbs above check their inputs, then hand the move to the path
# their store takes (`_path`, the one place that chooses): the store's statements (the SQL
# stores: one conditional UPDATE with RETURNING per move) or the ORM (MongoDB, any other
# backend, and HOT_PATH "orm"). Both raise the same errors (_refuse_holder).


def _path(using: str) -> _StatementPath | _OrmPath:
    hot = store(using).statements
    return _ORM_PATH if hot is None else _StatementPath(hot)


class _StatementPath:
    """claim_next, renew and complete through the store's statements: on a statement that
    matched nothing the row is read and judged as the ORM path judges it (_hot_holder_move)."""

    def __init__(self, hot: Statements):
        self.hot = hot

    def claim_next(self, using: str, agent: str, ttl: timedelta, queue: str | None,
                   request: ClaimRequest | None, key_hash: str | None, scope: scopes.Scope,
                   look_up: bool = True, capabilities: Capabilities = ()) -> Claim | None:
        """One statement: pick, CAS and history together, nothing read before. On SQLite the
        pick runs under the write lock; on PostgreSQL it skips rows other claimers have locked.
        So a match count of 0 means no ready task (what the ORM path says after losing every
        race, too), never a lost race to retry; except on PostgreSQL when a queue or
        concurrency key filled between the pick and its slot (LIMIT_FILLED): the pick runs again.

        With a claim request (only then), the statement runs in a write transaction after the
        request is serialised and looked up: a live lease it made is returned instead.
        `look_up` False: a claim of a batch, whose caller looked the request up already
        (board.engine.transitions.batches): the lease records the request, nothing is looked up."""
        hot = self.hot
        for _ in range(RACE_RETRIES):
            if request is None:
                token, seed = _mint_token(), None
                context = hot.transaction()
            else:
                token, seed = request.mint()
                context = store(using).write_transaction()
            with context:
                if request is not None and look_up:
                    _require_live_key(using, key_hash, agent)
                    claim_requests.serialise(using, request)
                    made = claim_requests.made_by(using, request, agent)
                    if made is not None:
                        return _claim_of(*made)
                row = hot.claim_next(agent, hash_token(token), ttl, queue,
                                     request.digest if request is not None else None, seed, key_hash, scope,
                                     capabilities)
            if row is not LIMIT_FILLED:
                break
            # A queue or key filled between the pick and its slot (board.engine.flow): nothing
            # was written; the next pick leaves it out.
            outcomes.record(using, Verb.CLAIM, outcomes.LOST_RACE)
        else:
            log.warning("claim_next by %s lost %d races for a slot in a row", agent, RACE_RETRIES)
            return None
        if row is None:
            # Nothing was ready, or the key is gone (the statement checks both): say which, out
            # of the transaction (nothing was written; on SQLite it holds the writers' lock).
            _require_live_key(using, key_hash, agent)
            outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
            return None
        _tell_hot_move(using, Verb.CLAIM)
        return _claim_of(hot.task(row), token)  # the task built out of the transaction: see HotStore

    # --- several moves in one transaction of the store's statements (transitions.batches) ---

    def _claim_row(self, agent: str, ttl: timedelta, queue: str | None, key_hash: str | None,
                   scope: scopes.Scope, capabilities: Capabilities = (), first: bool = True) -> tuple[Any, str] | None:
        """Inside hot.several(): claim_next's statement, run again while a limit filled between
        its pick and its slot (PostgreSQL; nothing was written then). (row, token), or None.
        Not `first` (a batch's later claims, holding a queue's shard already): it waits for no
        shard another transaction holds, and a limit filled (or held) ends the batch: None."""
        for _ in range(RACE_RETRIES):
            token = _mint_token()
            row = self.hot.claim_next(agent, hash_token(token), ttl, queue, None, None, key_hash, scope, capabilities,
                                      waits=first)
            if row is LIMIT_FILLED and not first:
                return None
            if row is not LIMIT_FILLED:
                return None if row is None else (row, token)
        log.warning("claim_next by %s lost %d races for a slot in a row", agent, RACE_RETRIES)
        return None

    def complete_and_claim(self, using: str, task_id: str, token: str, result: Any, agent: str,
                           key_hash: str | None, ttl: timedelta, queue: str | None,
                           scope: scopes.Scope, capabilities: Capabilities = ()) -> tuple[Task, Claim | None]:
        """complete's statement, then (when it matched) claim_next's, in one transaction
        (hot.several()). A completion that matched nothing claimed nothing: the row is then
        judged as complete() judges it (_hot_holder_move)."""
        hot, token_hash = self.hot, _token_hash(token)
        for _ in range(RACE_RETRIES):
            claimed = None
            with hot.several():
                row = hot.complete(task_id, token_hash, agent, result, key_hash)
                if row is not None:
                    claimed = self._claim_row(agent, ttl, queue, key_hash, scope, capabilities)
            if row is not None:
                break
            _require_live_key(using, key_hash, agent)
            _refuse_holder(_get(using, task_id), token_hash, clock.now(using), live_only=False, agent=agent)
            outcomes.record(using, Verb.COMPLETE, outcomes.LOST_RACE)
        else:
            raise errors.VersionConflict(f"task {task_id} kept changing; try again")
        _tell_hot_move(using, Verb.COMPLETE)
        task = hot.task(row)
        if task.has_dependents:
            _admit_dependents_after_commit(task.pk, using)
        if claimed is None:
            outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
            return task, None
        _tell_hot_move(using, Verb.CLAIM)
        return task, _claim_of(hot.task(claimed[0]), claimed[1])

    def claim_batch(self, using: str, agent: str, ttl: timedelta, max_tasks: int, queue: str | None,
                    key_hash: str | None, scope: scopes.Scope, capabilities: Capabilities = ()) -> list[Claim]:
        """Up to max_tasks of claim_next's statement in one transaction (hot.several()), stopping
        at the first that finds nothing."""
        claimed = []
        with self.hot.several():
            while len(claimed) < max_tasks and (got := self._claim_row(agent, ttl, queue, key_hash, scope, capabilities,
                                                                       first=not claimed)):
                claimed.append(got)
        if not claimed:
            _require_live_key(using, key_hash, agent)  # as claim_next: a gone key is not "no work"
            outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
            return []
        for _ in claimed:
            _tell_hot_move(using, Verb.CLAIM)
        return [_claim_of(self.hot.task(row), token) for row, token in claimed]

    def renew(self, using: str, task_id: str, token: str, ttl: timedelta, checkpoint: Any,
              progress: float | None, agent: str | None, key_hash: str | None) -> Claim:
        hot, token_hash = self.hot, _token_hash(token)
        task = _hot_holder_move(
            hot, using, task_id, token_hash,
            lambda: hot.renew(task_id, token_hash, agent, ttl, checkpoint, progress, key_hash),
            live_only=True, agent=agent, verb=Verb.RENEW, key_hash=key_hash)
        return Claim(task=task, lease=Lease(token=token, fence=task.fence, expires_at=task.lease_expires_at))

    def complete(self, using: str, task_id: str, token: str, result: Any, agent: str | None,
                 key_hash: str | None) -> Task:
        hot, token_hash = self.hot, _token_hash(token)
        task = _hot_holder_move(
            hot, using, task_id, token_hash,
            lambda: hot.complete(task_id, token_hash, agent, result, key_hash),
            live_only=False, agent=agent, verb=Verb.COMPLETE, key_hash=key_hash)
        # has_dependents as written, read under the row's lock. Registered after the move's
        # transaction: outside a caller's transaction it runs now (the move has committed),
        # inside one at its commit.
        if task.has_dependents:
            _admit_dependents_after_commit(task.pk, using)
        return task

    @tracing.traced(Verb.COMPLETE, names_task=False)
    def complete_batch(self, items, agent: str | None, key_hash: str | None, *, using: str) -> list[Task | None]:
        """complete's statement for each item ((task_id, token, result)). Where a transaction
        costs more than the statement (hot.completions_share_a_transaction: SQLite), all in one
        (one commit). Elsewhere (PostgreSQL) the first items whose tasks hold nothing a
        completion gives back (no queue slot, key or resource) in one, then each other item in
        its own, as complete's: a transaction holding several slots deadlocked (the attribute's
        comment). Per item, the completed task, or None where the statement matched nothing,
        which wrote nothing: the caller judges those items one by one (batches.complete_batch)."""
        hot = self.hot
        if hot.completions_share_a_transaction:
            rows = self._complete_rows(items, agent, key_hash, using=using)
        else:
            rows = [None] * len(items)
            if len(items) > 1:
                rows = self._complete_rows(items, agent, key_hash, using=using, holding_nothing=True)
            # (a conflict runs its own item again, never one that has committed)
            rows = [row if row is not None else self._complete_rows([item], agent, key_hash, using=using)[0]
                    for item, row in zip(items, rows)]
        made = [None if row is None else hot.task(row) for row in rows]  # out of the transaction
        count = sum(task is not None for task in made)
        if count:
            commits.after_commit(using)
            outcomes.record(using, Verb.COMPLETE, outcomes.WON, count=count)
        for task in made:
            if task is not None and task.has_dependents:
                _admit_dependents_after_commit(task.pk, using)
        return made

    @retry_conflicts
    def _complete_rows(self, items, agent: str | None, key_hash: str | None, *, using: str,
                       holding_nothing: bool = False) -> list:
        """complete's statement for each item, in one transaction: what each wrote, or None.
        `holding_nothing` (PostgreSQL's batch): the statement that moves only a task holding no
        slot, key or resource, up to the first item it does not move; that item and the ones
        after it are left None. (A batch's tasks are mostly of one queue: once one holds a slot,
        the others likely do too, and trying each would cost a statement for nothing.)"""
        hot = self.hot
        with hot.several() if len(items) > 1 else hot.transaction():
            if not holding_nothing:
                return [hot.complete(task_id, _token_hash(token), agent, result, key_hash)
                        for task_id, token, result in items]
            rows = []
            for task_id, token, result in items:
                row = hot.complete(task_id, _token_hash(token), agent, result, key_hash, holding_nothing=True)
                if row is None:
                    break
                rows.append(row)
            return rows + [None] * (len(items) - len(rows))


def _preferred_first(ready, capabilities: Capabilities) -> str | None:
    """The ORM path's re-rank by preference (board.engine.capabilities): of the first
    PREFER_WINDOW tasks in line, the id of the one whose preferred labels the claimer holds
    weigh most (one weight = one priority level), as the SQL statements pick it; None when
    `ready` is empty."""
    head = list(ready.values_list("pk", "claim_rank", "prefers")[:PREFER_WINDOW])
    if not head:
        return None
    return min(head, key=lambda row: (row[1] - score(row[2], capabilities) * AGING_SECONDS, row[1], row[0]))[0]


class _OrmPath:
    """claim_next, renew and complete through the ORM: read the row in a write transaction,
    judge it, then CAS (cas._swap) on its stage and version (and token hash)."""

    def claim_next(self, using: str, agent: str, ttl: timedelta, queue: str | None,
                   request: ClaimRequest | None, key_hash: str | None, scope: scopes.Scope,
                   look_up: bool = True, capabilities: Capabilities = ()) -> Claim | None:
        refused: set[str] = set()  # tasks a limit or resource refused in this call's earlier rounds
        for _ in range(RACE_RETRIES):
            try:
                with store(using).write_transaction():
                    _require_live_key(using, key_hash, agent)
                    if request is not None and look_up:
                        claim_requests.serialise(using, request)
                        made = claim_requests.made_by(using, request, agent)
                        if made is not None:
                            return _claim_of(*made)
                    now = clock.now(using)
                    # Queues and keys that take no claim now are left out of the pick; the
                    # move's slot (flow.take_slot) decides, so one that filled meanwhile rolls back.
                    ready = selectors.claimable_tasks(now, queue, scope=scope, capabilities=capabilities,
                                                      using=using)
                    if refused:
                        ready = ready.exclude(pk__in=list(refused))
                    preferred = _preferred_first(ready, capabilities) if capabilities else None
                    if preferred is not None:
                        ready = ready.filter(pk=preferred)
                    task = store(using).skip_locked(ready).first()
                    if task is None and preferred is not None:
                        refused.add(preferred)  # locked by another claimer: the next round picks past it
                        continue
                    if task is None:
                        outcomes.record(using, Verb.CLAIM, outcomes.EMPTY)
                        return None
                    won = _take(using, task, Verb.CLAIM, agent, ttl, now, request)
                    if won is not None:
                        return won
            except flow.AtLimit as at_limit:
                # A resource the pick could not see was busy for this task's need (a hold beside
                # a shared one: board.engine.resources), or a limit filled meanwhile: the next
                # round picks past it.
                refused.add(at_limit.task.pk)
                outcomes.record(using, Verb.CLAIM, outcomes.LOST_RACE)
        log.warning("claim_next by %s lost %d races in a row", agent, RACE_RETRIES)
        return None

    def renew(self, using: str, task_id: str, token: str, ttl: timedelta, checkpoint: Any,
              progress: float | None, agent: str | None, key_hash: str | None) -> Claim:
        def build(task: Task, now: datetime, token_hash: str):
            changes: dict[str, Any] = {"lease_expires_at": now + ttl}
            if checkpoint is not None:
                changes["checkpoint"] = checkpoint
            if progress is not None:
                changes["progress"] = progress
            # The progress deadline (board.engine.deadlines) counts from the last change of
            # progress or checkpoint; a renew that only repeats them is a heartbeat, not progress.
            # The CAS pins the version, so task.progress is the stored value (the SQL stores'
            # statements: a CASE).
            if checkpoint is not None or (progress is not None and progress != task.progress):
                changes["progress_changed_at"] = now
            # The guard re-checks expiry in the statement itself: check and extension are one step.
            if _swap(using, task, Verb.RENEW, now=now, actor=task.owner, token_hash=token_hash,
                     guard=Q(lease_expires_at__gt=now), **changes):
                return Claim(task=task, lease=Lease(token=token, fence=task.fence, expires_at=task.lease_expires_at))
            return None

        return _holder_move(using, task_id, token, build, live_only=True, agent=agent, key_hash=key_hash)

    def complete(self, using: str, task_id: str, token: str, result: Any, agent: str | None,
                 key_hash: str | None) -> Task:
        def build(task: Task, now: datetime, token_hash: str):
            # Without dependents when read, the CAS also pins has_dependents = false: a dependent
            # created meanwhile (transitions.create sets the flag in its transaction) makes this
            # CAS fail and the retry read the flag, so its admission cannot be skipped.
            guard = None if task.has_dependents else Q(has_dependents=False)
            ok = _swap(using, task, Verb.COMPLETE, now=now, actor=task.owner, token_hash=token_hash,
                       guard=guard, result=result, **NO_LEASE)
            if not ok:
                return None
            if task.has_dependents:
                _admit_dependents_after_commit(task.pk, using)
            return task

        return _holder_move(using, task_id, token, build, live_only=False, agent=agent, key_hash=key_hash)


_ORM_PATH = _OrmPath()
