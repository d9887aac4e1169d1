"""The board's concurrency criteria, exported so that any board (any database behind it) is judged
by the same code: `concurrent_claim`, `duplicate_token_submit` and `retried_claim` race real
threads released by a barrier and return the number of winners (of distinct leases for
`retried_claim`); the caller demands exactly 1. Any error but the expected loser's (Taken /
LeaseLost) raises `CriterionError`, never counted as a loser. docs/engine.md, "The criteria".
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import connections

from board.engine import errors, selectors, transitions
from board.engine.invariants import TaskSnapshot
from board.engine.transitions import Claim
from board.models import Task

# How long the barrier waits for every racer to be ready; a racer stuck longer is a fault.
BARRIER_TIMEOUT_SECONDS = 60


class Board(Protocol):
    """The storage-neutral board the criteria judge."""

    def snapshot(self) -> list[TaskSnapshot]: ...
    def claim(self, task_id: str, agent: str, ttl_seconds: float, request_id: str | None = None) -> Claim: ...
    def claim_next(self, agent: str, ttl_seconds: float, request_id: str | None = None) -> Claim | None: ...
    def renew(self, task_id: str, token: str, ttl_seconds: float) -> Claim: ...
    def release(self, task_id: str, token: str) -> Task: ...
    def complete(self, task_id: str, token: str, result: Any) -> Task: ...
    def prepare_thread(self) -> None: ...
    def end_thread(self) -> None: ...


@dataclass(frozen=True)
class DjangoBoard:
    """The board stored in the Django database `using` (an alias of settings.DATABASES)."""

    using: str = "default"

    def snapshot(self) -> list[TaskSnapshot]:
        return selectors.snapshot(using=self.using)

    def claim(self, task_id: str, agent: str, ttl_seconds: float, request_id: str | None = None) -> Claim:
        return transitions.claim(task_id, agent, ttl_seconds, request_id=request_id, using=self.using)

    def claim_next(self, agent: str, ttl_seconds: float, request_id: str | None = None) -> Claim | None:
        return transitions.claim_next(agent, ttl_seconds, request_id=request_id, using=self.using)

    def renew(self, task_id: str, token: str, ttl_seconds: float) -> Claim:
        return transitions.renew(task_id, token, ttl_seconds, using=self.using)

    def release(self, task_id: str, token: str) -> Task:
        return transitions.release(task_id, token, using=self.using)

    def complete(self, task_id: str, token: str, result: Any) -> Task:
        return transitions.complete(task_id, token, result, using=self.using)

    def prepare_thread(self) -> None:
        """Open this thread's own connection before the race starts, so that connecting is not
        part of the race (and a database that cannot be reached shows up as a fault)."""
        connections[self.using].ensure_connection()

    def end_thread(self) -> None:
        connections[self.using].close()


class CriterionError(Exception):
    """The criterion could not judge: an infrastructure fault (database error, timeout) or a
    loser that failed with an error other than the one the contract requires."""

    def __init__(self, message: str, faults: Sequence[BaseException]):
        self.faults = list(faults)
        detail = "; ".join(f"{type(f).__name__}: {f}" for f in self.faults[:5])
        more = f" (+{len(self.faults) - 5} more)" if len(self.faults) > 5 else ""
        super().__init__(f"{message}: {detail}{more}")


def _run_together(board: Board, calls: Sequence[Callable[[], Any]]) -> list[tuple[str, Any] | None]:
    """Run `calls` in threads released together by a barrier; each one's ("won", result) or
    ("raised", exception)."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def racer(i: int) -> None:
        try:
            try:
                board.prepare_thread()
            finally:
                # Always reach the barrier, even after a failed prepare, so nobody waits forever.
                barrier.wait(timeout=BARRIER_TIMEOUT_SECONDS)
            outcomes[i] = ("won", calls[i]())
        except BaseException as exc:  # classified below; nothing is swallowed
            outcomes[i] = ("raised", exc)
        finally:
            try:
                board.end_thread()
            except Exception as exc:  # a failing close is a fault too
                if outcomes[i] is None or outcomes[i][0] == "won":
                    outcomes[i] = ("raised", exc)

    threads = [threading.Thread(target=racer, args=(i,), name=f"racer-{i}") for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _race(board: Board, calls: Sequence[Callable[[], Any]], expected_loss: type[errors.BoardError]) -> int:
    """Run `calls` together; count successes, check losers' errors."""
    outcomes = _run_together(board, calls)
    winners = 0
    faults: list[BaseException] = []
    for outcome in outcomes:
        if outcome is None:
            faults.append(RuntimeError("a racer ended without an outcome"))
        elif outcome[0] == "won":
            winners += 1
        elif type(outcome[1]) is not expected_loss:
            faults.append(outcome[1])
    if faults:
        raise CriterionError(
            f"{len(faults)} of {len(calls)} racers failed with something other than {expected_loss.__name__}",
            faults,
        )
    return winners


def concurrent_claim(board: Board, task_id: str, agents: Sequence[str], ttl: float) -> int:
    """Let every agent claim `task_id` at the same moment; return how many succeeded.

    The contract demands exactly 1. Losers must get Taken (not Blocked or Terminal: those mean
    the agents never reached the contention this criterion is about); anything else raises
    CriterionError."""
    if len(agents) < 2:
        raise ValueError("a race needs at least two agents")
    calls = [lambda agent=agent: board.claim(task_id, agent, ttl) for agent in agents]
    return _race(board, calls, errors.Taken)


def duplicate_token_submit(board: Board, task_id: str, workers: int, ttl: float) -> int:
    """Claim `task_id` once (the store mints the token), then let `workers` submitters complete
    it with that same token at the same moment; return how many succeeded.

    The contract demands exactly 1: more means checking the token and writing the result are not
    one atomic step; 0 means even the true holder was refused. Losers must get LeaseLost;
    anything else raises CriterionError."""
    if workers < 2:
        raise ValueError("a race needs at least two workers")
    token = board.claim(task_id, "duplicate-token-holder", ttl).lease.token
    calls = [
        lambda i=i: board.complete(task_id, token, {"submitted_by": i}) for i in range(workers)
    ]
    return _race(board, calls, errors.LeaseLost)


def retried_claim(board: Board, agent: str, request_id: str, copies: int, ttl: float,
                  task_id: str | None = None) -> int:
    """Send `copies` copies of one claim (the same agent and request id; of `task_id`, or a
    claim-next when None) at the same moment, as a client retrying a claim whose answer it
    lost; return how many distinct leases they got.

    The contract demands exactly 1: every copy gets the same task, token and fence. More means
    a retried claim can take a second task (or a second lease); a copy that fails, or that
    finds no work while another copy claimed some, raises CriterionError."""
    if copies < 2:
        raise ValueError("a race needs at least two copies")
    if task_id is None:
        calls = [lambda: board.claim_next(agent, ttl, request_id) for _ in range(copies)]
    else:
        calls = [lambda: board.claim(task_id, agent, ttl, request_id) for _ in range(copies)]
    outcomes = _run_together(board, calls)
    faults: list[BaseException] = []
    for outcome in outcomes:
        if outcome is None:
            faults.append(RuntimeError("a copy ended without an outcome"))
        elif outcome[0] != "won":
            faults.append(outcome[1])
        elif outcome[1] is None:
            faults.append(RuntimeError("a copy found no work"))
    if faults:
        raise CriterionError(f"{len(faults)} of {copies} copies of one claim got no lease", faults)
    return len({(o[1].task.pk, o[1].lease.token, o[1].lease.fence) for o in outcomes})
