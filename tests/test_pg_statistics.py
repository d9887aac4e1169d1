"""PostgreSQL plans claim_next from the task table's statistics: they are kept current
(board/migrations/0007_task_table_statistics.py), and with current statistics the claim takes
the first ready task from the index instead of sorting every QUEUED task.

Why it matters (the migration's docstring has the measurement): statistics gathered while no
task was QUEUED make the planner expect almost no ready task after a burst of work, and read
and sort all of them on every claim. PostgreSQL's default waits for changes to 10% of the
table before analyzing again; the migration makes it 1,000 changed rows, whatever the size.
Waiting for autovacuum's round (a minute) has no place in a test: the tests check the table's
options, and the plan once analyzed."""
from __future__ import annotations

import json
from datetime import timedelta

from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from board.engine import hot_sql, transitions
from board.engine.transitions import TaskSpec
from board.models import Task
from tests.support import postgres_db_mark

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
    connection = connections[ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + hot_sql.PG_CLAIM_NEXT, CLAIM_PARAMS)
            (plan,), = cursor.fetchall()
        finally:
            cursor.execute("ROLLBACK")
    plan = plan if isinstance(plan, list) else json.loads(plan)
    nodes: list[str] = []

    def walk(node: dict) -> None:
        nodes.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    return nodes


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


def test_with_current_statistics_a_claim_after_a_burst_reads_the_index_and_sorts_nothing():
    """The plan the statistics lead to once autovacuum has re-analyzed (run here by hand)."""
    # A quiet board: every task finished, and the statistics say so.
    for start in range(0, 2000, 500):
        transitions.create([TaskSpec(title=f"done {i}", id=f"done-{i}") for i in range(start, start + 500)],
                           using=ALIAS)
    Task.objects.using(ALIAS).update(stage="COMPLETED")
    analyze()
    # A burst of work: 2,000 ready tasks, then what autovacuum does within a minute (2,000
    # changed rows are past the threshold of 1,000).
    for start in range(0, 2000, 500):
        transitions.create([TaskSpec(title=f"burst {i}", id=f"burst-{i}") for i in range(start, start + 500)],
                           using=ALIAS)
    analyze()
    plan = claim_plan()
    assert "Index Scan task_ready_any_queue" in plan and "Sort" not in plan, plan


def analyze() -> None:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"ANALYZE {Task._meta.db_table}")
