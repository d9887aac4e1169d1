"""Resource leases (issue 32, item 1), as the SQL tree's 0024."""


import django.db.models.deletion
import django_mongodb_backend.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0019_task_usage'),
    ]

    operations = [
        migrations.CreateModel(
            name='Resource',
            fields=[
                ('name', models.CharField(db_column='_id', max_length=200, primary_key=True, serialize=False)),
                ('capacity', models.PositiveIntegerField(default=1, help_text='Units the shared holders may hold together.')),
                ('held', models.BigIntegerField(default=0, editable=False, help_text='Units held now (kept by the engine).')),
                ('intents', models.IntegerField(default=0, editable=False, help_text='Holds of names below this one (kept by the engine).')),
                ('updated_at', models.DateTimeField(blank=True, help_text='When its capacity last changed.', null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='task',
            name='resources',
            field=models.JSONField(blank=True, editable=False, help_text='Resources a claim takes with the task (a name: exclusive).', null=True),
        ),
        migrations.CreateModel(
            name='TaskResource',
            fields=[
                ('id', django_mongodb_backend.fields.ObjectIdAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('units', models.BigIntegerField()),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='resource_needs', to='board.task')),
            ],
            options={
                'indexes': [models.Index(fields=['name'], name='task_resource_name')],
                'constraints': [models.UniqueConstraint(fields=('task', 'name'), name='task_resource_unique')],
            },
        ),
    ]
