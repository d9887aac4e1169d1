"""Pages of the API's lists: the page caps, and the cursor codec. A cursor is the sort key of a
page's last row, as URL-safe base64 JSON; it is client input like any other, so decoding checks
every part and refuses anything this API did not give out.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime

from board.api import reads
from board.engine import errors
from board.engine.inputs import is_valid_task_id
from board.engine.limits import MAX_CURSOR_CHARS, MAX_PAGE
from board.models import Task



def encode_cursor(*parts) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")




def decode_cursor(cursor: str, *checks) -> list:
    """The parts of a cursor this API gave out, each passing its check, or InvalidRequest: a
    cursor is client input like any other."""
    parts = None
    if len(cursor) <= MAX_CURSOR_CHARS:
        try:
            parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        except (ValueError, binascii.Error, RecursionError):  # RecursionError: nested [[[[...]]]]
            parts = None
    if isinstance(parts, list) and len(parts) == len(checks) and all(
            check(part) for check, part in zip(checks, parts, strict=True)):
        return parts
    raise errors.InvalidRequest("cursor is not one this API gave out")


def is_event_id(value) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _is_timestamp(value) -> bool:
    try:
        return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def page_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise errors.InvalidRequest(f"limit must be from 1 to {MAX_PAGE}")
    return limit


def _is_rank(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


# A page's cursor is the sort key of its last task: (created_at, id) for the default order,
# ("claim", claim_rank, id) for order=claim. The leading "claim" (and the length)
# keep a cursor to the order that gave it out: passed with the other order it is refused.
_CURSOR_CHECKS = {
    "created": (_is_timestamp, is_valid_task_id),
    "claim": ("claim".__eq__, _is_rank, is_valid_task_id),
}


def cursor_after(cursor: str, order: str) -> tuple:
    """The list_key (selectors) a cursor of `order` resumes after."""
    parts = decode_cursor(cursor, *_CURSOR_CHECKS[order])
    if order == "claim":
        _, rank, last_id = parts
        return float(rank), last_id
    created_at, last_id = parts
    return datetime.fromisoformat(created_at), last_id


def cursor_of(task: Task, order: str) -> str:
    key = [value.isoformat() if isinstance(value, datetime) else value for value in reads.list_key(task, order)]
    return encode_cursor(*(["claim", *key] if order == "claim" else key))
