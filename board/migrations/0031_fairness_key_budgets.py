"""Budgets per fairness key (issue 32, item 5): FairnessKey gains the budget a queue has (Budgeted) and updated_at; FairnessKeyChange, the audit history of their budgets. The two trees have the same: tests/test_mongo_migrations.py."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0030_capabilities'),
    ]

    operations = [
        migrations.AddField(
            model_name='fairnesskey',
            name='budget_closed_at',
            field=models.FloatField(blank=True, editable=False, help_text='When the budget was reached (Unix seconds).', null=True),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='budget_closed_until',
            field=models.FloatField(blank=True, editable=False, help_text='No claim starts before this Unix time: the budget is spent.', null=True),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='budget_cost_usd',
            field=models.FloatField(blank=True, help_text='Cost (USD) per window; empty: none.', null=True),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='budget_per',
            field=models.CharField(blank=True, help_text='day, month or total.', max_length=8, null=True),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='budget_tokens',
            field=models.BigIntegerField(blank=True, help_text='Tokens per window; empty: none.', null=True),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='budget_window',
            field=models.FloatField(blank=True, editable=False, help_text="The current window's start (Unix seconds; 0 for total).", null=True),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='spent_cost_usd',
            field=models.FloatField(default=0.0, editable=False, help_text='Cost reported in the window.'),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='spent_tokens',
            field=models.BigIntegerField(default=0, editable=False, help_text='Tokens reported in the window.'),
        ),
        migrations.AddField(
            model_name='fairnesskey',
            name='updated_at',
            field=models.DateTimeField(blank=True, help_text='When its budget last changed.', null=True),
        ),
        migrations.CreateModel(
            name='FairnessKeyChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('actor', models.CharField(max_length=200)),
                ('reason', models.CharField(blank=True, default='', max_length=500)),
                ('changes', models.JSONField(help_text='The settings changed: {name: [before, after]}.')),
                ('at', models.DateTimeField()),
            ],
            options={
                'ordering': ['-at'],
                'indexes': [models.Index(fields=['key', '-at'], name='fairness_key_change_history')],
            },
        ),
    ]
