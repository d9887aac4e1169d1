"""THE only module that changes a task's stage, version or lease. One function per verb.

Every move is one compare-and-swap (`cas._swap`): a conditional UPDATE filtered on the task's id,
the stage and version it was read at (and, for a holder's verb, the hash of its lease token),
setting the new stage with version + 1 in the same statement, and the move's TaskEvent inserted
in the same transaction. A match count of 0 means another writer moved first: the verb reloads
the row and either tries again (when the move is still legal) or raises the precise error from
`board.engine.errors`; an error leaves the database untouched.

Tokens are minted here (`secrets`; for a claim sent with a request id, derived from a minted
seed: `board.engine.claim_requests`), never by the caller; only their SHA-256 is stored. Lease
expiries come from the store's clock and a TTL the caller gives. The fence rises by one on every
claim, resume and takeover, and never on renew.

On MongoDB a CAS that races another transaction's write aborts the transaction (a
WriteConflict): every public verb is wrapped by `board.engine.stores.retry_conflicts`, which runs
it again from the start. Row locks are not the mechanism (SQLite has none): the CAS is. Each
public verb wears `tracing.traced` (outermost).

The rooms: `cas` (the CAS and what the verbs share), `creation` (create, the DAG checks),
`leases` (the holder's verbs: claim, claim_next, resume, renew, release, complete, fail, pause),
`batches` (several moves in one call: a finishing move and the next claim, a batch of claims or
of completions), `notes` (a note on a task: not a move, but guarded by the lease as one),
`approvals` (ask a person and give the lease up; the answer; the timeouts), `operators` (admit,
requeue, cancel, force_release, force_pause, edit), `housekeeping` (admit_ready,
reclaim_expired, enforce_deadlines). Callers use the names below: `transitions.claim_next(...)`.
"""
from board.engine import errors  # noqa: F401  (callers catch transitions.errors.X)
from board.engine.tokens import hash_token  # noqa: F401
from board.engine.transitions.cas import NO_LEASE, RACE_RETRIES, Claim, Lease, _swap  # noqa: F401
from board.engine.transitions.batches import (  # noqa: F401
    CompleteItem,
    Finished,
    NextClaim,
    claim_batch,
    complete_and_claim,
    complete_batch,
    fail_and_claim,
    release_and_claim,
)
from board.engine.transitions.creation import TaskSpec, create, replay  # noqa: F401
from board.engine.transitions.housekeeping import (  # noqa: F401
    Enforced,
    Reclaimed,
    admit_ready,
    enforce_deadlines,
    reclaim_expired,
)
from board.engine.transitions.leases import (  # noqa: F401
    _mint_token,
    _require_live_key,
    claim,
    claim_next,
    complete,
    fail,
    failure_detail,
    pause,
    release,
    renew,
    resume,
)
from board.engine.transitions.notes import add_note  # noqa: F401
from board.engine.transitions.approvals import (  # noqa: F401
    answer,
    request_approval,
    time_out_approvals,
    waiting_approval,
)
from board.engine.transitions.operators import (  # noqa: F401
    EDITABLE,
    admit,
    cancel,
    edit,
    force_pause,
    force_release,
    requeue,
)
