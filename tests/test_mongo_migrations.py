"""MongoDB's migrations (board/engine/stores/mongodb/migrations/board) are written by hand beside
the SQL ones (board/migrations): MongoDB keys rows by `_id` and has no auto-increment, so the two
trees cannot be one. This holds them together: both end at the same tables, the same fields with
the same options, the same indexes and constraints; only the primary keys differ, and only in
the one way the MongoDB store needs (board/engine/stores/rows.py). A migration added to one tree
and not the other fails here, on a laptop with no MongoDB. (That the MongoDB tree matches the
models is `makemigrations --check` in tests/mongodb.)"""
from __future__ import annotations

from django.db.migrations.loader import MigrationLoader
from django.test.utils import override_settings

MONGODB_TREE = "board.engine.stores.mongodb.migrations.board"


def final_state(tree: str | None):
    """The board app's models as its migrations leave them (`tree`: the module of another set)."""
    with override_settings(MIGRATION_MODULES={"board": tree} if tree else {}):
        state = MigrationLoader(None, ignore_no_migrations=True).project_state()
    return {name: model for (app, name), model in state.models.items() if app == "board"}


def described(model) -> dict:
    fields = {name: field.deconstruct()[1:] for name, field in model.fields.items() if not field.primary_key}
    return {"fields": fields, **{option: repr(model.options.get(option))
                                 for option in ("indexes", "constraints", "unique_together", "ordering")}}


def primary_key(model) -> tuple[str, dict]:
    (field,) = (field for field in model.fields.values() if field.primary_key)
    _name, path, _args, kwargs = field.deconstruct()
    return path, kwargs


def test_both_trees_end_at_the_same_tables_fields_indexes_and_constraints():
    sql, mongodb = final_state(None), final_state(MONGODB_TREE)
    assert sorted(mongodb) == sorted(sql)
    for name in sql:
        assert described(mongodb[name]) == described(sql[name]), f"board.{name} differs between the trees"


def test_the_primary_keys_differ_only_as_the_mongodb_store_keys_rows():
    sql, mongodb = final_state(None), final_state(MONGODB_TREE)
    for name in sql:
        sql_path, sql_kwargs = primary_key(sql[name])
        path, kwargs = primary_key(mongodb[name])
        if sql_path == "django.db.models.BigAutoField" and sql_kwargs.get("auto_created"):
            # Django's implicit id: an ObjectId on MongoDB (the settings' DEFAULT_AUTO_FIELD).
            assert path == "django_mongodb_backend.fields.ObjectIdAutoField", name
        elif sql_path == "django.db.models.BigAutoField":
            # A table whose ids follow commit order (rows.numbered_id): numbered from a counter.
            assert (path, kwargs.pop("db_column")) == ("django.db.models.BigIntegerField", "_id"), name
            assert kwargs == sql_kwargs, name
        else:
            # A key of the board's own (the task id): the same field, stored as the document's _id.
            assert (path, kwargs.pop("db_column")) == (sql_path, "_id"), name
            assert kwargs == sql_kwargs, name
