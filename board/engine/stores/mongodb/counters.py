"""MongoDB's counter documents: ids in commit order where MongoDB has no auto-increment. Imported
by the models (through stores/rows.py), so it imports no model and nothing that does."""
from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

# One document per numbered table: {_id: the table's name, last: the last id handed out}.
COUNTERS = "board_counter"


def number_rows(using: str, rows: Sequence) -> None:
    """Give new rows of the board's history (and the prune's records of deleted tasks) their ids
    from the counter document of their table, incremented in the row's own transaction. Two
    transactions that both increment it conflict, so one commits before the other takes its ids:
    ids follow commit order, which the live board's tailer needs to never skip an event or a
    deletion."""
    from pymongo import ReturnDocument

    missing = [row for row in rows if row.pk is None]
    if not missing:
        return
    connection = connections[using]
    if not connection.in_atomic_block_mongo:
        raise RuntimeError("rows numbered outside a transaction: their ids would not follow commit order")
    counter = connection.get_collection(COUNTERS).find_one_and_update(
        {"_id": type(missing[0])._meta.db_table}, {"$inc": {"last": len(missing)}},
        upsert=True, return_document=ReturnDocument.AFTER, session=connection.session,
    )
    first = counter["last"] - len(missing) + 1
    for offset, row in enumerate(missing):
        row.pk = first + offset
