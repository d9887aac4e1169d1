"""django-mongodb-backend's engine, with what the board's transactions need from MongoDB.

Every transaction (the MongoDB store's write_transaction and read_transaction, ../store.py) reads one snapshot
(read concern "snapshot") and commits with write concern "majority": a move is acknowledged
only once a majority of the replica set holds it, so an election cannot undo a lease an agent
was told it holds. The backend starts its sessions without options (they would inherit the
client's read concern, "majority", which does not promise one snapshot across statements)."""
from __future__ import annotations

from django.utils.asyncio import async_unsafe
from django_mongodb_backend.base import DatabaseWrapper as MongoDatabaseWrapper
from pymongo.client_session import TransactionOptions
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

TRANSACTION_OPTIONS = TransactionOptions(read_concern=ReadConcern("snapshot"),
                                         write_concern=WriteConcern("majority"))


class DatabaseWrapper(MongoDatabaseWrapper):
    @async_unsafe
    def start_transaction_mongo(self):
        if self.session is None:
            self.ensure_connection()
            self.session = self.connection.start_session(default_transaction_options=TRANSACTION_OPTIONS)
            self.session.start_transaction()
