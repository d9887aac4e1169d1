"""Queue budgets (issue 32, item 5: Queue.budget_*, spent_*; the MongoDB tree has the same as its 0022:
tests/test_mongo_migrations.py)."""


from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0025_webhooks'),
    ]

    operations = [
        migrations.AddField(
            model_name='queue',
            name='budget_closed_at',
            field=models.FloatField(blank=True, editable=False, help_text='When the budget was reached (Unix seconds).', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='budget_closed_until',
            field=models.FloatField(blank=True, editable=False, help_text='No claim starts before this Unix time: the budget is spent.', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='budget_cost_usd',
            field=models.FloatField(blank=True, help_text='Cost (USD) per window; empty: none.', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='budget_per',
            field=models.CharField(blank=True, help_text='day, month or total.', max_length=8, null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='budget_tokens',
            field=models.BigIntegerField(blank=True, help_text='Tokens per window; empty: none.', null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='budget_window',
            field=models.FloatField(blank=True, editable=False, help_text="The current window's start (Unix seconds; 0 for total).", null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='spent_cost_usd',
            field=models.FloatField(default=0.0, editable=False, help_text='Cost reported in the window.'),
        ),
        migrations.AddField(
            model_name='queue',
            name='spent_tokens',
            field=models.BigIntegerField(default=0, editable=False, help_text='Tokens reported in the window.'),
        ),
    ]
