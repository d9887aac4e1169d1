"""The live board's finished columns page most recent first within a stage (issue 31): an index for it. The two trees have the same: tests/test_mongo_migrations.py."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0027_fairness_key_budgets'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='task',
            index=models.Index(fields=['stage', '-updated_at', '-id'], name='task_column_recent'),
        ),
    ]
