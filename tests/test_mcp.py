"""The MCP server (`python -m taskflow_client.mcp`) driven by the MCP SDK's own stdio client
against the REAL board server (manage.py serve) on the test database.

The SDK client starts the MCP server as a subprocess, exactly as Claude Desktop or an IDE
would; the test code stays synchronous (so that it can read and age rows through the ORM) and
reaches the async client through an anyio blocking portal. Conditions in other processes are
awaited with `wait_until`, never a bare sleep.
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal
from django.utils import timezone
from mcp import Client as McpClient
from mcp import StdioServerParameters

from board import agent_keys
from board.engine import transitions
from board.models import Task, TaskEvent
from taskflow_client import Client
from tests import live_server
from tests.live_server import ROOT, wait_until
from tests.support import db_state, end_backoff, sqlite_db_mark

pytestmark = sqlite_db_mark()
board_server = live_server.board_server  # the module's real server (a fixture), used through `board`

AGENT = "mcp-agent"
TOOL_NAMES = {"create_tasks", "claim", "checkpoint", "complete", "fail", "pause", "resume", "release",
              "snooze", "get_task", "list_ready", "list_queues", "problems", "add_note", "request_approval"}
WAIT = 15.0  # deadline for conditions that take a heartbeat or two


class McpSession:
    """A connected MCP client session, called from synchronous test code."""

    def __init__(self, portal, client):
        self.portal = portal
        self.client = client

    def tools(self):
        return self.portal.call(self.client.list_tools).tools

    def call(self, name: str, arguments: dict) -> tuple[bool, dict]:
        """(is_error, the JSON body) of one tool call; the text and structured forms agree."""
        result = self.portal.call(self.client.call_tool, name, arguments)
        body = json.loads(result.content[0].text)
        assert result.structured_content == body
        return result.is_error, body

    def ok(self, name: str, arguments: dict) -> dict:
        is_error, body = self.call(name, arguments)
        assert not is_error, body
        return body

    def refused(self, name: str, arguments: dict, code: str) -> dict:
        is_error, body = self.call(name, arguments)
        assert is_error and body["error"]["code"] == code, body
        assert body["error"]["message"]
        return body["error"]


@contextlib.contextmanager
def mcp_session(command: list[str], env: dict, cwd=ROOT):
    """Start the MCP server with the SDK's stdio client; closing the session ends the server."""
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(cwd))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(McpClient(params)) as client:
        yield McpSession(portal, client)


def server_env(board, key: str) -> dict:
    return {"TASKFLOW_URL": board.url, "TASKFLOW_KEY": key, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def board(request):
    return request.getfixturevalue("board_server")


@pytest.fixture
def key(board):
    """A fresh agent key (the database is emptied after each test)."""
    return agent_keys.create_key(AGENT)[1]


@pytest.fixture
def session(board, key):
    with mcp_session([sys.executable, "-m", "taskflow_client.mcp"], server_env(board, key)) as session:
        yield session


def events(task_id):
    return list(TaskEvent.objects.filter(task_id=task_id).order_by("id").values_list("verb", "actor"))


def verbs(task_id):
    return [verb for verb, _ in events(task_id)]


# ---------------------------------------------------------------------------------------------


def test_tools_then_the_full_cycle_plan_claim_checkpoint_complete_fail_and_retry(session):
    tools = session.tools()
    assert {tool.name for tool in tools} == TOOL_NAMES
    for tool in tools:
        assert 0 < len(tool.description) <= 250, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False, tool.name
    # Tool schemas cost tokens on every request the model makes: keep the whole list small.
    listing = json.dumps([t.model_dump(by_alias=True, exclude_none=True) for t in tools], separators=(",", ":"))
    print(f"tools/list: {len(tools)} tools, {len(listing)} characters of JSON")
    assert len(listing) < 5000

    made = session.ok("create_tasks", {"tasks": [
        {"id": "fetch", "title": "fetch the pages", "payload": {"url": "https://example.org"}},
        {"id": "parse", "title": "parse them", "deps": ["fetch"]},
    ]})
    assert made == {"tasks": [{"id": "fetch", "stage": "QUEUED"},
                              {"id": "parse", "stage": "PENDING", "deps": ["fetch"]}]}

    first = session.ok("claim", {"ttl_seconds": 30})["task"]
    assert (first["id"], first["stage"], first["owner"], first["payload"]) == (
        "fetch", "RUNNING", AGENT, {"url": "https://example.org"})
    assert "token" not in json.dumps(first)  # the lease token stays in the MCP server

    saved = session.ok("checkpoint", {"task_id": "fetch", "checkpoint": {"page": 1}, "progress": 0.5})["task"]
    assert (saved["checkpoint"], saved["progress"]) == ({"page": 1}, 0.5)
    row = Task.objects.get(pk="fetch")
    assert (row.checkpoint, row.progress) == ({"page": 1}, 0.5)

    done = session.ok("complete", {"task_id": "fetch", "result": {"pages": 3}})["task"]
    assert (done["stage"], done["result"]) == ("COMPLETED", {"pages": 3})

    claimed = session.ok("claim", {"ttl_seconds": 30})
    second = claimed["task"]
    assert (second["id"], second["stage"], second["fence"]) == ("parse", "RUNNING", 1)
    assert claimed["inputs"] == {"fetch": {"pages": 3}}  # its dependency's result, handed over
    noted = session.ok("add_note", {"task_id": "parse", "text": "the parser chokes on tables"})["note"]
    assert noted["attempt"] == 1
    failed = session.ok("fail", {"task_id": "parse", "error": "the parser crashed"})["task"]
    assert (failed["stage"], failed["attempts"], failed["error"]) == ("QUEUED", 1, "the parser crashed")
    assert failed["not_before"]  # backing off: not claimable yet
    assert session.ok("claim", {})["task"] is None
    ready = session.ok("list_ready", {})
    assert ready["tasks"] == [{"id": "parse", "title": "parse them", "queue": "default", "priority": 0,
                               "attempts": 1, "not_before": failed["not_before"]}]
    assert ready["held_by_you"] == []

    end_backoff("parse")  # the backoff has passed (written into the row)
    claimed = session.ok("claim", {"ttl_seconds": 30})
    again = claimed["task"]
    assert (again["id"], again["stage"], again["attempts"], again["fence"]) == ("parse", "RUNNING", 2, 2)
    # The next attempt reads what the last one wrote.
    assert claimed["notes"] == [{"text": "the parser chokes on tables", "author": AGENT, "attempt": 1}]
    session.ok("complete", {"task_id": "parse", "result": {"rows": 7}})

    shown = session.ok("get_task", {"task_id": "parse"})
    assert shown["task"]["result"] == {"rows": 7}
    assert [(e["verb"], e["actor"]) for e in shown["history"] if e["actor"] == AGENT] == [
        ("create", AGENT), ("claim", AGENT), ("fail", AGENT), ("claim", AGENT), ("complete", AGENT)]
    assert events("parse") == [("create", AGENT), ("admit", "system"), ("claim", AGENT), ("fail", AGENT),
                               ("retry", "system"), ("claim", AGENT), ("complete", AGENT)]
    assert events("fetch") == [("create", AGENT), ("claim", AGENT), ("renew", AGENT), ("complete", AGENT)]
    session.ok("create_tasks", {"tasks": [{"id": "tagged", "title": "t", "tags": ["urgent", "repo:acme/web"]}]})
    assert session.ok("get_task", {"task_id": "tagged", "history": False})["task"]["tags"] == ["urgent", "repo:acme/web"]
    assert session.ok("problems", {}) == {"problems": []}


def test_held_leases_are_renewed_while_the_model_thinks_and_released_when_the_session_ends(board, key):
    ttl = 2
    with mcp_session([sys.executable, "-m", "taskflow_client.mcp"], server_env(board, key)) as session:
        session.ok("create_tasks", {"tasks": [{"id": "slow", "title": "long thought"},
                                              {"id": "also", "title": "held too"}]})
        claimed_at = timezone.now()
        assert session.ok("claim", {"task_id": "slow", "ttl_seconds": ttl})["task"]["owner"] == AGENT
        session.ok("claim", {"task_id": "also", "ttl_seconds": 60})

        def renewed_past_three_ttls():
            return (verbs("slow").count("renew") >= 3
                    and timezone.now() > claimed_at + timedelta(seconds=3 * ttl))

        # The model does nothing; only the server's heartbeat keeps the lease.
        wait_until(renewed_past_three_ttls, WAIT, "three renewals past three TTLs")
        row = Task.objects.get(pk="slow")
        assert (row.stage, row.owner, row.fence) == ("RUNNING", AGENT, 1)
        assert row.lease_expires_at > timezone.now()
        shown = session.ok("get_task", {"task_id": "slow"})
        renewals = [e for e in shown["history"] if e["verb"] == "renew"]
        assert len(renewals) == 1 and renewals[0]["count"] >= 3 and renewals[0]["actor"] == AGENT
        assert session.ok("list_ready", {})["held_by_you"] == ["also", "slow"]
    # The session is closed: the server released what it held before it exited.
    for task_id in ("slow", "also"):
        row = Task.objects.get(pk=task_id)
        assert (row.stage, row.owner, row.attempts) == ("QUEUED", "", 0)
        assert events(task_id)[-1] == ("release", AGENT)
    assert set(verbs("slow")) == {"create", "claim", "renew", "release"}


def mcp_server_pid() -> int:
    """The MCP server the SDK client started: this process's child running taskflow_client.mcp."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if ppid == os.getpid() and b"taskflow_client.mcp" in cmdline:
            found.append(int(proc.name))
    assert len(found) == 1, found
    return found[0]


def test_sigterm_ends_the_session_and_releases_what_it_held(session):
    """An MCP client that stops its server with a signal (the SDK's does, after a grace
    period) gets the leases released too."""
    session.ok("create_tasks", {"tasks": [{"id": "held", "title": "held when the signal comes"}]})
    session.ok("claim", {"ttl_seconds": 60})
    os.kill(mcp_server_pid(), signal.SIGTERM)
    wait_until(lambda: events("held")[-1] == ("release", AGENT), WAIT, "the lease released")
    row = Task.objects.get(pk="held")
    assert (row.stage, row.owner, row.attempts) == ("QUEUED", "", 0)


def test_bad_input_is_refused_with_a_tool_error_and_changes_nothing(session, board):
    session.ok("create_tasks", {"tasks": [{"id": "a", "title": "a"}, {"id": "b", "title": "b"},
                                          {"id": "gone", "title": "its lease is taken away"}]})
    bob = agent_keys.create_key("bob")[1]
    Client(board.url, bob).claim("b", 60)
    session.ok("claim", {"task_id": "gone", "ttl_seconds": 60})
    transitions.force_release("gone", actor="operator", reason="test")
    before, listed = db_state(), session.ok("list_ready", {})

    # Arguments that do not fit the schema: nothing reaches the board.
    error = session.refused("create_tasks", {"tasks": [{"title": "x", "colour": "red"}]}, "validation_error")
    assert error["details"] == [{"at": "tasks/0",
                                 "problem": "Additional properties are not allowed ('colour' was unexpected)"}]
    session.refused("create_tasks", {"tasks": []}, "validation_error")
    session.refused("create_tasks", {"tasks": [{"id": "c", "title": "c"}], "dry_run": True}, "validation_error")
    error = session.refused("claim", {"ttl_seconds": "soon"}, "validation_error")
    assert error["details"][0]["at"] == "ttl_seconds" and "not of type 'number'" in error["details"][0]["problem"]
    session.refused("claim", {"ttl_seconds": 0.5}, "validation_error")
    error = session.refused("complete", {"result": {}}, "validation_error")
    assert "'task_id' is a required property" in error["details"][0]["problem"]
    session.refused("checkpoint", {"task_id": "a", "checkpoint": None}, "validation_error")
    session.refused("fail", {"task_id": "a", "error": ""}, "validation_error")
    session.refused("claim", {"task_id": "a", "queue": "default"}, "validation_error")
    session.refused("delete_everything", {}, "unknown_tool")
    # Well-formed, but the board (or this session) says no: the board's own codes.
    error = session.refused("claim", {"task_id": "b"}, "taken")
    assert error["task"] == {"id": "b", "stage": "RUNNING", "owner": "bob"}
    session.refused("claim", {"task_id": "nope"}, "not_found")
    session.refused("create_tasks", {"tasks": [{"id": "a", "title": "another a"}]}, "duplicate_id")
    session.refused("create_tasks", {"tasks": [{"id": "d", "title": "d", "deps": ["missing"]}]}, "validation_error")
    session.refused("complete", {"task_id": "a"}, "not_held")
    session.refused("complete", {"task_id": "gone", "result": {"late": True}}, "lease_lost")
    session.refused("release", {"task_id": "gone"}, "not_held")  # a lost lease leaves the session

    assert db_state() == before
    after = session.ok("list_ready", {})
    assert after["tasks"] == listed["tasks"] and [t["id"] for t in after["tasks"]] == ["a", "gone"]
    assert (listed["held_by_you"], after["held_by_you"]) == (["gone"], [])  # the lost lease was let go


def test_the_readme_configuration_starts_the_server(board, key):
    """docs/mcp.md's mcpServers block is what --print-config prints for this checkout, and that
    command, run from another directory with only its env, serves the board."""
    section = (ROOT / "docs" / "mcp.md").read_text()
    shown = json.loads(re.search(r"```json\n(.*?)```", section, flags=re.DOTALL).group(1))
    printed = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "taskflow_client.mcp", "--print-config"],
                             check=False, capture_output=True, text=True, cwd=ROOT, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "TASKFLOW_URL": board.url, "TASKFLOW_KEY": key})
    assert printed.returncode == 0, printed.stderr
    config = json.loads(printed.stdout)
    entry = config["mcpServers"]["taskflow"]
    placeholders = {"/path/to/taskflow": str(ROOT), "http://127.0.0.1:8000": board.url, "tfk_...": key}
    expected = json.loads(re.sub("|".join(map(re.escape, placeholders)), lambda m: placeholders[m.group()],
                                 json.dumps(shown)))
    assert config == expected

    with mcp_session([entry["command"], *entry["args"]], entry["env"], cwd="/") as session:
        session.ok("create_tasks", {"tasks": [{"id": "hello", "title": "from the documented config"}]})
        assert session.ok("claim", {})["task"]["owner"] == AGENT
        session.ok("complete", {"task_id": "hello", "result": {"ok": True}})
    assert Task.objects.get(pk="hello").stage == "COMPLETED"


# ---------------------------------------------------------------------------------------------
# What the reading tools cost the board: one request each, however big the queue or the history.

QUEUED_TASKS = 5_100  # more than ten pages of the API's largest (500): paging would show


def make_queued(count: int) -> None:
    """`count` QUEUED tasks of priorities 0-6, created in batches (a batch shares its
    created_at, so the id breaks ties as in a claim)."""
    for start in range(0, count, 1000):
        transitions.create([transitions.TaskSpec(title=f"task {i}", id=f"q{i:05d}", priority=i % 7)
                            for i in range(start, min(count, start + 1000))], actor="test")


@contextlib.contextmanager
def counted_session(board, key):
    """An MCP session whose every request to the board goes through a proxy that lists them."""
    from tests.test_client import ReplyDropper  # a proxy that here drops nothing and records every path

    with ReplyDropper(board.port, paths=(), drop=0) as proxy, \
            mcp_session([sys.executable, "-m", "taskflow_client.mcp"],
                        {**server_env(board, key), "TASKFLOW_URL": proxy.url}) as session:
        yield session, proxy.forwarded


def test_list_ready_is_one_request_in_claim_order_however_long_the_queue(board, key):
    make_queued(QUEUED_TASKS)
    with counted_session(board, key) as (session, requests):
        started = time.perf_counter()
        ready = session.ok("list_ready", {"limit": 5})
        first = time.perf_counter() - started
        assert len(requests) == 1 and requests[0].startswith("/api/tasks?"), requests
        assert ready["more"] is True and ready["held_by_you"] == []
        listed = [t["id"] for t in ready["tasks"]]
        assert len(listed) == 5 and all(t["priority"] == 6 for t in ready["tasks"])
        started = time.perf_counter()
        assert session.ok("list_ready", {"limit": 5}) == ready and len(requests) == 2
        print(f"list_ready limit=5 on {QUEUED_TASKS} QUEUED tasks: 1 request a call; {first:.3f} s the "
              f"session's first call, {time.perf_counter() - started:.3f} s the next (through the counting proxy)")
        # The order is what claims take, one after another.
        taken = [session.ok("claim", {"ttl_seconds": 30})["task"]["id"] for _ in listed]
        assert taken == listed
        requests.clear()
        everything = session.ok("list_ready", {"limit": 100})
        assert len(requests) == 1 and len(everything["tasks"]) == 100, requests
        assert set(everything["held_by_you"]) == set(listed)
        ids = [t["id"] for t in everything["tasks"]]
        assert not set(ids) & set(listed)
        assert ids == list(Task.objects.filter(stage="QUEUED").order_by("claim_rank", "id")
                           .values_list("id", flat=True)[:100])


HISTORY_RENEWS = 450  # with the create and the claim, more than four pages of 100 events


def test_get_task_reads_the_recent_history_in_one_request_however_long_it_is(board, key):
    transitions.create([transitions.TaskSpec(title="long runner", id="long")], actor="test")
    token = transitions.claim("long", AGENT, 600).lease.token
    for i in range(HISTORY_RENEWS):
        transitions.renew("long", token, 600, progress=i / HISTORY_RENEWS)
    transitions.release("long", token)
    with counted_session(board, key) as (session, requests):
        shown = session.ok("get_task", {"task_id": "long"})
        history_reads = [path for path in requests if path.startswith("/api/tasks/long/events")]
        assert len(history_reads) == 1 and len(requests) == 2, requests
    # The most recent events, oldest first: the renews end in the release, and the answer says
    # that earlier events were left out.
    assert [line["verb"] for line in shown["history"]] == ["renew", "release"]
    assert shown["history"][-1]["to"] == "QUEUED"
    assert shown["history_truncated"] is True
    short = transitions.create([transitions.TaskSpec(title="short", id="short")], actor="test")
    assert short
    with counted_session(board, key) as (session, requests):
        shown = session.ok("get_task", {"task_id": "short"})
        assert len(requests) == 2, requests
    assert [line["verb"] for line in shown["history"]] == ["create"] and "history_truncated" not in shown


def test_list_queues_shows_the_brake_and_the_limits_and_create_takes_a_concurrency_key(session, board):
    """Flow control (issue 29) through the tools: a key's limit set at create, a queue paused by an
    operator (the MCP server has no operator tools: the operator uses the Python client), and what
    list_queues and a refused claim tell the model. Bad fields are refused before anything is sent."""
    operator = agent_keys.create_key("mcp-operator", is_operator=True)[1]
    made = session.ok("create_tasks", {"tasks": [
        {"id": "w1", "title": "deploy", "queue": "deploy", "concurrency_key": "repo:acme/web", "concurrency_limit": 1},
        {"id": "w2", "title": "deploy", "queue": "deploy", "concurrency_key": "repo:acme/web"},
        {"id": "b1", "title": "build", "queue": "ci"},
    ]})
    assert [t["id"] for t in made["tasks"]] == ["w1", "w2", "b1"]
    assert Task.objects.get(pk="w2").concurrency_key == "repo:acme/web"
    with Client(board.url, operator, timeout=10) as client:
        client.queue("ci").pause(reason="runner outage")

    assert session.ok("claim", {"queue": "ci"}) == {"task": None, "message": "no task is ready"}
    error = session.refused("claim", {"task_id": "b1"}, "blocked")
    assert error["details"]["waiting"] == "queue ci is paused"
    assert session.ok("claim", {})["task"]["id"] == "w1"
    error = session.refused("claim", {"task_id": "w2"}, "blocked")
    assert error["details"]["waiting"] == "repo:acme/web is at its limit 1/1"

    listed = session.ok("list_queues", {})
    assert listed == {"more": False, "queues": [
        {"name": "ci", "running": 0, "paused": True, "paused_by": "mcp-operator", "paused_reason": "runner outage",
         "depth": {"QUEUED": 1}, "oldest_queued_seconds": listed["queues"][0]["oldest_queued_seconds"]},
        {"name": "deploy", "running": 1, "depth": {"QUEUED": 1, "RUNNING": 1},
         "oldest_queued_seconds": listed["queues"][1]["oldest_queued_seconds"]},
    ]}
    assert session.ok("list_queues", {"limit": 1})["more"] is True

    before = db_state()
    for task in ({"title": "t", "concurrency_key": ""}, {"title": "t", "concurrency_key": "k" * 201},
                 {"title": "t", "concurrency_key": "k", "concurrency_limit": 0},
                 {"title": "t", "concurrency_key": "k", "concurrency_limit": 10_001}):
        session.refused("create_tasks", {"tasks": [task]}, "validation_error")
    session.refused("create_tasks", {"tasks": [{"title": "t", "concurrency_limit": 2}]}, "validation_error")  # the board's
    session.refused("list_queues", {"limit": 0}, "validation_error")
    session.refused("list_queues", {"paused": True}, "validation_error")
    assert db_state() == before


def test_snooze_gives_the_task_back_not_claimable_for_a_while(session):
    """A model that cannot proceed yet snoozes the task: QUEUED again with its not_before set,
    the attempt not counted, and nothing claimable meanwhile. A bad duration changes nothing."""
    session.ok("create_tasks", {"tasks": [{"id": "z1", "title": "wait for the upstream"}]})
    assert session.ok("claim", {})["task"]["id"] == "z1"
    before = db_state()
    for seconds in (0, 604_801, "60"):
        session.refused("snooze", {"task_id": "z1", "seconds": seconds}, "validation_error")
    assert db_state() == before
    snoozed = session.ok("snooze", {"task_id": "z1", "seconds": 120})["task"]
    assert (snoozed["stage"], Task.objects.get(pk="z1").attempts) == ("QUEUED", 0)
    assert Task.objects.get(pk="z1").not_before is not None
    assert session.ok("claim", {}) == {"task": None, "message": "no task is ready"}


def test_a_model_asks_a_person_gives_the_lease_up_and_claims_the_answer_back(session):
    """request_approval does not wait (a tool call must not hang while a person thinks): the lease
    is given up with the question; once answered, claiming the task carries the answer. A bad
    form is refused and changes nothing."""
    session.ok("create_tasks", {"tasks": [{"id": "g1", "title": "migrate the orders table"}]})
    assert session.ok("claim", {})["task"]["id"] == "g1"
    before = db_state()
    session.refused("request_approval", {"task_id": "g1", "question": "ok?", "form": {"type": "array"}},
                    "validation_error")
    assert db_state() == before
    form = {"type": "object", "properties": {"window": {"type": "string"}}, "required": ["window"]}
    asked = session.ok("request_approval", {"task_id": "g1", "question": "which maintenance window?", "form": form})
    assert (asked["task"]["stage"], asked["approval"]["state"]) == ("PAUSED", "waiting")
    session.refused("checkpoint", {"task_id": "g1", "progress": 0.5}, "not_held")  # the lease went with the question
    transitions.answer("g1", True, actor="dba", values={"window": "sunday 02:00"})
    claimed = session.ok("claim", {"task_id": "g1"})
    assert claimed["approval"] == {"question": "which maintenance window?", "approved": True,
                                   "values": {"window": "sunday 02:00"}, "comment": "", "answered_by": "dba"}
    assert session.ok("complete", {"task_id": "g1", "result": {"ok": True}})["task"]["stage"] == "COMPLETED"
    assert verbs("g1") == ["create", "claim", "ask", "answer", "claim", "complete"]


def test_complete_with_next_claims_the_next_task_in_the_same_request(session, board):
    """complete {next: true, queue} completes and claims in one request: the next task is held
    by the session as a claim's (renewed, listed, finished by the tools); null when none is ready."""
    session.ok("create_tasks", {"tasks": [{"id": "n1", "title": "first", "queue": "nx", "priority": 2},
                                          {"id": "n2", "title": "second", "queue": "nx", "priority": 1},
                                          {"id": "elsewhere", "title": "another queue's"}]})
    assert session.ok("claim", {"queue": "nx"})["task"]["id"] == "n1"
    answer = session.ok("complete", {"task_id": "n1", "result": {"a": 1}, "next": True, "queue": "nx"})
    assert (answer["task"]["id"], answer["task"]["stage"]) == ("n1", "COMPLETED")
    assert (answer["next"]["id"], answer["next"]["stage"]) == ("n2", "RUNNING")
    assert session.ok("list_ready", {})["held_by_you"] == ["n2"]
    assert verbs("n1") == ["create", "claim", "complete"] and verbs("n2") == ["create", "claim"]
    answer = session.ok("complete", {"task_id": "n2", "result": {"b": 2}, "next": True, "queue": "nx"})
    assert answer["task"]["stage"] == "COMPLETED" and answer["next"] is None
    assert session.ok("list_ready", {})["held_by_you"] == []
    assert Task.objects.get(pk="elsewhere").stage == "QUEUED"  # another queue's task was left alone
    session.refused("complete", {"task_id": "n2", "next": "yes"}, "validation_error")


def test_a_session_started_with_fewer_capabilities_claims_only_what_they_allow(board):
    """TASKFLOW_CAPABILITIES narrows every claim of the session to those of its key's labels
    (docs/capabilities.md): a key holding gpu and python, started with python only, takes the
    python task and leaves the gpu one; a label the key lacks is refused, nothing claimed."""
    key = agent_keys.create_key(AGENT, capabilities="gpu,python")[1]
    transitions.create([transitions.TaskSpec(id="train", title="train", requires=["gpu"], priority=5),
                        transitions.TaskSpec(id="lint", title="lint", requires=["python"])])
    env = {**server_env(board, key), "TASKFLOW_CAPABILITIES": "python"}
    with mcp_session([sys.executable, "-m", "taskflow_client.mcp"], env) as narrowed:
        assert narrowed.ok("claim", {})["task"]["id"] == "lint"
        assert narrowed.ok("claim", {})["task"] is None  # train needs gpu: not this session's
    assert Task.objects.get(pk="train").stage == "QUEUED"
    env = {**server_env(board, key), "TASKFLOW_CAPABILITIES": "python,model:opus"}
    with mcp_session([sys.executable, "-m", "taskflow_client.mcp"], env) as widened:
        widened.refused("claim", {}, "forbidden")
    assert Task.objects.get(pk="train").stage == "QUEUED"
    with mcp_session([sys.executable, "-m", "taskflow_client.mcp"], server_env(board, key)) as whole:
        assert whole.ok("claim", {})["task"]["id"] == "train"  # the key's own labels: gpu too
