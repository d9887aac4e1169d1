"""The SQL stores' hot statements (board.engine.stores) against the ORM path, on SQLite and PostgreSQL.

The contract suite (tests/test_contract.py) runs every behaviour on both paths. This file checks
what only a comparison can show: rows written by the hand-written statements read back through
the ORM (and are stored, byte for byte) exactly as rows written by the ORM path; the hot verbs
send the statements they are meant to and re-read nothing; the dependency flags are set by
creation and backfilled by the migration; the ORM path's CAS keeps a dependent created during
a completion from being forgotten; and API keys are checked with one indexed SELECT that a
revocation from any connection defeats at once.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from board import agent_keys
from board.engine import errors, flow, selectors, stores, transitions
from board.engine.stores.statements import Statements
from board.engine.lifecycle import Stage
from board.engine.transitions import TaskSpec
from board.models import AgentKey, Task, TaskEvent
from tests.support import sql_stores

TTL = 60
FIELDS = [f.name for f in Task._meta.fields]

BACKENDS = sql_stores()


@pytest.fixture(params=BACKENDS)
def alias(request):
    return request.param


def use_path(settings, mode: str) -> None:
    settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": mode}


class Clock:
    """The store's clock, set by the test (transitions read django.utils.timezone.now)."""

    def __init__(self, monkeypatch):
        self.now = datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt_timezone.utc)
        monkeypatch.setattr(timezone, "now", lambda: self.now)

    def set(self, **delta) -> None:
        self.now = datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt_timezone.utc) + timedelta(**delta)


def stored(alias: str, task_id: str) -> dict:
    """The task's columns as the database holds them (no ORM conversion), without its id."""
    table = Task._meta.db_table
    columns = [f.column for f in Task._meta.concrete_fields if f.column != "id"]
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE id = %s", [task_id])
        return dict(zip(columns, cursor.fetchone()))


def stored_events(alias: str, task_id: str) -> list[tuple]:
    table = TaskEvent._meta.db_table
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT verb, from_stage, to_stage, version, fence, actor, at, detail FROM {table}"
                       " WHERE task_id = %s ORDER BY id", [task_id])
        return cursor.fetchall()


def orm_row(alias: str, task_id: str) -> dict:
    task = Task.objects.using(alias).get(pk=task_id)
    values = model_to_dict(task, fields=FIELDS)
    del values["id"]
    values["stage_changed_at"] = task.stage_changed_at  # not editable: model_to_dict skips it
    values["progress_changed_at"] = task.progress_changed_at  # the same
    values["claim_rank"] = task.claim_rank  # the same
    return values


# ---------------------------------------------------------------------------------------------
# Same rows, both paths


def test_rows_written_by_the_hot_path_read_back_equal_to_the_orm_paths(alias, settings, monkeypatch):
    """Drive one task through claim_next, renew (checkpoint, progress) and complete on each path
    with the same clock and the same token; after every step the two rows (and their history)
    are equal as the ORM reads them AND as the database stores them. The clock includes a
    whole second (no microseconds: Django's SQLite text then has no fraction) and odd ones.

    On PostgreSQL times come from the database's clock (board.engine.clock), which a test cannot set:
    there the time columns are taken out of the comparison and checked for what they must be
    (expiry = the write's time + the TTL, the history's time = the row's)."""
    clock = Clock(monkeypatch)
    monkeypatch.setattr(transitions.leases, "_mint_token", lambda: "the-same-token-for-both-paths-0123456789")
    payload = {"z": 1, "a": [1.5, "é", None, True, {"k": "€"}]}
    steps: dict[str, list] = {}
    for mode in ("orm", "auto"):
        use_path(settings, mode)
        assert (stores.store(alias).statements is None) == (mode == "orm")
        task_id = f"same-{mode}"
        clock.set()
        transitions.create(TaskSpec(id=task_id, title="same", payload=payload, queue="same"), using=alias)
        seen = []
        clock.set(seconds=1, microseconds=500_000)
        claim = transitions.claim_next("agent-same", TTL, queue="same", using=alias)
        assert claim.task.pk == task_id
        seen.append((orm_row(alias, task_id), stored(alias, task_id)))
        clock.set(seconds=7)
        transitions.renew(task_id, claim.lease.token, 90, checkpoint={"page": 3, "ü": [0.1]}, progress=0.25,
                          agent="agent-same", using=alias)
        seen.append((orm_row(alias, task_id), stored(alias, task_id)))
        clock.set(seconds=9, microseconds=123_456)
        transitions.complete(task_id, claim.lease.token, {"out": payload, "n": 10**12}, using=alias)
        seen.append((orm_row(alias, task_id), stored(alias, task_id)))
        seen.append(stored_events(alias, task_id))
        steps[mode] = seen
    if connections[alias].vendor == "postgresql":
        for mode in ("orm", "auto"):
            steps[mode] = _database_clock_times_checked(steps[mode], ttls=(TTL, 90))
    for step, (orm_path, hot_path) in enumerate(zip(steps["orm"], steps["auto"])):
        assert hot_path == orm_path, f"step {step} differs"
    assert steps["auto"][-2][0]["result"] == {"out": payload, "n": 10**12}


def _database_clock_times_checked(seen: list, ttls: tuple[int, int]) -> list:
    """`seen` (claim, renew, complete rows as (ORM, stored), then the history) without its time
    columns, after checking them: each write's expiry is exactly its time + the TTL (one
    reading of the database's clock per move), times rise, and each history row has its
    move's time."""
    times = ("created_at", "updated_at", "lease_expires_at", "stage_changed_at", "progress_changed_at", "claim_rank")
    history = seen[-1]
    written = [orm for orm, _ in seen[:-1]]
    # claim and complete change the stage (its time is the write's); renew keeps it.
    claimed, renewed, completed = written
    assert claimed["stage_changed_at"] == claimed["updated_at"] == renewed["stage_changed_at"]
    assert completed["stage_changed_at"] == completed["updated_at"]
    # The renew saved a checkpoint and changed progress: the progress deadline's clock is its time.
    assert claimed["progress_changed_at"] is None
    assert renewed["progress_changed_at"] == renewed["updated_at"] == completed["progress_changed_at"]
    for values, ttl in zip(written[:2], ttls):
        assert values["lease_expires_at"] - values["updated_at"] == timedelta(seconds=ttl)
    assert written[2]["lease_expires_at"] is None
    # The line's rank is the creation's time (priority 0: board.engine.fairness), kept by every move.
    assert {values["claim_rank"] for values in written} == {written[0]["created_at"].timestamp()}
    moves = [written[0]["created_at"]] + [values["updated_at"] for values in written]
    assert moves == sorted(moves) and [event[6] for event in history] == moves
    stripped = [tuple({k: v for k, v in row.items() if k not in times} for row in pair) for pair in seen[:-1]]
    return stripped + [[event[:6] + event[7:] for event in history]]


# ---------------------------------------------------------------------------------------------
# What the hot verbs send


def _statements(alias: str, call) -> tuple[object, list[str]]:
    with CaptureQueriesContext(connections[alias]) as captured:
        result = call()
    return result, [" ".join(q["sql"].split()) for q in captured.captured_queries]


def test_the_hot_verbs_send_one_statement_each_and_read_nothing_first(alias):
    assert stores.store(alias).statements is not None
    transitions.create(TaskSpec(id="lean", title="lean"), using=alias)
    claim, claim_sql = _statements(alias, lambda: transitions.claim_next("a", TTL, using=alias))
    renewed, renew_sql = _statements(alias, lambda: transitions.renew("lean", claim.lease.token, TTL, using=alias))
    done, complete_sql = _statements(alias, lambda: transitions.complete("lean", claim.lease.token, {}, using=alias))
    assert (claim.task.pk, renewed.task.version, done.stage) == ("lean", 2, Stage.COMPLETED)
    if connections[alias].vendor == "sqlite":
        # write_transaction's BEGIN IMMEDIATE and COMMIT around the move, its history row and
        # (claim and complete) the task's queue slot (board.engine.flow; no concurrency key here)
        assert [s.split()[0] for s in claim_sql] == ["BEGIN", "UPDATE", "INSERT", "UPDATE", "COMMIT"]
        assert [s.split()[0] for s in renew_sql] == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
        assert [s.split()[0] for s in complete_sql] == ["BEGIN", "INSERT", "UPDATE", "UPDATE", "COMMIT"]
        assert "board_queue" in claim_sql[3] and "board_queue" in complete_sql[3]
    else:
        # one statement, committed by itself: no BEGIN, no COMMIT
        for sql in (claim_sql, renew_sql, complete_sql):
            assert len(sql) == 1 and sql[0].startswith("WITH"), sql
    for sql in claim_sql + renew_sql + complete_sql:
        assert "RETURNING" in sql or sql.startswith(("BEGIN", "COMMIT", "INSERT", "UPDATE board_queue"))
        assert "board_dependency" not in sql  # no dependents: nobody looks for them


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_on_postgresql_a_batch_commits_the_completions_holding_nothing_together_and_each_other_alone(alias):
    """A batch of completions on PostgreSQL: its first tasks holding nothing a completion gives
    back (an unlimited queue, no key) are completed in one transaction (their rows' xmin, the id
    of the transaction that wrote them, is one); from the first that holds a queue's slot or a
    key's, each item is completed in a transaction of its own, as complete() alone (it gives
    back its slot there); a refused item writes nothing; the counts end exact."""
    flow.change_queue("capped", concurrency=5, actor="op", using=alias)
    specs = [TaskSpec(id=f"f{n}", title="f", queue="free") for n in (1, 2, 3)]
    specs += [TaskSpec(id=f"c{n}", title="c", queue="capped") for n in (1, 2)]
    specs += [TaskSpec(id="k1", title="k", queue="free", concurrency_key="k", concurrency_limit=2)]
    transitions.create(specs, using=alias)
    claims = [transitions.claim_next("a", TTL, queue=queue, using=alias) for queue in ["free"] * 4 + ["capped"] * 2]
    token = {claim.task.pk: claim.lease.token for claim in claims}
    order = ["f1", "f3", "c1", "k1", "f2", "c2"]
    items = [transitions.CompleteItem(pk, "not-the-token" if pk == "f2" else token[pk], {"n": pk}) for pk in order]
    done = transitions.complete_batch(items, agent="a", using=alias)
    assert [getattr(d, "stage", getattr(d, "code", d)) for d in done] == [
        Stage.COMPLETED, Stage.COMPLETED, Stage.COMPLETED, Stage.COMPLETED, "lease_lost", Stage.COMPLETED]
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT id, xmin::text FROM board_task WHERE id = ANY(%s)", [order])
        xmin = dict(cursor.fetchall())
    assert xmin["f1"] == xmin["f3"]  # together
    assert len({xmin["f1"], xmin["c1"], xmin["c2"], xmin["k1"], xmin["f2"]}) == 5  # each other alone
    assert Task.objects.using(alias).get(pk="f2").stage == Stage.RUNNING
    assert flow.counts(["capped"], using=alias)[0] == {"capped": 0}
    assert selectors.problems(using=alias) == []


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_on_postgresql_a_batch_in_a_limited_queue_tries_the_shared_transaction_once(alias):
    """Once an item of a batch holds a slot, the items after it are not tried in the shared
    transaction: a batch of a limited queue costs one statement more than its items, not twice
    as many. A batch of one is complete()'s statement alone."""
    flow.change_queue("capped", concurrency=5, actor="op", using=alias)
    transitions.create([TaskSpec(id=f"c{n}", title="c", queue="capped") for n in range(4)], using=alias)
    claims = [transitions.claim_next("a", TTL, queue="capped", using=alias) for _ in range(4)]
    items = [transitions.CompleteItem(c.task.pk, c.lease.token, {}) for c in claims]
    done, sql = _statements(alias, lambda: transitions.complete_batch(items[:3], agent="a", using=alias))
    assert [d.stage for d in done] == [Stage.COMPLETED] * 3
    moves = [s for s in sql if s.startswith("WITH held")]
    assert ["AND resources IS NULL AND NOT EXISTS" in s for s in moves] == [True, False, False, False], sql
    done, sql = _statements(alias, lambda: transitions.complete_batch(items[3:], agent="a", using=alias))
    assert done[0].stage == Stage.COMPLETED and len(sql) == 1
    assert "AND resources IS NULL AND NOT EXISTS" not in sql[0]
    assert flow.counts(["capped"], using=alias)[0] == {"capped": 0}


def _prepared_here(alias: str) -> list[tuple[str, str, object, int]]:
    """The statements this connection's server session has prepared: (first words, name,
    when prepared, times run)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT statement, name, prepare_time, generic_plans + custom_plans"
                       " FROM pg_prepared_statements ORDER BY prepare_time")
        return [(" ".join(text.split()[:2]), name, at, runs) for text, name, at, runs in cursor.fetchall()]


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_on_postgresql_each_hot_statement_is_prepared_once_and_django_s_queries_never(alias):
    """Django turns psycopg's preparing off; the hot statements are prepared all the same
    (parsed and planned once per connection), and nothing else is."""
    assert connections[alias].settings_dict["OPTIONS"].get("pool"), "the suite's PostgreSQL is pooled"
    transitions.create([TaskSpec(id=f"p{i}", title="p") for i in range(4)], using=alias)

    def cycle(i: int) -> None:
        claim = transitions.claim_next("a", TTL, using=alias)
        transitions.renew(claim.task.pk, claim.lease.token, TTL, using=alias)
        transitions.complete(claim.task.pk, claim.lease.token, {"i": i}, using=alias)
        assert Task.objects.using(alias).get(pk=claim.task.pk).stage == Stage.COMPLETED  # a Django query

    cycle(0)
    prepared = _prepared_here(alias)
    # The session may hold variants from earlier tests (another parameter type is another
    # statement to psycopg); these three calls' statements are among them, and nothing else is.
    assert {words for words, *_ in prepared} == {"WITH held", "WITH moved", "WITH picked"}, prepared
    for i in range(1, 4):
        cycle(i)
    again = _prepared_here(alias)
    # Prepared once: the same statements (name, time prepared), each run again by the 3 cycles.
    assert [p[:3] for p in again] == [p[:3] for p in prepared]
    assert sum(p[3] for p in again) - sum(p[3] for p in prepared) == 3 * 3
    assert connections[alias].connection.prepare_threshold is None  # Django's setting, back as it was


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_on_postgresql_the_hot_verbs_read_times_as_django_does_with_psycopgs_own_loader(alias):
    """When the session's time zone is Django's (UTC, the default), the hot statements' rows are
    read with psycopg's compiled timestamptz loader rather than Django's Python one: the Task a
    verb returns has the times a fresh ORM read has, same instants and same tzinfo."""
    import psycopg
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID
    from psycopg.pq import Format

    transitions.create(TaskSpec(id="tz", title="tz"), using=alias)
    claim = transitions.claim_next("a", TTL, using=alias)
    returned = [claim.task, Task.objects.using(alias).get(pk="tz")]
    done = transitions.complete("tz", claim.lease.token, {"ok": True}, using=alias)
    returned += [done, Task.objects.using(alias).get(pk="tz")]
    for made, read in (returned[:2], returned[2:]):
        for name in ("created_at", "updated_at", "lease_expires_at", "stage_changed_at", "not_before"):
            mine, django_s = getattr(made, name), getattr(read, name)
            assert mine == django_s, name
            assert mine is None or mine.tzinfo is django_s.tzinfo is dt_timezone.utc, name
    assert returned[0].lease_expires_at is not None and returned[2].stage == Stage.COMPLETED
    cursor = stores.store(alias).statements._cursor(connections[alias])
    assert cursor.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is psycopg.adapters.get_loader(
        TIMESTAMPTZ_OID, Format.TEXT)


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_on_postgresql_the_hot_statements_keep_one_cursor_per_connection_and_its_time_zone(alias, monkeypatch):
    """The PostgreSQL statements keep a server-binding cursor per driver connection (making one per statement cost
    about 5% of a request): verbs after the first make none. A change of Django's time zone for
    the connection makes a new one, which then reads times with Django's loader for that zone
    (the session's zone differs), as Django's own cursors do."""
    from zoneinfo import ZoneInfo

    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID
    from psycopg.pq import Format

    store, connection = stores.store(alias).statements, connections[alias]
    transitions.create([TaskSpec(id=f"c{i}", title="c") for i in range(4)], using=alias)
    transitions.renew(*_claimed(alias), TTL, using=alias)  # the connection's cursor is made here
    made = []
    new_cursor = store._new_cursor
    monkeypatch.setattr(store, "_new_cursor", lambda *args: made.append(args) or new_cursor(*args))
    for _ in range(2):
        task_id, token = _claimed(alias)
        transitions.renew(task_id, token, TTL, using=alias)
        transitions.complete(task_id, token, {}, using=alias)
    assert made == []

    paris = ZoneInfo("Europe/Paris")
    monkeypatch.setitem(connection.__dict__, "timezone", paris)  # Django's cached zone of the connection
    task_id, token = _claimed(alias)
    assert len(made) == 1
    assert store._cursor(connection).adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT).timezone is paris  # Django's
    renewed = transitions.renew(task_id, token, TTL, using=alias)
    assert len(made) == 1
    assert renewed.lease.expires_at.tzinfo is paris
    assert renewed.task.lease_expires_at == Task.objects.using(alias).get(pk=task_id).lease_expires_at


def _claimed(alias: str) -> tuple[str, str]:
    claim = transitions.claim_next("a", TTL, using=alias)
    return claim.task.pk, claim.lease.token


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_on_postgresql_a_dropped_connection_takes_its_kept_cursor_with_it(alias):
    """The kept cursor lives on its driver connection: nothing in the store keeps a connection
    the pool has dropped (closed, past its lifetime) alive."""
    import gc
    import weakref
    from types import SimpleNamespace

    import psycopg

    store = stores.store(alias).statements
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)  # Django's own cursor class: not needed by a bare connection
    driver = psycopg.connect(**params)
    store._cursor(SimpleNamespace(connection=driver, timezone=dt_timezone.utc))
    gone = weakref.ref(driver)
    driver.close()
    del driver
    gc.collect()
    assert gone() is None


def test_completing_a_task_with_dependents_admits_them_after_commit(alias):
    transitions.create([TaskSpec(id="parent", title="p"), TaskSpec(id="child", title="c", deps=["parent"])],
                       using=alias)
    claim = transitions.claim("parent", "a", TTL, using=alias)
    _, sql = _statements(alias, lambda: transitions.complete("parent", claim.lease.token, {}, using=alias))
    assert any("board_dependency" in s for s in sql)
    assert Task.objects.using(alias).get(pk="child").stage == "QUEUED"


def test_a_refused_hot_verb_reads_the_row_to_say_why(alias):
    transitions.create(TaskSpec(id="why", title="why"), using=alias)
    claim = transitions.claim("why", "holder", TTL, using=alias)
    for call, error in (
        (lambda: transitions.complete("why", "forged", {}, using=alias), errors.LeaseLost),
        (lambda: transitions.complete("missing", claim.lease.token, {}, using=alias), errors.NotFound),
        (lambda: transitions.renew("why", claim.lease.token, TTL, agent="other", using=alias), errors.Forbidden),
    ):
        with pytest.raises(error) as caught:
            call()
        assert caught.value.task is None or caught.value.task.pk == "why"
    assert Task.objects.using(alias).get(pk="why").version == 1


# ---------------------------------------------------------------------------------------------
# The dependency flags


def _flags(alias: str) -> dict[str, tuple[bool, bool]]:
    return {t: (d, n) for t, d, n in Task.objects.using(alias).values_list("id", "has_deps", "has_dependents")}


def test_creation_sets_has_deps_and_has_dependents(alias):
    transitions.create([TaskSpec(id="base", title="b"), TaskSpec(id="lone", title="l")], using=alias)
    transitions.create([TaskSpec(id="mid", title="m", deps=["base"]),
                        TaskSpec(id="top", title="t", deps=["mid"])], using=alias)
    with pytest.raises(errors.InvalidRequest):  # refused: nothing of it stays, flags included
        transitions.create(TaskSpec(id="nope", title="n", deps=["lone", "nowhere"]), using=alias)
    assert _flags(alias) == {
        "base": (False, True), "lone": (False, False), "mid": (True, True), "top": (True, False),
    }


def test_rendering_reads_dependencies_only_for_a_task_that_has_some(alias):
    transitions.create([TaskSpec(id="solo", title="s"), TaskSpec(id="after", title="a", deps=["solo"])],
                       using=alias)
    solo, after = (Task.objects.using(alias).get(pk=t) for t in ("solo", "after"))
    deps, sql = _statements(alias, lambda: selectors.deps_of_task(solo, using=alias))
    assert (deps, sql) == ([], [])
    assert selectors.deps_of_task(after, using=alias) == ["solo"]


def test_the_migration_backfills_both_flags(alias):
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("board")
    try:
        executor.migrate([("board", "0001_initial")])
        old = executor.loader.project_state([("board", "0001_initial")]).apps
        OldTask, OldDep = old.get_model("board", "Task"), old.get_model("board", "Dependency")
        now = timezone.now()
        for task_id in ("a", "b", "c", "d"):
            OldTask.objects.using(alias).create(id=task_id, title=task_id, created_at=now, updated_at=now)
        for task_id, dep in (("b", "a"), ("d", "a"), ("d", "b")):
            OldDep.objects.using(alias).create(task_id=task_id, depends_on_id=dep)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert _flags(alias) == {"a": (False, True), "b": (True, True), "c": (False, False), "d": (True, False)}


def test_the_migration_fills_stage_changed_at_from_updated_at(alias):
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("board")
    before = ("board", "0004_claim_request_id")
    now = timezone.now()
    written = {"old": now - timedelta(days=2), "older": now - timedelta(days=9, seconds=7)}
    try:
        executor.migrate([before])
        OldTask = executor.loader.project_state([before]).apps.get_model("board", "Task")
        for task_id, updated_at in written.items():
            OldTask.objects.using(alias).create(id=task_id, title=task_id, created_at=now - timedelta(days=10),
                                                updated_at=updated_at)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert dict(Task.objects.using(alias).values_list("id", "stage_changed_at")) == written


# ---------------------------------------------------------------------------------------------
# The race the ORM path's CAS closes (PostgreSQL: SQLite serialises whole transactions)


@pytest.mark.parametrize("alias", [BACKENDS[1]])
def test_orm_complete_cannot_miss_a_dependent_created_between_its_read_and_its_cas(alias, settings):
    """The ORM path reads the task, then writes it. A dependent created (and committed) in
    between has set has_dependents after the read; the CAS pins the flag, so it fails, the verb
    reads again and admits the dependent after its commit. Without the pin, the dependent would
    stay PENDING: its creation's own after-commit look saw the task still RUNNING."""
    use_path(settings, "orm")
    transitions.create(TaskSpec(id="dep", title="d"), using=alias)
    claim = transitions.claim("dep", "a", TTL, using=alias)
    created = []

    def create_child_first(execute, sql, params, many, context):
        if not created and sql.startswith('UPDATE "board_task"'):
            def other_process():
                try:
                    created.extend(transitions.create(TaskSpec(id="kid", title="k", deps=["dep"]), using=alias))
                finally:
                    connections[alias].close()
            thread = threading.Thread(target=other_process)
            thread.start()
            thread.join()
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(create_child_first):
        transitions.complete("dep", claim.lease.token, {}, using=alias)
    assert [t.pk for t in created] == ["kid"]
    assert created[0].stage == "PENDING"  # dep was RUNNING when the child was created
    assert Task.objects.using(alias).get(pk="kid").stage == "QUEUED"


# ---------------------------------------------------------------------------------------------
# Choosing the path


def test_the_path_follows_the_setting_then_the_environment(alias, settings, monkeypatch):
    use_path(settings, "orm")
    assert stores.store(alias).statements is None
    use_path(settings, "auto")
    assert isinstance(stores.store(alias).statements, Statements)
    settings.TASKFLOW = {k: v for k, v in settings.TASKFLOW.items() if k != "HOT_PATH"}
    monkeypatch.setenv("TASKFLOW_HOT_PATH", "orm")
    stores._stores.clear()
    assert stores.store(alias).statements is None
    monkeypatch.setenv("TASKFLOW_HOT_PATH", "fast")
    stores._stores.clear()
    with pytest.raises(ValueError, match="HOT_PATH"):
        stores.store(alias).statements
    stores._stores.clear()


# ---------------------------------------------------------------------------------------------
# API keys


def test_a_key_check_is_one_select_and_records_use_once_a_minute(alias, monkeypatch):
    stored_key, key = agent_keys.create_key("agent-k", is_operator=True, using=alias)
    first, sql = _statements(alias, lambda: agent_keys.authenticate(key, using=alias))
    assert [s.split()[0] for s in sql] == ["SELECT", "UPDATE"]  # the first use is recorded
    assert first.last_used_at is not None
    again, sql = _statements(alias, lambda: agent_keys.authenticate(key, using=alias))
    assert len(sql) == 1 and sql[0].startswith("SELECT id, name, is_operator, last_used_at, queues, capabilities FROM board_agentkey")
    assert (again.pk, again.name, again.is_operator) == (stored_key.pk, "agent-k", True)
    assert again.last_used_at == AgentKey.objects.using(alias).get(pk=stored_key.pk).last_used_at
    later = timezone.now() + agent_keys.LAST_USED_PRECISION
    monkeypatch.setattr(timezone, "now", lambda: later)
    _, sql = _statements(alias, lambda: agent_keys.authenticate(key, using=alias))
    assert [s.split()[0] for s in sql] == ["SELECT", "UPDATE"]
    assert AgentKey.objects.using(alias).get(pk=stored_key.pk).last_used_at == later
    assert agent_keys.authenticate("tfk_unknown", using=alias) is None


def test_a_key_revoked_elsewhere_is_refused_on_its_next_check(alias):
    stored_key, key = agent_keys.create_key("agent-r", using=alias)
    assert agent_keys.authenticate(key, using=alias).pk == stored_key.pk

    def revoke_from_another_connection():
        try:
            assert agent_keys.revoke(stored_key.pk, using=alias)
        finally:
            connections[alias].close()

    thread = threading.Thread(target=revoke_from_another_connection)
    thread.start()
    thread.join()
    assert agent_keys.authenticate(key, using=alias) is None


# ---------------------------------------------------------------------------------------------
# A key taken on trust by the API's hot verbs (key_hash) is checked by the move itself


def _revoke_behind_the_cache(alias: str, key_id: int) -> None:
    """Revoke as another server process would: the row only (agent_keys.revoke would also make
    this process forget the key)."""
    assert AgentKey.objects.using(alias).filter(pk=key_id).update(revoked_at=timezone.now()) == 1


def _board(alias: str) -> tuple[list, list]:
    return (list(Task.objects.using(alias).order_by("id").values()),
            list(TaskEvent.objects.using(alias).order_by("id").values()))


@pytest.mark.parametrize("mode", ["auto", "orm"])
def test_a_hot_verb_given_a_revoked_key_is_refused_and_writes_nothing(alias, settings, mode):
    use_path(settings, mode)
    row, key = agent_keys.create_key("trusted", using=alias)
    key_hash = agent_keys.hash_token(key)
    transitions.create([TaskSpec(title="held", id="held"), TaskSpec(title="ready", id="ready", priority=-1)],
                       using=alias)
    held = transitions.claim_next("trusted", TTL, key_hash=key_hash, using=alias)  # live key: claims
    assert held.task.pk == "held"
    _revoke_behind_the_cache(alias, row.pk)
    before = _board(alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.claim_next("trusted", TTL, key_hash=key_hash, using=alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.claim_next("trusted", TTL, key_hash=key_hash, request_id="r-1", using=alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.renew("held", held.lease.token, TTL, agent="trusted", key_hash=key_hash, using=alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.complete("held", held.lease.token, {"ok": 1}, agent="trusted", key_hash=key_hash, using=alias)
    with pytest.raises(errors.KeyRevoked):  # a batch: refused whole
        transitions.complete_batch([transitions.CompleteItem("held", held.lease.token, {"ok": 1}),
                                    transitions.CompleteItem("ready", "not-held", {})],
                                   agent="trusted", key_hash=key_hash, using=alias)
    assert _board(alias) == before
    # The same moves without a key to check (the caller looked the key up itself) still work.
    assert transitions.complete("held", held.lease.token, {"ok": 1}, agent="trusted", using=alias).stage == "COMPLETED"


def test_a_key_is_checked_by_name_too(alias):
    """The hash alone could outlive its row's owner: the move also asks for the agent's name."""
    _, key = agent_keys.create_key("named", using=alias)
    transitions.create([TaskSpec(title="t", id="t")], using=alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.claim_next("someone-else", TTL, key_hash=agent_keys.hash_token(key), using=alias)
    assert Task.objects.using(alias).get(pk="t").stage == "QUEUED"


def test_with_no_ready_task_a_live_key_gets_none_and_a_revoked_one_is_refused(alias):
    row, key = agent_keys.create_key("idle", using=alias)
    key_hash = agent_keys.hash_token(key)
    assert transitions.claim_next("idle", TTL, key_hash=key_hash, using=alias) is None
    _revoke_behind_the_cache(alias, row.pk)
    with pytest.raises(errors.KeyRevoked):
        transitions.claim_next("idle", TTL, key_hash=key_hash, using=alias)


def test_a_holder_refused_for_its_lease_with_a_live_key_gets_the_leases_error(alias):
    _, key = agent_keys.create_key("holder", using=alias)
    key_hash = agent_keys.hash_token(key)
    transitions.create([TaskSpec(title="t", id="t")], using=alias)
    transitions.claim_next("holder", TTL, key_hash=key_hash, using=alias)
    with pytest.raises(errors.LeaseLost):
        transitions.complete("t", "not-the-token", {}, agent="holder", key_hash=key_hash, using=alias)


def test_the_hot_claim_with_a_trusted_key_asks_nothing_of_the_key_table_first(alias):
    """The point of key_hash: the key is checked inside the move's statement, not by a query of
    its own (on PostgreSQL that is a round trip saved per request)."""
    _, key = agent_keys.create_key("fast", using=alias)
    transitions.create([TaskSpec(title="t", id="t")], using=alias)
    table = AgentKey._meta.db_table
    with CaptureQueriesContext(connections[alias]) as queries:
        claim = transitions.claim_next("fast", TTL, key_hash=agent_keys.hash_token(key), using=alias)
    assert claim is not None
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [s for s in sql if s.lstrip().upper().startswith("SELECT") and table in s], sql
    assert [s for s in sql if table in s], sql  # ... and the move's own statement does check it


def test_a_key_is_trusted_from_memory_only_until_its_next_use_is_due_for_recording(alias):
    """authenticate_deferred answers from memory without a query, but only while the key's
    recorded use is under a minute old: last_used_at keeps its precision. Here the recorded use
    is 59.5 s old when the key is looked up, so it is trusted for half a second, not a minute."""
    row, key = agent_keys.create_key("memo", using=alias)
    key_hash = agent_keys.hash_token(key)
    AgentKey.objects.using(alias).filter(pk=row.pk).update(last_used_at=timezone.now() - timedelta(seconds=59.5))
    agent_keys._verified.clear()
    with CaptureQueriesContext(connections[alias]) as lookup:
        first = agent_keys.authenticate_deferred(key, using=alias)
    with CaptureQueriesContext(connections[alias]) as recalled:
        second = agent_keys.authenticate_deferred(key, using=alias)
    assert first == second == ("memo", False, key_hash, None, ())
    assert [q["sql"].split()[0] for q in lookup.captured_queries] == ["SELECT"]  # no use recorded: not due
    assert recalled.captured_queries == []
    trusted_since = agent_keys._verified[key_hash].use_recorded
    assert 59.5 <= time.monotonic() - trusted_since < 61  # dated from the recorded use, not from the lookup
