"""The one public view of a task, of its lease and of a history row: how they leave the server.

The API's answers (board.api) and the live board's frames (board.live) are built here and only
here. A task's public view has no lease token field at all, not even its hash, so none can
leak; the lease (token, fence, expiry) is added only to the answer of its holder's own claim,
resume or renew. The API's documented schemas (board.api.schemas: TaskOut, LeaseOut, ClaimOut,
EventOut) describe these same shapes for the OpenAPI document; tests/test_api.py checks that
what is built here is exactly what they declare.
"""
from __future__ import annotations

from board.engine.transitions import Claim
from board.models import Task, TaskEvent


# Fields the API's answers still carry under a former name (docs/api.md, "API stability"): for
# clients written before the rename. The live board's page is served with this code and reads
# the new names, so its cards leave them out (board.live.frames).
FORMER_NAMES = ("hold",)  # on_hold, since issue 28


def public_task(task: Task, deps: list[str]) -> dict:
    """The public fields of a task. Never a token (not even its hash)."""
    return {
        "id": task.id, "title": task.title, "description": task.description,
        "payload": task.payload, "queue": task.queue, "priority": task.priority, "deps": deps,
        "on_hold": task.on_hold, "max_retries": task.max_retries, "stage": task.stage,
        "version": task.version, "owner": task.owner, "fence": task.fence,
        "lease_expires_at": task.lease_expires_at, "attempts": task.attempts,
        "not_before": task.not_before, "checkpoint": task.checkpoint, "progress": task.progress,
        "result": task.result, "error": task.last_error, "created_at": task.created_at,
        "updated_at": task.updated_at,
        # Null only for a row written outside the engine: its last write is the best bound.
        "stage_changed_at": task.stage_changed_at or task.updated_at,
        "concurrency_key": task.concurrency_key,
        "rate_key": task.rate_key,
        "dedup_key": task.dedup_key,
        "fairness_key": task.fairness_key,
        "tags": list(task.tags or []),
        "resources": task.resources,
        # Capabilities (board.engine.capabilities): what a claimer must hold, and is preferred for.
        "requires": task.requires,
        "prefers": task.prefers,
        "replay_of": task.replay_of,
        "claim_rank": task.claim_rank,
        # Deadlines beside the lease (board.engine.deadlines): the creator's timeouts, and when
        # the holder last changed its progress or checkpoint (the progress deadline's clock).
        "queue_timeout_seconds": task.queue_timeout_seconds,
        "attempt_timeout_seconds": task.attempt_timeout_seconds,
        "progress_timeout_seconds": task.progress_timeout_seconds,
        "progress_changed_at": task.progress_changed_at,
        "notes_count": task.notes_count,
        # Approval gates (board.engine.approvals): PAUSED waiting for a person's answer.
        "awaiting_approval": task.awaiting_approval,
        "approvals_count": task.approvals_count,
        "hold": task.on_hold,  # FORMER_NAMES
    }


def public_claim(claim: Claim, deps: list[str], handoff: dict | None = None) -> dict:
    """A claim's answer; `handoff`: what the new holder is handed besides the lease (the
    dependencies' results, the notes: board.engine.handoffs), in the lease object."""
    lease = claim.lease
    return {"task": public_task(claim.task, deps),
            "lease": {"token": lease.token, "fence": lease.fence, "expires_at": lease.expires_at, **(handoff or {})}}


def public_event(event: TaskEvent) -> dict:
    return {"id": event.id, "task": event.task_id, "verb": event.verb, "from_stage": event.from_stage,
            "to_stage": event.to_stage, "version": event.version, "fence": event.fence,
            "actor": event.actor, "at": event.at, "detail": event.detail}
