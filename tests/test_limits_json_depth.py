"""Every JSON value a client sends (a task's payload, a result, a checkpoint) nests at most
MAX_JSON_DEPTH (64) arrays/objects deep: 64 is stored, 65 is a 422 `validation_error` naming
the field with nothing written, and so is 950 (which once crashed the server with a 500, on
SQLite and PostgreSQL, and at 920 was stored but broke the task's admin page). Through the real
server on both stores, and the engine's own check (every caller's: commands, the admin).
"""
import json

import pytest

from board.engine import errors, transitions
from board.models import Task
from tests.live_server import BoardServer  # noqa: F401  (the fixtures' type)
from tests.support import db_state, sql_stores, sqlite_db_mark
from tests.test_limits_bad_input import Board, assert_json_4xx, postgres_server, send, sqlite_server  # noqa: F401

pytestmark = sqlite_db_mark()

MAX_JSON_DEPTH = 64  # the cap the Limits table (docs/api.md) names (board.engine.limits.MAX_JSON_DEPTH)


def nested(depth: int, leaf=1):
    """A JSON value nesting `depth` containers: arrays, with an object every other level."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def nested_text(depth: int, leaf: str = "1") -> str:
    """nested(depth) as JSON text, written without recursion: json.dumps of 950 levels may pass
    the interpreter's recursion limit in a test process whose stack is already deep (pytest-xdist)."""
    opening = "".join('{"k": ' if level % 2 else "[" for level in reversed(range(depth)))
    closing = "".join("}" if level % 2 else "]" for level in range(depth))
    return opening + leaf + closing


PLACEHOLDER = "\u0001nested\u0001"


def test_the_engine_caps_json_at_the_documented_depth():
    from board.engine import limits

    assert limits.MAX_JSON_DEPTH == MAX_JSON_DEPTH


def test_nested_builds_exactly_the_depth_it_says():
    assert nested(0) == 1 and nested(1) == [1] and nested(2) == {"k": [1]}
    assert json.dumps(nested(3)) == '[{"k": [1]}]'
    assert all(json.loads(nested_text(depth)) == nested(depth) for depth in range(6))


def server_for(alias: str, request) -> BoardServer:
    return request.getfixturevalue("sqlite_server" if alias == "default" else "postgres_server")


def requests_with(board: Board, depth: int) -> list[tuple[str, str, str, dict | list]]:
    """(field, path, body) for every API input that carries a client's JSON value."""
    value = PLACEHOLDER  # replaced by nested_text(depth) in the encoded body (encode_with)
    return [
        ("payload", "/api/tasks", {"title": "t", "payload": value}),
        ("payload", "/api/tasks", [{"title": "ok"}, {"title": "t", "payload": value}]),
        ("checkpoint", "/api/tasks/r1/renew", {"token": board.token, "ttl_seconds": 60, "checkpoint": value}),
        ("result", "/api/tasks/r1/complete", {"token": board.token, "result": value}),
        ("checkpoint", "/api/tasks/r1/pause", {"token": board.token, "checkpoint": value}),
    ]


@pytest.mark.parametrize("alias", sql_stores())
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 950])
def test_json_deeper_than_the_cap_is_a_422_naming_the_field_and_writes_nothing(alias, depth, request):
    server = server_for(alias, request)
    board = Board(alias)
    before = db_state(alias)
    for field, path, body in requests_with(board, depth):
        what = f"{path} {field} nested {depth} deep"
        encoded = json.dumps(body).replace(json.dumps(PLACEHOLDER), nested_text(depth))
        error = assert_json_4xx(send(server, "POST", path, board.agent, encoded.encode()), what)
        assert error["code"] == "validation_error", f"{what}: {error}"
        assert field in error["message"] and f"{MAX_JSON_DEPTH}" in error["message"], f"{what}: {error}"
        assert error["details"][0]["loc"][-1] == field, f"{what}: {error}"
        assert db_state(alias) == before, what


@pytest.mark.parametrize("alias", sql_stores())
def test_json_as_deep_as_the_cap_is_stored_and_read_back(alias, request):
    server = server_for(alias, request)
    board = Board(alias)
    value = nested(MAX_JSON_DEPTH)

    def ok(path: str, body: dict) -> dict:
        status, _, data = send(server, "POST", path, board.agent, json.dumps(body).encode())
        assert status in (200, 201), f"{path}: {status} {data[:300]!r}"
        return json.loads(data)

    assert ok("/api/tasks", {"id": "deep", "title": "t", "payload": value})["payload"] == value
    renewed = ok("/api/tasks/r1/renew", {"token": board.token, "ttl_seconds": 60, "checkpoint": value})
    assert renewed["task"]["checkpoint"] == value
    assert ok("/api/tasks/r1/pause", {"token": board.token, "checkpoint": value})["checkpoint"] == value
    status, _, data = send(server, "POST", "/api/tasks/r1/resume", board.agent, b'{"ttl_seconds": 60}')
    assert status == 200, data[:300]
    token = json.loads(data)["lease"]["token"]
    assert ok("/api/tasks/r1/complete", {"token": token, "result": value})["result"] == value
    status, _, data = send(server, "GET", "/api/tasks/deep", board.agent)
    assert status == 200 and json.loads(data)["payload"] == value


@pytest.mark.parametrize("alias", sql_stores())
def test_the_engine_refuses_json_deeper_than_the_cap_for_every_caller(alias):
    board = Board(alias)
    too_deep, at_cap = nested(MAX_JSON_DEPTH + 1), nested(MAX_JSON_DEPTH)
    before = db_state(alias)
    version = Task.objects.using(alias).get(pk="q1").version
    calls = [
        ("payload", lambda: transitions.create([transitions.TaskSpec(title="t", payload=too_deep)],
                                               actor="test", using=alias)),
        ("checkpoint", lambda: transitions.renew("r1", board.token, 60, checkpoint=too_deep, using=alias)),
        ("result", lambda: transitions.complete("r1", board.token, too_deep, using=alias)),
        ("checkpoint", lambda: transitions.pause("r1", board.token, too_deep, using=alias)),
        # an operator's edit in the admin
        ("payload", lambda: transitions.edit("q1", actor="ops", version=version, payload=too_deep, using=alias)),
    ]
    for field, call in calls:
        with pytest.raises(errors.InvalidRequest) as refused:
            call()
        assert refused.value.field == field and str(MAX_JSON_DEPTH) in refused.value.message, refused.value.message
        assert db_state(alias) == before, field
    transitions.edit("q1", actor="ops", version=version, payload=at_cap, using=alias)
    assert transitions.renew("r1", board.token, 60, checkpoint=at_cap, using=alias).task.checkpoint == at_cap


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 950, 100_000])
def test_the_depth_check_walks_any_depth_without_recursing(depth):
    from board.engine.inputs import json_field

    with pytest.raises(errors.InvalidRequest) as refused:
        json_field("payload", nested(depth))
    assert refused.value.field == "payload"



VALID = ['{"a": [1, 2.5e3, -0.5, "x\\u00e9\\n", true, false, null, {}, []], "b": {"c": "d"}}', "[]", "{}", '"s"',
         "0", " [ 1 , [ ] ] ", '{"k": 1, "k": 2}', "[NaN, Infinity, -Infinity]", '["\\ud83d\\ude00"]']
INVALID = ["", "[", "]", "[1,]", '{"a" 1}', '{"a": 1,}', "[1 2]", "[1]]", '{1: 2}', "[}", "{]", "01", "[1] x",
           '"\x01"', '{"a": }', "[,1]", "tru", '"\\x"', "[-]"]


@pytest.mark.parametrize("text", VALID + INVALID)
def test_the_body_parser_reads_exactly_what_json_loads_reads(text):
    from board.api.json_body import loads_without_recursion

    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            loads_without_recursion(text)
        return
    got = loads_without_recursion(text)
    assert json.dumps(got) == json.dumps(expected)


def test_the_body_parser_reads_any_depth():
    from board.api.json_body import loads_without_recursion

    depth = 100_000
    value = loads_without_recursion('{"payload": ' + '[{"k": ' * depth + "0" + "}]" * depth + "}")["payload"]
    for _ in range(depth):
        assert isinstance(value, list) and len(value) == 1 and list(value[0]) == ["k"]
        value = value[0]["k"]
    assert value == 0
