"""The engine's one outward signal: "a change to the board has committed".

The engine moves rows and commits; it does not know who watches. Whatever wants to hear of a
commit (the live board's outbox tailer and its cross-process doorbell: board.live) subscribes
here when Django starts (board.apps), and the engine calls `after_commit(using)` inside each
transaction that changed a task. Subscribers run after the commit, in the committing thread:
they must return at once, and a subscriber that raises is logged, never seen by the writer
(whose change has committed already).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from board.engine.stores import store

log = logging.getLogger("board.engine.commits")

_subscribers: list[Callable[[], None]] = []


def subscribe(callback: Callable[[], None]) -> None:
    """Call `callback()` after every commit that changed the board: once per move that the
    transaction made (a failure and its retry announce twice), so a subscriber must not mind
    being called again for the same commit (the live board's only wakes a reader up)."""
    if callback not in _subscribers:
        _subscribers.append(callback)


def after_commit(using: str) -> None:
    """Inside a write transaction: announce the change once the transaction commits (nothing
    is announced if it rolls back)."""
    store(using).on_commit(_announce)


def _announce() -> None:
    for callback in tuple(_subscribers):
        try:
            callback()
        except Exception:  # noqa: BLE001  (the write committed; a watcher's failure is not its caller's)
            log.exception("a commit subscriber failed: %r", callback)
