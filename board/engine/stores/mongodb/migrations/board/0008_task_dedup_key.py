"""Dedup keys (issue 29): Task.dedup_key, unique among the live tasks through a partial unique
index (MongoDB: a partialFilterExpression on the stage; board/migrations/0012 on the SQL stores)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0007_flow_control'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='dedup_key',
            field=models.CharField(blank=True, help_text='While this task is live, a create with the same key returns it.', max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.UniqueConstraint(condition=models.Q(('stage__in', ['PENDING', 'QUEUED', 'RUNNING', 'PAUSED'])), fields=('dedup_key',), name='task_live_dedup_key'),
        ),
    ]
