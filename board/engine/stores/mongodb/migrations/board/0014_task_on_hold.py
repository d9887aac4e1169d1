"""Task.hold is Task.on_hold (issue 28, item 9): "hold" also named the client's lease (hold()), so
the operator's gate gets a name of its own. The column is renamed (board/migrations/0018 on the SQL stores; here
the field is renamed in every document ($rename)). The API keeps `hold` as an alias (docs/api.md)."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('board', '0013_rate_keys'),
    ]

    operations = [
        migrations.RenameField(model_name='task', old_name='hold', new_name='on_hold'),
    ]
