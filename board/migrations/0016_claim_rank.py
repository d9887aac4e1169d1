"""The claim order (issue 29, item 8; board.engine.fairness): Task.claim_rank and
Task.fairness_key, the fairness keys' weights, and the line's indexes in place of the
(priority, created_at) ones. Existing tasks are ranked from their creation and priority, as new
ones are: their order among themselves is unchanged, and they now age (the MongoDB tree's 0012
is the same)."""

from django.db import migrations, models

AGING_SECONDS = 60.0  # board.engine.fairness.AGING_SECONDS when this was written


def rank_existing(apps, schema_editor):
    """One UPDATE in the database's own arithmetic (a table of any size)."""
    table = apps.get_model("board", "Task")._meta.db_table
    if schema_editor.connection.vendor == "postgresql":
        epoch = "extract(epoch from created_at)::double precision"
    else:  # SQLite: julianday() of Django's stored text, in days since -4713
        epoch = "(julianday(created_at) - 2440587.5) * 86400.0"
    schema_editor.execute(f"UPDATE {table} SET claim_rank = {epoch} - priority * {AGING_SECONDS}")


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0015_task_deadlines'),
    ]

    operations = [
        migrations.CreateModel(
            name='FairnessKey',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('weight', models.PositiveIntegerField(default=1, help_text="Turns for another key's one.")),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.RemoveIndex(
            model_name='task',
            name='task_ready_in_queue',
        ),
        migrations.RemoveIndex(
            model_name='task',
            name='task_ready_any_queue',
        ),
        migrations.AddField(
            model_name='task',
            name='claim_rank',
            field=models.FloatField(db_default=0.0, default=0.0, editable=False, help_text='Claimed lowest first: its turn (Unix seconds) minus priority x 60 s.'),
        ),
        migrations.AddField(
            model_name='task',
            name='fairness_key',
            field=models.CharField(blank=True, help_text='Tasks of different keys take turns (a plan, a person).', max_length=200, null=True),
        ),
        migrations.RunPython(rank_existing, migrations.RunPython.noop, elidable=False),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(fields=['stage', 'queue', 'claim_rank', 'id'], name='task_line_in_queue'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(fields=['stage', 'claim_rank', 'id'], name='task_line_any_queue'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('fairness_key__gte', '')), fields=['fairness_key', 'stage', 'claim_rank'], name='task_fairness_line'),
        ),
    ]
