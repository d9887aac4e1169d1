"""Task.replay_of and its partial index (issue 33, item 5; board/migrations/0022 on the SQL stores)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0017_task_notes'),
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
