"""Settings for a MongoDB store (`DATABASE_URL=mongodb://host:port/dbname?replicaSet=...`).

The board runs on MongoDB through MongoDB's own Django backend (django-mongodb-backend), wrapped
by `backend/` beside this module (what its transactions read and write: backend/base.py). A replica set
is required: multi-document transactions, which keep a move and its history row together, exist
only there. This module only builds settings:

- the DATABASES entry (dj-database-url does not parse mongodb:// URLs), with majority writes and
  majority reads by default, and a 5 s server selection timeout (a request fails after 5 s when
  no primary answers, like PostgreSQL's pool timeout) unless the URL says otherwise;
- the contrib apps with ObjectId primary keys (MongoDB has no auto-increment: AutoField is
  refused there) and, for them and the board, migrations kept apart from the SQL ones.
"""
from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

DEFAULT_AUTO_FIELD = "django_mongodb_backend.fields.ObjectIdAutoField"
# The Django database engine of a MongoDB store: django-mongodb-backend's, wrapped (backend/).
ENGINE = "board.engine.stores.mongodb.backend"

# The SQL migrations (board/migrations, Django's own) are not touched: MongoDB has its own set.
MIGRATION_MODULES = {
    "admin": "board.engine.stores.mongodb.migrations.admin",
    "auth": "board.engine.stores.mongodb.migrations.auth",
    "contenttypes": "board.engine.stores.mongodb.migrations.contenttypes",
    "board": "board.engine.stores.mongodb.migrations.board",
}

# Defaults a URL may override (option names are case-insensitive in MongoDB URLs).
_DEFAULT_OPTIONS = {
    "w": "majority",                     # a write is acknowledged once a majority holds it
    "readConcernLevel": "majority",      # reads outside transactions see only majority-held data
    "serverSelectionTimeoutMS": 5000,
}


def database_from_mongodb_url(url: str) -> dict:
    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured(
            f"DATABASE_URL {parts.scheme}://{parts.hostname}/… names no database: "
            "write it after the host, e.g. mongodb://127.0.0.1:27017/taskflow?replicaSet=rs0")
    given = {key.lower() for key, _ in parse_qsl(parts.query)}
    options = {key: value for key, value in _DEFAULT_OPTIONS.items() if key.lower() not in given}
    return {
        "ENGINE": ENGINE,
        "HOST": url,
        "NAME": name,
        "USER": "",
        "PASSWORD": "",
        "PORT": "",
        "OPTIONS": options,
        # The backend's MongoClient is a pool shared by the process's threads.
        "CONN_MAX_AGE": None,
    }


_MONGO_APPS = {
    "django.contrib.admin": "board.engine.stores.mongodb.apps.MongoAdminConfig",
    "django.contrib.auth": "board.engine.stores.mongodb.apps.MongoAuthConfig",
    "django.contrib.contenttypes": "board.engine.stores.mongodb.apps.MongoContentTypesConfig",
}


def installed_apps(apps: list[str]) -> list[str]:
    return [_MONGO_APPS.get(app, app) for app in apps]
