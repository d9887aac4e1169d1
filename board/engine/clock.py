"""Where the engine's "now" comes from: the store's clock (board.engine.stores), so that lease
expiries mean the same thing to every process that reads them. PostgreSQL's and MongoDB's
clocks serve every server process on any host; SQLite's is this process's (an embedded store
lives on one machine). Each store says how it reads its clock: docs/stores.md."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from board.engine.stores import store


def in_query(using: str = "default") -> datetime | Any:
    """"Now" for an ORM filter, read by the query itself where the store can (PostgreSQL's
    statement_timestamp(): no round trip of its own), else the store's time read first."""
    return store(using).now_in_query()


def now(using: str = "default") -> datetime:
    """The store's current time (aware)."""
    return store(using).now()
