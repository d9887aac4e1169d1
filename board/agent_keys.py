"""Agent API keys: minting, lookup by hash, revocation. The only module that writes AgentKey.

Names that the history could confuse with the board itself (`system`, `system:…`, `admin`) or
with a user of the admin (any existing username) are refused at minting.

`authenticate` runs on every API request but those of three verbs, so it is one indexed SELECT
(the unique key_hash index) written by hand and sent through the connection's cursor, instead
of an ORM query built anew each time. It reads the row on every call, never a cache: a key
revoked by any process is refused on its very next request.

The three are the agents' hot verbs (claim_next, renew, complete): there a request would spend
a database round trip on the key and another on the move. `authenticate_deferred` answers from
this process's memory of the keys it verified (`_verified`) for up to a minute after the key's
recorded use, and the verb always checks the key in its own statement (the hash it returns:
board.engine.transitions._require_live_key, the SQL stores' statements): a key revoked or deleted
meanwhile is refused by the move itself, which writes nothing. After that minute the key is
looked up again, which records its use (last_used_at keeps its one-minute precision). The
request's body is parsed before the move, so a malformed request with a revoked key may get
its 422 before the move would have said 401; nothing is written either way.

One live key per agent name (issue 27): the history and the holder's checks know an agent by
name only, so a second key for a live name would be that agent. `create_key` refuses a name
that has a live key unless it rotates: the new key is made and the old one ends at now + a
grace (`revoked_at` ahead of time). The database holds the rule: `live_name` (the name while
the key has no end set) is unique, so two concurrent mints cannot both win. A key is live
while `revoked_at` is NULL or still ahead, by the store's clock (board.engine.clock): every
lookup and the hot verbs' own statements compare it, so a scheduled end is honoured by every
process from that moment, without waiting for this module's one-minute memory to lapse."""
from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import NamedTuple

from django.contrib.auth import get_user_model
from django.db import IntegrityError
from django.db.models import Q
from django.utils import timezone

from board.engine import capabilities, clock, errors, scopes
from board.engine.stores import retry_conflicts, store
from board.engine.inputs import NAME_RULE, is_valid_task_id
from board.engine.limits import MAX_ROTATION_GRACE
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


class NameHasLiveKey(errors.InvalidRequest):
    """This agent name already has a live key."""


def create_key(name: str, *, is_operator: bool = False, rotate: timedelta | None = None,
               queues: str | None = None, capabilities: str | None = None,
               using: str = "default") -> tuple[AgentKey, str]:
    """Mint a key for agent `name`; returns the row and the key, which is never shown again.
    Whether the caller may mint an operator key, or rotate, is the caller's check (the admin
    asks for board.intervene, and board.change_agentkey to rotate; the command is run by
    whoever runs the server).

    A name with a live key (one without an end set) is refused with NameHasLiveKey, unless
    `rotate` is given: then, in one transaction, that key's end is set to now + `rotate` and
    the new key takes the name. The unique `live_name` decides between concurrent mints.

    `queues`: comma-separated glob patterns (`ci-*,docs`, board.engine.scopes) limiting the key
    to those queues; None or empty: every queue. A key's scope never changes: rotate to change it.

    `capabilities`: comma-separated labels (`gpu,python`, board.engine.capabilities): what the
    agent can do; a claim takes only tasks whose `requires` are all among them. Changeable later
    (set_capabilities)."""
    if not is_valid_task_id(name):
        raise errors.InvalidRequest(f"agent name: {NAME_RULE}")
    why = reserved_because(name, using=using)
    if why:
        raise errors.InvalidRequest(f"agent name {name!r} is reserved: {why}")
    try:
        scope = scopes.parse(queues)
    except scopes.BadScope as exc:
        raise errors.InvalidRequest(str(exc)) from None
    labels = _capabilities(capabilities)
    if rotate is not None and not timedelta(0) <= rotate <= MAX_ROTATION_GRACE:
        raise errors.InvalidRequest(f"a rotation's grace is from 0 to {int(MAX_ROTATION_GRACE.total_seconds())} seconds")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        row = _mint(name, key, is_operator, rotate, scopes.stored(scope), labels, using=using)
    except IntegrityError:  # live_name: another key took the name first (or still has it)
        raise NameHasLiveKey(f"agent {name!r} already has a live key; revoke it, or rotate it "
                             "(create_agent_key --rotate[=SECONDS], or the admin's rotate choice)") from None
    _verified.clear()  # spares this process a failed move with a key it just ended (not needed for safety)
    return row, key


@retry_conflicts
def _mint(name: str, key: str, is_operator: bool, rotate: timedelta | None, queues: str, labels: str, *,
          using: str) -> AgentKey:
    keys = AgentKey.objects.using(using)
    with store(using).write_transaction():
        now = clock.now(using)
        if rotate is not None:
            # The old key keeps working until its end; from now on the name is the new key's.
            keys.filter(live_name=name).update(live_name=None, revoked_at=now + rotate)
        return keys.create(
            name=name, live_name=name, prefix=key[: len(KEY_PREFIX) + 6], key_hash=hash_token(key),
            is_operator=is_operator, queues=queues, capabilities=labels, created_at=now,
        )


def _capabilities(text: str | None) -> str:
    """Capability labels as a key stores them, or 422 naming what is wrong."""
    try:
        return capabilities.stored(capabilities.parse(text))
    except capabilities.BadCapabilities as exc:
        raise errors.InvalidRequest(str(exc), field="capabilities") from None


def set_capabilities(key_id: int, text: str | None, *, using: str = "default") -> AgentKey:
    """Change a key's capabilities (the Keys admin). A claim reads them from the key: a server
    process that verified the key in the last VERIFIED_SECONDS uses the former ones until it
    looks the key up again (this process: at once)."""
    labels = _capabilities(text)
    row = AgentKey.objects.using(using).get(pk=key_id)
    AgentKey.objects.using(using).filter(pk=key_id).update(capabilities=labels)
    row.capabilities = labels
    _verified.clear()
    return row


def live(using: str = "default") -> Q:
    """The filter of live keys: no end set, or an end still ahead by the store's clock."""
    return store(using).live_keys()


def _well_formed(key: str) -> bool:
    return bool(key) and key.startswith(KEY_PREFIX) and len(key) <= 200


def authenticate(key: str, *, using: str = "default") -> AgentKey | None:
    """The live key row for `key`, or None (unknown or revoked). Records the use (at most once
    a minute). The row has id, name, is_operator, queues and last_used_at loaded; the rest is
    deferred. Its scope: `scope_of(row)`."""
    if not _well_formed(key):
        return None
    key_hash = hash_token(key)
    # Only what a request needs of it (the rest deferred), by one index lookup on key_hash.
    row = store(using).find_live_key(key_hash)
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_PRECISION:
        AgentKey.objects.using(using).filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    _remember(key_hash, using, row, now)
    return row


class DeferredKey(NamedTuple):
    """A key as authenticate_deferred knows it: whoever acts on it must have the move check
    `key_hash` (pass it as the verb's key_hash), whether or not it was looked up just now (a
    waiting claim may act long after)."""

    name: str
    is_operator: bool
    key_hash: str
    scope: scopes.Scope
    capabilities: tuple[str, ...] = ()


def scope_of(row: AgentKey) -> scopes.Scope:
    """The queues `row` may use (its stored patterns were checked at minting)."""
    return scopes.parse(row.queues)


def capabilities_of(row: AgentKey) -> capabilities.Capabilities:
    """What `row`'s agent can do (board.engine.capabilities; checked when set)."""
    return capabilities.parse(row.capabilities)


class _Verified(NamedTuple):
    using: str
    name: str
    is_operator: bool
    scope: scopes.Scope  # a key's scope never changes, so remembering it is safe
    # Its capabilities may change (the Keys admin): a change reaches this cache within
    # VERIFIED_SECONDS, when the key is looked up again (board.engine.capabilities says so).
    capabilities: tuple[str, ...]
    use_recorded: float  # when its use was last recorded, by time.monotonic()


# Keys verified by this process, by key hash. Bounded: when full it is emptied (each key is
# then looked up once more), so its size never depends on how many keys agents send. A lookup
# that finds no live key stores nothing.
_verified: dict[str, _Verified] = {}
VERIFIED_MAX = 10_000
# How long a verified key is taken on trust by the hot verbs: as long as its use may go
# unrecorded, so last_used_at keeps its precision.
VERIFIED_SECONDS = LAST_USED_PRECISION.total_seconds()


def authenticate_deferred(key: str, *, using: str = "default") -> DeferredKey | None:
    """For the hot verbs only: the key as this process verified it, without a query, while its
    recorded use is under VERIFIED_SECONDS old; otherwise `authenticate` (one query). None:
    unknown or revoked (when looked up). The verb must check the returned key_hash."""
    if not _well_formed(key):
        return None
    key_hash = hash_token(key)
    known = _verified.get(key_hash)
    if known is not None and known.using == using and time.monotonic() - known.use_recorded < VERIFIED_SECONDS:
        return DeferredKey(known.name, known.is_operator, key_hash, known.scope, known.capabilities)
    row = authenticate(key, using=using)
    return (DeferredKey(row.name, row.is_operator, key_hash, scope_of(row), capabilities_of(row))
            if row is not None else None)


def _remember(key_hash: str, using: str, row: AgentKey, now) -> None:
    """Trusted until VERIFIED_SECONDS after the use last recorded (now or up to a minute ago),
    so that the next lookup, which records a use, comes when one is due."""
    if len(_verified) >= VERIFIED_MAX:
        _verified.clear()
    recorded_ago = max(0.0, (now - row.last_used_at).total_seconds())
    _verified[key_hash] = _Verified(using, row.name, row.is_operator, scope_of(row), capabilities_of(row),
                                    time.monotonic() - recorded_ago)


def revoke(key_id: int, *, using: str = "default") -> bool:
    """Revoke a key now (a rotated key's later end is brought forward); True if it was live.
    Its name is free again. Every process refuses it from its next request: the hot verbs,
    which may take a key from memory (authenticate_deferred), check it in the move."""
    revoked = AgentKey.objects.using(using).filter(live(using), pk=key_id).update(
        revoked_at=clock.now(using), live_name=None)
    _verified.clear()  # not needed for safety (see above): spares this process the failed move
    return bool(revoked)
