"""A small client for the TaskFlow board's JSON API, for agents and worker programs.

Standard library only: copy this package next to your program, no Django needed.

Quick start::

    import os
    from taskflow_client import Client

    client = Client(os.environ["TASKFLOW_URL"], os.environ["TASKFLOW_KEY"])
    client.create([{"id": "fetch", "title": "fetch"},
                   {"id": "parse", "title": "parse", "deps": ["fetch"]}])

    while True:
        with client.hold(ttl_seconds=30, wait_seconds=5) as job:
            if job is None:           # no work for 5 s
                break
            job.result = {"done": job.task_id}   # completed on leaving the block

What is here:

- `Client` -- one method per endpoint (`create`, `get`, `list`, `events`, `claim_next`,
  `claim`, `resume`, `renew`, `release`, `complete`, `fail`, `pause`, `admit`, `requeue`,
  `cancel`, `check`) and the context managers `hold` / `hold_task`.
- `Client.queues()`, `Client.queue(name)` -> `Queue` -- queues' limits, pause and running counts;
  an operator key's ``queue.pause(reason=...)``, ``resume``, ``set_concurrency(n)``, ``history()``.
- `Client.fairness_keys()`, `Client.fairness_key(name)` -> `FairnessKey` -- fairness keys' weights and
  budgets; an operator key's ``fairness_key.set_budget(tokens=..., per=...)``.
- `Client.schedules()`, `Client.schedule(name)` -> `Schedule` -- periodic tasks (a cron, in a time
  zone): ``create(cron, task)``, ``get``, ``update``, ``pause``, ``resume``, ``delete``.
- `Lease` -- what a claim returns (task, token, fence, expires_at) with the holder's verbs.
- `Job` -- a lease held by a ``with`` block: background renewal every ttl/3, ``job.lost`` (a bool),
  ``job.checkpoint()``, ``job.pause()``, complete on success, fail on an exception. ``hold()``'s
  complete also claims the next task (one round trip per task in a worker loop).
- Hand-offs: a claim's ``lease.inputs`` (its dependencies' results) and ``lease.notes`` (what
  earlier attempts wrote); ``lease.note(text)`` / ``job.note(text)`` / `Client.add_note` leave one.
- Batches: `Client.claim_batch` / `complete_batch` (one request for up to 100 tasks),
  `Client.hold_batch` -> `JobBatch` (one heartbeat for the batch), `Client.work(handler)`, the batch
  worker loop (examples/fast_worker.py).
- Errors: `TaskflowError` (the board refused; one subclass per error code: `NotFound`,
  `Taken`, `Blocked`, `Terminal`, `LeaseLost`, `VersionConflict`, `InvalidTransition`,
  `DuplicateId`, `DuplicateName`, `NotesFull`, `BudgetExhausted`, `AlreadyAnswered`, `ApprovalClosed`, `ValidationFailed`, `Unauthorized`, `Forbidden`, `TooLarge`, `TooManyWaiters`) and
  `TransportError` (no definitive answer; never a `TaskflowError`).
- ``python -m taskflow_client --help`` -- the same from a shell.
- ``python -m taskflow_client.mcp`` -- the same as MCP tools for LLM agents (the one module that
  needs a package: the ``mcp`` SDK; nothing here imports it).
"""
from .client import Client, FairnessKey, Lease, Queue, RateKey, Schedule
from .errors import (
    ERROR_CLASSES,
    AlreadyAnswered,
    ApprovalClosed,
    Blocked,
    DuplicateId,
    DuplicateName,
    Forbidden,
    InvalidTransition,
    LeaseLost,
    NotFound,
    NotesFull,
    BudgetExhausted,
    Taken,
    TaskflowError,
    Terminal,
    TooLarge,
    TooManyWaiters,
    TransportError,
    Unauthorized,
    ValidationFailed,
    VersionConflict,
)
from .hold import Hold, HoldBatch, Job, JobBatch, Outcome

__all__ = [
    "ERROR_CLASSES",
    "AlreadyAnswered",
    "ApprovalClosed",
    "Blocked",
    "Client",
    "DuplicateId",
    "DuplicateName",
    "FairnessKey",
    "Forbidden",
    "Hold",
    "HoldBatch",
    "InvalidTransition",
    "Job",
    "JobBatch",
    "Lease",
    "LeaseLost",
    "NotFound",
    "NotesFull",
    "BudgetExhausted",
    "Outcome",
    "Queue",
    "RateKey",
    "Schedule",
    "Taken",
    "TaskflowError",
    "Terminal",
    "TooLarge",
    "TooManyWaiters",
    "TransportError",
    "Unauthorized",
    "ValidationFailed",
    "VersionConflict",
]
__version__ = "1.0"
