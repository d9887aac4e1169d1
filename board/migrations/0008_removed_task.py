"""RemovedTask: the tasks the prune deleted, read by the live board's tailers so that open pages
drop their cards (board.live.outbox)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0007_task_table_statistics'),
    ]

    operations = [
        migrations.CreateModel(
            name='RemovedTask',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('task_id', models.CharField(max_length=100)),
                ('stage', models.CharField(help_text='The stage it was deleted in (its column on the board).', max_length=16)),
                ('at', models.DateTimeField()),
            ],
            options={
                'ordering': ['id'],
            },
        ),
    ]
