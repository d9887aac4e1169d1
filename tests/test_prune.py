"""History retention (board.engine.retention, `manage.py prune`): on a board with old terminal
tasks and long runs of old renews, a prune deletes exactly the old terminal tasks nothing that
stays depends on, collapses the old renews into one row per lease, keeps every move that changes
the stage, leaves check() empty, and keeps the outbox, the API's event cursors and an open live
board correct, while agents work beside it. Rows are aged by writing their timestamps."""
from __future__ import annotations

import io
import itertools
import subprocess
import threading
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections
from django.utils import timezone

from board.engine import clock, invariants, retention, selectors, transitions
from board.engine.lifecycle import Stage, Verb
from board.engine.transitions import TaskSpec
from board.live import outbox
from board.models import Dependency, RemovedTask, Task, TaskEvent
from tests.live_server import (
    LineReader,
    manage,
    server_for_sessions,
    stop_process,
    wait_until,
)
from tests.support import (
    database_url,
    db_state,
    race,
    sql_stores,
)
from tests.test_api import HttpsClient, assert_error, get, used_key
from tests.test_live_board import (
    WAIT,
    BoardSocket,
    staff_session,
    wait_for_versions,
)
from tests.test_outbox import cursor_at_the_end, read

BACKENDS = sql_stores()

OLD_DONE = 12  # old COMPLETED tasks, each with RENEWS renews: all deleted
RENEWS = 25
LONG_AGO = timedelta(days=40)  # past the 30-day retention
YESTERDAY = timedelta(days=2)  # past the 24-hour renew window, within the retention


# ---------------------------------------------------------------------------------------------
# A board to prune


def age_tasks(task_ids, ago: timedelta, using: str) -> None:
    """The tasks and their whole history as if written `ago` (time passing, by writing rows)."""
    when = timezone.now() - ago
    Task.objects.using(using).filter(pk__in=task_ids).update(updated_at=when, stage_changed_at=when)
    TaskEvent.objects.using(using).filter(task_id__in=task_ids).update(at=when)


def age_events(event_ids, ago: timedelta, using: str) -> None:
    TaskEvent.objects.using(using).filter(pk__in=event_ids).update(at=timezone.now() - ago)


def run_task(task_id: str, using: str, *, renews: int = 0, deps=(), end: str = "complete", max_retries: int = 3):
    """Create, claim, renew `renews` times, then end it: complete, fail (not retryable) or stay RUNNING."""
    transitions.create(TaskSpec(id=task_id, title=task_id, deps=tuple(deps), max_retries=max_retries), using=using)
    claim = transitions.claim(task_id, "agent-old", 60, using=using)
    for _ in range(renews):
        transitions.renew(task_id, claim.lease.token, 60, using=using)
    if end == "complete":
        transitions.complete(task_id, claim.lease.token, {"ok": True}, using=using)
    elif end == "fail":
        transitions.fail(task_id, claim.lease.token, "boom", retryable=False, using=using)
    return claim


def renew_ids(task_id: str, using: str) -> list[int]:
    return list(TaskEvent.objects.using(using).filter(task_id=task_id, verb=Verb.RENEW)
                .order_by("pk").values_list("pk", flat=True))


def build_board(using: str) -> dict:
    """Old and recent, terminal and live tasks; returns what a prune must do with them."""
    old_done = [f"old-done-{i}" for i in range(OLD_DONE)]
    for task_id in old_done:
        run_task(task_id, using, renews=RENEWS)
    # A chain that is old and terminal throughout goes whole (gone-a only once gone-b is gone).
    run_task("gone-a", using)
    run_task("gone-b", using, deps=["gone-a"])
    transitions.create(TaskSpec(id="old-cancelled", title="never ran"), using=using)
    transitions.cancel("old-cancelled", actor="operator", using=using)
    run_task("old-failed-dead", using, end="fail", max_retries=0)  # no attempt left: goes
    run_task("old-failed-open", using, end="fail", max_retries=3)  # attempts left: an operator's call
    # Old terminal tasks that something which stays depends on, directly or down a chain.
    run_task("base", using, renews=5)
    transitions.create(TaskSpec(id="gate", title="on hold", deps=("base",), on_hold=True), using=using)
    run_task("chain-a", using)
    run_task("chain-b", using, deps=["chain-a"])
    transitions.create(TaskSpec(id="gate-2", title="on hold", deps=("chain-b",), on_hold=True), using=using)
    run_task("old-parent", using)
    run_task("recent-child", using, deps=["old-parent"])  # terminal, but recent: stays, so its parent does
    old = old_done + ["gone-a", "gone-b", "old-cancelled", "old-failed-dead", "old-failed-open", "base",
                      "chain-a", "chain-b", "old-parent"]
    age_tasks(old, LONG_AGO, using)

    # Live leases whose old renews collapse: one lease, and a task with two leases (fences);
    # renews after the window stay as they are.
    live_1 = run_task("live-1", using, renews=RENEWS, end="running")
    first = run_task("live-2", using, renews=5, end="running")
    transitions.release("live-2", first.lease.token, using=using)
    live_2 = transitions.claim("live-2", "agent-old", 60, using=using)
    for _ in range(5):
        transitions.renew("live-2", live_2.lease.token, 60, using=using)
    age_tasks(["live-1", "live-2"], YESTERDAY, using)
    for _ in range(3):
        transitions.renew("live-1", live_1.lease.token, 60, using=using)
    run_task("recent-done", using, renews=10)  # recent: untouched
    deleted = old_done + ["gone-a", "gone-b", "old-cancelled", "old-failed-dead"]
    return {
        "deleted": set(deleted),
        "stages": Counter({Stage.COMPLETED: OLD_DONE + 2, Stage.CANCELLED: 1, Stage.FAILED: 1}),
        "kept_depended_on": 4,  # base, chain-a, chain-b, old-parent
        # live-1: RENEWS old renews, one kept; live-2: two leases of 5; base: one lease of 5.
        "renews_collapsed": (RENEWS - 1) + 4 + 4 + 4,
        "leases_collapsed": 4,
        "events_deleted": TaskEvent.objects.using(using).filter(task_id__in=deleted).count(),
        "dependencies_deleted": 1,  # gone-b -> gone-a
    }


def stage_history(using: str) -> dict[str, list[tuple]]:
    """Every history row that is not a renew, per task: what a prune must keep as it is."""
    rows = defaultdict(list)
    for row in (TaskEvent.objects.using(using).exclude(verb=Verb.RENEW).order_by("pk")
                .values_list("pk", "task_id", "verb", "from_stage", "to_stage", "version", "fence", "at", "detail")):
        rows[row[1]].append(row)
    return rows


def renews_per_lease(using: str, before) -> dict[tuple[str, int], int]:
    """How many renews each lease's rows older than `before` stand for (a kept row counts itself
    and the renews its detail says it collapsed)."""
    counts: dict[tuple[str, int], int] = Counter()
    for task_id, fence, detail in (TaskEvent.objects.using(using).filter(verb=Verb.RENEW, at__lt=before)
                                   .values_list("task_id", "fence", "detail")):
        counts[(task_id, fence)] += 1 + (detail or {}).get("collapsed", 0)
    return counts


def board_before(using: str) -> dict:
    cutoff = clock.now(using) - retention.RENEWS_AFTER
    old_live_1 = [pk for pk in renew_ids("live-1", using) if TaskEvent.objects.using(using).get(pk=pk).at < cutoff]
    return {
        "ids": set(Task.objects.using(using).values_list("pk", flat=True)),
        "history": stage_history(using),
        "old_renews": renews_per_lease(using, cutoff),
        "recent_renews": list(TaskEvent.objects.using(using).filter(verb=Verb.RENEW, at__gte=cutoff)
                              .order_by("pk").values()),
        "last_old_renew_live_1": old_live_1[-1],
    }


def assert_pruned(using: str, expected: dict, report, before: dict) -> None:
    """The board after a prune of build_board's board, against what was there before it."""
    ids = set(Task.objects.using(using).values_list("pk", flat=True))
    assert expected["deleted"].isdisjoint(ids)
    assert before["ids"] - expected["deleted"] <= ids  # nothing else went: nothing live
    assert Dependency.objects.using(using).filter(task_id__in=expected["deleted"]).count() == 0
    assert TaskEvent.objects.using(using).filter(task_id__in=expected["deleted"]).count() == 0
    # Stage history intact: every surviving task's moves, row for row (agents may add more).
    after = stage_history(using)
    for task_id in before["ids"] - expected["deleted"]:
        assert after[task_id][:len(before["history"][task_id])] == before["history"][task_id], task_id
    # One renew row per old lease, standing for all of that lease's old renews; recent renews untouched.
    cutoff = report.renew_cutoff
    assert renews_per_lease(using, cutoff) == {
        lease: n for lease, n in before["old_renews"].items() if lease[0] not in expected["deleted"]}
    rows = Counter(TaskEvent.objects.using(using).filter(verb=Verb.RENEW, at__lt=cutoff).values_list("task_id", "fence"))
    assert set(rows.values()) == {1}
    recent = {r["id"]: r for r in TaskEvent.objects.using(using).filter(verb=Verb.RENEW, at__gte=cutoff).values()}
    for row in before["recent_renews"]:
        if row["task_id"] not in expected["deleted"]:
            assert recent[row["id"]] == row
    # The kept row of live-1's lease: its last old renew, saying how many it stands for.
    kept = TaskEvent.objects.using(using).get(task_id="live-1", verb=Verb.RENEW, at__lt=cutoff)
    assert kept.pk == before["last_old_renew_live_1"]
    assert kept.detail["collapsed"] == RENEWS - 1 and kept.detail["since"]
    assert report.tasks_deleted == expected["stages"]
    # Each deleted task recorded once, with the stage it was deleted in, for open live boards.
    records = list(RemovedTask.objects.using(using).values_list("task_id", "stage"))
    assert {task for task, _ in records} == expected["deleted"] and len(records) == len(expected["deleted"])
    assert Counter(stage for _, stage in records) == expected["stages"]
    assert report.task_events_deleted == expected["events_deleted"]
    assert report.dependencies_deleted == expected["dependencies_deleted"]
    assert report.renews_collapsed == expected["renews_collapsed"]
    assert report.leases_collapsed == expected["leases_collapsed"]
    assert report.kept_depended_on == expected["kept_depended_on"]
    assert selectors.problems(using=using) == []
    assert invariants.check(selectors.snapshot(using=using), clock.now(using)) == []


# ---------------------------------------------------------------------------------------------
# The prune itself


@pytest.mark.parametrize("alias", BACKENDS)
def test_prune_deletes_old_terminal_tasks_collapses_old_renews_and_keeps_the_rest(alias):
    check_prune(alias)


def check_prune(alias):
    expected = build_board(alias)
    before = board_before(alias)
    report = retention.prune(using=alias)
    assert_pruned(alias, expected, report, before)
    assert set(Task.objects.using(alias).values_list("pk", flat=True)) == before["ids"] - expected["deleted"]
    assert report.batches > 0 and report.longest_batch_seconds > 0
    # A second run finds nothing more to do.
    again = retention.prune(using=alias)
    assert (sum(again.tasks_deleted.values()), again.renews_collapsed, again.kept_depended_on) == (0, 0, 4)


@pytest.mark.parametrize("alias", BACKENDS)
def test_records_of_deleted_tasks_older_than_the_shortest_window_go_with_a_later_batch(alias):
    check_removal_records_trimmed(alias)


def check_removal_records_trimmed(alias):
    """The prune's records of deleted tasks are read by tailers within seconds: a later batch
    that deletes tasks also deletes those older than MIN_WINDOW (aged here by writing them)."""
    run_task("first", alias)
    age_tasks(["first"], LONG_AGO, alias)
    retention.prune(using=alias)
    (old,) = RemovedTask.objects.using(alias).values_list("pk", flat=True)
    RemovedTask.objects.using(alias).filter(pk=old).update(at=clock.now(alias) - retention.MIN_WINDOW - timedelta(minutes=1))
    run_task("young", alias)
    retention.prune(using=alias)  # deletes nothing: records stay
    assert list(RemovedTask.objects.using(alias).values_list("pk", flat=True)) == [old]
    age_tasks(["young"], LONG_AGO, alias)
    retention.prune(using=alias)
    assert list(RemovedTask.objects.using(alias).values_list("task_id", "stage")) == [("young", Stage.COMPLETED)]
    assert RemovedTask.objects.using(alias).get().pk > old


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_dry_run_writes_nothing_and_counts_what_the_real_run_then_does(alias):
    check_dry_run(alias)


def check_dry_run(alias):
    expected = build_board(alias)
    state = db_state(alias)
    dry = retention.prune(dry_run=True, using=alias)
    assert db_state(alias) == state
    assert dry.batches == 0
    real = retention.prune(using=alias)
    for name in ("tasks_deleted", "task_events_deleted", "dependencies_deleted", "renews_collapsed",
                 "leases_collapsed", "kept_depended_on"):
        assert getattr(dry, name) == getattr(real, name), name
    assert real.tasks_deleted == expected["stages"]
    assert real.renews_collapsed == expected["renews_collapsed"]


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_terminal_task_that_a_pending_task_depends_on_is_kept(alias):
    check_depended_on_is_kept(alias)


def check_depended_on_is_kept(alias):
    run_task("dep", alias)
    transitions.create(TaskSpec(id="waiting", title="on hold", deps=("dep",), on_hold=True), using=alias)
    run_task("lone", alias)
    age_tasks(["dep", "lone"], LONG_AGO, alias)
    report = retention.prune(using=alias)
    assert set(Task.objects.using(alias).values_list("pk", flat=True)) == {"dep", "waiting"}
    assert report.kept_depended_on == 1 and report.tasks_deleted == Counter({Stage.COMPLETED: 1})
    assert selectors.problems(using=alias) == []
    # Once the dependent is cancelled and old too, both go, in one run.
    transitions.cancel("waiting", actor="operator", using=alias)
    age_tasks(["waiting"], LONG_AGO, alias)
    report = retention.prune(using=alias)
    assert not Task.objects.using(alias).exists()
    assert report.tasks_deleted == Counter({Stage.COMPLETED: 1, Stage.CANCELLED: 1})
    assert report.kept_depended_on == 0


@pytest.mark.parametrize("alias", BACKENDS)
def test_renews_collapsed_twice_still_count_every_renew_and_the_first_time(alias):
    check_collapsed_twice(alias)


def check_collapsed_twice(alias):
    claim = run_task("t", alias, renews=6, end="running")
    age_tasks(["t"], timedelta(days=3), alias)
    first_at = TaskEvent.objects.using(alias).filter(task_id="t", verb=Verb.RENEW).order_by("pk").first().at
    retention.prune(using=alias)
    for _ in range(4):
        transitions.renew("t", claim.lease.token, 60, using=alias)
    fresh = renew_ids("t", alias)[1:]
    assert len(fresh) == 4
    age_events(fresh, timedelta(days=2), alias)
    report = retention.prune(using=alias)
    (kept,) = TaskEvent.objects.using(alias).filter(task_id="t", verb=Verb.RENEW)
    assert kept.pk == fresh[-1]
    assert kept.detail == {"collapsed": 9, "since": first_at.isoformat()}
    assert report.renews_collapsed == 4 and report.leases_collapsed == 1
    assert selectors.problems(using=alias) == []


@pytest.mark.django_db(transaction=True)
def test_the_command_prints_stable_lines_and_refuses_a_window_under_an_hour():
    expected = build_board("default")
    state = db_state()
    out = io.StringIO()
    call_command("prune", "--dry-run", stdout=out)
    lines = out.getvalue().splitlines()
    assert db_state() == state
    assert lines[0].startswith("prune at ") and lines[0].endswith("(dry run: nothing written)")
    tasks = len(expected["deleted"])
    removed = (f"{tasks} (CANCELLED 1, COMPLETED {OLD_DONE + 2}, FAILED 1), with "
               f"{expected['events_deleted']} history rows and 1 dependency rows")
    assert lines[1].startswith("terminal tasks older than ") and lines[1].endswith(f": would delete {removed}")
    assert lines[2] == "terminal tasks kept because other tasks depend on them: 4"
    assert lines[3].endswith(f": would collapse {expected['renews_collapsed']} rows into the last renew of "
                             "each of 4 leases")
    assert lines[4] == "write batches: none (dry run)"
    assert len(lines) == 5
    out = io.StringIO()
    call_command("prune", "--renews-after", "36h", "--terminal-after", "35d", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[1].endswith(f": deleted {removed}")
    assert lines[3].endswith(f": collapsed {expected['renews_collapsed']} rows into the last renew of each of 4 leases")
    assert lines[4].startswith("write batches: ") and lines[4].endswith(" s")
    state = db_state()
    for option in ("--renews-after", "--terminal-after"):
        with pytest.raises(CommandError, match="shortest window"):
            call_command("prune", option, "59m", stdout=io.StringIO())
    assert db_state() == state


# ---------------------------------------------------------------------------------------------
# Readers of the history across a prune: the outbox's cursor and the API's event cursors


@pytest.mark.parametrize("alias", BACKENDS)
def test_rows_pruned_above_a_tailers_cursor_neither_stall_it_nor_hide_a_live_event(alias):
    # The worst case for the outbox: the pruned rows were never read (they lie above the cursor),
    # so they are missing ids between ids it reads. On PostgreSQL they become holes, which must
    # be given up like rolled-back ids (the tailer would otherwise ask for them forever); on
    # SQLite a missing id below one read is never waited for.
    cursor = cursor_at_the_end(alias)
    start = cursor.last_id
    expected = build_board(alias)
    retention.prune(using=alias)
    run_task("after-prune", alias, renews=2)
    surviving = list(TaskEvent.objects.using(alias).filter(pk__gt=start).order_by("pk").values_list("pk", flat=True))
    assert [e.pk for e in read(cursor)] == surviving
    assert not expected["deleted"] & {e.task_id for e in TaskEvent.objects.using(alias).filter(pk__gt=start)}
    pruned = set(range(start + 1, surviving[-1])) - set(surviving)
    assert pruned  # rows above the cursor were deleted before it read them
    if connections[alias].vendor == "postgresql":
        assert set(cursor.holes) == pruned  # deleted ids look like ids of running transactions
        # Transaction ids are the whole server's: wait until every transaction older than the
        # holes' horizon has ended (other test runs' too), then one read gives them up.
        horizon = max(cursor.holes.values())
        wait_until(lambda: outbox._oldest_running_xid(alias) >= horizon, 300, "older transactions ended")
        assert read(cursor) == [] and cursor.holes == {}
    assert cursor.holes == {}
    run_task("later", alias)
    assert [e.task_id for e in read(cursor)] == ["later"] * 3  # create, claim, complete


@pytest.mark.django_db(transaction=True)
def test_an_events_cursor_into_pruned_history_resumes_at_the_next_surviving_event():
    key = used_key("agent-a")
    http = HttpsClient()
    run_task("t", "default", renews=6, end="running")
    age_tasks(["t"], YESTERDAY, "default")
    first = get(http, "/tasks/t/events?limit=3", key).json()
    assert [e["verb"] for e in first["items"]] == ["create", "claim", "renew"]
    cursor = first["next"]  # "after the first renew", which the prune deletes
    retention.prune()
    assert not TaskEvent.objects.filter(pk=first["items"][-1]["id"]).exists()
    rest = get(http, f"/tasks/t/events?cursor={cursor}", key).json()
    (kept,) = rest["items"]
    assert kept["verb"] == "renew" and kept["detail"]["collapsed"] == 5
    assert kept["id"] == TaskEvent.objects.filter(task_id="t", verb="renew").get().pk
    assert rest["next"] is None
    # A cursor of a task that was deleted: the task is gone, the answer says so.
    run_task("old", "default")
    age_tasks(["old"], LONG_AGO, "default")
    old_cursor = get(http, "/tasks/old/events?limit=1", key).json()["next"]
    retention.prune()
    assert_error(get(http, f"/tasks/old/events?cursor={old_cursor}", key), 404, "not_found")


# ---------------------------------------------------------------------------------------------
# A prune while agents work and a live board watches


AGENTS = 4
WORK = 40


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_prune_while_agents_work_and_a_socket_watches(alias):
    expected = build_board(alias)
    transitions.create([TaskSpec(id=f"work-{i}", title="fresh work") for i in range(WORK)], using=alias)
    before = board_before(alias)
    _, session = staff_session(alias)
    server = server_for_sessions(alias)
    try:
        socket = BoardSocket(server, session)
        wait_for_versions(socket, alias)  # the socket shows every task, the old ones too
        barrier = threading.Barrier(AGENTS + 1)
        failures: list = []
        reports: list = []
        done = Counter()

        def agent(n):
            try:
                barrier.wait(timeout=WAIT)
                while (claim := transitions.claim_next(f"agent-{n}", 60, using=alias)) is not None:
                    for _ in range(2):
                        transitions.renew(claim.task.pk, claim.lease.token, 60, using=alias)
                    transitions.complete(claim.task.pk, claim.lease.token, {"by": n}, using=alias)
                    done[n] += 1
            except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
                failures.append(exc)
            finally:
                connections[alias].close()

        def pruner():
            try:
                barrier.wait(timeout=WAIT)
                reports.append(retention.prune(using=alias))
            except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
                failures.append(exc)
            finally:
                connections[alias].close()

        threads = [threading.Thread(target=agent, args=(n,)) for n in range(AGENTS)]
        threads.append(threading.Thread(target=pruner))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert sum(done.values()) == WORK
        assert Task.objects.using(alias).filter(pk__startswith="work-", stage=Stage.COMPLETED).count() == WORK
        (report,) = reports
        assert_pruned(alias, expected, report, before)
        # The socket: every task that stays, at the database's version, and none of the pruned
        # ones it was shown before: "removed" frames took them away, as a reload's snapshot
        # (the second socket) has none of them.
        wait_for_versions(socket, alias)
        assert socket.removed == expected["deleted"]
        fresh = BoardSocket(server, session)
        wait_for_versions(fresh, alias)
        socket.close()
        fresh.close()
    finally:
        server.close()


# ---------------------------------------------------------------------------------------------
# The reaper's schedule


@pytest.mark.django_db(transaction=True)
def test_the_reaper_prunes_on_its_schedule():
    expected = build_board("default")
    url = database_url(connections["default"].settings_dict)
    reaper = manage(url, settings.SECRET_KEY, "reap", "--loop", "--interval", "0.5", "--prune-interval", "3600",
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Another process prunes: its report's last line says its first prune (at start) is
        # done. (Polling the rows instead stopped it, now and then, before it had printed.)
        errors = LineReader(reaper.stderr)
        while True:
            line = errors.next(WAIT)
            assert line is not None, "the reaper ended before its first prune's report"
            if "prune: write batches: " in line:  # after the log line's time, level and logger
                break
    finally:
        stop_process(reaper)
    assert not Task.objects.filter(pk__in=expected["deleted"]).exists()
    assert TaskEvent.objects.filter(task_id="live-1", verb=Verb.RENEW).count() == 1 + 3
    assert selectors.problems() == []


# ---------------------------------------------------------------------------------------------
# A prune racing a create that depends on the task it deletes


RACE_ROUNDS = 25
RACE_ROUNDS_MAX = 200


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_create_racing_the_prune_of_its_dependency_never_leaves_a_dangling_dependency(alias):
    check_create_races_prune(alias)


def check_create_races_prune(alias):
    # Each round: an old COMPLETED task, and a create of a task that depends on it released
    # together with a prune. Either the create wins (the task stays, depended on) or the prune
    # does (the create is refused: unknown dependency); never a dependency on a deleted task.
    # Odd rounds: the old task had a dependent, also old and deleted by the same prune, so its
    # has_dependents flag is true and is cleared before it goes (the two-step path).
    # At least RACE_ROUNDS rounds, and on until each side has won one (at most RACE_ROUNDS_MAX):
    # who wins is chance, and on SQLite the prune won all of 25 rounds about one run in eight.
    outcomes = Counter()
    for n in itertools.count():
        if n >= RACE_ROUNDS and (len(outcomes) == 2 or n >= RACE_ROUNDS_MAX):
            break
        base, child = f"base-{n}", f"child-{n}"
        run_task(base, alias)
        old = [base]
        if n % 2:
            transitions.create(TaskSpec(id=f"old-dependent-{n}", title="old", deps=(base,)), using=alias)
            transitions.cancel(f"old-dependent-{n}", actor="operator", using=alias)
            old.append(f"old-dependent-{n}")
        age_tasks(old, LONG_AGO, alias)
        created, pruned = race([
            lambda child=child, base=base: transitions.create(TaskSpec(id=child, title="new", deps=(base,)), using=alias),
            lambda: retention.prune(using=alias),
        ], alias, jitter=[0.02, 0])  # the create a little later at times: both sides win some rounds
        assert not isinstance(pruned, BaseException), pruned
        if isinstance(created, transitions.errors.InvalidRequest):
            assert "unknown dependencies" in str(created)
            assert not Task.objects.using(alias).filter(pk__in=[base, child]).exists()
            outcomes["prune first"] += 1
        else:
            assert not isinstance(created, BaseException), created
            assert Task.objects.using(alias).filter(pk__in=[base, child]).count() == 2
            outcomes["create first"] += 1
        dangling = set(Dependency.objects.using(alias).values_list("depends_on_id", flat=True)) - set(
            Task.objects.using(alias).values_list("pk", flat=True))
        assert dangling == set()
        assert selectors.problems(using=alias) == []
    assert sum(outcomes.values()) == n
    assert set(outcomes) == {"prune first", "create first"}, outcomes  # both sides of the race ran
    print(f"{alias}: {dict(outcomes)}")  # which side won how often, for the run's log
