"""The API's request body parser: `json.loads`, and for a body nested deeper than it can recurse
(about 900 levels, depending on the stack it starts from) the same JSON read without recursion.

Why: a JSON value nested past the cap (limits.MAX_JSON_DEPTH) must be refused as a 422
naming its field (board.api.schemas.JsonValue), whatever its depth. If `json.loads` raised
instead, django-ninja would answer "Cannot parse request body", naming nothing (and a few
levels shallower, an encoder further on would crash with a 500). So the body is read whole,
however deep, and the schemas judge it. Only bodies `json.loads` gives up on take the slow path;
the body's size is already capped (DATA_UPLOAD_MAX_MEMORY_SIZE).
"""
from __future__ import annotations

import json
import re
from typing import Any

from ninja.parser import Parser

# One token after optional JSON whitespace: a string, a structural character, or a scalar
# (number, true, false, null, and the NaN/Infinity that json.loads also takes). Each string and
# scalar is then decoded by json.loads itself, so escapes and numbers mean what they always do.
_TOKEN = re.compile(r"""[ \t\n\r]*(?:
    (?P<string>"(?:[^"\\\x00-\x1f]|\\.)*")
  | (?P<punct>[\[\]{}:,])
  | (?P<scalar>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null|NaN|-?Infinity)
)""", re.VERBOSE | re.DOTALL)
_TRAILING_SPACE = re.compile(r"[ \t\n\r]*\Z")


def loads_without_recursion(text: str) -> Any:
    """`json.loads(text)` for any depth: an explicit stack of the open arrays and objects.
    Raises ValueError for what is not one JSON value."""
    stack: list[list] = []  # open containers: [list] or [dict, the key being filled]
    root: list = []  # the finished value, once there is one
    expect = "value"  # value | value_or_end | key | key_or_end | colon | comma_or_end | end
    pos = 0

    def place(value: Any) -> None:
        if not stack:
            root.append(value)
        elif isinstance(stack[-1][0], list):
            stack[-1][0].append(value)
        else:
            stack[-1][0][stack[-1][1]] = value

    while True:
        match = _TOKEN.match(text, pos)
        if match is None:
            if expect == "end" and _TRAILING_SPACE.match(text, pos):
                return root[0]
            raise ValueError(f"not JSON at character {pos}")
        pos = match.end()
        kind, token = match.lastgroup, match.group(match.lastgroup)
        if kind == "punct" and token in "]}" and (
                expect == "comma_or_end" and isinstance(stack[-1][0], list if token == "]" else dict)
                or (expect, token) in (("value_or_end", "]"), ("key_or_end", "}"))):
            stack.pop()  # the container was placed in its parent when it opened
            expect = "comma_or_end" if stack else "end"
        elif expect in ("value", "value_or_end") and token in ("[", "{"):
            container: Any = [] if token == "[" else {}
            place(container)
            stack.append([container, None])
            expect = "value_or_end" if token == "[" else "key_or_end"
        elif expect in ("value", "value_or_end") and kind in ("string", "scalar"):
            place(json.loads(token))
            expect = "comma_or_end" if stack else "end"
        elif expect in ("key", "key_or_end") and kind == "string":
            stack[-1][1] = json.loads(token)
            expect = "colon"
        elif expect == "colon" and token == ":":
            expect = "value"
        elif expect == "comma_or_end" and token == ",":
            expect = "value" if isinstance(stack[-1][0], list) else "key"
        else:
            raise ValueError(f"unexpected {token[:20]!r} at character {match.start(kind)}")


class BodyParser(Parser):
    """django-ninja's parser, reading a body of any depth (see the module's docstring)."""

    def parse_body(self, request):
        try:
            return json.loads(request.body)
        except RecursionError:
            return loads_without_recursion(request.body.decode("utf-8"))
