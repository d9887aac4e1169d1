"""Schedules (issue 29, periodic tasks): a cron, a time zone and a task template per name
(the MongoDB tree's 0009 is the same). Numbered 0013 beside a parallel 0012: its dependency is
set to that one when both are merged."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0013_queue_rate'),
    ]

    operations = [
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('name', models.CharField(max_length=85, primary_key=True, serialize=False)),
                ('cron', models.CharField(help_text='Five-field cron expression (minute hour day month weekday).', max_length=200)),
                ('timezone', models.CharField(default='UTC', help_text='IANA time zone the cron is read in.', max_length=64)),
                ('task', models.JSONField(help_text="The template of each tick's task: title, description, payload, queue, priority, max_retries, concurrency_key, concurrency_limit.")),
                ('paused', models.BooleanField(default=False, help_text='Fires nothing; resuming starts from the next tick.')),
                ('next_tick_at', models.DateTimeField(help_text='The next tick not yet fired.')),
                ('last_tick_at', models.DateTimeField(blank=True, help_text='The tick of the last task created.', null=True)),
                ('last_task_id', models.CharField(blank=True, default='', help_text='The last task created.', max_length=100)),
                ('skipped_ticks', models.BigIntegerField(default=0, help_text='Ticks missed while no reaper ran and not fired (only the latest missed one fires).')),
                ('version', models.BigIntegerField(default=0)),
                ('created_by', models.CharField(blank=True, default='', max_length=200)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'ordering': ['name'],
            },
        ),
    ]
