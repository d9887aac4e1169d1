"""How the API's answers become bytes: orjson, with the values json.dumps and django-ninja's
encoder would have written.

django-ninja's JSONRenderer (json.dumps with NinjaJSONEncoder) cost 0.062 ms of a
complete-and-claim-next request's 1.006 ms, and 0.192 of a batch of ten's 2.098
(bench/api_cost.py's "rendering", SQLite); orjson, 0.027-0.031 and 0.081-0.110 (two runs). It
writes the same JSON values: the same keys, strings, numbers and nulls, datetimes as Django writes them
(milliseconds, "Z" for UTC: handed to Django's encoder by OPT_PASSTHROUGH_DATETIME, since
orjson's own form keeps microseconds). What differs is only the spelling JSON leaves free: no
spaces after "," and ":", non-ASCII text as UTF-8 instead of \\u escapes, exponents written
shortest (1e-7, not 1e-07). A client parses the same document. A value orjson refuses (an
integer beyond 64 bits) is rendered by json.dumps, as before.
"""
from __future__ import annotations

import datetime
import json
from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

# Datetimes handed to _default (Django's form, not orjson's); keys that are not
# strings (an int key of a payload) written as json.dumps writes them: as strings.
OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
_django_default = DjangoJSONEncoder().default
_ninja_default = NinjaJSONEncoder().default


def _default(value: Any) -> Any:
    """What orjson does not write itself: datetimes by Django's encoder (straight to it: a batch's
    answer holds dozens), the rest by django-ninja's (pydantic models, Decimal, durations, ...)."""
    if isinstance(value, datetime.datetime):
        return _django_default(value)
    return _ninja_default(value)


def dumps(data: Any) -> bytes:
    """`data` as the API's JSON bytes."""
    try:
        return orjson.dumps(data, default=_default, option=OPTIONS)
    except orjson.JSONEncodeError:
        # An integer over 64 bits (json writes any), or a value neither knows (json raises
        # its own TypeError, as before).
        return json.dumps(data, cls=NinjaJSONEncoder).encode()


class Renderer(JSONRenderer):
    """The NinjaAPI's renderer (board/api/main.py) and the one board/api/errors.py answers with."""

    def render(self, request, data: Any, *, response_status: int) -> bytes:
        return dumps(data)
