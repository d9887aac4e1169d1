"""The search grammar (board.engine.search) on every store: each qualifier finds exactly the tasks
it names (SQLite and PostgreSQL here; MongoDB in tests/mongodb/test_list_orders_mongodb.py), a bad
line is refused with what is wrong before anything is read, and the API's `search` and a task's
`tags` go through GET/POST /api/tasks (a refused create writes nothing)."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from board.engine import errors, listing, search, transitions
from board.engine.transitions import TaskSpec
from board.models import Task
from tests.support import db_state, plan_node_names, postgres_db_mark, sql_stores
from tests.test_api import agent, assert_error, get, http, post  # noqa: F401  (fixtures: agent, http)

ALL = {"a1", "a2", "a3", "a4", "a5", "a6"}


def _board(using: str) -> None:
    transitions.create([
        TaskSpec(id="a1", title="deploy web", queue="ci-web", tags=["urgent", "web", "urgent"],
                 payload={"repo": "acme/web", "n": 3, "nested": {"k": "v"}}),
        TaskSpec(id="a2", title="deploy api", queue="ci-api", tags=["web"], payload={"repo": "acme/api", "n": "3"}),
        TaskSpec(id="a3", title="Write docs", queue="docs"),
        TaskSpec(id="a4", title="flaky test", queue="ci-web"),
        TaskSpec(id="a5", title="report", queue="docs", tags=["repo:acme/web"]),
        TaskSpec(id="a6", title="flags", queue="docs", payload={"flag": True, "x": None}),
    ], actor="test", using=using)
    transitions.claim("a3", "worker-3", 600, using=using)
    lease = transitions.claim("a4", "worker-4", 600, using=using).lease
    transitions.fail("a4", lease.token, "connection Timeout after 30 s", retryable=False, using=using)
    lease = transitions.claim("a5", "worker-5", 600, using=using).lease
    transitions.complete("a5", lease.token, {"status": "error"}, using=using)


def found(line: str, using: str) -> set[str]:
    filters = listing.check_filters(search=line)
    return {task.pk for task in listing.task_list(search=filters.search, count=100, using=using)}


def check_search(using: str) -> None:
    """(tests/mongodb runs it on MongoDB too.)"""
    _board(using)
    assert Task.objects.using(using).get(pk="a1").tags == ["urgent", "web"]  # repeats dropped, order kept
    cases = {
        "tag:urgent": {"a1"}, "tag:web": {"a1", "a2"}, "tag:web tag:urgent": {"a1"}, "tag:repo:acme/web": {"a5"},
        "tag:urgen": set(),
        "queue:ci-*": {"a1", "a2", "a4"}, "queue:ci-web": {"a1", "a4"}, "queue:ci": set(), "queue:?ocs": {"a3", "a5", "a6"},
        "owner:worker-3": {"a3"}, "owner:worker-*": {"a3"}, "id:a?": ALL, "id:a1": {"a1"},
        "stage:failed": {"a4"}, "stage:FAILED stage:completed": {"a4", "a5"},
        "error:timeout": {"a4"}, 'error:"TIMEOUT after"': {"a4"}, "error:refused": set(),
        "payload.repo:acme/web": {"a1"}, "payload.n:3": {"a1", "a2"}, "payload.nested.k:v": {"a1"},
        "payload.flag:true": {"a6"}, "payload.x:null": {"a6"}, "payload.missing:null": set(),
        "result.status:error": {"a5"}, "result.status:ok": set(),
        "deploy": {"a1", "a2"}, "DEPLOY web": {"a1"}, '"deploy web"': {"a1"}, "deploy queue:docs": set(),
        "created:<1h": ALL, "created:>1h": set(), "updated:<1h stage:running": {"a3"},
    }
    for line, expected in cases.items():
        assert found(line, using) == expected, line
    # Ages and moments: a1 made three hours ago.
    Task.objects.using(using).filter(pk="a1").update(created_at=timezone.now() - timedelta(hours=3))
    assert found("created:>2h", using) == {"a1"}
    assert found("created:<2h", using) == ALL - {"a1"}
    moment = (timezone.now() - timedelta(hours=1)).isoformat()
    assert found(f"created:>{moment}", using) == ALL - {"a1"}
    assert found(f"created:<{moment} tag:web", using) == {"a1"}


@pytest.mark.parametrize("using", sql_stores())
def test_each_qualifier_finds_exactly_its_tasks(using):
    check_search(using)


@pytest.mark.parametrize("line, message", [
    ("foo:bar", "unknown qualifier 'foo'"),
    ('tag:"two words"', "is not a tag"),
    ("tag:-lead", "is not a tag"),
    ("stage:nope", "stage:nope is not a stage"),
    ("created:2h", "starts with < or >"),
    ("created:>2x", "an age (30m, 2h, 7d) or an ISO 8601 moment with its zone"),
    ("created:>2026-12-01T10:00", "an age (30m, 2h, 7d) or an ISO 8601 moment with its zone"),
    ('"unclosed', "an unclosed quote?"),
    ("payload.a..b:x", "a path is keys"),
    ("tag:", "has no value"),
    (" ".join(["w"] * 21), "at most 20 terms"),
    ("x" * 501, "at most 500 characters"),
])
def test_a_bad_search_line_says_what_is_wrong(line, message):
    with pytest.raises(errors.InvalidRequest) as refused:
        search.parse(line)
    assert message in str(refused.value) and refused.value.field == "search"


def test_an_empty_line_is_no_search():
    assert search.parse("") is None and search.parse("   ") is None and search.parse(None) is None


@pytest.mark.parametrize("tags, message", [
    ("urgent", "tags must be a list"),
    (["ok", "not ok"], "'not ok' is not a tag"),
    (["x" * 51], "is not a tag"),
    ([f"t{i}" for i in range(21)], "at most 20 tags"),
    ([3], "is not a tag"),
])
@pytest.mark.django_db(transaction=True)
def test_bad_tags_are_refused_and_create_nothing(tags, message):
    before = db_state()
    with pytest.raises(errors.InvalidRequest) as refused:
        transitions.create([TaskSpec(id="t", title="t", tags=tags)], actor="test")
    assert message in str(refused.value)
    assert db_state() == before


@pytest.mark.django_db(transaction=True)
def test_the_api_creates_tags_and_searches(http, agent):
    created = post(http, "/tasks", [{"id": "t1", "title": "t", "tags": ["urgent", "db"]},
                                    {"id": "t2", "title": "u", "tags": ["db"]}], agent)
    assert created.status_code == 201, created.content
    assert [t["tags"] for t in created.json()["items"]] == [["urgent", "db"], ["db"]]
    page = get(http, "/tasks?search=tag:db+tag:urgent", agent).json()
    assert [t["id"] for t in page["items"]] == ["t1"]
    assert [t["id"] for t in get(http, "/tasks?search=tag:db&order=newest", agent).json()["items"]] == ["t2", "t1"]
    before = db_state()
    assert_error(get(http, "/tasks?search=colour:blue", agent), 422, "validation_error")
    assert_error(post(http, "/tasks", {"id": "t3", "title": "t", "tags": ["no spaces"]}, agent), 422,
                 "validation_error")
    assert db_state() == before


@postgres_db_mark()[0]
@postgres_db_mark()[1]
def test_postgresql_answers_a_tag_and_a_payload_path_from_their_gin_indexes():
    """EXPLAIN with sequential scans off: the plan can use the indexes at all (at 100k tasks the
    planner picks them by itself: bench/search.py)."""
    rows = Task.objects.using("postgres")
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            for q in (search.parse("tag:urgent").q("postgres"), search.parse("payload.repo:acme/web").q("postgres")):
                names = plan_node_names(json.loads(rows.filter(q).explain(format="json")))
                assert any("task_tags_gin" in n or "task_payload_gin" in n for n in names), names
        finally:
            cursor.execute("SET enable_seqscan = on")
