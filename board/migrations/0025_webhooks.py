"""Webhook and WebhookDelivery (issue 33, item 6: webhook alerts, board/webhooks/; the MongoDB tree
has the same as its 0021: tests/test_mongo_migrations.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0024_resources'),
    ]

    operations = [
        migrations.CreateModel(
            name='Webhook',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('url', models.CharField(help_text='Where deliveries are POSTed (http or https).', max_length=2000, verbose_name='URL')),
                ('events', models.JSONField(default=list, help_text='The event names it receives (docs/webhooks.md).')),
                ('filter', models.JSONField(blank=True, default=dict, help_text='Only events of matching tasks: {"queue": "ci-*,docs", "tags": ["urgent"]}.')),
                ('format', models.CharField(default='json', help_text="json (the board's payload) or slack.", max_length=10)),
                ('secret', models.CharField(editable=False, max_length=100)),
                ('active', models.BooleanField(default=True, help_text='An inactive webhook collects and sends nothing.')),
                ('created_by', models.CharField(blank=True, default='', max_length=200)),
                ('created_at', models.DateTimeField()),
                ('cursor', models.BigIntegerField(default=0, editable=False, help_text='The last history event id consumed.')),
                ('holes', models.JSONField(blank=True, default=dict, editable=False)),
                ('problems_seen', models.JSONField(blank=True, default=list, editable=False)),
                ('version', models.BigIntegerField(default=0, editable=False)),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.CreateModel(
            name='WebhookDelivery',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('event_id', models.CharField(help_text="The event's id (the same for every webhook).", max_length=250)),
                ('event', models.CharField(help_text='task.failed, task.deadline_missed, check.problem, ...', max_length=40)),
                ('body', models.JSONField(help_text='The payload sent, as JSON (signed as sent).')),
                ('state', models.CharField(default='pending', help_text='pending, delivered, or failed (gave up).', max_length=10)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(blank=True, help_text='When it is sent next (pending only).', null=True)),
                ('last_status', models.IntegerField(blank=True, help_text="The receiver's last HTTP status.", null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('webhook', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='board.webhook')),
            ],
            options={
                'verbose_name_plural': 'webhook deliveries',
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['state', 'next_attempt_at'], name='webhook_delivery_due'), models.Index(fields=['created_at'], name='webhook_delivery_age')],
                'constraints': [models.UniqueConstraint(fields=('webhook', 'event_id'), name='webhook_delivery_once')],
            },
        ),
    ]
