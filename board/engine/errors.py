"""Typed errors of the engine. Each class's docstring is its human message; `code` is the
machine code every caller (API, admin, client) reports unchanged.

An error raised by a verb means nothing was written."""
from __future__ import annotations

from typing import Any


class BoardError(Exception):
    """The board refused the request."""

    code = "board_error"
    http_status = 409

    def __init__(self, message: str | None = None, *, task: Any = None, field: str | None = None, **details: Any):
        self.message = message or (self.__doc__ or "").strip().splitlines()[0]
        self.task = task  # the task's current row when one exists (never carries a token)
        # The argument the refusal is about ("title", "payload", "reason"...), when it is about
        # one: the admin marks that form field by it, never by searching the message's words.
        self.field = field
        self.details = details
        super().__init__(self.message)


class NotFound(BoardError):
    """No task has this id."""

    code = "not_found"
    http_status = 404


class Taken(BoardError):
    """The task is held by another live lease."""

    code = "taken"


class Blocked(BoardError):
    """The task is not ready: a dependency is unfinished, it is on hold, or it is backing off."""

    code = "blocked"


class Terminal(BoardError):
    """The task has finished (COMPLETED or CANCELLED); nothing more can happen to it."""

    code = "terminal"


class LeaseLost(BoardError):
    """This lease token is not the task's current lease (expired, released or taken over)."""

    code = "lease_lost"


class NotesFull(BoardError):
    """The task has as many notes as it may have (limits.MAX_NOTES_PER_TASK)."""

    code = "notes_full"


class AlreadyAnswered(BoardError):
    """The approval was answered (or timed out, or cancelled with its task) first: one answer
    per approval (board.engine.transitions.approvals)."""

    code = "already_answered"


class BudgetExhausted(BoardError):
    """The task's queue has spent its budget (board.engine.budgets): no claim of it starts until
    its window ends or an operator raises the budget."""

    code = "budget_exhausted"


class VersionConflict(BoardError):
    """The task changed since the version you expected."""

    code = "version_conflict"


class InvalidTransition(BoardError):
    """The lifecycle does not allow this move from the task's current stage."""

    code = "invalid_transition"


class DuplicateId(BoardError):
    """A task with this id already exists."""

    code = "duplicate_id"


class DuplicateName(BoardError):
    """A schedule with this name already exists, with other settings."""

    # Not duplicate_id (a task's): a schedule is created again with the same settings (200), so
    # this says that the name is taken by a different schedule.
    code = "duplicate_name"


class InvalidRequest(BoardError):
    """The request is not valid.

    The one "invalid input" error, whoever finds it: the engine, the API's schemas (pydantic's
    errors) and board.api.middleware (an unreadable URL) all answer 422 with this code,
    `validation_error`; the Python client raises it as `taskflow_client.ValidationFailed`."""

    code = "validation_error"
    http_status = 422


class Forbidden(BoardError):
    """You may not do this: the lease belongs to another agent, or the action needs operator rights."""

    code = "forbidden"
    http_status = 403


class KeyRevoked(BoardError):
    """The agent key this request was sent with is no longer live (revoked or deleted)."""

    # A verb given the caller's key to check (key_hash: the API's hot verbs, which skip the
    # separate key lookup for a key verified by this process in the last minute) raises this
    # when its own statement finds the key gone. The API answers it exactly like any bad key.
    code = "unauthorized"
    http_status = 401


class TooLarge(BoardError):
    """The request, or one of its JSON values, is over the size limit."""

    code = "too_large"
    http_status = 413
