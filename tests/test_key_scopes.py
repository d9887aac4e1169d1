"""Queue scopes of agent keys (issue 27, item 17), against the real server (`manage.py serve`)
on the real SQLite database, the MCP server driven by the MCP SDK, and claim-next's statement
on SQLite and PostgreSQL.

A key minted with `--queues ci-*,docs` creates, lists, reads, claims and acts only on tasks of
the queues matching its patterns. Every other task is absent to it: 404 `not_found` with the
very body an id that exists nowhere gets, 204 from claim-next, missing from lists. Creating a
task in another queue is refused 403 `forbidden` (the key is told which queues it has: there
is nothing to hide from it about itself); a dependency on a task it cannot see is an unknown
dependency, as if absent. Claim-next filters by the scope in the statement that picks and
claims the task, never by a check before it.
"""
from __future__ import annotations

import sys

import pytest

from board import agent_keys
from board.engine import scopes, transitions
from board.engine.transitions import TaskSpec
from board.models import AgentKey, Task
from tests.live_server import api_call, board_server  # noqa: F401  (fixture)
from tests.support import db_state, expire_lease, race, sql_stores, sqlite_db_mark

SCOPE = "ci-*,docs"


def seed_board():
    """Tasks in and out of SCOPE. The foreign ones come first in the claim order (higher
    priority), so a claim that ignores the scope takes one of them."""
    transitions.create([
        TaskSpec(id="s1", title="secret, best", queue="secret", priority=9),
        TaskSpec(id="s2", title="secret, held", queue="secret", priority=9),
        TaskSpec(id="s3", title="secret, paused", queue="secret", priority=9),
        TaskSpec(id="s4", title="secret, on hold", queue="secret", on_hold=True),
        TaskSpec(id="cix", title="not ci- (a prefix without the dash)", queue="cibuild", priority=8),
        TaskSpec(id="c1", title="ci", queue="ci-build", priority=1),
        TaskSpec(id="d1", title="docs", queue="docs"),
    ], actor="seed")


@pytest.fixture
def scoped(board_server):  # noqa: F811
    """(server, the scoped key, the foreign held task's token). A key of another agent holds
    s2 and s3 (s3 then paused); the scoped key is told s2's token, as a leak would."""
    seed_board()
    _, other = agent_keys.create_key("other")
    status, held = api_call(board_server, "POST", "/api/tasks/s2/claim", other, {"ttl_seconds": 600})
    assert status == 200, held
    status, paused = api_call(board_server, "POST", "/api/tasks/s3/claim", other, {"ttl_seconds": 600})
    assert status == 200
    assert api_call(board_server, "POST", "/api/tasks/s3/pause", other,
                    {"token": paused["lease"]["token"], "checkpoint": {"at": 1}})[0] == 200
    _, key = agent_keys.create_key("ci-agent", queues=SCOPE)
    return board_server, key, held["lease"]["token"]


def absent(answer, task_id: str) -> None:
    """The answer an id that exists nowhere gets."""
    status, body = answer
    assert (status, body) == (404, {"error": {"code": "not_found", "message": f"no task with id {task_id!r}"}}), \
        (status, body)


pytestmark = sqlite_db_mark()


def test_a_scoped_key_lists_and_reads_only_its_queues(scoped):
    server, key, _ = scoped
    status, page = api_call(server, "GET", "/api/tasks?limit=100", key)
    assert status == 200
    assert sorted(t["id"] for t in page["items"]) == ["c1", "d1"]
    status, page = api_call(server, "GET", "/api/tasks?queue=secret", key)
    assert (status, page["items"]) == (200, [])
    for task_id in ("s1", "s2", "cix", "nowhere"):
        absent(api_call(server, "GET", f"/api/tasks/{task_id}", key), task_id)
        absent(api_call(server, "GET", f"/api/tasks/{task_id}/events", key), task_id)
    assert api_call(server, "GET", "/api/tasks/c1", key)[1]["queue"] == "ci-build"
    assert api_call(server, "GET", "/api/tasks/d1/events", key)[0] == 200


def test_a_scoped_claim_takes_only_its_queues_then_answers_no_work(scoped):
    server, key, _ = scoped
    before = Task.objects.get(pk="s1").version
    taken = []
    for _ in range(3):
        status, claim = api_call(server, "POST", "/api/claim", key, {"ttl_seconds": 60})
        if status == 204:
            break
        assert status == 200, claim
        taken.append(claim["task"]["id"])
    assert taken == ["c1", "d1"], taken
    assert status == 204  # s1 and cix are QUEUED and first in line, but not this key's
    assert api_call(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "secret"})[0] == 204
    assert api_call(server, "POST", "/api/claim", key, {"ttl_seconds": 60, "queue": "secret",
                                                        "wait_seconds": 1})[0] == 204
    assert list(Task.objects.filter(pk__in=["s1", "cix"]).values_list("stage", flat=True)) == ["QUEUED", "QUEUED"]
    assert Task.objects.get(pk="s1").version == before


def test_a_scoped_key_cannot_act_on_a_foreign_task_even_with_its_token(scoped):
    server, key, token = scoped
    before = db_state()
    for path, body in [
        ("/api/tasks/s1/claim", {"ttl_seconds": 60}),
        ("/api/tasks/s3/resume", {"ttl_seconds": 60}),
        ("/api/tasks/s2/renew", {"token": token, "ttl_seconds": 60}),
        ("/api/tasks/s2/complete", {"token": token, "result": 1}),
        ("/api/tasks/s2/fail", {"token": token, "error": "no"}),
        ("/api/tasks/s2/pause", {"token": token, "checkpoint": {}}),
        ("/api/tasks/s2/release", {"token": token}),
    ]:
        absent(api_call(server, "POST", path, key, body), path.split("/")[3])
    assert db_state() == before


def test_a_scoped_key_creates_only_in_its_queues(scoped):
    server, key, _ = scoped
    before = db_state()
    status, body = api_call(server, "POST", "/api/tasks", key, {"id": "new", "title": "x", "queue": "secret"})
    assert (status, body["error"]["code"]) == (403, "forbidden"), body
    assert "ci-*" in body["error"]["message"] and "task" not in body["error"]
    status, body = api_call(server, "POST", "/api/tasks", key, [{"id": "n1", "title": "x", "queue": "docs"},
                                                               {"id": "n2", "title": "y"}])
    assert status == 403, body  # the default queue is not in ci-*,docs
    # A dependency on a task it cannot see is unknown, as an absent one is.
    status, body = api_call(server, "POST", "/api/tasks", key, {"id": "n3", "title": "z", "queue": "docs",
                                                               "deps": ["s1"]})
    assert status == 422 and body["error"]["message"] == "unknown dependencies: s1", body
    assert db_state() == before
    status, made = api_call(server, "POST", "/api/tasks", key, {"id": "n4", "title": "ok", "queue": "ci-x",
                                                               "deps": ["c1"]})
    assert (status, made["queue"]) == (201, "ci-x"), made


def test_a_scoped_key_hears_only_of_its_queues_problems(scoped):
    server, key, _ = scoped
    status, claim = api_call(server, "POST", "/api/claim", key, {"ttl_seconds": 60})
    assert (status, claim["task"]["id"]) == (200, "c1")
    expire_lease("c1")
    expire_lease("s2")  # held by the other agent, in the secret queue
    _, plain = agent_keys.create_key("plain")
    status, everything = api_call(server, "GET", "/api/check", plain)
    assert status == 200 and {p["task"] for p in everything["problems"]} == {"c1", "s2"}, everything
    status, mine = api_call(server, "GET", "/api/check", key)
    assert status == 200 and {p["task"] for p in mine["problems"]} == {"c1"}, mine


def test_a_scoped_operator_key_intervenes_only_in_its_queues(board_server):  # noqa: F811
    seed_board()
    _, op = agent_keys.create_key("ci-op", is_operator=True, queues=SCOPE)
    before = db_state()
    for verb in ("admit", "requeue", "cancel", "force-release", "force-pause"):
        task_id = "s4" if verb == "admit" else "s1"
        absent(api_call(board_server, "POST", f"/api/tasks/{task_id}/{verb}", op, {}), task_id)
    assert db_state() == before
    status, done = api_call(board_server, "POST", "/api/tasks/d1/cancel", op, {})
    assert (status, done["stage"]) == (200, "CANCELLED"), done


def test_the_mcp_server_inherits_the_keys_scope(scoped):
    from tests.test_mcp import mcp_session, server_env

    server, key, _ = scoped
    with mcp_session([sys.executable, "-m", "taskflow_client.mcp"], server_env(server, key)) as session:
        listed = session.ok("list_ready", {})
        assert sorted(t["id"] for t in listed["tasks"]) == ["c1", "d1"]
        assert session.refused("get_task", {"task_id": "s1"}, "not_found")["message"] == "no task with id 's1'"
        session.refused("claim", {"task_id": "s1"}, "not_found")
        assert session.ok("claim", {"queue": "secret"})["task"] is None
        first = session.ok("claim", {})["task"]["id"]
        second = session.ok("claim", {})["task"]["id"]
        assert [first, second] == ["c1", "d1"]
        assert session.ok("claim", {})["task"] is None
        session.ok("release", {"task_id": "c1"})
        session.ok("release", {"task_id": "d1"})
    assert Task.objects.get(pk="s1").stage == "QUEUED"


# ---------------------------------------------------------------------------------------------
# The claim's statement: the scope in the query that picks and CAS-claims the task, on each
# store and each path (the store's statements, "auto"; the ORM's pick, "orm").
# tests/mongodb/test_keys_mongodb.py runs the same checks on MongoDB.

PATHS = [pytest.param(alias, path, marks=store.marks, id=f"{store.id}-{path}")
         for store in sql_stores() for alias in [store.values[0]] for path in ("auto", "orm")]


@pytest.fixture
def hot_path(settings):
    def use(path: str) -> None:
        settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": path}
    return use


def check_patterns_match_exactly(alias: str) -> None:
    """`_` and `.` are literal, `?` is one character, matching is case-sensitive."""
    transitions.create([
        TaskSpec(id="under", title="_ is literal", queue="ci_x", priority=5),
        TaskSpec(id="other", title="what ci_x as LIKE would match", queue="ciAx", priority=9),
        TaskSpec(id="dot", title="what a.b as a regex would match", queue="aXb", priority=9),
        TaskSpec(id="case", title="upper case", queue="CI-1", priority=9),
        TaskSpec(id="mine", title="the one", queue="a.b", priority=1),
    ], actor="t", using=alias)
    scope = scopes.parse("ci_x,a.b,ci-?")
    got = [transitions.claim_next("w", 60, scope=scope, using=alias) for _ in range(3)]
    assert [c.task.pk if c else None for c in got] == ["under", "mine", None]
    assert transitions.claim_next("w", 60, queue="aXb", scope=scope, using=alias) is None
    assert Task.objects.using(alias).filter(stage="QUEUED").count() == 3


RACE_ROUNDS = 30


def check_scoped_claimers_race(alias: str) -> None:
    """Two scopes racing over one board (threads released by a barrier), RACE_ROUNDS rounds:
    every task in a scope is claimed exactly once, only by a claimer of that scope; the rest
    stay QUEUED."""
    for _ in range(RACE_ROUNDS):
        Task.objects.using(alias).filter(queue__in=["ci-a", "docs", "secret"]).delete()
        scoped_claimers_round(alias)


def scoped_claimers_round(alias: str) -> None:
    specs = [TaskSpec(id=f"{q}-{n}", title="x", queue=q) for q in ("ci-a", "docs", "secret") for n in range(6)]
    transitions.create(specs, actor="t", using=alias)
    scope_of = {"ci": scopes.parse("ci-*"), "docs": scopes.parse("docs")}
    calls = [(lambda who=who: (who, transitions.claim_next(f"{who}-agent", 60, scope=scope_of[who], using=alias)))
             for who in ("ci", "docs") for _ in range(8)]
    results = race(calls, alias)
    faults = [r for r in results if isinstance(r, BaseException)]
    assert faults == []  # an infrastructure fault is never counted as an empty claim
    claimed = [(who, c.task.pk) for who, c in results if c is not None]
    assert sorted(pk for _, pk in claimed) == sorted([f"ci-a-{n}" for n in range(6)] + [f"docs-{n}" for n in range(6)])
    assert all(pk.startswith("ci-a" if who == "ci" else "docs") for who, pk in claimed), claimed
    assert Task.objects.using(alias).filter(queue="secret", stage="QUEUED").count() == 6


@pytest.mark.parametrize(("alias", "path"), PATHS)
def test_claim_next_with_a_scope_matches_patterns_exactly_in_the_statement(alias, path, hot_path):
    hot_path(path)
    check_patterns_match_exactly(alias)


@pytest.mark.parametrize(("alias", "path"), PATHS)
def test_scoped_claimers_racing_take_only_their_queues_each_once(alias, path, hot_path):
    hot_path(path)
    check_scoped_claimers_race(alias)


def test_patterns_parse_strictly():
    assert scopes.parse(" ci-*, docs ,ci-*") == ("ci-*", "docs")
    assert scopes.parse("") is None and scopes.parse(None) is None
    for bad in ("ci-%", "a b", "-x", "x" * 101, "ci_[1]", ",".join(f"q{n}" for n in range(21))):
        with pytest.raises(scopes.BadScope):
            scopes.parse(bad)
    assert scopes.as_like("ci_?*") == r"ci\__%" and scopes.as_regex("a.b*") == r"^a\.b.*$"


# ---------------------------------------------------------------------------------------------
# Setting a scope: the command and the Keys admin


def test_create_agent_key_sets_the_queues_and_refuses_bad_patterns():
    import io

    from django.core.management import CommandError, call_command

    out, err = io.StringIO(), io.StringIO()
    call_command("create_agent_key", "ci-1", "--queues", "ci-*,docs", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert agent_keys.authenticate_deferred(key).scope == ("ci-*", "docs")
    assert "queues ci-*,docs" in err.getvalue()
    with pytest.raises(CommandError, match="queue pattern 'ci-%'"):
        call_command("create_agent_key", "ci-2", "--queues", "ci-%", stdout=io.StringIO(), stderr=io.StringIO())
    assert not AgentKey.objects.filter(name="ci-2").exists()


def test_the_keys_admin_sets_and_shows_the_queues():
    from django.urls import reverse

    from tests.test_access_admin import client_for, make_user

    clerk = client_for(make_user("clerk", ["board.view_agentkey", "board.add_agentkey"]))
    add = reverse("admin:board_agentkey_add")
    assert 'name="queues"' in clerk.get(add).content.decode()
    refused = clerk.post(add, {"name": "ci-1", "queues": "ci-*, a b"})
    assert refused.context["adminform"].form.errors["queues"][0].startswith("queue pattern 'a b'")
    assert not AgentKey.objects.exists()
    made = clerk.post(add, {"name": "ci-1", "queues": "ci-*, docs"})
    assert agent_keys.authenticate_deferred(made.context["key"]).scope == ("ci-*", "docs")
    agent_keys.create_key("free")
    listed = clerk.get(reverse("admin:board_agentkey_changelist")).content.decode()
    assert "ci-*, docs" in listed and "every queue" in listed
