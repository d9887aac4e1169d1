"""The database engine for a MongoDB store (ENGINE "board.mongodb"): django-mongodb-backend, with
the board's transaction options (base.py). Chosen by taskflow_site/mongodb.py."""
