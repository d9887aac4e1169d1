"""The board at any moment (issue 33, item 4; board.engine.moments, GET /api/board?at=).

A history made by the engine's own verbs on SQLite and PostgreSQL: after every move the board
as it is (every task's stage, version and owner, read from the tasks) is written down with the
moment of that move's row; the board rebuilt at that moment, and at moments between two moves,
must be exactly it. Then paging, scoped keys, check()'s problems at a past moment, the
retention boundary after a prune, and bad input refused with nothing written (over HTTP, on the
real server).
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from board import agent_keys
from board.engine import clock, moments, retention, transitions
from board.engine.lifecycle import Stage
from board.engine.stores import store
from board.engine.transitions import TaskSpec
from board.models import HistoryHorizon, Task, TaskEvent
from tests.live_server import api_call, board_server  # noqa: F401  (fixture)
from tests.support import db_state, sql_stores, sqlite_db_mark


def board_now(using: str) -> dict:
    """The board as the tasks say it is: id -> (stage, version, owner)."""
    return {pk: (stage, version, owner if stage == Stage.RUNNING else "")
            for pk, stage, version, owner in Task.objects.using(using).values_list("pk", "stage", "version", "owner")}


def rebuilt(at, using: str, **kw) -> dict:
    cards, after = {}, None
    while True:
        page = moments.board_at(at, after=after, limit=2, using=using, **kw)
        cards.update({c.id: (c.stage, c.version, c.owner) for c in page.tasks})
        if page.last is None:
            return cards
        after = page.last


def last_at(using: str):
    return TaskEvent.objects.using(using).order_by("-pk").values_list("at", flat=True).first()


def make_history(using: str) -> list[tuple]:
    """Moves by the engine; after each, (its row's at, the board then)."""
    seen = []

    def mark():
        seen.append((last_at(using), board_now(using)))

    transitions.create([TaskSpec(id="a", title="a", queue="ci-build"),
                        TaskSpec(id="b", title="b", queue="docs", deps=("a",))], actor="seed", using=using)
    mark()
    ca = transitions.claim("a", "agent-1", 60, using=using)
    mark()
    transitions.renew("a", ca.lease.token, 60, using=using)
    mark()
    transitions.pause("a", ca.lease.token, {"step": 1}, using=using)
    mark()
    ra = transitions.resume("a", "agent-2", 60, using=using)
    mark()
    transitions.create(TaskSpec(id="c", title="c", queue="secret"), actor="seed", using=using)
    mark()
    cc = transitions.claim("c", "agent-3", 60, using=using)
    mark()
    transitions.fail("c", cc.lease.token, "boom", retryable=False, using=using)
    mark()
    transitions.complete("a", ra.lease.token, {"ok": True}, using=using)
    mark()
    transitions.create(TaskSpec(id="d", title="d", queue="docs"), actor="seed", using=using)
    mark()
    transitions.cancel("d", actor="op", using=using)
    mark()
    return seen


@pytest.mark.parametrize("using", sql_stores())
def test_the_board_at_each_move_and_between_moves_is_the_board_as_it_was(using):
    check_moves(using)


def check_moves(using):
    seen = make_history(using)
    for at, board in seen:
        assert rebuilt(at, using) == board
        page = moments.board_at(at, using=using)
        assert page.counts == {s.value: sum(1 for v in board.values() if v[0] == s) for s in Stage}
        assert page.exact and page.exact_from is None
        following = TaskEvent.objects.using(using).filter(at__gt=at).order_by("at").values_list("at", flat=True).first()
        if following is not None:  # a moment between this move and the next row
            assert rebuilt(at + (following - at) / 2, using) == board
    # Before the first row: nothing; a task created after T is absent.
    first = seen[0][0]
    assert rebuilt(first - timedelta(microseconds=1), using) == {}
    assert "c" not in rebuilt(seen[4][0], using) and "c" in rebuilt(seen[5][0], using)
    # The owner is the agent whose resume started the stint, not the first claimer.
    assert rebuilt(seen[4][0], using)["a"][0] == Stage.RUNNING and rebuilt(seen[4][0], using)["a"][2] == "agent-2"


@pytest.mark.parametrize("using", sql_stores())
def test_pages_scopes_and_problems_at_a_past_moment(using):
    check_pages_scopes_problems(using)


def check_pages_scopes_problems(using):
    transitions.create([TaskSpec(id=f"t{i:02}", title="x", queue="ci-a" if i % 2 else "other") for i in range(7)],
                       actor="seed", using=using)
    at = last_at(using)
    first = moments.board_at(at, limit=3, using=using)
    assert [c.id for c in first.tasks] == ["t00", "t01", "t02"] and first.last == "t02"
    assert first.counts[Stage.QUEUED] == 7
    assert [c.id for c in moments.board_at(at, after="t05", limit=3, using=using).tasks] == ["t06"]
    scoped = moments.board_at(at, scope=("ci-*",), using=using)
    assert [c.id for c in scoped.tasks] == ["t01", "t03", "t05"] and scoped.counts[Stage.QUEUED] == 3
    # The step to the next event: a scoped key's steps go through its queues' rows only.
    transitions.create(TaskSpec(id="u1", title="x", queue="other"), using=using)
    transitions.create(TaskSpec(id="u2", title="x", queue="ci-a"), using=using)
    u1, u2 = (TaskEvent.objects.using(using).get(task_id=t).at for t in ("u1", "u2"))
    assert moments.events_around(at, using=using)[1] == u1
    assert moments.events_around(at, scope=("ci-*",), using=using)[1] == u2
    assert moments.events_around(u2, scope=("ci-*",), using=using)[0] <= at
    # A problem that existed at T and not now: a task claimed while its dependency was unfinished
    # (written by hand: the engine never does it), then the dependency completed.
    transitions.create([TaskSpec(id="dep", title="dep"), TaskSpec(id="w", title="w", deps=("dep",))], using=using)
    now = clock.now(using)
    later = now + timedelta(milliseconds=5)
    with store(using).write_transaction():  # on MongoDB, a transaction numbers the rows in commit order
        TaskEvent.objects.using(using).create(task_id="w", verb="claim", from_stage="PENDING", to_stage="RUNNING",
                                              version=5, fence=1, actor="rogue", at=now)
        TaskEvent.objects.using(using).create(task_id="dep", verb="complete", from_stage="RUNNING",
                                              to_stage="COMPLETED", version=9, fence=1, actor="x", at=later)
    found = moments.problems_at(now, using=using)
    assert [(p.task, p.code) for p in found] == [("w", "blocked_claim")]
    assert moments.problems_at(later, using=using) == []
    assert moments.problems_at(now, scope=("ci-*",), using=using) == []


@pytest.mark.parametrize("using", sql_stores())
def test_after_a_prune_a_moment_before_the_horizon_says_it_is_not_exact(using):
    check_horizon(using)


def check_horizon(using):
    transitions.create(TaskSpec(id="old", title="old"), using=using)
    claim = transitions.claim("old", "agent", 60, using=using)
    transitions.complete("old", claim.lease.token, {"ok": 1}, using=using)
    when = timezone.now() - timedelta(days=40)
    Task.objects.using(using).filter(pk="old").update(updated_at=when, stage_changed_at=when)
    TaskEvent.objects.using(using).filter(task_id="old").update(at=when)
    when = TaskEvent.objects.using(using).filter(task_id="old").values_list("at", flat=True).first()  # as stored
    transitions.create(TaskSpec(id="kept", title="kept"), using=using)
    retention.prune(using=using)
    assert not Task.objects.using(using).filter(pk="old").exists()
    (horizon,) = HistoryHorizon.objects.using(using).values_list("exact_from", flat=True)
    assert horizon == when
    before = moments.board_at(when - timedelta(seconds=1), using=using)
    assert (before.exact, before.exact_from) == (False, when)
    after = moments.board_at(clock.now(using), using=using)
    assert after.exact and [c.id for c in after.tasks] == ["kept"]
    # A later prune never moves the horizon back.
    retention.prune(using=using)
    assert HistoryHorizon.objects.using(using).get().exact_from == when


# ---------------------------------------------------------------------------------------------
# Over HTTP, on the real server (SQLite)


@pytest.mark.parametrize("_", [pytest.param(0, marks=sqlite_db_mark())])
def test_the_api_answers_pages_scopes_and_refuses_bad_input_writing_nothing(_, board_server):  # noqa: F811
    transitions.create([TaskSpec(id="c1", title="c1", queue="ci-build"),
                        TaskSpec(id="s1", title="s1", queue="secret")], actor="seed")
    at = last_at("default")
    claim = transitions.claim("c1", "agent-9", 60)
    _, key = agent_keys.create_key("reader")
    _, scoped = agent_keys.create_key("ci", queues="ci-*")
    moment = at.isoformat().replace("+00:00", "Z")
    status, body = api_call(board_server, "GET", f"/api/board?at={moment}&limit=1", key)
    assert status == 200, body
    assert body["counts"]["QUEUED"] == 2 and body["counts"]["RUNNING"] == 0
    assert body["tasks"] == [{"id": "c1", "stage": "QUEUED", "version": 0, "owner": ""}]
    assert body["exact"] is True and body["exact_from"] is None and body["problems"] == []
    assert body["next_event_at"] is not None
    status, more = api_call(board_server, "GET", f"/api/board?at={moment}&limit=1&cursor={body['next']}", key)
    assert status == 200 and [t["id"] for t in more["tasks"]] == ["s1"] and more["next"] is None
    now = clock.now().isoformat().replace("+00:00", "Z")
    status, body = api_call(board_server, "GET", f"/api/board?at={now}", scoped)
    assert status == 200 and body["tasks"] == [{"id": "c1", "stage": "RUNNING", "version": 1, "owner": "agent-9"}]
    assert sum(body["counts"].values()) == 1
    assert claim.lease.fence == 1
    before = db_state()
    future = (clock.now() + timedelta(hours=1)).isoformat()
    for query in ("", "?at=yesterday", "?at=2026-12-04T10:15:00", f"?at={future.replace('+00:00', 'Z')}",
                  f"?at={moment}&limit=0", f"?at={moment}&cursor=nope", f"?at={moment}&stage=QUEUED",
                  f"?at={moment}&limit=501"):
        status, body = api_call(board_server, "GET", "/api/board" + query, key)
        assert status == 422 and body["error"]["code"] == "validation_error", (query, body)
    # A cursor is good for its own moment only.
    cursor = api_call(board_server, "GET", f"/api/board?at={moment}&limit=1", key)[1]["next"]
    status, body = api_call(board_server, "GET", f"/api/board?at={now}&cursor={cursor}", key)
    assert status == 422 and "cursor" in body["error"]["message"]
    assert db_state() == before
    assert api_call(board_server, "GET", f"/api/board?at={moment}", None)[0] == 401


def naive_problems(at, using: str) -> list:
    """check() of the whole board rebuilt at `at` by folding every row (the definition
    problems_at is held to): every task that existed, every dependency."""
    from board.engine.invariants import TaskSnapshot, check
    from board.models import Dependency

    state = {}
    for task_id, stage in TaskEvent.objects.using(using).filter(at__lte=at).order_by("pk").values_list(
            "task_id", "to_stage"):
        state[task_id] = stage
    deps = {}
    for task_id, dep in Dependency.objects.using(using).values_list("task_id", "depends_on_id"):
        deps.setdefault(task_id, []).append(dep)
    far = moments._UNKNOWN_EXPIRY
    return check([TaskSnapshot(id=t, stage=s, deps=tuple(deps.get(t, ())), owner="x" if s == Stage.RUNNING else "",
                               has_token=s == Stage.RUNNING, lease_expires_at=far if s == Stage.RUNNING else None,
                               has_checkpoint=True, has_result=True) for t, s in state.items()], at)


@pytest.mark.parametrize("using", sql_stores())
def test_problems_at_equal_check_of_the_whole_rebuilt_board(using):
    check_problems_equal(using)


def check_problems_equal(using):
    """Dead ends, a chain stranded behind one, tasks run before their dependency finished and a
    cycle (rows written by hand where the engine refuses): at every row's moment, problems_at is
    check() of every task rebuilt with every dependency."""
    from board.models import Dependency

    transitions.create([TaskSpec(id="root", title="r"), TaskSpec(id="ok", title="ok")], using=using)
    transitions.create([TaskSpec(id="mid", title="m", deps=("root",)), TaskSpec(id="leaf", title="l", deps=("mid",)),
                        TaskSpec(id="side", title="s", deps=("root", "ok"))], using=using)
    claim = transitions.claim("ok", "a", 60, using=using)
    transitions.complete("ok", claim.lease.token, {"r": 1}, using=using)
    transitions.cancel("root", actor="op", using=using)  # mid, side: dead_dep; leaf: stranded
    transitions.create([TaskSpec(id="c1", title="c1"), TaskSpec(id="c2", title="c2", deps=("c1",))], using=using)
    Dependency.objects.using(using).create(task_id="c1", depends_on_id="c2")  # a cycle
    now = clock.now(using)
    with store(using).write_transaction():
        TaskEvent.objects.using(using).create(task_id="leaf", verb="claim", from_stage="PENDING", to_stage="RUNNING",
                                              version=9, fence=1, actor="rogue", at=now)
    moments_seen = sorted(set(TaskEvent.objects.using(using).values_list("at", flat=True)))
    some = False
    for at in moments_seen:
        expected = naive_problems(at, using)
        assert moments.problems_at(at, using=using) == expected, at
        assert moments.board_at(at, with_problems=True, using=using).problems == expected
        some = some or bool(expected)
    assert some and {p.code for p in naive_problems(now, using)} >= {"dead_dep", "dep_cycle", "blocked_claim"}
