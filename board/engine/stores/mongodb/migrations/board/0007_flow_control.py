"""Flow control (issue 29): queues with a concurrency limit and a pause, concurrency keys, and the
audit history of queue settings (board/migrations/0011 on the SQL stores). Existing queues get their
row with the count of their RUNNING tasks, so the limits count right from the start."""

import django_mongodb_backend.fields
from django.db import migrations, models
from django.db.models import Count


def count_running(apps, schema_editor):
    Task, Queue = apps.get_model("board", "Task"), apps.get_model("board", "Queue")
    using = schema_editor.connection.alias
    running = dict(Task.objects.using(using).filter(stage="RUNNING").values_list("queue").annotate(n=Count("id")))
    for name in Task.objects.using(using).values_list("queue", flat=True).distinct():
        Queue.objects.using(using).get_or_create(name=name, defaults={"running": running.get(name, 0)})


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0006_agent_key_queues'),
    ]

    operations = [
        migrations.CreateModel(
            name='ConcurrencyKey',
            fields=[
                ('name', models.CharField(db_column='_id', max_length=200, primary_key=True, serialize=False)),
                ('concurrency', models.PositiveIntegerField(default=1, help_text='At most this many RUNNING tasks share the key.')),
                ('running', models.IntegerField(default=0, editable=False, help_text='RUNNING tasks now (kept by the engine).')),
                ('updated_at', models.DateTimeField(blank=True, help_text='When its limit last changed.', null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='Queue',
            fields=[
                ('name', models.CharField(db_column='_id', max_length=100, primary_key=True, serialize=False)),
                ('concurrency', models.PositiveIntegerField(blank=True, help_text='At most this many RUNNING tasks at once; empty: no limit.', null=True)),
                ('paused', models.BooleanField(default=False, help_text='No new claim takes a task of this queue.')),
                ('paused_by', models.CharField(blank=True, default='', max_length=200)),
                ('paused_reason', models.CharField(blank=True, default='', max_length=500)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('running', models.IntegerField(default=0, editable=False, help_text='RUNNING tasks now (kept by the engine).')),
                ('updated_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='task',
            name='concurrency_key',
            field=models.CharField(blank=True, help_text="At most the key's limit of RUNNING tasks share this key.", max_length=200, null=True),
        ),
        migrations.CreateModel(
            name='QueueChange',
            fields=[
                ('id', django_mongodb_backend.fields.ObjectIdAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.CharField(max_length=100)),
                ('actor', models.CharField(max_length=200)),
                ('reason', models.CharField(blank=True, default='', max_length=500)),
                ('changes', models.JSONField(help_text='The settings changed: {name: [before, after]}.')),
                ('at', models.DateTimeField()),
            ],
            options={
                'ordering': ['-at'],
                'indexes': [models.Index(fields=['queue', '-at'], name='queue_change_history')],
            },
        ),
        migrations.RunPython(count_running, migrations.RunPython.noop),
    ]
