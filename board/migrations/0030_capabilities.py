"""Capabilities (issue 32, item 3): AgentKey.capabilities, Task.requires, prefers and has_requires, a partial index of the tasks that require some and the line of the QUEUED ones that require none; a partial index of the tasks that asked for approvals (check()'s approvals_miscounted). The two trees have the same: tests/test_mongo_migrations.py."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0029_history_horizon'),
    ]

    operations = [
        migrations.AddField(
            model_name='agentkey',
            name='capabilities',
            field=models.CharField(blank=True, default='', help_text='Capability labels, comma-separated (e.g. gpu,python,model:opus).', max_length=2100),
        ),
        migrations.AddField(
            model_name='task',
            name='has_requires',
            field=models.BooleanField(db_default=False, default=False, editable=False, help_text='Requires capabilities of its claimer.'),
        ),
        migrations.AddField(
            model_name='task',
            name='prefers',
            field=models.JSONField(blank=True, editable=False, help_text='Capability labels a claimer is preferred for: {label: weight}.', null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='requires',
            field=models.JSONField(blank=True, editable=False, help_text='Capability labels a claimer must all hold (empty: anybody).', null=True),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('has_requires', False), ('stage', 'QUEUED')), fields=['claim_rank', 'id'], name='task_line_unrequired'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('approvals_count__gte', 1)), fields=['approvals_count'], name='task_asked'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('has_requires', True)), fields=['stage'], name='task_requiring'),
        ),
    ]
