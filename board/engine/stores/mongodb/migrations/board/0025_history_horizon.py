"""HistoryHorizon and an index of the history by time (issue 33, item 4: the board at any moment; the SQL tree has the same as its
0029: tests/test_mongo_migrations.py)."""

import django_mongodb_backend.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0024_approvals'),
    ]

    operations = [
        migrations.CreateModel(
            name='HistoryHorizon',
            fields=[
                ('id', django_mongodb_backend.fields.ObjectIdAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
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
