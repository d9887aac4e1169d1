"""Task.tags (issue 33, item 2: tags and search, board.engine.search), and on PostgreSQL the GIN
indexes that answer `tag:NAME` (`tags @> '["NAME"]'`) and `payload.PATH:VALUE`
(`payload @> '{"PATH": "VALUE"}'`) without reading every task. jsonb_path_ops: smaller and
faster than the default operator class, and containment (@>) is all the search asks of it.
`result` is not indexed: every complete writes it, and the hot path pays for each index.
SQLite and MongoDB get the field only (the MongoDB tree's 0016 matches:
tests/test_mongo_migrations.py); their searches scan."""
from django.db import migrations, models

GIN_INDEXES = {"task_tags_gin": "tags", "task_payload_gin": "payload"}


def create_gin_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = apps.get_model("board", "Task")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        for name, column in GIN_INDEXES.items():
            cursor.execute(f'CREATE INDEX IF NOT EXISTS {name} ON "{table}" USING gin ("{column}" jsonb_path_ops)')


def drop_gin_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            for name in GIN_INDEXES:
                cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0019_list_orders'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='tags',
            field=models.JSONField(blank=True, default=list, null=True, help_text='Labels to find the task by (tag:NAME).'),
        ),
        migrations.RunPython(create_gin_indexes, drop_gin_indexes, elidable=False),
    ]
