"""Agent API keys: minting, lookup by hash, revocation. The only module that writes AgentKey.

Names that the history could confuse with the board itself (`system`, `system:…`, `admin`) or
with a user of the admin (any existing username) are refused at minting.

`authenticate` runs on every API request, so it is one indexed SELECT (the unique key_hash
index) written by hand and sent through the connection's cursor, instead of an ORM query built
anew each time. It reads the row on every call, never a cache: a key revoked by any process is
refused on its very next request."""
from __future__ import annotations

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from board.engine import db, errors
from board.engine.lifecycle import is_valid_task_id
from board.engine.tokens import hash_token
from board.models import AgentKey

KEY_PREFIX = "tfk_"
# Recording every use would make each API call a write; a minute's precision is plenty.
LAST_USED_PRECISION = timedelta(seconds=60)


# The history records who acted by name: agents by their key's name, operators by their
# username, the board itself as "system" or "system:<job>". An agent must not be able to pass
# for either, so these names (compared without case) and every existing username are refused.
RESERVED_NAMES = frozenset({"system", "admin"})
RESERVED_PREFIXES = ("system:",)


def reserved_because(name: str, *, using: str = "default") -> str | None:
    """Why `name` may not be an agent's name, or None when it may."""
    folded = name.casefold()
    if folded in RESERVED_NAMES or folded.startswith(RESERVED_PREFIXES):
        return "the board's own actions are recorded under it"
    users = get_user_model()
    if users._default_manager.db_manager(using).filter(**{f"{users.USERNAME_FIELD}__iexact": name}).exists():
        return "a user of the admin has this name, and the history must tell them apart"
    return None


def create_key(name: str, *, is_operator: bool = False, using: str = "default") -> tuple[AgentKey, str]:
    """Mint a key for agent `name`; returns the row and the key, which is never shown again.
    Whether the caller may mint an operator key is the caller's check (the admin asks for
    board.intervene; the command is run by whoever runs the server)."""
    if not is_valid_task_id(name):
        raise errors.InvalidRequest(
            "agent name: 1-100 letters, digits and ._:- starting with a letter or digit"
        )
    why = reserved_because(name, using=using)
    if why:
        raise errors.InvalidRequest(f"agent name {name!r} is reserved: {why}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = AgentKey.objects.using(using).create(
        name=name, prefix=key[: len(KEY_PREFIX) + 6], key_hash=hash_token(key), is_operator=is_operator,
        created_at=timezone.now(),
    )
    return row, key


_TABLE = AgentKey._meta.db_table
# What a request needs of its key; the other columns stay deferred on the returned row.
_LOOKUP_FIELDS = ("id", "name", "is_operator", "last_used_at")
# The live key with this hash: an index lookup on key_hash (unique). Params: key_hash.
_LOOKUP = (f"SELECT {', '.join(AgentKey._meta.get_field(f).column for f in _LOOKUP_FIELDS)} "
           f"FROM {_TABLE} WHERE key_hash = %s AND revoked_at IS NULL")
_LAST_USED = AgentKey._meta.get_field("last_used_at").get_col(_TABLE)


def authenticate(key: str, *, using: str = "default") -> AgentKey | None:
    """The live key row for `key`, or None (unknown or revoked). Records the use (at most once
    a minute). The row has id, name, is_operator and last_used_at loaded; the rest is deferred."""
    if not key or not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    connection = connections[using]
    if not db.speaks_sql(using):  # a store without SQL: the ORM's query
        row = AgentKey.objects.using(using).filter(key_hash=hash_token(key), revoked_at__isnull=True).first()
    else:
        with connection.cursor() as cursor:
            cursor.execute(_LOOKUP, (hash_token(key),))
            found = cursor.fetchone()
        if found is None:
            return None
        key_id, name, is_operator, last_used_at = found
        # Stored values as the ORM would read them (SQLite: text and 0/1).
        for convert in connection.ops.get_db_converters(_LAST_USED):
            last_used_at = convert(last_used_at, _LAST_USED, connection)
        row = AgentKey.from_db(using, _LOOKUP_FIELDS, (key_id, name, bool(is_operator), last_used_at))
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_PRECISION:
        AgentKey.objects.using(using).filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row


def revoke(key_id: int, *, using: str = "default") -> bool:
    """Revoke a key; True if it was live."""
    return bool(
        AgentKey.objects.using(using).filter(pk=key_id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    )
