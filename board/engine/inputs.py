"""The input rules every caller meets, written once: names (task ids, queues, agents), text a
database can store, and JSON values (`json_field`: encoded once, size and depth checked).

Each rule raises `errors.InvalidRequest` (422) or `errors.TooLarge` (413) carrying the `field`
it is about; the caps are board.engine.limits'. Pure: no Django, no I/O.
"""
from __future__ import annotations

import json
import re
from typing import Any

from board.engine import errors
from board.engine.limits import MAX_JSON_DEPTH, MAX_JSON_FIELD_BYTES, MAX_NAME_CHARS, MAX_OWNER_CHARS, MAX_REASON_CHARS

# A task id, and a queue or agent key's name: 1-100 letters, digits and ._:-, starting with a
# letter or digit. Written here only: the API's schemas take TASK_ID_PATTERN, the engine TASK_ID_RE.
TASK_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_NAME_CHARS - 1}}}$"
TASK_ID_RE = re.compile(TASK_ID_PATTERN)
NAME_RULE = f"1-{MAX_NAME_CHARS} letters, digits and ._:- starting with a letter or digit"


def is_valid_task_id(task_id: object) -> bool:
    return isinstance(task_id, str) and TASK_ID_RE.fullmatch(task_id) is not None


def agent_name(agent: str) -> str:
    """`agent` as the engine takes it for a lease's owner (MAX_OWNER_CHARS, the owner column)."""
    if not isinstance(agent, str) or not agent.strip() or len(agent) > MAX_OWNER_CHARS:
        raise errors.InvalidRequest(f"agent must be a non-empty name of at most {MAX_OWNER_CHARS} characters")
    return agent


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


def key_text(value: object, field: str, max_chars: int) -> str | None:
    """A key a task names (a concurrency key, a dedup key): 1 to `max_chars` printable
    characters, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars or not value.isprintable():
        raise errors.InvalidRequest(f"{field} must be 1 to {max_chars} printable characters", field=field)
    return value


def reason_text(reason: object) -> None:
    """An operator's reason (kept in a history row: a task's, or a queue's) meets its cap,
    whoever calls: the API's schemas check it too; a command or the admin does not go through
    them."""
    if not isinstance(reason, str):
        raise errors.InvalidRequest("reason must be text", field="reason")
    if len(reason) > MAX_REASON_CHARS:
        raise errors.InvalidRequest(f"reason must be at most {MAX_REASON_CHARS} characters", field="reason")
    if problem := unstorable_text(reason):
        raise errors.InvalidRequest(f"reason {problem}", field="reason")


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


def json_field(name: str, value: Any) -> str | None:
    """Refuse a payload, result or checkpoint (`name`, carried by the error) nested more than
    MAX_JSON_DEPTH deep (InvalidRequest), that is not strict JSON (NaN, Infinity, a set, a
    cycle: InvalidRequest, before the database refuses it less helpfully), or over
    MAX_JSON_FIELD_BYTES of compact JSON (TooLarge). The depth first: encoding a value nested
    ~1,000 deep raises RecursionError. Returns the compact JSON text (None for None), encoded
    once."""
    if value is None:
        return None
    if problem := json_too_deep(value):
        raise errors.InvalidRequest(f"{name} {problem}", field=name)
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as not_strict:
        # Only on a refusal, the order of the two checks this replaced: the size (NaN counted as
        # text) before strictness, each with its own message.
        try:
            size = len(json.dumps(value, separators=(",", ":")).encode())
        except (TypeError, ValueError) as exc:
            raise errors.InvalidRequest(f"{name} is not valid JSON: {exc}", field=name) from None
        _refuse_size(name, size)
        raise errors.InvalidRequest(f"{name} is not valid JSON: {not_strict}", field=name) from None
    _refuse_size(name, len(text.encode()))
    return text


def _refuse_size(name: str, size: int) -> None:
    if size > MAX_JSON_FIELD_BYTES:
        raise errors.TooLarge(f"{name} is {size} bytes of JSON; the limit is {MAX_JSON_FIELD_BYTES}", field=name)
