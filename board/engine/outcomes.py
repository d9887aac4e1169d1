"""The engine's second outward signal: what became of each move. Like `board.engine.commits`,
the engine does not know who listens: the metrics (board.metrics) subscribe when Django starts
(board.apps), so the engine never imports prometheus.

Transitions call `record(using, verb, outcome, code)`:

| outcome     | when                                                                  | code              |
|-------------|-----------------------------------------------------------------------|-------------------|
| `won`       | a move was made: one per history row written (after its commit)      | ""                |
| `lost_race` | a compare-and-swap matched no row: another writer moved the task first (the verb re-reads, then tries again or is refused) | "" |
| `refused`   | a call was refused with an error (nothing written; `refusals`)        | the error's code  |
| `empty`     | claim_next found no ready task                                        | ""                |
| `expired`   | a lease that had expired was taken back (after its commit)            | who took it: `reaper` or `claim` (a takeover) |
| `terminal`  | a failure left the task FAILED for good (after its commit)            | `not_retryable`, `attempts_spent`, `lease_expired` or `deadline` (board.engine.deadlines) |

`won`, `expired` and `terminal` are told only once the transaction commits (a move rolled back,
or retried after a MongoDB write conflict, is never counted); the others at once. Observers run
in the calling thread and must return at once (a counter increment); one that raises is logged,
never seen by the caller.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from board.engine import errors
from board.engine.stores import store

log = logging.getLogger("board.engine.outcomes")

WON, LOST_RACE, REFUSED, EMPTY, EXPIRED, TERMINAL = "won", "lost_race", "refused", "empty", "expired", "terminal"
_AFTER_COMMIT = frozenset({WON, EXPIRED, TERMINAL})

_observers: list[Callable[[str, str, str, int], None]] = []


def subscribe(observer: Callable[[str, str, str, int], None]) -> None:
    """Call `observer(verb, outcome, code, count)` for every outcome recorded."""
    if observer not in _observers:
        _observers.append(observer)


def record(using: str, verb: str, outcome: str, code: str = "", count: int = 1) -> None:
    """Tell the observers; `won`, `expired` and `terminal` once the transaction commits."""
    if not _observers:
        return
    if outcome in _AFTER_COMMIT:
        store(using).on_commit(lambda: _tell(str(verb), outcome, code, count))
    else:
        _tell(str(verb), outcome, code, count)


def _tell(verb: str, outcome: str, code: str, count: int) -> None:
    for observer in tuple(_observers):
        try:
            observer(verb, outcome, code, count)
        except Exception:  # a counter's failure is not the mover's
            log.exception("an outcome observer failed: %r", observer)


def refusals(verb: str):
    """Decorator for a public verb: a BoardError it raises is recorded as `refused` with the
    error's code (and raised on). Put it above `retry_conflicts`: one record per call."""

    def wrap(function):
        @functools.wraps(function)
        def verb_call(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except errors.BoardError as exc:
                record(kwargs.get("using", "default"), verb, REFUSED, exc.code)
                raise

        return verb_call

    return wrap
