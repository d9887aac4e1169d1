"""Every text the API takes is capped (title, description, error, reason, queue, token, the list
filters), on every input path, with the limit in the refusal and nothing written; and a list
page is bounded in bytes as well as in tasks. Against the real server on SQLite; the engine's
own checks (every caller's) on SQLite and PostgreSQL.
"""
import http.client
import json
from urllib.parse import quote

import pytest

from board import agent_keys
from board.engine import errors, transitions
from board.engine.limits import (
    MAX_BATCH_TASKS,
    MAX_DESCRIPTION_CHARS,
    MAX_ERROR_CHARS,
    MAX_JSON_FIELD_BYTES,
    MAX_OWNER_CHARS,
    MAX_PAGE,
    MAX_PAGE_BYTES,
    MAX_REASON_CHARS,
    MAX_TITLE_CHARS,
    MAX_TOKEN_CHARS,
)
from tests.live_server import BoardServer, one_process_server  # noqa: F401  (fixture)
from tests.support import db_state, postgres_db_mark, sqlite_db_mark

pytestmark = sqlite_db_mark()


@pytest.fixture(scope="module")
def server(one_process_server):
    return one_process_server


def send(server, method: str, path: str, key: str, body=None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.fixture
def board():
    agent = agent_keys.create_key("agent-a")[1]
    operator = agent_keys.create_key("ops", is_operator=True)[1]
    transitions.create([transitions.TaskSpec(title="running", id="r1"),
                        transitions.TaskSpec(title="queued", id="q1")], actor="test")
    token = transitions.claim("r1", "agent-a", 600).lease.token
    return agent, operator, token


def over(limit: int) -> str:
    return "x" * (limit + 1)


def test_every_text_over_its_cap_is_422_naming_the_cap_and_writes_nothing(server, board):
    agent, operator, token = board
    cases = [
        ("create title", agent, "POST", "/api/tasks", {"title": over(MAX_TITLE_CHARS)}, MAX_TITLE_CHARS),
        ("create description", agent, "POST", "/api/tasks",
         {"title": "t", "description": over(MAX_DESCRIPTION_CHARS)}, MAX_DESCRIPTION_CHARS),
        ("batch description", agent, "POST", "/api/tasks",
         [{"title": "t"}, {"title": "t", "description": over(MAX_DESCRIPTION_CHARS)}], MAX_DESCRIPTION_CHARS),
        # A queue is a name like a task id: its pattern says 1 + {0,99} characters.
        ("create queue", agent, "POST", "/api/tasks", {"title": "t", "queue": over(100)}, "{0,99}"),
        ("claim_next queue", agent, "POST", "/api/claim", {"ttl_seconds": 60, "queue": over(100)}, "{0,99}"),
        ("fail error", agent, "POST", "/api/tasks/r1/fail", {"token": token, "error": over(MAX_ERROR_CHARS)},
         MAX_ERROR_CHARS),
        ("complete token", agent, "POST", "/api/tasks/r1/complete",
         {"token": token + over(MAX_TOKEN_CHARS), "result": 1}, MAX_TOKEN_CHARS),
        ("cancel reason", operator, "POST", "/api/tasks/q1/cancel", {"reason": over(MAX_REASON_CHARS)},
         MAX_REASON_CHARS),
        ("list owner", agent, "GET", f"/api/tasks?owner={over(MAX_OWNER_CHARS)}", None, MAX_OWNER_CHARS),
        ("list text", agent, "GET", f"/api/tasks?text={over(MAX_TITLE_CHARS)}", None, MAX_TITLE_CHARS),
        ("list queue", agent, "GET", f"/api/tasks?queue={over(100)}", None, "queue"),
    ]
    before = db_state()
    failures = []
    for what, key, method, path, body, limit in cases:
        status, data = send(server, method, path, key, body)
        error = json.loads(data).get("error", {}) if data.startswith(b"{") else {}
        if status != 422 or error.get("code") != "validation_error" or str(limit) not in error.get("message", ""):
            failures.append(f"{what}: {status} {data[:200]!r}")
    assert not failures, "\n".join(failures)
    assert db_state() == before


def test_text_at_its_cap_is_accepted(server, board):
    agent, operator, token = board
    status, data = send(server, "POST", "/api/tasks", agent,
                        {"id": "full", "title": "t" * MAX_TITLE_CHARS, "description": "d" * MAX_DESCRIPTION_CHARS})
    assert status == 201, data[:300]
    status, data = send(server, "POST", "/api/tasks/r1/fail", agent, {"token": token, "error": "e" * MAX_ERROR_CHARS})
    assert status == 200 and json.loads(data)["error"] == "e" * MAX_ERROR_CHARS
    status, data = send(server, "POST", "/api/tasks/q1/cancel", operator, {"reason": "r" * MAX_REASON_CHARS})
    assert status == 200, data[:300]
    status, data = send(server, "GET", f"/api/tasks?text={quote('t' * MAX_TITLE_CHARS)}", agent)
    assert status == 200 and [t["id"] for t in json.loads(data)["items"]] == ["full"]


def test_a_page_of_bulky_tasks_stays_under_the_byte_bound_and_the_walk_sees_each_task_once(server, board):
    agent = board[0]
    # Each task as bulky as the API lets it be: description at its cap, payload near 256 KiB.
    bulky = [f"bulky-{i:02d}" for i in range(24)]
    for i in range(0, len(bulky), 4):
        transitions.create([transitions.TaskSpec(id=task_id, title="bulky", description="d" * MAX_DESCRIPTION_CHARS,
                                                  payload="p" * (MAX_JSON_FIELD_BYTES - 10))
                            for task_id in bulky[i:i + 4]], actor="test")
    seen, sizes, cursor = [], [], None
    while True:
        status, data = send(server, "GET", f"/api/tasks?limit={MAX_PAGE}" + (f"&cursor={cursor}" if cursor else ""), agent)
        assert status == 200, data[:300]
        sizes.append(len(data))
        page = json.loads(data)
        seen += [task["id"] for task in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
        assert len(sizes) < 50, "the walk does not end"
    assert seen == ["q1", "r1", *bulky]
    assert len(sizes) > 1
    assert max(sizes) <= MAX_PAGE_BYTES + 1024, sizes  # + the page's own brackets and cursor


def test_a_page_of_small_tasks_is_still_limit_tasks(server, board):
    agent = board[0]
    transitions.create([transitions.TaskSpec(id=f"small-{i:03d}", title="small") for i in range(MAX_PAGE)], actor="test")
    status, data = send(server, "GET", f"/api/tasks?limit={MAX_PAGE}", agent)
    page = json.loads(data)
    assert status == 200 and len(page["items"]) == MAX_PAGE and page["next"] is not None
    status, data = send(server, "GET", f"/api/tasks?limit={MAX_PAGE}&cursor={page['next']}", agent)
    assert status == 200 and [t["id"] for t in json.loads(data)["items"]] == ["small-498", "small-499"]


@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=postgres_db_mark())])
def test_the_engine_holds_every_caller_to_the_task_caps_on_create_and_edit(alias):
    # The admin's change form edits through transitions.edit, and commands create through
    # transitions.create: neither goes through the API's schemas.
    transitions.create(transitions.TaskSpec(title="t", id="e1"), actor="test", using=alias)
    before = db_state(alias)
    refused = [
        lambda: transitions.create(transitions.TaskSpec(title="t", description=over(MAX_DESCRIPTION_CHARS)),
                                   using=alias),
        lambda: transitions.create(transitions.TaskSpec(title="t\x00"), using=alias),
        lambda: transitions.create(transitions.TaskSpec(title="t", payload={"k": "\ud800"}), using=alias),
        lambda: transitions.edit("e1", actor="op", version=0, description=over(MAX_DESCRIPTION_CHARS), using=alias),
        lambda: transitions.edit("e1", actor="op", version=0, description="\x00", using=alias),
        lambda: transitions.create([transitions.TaskSpec(title="t") for _ in range(MAX_BATCH_TASKS + 1)], using=alias),
    ]
    for call in refused:
        with pytest.raises((errors.InvalidRequest, errors.TooLarge)):
            call()
    assert db_state(alias) == before


@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=postgres_db_mark())])
def test_the_engine_holds_every_caller_to_the_json_and_text_caps_of_every_verb(alias):
    """What the admin and commands call (they do not go through the API's schemas): each verb
    refuses a value over its cap before writing, with the field it is about on the error, and
    the same message the API answers with."""
    transitions.create([transitions.TaskSpec(title="t", id=task_id) for task_id in ("run", "queued", "held")]
                       + [transitions.TaskSpec(title="t", id="pending", on_hold=True)], actor="test", using=alias)
    token = transitions.claim("run", "agent-a", 600, using=alias).lease.token
    big = {"blob": "x" * MAX_JSON_FIELD_BYTES}  # 256 KiB of text, and its JSON's braces and key
    size = len(json.dumps(big, separators=(",", ":")))
    too_large = f"is {size} bytes of JSON; the limit is {MAX_JSON_FIELD_BYTES}"
    long_reason = over(MAX_REASON_CHARS)
    refused = [
        ("payload", errors.TooLarge, lambda: transitions.create(transitions.TaskSpec(title="t", payload=big),
                                                                using=alias)),
        ("payload", errors.TooLarge, lambda: transitions.edit("queued", actor="op", version=0, payload=big,
                                                              using=alias)),
        ("result", errors.TooLarge, lambda: transitions.complete("run", token, big, using=alias)),
        ("checkpoint", errors.TooLarge, lambda: transitions.renew("run", token, 60, checkpoint=big, using=alias)),
        ("checkpoint", errors.TooLarge, lambda: transitions.pause("run", token, big, using=alias)),
        ("error", errors.InvalidRequest, lambda: transitions.fail("run", token, over(MAX_ERROR_CHARS), using=alias)),
        ("title", errors.InvalidRequest, lambda: transitions.edit("queued", actor="op", version=0,
                                                                  title=over(MAX_TITLE_CHARS), using=alias)),
        ("reason", errors.InvalidRequest, lambda: transitions.cancel("queued", actor="op", reason=long_reason,
                                                                     using=alias)),
        ("reason", errors.InvalidRequest, lambda: transitions.admit("pending", actor="op", reason=long_reason,
                                                                    using=alias)),
        ("reason", errors.InvalidRequest, lambda: transitions.force_release("run", actor="op", reason=long_reason,
                                                                            using=alias)),
        ("reason", errors.InvalidRequest, lambda: transitions.force_pause("run", actor="op", reason=long_reason,
                                                                          using=alias)),
        ("reason", errors.InvalidRequest, lambda: transitions.cancel("queued", actor="op", reason="why\x00",
                                                                     using=alias)),
    ]
    before = db_state(alias)
    for field, error, call in refused:
        with pytest.raises(error) as caught:
            call()
        assert caught.value.field == field, (field, caught.value.message)
        if error is errors.TooLarge:
            assert caught.value.message == f"{field} {too_large}"
    assert db_state(alias) == before
    # At its cap each is taken (the refusals above were the caps, not the verbs).
    transitions.cancel("queued", actor="op", reason="r" * MAX_REASON_CHARS, using=alias)
    at_cap = {"blob": "x" * (MAX_JSON_FIELD_BYTES - len('{"blob":""}'))}
    assert transitions.complete("run", token, at_cap, using=alias).result == at_cap
