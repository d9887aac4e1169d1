"""Indexes for the admin's search box (board.admin.TaskAdmin.search_fields), on PostgreSQL only.

What a search term matches: a task id by prefix (an exact id is a prefix of itself), an owner
or a queue exactly, and words of the title anywhere, in any case.

- PostgreSQL: an id prefix uses the primary key's pattern index (`…_like`, which Django creates
  for a CharField key); owner and queue use task_owner and task_queue; words of the title use a
  trigram index on UPPER(title) (Django's `icontains` is `UPPER(title::text) LIKE UPPER(…)`),
  made only where the pg_trgm extension exists and this role may create it: without it the
  title is searched by scanning (said in the log).
- SQLite: no index can serve a word inside a title, so the search scans the tasks (the list
  stops at its first page of matches, walking task_recent). No index is made there.
- MongoDB (board/engine/stores/mongodb/migrations): nothing to add; an id is the document's `_id`, everything
  else is scanned by the query (the README says so).
"""
import logging

from django.db import migrations, transaction

log = logging.getLogger("board.migrations")

TRIGRAM_INDEX = "task_title_trgm"


def create_title_index(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            log.warning("pg_trgm is not installed on this server: the admin searches titles by scanning")
            return
        try:
            with transaction.atomic(using=connection.alias):  # a savepoint: a refusal leaves the migration whole
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except Exception as exc:  # noqa: BLE001 - no privilege: the search still works, unindexed
            log.warning("cannot create the pg_trgm extension (%s): the admin searches titles by scanning", exc)
            return
        table = apps.get_model("board", "Task")._meta.db_table
        cursor.execute(
            f'CREATE INDEX IF NOT EXISTS {TRIGRAM_INDEX} ON "{table}" USING gin ((UPPER("title"::text)) gin_trgm_ops)'
        )


def drop_title_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")


class Migration(migrations.Migration):
    dependencies = (("board", "0005_task_stage_changed_at"),)
    operations = (migrations.RunPython(create_title_index, drop_title_index, elidable=False),)
