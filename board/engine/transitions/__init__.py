"""THE only writer of a task's stage, version and lease: one function per verb (the package's
modules, re-exported here so that callers keep `transitions.claim_next(...)`)."""
from board.engine import errors  # noqa: F401  (callers catch transitions.errors.X)
from board.engine.tokens import hash_token  # noqa: F401
from board.engine.transitions.leases import (  # noqa: F401
    EDITABLE, NO_LEASE, RACE_RETRIES, Claim, Lease, Reclaimed, TaskSpec, _mint_token, _require_live_key,
    _swap, admit, admit_ready, cancel, claim, claim_next, complete, create, edit, fail, failure_detail,
    force_pause, force_release, pause, reclaim_expired, release, renew, requeue, resume,
)
