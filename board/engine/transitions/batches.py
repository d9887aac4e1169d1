"""Several moves in one call (issue 34): a holder's finishing move followed by the next claim
(complete, fail or release with `next`), a batch of claims, a batch of completions. Each move is
the verb of board.engine.transitions.leases, with its own compare-and-swap, errors and flow
control; what this module adds is how the moves share a transaction.

- Where the store allows it (`Store.moves_share_a_transaction`: SQLite and PostgreSQL), the
  moves of one call run in one write transaction: the finishing move and the next claim commit
  together or not at all, and a batch of claims is one transaction. A move refused inside it
  (flow.AtLimit) rolls back alone (a savepoint). On PostgreSQL two such transactions may lock
  the rows of two queues (or concurrency keys) in opposite orders; the deadlock detector then
  rolls one back whole (or a lone claim waiting in line for one of those rows), and it runs
  again (`Store.lost_a_lock_race`, retry_conflicts). On the SQL stores' statements path a completion and its next claim (without a request id), and a
  batch of claims, are the verbs' statements in one transaction of them (`Statements.several`:
  SQLite's BEGIN IMMEDIATE, PostgreSQL's atomic), with no savepoint; the other combinations
  nest the verbs themselves in the store's write transaction.
- Elsewhere (MongoDB, whose nested blocks have no savepoint) each move is a transaction of its
  own: the finishing move commits first; a claim that then fails leaves it committed and claims
  nothing (the call answers `next` null, and the failure is logged).

A batch of completions: each item is its own compare-and-swap, and one refused item writes
nothing, so it undoes nothing. On SQLite the items' statements share one transaction (one
BEGIN IMMEDIATE and COMMIT for the batch); on PostgreSQL the statements of the items whose task
holds nothing to give back (slot, key, resource) share one, and each other item has its own
(`Statements.completions_share_a_transaction`); an item that matched nothing runs again as
complete() alone. On MongoDB each item is complete(), its own transaction.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from board.engine import claim_requests, errors, outcomes, scopes, tracing
from board.engine.capabilities import Capabilities
from board.engine.inputs import agent_name, is_valid_task_id, json_field
from board.engine.lifecycle import Verb
from board.engine.limits import MAX_CLAIM_BATCH, MAX_COMPLETE_BATCH
from board.engine.stores import retry_conflicts, store
from board.engine.transitions.leases import (
    _StatementPath,
    _claim_of,
    _path,
    _require_live_key,
    claim_next,
    complete,
    fail,
    release,
)
from board.engine.transitions.cas import Claim, _ttl
from board.models import Task

log = logging.getLogger("board.engine.transitions")


@dataclass(frozen=True)
class NextClaim:
    """The claim a finishing move is followed by: claim_next's arguments."""

    ttl_seconds: float
    queue: str | None = None
    request_id: str | None = None


def _check_claim(agent: str, ttl_seconds: float, queue: str | None, request_id: str | None) -> None:
    """What claim_next refuses with InvalidRequest, checked before anything is written."""
    _ttl(ttl_seconds)
    agent_name(agent)
    if queue is not None and not is_valid_task_id(queue):
        raise errors.InvalidRequest(f"invalid queue name {queue!r}")
    claim_requests.of(agent, request_id)


@contextmanager
def _shared(using: str) -> Iterator[bool]:
    """One write transaction for the moves made inside, where the store allows it (yields True);
    otherwise nothing (yields False: each move makes its own)."""
    the_store = store(using)
    if not the_store.moves_share_a_transaction:
        yield False
        return
    with the_store.write_transaction():
        yield True


def _statements_of(using: str) -> _StatementPath | None:
    """The store's statements path when it has one (the SQL stores): the moves of a call then
    run as its statements in one transaction of them (_StatementPath.complete_and_claim,
    claim_batch), without the ORM path's savepoints."""
    path = _path(using)
    return path if isinstance(path, _StatementPath) else None


# ---------------------------------------------------------------------------------------------
# A finishing move, then the next claim


class Finished(NamedTuple):
    """What a finishing move with `next` made: the task it finished, and the next claim (None:
    no task was ready)."""

    task: Task
    next: Claim | None


def complete_and_claim(task_id: str, token: str, result: Any, next_claim: NextClaim, *, agent: str,
                       key_hash: str | None = None, scope: scopes.Scope = None, capabilities: Capabilities = (),
                       using: str = "default") -> Finished:
    """complete(), then claim_next() for the same agent: (the completed task, the next claim or
    None when no task was ready). Refused completion: its error, and nothing is claimed."""
    if next_claim.request_id is None and _statements_of(using) is not None:
        return _complete_and_claim(task_id, token, result, next_claim, agent=agent, key_hash=key_hash, scope=scope,
                                   capabilities=capabilities, using=using)
    return _then_claim(
        lambda: complete(task_id, token, result, agent=agent, key_hash=key_hash, using=using),
        next_claim, agent, key_hash, scope, capabilities, using=using)


def fail_and_claim(task_id: str, token: str, error: str, next_claim: NextClaim, *, retryable: bool = True,
                   traceback: str | None = None, agent: str, key_hash: str | None = None,
                   scope: scopes.Scope = None, capabilities: Capabilities = (), using: str = "default") -> Finished:
    """fail(), then claim_next() (as complete_and_claim)."""
    return _then_claim(
        lambda: fail(task_id, token, error, retryable=retryable, traceback=traceback, agent=agent,
                            using=using),
        next_claim, agent, key_hash, scope, capabilities, using=using)


def release_and_claim(task_id: str, token: str, next_claim: NextClaim, *, retry_after_seconds: float | None = None,
                      agent: str, key_hash: str | None = None, scope: scopes.Scope = None,
                      capabilities: Capabilities = (), using: str = "default") -> Finished:
    """release(), then claim_next() (as complete_and_claim). The released task may be the one
    claimed next, when it is the first ready task."""
    return _then_claim(
        lambda: release(task_id, token, retry_after_seconds=retry_after_seconds, agent=agent, using=using),
        next_claim, agent, key_hash, scope, capabilities, using=using)


@tracing.traced(Verb.COMPLETE)
@outcomes.refusals(Verb.COMPLETE)
@retry_conflicts
def _complete_and_claim(task_id: str, token: str, result: Any, next_claim: NextClaim, *, agent: str,
                        key_hash: str | None, scope: scopes.Scope, capabilities: Capabilities = (),
                        using: str = "default") -> Finished:
    """complete_and_claim on a store's statements: the completion's and the claim's statements
    in one transaction of them."""
    if result is None:
        raise errors.InvalidRequest("result is required (use {} for a task with no output)", field="result")
    json_field("result", result)
    _check_claim(agent, next_claim.ttl_seconds, next_claim.queue, None)
    queue = next_claim.queue
    if scope is not None and queue is not None:
        if not scopes.allows(scope, queue):
            return Finished(complete(task_id, token, result, agent=agent, key_hash=key_hash, using=using), None)
        scope = None
    return Finished(*_statements_of(using).complete_and_claim(
        using, task_id, token, result, agent, key_hash, _ttl(next_claim.ttl_seconds), queue, scope, capabilities))


@retry_conflicts
def _then_claim(finish: Callable[[], Task], next_claim: NextClaim, agent: str, key_hash: str | None,
                scope: scopes.Scope, capabilities: Capabilities = (), using: str = "default") -> Finished:
    _check_claim(agent, next_claim.ttl_seconds, next_claim.queue, next_claim.request_id)

    def claim() -> Claim | None:
        return claim_next(agent, next_claim.ttl_seconds, queue=next_claim.queue, request_id=next_claim.request_id,
                          key_hash=key_hash, scope=scope, capabilities=capabilities, using=using)

    with _shared(using) as shared:
        task = finish()
        if shared:
            return Finished(task, claim())
    # Two transactions: the finishing move has committed. A claim that fails now claimed nothing
    # (its own transaction rolled back): the caller gets its finished task and no next one.
    try:
        return Finished(task, claim())
    except Exception:  # noqa: BLE001  (logged; the finishing move stands)
        log.exception("the claim after %s's finishing move failed; it stays finished and nothing was claimed",
                      task.pk)
        return Finished(task, None)


# ---------------------------------------------------------------------------------------------
# A batch of claims


def _check_max_tasks(max_tasks: Any) -> None:
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or not 1 <= max_tasks <= MAX_CLAIM_BATCH:
        raise errors.InvalidRequest(f"max_tasks must be a whole number from 1 to {MAX_CLAIM_BATCH}", field="max_tasks")


@tracing.traced(Verb.CLAIM, names_task=False)
@outcomes.refusals(Verb.CLAIM)
@retry_conflicts
def claim_batch(agent: str, ttl_seconds: float, max_tasks: int, *, queue: str | None = None,
                request_id: str | None = None, key_hash: str | None = None, scope: scopes.Scope = None,
                capabilities: Capabilities = (), using: str = "default") -> list[Claim]:
    """Up to `max_tasks` claims of claim_next for `agent`, in claim order, each its own lease
    (token, fence, expiry); stops at the first that finds no ready task. Each claim goes through
    claim_next's own compare-and-swap and flow control, so a batch never takes more than a
    queue's or a key's limit or a rate allows.

    With `request_id`: every lease of the batch records the request; a call with the same id
    while any of them is live returns those still live (same tasks, tokens, fences), in claim
    order, and claims nothing more. On a store whose moves share a transaction the lookup and the
    claims are one transaction, serialised per request as a single claim's are; elsewhere
    (MongoDB) the lookup is serialised but each claim commits alone, so a copy sent while the
    first is still claiming gets the leases made so far."""
    _check_max_tasks(max_tasks)
    _check_claim(agent, ttl_seconds, queue, request_id)
    ttl = _ttl(ttl_seconds)
    if scope is not None and queue is not None:
        if not scopes.allows(scope, queue):
            _require_live_key(using, key_hash, agent)
            return []
        scope = None
    request = claim_requests.of(agent, request_id)
    hot = _statements_of(using)
    if request is None and hot is not None:
        return hot.claim_batch(using, agent, ttl, max_tasks, queue, key_hash, scope, capabilities)
    path = _path(using)
    with _shared(using):
        if request is not None:
            with store(using).write_transaction():
                _require_live_key(using, key_hash, agent)
                claim_requests.serialise(using, request)
                made = claim_requests.all_made_by(using, request, agent)
            if made:
                return [_claim_of(task, token) for task, token in made]
        claims: list[Claim] = []
        while len(claims) < max_tasks:
            claim = path.claim_next(using, agent, ttl, queue, request, key_hash, scope, look_up=False,
                                    capabilities=capabilities)
            if claim is None:
                break
            claims.append(claim)
    return claims


# ---------------------------------------------------------------------------------------------
# A batch of completions


@dataclass(frozen=True)
class CompleteItem:
    task_id: str
    token: str
    result: Any


def check_complete_items(items: Sequence[CompleteItem]) -> None:
    """InvalidRequest, before anything is written, for a batch that is empty, too long, names a
    task twice, or carries an item complete() would refuse for its input (a null result, JSON
    too deep or too large)."""
    if not items:
        raise errors.InvalidRequest("items must hold at least one completion", field="items")
    if len(items) > MAX_COMPLETE_BATCH:
        raise errors.InvalidRequest(f"at most {MAX_COMPLETE_BATCH} completions in one call", field="items")
    seen: set[str] = set()
    for n, item in enumerate(items):
        if item.task_id in seen:
            raise errors.InvalidRequest(f"task {item.task_id} appears twice in the batch", field="items")
        seen.add(item.task_id)
        if not isinstance(item.token, str) or not item.token:
            raise errors.InvalidRequest(f"item {n}: token is required", field="token")
        if item.result is None:
            raise errors.InvalidRequest(f"item {n}: result is required (use {{}} for a task with no output)",
                                        field="result")
        json_field("result", item.result)


def complete_batch(items: Sequence[CompleteItem], *, agent: str | None = None, key_hash: str | None = None,
                   using: str = "default") -> list[Task | errors.BoardError]:
    """complete() each item, in order, each its own compare-and-swap: per item, the completed
    task or the error that refused it (lease_lost, forbidden, not_found, ...). One refused item
    undoes nothing: it wrote nothing. The batch as a whole is checked first
    (check_complete_items): a bad batch is refused whole and nothing is written.

    On SQLite and PostgreSQL the store's statement runs for each item (_StatementPath.complete_batch:
    one transaction for them all on SQLite; on PostgreSQL one for the items holding nothing to give
    back, one each for the others; the Statements.completions_share_a_transaction comment says
    why); an item whose statement matched
    nothing is then run again as complete() alone, which makes the move if it has become legal
    or says why not. On MongoDB each item is complete()."""
    check_complete_items(items)
    hot = _statements_of(using)
    if hot is None:
        # A key gone before the batch refuses the whole call (KeyRevoked: 401), as it would one
        # completion; gone during it, the items after are refused one by one. Each completion
        # checks the key before its lease, so the first item's KeyRevoked is the call's (it wrote
        # nothing): no query of the key's own per batch.
        done = [_complete_one(items[0], agent, key_hash, using)]
        if isinstance(done[0], errors.KeyRevoked):
            raise done[0]
        return done + [_complete_one(item, agent, key_hash, using) for item in items[1:]]
    made = hot.complete_batch([(item.task_id, item.token, item.result) for item in items], agent, key_hash,
                              using=using)
    if not any(made):
        # The statements check the key too: nothing matched, so a gone key refuses the call whole.
        _require_live_key(using, key_hash, agent)
    return [task if task is not None else _complete_one(item, agent, key_hash, using)
            for item, task in zip(items, made)]


def _complete_one(item: CompleteItem, agent: str | None, key_hash: str | None, using: str) -> Task | errors.BoardError:
    try:
        return complete(item.task_id, item.token, item.result, agent=agent, key_hash=key_hash, using=using)
    except errors.BoardError as refused:
        return refused
