from django.db import migrations, models
from django.db.models import F


def backfill(apps, schema_editor):
    """Existing tasks entered their stage at the latest at their last write: the best the rows
    still tell (new moves set the field themselves)."""
    Task = apps.get_model("board", "Task")
    Task.objects.using(schema_editor.connection.alias).filter(stage_changed_at__isnull=True).update(
        stage_changed_at=F("updated_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0004_claim_request_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='stage_changed_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=False),
    ]
