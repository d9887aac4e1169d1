"""Agent API keys: minting, lookup by hash, revocation. The only module that writes AgentKey."""
from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone

from . import errors
from .lifecycle import is_valid_task_id
from .models import AgentKey

KEY_PREFIX = "tfk_"
# Recording every use would make each API call a write; a minute's precision is plenty.
LAST_USED_PRECISION = timedelta(seconds=60)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(name: str, *, is_operator: bool = False, using: str = "default") -> tuple[AgentKey, str]:
    """Mint a key for agent `name`; returns the row and the key, which is never shown again."""
    if not is_valid_task_id(name):
        raise errors.InvalidRequest(
            "agent name: 1-100 letters, digits and ._:- starting with a letter or digit"
        )
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = AgentKey.objects.using(using).create(
        name=name, prefix=key[: len(KEY_PREFIX) + 6], key_hash=_hash(key), is_operator=is_operator,
        created_at=timezone.now(),
    )
    return row, key


def authenticate(key: str, *, using: str = "default") -> AgentKey | None:
    """The live key row for `key`, or None (unknown or revoked). Records the use."""
    if not key or not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    row = AgentKey.objects.using(using).filter(key_hash=_hash(key), revoked_at__isnull=True).first()
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
