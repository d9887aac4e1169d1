"""Task.stage_changed_at (board/migrations/0005 on the SQL stores), filled from updated_at."""
from django.db import migrations, models


def backfill(apps, schema_editor):
    """Existing tasks entered their stage at the latest at their last write. One update per task
    with the value read: an update from another field (F(), an aggregation pipeline) is not
    something every MongoDB-compatible server answers."""
    Task = apps.get_model("board", "Task")
    tasks = Task.objects.using(schema_editor.connection.alias)
    for task_id, updated_at in tasks.filter(stage_changed_at__isnull=True).values_list("pk", "updated_at").iterator(1000):
        tasks.filter(pk=task_id, stage_changed_at__isnull=True).update(stage_changed_at=updated_at)


class Migration(migrations.Migration):
    dependencies = [("board", "0002_history_counter")]
    operations = [
        migrations.AddField(
            model_name="task",
            name="stage_changed_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=False),
    ]
