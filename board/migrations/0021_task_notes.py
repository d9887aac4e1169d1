"""Task.notes_count and TaskNote (issue 32, item 4: notes that stay with a task across attempts;
the MongoDB tree has the same as its 0017: tests/test_mongo_migrations.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0020_task_tags'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='notes_count',
            field=models.PositiveIntegerField(db_default=0, default=0, editable=False, help_text='Notes on the task (board.engine.notes): at most MAX_NOTES_PER_TASK; a claim reads them only when some exist.'),
        ),
        migrations.CreateModel(
            name='TaskNote',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('text', models.TextField()),
                ('author', models.CharField(help_text='The agent that held the task, or the staff user.', max_length=200)),
                ('by_holder', models.BooleanField(default=False, help_text="Written by the lease's holder (else by staff).")),
                ('attempt', models.PositiveIntegerField(default=0, help_text="The task's attempt when written (0: before its first claim).")),
                ('fence', models.BigIntegerField(default=0, help_text="The task's fence when written: which lease's attempt.")),
                ('at', models.DateTimeField()),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notes', to='board.task')),
            ],
            options={
                'ordering': ['id'],
                'indexes': [models.Index(fields=['task', 'id'], name='note_task_order')],
            },
        ),
    ]
