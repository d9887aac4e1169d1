"""Keep PostgreSQL's statistics of the task table current (PostgreSQL only).

Why: claim_next asks for the best QUEUED task (ORDER BY priority, age LIMIT 1, SKIP LOCKED).
PostgreSQL plans it from the table's statistics. When they were gathered at a quiet moment
(no task QUEUED: a board whose work was all done, or a table just created), the planner
believes almost no task is ready, and scans and sorts every QUEUED task on every claim
instead of taking the first one from task_ready_any_queue. Measured here (EXPLAIN ANALYZE of
the PostgreSQL store's PG_CLAIM_NEXT, a scratch script): on a table of 20,000 tasks analyzed with none QUEUED,
then 5,000 queued, one claim took 17 ms; with current statistics a claim took about 0.2 ms.

PostgreSQL's default re-analyzes a table after changes to 10% of its rows: on a board that keeps
a million finished tasks, 100,000 changes, i.e. a burst of tens of thousands of tasks would be
claimed the slow way. Here autovacuum re-analyzes the task table after every 1,000 changed
rows whatever its size: within autovacuum's next round (a minute by default) of any burst.
Analyzing samples at most 30,000 rows (the default statistics target), so doing it often
costs little.

SQLite plans claim_next from the index alone (it has no statistics unless ANALYZE is run);
MongoDB (board/engine/stores/mongodb/migrations) likewise. Nothing to do there.
"""
from django.db import migrations

ANALYZE_AFTER_CHANGED_ROWS = 1000


def _alter_task_table(apps, schema_editor, change: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = apps.get_model("board", "Task")._meta.db_table
    schema_editor.execute(f'ALTER TABLE "{table}" {change}')


def set_statistics_options(apps, schema_editor):
    _alter_task_table(apps, schema_editor, "SET (autovacuum_analyze_scale_factor = 0, "
                      f"autovacuum_analyze_threshold = {ANALYZE_AFTER_CHANGED_ROWS})")


def reset_statistics_options(apps, schema_editor):
    _alter_task_table(apps, schema_editor, "RESET (autovacuum_analyze_scale_factor, autovacuum_analyze_threshold)")


class Migration(migrations.Migration):
    dependencies = (("board", "0006_admin_search_indexes"),)
    operations = (migrations.RunPython(set_statistics_options, reset_statistics_options, elidable=False),)
