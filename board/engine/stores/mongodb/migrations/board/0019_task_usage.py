"""TaskUsage (issue 32, item 5; board/migrations/0023 on the SQL stores). Its ids come from the
counter document named after its collection (../../counters.py), as the history's."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0018_task_replay_of'),
    ]

    operations = [
        migrations.CreateModel(
            name='TaskUsage',
            fields=[
                ('id', models.BigIntegerField(db_column='_id', primary_key=True, serialize=False)),
                ('fence', models.BigIntegerField(help_text='The lease (attempt) it was reported under.')),
                ('agent', models.CharField(max_length=200)),
                ('queue', models.CharField(help_text="The task's queue (fixed at creation): usage by queue.", max_length=100)),
                ('model', models.CharField(blank=True, default='', max_length=100)),
                ('input_tokens', models.BigIntegerField(default=0)),
                ('output_tokens', models.BigIntegerField(default=0)),
                ('cost_usd', models.FloatField(blank=True, help_text='Empty: not reported (never read as zero).', null=True)),
                ('source', models.CharField(default='reported', help_text='reported or estimated.', max_length=10)),
                ('at', models.DateTimeField()),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='usage_reports', to='board.task')),
            ],
            options={
                'ordering': ['id'],
                'indexes': [models.Index(fields=['task', 'id'], name='usage_task_order'), models.Index(fields=['at'], name='usage_at')],
            },
        ),
    ]
