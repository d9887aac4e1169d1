"""RemovedTask (board/migrations/0008 on the SQL stores): the tasks the prune deleted, read by the
live board's tailers. Its ids come from the counter document named after its collection
(the MongoDB store's number_rows, ../../store.py), in the counter collection 0002 created."""
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("board", "0003_task_stage_changed_at")]
    operations = [
        migrations.CreateModel(
            name="RemovedTask",
            fields=[
                ("id", models.BigIntegerField(db_column="_id", primary_key=True, serialize=False)),
                ("task_id", models.CharField(max_length=100)),
                ("stage", models.CharField(help_text="The stage it was deleted in (its column on the board).",
                                           max_length=16)),
                ("at", models.DateTimeField()),
            ],
            options={"ordering": ["id"]},
        ),
    ]
