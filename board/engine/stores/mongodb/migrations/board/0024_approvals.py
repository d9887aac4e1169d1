"""Approval gates (issue 32, item 2: board.engine.approvals): Task.awaiting_approval and
approvals_count, the Approval rows, and partial indexes of the tasks that have notes or await an
answer (check() reads them); BulkJob.action's help names replay (the MongoDB tree has the same as the SQL tree's 0028:
tests/test_mongo_migrations.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0023_bulk_jobs'),
    ]

    operations = [
        migrations.CreateModel(
            name='Approval',
            fields=[
                ('id', models.BigIntegerField(db_column='_id', primary_key=True, serialize=False)),
                ('question', models.TextField()),
                ('form', models.JSONField(blank=True, help_text='The JSON Schema of the values the answer may carry.', null=True)),
                ('approvers', models.JSONField(blank=True, default=list, help_text='Usernames or group names allowed to answer; empty: operators.')),
                ('asked_by', models.CharField(help_text='The agent that held the task and asked.', max_length=200)),
                ('asked_at', models.DateTimeField()),
                ('attempt', models.PositiveIntegerField(default=0, help_text="The task's attempt when asked.")),
                ('fence', models.BigIntegerField(default=0, help_text='The lease (fence) it was asked under.')),
                ('due_at', models.DateTimeField(blank=True, help_text='When its timeout applies on_timeout; null: never.', null=True)),
                ('on_timeout', models.CharField(default='fail', max_length=10)),
                ('state', models.CharField(choices=[('waiting', 'waiting'), ('approved', 'approved'), ('rejected', 'rejected'), ('timed_out', 'timed out (the task failed)'), ('cancelled', 'cancelled (with the task)')], default='waiting', max_length=10)),
                ('approved', models.BooleanField(blank=True, null=True)),
                ('values', models.JSONField(blank=True, help_text="The answer's values (valid against the form).", null=True)),
                ('comment', models.TextField(blank=True, default='', help_text="The approver's words to the agent.")),
                ('answered_by', models.CharField(blank=True, default='', max_length=200)),
                ('answered_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.AddField(
            model_name='task',
            name='approvals_count',
            field=models.PositiveIntegerField(db_default=0, default=0, editable=False, help_text='Approvals the task asked for, over all its attempts.'),
        ),
        migrations.AddField(
            model_name='task',
            name='awaiting_approval',
            field=models.BooleanField(db_default=False, default=False, editable=False, help_text="PAUSED waiting for a person's answer to its approval (board.engine.approvals)."),
        ),
        migrations.AlterField(
            model_name='bulkjob',
            name='action',
            field=models.CharField(help_text='retry, requeue, cancel, pause, admit, release-stale, set-priority, add-tag, replay.', max_length=20),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('notes_count__gte', 1)), fields=['notes_count'], name='task_noted'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('awaiting_approval', True)), fields=['awaiting_approval'], name='task_awaiting_approval'),
        ),
        migrations.AddField(
            model_name='approval',
            name='task',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='approvals', to='board.task'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['task', 'id'], name='approval_task_order'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['state', 'due_at'], name='approval_state_due'),
        ),
    ]
