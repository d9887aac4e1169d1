"""Queue scopes of agent keys (issue 27): a key may be limited to the queues matching a few glob
patterns (`ci-*`, `docs`). Pure: parsing, matching, and the patterns as each store's query
language writes them. Who applies a scope: the API (board/api/auth.py) for reads and verbs
on one task, and the claim's own statement for claim-next (board.engine.transitions,
the SQL stores' statements, board.engine.stores), so that a scoped key never even picks another queue's task.

A pattern is a queue name in which `*` stands for any run of characters (none included) and
`?` for exactly one. Queue names are letters, digits and `._:-` only, so the only characters a
pattern can hold that a store's matcher treats specially are the wildcards themselves and `.`
(regex), `_` (LIKE): each translation below escapes what its language needs."""
from __future__ import annotations

import fnmatch
import re

from board.engine.limits import MAX_SCOPE_PATTERNS

# A scope: the patterns, or None for a key that may use every queue.
Scope = tuple[str, ...] | None

PATTERN = re.compile(r"^[A-Za-z0-9*?][A-Za-z0-9._:*?-]{0,99}$")


class BadScope(ValueError):
    """A scope that is not a comma-separated list of queue patterns."""


def parse(text: str | None) -> Scope:
    """`ci-*,docs` -> ("ci-*", "docs"); empty or None -> None (every queue). BadScope when a
    pattern is not a queue name with wildcards, or there are too many."""
    if text is None or not text.strip():
        return None
    patterns = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if len(patterns) > MAX_SCOPE_PATTERNS:
        raise BadScope(f"a key's queues are at most {MAX_SCOPE_PATTERNS} patterns")
    for pattern in patterns:
        if not PATTERN.match(pattern):
            raise BadScope(f"queue pattern {pattern!r}: 1-100 letters, digits and ._:- with * and ? as "
                           "wildcards, starting with a letter, digit or wildcard")
    return patterns


def stored(scope: Scope) -> str:
    """How AgentKey.queues keeps a scope: the patterns joined by commas; '' for every queue."""
    return ",".join(scope) if scope else ""


def allows(scope: Scope, queue: str) -> bool:
    """Whether a key with `scope` may see and act on tasks of `queue` (case-sensitive)."""
    return scope is None or any(fnmatch.fnmatchcase(queue, pattern) for pattern in scope)


def as_regex(pattern: str) -> str:
    """The pattern as an anchored regular expression, the same in Python, PostgreSQL and
    MongoDB (the ORM's __regex lookup): `.` escaped, `*` -> `.*`, `?` -> `.`."""
    return "^" + "".join({"*": ".*", "?": ".", ".": r"\."}.get(c, c) for c in pattern) + "$"


def as_like(pattern: str) -> str:
    """The pattern for PostgreSQL's LIKE (case-sensitive, `\\` escapes): `_` escaped, `*` -> `%`,
    `?` -> `_` (`%` and `\\` cannot occur in a queue pattern)."""
    return "".join({"*": "%", "?": "_", "_": r"\_"}.get(c, c) for c in pattern)


def as_glob(pattern: str) -> str:
    """The pattern for SQLite's GLOB (case-sensitive, unlike its LIKE): already one; `[`, GLOB's
    only other special character, cannot occur in a queue pattern."""
    return pattern
