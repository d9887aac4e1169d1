"""One live key per agent name (issue 27; board/migrations/0009 on the SQL stores):
AgentKey.live_name, unique, holds the name of the key that has no end set (board.agent_keys). revoked_at may now lie ahead: a rotated key's end.

Keys minted before this rule may share a name. The oldest live key of each name keeps it; the
others are given an end a day from now (as if rotated with a day's grace), so no agent loses
its key without warning, and an operator sees them in the Keys admin ("ends at") and can
revoke them sooner.

On MongoDB the unique index on live_name is partial ({$type: "string"}, as the backend makes
every unique index of a nullable field), so the many keys without a live name do not collide."""
from datetime import timedelta

from django.db import migrations, models
from django.utils import timezone

# How long a key that shared its name with an older live key keeps working after the migration.
DUPLICATE_GRACE = timedelta(days=1)


def one_live_key_per_name(apps, schema_editor):
    keys = apps.get_model("board", "AgentKey").objects.using(schema_editor.connection.alias)
    ends = timezone.now() + DUPLICATE_GRACE
    seen: set[str] = set()
    for key_id, name in keys.filter(revoked_at__isnull=True).order_by("created_at", "pk").values_list("pk", "name"):
        if name in seen:
            keys.filter(pk=key_id).update(revoked_at=ends)
        else:
            seen.add(name)
            keys.filter(pk=key_id).update(live_name=name)


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0004_removed_task'),
    ]

    operations = [
        migrations.AddField(
            model_name='agentkey',
            name='live_name',
            field=models.CharField(blank=True, editable=False, max_length=100, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name='agentkey',
            name='revoked_at',
            field=models.DateTimeField(blank=True, help_text='Refused from this time on.', null=True),
        ),
        migrations.RunPython(one_live_key_per_name, migrations.RunPython.noop, elidable=False),
    ]
