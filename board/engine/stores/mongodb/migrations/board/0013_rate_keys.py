"""Rate keys (issue 29, item 2): a task's rate_key, the RateKey rows (a rate shared by the tasks of
many queues naming one key) and their audit history (board.models; board/migrations/0017 on the SQL stores; the trees match:
tests/test_mongo_migrations.py). Existing tasks name none."""
import django_mongodb_backend.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0012_claim_rank'),
    ]

    operations = [
        migrations.CreateModel(
            name='RateKey',
            fields=[
                ('name', models.CharField(db_column='_id', max_length=200, primary_key=True, serialize=False)),
                ('rate_count', models.PositiveIntegerField(blank=True, help_text='Claims per window; empty: no rate limit.', null=True)),
                ('rate_per_seconds', models.PositiveIntegerField(blank=True, help_text='The window, in seconds.', null=True)),
                ('rate_interval', models.FloatField(blank=True, editable=False, help_text='Seconds between two claims (per_seconds / count).', null=True)),
                ('rate_open_at', models.FloatField(blank=True, editable=False, help_text='No claim starts before this Unix time (kept by the engine).', null=True)),
                ('updated_at', models.DateTimeField(blank=True, help_text='When its rate last changed.', null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='task',
            name='rate_key',
            field=models.CharField(blank=True, help_text='Claims of the tasks sharing this key start no faster than its rate.', max_length=200, null=True),
        ),
        migrations.CreateModel(
            name='RateKeyChange',
            fields=[
                ('id', django_mongodb_backend.fields.ObjectIdAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('actor', models.CharField(max_length=200)),
                ('reason', models.CharField(blank=True, default='', max_length=500)),
                ('changes', models.JSONField(help_text='The settings changed: {name: [before, after]}.')),
                ('at', models.DateTimeField()),
            ],
            options={
                'ordering': ['-at'],
                'indexes': [models.Index(fields=['key', '-at'], name='rate_key_change_history')],
            },
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('rate_key__gte', '')), fields=['rate_key'], name='task_rate_key'),
        ),
    ]
