"""PostgreSQL plans claim_next from the task table's statistics: they are kept current
(board/migrations/0007_task_table_statistics.py), and with current statistics the claim takes
the first ready task from the index instead of sorting every QUEUED task.

Why it matters (the migration's docstring has the measurement): statistics gathered while no
task was QUEUED make the planner expect almost no ready task after a burst of work, and read
and sort all of them on every claim. PostgreSQL's default waits for changes to 10% of the
table before analyzing again; the migration makes it 1,000 changed rows, whatever the size.
Waiting for autovacuum's round (a minute) has no place in a test: the tests check the table's
options, and the planner's two plans (stale and current statistics) on this server (since flow
control's anti-joins, both read the index: see the test)."""
from __future__ import annotations

import json
from datetime import timedelta

from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from board.engine.stores import postgresql
from board.models import Task
from tests.support import plan_node_names, postgres_db_mark

pytestmark = postgres_db_mark()

ALIAS = "postgres"
CLAIM_PARAMS = {"agent": "a", "token_hash": "0" * 64, "ttl": timedelta(seconds=60), "request_hash": None,
                "seed": None, "key_hash": None}


def table_options() -> dict[str, str]:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [Task._meta.db_table])
        (options,), = cursor.fetchall()
    return dict(option.split("=", 1) for option in options or [])


def claim_plan() -> list[str]:
    """EXPLAIN ANALYZE of the hot claim, rolled back: the plan's node lines."""
    return plan_node_names(explained_claim("ANALYZE, FORMAT JSON"))


def explained_claim(options: str) -> list:
    """EXPLAIN (`options`) of the hot claim, rolled back, parsed."""
    connection = connections[ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute(f"EXPLAIN ({options}) " + postgresql.PG_CLAIM_NEXT["any", False, True], CLAIM_PARAMS)
            (plan,), = cursor.fetchall()
        finally:
            cursor.execute("ROLLBACK")
    return plan if isinstance(plan, list) else json.loads(plan)


def test_the_task_table_is_re_analyzed_after_a_fixed_number_of_changes():
    assert table_options() == {"autovacuum_analyze_scale_factor": "0", "autovacuum_analyze_threshold": "1000"}


def test_the_migration_back_removes_the_options_and_forward_sets_them_again():
    executor = MigrationExecutor(connections[ALIAS])
    latest = executor.loader.graph.leaf_nodes("board")
    try:
        executor.migrate([("board", "0006_admin_search_indexes")])
        assert table_options() == {}
    finally:
        MigrationExecutor(connections[ALIAS]).migrate(latest)
    assert table_options()["autovacuum_analyze_threshold"] == "1000"


def test_the_claim_reads_the_index_with_stale_statistics_and_with_current_ones():
    """PostgreSQL's planner, shown on this server. Before flow control (issue 29) the claim's plan
    with stale statistics read and sorted every ready task; since its pick also anti-joins the
    queue and concurrency-key tables (OPEN_FOR_CLAIMS), the planner walks the ready index in
    claim order and stops at the first open task in both cases (for a claimer without
    capabilities, the line of the QUEUED tasks that require none: task_line_unrequired). The migration's re-analysis is
    kept: it still shortens the hazard for every other read of the task table."""
    # A quiet board: 20,000 finished tasks, and the statistics say so.
    now = timezone.now()
    Task.objects.using(ALIAS).bulk_create(
        [Task(id=f"done-{i:05}", title="done", stage="COMPLETED", result={}, created_at=now, updated_at=now,
              stage_changed_at=now) for i in range(20_000)], batch_size=2_000)
    analyze()
    # A burst of work: 5,000 of them ready again, which the statistics do not know of.
    Task.objects.using(ALIAS).filter(id__lt="done-05000").update(stage="QUEUED", result=None)
    stale = claim_plan()
    assert "Index Scan task_line_unrequired" in stale and not tasks_sorted(), stale
    analyze()  # what autovacuum now does within a minute (5,000 changed rows > 1,000)
    current = claim_plan()
    assert "Index Scan task_line_unrequired" in current and not tasks_sorted(), current


def tasks_sorted() -> bool:
    """Whether the hot claim's plan sorts rows of the task table (a Sort node with a scan of
    board_task below it). The resources' lock order sorts the claimed task's needs (a handful of
    rows: `resource_slot`), which is not a sort of the tasks."""
    plan = explained_claim("FORMAT JSON")

    def relations(node: dict) -> set[str]:
        return {node.get("Relation Name", "")}.union(*(relations(child) for child in node.get("Plans", ())))

    def sorts(node: dict) -> list[dict]:
        return ([node] if node["Node Type"] == "Sort" else []) + [s for c in node.get("Plans", ()) for s in sorts(c)]

    return any(Task._meta.db_table in relations(node) for node in sorts(plan[0]["Plan"]))


def analyze() -> None:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"ANALYZE {Task._meta.db_table}")


def test_the_boards_sessions_run_without_jit():
    """On a board of ~100,000 tasks the claim statement's estimated cost passes jit_above_cost,
    and PostgreSQL's JIT then compiled each claim of one queue for seconds (bench/pg_jit.py
    prints it); the board's sessions turn it off at connection (postgres_options)."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"


def test_the_resource_tables_are_re_analyzed_after_a_fixed_number_of_changes():
    """The claim statement joins them (board.engine.resources): as the task table, re-analyzed
    after every 1,000 changed rows (board/migrations/0024_resources)."""
    for table in ("board_resource", "board_taskresource"):
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [table])
            (options,), = cursor.fetchall()
        assert sorted(options) == ["autovacuum_analyze_scale_factor=0", "autovacuum_analyze_threshold=1000"], table
