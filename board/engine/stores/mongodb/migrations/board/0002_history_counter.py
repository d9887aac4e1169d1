"""The collections the MongoDB store (../../store.py) writes besides the models', created before any transaction needs
them (collections created inside racing transactions fail on each other): the counter that
numbers the history's rows (number_rows), and the documents of serialise_on, each dropped a day
after its last write (a TTL index)."""
from django.db import migrations


def create_counter(apps, schema_editor):
    from board.engine.stores.mongodb.store import COUNTERS, SERIALISED

    TaskEvent = apps.get_model("board", "TaskEvent")
    table = TaskEvent._meta.db_table
    database = schema_editor.connection.database
    for name in (COUNTERS, SERIALISED):
        if name not in database.list_collection_names():
            database.create_collection(name)
    database[SERIALISED].create_index("at", expireAfterSeconds=24 * 3600)
    # Start past any id already there (a board moved from another store keeps its ids).
    last = TaskEvent.objects.using(schema_editor.connection.alias).order_by("-id").values_list("id", flat=True).first()
    database[COUNTERS].update_one({"_id": table}, {"$max": {"last": last or 0}}, upsert=True)


class Migration(migrations.Migration):
    dependencies = [("board", "0001_initial")]
    operations = [migrations.RunPython(create_counter, migrations.RunPython.noop)]
