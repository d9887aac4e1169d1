"""What the client raises, in two families that are never confused with each other.

`TaskflowError` -- the board *answered* and refused the request with its error body
``{"error": {"code", "message", "task"?, "details"?}}``. The answer is definitive and nothing
changed on the board. There is one subclass per error code, so a racing agent can write
``except Taken:`` and know it lost fairly.

`TransportError` -- no definitive answer: the server could not be reached, the connection
broke, the request timed out, or what came back is not the API's answer (a proxy's 502, a 500
page). Whether the request took effect is unknown. It is *not* a `TaskflowError`: a loser of a
race is never a network fault, and a network fault is never counted as a loser.

"""
from __future__ import annotations

from typing import Any

__all__ = [
    "ERROR_CLASSES",
    "Blocked",
    "DuplicateId",
    "DuplicateName",
    "Forbidden",
    "InvalidTransition",
    "LeaseLost",
    "NotFound",
    "NotesFull",
    "BudgetExhausted",
    "Taken",
    "TaskflowError",
    "Terminal",
    "TooLarge",
    "TooManyWaiters",
    "TransportError",
    "Unauthorized",
    "ValidationFailed",
    "VersionConflict",
    "error_from_body",
]


class TaskflowError(Exception):
    """The board refused the request (nothing changed).

    Attributes:
        code:    the API's machine code, e.g. ``"lease_lost"``.
        status:  the HTTP status of the answer (404, 409, 422, ...).
        message: the server's human message.
        task:    the task as it is now (a dict), when the error concerns one; else None.
        details: extra structured detail (e.g. validation errors), or None.
    """

    code = "error"

    def __init__(self, message: str = "", *, status: int = 0, code: str | None = None,
                 task: dict[str, Any] | None = None, details: Any = None):
        self.message = message or (type(self).__doc__ or "").strip().splitlines()[0]
        if code is not None:
            self.code = code
        self.status = status
        self.task = task
        self.details = details
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class NotFound(TaskflowError):
    """No task has this id (404 not_found)."""

    code = "not_found"


class Taken(TaskflowError):
    """The task is held by another live lease (409 taken)."""

    code = "taken"


class Blocked(TaskflowError):
    """The task is not ready: a dependency is unfinished, it is held, or it is backing off (409 blocked).

    Or it is ready but may not start now: its queue is paused or at its concurrency limit, or
    its concurrency key is at its limit; ``details["waiting"]`` then says which (e.g.
    ``"queue ci is paused"``, ``"repo:acme/web is at its limit 1/1"``)."""

    code = "blocked"


class Terminal(TaskflowError):
    """The task has finished (COMPLETED or CANCELLED); nothing more can happen to it (409 terminal)."""

    code = "terminal"


class LeaseLost(TaskflowError):
    """This lease token is not the task's current lease: expired, released or taken over (409 lease_lost)."""

    code = "lease_lost"


class VersionConflict(TaskflowError):
    """The task changed since the version you expected (409 version_conflict)."""

    code = "version_conflict"


class InvalidTransition(TaskflowError):
    """The lifecycle does not allow this move from the task's current stage (409 invalid_transition)."""

    code = "invalid_transition"


class DuplicateId(TaskflowError):
    """A different task with this id already exists (409 duplicate_id)."""

    code = "duplicate_id"


class DuplicateName(TaskflowError):
    """A schedule with this name already exists with other settings (409 duplicate_name)."""

    code = "duplicate_name"


class NotesFull(TaskflowError):
    """The task has as many notes as it may have, 100 (409 notes_full)."""

    code = "notes_full"


class AlreadyAnswered(TaskflowError):
    """Someone answered the approval first (or it timed out, or was cancelled with its task):
    one answer per approval (409 already_answered)."""

    code = "already_answered"


class ApprovalClosed(TaskflowError):
    """`Lease.ask` / `Job.ask` (the client's own, no server code): the question was closed
    without an answer to act on: it timed out with on_timeout "fail" or "cancel", or its task
    was cancelled. ``approval`` is the approval as the server has it."""

    code = "approval_closed"

    def __init__(self, message: str, approval: dict[str, Any]):
        super().__init__(message)
        self.approval = approval


class BudgetExhausted(TaskflowError):
    """The task's queue has spent its budget: no claim of it starts until its window ends or an
    operator raises it (409 budget_exhausted)."""

    code = "budget_exhausted"


class ValidationFailed(TaskflowError):
    """The request is not valid; ``details`` lists the fields (422 validation_error)."""

    code = "validation_error"


class Unauthorized(TaskflowError):
    """The API key is missing, unknown or revoked (401 unauthorized)."""

    code = "unauthorized"


class Forbidden(TaskflowError):
    """Not allowed: the lease belongs to another agent, or operator rights are needed (403 forbidden)."""

    code = "forbidden"


class TooLarge(TaskflowError):
    """The request, or one of its JSON values, is over the size limit (413 too_large)."""

    code = "too_large"


class TooManyWaiters(TaskflowError):
    """The server already parks as many waiting claims as it allows; try again shortly
    (503 too_many_waiters). `claim_next` does so by itself until its wait is over."""

    code = "too_many_waiters"


class TransportError(Exception):
    """No definitive answer from the board: connection refused or broken, timeout, or a
    response that is not the API's (e.g. a 5xx page). The request may or may not have taken
    effect. Attributes: ``status`` (the HTTP status if a response arrived, else None),
    ``body`` (the start of that response's text, if any)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = ""):
        self.message = message
        self.status = status
        self.body = body
        super().__init__(message)


ERROR_CLASSES: dict[str, type[TaskflowError]] = {
    cls.code: cls
    for cls in (NotFound, Taken, Blocked, Terminal, LeaseLost, VersionConflict, InvalidTransition,
                DuplicateId, DuplicateName, NotesFull, BudgetExhausted, AlreadyAnswered, ValidationFailed, Unauthorized,
                Forbidden, TooLarge, TooManyWaiters)
}


def error_from_body(status: int, body: dict[str, Any]) -> TaskflowError:
    """The exception for an API error body ``{"error": {...}}``; unknown codes give a plain
    `TaskflowError` carrying the code."""
    error = body["error"]
    code = str(error.get("code") or "error")
    cls = ERROR_CLASSES.get(code, TaskflowError)
    return cls(str(error.get("message") or ""), status=status, code=code, task=error.get("task"),
               details=error.get("details"))
