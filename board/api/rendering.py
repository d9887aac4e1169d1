"""How the API's answers become bytes: orjson, with the values json.dumps and django-ninja's
encoder would have written.

django-ninja's JSONRenderer (json.dumps with NinjaJSONEncoder) cost 0.062 ms of a
complete-and-claim-next request's 1.006 ms, and 0.192 of a batch of ten's 2.098 (bench/api_cost.py's
"rendering", SQLite); orjson, 0.025 and 0.078 in the same run. It writes the same JSON values: the same keys, strings,
numbers and nulls, datetimes as Django writes them (milliseconds, "Z" for UTC: handed to
`_default` by OPT_PASSTHROUGH_DATETIME, since orjson's own form keeps microseconds). What
differs is only the spelling JSON leaves free: no spaces after "," and ":", non-ASCII text as
UTF-8 instead of \\u escapes, exponents written shortest (1e-7, not 1e-07). A client parses the
same document. A value orjson refuses (an integer beyond 64 bits) is rendered by json.dumps,
as before.
"""
from __future__ import annotations

import datetime
from typing import Any

import orjson
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

# Keys that are not strings (an int key of a payload) written as json.dumps writes them: as strings.
OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
_NINJA = NinjaJSONEncoder()


def _default(value: Any) -> Any:
    """What orjson does not write itself: datetimes (Django's form), then what django-ninja's
    encoder knows (pydantic models, Decimal, UUID, durations, lazy strings, ...)."""
    if isinstance(value, datetime.datetime):
        text = value.isoformat()
        if value.microsecond:  # DjangoJSONEncoder: milliseconds
            text = text[:23] + text[26:]
        if text.endswith("+00:00"):
            text = text[:-6] + "Z"
        return text
    return _NINJA.default(value)


def dumps(data: Any) -> bytes:
    """`data` as the API's JSON bytes."""
    try:
        return orjson.dumps(data, default=_default, option=OPTIONS)
    except orjson.JSONEncodeError:
        # An integer over 64 bits (json writes any), or a value neither knows (json raises
        # its own TypeError, as before).
        return JSONRenderer().render(None, data, response_status=200).encode()


class Renderer(JSONRenderer):
    """The NinjaAPI's renderer (board/api/main.py) and the one board/api/errors.py answers with."""

    def render(self, request, data: Any, *, response_status: int) -> bytes:
        return dumps(data)
