"""The database engine of a MongoDB store (ENGINE "board.engine.stores.mongodb.backend"):
django-mongodb-backend, with the board's transaction options (base.py). Chosen by ../settings.py."""
