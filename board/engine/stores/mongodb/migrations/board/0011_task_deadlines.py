"""Deadlines beside the lease (issue 29, item 7): a task's queue, attempt and progress timeouts,
when its holder last made progress, and a partial index of the tasks with a queue timeout (the
reaper's pass reads those; board/migrations/0015 on the SQL stores). Existing tasks have none."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0010_schedules'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='attempt_timeout_seconds',
            field=models.PositiveIntegerField(blank=True, help_text="One attempt's wall-clock limit, renewals or not.", null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='progress_changed_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='progress_timeout_seconds',
            field=models.PositiveIntegerField(blank=True, help_text='The lease is taken back when neither progress nor checkpoint changed this long.', null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='queue_timeout_seconds',
            field=models.PositiveIntegerField(blank=True, help_text='FAILED when QUEUED (and claimable) this long without starting.', null=True),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('queue_timeout_seconds__gte', 1)), fields=['stage'], name='task_queue_deadline'),
        ),
    ]
