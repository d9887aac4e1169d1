"""Task.tags (issue 33, item 2: tags and search; board/migrations/0020 on the SQL stores, which
also indexes them on PostgreSQL; the trees match: tests/test_mongo_migrations.py)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0015_list_orders'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='tags',
            field=models.JSONField(blank=True, default=list, null=True, help_text='Labels to find the task by (tag:NAME).'),
        ),
    ]
