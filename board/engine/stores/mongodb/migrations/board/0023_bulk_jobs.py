"""BulkJob (issue 33, item 1; board/migrations/0027 on the SQL stores). Its ids come from the counter
document named after its collection (../../counters.py), as the history's."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0022_queue_budgets'),
    ]

    operations = [
        migrations.CreateModel(
            name='BulkJob',
            fields=[
                ('id', models.BigIntegerField(db_column='_id', primary_key=True, serialize=False)),
                ('actor', models.CharField(help_text='Who asked for it (the name its moves record).', max_length=200)),
                ('action', models.CharField(help_text='retry, requeue, cancel, pause, admit, release-stale, set-priority, add-tag.', max_length=20)),
                ('params', models.JSONField(blank=True, default=dict, help_text='The action\'s value: {"priority": 5} or {"tag": "x"}.')),
                ('reason', models.CharField(blank=True, default='', max_length=500)),
                ('filter', models.JSONField(blank=True, default=dict, help_text='The filter as given (docs/bulk.md).')),
                ('state', models.CharField(default='pending', help_text='pending, running, stopping, stopped, done, failed.', max_length=10)),
                ('total', models.PositiveIntegerField(default=0, help_text='The tasks it acts on (matched, in a stage the action applies to).')),
                ('matching', models.PositiveIntegerField(default=0, help_text='Every task the filter matched, any stage.')),
                ('done', models.PositiveIntegerField(default=0)),
                ('skipped', models.PositiveIntegerField(default=0)),
                ('lost', models.PositiveIntegerField(default=0, help_text='Tasks that changed meanwhile (left as they were).')),
                ('skipped_reasons', models.JSONField(blank=True, default=dict, help_text='reason code -> count')),
                ('problems', models.IntegerField(blank=True, help_text="check()'s problems after the job (null: not run).", null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('items', models.JSONField(blank=True, default=list, editable=False, help_text='[task id, version read] per task.')),
                ('position', models.PositiveIntegerField(default=0, editable=False, help_text='Items handled so far.')),
                ('runner', models.CharField(blank=True, default='', editable=False, max_length=100)),
                ('heartbeat_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('created_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('version', models.BigIntegerField(default=0, editable=False)),
            ],
            options={
                'verbose_name': 'bulk job',
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['state', 'heartbeat_at'], name='bulk_job_runnable')],
            },
        ),
    ]
