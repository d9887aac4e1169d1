"""Rate limits (issue 29): a queue's rate (count per seconds) and the time its next claim may start
(board.models.Queue; the migrations of the two trees match: tests/test_mongo_migrations.py)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0012_task_dedup_key'),
    ]

    operations = [
        migrations.AddField(
            model_name='queue',
            name='rate_count',
            field=models.PositiveIntegerField(blank=True, help_text='Claims per window; empty: no rate limit.', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='rate_interval',
            field=models.FloatField(blank=True, editable=False, help_text='Seconds between two claims (per_seconds / count).', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='rate_open_at',
            field=models.FloatField(blank=True, editable=False, help_text='No claim starts before this Unix time (kept by the engine).', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='rate_per_seconds',
            field=models.PositiveIntegerField(blank=True, help_text='The window, in seconds.', null=True),
        ),
    ]
