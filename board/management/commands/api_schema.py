"""The agents' API as a committed contract: board/api/openapi.json, and what may change in it.

    DEBUG=1 .venv/bin/python manage.py api_schema            # print the current schema
    DEBUG=1 .venv/bin/python manage.py api_schema --write    # write it to board/api/openapi.json
    DEBUG=1 .venv/bin/python manage.py api_schema --check    # compare it with the committed file

(DEBUG=1 only so that it runs in any checkout without a SECRET_KEY; the schema is the same.)

The file is the NinjaAPI's own OpenAPI document (what /api/openapi.json serves), with sorted keys
and a fixed indent so that it is the same byte for byte on every machine, plus one extension:
`x-error-codes`, every `error.code` the API can answer (the schema's `code` is a plain string).

The rule (docs/api.md, "API stability"): within /api/, changes are additive only; a change that could
break an existing client goes to a new version prefix instead. `compare(old, new)` sorts the
differences into breaking ones (a removed path, method, parameter, request or response field,
enum value or error code; a new required request field or parameter; a request type narrowed: a
type changed, a maximum lowered, a minimum raised, a pattern or format added; a response field
that may now be missing or of another type) and additive ones (a new path, method, optional
parameter or request field, response field, enum value or error code; a request type widened).
tests/test_api_schema.py fails on a breaking change, and on an additive one until the committed
file is regenerated.
"""
from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

SCHEMA_FILE = Path(settings.BASE_DIR) / "board" / "api" / "openapi.json"
# DEBUG=1: the development settings, so that it runs in any checkout (no SECRET_KEY needed).
REGENERATE = "DEBUG=1 .venv/bin/python manage.py api_schema --write"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# Where answers are made (the engine's codes come from its error classes): the literal codes of
# the error helpers' calls and of `{"error": {"code": ...}}` bodies in these packages' modules.
_ERROR_SOURCES = ("board", "server", "taskflow_site")
_ERROR_HELPERS = {"error_response": 2, "_json_error": 1, "error_answer": 1,  # the `code` argument's position
                  "_answer_and_linger": 1}


# -- the schema --------------------------------------------------------------------------------


def _literal_key(node: ast.Dict, key: str):
    """The value under the literal `key` of a dict display, or None."""
    for k, v in zip(node.keys, node.values):
        if isinstance(k, ast.Constant) and k.value == key:
            return v
    return None


def error_codes() -> list[str]:
    """Every `error.code` the API answers: the engine's error classes, the API middleware's
    codes for Django's own refusals, and the literal codes written where answers are made
    (tests/test_api_schema.py checks them against docs/api.md's list)."""
    from board.api import middleware
    from board.engine import errors

    codes: set[str] = set()
    pending = list(errors.BoardError.__subclasses__())
    while pending:
        cls = pending.pop()
        codes.add(cls.code)
        pending += cls.__subclasses__()
    codes |= {code for code, _ in middleware.CODES.values()}
    base = Path(settings.BASE_DIR)
    modules = sorted(p for package in _ERROR_SOURCES for p in (base / package).rglob("*.py")
                     if "migrations" not in p.parent.name)
    for module in modules:
        for node in ast.walk(parse_python(module.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                at = _ERROR_HELPERS.get(name)
                if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant):
                    codes.add(node.args[at].value)
            elif isinstance(node, ast.Dict):
                error = _literal_key(node, "error")
                code = _literal_key(error, "code") if isinstance(error, ast.Dict) else None
                if isinstance(code, ast.Constant) and isinstance(code.value, str):
                    codes.add(code.value)
    return sorted(codes)


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    # CPython 3.11 keeps the AST converter's recursion depth in shared module state, so an
    # ast.parse racing another thread's (3.11's traceback formatter calls ast.parse to place
    # its carets) raises "SystemError: AST constructor recursion depth mismatch" (gh-106905).
    # The state is reset at each call, so parsing again is correct, not a mask.
    for attempt in range(5):
        try:
            return ast.parse(source, filename)
        except SystemError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def build_schema() -> dict:
    from board.api.main import api

    schema = api.get_openapi_schema()
    schema = json.loads(json.dumps(schema))  # plain dicts and lists, as the file holds them
    schema["x-error-codes"] = error_codes()
    return schema


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# -- the comparison ----------------------------------------------------------------------------


@dataclass
class Changes:
    breaking: list[str] = field(default_factory=list)
    additive: list[str] = field(default_factory=list)


_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")


class _Comparison:
    def __init__(self, old: dict, new: dict):
        self.old, self.new = old, new
        self.changes = Changes()

    def breaking(self, text: str) -> None:
        if text not in self.changes.breaking:
            self.changes.breaking.append(text)

    def additive(self, text: str) -> None:
        if text not in self.changes.additive:
            self.changes.additive.append(text)

    # Schemas: $ref resolved, unions flattened into their alternatives.

    @staticmethod
    def _resolve(doc: dict, schema: dict) -> dict:
        for _ in range(50):
            ref = schema.get("$ref") if isinstance(schema, dict) else None
            if not ref:
                return schema if isinstance(schema, dict) else {}
            schema = doc.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[-1], {})
        raise ValueError(f"$ref chain too deep at {ref}")

    def _alternatives(self, doc: dict, schema: dict) -> list[dict]:
        schema = self._resolve(doc, schema)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return [alt for sub in schema[key] for alt in self._alternatives(doc, sub)]
        if len(schema.get("allOf", ())) == 1:
            return self._alternatives(doc, schema["allOf"][0])
        if isinstance(schema.get("type"), list):
            return [{**schema, "type": t} for t in schema["type"]]
        if "const" in schema and "enum" not in schema:
            return [{**schema, "enum": [schema["const"]]}]
        return [schema]

    @staticmethod
    def _covers(wide: str | None, narrow: str | None) -> bool:
        """Whether every value of type `narrow` is of type `wide` (None: any type)."""
        return wide is None or wide == narrow or (wide == "number" and narrow == "integer")

    @staticmethod
    def _describe(schema: dict) -> str:
        return schema.get("type") or "any value"

    # What a client sends: the new schema must accept everything the old one accepted.

    def _closest(self, candidates: list[dict], judge) -> None:
        """Judge against each candidate alternative of a union and keep the findings of the one
        that fits best (fewest breaking changes, then fewest changes): a union's alternatives
        (one task or a batch) are matched by shape, not by their order."""
        found = []
        for i, candidate in enumerate(candidates):
            saved, self.changes = self.changes, Changes()
            try:
                judge(candidate)
                found.append((len(self.changes.breaking), len(self.changes.additive), i, self.changes))
            finally:
                self.changes = saved
        best = min(found)[3]
        for text in best.breaking:
            self.breaking(text)
        for text in best.additive:
            self.additive(text)

    def request(self, old: dict, new: dict, where: str) -> None:
        olds, news = self._alternatives(self.old, old), self._alternatives(self.new, new)
        for o in olds:
            candidates = [n for n in news if self._covers(n.get("type"), o.get("type"))]
            if not candidates:
                self.breaking(f"{where}: {self._describe(o)} is no longer accepted (type narrowed)")
                continue
            self._closest(candidates, lambda n, o=o: self._request_one(o, n, where))
        for n in news:
            if not any(self._covers(n.get("type"), o.get("type")) for o in olds):
                self.additive(f"{where}: now also accepts {self._describe(n)}")

    def _request_one(self, o: dict, n: dict, where: str) -> None:
        if n.get("type") != o.get("type"):
            self.additive(f"{where}: {self._describe(o)} widened to {self._describe(n)}")
        self._request_bounds(o, n, where)
        if n.get("type") in ("object", None) and (o.get("properties") or n.get("properties")):
            self._request_object(o, n, where)
        if "items" in o or "items" in n:
            self.request(o.get("items", {}), n.get("items", {}), f"{where}[]")

    def _request_bounds(self, o: dict, n: dict, where: str) -> None:
        for key in _UPPER_BOUNDS:
            if key in n and (key not in o or n[key] < o[key]):
                self.breaking(f"{where}: {key} {'lowered from ' + str(o[key]) if key in o else 'added'}"
                              f" to {n[key]} (type narrowed)")
            elif key in o and (key not in n or n[key] > o[key]):
                self.additive(f"{where}: {key} raised or removed (widened)")
        for key in _LOWER_BOUNDS:
            if key in n and (key not in o or n[key] > o[key]):
                self.breaking(f"{where}: {key} {'raised from ' + str(o[key]) if key in o else 'added'}"
                              f" to {n[key]} (type narrowed)")
            elif key in o and (key not in n or n[key] < o[key]):
                self.additive(f"{where}: {key} lowered or removed (widened)")
        for key in ("pattern", "format"):
            if key in n and n[key] != o.get(key):
                self.breaking(f"{where}: {key} {'changed' if key in o else 'added'}: {n[key]!r} (type narrowed)")
            elif key in o and key not in n:
                self.additive(f"{where}: {key} removed (widened)")
        if "enum" in n:
            if "enum" not in o:
                self.breaking(f"{where}: only {n['enum']} accepted now (enum added)")
            else:
                self._enum_values(o["enum"], n["enum"], where)
        elif "enum" in o:
            self.additive(f"{where}: enum removed (any value accepted)")

    def _enum_values(self, old: list, new: list, where: str) -> None:
        """Both directions alike: a value a client may send or read that is gone breaks it."""
        for value in old:
            if value not in new:
                self.breaking(f"{where}: enum value {value!r} removed")
        for value in new:
            if value not in old:
                self.additive(f"{where}: new enum value {value!r}")

    def _request_object(self, o: dict, n: dict, where: str) -> None:
        old_props, new_props = o.get("properties", {}), n.get("properties", {})
        old_req, new_req = set(o.get("required", ())), set(n.get("required", ()))
        for name in sorted(new_req - old_req):
            if name in old_props:
                self.breaking(f"{where}.{name}: request field now required")
            else:
                self.breaking(f"{where}.{name}: new required request field")
        for name in sorted(set(old_props) - set(new_props)):
            self.breaking(f"{where}.{name}: request field removed")
        if n.get("additionalProperties", True) is False and o.get("additionalProperties", True) is not False:
            self.breaking(f"{where}: unknown request fields now refused")
        for name in sorted(set(new_props) - set(old_props)):
            if name not in new_req:
                self.additive(f"{where}.{name}: new optional request field")
        for name in sorted(set(old_props) & set(new_props)):
            self.request(old_props[name], new_props[name], f"{where}.{name}")

    # What a client reads: everything the new schema answers must fit what the old one said.

    def response(self, old: dict, new: dict, where: str) -> None:
        olds, news = self._alternatives(self.old, old), self._alternatives(self.new, new)
        for n in news:
            candidates = [o for o in olds if self._covers(o.get("type"), n.get("type"))]
            if not candidates:
                self.breaking(f"{where}: may now be {self._describe(n)} (a type the client never got)")
                continue
            self._closest(candidates, lambda o, n=n: self._response_one(o, n, where))

    def _response_one(self, o: dict, n: dict, where: str) -> None:
        if "enum" in o:
            if "enum" not in n:
                self.breaking(f"{where}: no longer limited to {o['enum']}")
            else:
                self._enum_values(o["enum"], n["enum"], where)
        if o.get("type") in ("object", None) and (o.get("properties") or n.get("properties")):
            self._response_object(o, n, where)
        if "items" in o or "items" in n:
            self.response(o.get("items", {}), n.get("items", {}), f"{where}[]")

    def _response_object(self, o: dict, n: dict, where: str) -> None:
        old_props, new_props = o.get("properties", {}), n.get("properties", {})
        old_req, new_req = set(o.get("required", ())), set(n.get("required", ()))
        for name in sorted(set(old_props) - set(new_props)):
            self.breaking(f"{where}.{name}: response field removed")
        for name in sorted((old_req & set(new_props)) - new_req):
            self.breaking(f"{where}.{name}: response field may now be missing")
        for name in sorted(set(new_props) - set(old_props)):
            self.additive(f"{where}.{name}: new response field")
        for name in sorted(set(old_props) & set(new_props)):
            self.response(old_props[name], new_props[name], f"{where}.{name}")

    # Paths and operations.

    @staticmethod
    def _template(path: str) -> str:
        """A path with its parameters' names left out: renaming one breaks no client."""
        return "/".join("{}" if part.startswith("{") else part for part in path.split("/"))

    @staticmethod
    def _parameters(operation: dict) -> dict:
        found, position = {}, 0
        for param in operation.get("parameters", ()):
            if param.get("in") == "path":
                found[("path", position)] = param
                position += 1
            else:
                found[(param.get("in"), param.get("name"))] = param
        return found

    @staticmethod
    def _json(part: dict) -> dict | None:
        content = (part or {}).get("content", {})
        return content.get("application/json", {}).get("schema") if content else None

    def run(self) -> Changes:
        old_paths = {self._template(p): (p, item) for p, item in self.old.get("paths", {}).items()}
        new_paths = {self._template(p): (p, item) for p, item in self.new.get("paths", {}).items()}
        for key, (path, old_item) in sorted(old_paths.items()):
            if key not in new_paths:
                self.breaking(f"{path}: path removed")
                continue
            new_item = new_paths[key][1]
            for method in METHODS:
                if method in old_item and method not in new_item:
                    self.breaking(f"{method.upper()} {path}: method removed")
                elif method in old_item:
                    self.operation(old_item[method], new_item[method], f"{method.upper()} {path}")
                elif method in new_item:
                    self.additive(f"{method.upper()} {path}: new method")
        for key, (path, _) in sorted(new_paths.items()):
            if key not in old_paths:
                self.additive(f"{path}: new path")
        old_codes, new_codes = self.old.get("x-error-codes", []), self.new.get("x-error-codes", [])
        for code in old_codes:
            if code not in new_codes:
                self.breaking(f"error code {code!r} removed")
        for code in new_codes:
            if code not in old_codes:
                self.additive(f"new error code {code!r}")
        return self.changes

    def operation(self, old: dict, new: dict, where: str) -> None:
        old_params, new_params = self._parameters(old), self._parameters(new)
        for key, param in old_params.items():
            label = f"{where} {param.get('in')} parameter {param.get('name')}"
            if key not in new_params:
                self.breaking(f"{label}: removed")
                continue
            if new_params[key].get("required") and not param.get("required"):
                self.breaking(f"{label}: now required")
            self.request(param.get("schema", {}), new_params[key].get("schema", {}), label)
        for key, param in new_params.items():
            if key not in old_params:
                label = f"{where} {param.get('in')} parameter {param.get('name')}"
                if param.get("required"):
                    self.breaking(f"{label}: new required parameter")
                else:
                    self.additive(f"{label}: new optional parameter")
        old_body, new_body = old.get("requestBody"), new.get("requestBody")
        if old_body and not new_body:
            self.breaking(f"{where}: request body no longer taken")
        elif new_body and new_body.get("required") and not (old_body or {}).get("required"):
            self.breaking(f"{where}: request body now required")
        if old_body and new_body:
            self.request(self._json(old_body) or {}, self._json(new_body) or {}, f"{where} request body")
        old_answers, new_answers = old.get("responses", {}), new.get("responses", {})
        for status, answer in old_answers.items():
            if status not in new_answers:
                if str(status).startswith("2"):
                    self.breaking(f"{where}: response {status} removed")
                continue
            old_schema, new_schema = self._json(answer), self._json(new_answers[status])
            if old_schema is not None and new_schema is None:
                self.breaking(f"{where}: response {status} no longer has a JSON body")
            elif old_schema is not None:
                self.response(old_schema, new_schema, f"{where} response {status}")
        for status in new_answers:
            if status not in old_answers:
                if str(status).startswith("2"):
                    self.breaking(f"{where}: new success status {status} (a client may not expect it)")
                else:
                    self.additive(f"{where}: new response {status}")


def compare(old: dict, new: dict) -> Changes:
    """What changed from the `old` OpenAPI document to the `new` one, for a client written
    against the old one: `breaking` (it may fail) and `additive` (it goes on working). Changes
    of wording (summaries, descriptions, titles) are neither."""
    return _Comparison(old, new).run()


def check_message(committed: dict | None, current: dict, path: Path = SCHEMA_FILE) -> str | None:
    """None when `current` is the committed schema; otherwise what a developer must do."""
    if committed is None:
        return f"{path} is missing: write it with\n    {REGENERATE}"
    if render(committed) == render(current):
        return None
    changes = compare(committed, current)
    if changes.breaking:
        listed = "\n".join(f"  - {text}" for text in changes.breaking)
        return (f"The API changed in a way that can break existing clients:\n{listed}\n"
                "Within /api/ only additive changes are allowed: keep the old shape, or serve the "
                "new one under a new version prefix (docs/api.md, 'API stability').")
    listed = "\n".join(f"  - {text}" for text in changes.additive) or "  (wording only)"
    return (f"The API changed compatibly:\n{listed}\nUpdate the committed schema with\n    {REGENERATE}")


class Command(BaseCommand):
    help = "Print the agents' API schema (OpenAPI), write it to board/api/openapi.json, or check the committed one."

    def add_arguments(self, parser):
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--write", action="store_true", help="write the schema to the committed file")
        group.add_argument("--check", action="store_true",
                           help="compare with the committed file; exit 1 on any difference, saying whether it is breaking")
        parser.add_argument("--file", type=Path, default=SCHEMA_FILE, help=f"the schema file (default {SCHEMA_FILE})")

    def handle(self, *args, write=False, check=False, file=SCHEMA_FILE, **options):
        current = build_schema()
        if write:
            file.write_text(render(current))
            self.stdout.write(f"wrote {file}")
        elif check:
            committed = json.loads(file.read_text()) if file.exists() else None
            problem = check_message(committed, current, file)
            if problem:
                self.stderr.write(problem)
                sys.exit(1)
            self.stdout.write(f"{file} is current")
        else:
            self.stdout.write(render(current), ending="")
