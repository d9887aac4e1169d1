"""The task list's orders (issue 30, item 17: the board's all-tasks table and GET /api/tasks'
order=newest and priority): an index per order so that PostgreSQL reads a page without sorting
every task (board.models; the MongoDB tree's 0015 matches: tests/test_mongo_migrations.py)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0018_task_on_hold'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='task',
            index=models.Index(fields=['created_at', 'id'], name='task_created'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(fields=['-priority', 'created_at', 'id'], name='task_priority'),
        ),
    ]
