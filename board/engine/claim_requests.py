"""Claim request ids: a claim sent again after its answer was lost gets the lease it made.

A claim (`claim`, `claim_next`) commits, then its answer is lost (the client timed out, a proxy
dropped the connection): the task stays RUNNING under a lease whose token nobody has, until it
expires (up to 24 h). So an agent may send a `request_id` with a claim (printable ASCII, 1-64
characters; the Python client sends a fresh uuid4 per call and retries once on a transport
error). The lease then records:

- `claim_request_hash`: SHA-256 of (agent, request id), never the id itself;
- `claim_token_seed`: a random value minted with the lease (`secrets`).

and its token is HMAC-SHA256(key=request id, seed): minted by the store (the agent cannot know
it before the claim), stored only as its hash like every token, and computable again from the
request id and the seed. A claim from the same agent with the same id while that lease is live
(RUNNING, not expired, the same request hash) returns the same task, token, fence and current
expiry instead of claiming again. Otherwise (another agent, an expired or ended lease) the
claim is an ordinary one. Both columns are cleared with the rest of the lease.

Only the same agent (its API key) can replay a request. The database holds the seed and the
request's hash, never the id: with a guessable id a copy of the database would be enough to
compute the token, so send an unguessable one (the client's uuid4).

Race safety: two copies of one request must not make two leases.
- claim(task): the task's compare-and-swap decides; the loser re-reads the row, finds the
  winner's lease under its own request hash and returns it.
- claim_next: the lookup and the claim run in one write transaction, serialised per request:
  on SQLite by the database's single writer (BEGIN IMMEDIATE), on PostgreSQL by a transaction
  advisory lock on the request hash (`serialise`), taken before the lookup, so the second copy
  reads the first one's committed lease.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from board.engine import clock, errors
from board.engine.stores import store
from board.engine.lifecycle import Stage
from board.engine.limits import MAX_REQUEST_ID_CHARS
from board.engine.tokens import hash_token, token_text
from board.models import Task

# Printable ASCII without space: safe in logs and headers, no normalisation questions.
PATTERN = r"^[\x21-\x7e]{1,64}$"
_VALID = re.compile(PATTERN)


@dataclass(frozen=True)
class ClaimRequest:
    request_id: str
    digest: str  # SHA-256 of (agent, request id): what the lease records as claim_request_hash

    def mint(self) -> tuple[str, str]:
        """A new lease's (token, seed)."""
        seed = secrets.token_urlsafe(32)
        return self.token(seed), seed

    def token(self, seed: str) -> str:
        return token_text(hmac.new(self.request_id.encode(), seed.encode(), hashlib.sha256).digest())


def of(agent: str, request_id: str | None) -> ClaimRequest | None:
    """The claim request `request_id` names for `agent`; None without one. InvalidRequest for
    an id that is not 1-64 printable ASCII characters."""
    if request_id is None:
        return None
    if not isinstance(request_id, str) or not _VALID.fullmatch(request_id):
        raise errors.InvalidRequest(f"request_id must be 1-{MAX_REQUEST_ID_CHARS} printable ASCII characters (no spaces)")
    digest = hash_token(f"{agent}\0{request_id}")
    return ClaimRequest(request_id, digest)


def token_if_made_by(task: Task, request: ClaimRequest, agent: str, now: datetime) -> str | None:
    """The token of `task`'s lease when that lease is live at `now` and was made by this
    request of this agent; otherwise None."""
    if task.lease_expires_at is None or task.lease_expires_at <= now:
        return None
    return _token_of(task, request, agent)


def made_by(using: str, request: ClaimRequest, agent: str) -> tuple[Task, str] | None:
    """The live lease (by the store's clock) this request of this agent made, as (task,
    token), or None. An agent holds few tasks at a time: the owner index finds them."""
    live = Task.objects.using(using).filter(owner=agent, claim_request_hash=request.digest, stage=Stage.RUNNING,
                                            lease_expires_at__gt=clock.in_query(using))
    for task in live:
        token = _token_of(task, request, agent)
        if token is not None:
            return task, token
    return None


def all_made_by(using: str, request: ClaimRequest, agent: str) -> list[tuple[Task, str]]:
    """Every live lease this request of this agent made (a batch claim makes several), as
    (task, token), in claim order: by the time each was claimed, then id (board.engine.
    transitions.batches)."""
    live = Task.objects.using(using).filter(owner=agent, claim_request_hash=request.digest, stage=Stage.RUNNING,
                                            lease_expires_at__gt=clock.in_query(using))
    made = [(task, token) for task in live if (token := _token_of(task, request, agent)) is not None]
    made.sort(key=lambda pair: (pair[0].stage_changed_at, pair[0].pk))
    return made


def _token_of(task: Task, request: ClaimRequest, agent: str) -> str | None:
    if (task.stage != Stage.RUNNING or task.owner != agent or task.claim_request_hash != request.digest
            or not task.claim_token_seed):
        return None
    token = request.token(task.claim_token_seed)
    # The stored hash is the proof: never hand out a token that does not hold the lease.
    if not hmac.compare_digest(hash_token(token), task.lease_token_hash or ""):
        return None
    return token


def serialise(using: str, request: ClaimRequest) -> None:
    """Inside a write transaction: wait until no other transaction is handling this request
    (the store's serialise_on: an advisory lock on PostgreSQL, a write to one document that makes
    a copy conflict and retry on MongoDB, nothing on SQLite, whose writer is alone)."""
    store(using).serialise_on(request.digest)
