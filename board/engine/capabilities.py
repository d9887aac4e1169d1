"""Capabilities (issue 32, item 3): what an agent can do, and what a task needs of its taker.

An agent key carries `capabilities`, labels such as `python`, `gpu`, `model:opus`,
`repo:acme/web` (AgentKey.capabilities; `create_agent_key NAME --capabilities gpu,python`, the
Keys admin). A claim may narrow them (`capabilities` in the claim's body: a subset of the key's;
naming one the key lacks is 403). A task carries:

- `requires`: labels that must **all** be among the claimer's. Enforced inside the claim's own
  query on every store (the SQL stores' statements: stores/sqlite.py, stores/postgresql.py; the ORM path's pick:
  `Store.takeable`), like a key's queue scope: a claimer never even picks a task it cannot take. A
  claimer with no capabilities takes only tasks that require none.
- `prefers`: `{label: weight}` (weights 1..MAX_PREFER_WEIGHT; a list of labels is weight 1 each).
  For a claimer holding preferred labels, the task counts as that many priority levels higher
  (fairness.AGING_SECONDS each), but only among the first PREFER_WINDOW tasks this claimer
  could take, in line order: a bounded re-rank, so that a claim stays an index seek and a
  preference never lifts a task from the back of a long line. Claimers without capabilities
  skip the re-rank (nothing could score).

A task's requires and prefers are fixed at creation (a task's needs do not change under a claim
that read them), so a check of them outside the claim's transaction (a claim by id) cannot go
stale. A key's capabilities may be changed in the admin; the hot verbs trust a key this process
verified for up to agent_keys.VERIFIED_SECONDS, so a change reaches them within that minute.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from board.engine import errors
from board.engine.limits import (
    MAX_CAPABILITIES,
    MAX_CAPABILITY_CHARS,
    MAX_PREFER_WEIGHT,
    MAX_PREFERS,
    MAX_REQUIRES,
    PREFER_WINDOW,
)

__all__ = ["PREFER_WINDOW", "Capabilities", "BadCapabilities", "parse", "stored", "requires_list",
           "prefers_map", "satisfies", "missing", "score", "refuse_unless_fits", "narrowed", "as_json"]

# What a claimer holds: a sorted tuple of labels (empty: none).
Capabilities = tuple[str, ...]

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+=-]*$")
LABEL_RULE = (f"1-{MAX_CAPABILITY_CHARS} letters, digits and ._:/@+=- starting with a letter or digit "
              "(e.g. python, gpu, model:opus, repo:acme/web)")


class BadCapabilities(ValueError):
    """A key's capabilities that are not a comma-separated list of labels."""


def _label(value: Any, field: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CAPABILITY_CHARS or not LABEL.match(value):
        raise errors.InvalidRequest(f"{field}: {value!r} is not a capability label: {LABEL_RULE}", field=field)
    return value


def parse(text: str | Iterable[str] | None) -> Capabilities:
    """A key's capabilities from `gpu, python` (or a list): sorted, each once. BadCapabilities
    when a label is malformed or there are more than MAX_CAPABILITIES."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    labels = sorted({item.strip() for item in items if isinstance(item, str) and item.strip()}
                    | {item for item in items if not isinstance(item, str)})
    if len(labels) > MAX_CAPABILITIES:
        raise BadCapabilities(f"a key has at most {MAX_CAPABILITIES} capabilities")
    for label in labels:
        if not isinstance(label, str) or len(label) > MAX_CAPABILITY_CHARS or not LABEL.match(label):
            raise BadCapabilities(f"capability {label!r}: {LABEL_RULE}")
    return tuple(labels)


def stored(capabilities: Capabilities) -> str:
    """How AgentKey.capabilities keeps them: joined by commas; '' for none."""
    return ",".join(capabilities)


def requires_list(value: Any) -> list[str] | None:
    """A task's `requires` as stored: a sorted list of labels, or None for none (an empty list
    too: the claim statements test `requires IS NULL` for the tasks anybody may take)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise errors.InvalidRequest("requires must be a list of capability labels", field="requires")
    labels = sorted({_label(item, "requires") for item in value})
    if len(labels) > MAX_REQUIRES:
        raise errors.InvalidRequest(f"requires has at most {MAX_REQUIRES} labels", field="requires")
    return labels or None


def prefers_map(value: Any) -> dict[str, int] | None:
    """A task's `prefers` as stored: {label: weight}, or None. A list of labels is weight 1 each."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = {item: 1 for item in value} if all(isinstance(item, str) for item in value) else value
    if not isinstance(value, dict):
        raise errors.InvalidRequest("prefers must be {label: weight} or a list of labels", field="prefers")
    if len(value) > MAX_PREFERS:
        raise errors.InvalidRequest(f"prefers has at most {MAX_PREFERS} labels", field="prefers")
    checked = {}
    for label, weight in value.items():
        _label(label, "prefers")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_PREFER_WEIGHT:
            raise errors.InvalidRequest(f"prefers: the weight of {label!r} must be a whole number from 1 to "
                                        f"{MAX_PREFER_WEIGHT}", field="prefers")
        checked[label] = weight
    return dict(sorted(checked.items())) or None


def satisfies(requires: Iterable[str] | None, capabilities: Iterable[str]) -> bool:
    """Whether a claimer holding `capabilities` may take a task requiring `requires`."""
    return not requires or set(requires) <= set(capabilities)


def missing(requires: Iterable[str] | None, capabilities: Iterable[str]) -> list[str]:
    """The labels of `requires` the claimer lacks, sorted."""
    return sorted(set(requires or ()) - set(capabilities))


def score(prefers: dict[str, int] | None, capabilities: Iterable[str]) -> int:
    """How many priority levels `prefers` is worth to a claimer holding `capabilities`."""
    held = set(capabilities)
    return sum(weight for label, weight in (prefers or {}).items() if label in held)


def refuse_unless_fits(task, capabilities: Capabilities) -> None:
    """A claim or resume of this one task by a claimer holding `capabilities`: 403 `forbidden`
    unless every label the task requires is among them (a task's requires never change, so
    this check needs no transaction)."""
    lacking = missing(task.requires, capabilities)
    if lacking:
        raise errors.Forbidden(f"task {task.pk} requires the capabilities {', '.join(task.requires)}; this claimer "
                               f"lacks {', '.join(lacking)} (it holds: {', '.join(capabilities) or 'none'})",
                               task=task)


def narrowed(held: Capabilities, asked: Any) -> Capabilities:
    """A claim's capabilities: the key's (`held`), or the subset the claim names (`asked`).
    Naming a label the key lacks is 403: a claim narrows its key, never widens it."""
    if asked is None:
        return held
    if not isinstance(asked, (list, tuple)):
        raise errors.InvalidRequest("capabilities must be a list of labels", field="capabilities")
    labels = sorted({_label(item, "capabilities") for item in asked})
    lacking = sorted(set(labels) - set(held))
    if lacking:
        raise errors.Forbidden(f"this key does not carry the capabilities {', '.join(lacking)} "
                               f"(it carries: {', '.join(held) or 'none'}); a claim may only narrow its key's")
    return tuple(labels)


def as_json(capabilities: Capabilities) -> str:
    """The claimer's labels as a JSON array: the SQL statements' parameter."""
    return json.dumps(list(capabilities))
