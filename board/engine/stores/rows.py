"""How each store keys and numbers rows: what board.models asks of the stores. It imports no
model (the models import it), and the MongoDB store's code only when the alias is MongoDB.

On MongoDB the primary keys are the documents' `_id`, the one field every MongoDB server finds
by index whatever the query (the test server, SecantusDB, scans the collection for any other
field), and AutoFields are refused: the history's ids come from a counter, in commit order."""
from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import connections, models


def document_ids(alias: str = "default") -> bool:
    """The alias is a MongoDB store (read from the settings: connects to nothing)."""
    from board.engine.stores.mongodb.settings import ENGINE

    return settings.DATABASES[alias]["ENGINE"] == ENGINE


def pk_column() -> str | None:
    """The primary key's column of the board's tables: `_id` on MongoDB, Django's default else."""
    return "_id" if document_ids() else None


def numbered_id() -> models.Field:
    """The primary key of a table whose ids follow commit order (the history, the prune's
    records): an auto-increment on SQL stores; on MongoDB, numbers from the store's counter
    (`number_rows`, called by the models' NumberedQuerySet)."""
    if document_ids():
        return models.BigIntegerField(primary_key=True, db_column="_id")
    return models.BigAutoField(primary_key=True)


def number_rows(using: str, rows: Sequence) -> None:
    """Give new rows of such a table their ids where the store has no auto-increment (MongoDB,
    from the counter document of their table, in the rows' own transaction). SQL stores: nothing."""
    if connections[using].vendor == "mongodb":
        from board.engine.stores.mongodb.counters import number_rows as from_counter

        from_counter(using, rows)
