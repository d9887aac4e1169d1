"""Resource leases (issue 32, item 1: Resource rows, each task's TaskResource needs and Task.resources;
the MongoDB tree has the same as its 0020: tests/test_mongo_migrations.py).

On PostgreSQL the two new tables are re-analyzed after every 1,000 changed rows, as the task table
is (0007_task_table_statistics says why): the claim statement joins them, and with statistics
gathered while they were empty its plan read every row of them on each claim (bench/claims.py
--with-resources own ran at 62.9 claims/s against 457 once they were analyzed)."""


import django.db.models.deletion
from django.db import migrations, models

ANALYZE_AFTER_CHANGED_ROWS = 1000
TABLES = ("Resource", "TaskResource")


def set_statistics_options(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for model in TABLES:
        table = apps.get_model("board", model)._meta.db_table
        schema_editor.execute(f'ALTER TABLE "{table}" SET (autovacuum_analyze_scale_factor = 0, '
                              f'autovacuum_analyze_threshold = {ANALYZE_AFTER_CHANGED_ROWS})')


def reset_statistics_options(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for model in TABLES:
        table = apps.get_model("board", model)._meta.db_table
        schema_editor.execute(f'ALTER TABLE "{table}" RESET (autovacuum_analyze_scale_factor, '
                              "autovacuum_analyze_threshold)")


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0023_task_usage'),
    ]

    operations = [
        migrations.CreateModel(
            name='Resource',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('capacity', models.PositiveIntegerField(default=1, help_text='Units the shared holders may hold together.')),
                ('held', models.BigIntegerField(default=0, editable=False, help_text='Units held now (kept by the engine).')),
                ('intents', models.IntegerField(default=0, editable=False, help_text='Holds of names below this one (kept by the engine).')),
                ('updated_at', models.DateTimeField(blank=True, help_text='When its capacity last changed.', null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='task',
            name='resources',
            field=models.JSONField(blank=True, editable=False, help_text='Resources a claim takes with the task (a name: exclusive).', null=True),
        ),
        migrations.CreateModel(
            name='TaskResource',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('units', models.BigIntegerField()),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='resource_needs', to='board.task')),
            ],
            options={
                'indexes': [models.Index(fields=['name'], name='task_resource_name')],
                'constraints': [models.UniqueConstraint(fields=('task', 'name'), name='task_resource_unique')],
            },
        ),
        migrations.RunPython(set_statistics_options, reset_statistics_options, elidable=False),
    ]
