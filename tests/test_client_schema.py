"""The Python client against the committed API schema (board/api/openapi.json), without a server.

tests/test_client.py runs the client against the live server; this test reads the client's
source (ast, not imports: the client is not edited for it) and checks that what it sends and
what it reads are in the committed contract, so a change of the schema that would break the
client is caught by the schema, and a change of the client that leaves the schema is caught too:

- every request (`self.request(METHOD, path, body, query=...)`) names a path and method of the
  schema; every body field it sends is a field of the request schema, of a type the schema
  accepts (from the client's own annotations and literals); every field the schema requires is
  always sent; every query parameter exists;
- every field the client reads from an answer (`answer["items"]`, `page.get("next")`,
  `lease["fence"]`... followed through assignments, `Lease(...)` and its methods) is a field of
  that operation's success response; errors.py's reads of an error answer are fields of ErrorOut.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from board.management.commands.api_schema import SCHEMA_FILE, parse_python

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "taskflow_client" / "client.py"
ERRORS = ROOT / "taskflow_client" / "errors.py"
SCHEMA = json.loads(SCHEMA_FILE.read_text())


# -- the schema's side ---------------------------------------------------------------------------


def resolve(schema: dict) -> dict:
    while "$ref" in schema:
        schema = SCHEMA["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def alternatives(schema: dict) -> list[dict]:
    schema = resolve(schema)
    if "anyOf" in schema or "oneOf" in schema:
        return [alt for sub in schema.get("anyOf", schema.get("oneOf")) for alt in alternatives(sub)]
    return [schema]


def accepted_types(schema: dict) -> set[str] | None:
    """The JSON types a schema accepts (None: any)."""
    kinds = set()
    for alt in alternatives(schema):
        if "type" not in alt:
            return None
        kinds.add(alt["type"])
    return kinds | ({"integer"} if "number" in kinds else set())


def operation(method: str, path: str) -> dict | None:
    template = "/".join("{}" if p.startswith("{") else p for p in f"/api{path}".split("/"))
    for schema_path, item in SCHEMA["paths"].items():
        if "/".join("{}" if p.startswith("{") else p for p in schema_path.split("/")) == template:
            return item.get(method.lower())
    return None


def success_schema(op: dict) -> dict:
    """What a 2xx answer of `op` may be (one of its JSON bodies)."""
    bodies = [answer["content"]["application/json"]["schema"] for status, answer in op["responses"].items()
              if status.startswith("2") and "content" in answer]
    return {"anyOf": bodies}


# -- the client's side: a small reader of its source ---------------------------------------------

OPAQUE = object()  # a body that is the caller's own data (create's task dicts)
ANY = None


def annotation_types(node) -> set[str] | None:
    """JSON types of a value annotated `node` (None: any)."""
    if node is None:
        return ANY
    text = ast.unparse(node)
    simple = {"str": {"string"}, "float": {"number"}, "int": {"integer"}, "bool": {"boolean"}, "None": {"null"}}
    if text in simple:
        return simple[text]
    if text.startswith(("Dict", "dict")):
        return {"object"}
    if text.startswith(("List", "list", "Sequence")):
        return {"array"}
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Optional", "Union"):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        found = set() if ast.unparse(node.value) == "Union" else {"null"}
        for part in parts:
            kinds = annotation_types(part)
            if kinds is None:
                return ANY
            found |= kinds
        return found
    return ANY


class Source:
    def __init__(self, path: Path):
        self.path = path
        self.text = path.read_text()
        tree = parse_python(self.text)
        self.functions: dict[tuple[str, str], ast.FunctionDef] = {}
        self.classes: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions[("", node.name)] = node
            elif isinstance(node, ast.ClassDef):
                self.classes.add(node.name)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        self.functions[(node.name, item.name)] = item

    @staticmethod
    def assignments(fn, name: str) -> list:
        """Values assigned to local `name` in `fn`, in order."""
        found = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(node.value)
        return found

    @staticmethod
    def params(fn) -> dict:
        args = fn.args
        return {a.arg: a for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}

    def types_of(self, fn, expr) -> set[str] | None:
        if isinstance(expr, ast.Constant):
            return {bool: {"boolean"}, int: {"integer"}, float: {"number"}, str: {"string"},
                    type(None): {"null"}}.get(type(expr.value), ANY)
        if isinstance(expr, (ast.Dict, ast.DictComp)):
            return {"object"}
        if isinstance(expr, (ast.List, ast.ListComp)):
            return {"array"}
        if isinstance(expr, ast.IfExp):
            a, b = self.types_of(fn, expr.body), self.types_of(fn, expr.orelse)
            return ANY if a is None or b is None else a | b
        if isinstance(expr, ast.Name):
            if expr.id in self.params(fn):
                return annotation_types(self.params(fn)[expr.id].annotation)
            values = self.assignments(fn, expr.id)
            return self.types_of(fn, values[0]) if values else ANY
        if isinstance(expr, ast.Call):
            name = ast.unparse(expr.func)
            if name == "list":
                return {"array"}
            if ("", name) in self.functions:
                return annotation_types(self.functions[("", name)].returns)
        return ANY

    def path_of(self, fn, expr) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) == "self._path":
            return "/" + "/".join(a.value if isinstance(a, ast.Constant) else "{}" for a in expr.args)
        if isinstance(expr, ast.Name):
            values = self.assignments(fn, expr.id)
            return self.path_of(fn, values[0]) if len(values) == 1 else None
        return None

    def body_of(self, cls: str, fn, expr, kwargs=(), bound=None):
        """{field: (always sent, JSON types)} of a request body, or OPAQUE. `bound`: (caller,
        {parameter: argument}) when `fn` is a helper read at one of its call sites."""
        if expr is None:
            return {}
        if isinstance(expr, ast.Dict):
            fields = {}
            for key, value in zip(expr.keys, expr.values):
                if key is None and bound and isinstance(value, ast.Name) and value.id in bound[1]:
                    fields.update(self.body_of(cls, bound[0], bound[1][value.id]))  # **body of the caller's
                elif key is None:  # **extra: the keyword arguments the caller gave
                    fields.update({name: (True, types) for name, types in kwargs})
                else:
                    fields[key.value] = (True, self.types_of(fn, value))
            return fields
        if isinstance(expr, ast.Name):
            if bound and expr.id in bound[1]:
                return self.body_of(cls, bound[0], bound[1][expr.id])
            if expr.id in self.params(fn):
                return OPAQUE
            values = self.assignments(fn, expr.id)
            assert len(values) == 1, f"{fn.name}: body {expr.id} assigned {len(values)} times"
            fields = self.body_of(cls, fn, values[0], kwargs)
            for node in ast.walk(fn):  # body["x"] = ...: sent only sometimes
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript) \
                        and ast.unparse(node.targets[0].value) == expr.id:
                    fields[node.targets[0].slice.value] = (False, self.types_of(fn, node.value))
            return fields
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) == "list":
            return OPAQUE
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and ast.unparse(expr.func.value) == "self" and (cls, expr.func.attr) in self.functions:
            callee = self.functions[(cls, expr.func.attr)]
            given = [(k.arg, self.types_of(fn, k.value)) for k in expr.keywords]
            returned = [n.value for n in ast.walk(callee) if isinstance(n, ast.Return)]
            assert len(returned) == 1, f"{callee.name} returns in {len(returned)} places"
            return self.body_of(cls, callee, returned[0], given)
        raise AssertionError(f"{fn.name}: cannot read the body {ast.unparse(expr)}")

    def call_sites(self, cls: str, fn):
        """(caller, {parameter: argument}) of every `self.fn(...)` call in class `cls`."""
        params = [a.arg for a in fn.args.args][1:]  # without self
        for (caller_cls, _), caller in self.functions.items():
            for node in ast.walk(caller):
                if caller_cls == cls and isinstance(node, ast.Call) and ast.unparse(node.func) == f"self.{fn.name}":
                    yield caller, {**dict(zip(params, node.args)), **{k.arg: k.value for k in node.keywords}}

    def requests(self):
        """Every `self.request("METHOD", path, body, query=...)` call with a literal method. A
        request whose path is a parameter of its function (a shared helper) is read once per call
        of the helper, with that caller's path and body."""
        for (cls, _), fn in self.functions.items():
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.request" and node.args \
                        and isinstance(node.args[0], ast.Constant):
                    body = node.args[2] if len(node.args) > 2 else next(
                        (k.value for k in node.keywords if k.arg == "body"), None)
                    query = next((k.value for k in node.keywords if k.arg == "query"), None)
                    path = node.args[1]
                    if isinstance(path, ast.Name) and path.id in self.params(fn):
                        sites = list(self.call_sites(cls, fn))
                        assert sites, f"{fn.name}: its path {path.id} is a parameter, and no call of it was found"
                        for caller, args in sites:
                            yield (fn, node, node.args[0].value, self.path_of(caller, args[path.id]),
                                   self.body_of(cls, fn, body, bound=(caller, args)), query)
                    else:
                        yield fn, node, node.args[0].value, self.path_of(fn, path), self.body_of(cls, fn, body), query


CLIENT_SOURCE = Source(CLIENT)
REQUESTS = list(CLIENT_SOURCE.requests())


def request_id(request) -> str:
    fn, node, method, path, _, _ = request
    return f"{fn.name}:{node.lineno}:{method} {path}"


def test_every_request_of_the_client_is_read():
    """The reader finds as many requests as the source makes (none slips past it)."""
    written = re.findall(r'self\.request\("(GET|POST|PUT|PATCH|DELETE)"', CLIENT_SOURCE.text)
    assert len({id(node) for _, node, *_ in REQUESTS}) == len(written) > 0


@pytest.mark.parametrize("request_", REQUESTS, ids=request_id)
def test_what_the_client_sends_is_in_the_committed_schema(request_):
    fn, node, method, path, body, query = request_
    assert path is not None, f"{fn.name}: cannot read the path {ast.unparse(node.args[1])}"
    op = operation(method, path)
    assert op is not None, f"{method} /api{path} is not in the committed schema"

    if body is not OPAQUE and (body or method == "POST"):
        assert "requestBody" in op, f"{method} {path} takes no body in the schema"
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        objects = [alt for alt in alternatives(schema) if alt.get("type") == "object"]
        assert len(objects) == 1, f"{method} {path}: {len(objects)} object shapes"
        properties, required = objects[0].get("properties", {}), set(objects[0].get("required", ()))
        for name, (_, types) in body.items():
            assert name in properties, f"{method} {path}: the client sends {name!r}, not in the schema"
            accepted = accepted_types(properties[name])
            if types is not None and accepted is not None:
                assert types <= accepted, f"{method} {path}.{name}: the client sends {types}, the schema takes {accepted}"
        always = {name for name, (sent, _) in body.items() if sent}
        assert required <= always, f"{method} {path}: required {sorted(required - always)} not always sent"

    if query is not None:
        params = {p["name"]: p for p in op.get("parameters", ()) if p["in"] == "query"}
        assert isinstance(query, ast.Dict)
        for key, value in zip(query.keys, query.values):
            assert key.value in params, f"{method} {path}: query parameter {key.value!r} not in the schema"
            # request() drops None values: only the others are sent.
            types = CLIENT_SOURCE.types_of(fn, value)
            accepted = accepted_types(params[key.value]["schema"])
            if types is not None and accepted is not None:
                assert types - {"null"} <= accepted, f"{method} {path}?{key.value}: {types} vs {accepted}"


# -- what the client reads from answers ---------------------------------------------------------


class Reads:
    """Follows answers through the client's code: which schema each name holds, and every
    `x["field"]` / `x.get("field")` read on one."""

    def __init__(self, source: Source, seeds: dict):
        self.source = source
        self.env: dict[tuple, list] = {key: list(value) for key, value in seeds.items()}
        self.reads: set[str] = set()
        self.missing: set[str] = set()

    def shapes(self, cls, fn, expr) -> list:
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) == "self.request" \
                and isinstance(expr.args[0], ast.Constant):
            method, path = expr.args[0].value, self.source.path_of(fn, expr.args[1])
            op = operation(method, path)
            return [(f"{method} {path}", success_schema(op))] if op else []
        if isinstance(expr, ast.Name):
            return self.env.get((cls, fn.name, expr.id), [])
        if isinstance(expr, ast.Attribute) and ast.unparse(expr.value) == "self":
            return self.env.get((cls, "self", expr.attr), [])
        key = None
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
            inner, key = expr.value, expr.slice.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get" \
                and expr.args and isinstance(expr.args[0], ast.Constant):
            inner, key = expr.func.value, expr.args[0].value
        if key is not None:
            found = []
            for label, schema in self.shapes(cls, fn, inner):
                holders = [alt for alt in alternatives(schema) if key in alt.get("properties", {})]
                self.reads.add(f"{label}.{key}")
                if not holders:
                    self.missing.add(f"{fn.name}: {label}.{key} (line {expr.lineno})")
                found += [(f"{label}.{key}", alt["properties"][key]) for alt in holders]
            return found
        if isinstance(expr, ast.IfExp):
            return self.shapes(cls, fn, expr.body) + self.shapes(cls, fn, expr.orelse)
        return []

    def bind(self, key, shapes) -> bool:
        known = self.env.setdefault(key, [])
        new = [s for s in shapes if s not in known]
        known += new
        return bool(new)

    def run(self):
        for _ in range(10):
            grew = False
            for (cls, _), fn in self.source.functions.items():
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Subscript, ast.Call)):
                        self.shapes(cls, fn, node)  # records reads
                    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            if isinstance(target, ast.Name):
                                grew |= self.bind((cls, fn.name, target.id), self.shapes(cls, fn, node.value))
                            elif isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                                grew |= self.bind((cls, "self", target.attr), self.shapes(cls, fn, node.value))
                    if isinstance(node, ast.Call):
                        grew |= self.bind_call(cls, fn, node)
            if not grew:
                return self
        raise AssertionError("the reads did not settle")

    def bind_call(self, cls, fn, call) -> bool:
        """Arguments that hold answers, bound to the parameters of `Class(...)` or `self.method(...)`."""
        name = ast.unparse(call.func)
        if name in self.source.classes and (name, "__init__") in self.source.functions:
            target_cls, callee = name, self.source.functions[(name, "__init__")]
        elif name.startswith("self.") and (cls, name[5:]) in self.source.functions:
            target_cls, callee = cls, self.source.functions[(cls, name[5:])]
        else:
            return False
        params = [a.arg for a in callee.args.args][1:]  # without self
        grew = False
        for param, arg in zip(params, call.args):
            grew |= self.bind((target_cls, callee.name, param), self.shapes(cls, fn, arg))
        return grew


def test_every_field_the_client_reads_from_an_answer_is_in_the_committed_schema():
    reads = Reads(CLIENT_SOURCE, {}).run()
    assert reads.missing == set()
    # The reader reached the answers: the lists' pages, the claims' leases (through Lease), check().
    read_fields = {read.rsplit(".", 1)[-1] for read in reads.reads}
    assert {"items", "next", "lease", "task", "token", "fence", "expires_at", "id", "problems"} <= read_fields


def test_every_field_the_client_reads_from_an_error_answer_is_in_the_committed_schema():
    source = Source(ERRORS)
    error_out = {"$ref": "#/components/schemas/ErrorOut"}
    reads = Reads(source, {("", "error_from_body", "body"): [("error answer", error_out)]}).run()
    assert reads.missing == set()
    assert {"error answer.error", "error answer.error.code", "error answer.error.message"} <= reads.reads
