"""board.live.insights on SQLite and PostgreSQL: exact agents, throughput and queue depths after a
scripted set of transitions, each stamped at a chosen time (the history rows are written with
their `at`, never waited for), computed at a controlled `now`."""
from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction

from board.engine import transitions, usage
from board.engine.transitions import TaskSpec
from board.live import insights, reads
from board.models import Task, TaskEvent, TaskUsage
from tests.support import postgres_db_mark, sql_stores

STORES = sql_stores()
QUEUES = ("ingest", "ux", "mail")

NOW = datetime(2026, 1, 1, 12, 30, 20, tzinfo=UTC)  # the window's buckets start at 11:31


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


class Script:
    """Runs transitions and stamps the history rows each step wrote with the step's time."""

    def __init__(self, using: str):
        self.using = using
        self.stamped = 0

    def at(self, when: datetime, step):
        result = step()
        rows = TaskEvent.objects.using(self.using).filter(id__gt=self.stamped)
        self.stamped = max(rows.values_list("id", flat=True))
        rows.update(at=when)
        return result


@pytest.fixture
def scripted(request):
    return run_script(request.param)


def run_script(using: str) -> str:
    s = Script(using)
    s.at(ago(90), lambda: transitions.create(
        [TaskSpec(id=f"a{i}", title="alpha", queue="alpha") for i in (1, 2, 3)]
        + [TaskSpec(id="b1", title="beta", queue="beta")], actor="creator", using=using))
    # cy claimed a3 before the window and has not renewed in it: it holds a3, no heartbeat.
    a3 = s.at(ago(70), lambda: transitions.claim("a3", "cy", 3600, using=using))
    s.at(ago(65), lambda: transitions.renew("a3", a3.lease.token, 3600, using=using))
    a1 = s.at(ago(50), lambda: transitions.claim("a1", "ann", 3600, using=using))
    s.at(ago(49.9), lambda: transitions.complete("a1", a1.lease.token, {"ok": True}, using=using))
    a2 = s.at(ago(25), lambda: transitions.claim("a2", "bob", 3600, using=using))
    # FAIL then RETRY (by "system"): back to QUEUED in the same minute.
    s.at(ago(20), lambda: transitions.fail("a2", a2.lease.token, "boom", using=using))
    b1 = s.at(ago(5), lambda: transitions.claim("b1", "bob", 3600, using=using))
    s.at(ago(2), lambda: transitions.renew("b1", b1.lease.token, 3600, using=using))
    return using


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_agents_throughput_and_queue_depth_are_exact(scripted):
    assert_exact(scripted)


def assert_exact(scripted: str) -> None:
    """The panel's data after run_script(), item by item (tests/mongodb runs it on MongoDB)."""
    data, first_id = insights.compute(NOW, using=scripted)
    assert (data["type"], data["start"], data["minutes"]) == ("insights", "2026-01-01T11:31:00Z", 60)

    completed, failed = [0] * 60, [0] * 60
    completed[9] = 1  # 11:40:20 (a1)
    failed[39] = 1  # 12:10:20 (a2)
    assert data["throughput"] == {"completed": completed, "failed": failed}

    # Each minute's most: alpha: a1 and a2 queued before the window; a1 claimed (minute 9: 2
    # then 1), a2 claimed (34: 1 then 0) and back after its failure (39: 0 then 1). beta: b1
    # claimed in minute 54 (1 then 0).
    assert data["queue_depth"] == {
        "alpha": [2] * 10 + [1] * 25 + [0] * 4 + [1] * 21,
        "beta": [1] * 55 + [0] * 5,
    }
    assert data["queued_now"] == {"alpha": 1, "beta": 0}
    assert data["agents"] == [
        {"name": "ann", "holds": [], "holding": 0, "last_heartbeat": "2026-01-01T11:40:20Z",
         "completed": 1, "failed": 0, "usage": None},
        {"name": "bob", "holds": ["b1"], "holding": 1, "last_heartbeat": "2026-01-01T12:28:20Z",
         "completed": 0, "failed": 1, "usage": None},
        {"name": "cy", "holds": ["a3"], "holding": 1, "last_heartbeat": None, "completed": 0, "failed": 0,
         "usage": None},
    ]
    assert (data["more_agents"], data["more_queues"]) == (0, 0)
    # The last hour's waits and runs (board.engine.timing): a1 waited 40 min and ran 6 s, a2
    # waited 65 min and ran 5 min before failing; b1 waited 85 min and runs still; a3's wait
    # ended before the hour.
    assert data["timing"] == {
        "alpha": {"wait": {"count": 2, "p50": 2400, "p95": 3900}, "run": {"count": 2, "p50": 6, "p95": 300}},
        "beta": {"wait": {"count": 1, "p50": 5100, "p95": 5100}, "run": {"count": 0, "p50": None, "p95": None}},
    }
    first_in_window = TaskEvent.objects.using(scripted).filter(at__gte=datetime(2026, 1, 1, 11, 31, tzinfo=UTC))
    assert first_id == min(first_in_window.values_list("id", flat=True))
    assert "token" not in repr(data).lower()


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_the_depth_is_exact_when_the_moved_tasks_queues_are_read_by_their_last_change(scripted, monkeypatch):
    # A busy hour's thousands of moved tasks: their queues are read by updated_at, not by id.
    monkeypatch.setattr(reads, "MOVED_BY_ID_MAX", 0)
    assert_exact(scripted)


@pytest.mark.parametrize("using", STORES)
def test_a_moved_task_whose_last_change_reads_older_is_still_found_by_id(using, monkeypatch):
    monkeypatch.setattr(reads, "MOVED_BY_ID_MAX", 0)
    transitions.create([TaskSpec(id=f"m{i}", title="m", queue=f"q{i % 3}") for i in range(6)], using=using)
    # Rows written outside the engine (a bulk load) may carry an older updated_at than their history.
    Task.objects.using(using).filter(pk__in=["m1", "m4"]).update(updated_at=ago(600))
    ids = [f"m{i}" for i in range(6)] + ["absent"]
    assert reads.queues_of_moved(ids, ago(60), using=using) == {f"m{i}": f"q{i % 3}" for i in range(6)}


@pytest.mark.parametrize("using", STORES)
def test_a_peak_inside_one_minute_is_the_minutes_depth(using):
    """Two tasks queued and claimed within the same minute: the queue held 2 during it, although
    it ended that minute (and every other) empty. Sampled at each minute's end, the chart said
    "at most 0" for a queue that had just had work waiting."""
    s = Script(using)
    s.at(ago(10.9), lambda: transitions.create([TaskSpec(id=f"p{i}", title="peak", queue="peaks") for i in (1, 2)],
                                               actor="creator", using=using))
    s.at(ago(10.8), lambda: transitions.claim("p1", "ann", 60, using=using))
    s.at(ago(10.7), lambda: transitions.claim("p2", "ann", 60, using=using))
    data, _ = insights.compute(NOW, using=using)
    depth = data["queue_depth"]["peaks"]
    assert depth == [0] * 48 + [2] + [0] * 11  # 12:19:26-12:19:38 is in minute 48 (from 11:31)
    assert data["queued_now"] == {"peaks": 0}


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_many_agents_and_queues_send_the_busiest_and_how_many_more(scripted, monkeypatch):
    monkeypatch.setattr(insights, "MAX_AGENTS", 2)
    monkeypatch.setattr(insights, "MAX_QUEUES", 1)
    data, _ = insights.compute(NOW, using=scripted)
    # bob and cy each hold a task; ann holds none. alpha has a task queued now, beta none.
    assert ([a["name"] for a in data["agents"]], data["more_agents"]) == (["bob", "cy"], 1)
    assert (list(data["queue_depth"]), data["more_queues"]) == (["alpha"], 1)


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_later_computations_read_from_the_window_start_and_agree(scripted):
    state = insights.Insights(using=scripted)
    first = state.compute(NOW)
    anchor = state.first_id
    assert anchor > 0
    assert state.compute(NOW) == first and state.first_id == anchor
    # Thirty minutes on: the window starts at 12:01, after a1's completion, before a2's failure.
    later = state.compute(NOW + timedelta(minutes=30))
    assert sum(later["throughput"]["completed"]) == 0 and sum(later["throughput"]["failed"]) == 1
    assert [a["name"] for a in later["agents"]] == ["bob", "cy"]
    assert state.first_id > anchor
    assert later == insights.compute(NOW + timedelta(minutes=30), using=scripted)[0]


# ---------------------------------------------------------------------------------------------
# Pushed over the board's websocket (the real server, a real websocket client)


@pytest.fixture(scope="module")
def board_live(django_db_setup, django_db_blocker):
    from tests.live_server import server_for_sessions

    with django_db_blocker.unblock():
        server = server_for_sessions("default")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_an_insights_frame_follows_the_snapshot_and_changes_after_a_completion(board_live):
    import json

    from websockets.sync.client import connect as ws_connect

    from tests.test_live_board import WAIT, staff_session

    transitions.create([TaskSpec(id="w1", title="work", queue="live"), TaskSpec(id="w2", title="more", queue="live")])
    claim = transitions.claim("w1", "live-agent", 600)
    _, session = staff_session("default")
    headers = {"Origin": board_live.url, "Cookie": f"sessionid={session}"}
    with ws_connect(f"ws://127.0.0.1:{board_live.port}/ws/board/", additional_headers=headers,
                    open_timeout=WAIT, max_size=None) as ws:
        def next_insights(deadline_seconds: float = WAIT) -> tuple[dict, list[str]]:
            seen = []
            while True:
                frame = json.loads(ws.recv(timeout=deadline_seconds))
                seen.append(frame["type"])
                if frame["type"] == "insights":
                    return frame, seen

        first, before = next_insights()
        assert before[0] == "snapshot"  # after the snapshot
        agents = {a["name"]: a for a in first["agents"]}
        assert agents["live-agent"]["holds"] == ["w1"] and agents["live-agent"]["completed"] == 0
        # Two queued, then one claimed: 1 now, and 2 at the most of this minute (or the last).
        assert first["queued_now"]["live"] == 1 and max(first["queue_depth"]["live"][-2:]) == 2
        assert sum(first["throughput"]["completed"]) == 0

        transitions.complete("w1", claim.lease.token, {"ok": True})
        while True:  # frames with nothing new are not sent; the next one shows the completion
            frame, _ = next_insights()
            if sum(frame["throughput"]["completed"]) == 1:
                break
        agents = {a["name"]: a for a in frame["agents"]}
        assert (agents["live-agent"]["holds"], agents["live-agent"]["completed"]) == ([], 1)
        assert frame["throughput"]["completed"][-1] + frame["throughput"]["completed"][-2] == 1
        assert claim.lease.token not in json.dumps(frame)

        # A failure's traceback stays out of the live frames (the details panel reads it from
        # the API): the event says only that there is one.
        other = transitions.claim("w2", "live-agent", 600).lease
        transitions.fail("w2", other.token, "boom", traceback="Traceback ...\n" + "x" * 60_000)
        while True:
            frame = json.loads(ws.recv(timeout=WAIT))
            fails = [i["event"] for i in frame.get("items", []) if i["event"]["verb"] == "fail"]
            if fails:
                break
        assert fails[0]["detail"] == {"error": "boom", "has_traceback": True, "retryable": True}
        assert other.token not in json.dumps(frame)


@pytest.mark.parametrize("using", STORES)
def test_a_claim_committed_between_the_panels_reads_leaves_the_depth_exact(using, monkeypatch):
    """Under a churn the chart drew bars of negative height: the history and today's counts were
    read one after the other, so a claim committed between them was in the count (one fewer
    queued) and not in the history, and the level replayed back to the window's start came out
    below 0 (then clamped to 0: the queue's one waiting task vanished from the chart). Here a
    claim commits, from another connection, right after the history is read."""
    s = Script(using)
    s.at(ago(10), lambda: transitions.create(TaskSpec(id="w1", title="waits", queue="q"), actor="c", using=using))
    read_history = insights.reads.history_window

    def history_then_a_claim(*args, **kwargs):
        found = read_history(*args, **kwargs)
        if not claimed:
            def claim():
                try:
                    claimed.append(transitions.claim("w1", "ann", 60, using=using))
                finally:
                    connections.close_all()
            thread = threading.Thread(target=claim)
            thread.start()
            thread.join(timeout=30)
            assert claimed, "the claim did not commit"
        return found

    claimed: list = []
    monkeypatch.setattr(insights.reads, "history_window", history_then_a_claim)
    data, _ = insights.compute(NOW, using=using)
    # w1 waited from 12:20:20 (minute 49) on; the claim is stamped after NOW (real time).
    assert data["queue_depth"]["q"] == [0] * 49 + [1] * 11
    assert data["queued_now"]["q"] in (0, 1)  # the claim may or may not be in the reads' snapshot


def levels_at_window_start(monkeypatch) -> list[int]:
    """Each queue's level at the window's start, as every later computation replays it (appended
    to the list returned)."""
    levels: list[int] = []
    peaks = insights._peaks

    def spy(now, changes, minutes):
        levels.append(now - sum(delta for _, delta in changes))
        return peaks(now, changes, minutes)

    monkeypatch.setattr(insights, "_peaks", spy)
    return levels


@pytest.mark.parametrize("using", STORES)
def test_under_a_churn_every_computation_starts_the_window_at_the_true_level(using, monkeypatch):
    """Six agents create, claim and complete (threads released by a barrier) while an observer
    computes the panel over and over: every task was made inside the window, so every queue's
    level at the window's start must be exactly 0 in every computation (read one query after
    another it came out between -2 and +4)."""
    levels = levels_at_window_start(monkeypatch)
    stop = threading.Event()
    computed = []

    def observe():
        try:
            state = insights.Insights(using=using)
            while not stop.is_set():
                computed.append(state.compute())
        finally:
            connections.close_all()

    observer = threading.Thread(target=observe)
    observer.start()
    try:
        errors = churn(agents=6, rounds=40, using=using)
    finally:
        stop.set()
        observer.join(timeout=60)
    assert errors == []
    assert len(computed) >= 5 and levels
    assert set(levels) == {0}
    assert all(min(series) >= 0 for data in computed for series in data["queue_depth"].values())


@pytest.mark.parametrize("scripted", STORES, indirect=True)
def test_the_timing_figures_are_read_again_after_fifteen_seconds(scripted, monkeypatch):
    """The hour's wait and run percentiles are kept TIMING_MAX_AGE by a process's Insights (they
    need not move every 3 s), then read again."""
    reads = []  # the timing figures are computed from the same read of the history (timings_of)
    real = insights.timing.timings_of
    monkeypatch.setattr(insights.timing, "timings_of", lambda *a, **k: reads.append(a) or real(*a, **k))
    state = insights.Insights(using=scripted)
    first = state.compute(NOW)
    assert state.compute(NOW + timedelta(seconds=14))["timing"] == first["timing"] and len(reads) == 1
    state.compute(NOW + timedelta(seconds=15))
    assert len(reads) == 2
    state.compute(NOW)  # a clock that went back: read again
    assert len(reads) == 3


@pytest.mark.parametrize("using", [pytest.param("postgres", marks=postgres_db_mark(), id="postgres")])
def test_a_move_committed_after_a_computation_with_a_lower_id_than_it_saw_is_counted_by_the_next(using, monkeypatch):
    """History ids are given at insert, not at commit: a create still in its transaction holds a
    lower id than one committed after it. A computation that saw only the later one must not
    start the next one's read past the earlier (the queue level replayed to the window's start
    came out 2 under the churn above, once in CI). Two writers at once: PostgreSQL."""
    levels = levels_at_window_start(monkeypatch)
    inserted, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow_create():  # inserts its history row, then waits before committing
        try:
            with transaction.atomic(using=using):
                transitions.create(TaskSpec(id="slow", title="slow", queue="q"), using=using)
                inserted.set()
                assert commit.wait(timeout=30)
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            errors.append(error)
        finally:
            connections.close_all()

    writer = threading.Thread(target=slow_create)
    writer.start()
    try:
        assert inserted.wait(timeout=30)
        transitions.create(TaskSpec(id="quick", title="quick", queue="q"), using=using)  # a higher id, committed
        state = insights.Insights(using=using)
        assert state.compute()["queued_now"] == {"q": 1}
    finally:
        commit.set()
        writer.join(timeout=30)
    assert errors == []
    assert TaskEvent.objects.using(using).get(task_id="slow").id < TaskEvent.objects.using(using).get(task_id="quick").id
    levels.clear()
    assert state.compute()["queued_now"] == {"q": 2}
    assert levels == [0]  # both creates counted: the level at the window's start is 0


def churn(agents: int, rounds: int, using: str = "default") -> list[BaseException]:
    """`agents` threads released together by a barrier; each, `rounds` times: create two tasks in
    its queue, claim the next ready one there, complete it. Returns the errors they met."""
    barrier = threading.Barrier(agents)
    errors: list[BaseException] = []

    def agent(n: int):
        queue = QUEUES[n % len(QUEUES)]
        try:
            barrier.wait(timeout=30)
            for i in range(rounds):
                transitions.create([TaskSpec(id=f"c{n}-{i}-{j}", title="churn", queue=queue) for j in (0, 1)],
                                   actor=f"maker-{n}", using=using)
                claim = transitions.claim_next(f"agent-{n}", 60, queue=queue, using=using)
                if claim is not None:
                    transitions.complete(claim.task.id, claim.lease.token, {"i": i}, using=using)
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(n,), name=f"churn-{n}") for n in range(agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


@pytest.mark.parametrize("using", STORES)
def test_each_agent_shows_the_usage_it_reported_in_the_window_and_none_is_missing_not_zero(using):
    transitions.create([TaskSpec(id=f"u{i}", title="u") for i in (1, 2)], using=using)
    one = transitions.claim("u1", "ann", 3600, using=using)
    two = transitions.claim("u2", "bob", 3600, using=using)
    report = usage.checked({"model": "opus", "input_tokens": 100, "output_tokens": 10, "cost_usd": 0.5})
    usage.record(one.task, one.lease.fence, "ann", report, using=using)
    usage.record(one.task, one.lease.fence, "ann", report, using=using)
    old = usage.record(one.task, one.lease.fence, "ann", report, using=using)
    TaskUsage.objects.using(using).filter(pk=old.pk).update(at=NOW - timedelta(hours=2))  # before the window
    usage.record(two.task, two.lease.fence, "bob", usage.checked({"input_tokens": 7}), using=using)
    data, _ = insights.compute(NOW, using=using)
    by_name = {agent["name"]: agent["usage"] for agent in data["agents"]}
    assert by_name == {
        "ann": {"input_tokens": 200, "output_tokens": 20, "cost_usd": 1.0, "cost_missing": 0},
        "bob": {"input_tokens": 7, "output_tokens": 0, "cost_usd": None, "cost_missing": 1},
    }
    transitions.create(TaskSpec(id="u3", title="u"), using=using)
    transitions.claim("u3", "cy", 3600, using=using)
    assert {a["name"]: a["usage"] for a in insights.compute(NOW, using=using)[0]["agents"]}["cy"] is None
