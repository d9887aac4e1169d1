"""Pages of the API's lists: the page caps, and the cursor codec. A cursor is the sort key of a
page's last row, as URL-safe base64 JSON; it is client input like any other, so decoding checks
every part and refuses anything this API did not give out.
"""
from __future__ import annotations

from board.engine import errors, listing
from board.engine.limits import MAX_PAGE



# The codec is the task list's (board.engine.listing), which the events' cursors share.
encode_cursor = listing.encode_cursor
decode_cursor = listing.decode_cursor
cursor_after = listing.cursor_after
cursor_of = listing.cursor_of


def is_event_id(value) -> bool:
    return type(value) is int and 0 <= value < 2**63


def page_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise errors.InvalidRequest(f"limit must be from 1 to {MAX_PAGE}")
    return limit
