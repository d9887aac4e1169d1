"""AgentKey.queues (issue 27; board/migrations/0010 on the SQL stores): the queues a key is limited to, as glob patterns
(board.engine.scopes); existing keys get '', every queue, as before."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0005_agent_key_live_name'),
    ]

    operations = [
        migrations.AddField(
            model_name='agentkey',
            name='queues',
            field=models.CharField(blank=True, default='', help_text='Queue patterns this key is limited to (e.g. ci-*,docs); empty: every queue.', max_length=2100),
        ),
    ]
