"""HistoryHorizon and an index of the history by time (issue 33, item 4: the board at any moment; the MongoDB tree has the same as its
0025: tests/test_mongo_migrations.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0028_approvals'),
    ]

    operations = [
        migrations.CreateModel(
            name='HistoryHorizon',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=20, unique=True)),
                ('exact_from', models.DateTimeField(help_text='The board at any moment from this one on is rebuilt exactly.')),
                ('updated_at', models.DateTimeField()),
            ],
        ),
        migrations.AddIndex(
            model_name='taskevent',
            index=models.Index(fields=['at'], name='event_at'),
        ),
    ]
