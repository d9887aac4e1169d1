"""Task.replay_of and its partial index (issue 33, item 5: run again as new; the MongoDB tree has
the same as its 0018: tests/test_mongo_migrations.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0021_task_notes'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='replay_of',
            field=models.CharField(blank=True, editable=False, help_text='The finished task this one was run again from.', max_length=100, null=True),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('replay_of__gte', '')), fields=['replay_of'], name='task_replay_of'),
        ),
    ]
