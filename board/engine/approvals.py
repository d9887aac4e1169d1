"""Approval gates (issue 32, item 2): a task's holder asks a person a question and gives its
lease up while the person thinks; the answer puts the task back in the line, and the next claim
carries it (`lease.approval`). This module holds the rules (what a question, a form, an answer
may be; who may answer) and the approval as the API shows it. The moves are in
board.engine.transitions.approvals; the reaper applies timeouts.

The waiting sub-state: PAUSED with Task.awaiting_approval, and one Approval row in state
"waiting". No lease, no slot, no resource is held meanwhile (the ask gives them back as a pause
does). Resume and requeue refuse such a task (answer it, or cancel it); cancel closes the
approval as "cancelled".

The form is a JSON Schema of flat fields, so that the board can draw it: an object whose
`properties` are strings (optionally an `enum`), numbers, integers or booleans, with `required`,
`title`, `description` and `default` where JSON Schema has them. An answer's `values` must be
valid against it (jsonschema), and are stored as given.

Who may answer: an operator key (the API) or a staff user with operator rights
(board.intervene) when the question names no approvers; when it names some, a staff user whose
username or one of whose groups is named (a superuser always may). The agent that asked is
never an approver of its own question, unless it holds an operator key.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from board.engine import errors
from board.models import Approval
from board.engine.inputs import unstorable_text
from board.engine.limits import (
    APPROVAL_PREFER_SECONDS,
    MAX_APPROVAL_FIELDS,
    MAX_APPROVAL_FORM_BYTES,
    MAX_APPROVAL_TIMEOUT_SECONDS,
    MAX_APPROVERS,
    MAX_NAME_CHARS,
    MAX_QUESTION_CHARS,
)

ON_TIMEOUT = ("fail", "approve", "cancel")
FIELD_TYPES = ("string", "number", "integer", "boolean")
# What a field of the form may say besides its type: what the board can draw and check.
FIELD_KEYS = {"type", "title", "description", "enum", "default", "minimum", "maximum", "minLength",
              "maxLength", "pattern", "format"}
FORM_KEYS = {"type", "properties", "required", "title", "description", "additionalProperties", "$schema"}
TIMEOUT_ANSWERER = "system:timeout"


def question_text(question: object) -> str:
    if not isinstance(question, str) or not question.strip():
        raise errors.InvalidRequest("question must be a non-empty string", field="question")
    if len(question) > MAX_QUESTION_CHARS:
        raise errors.InvalidRequest(f"question is longer than {MAX_QUESTION_CHARS} characters", field="question")
    if (why := unstorable_text(question)) is not None:
        raise errors.InvalidRequest(f"question {why}", field="question")
    return question


def checked_form(form: object) -> dict | None:
    """The form as given, when it is a JSON Schema of flat fields (module docstring); None for none."""
    if form is None:
        return None
    if not isinstance(form, dict):
        raise errors.InvalidRequest("form must be a JSON Schema object", field="form")
    if len(json.dumps(form, separators=(",", ":")).encode()) > MAX_APPROVAL_FORM_BYTES:
        raise errors.InvalidRequest(f"form is larger than {MAX_APPROVAL_FORM_BYTES} bytes of JSON", field="form")
    if form.get("type", "object") != "object" or not isinstance(form.get("properties", {}), dict):
        raise errors.InvalidRequest('form must be {"type": "object", "properties": {...}}', field="form")
    if unknown := set(form) - FORM_KEYS:
        raise errors.InvalidRequest(f"form: unsupported keys {sorted(unknown)} (a form is flat fields)", field="form")
    if (why := unstorable_text(form)) is not None:
        raise errors.InvalidRequest(f"form: {why}", field="form")
    fields = form.get("properties", {})
    if len(fields) > MAX_APPROVAL_FIELDS:
        raise errors.InvalidRequest(f"form: at most {MAX_APPROVAL_FIELDS} fields", field="form")
    for name, spec in fields.items():
        if not isinstance(spec, dict) or spec.get("type") not in FIELD_TYPES:
            raise errors.InvalidRequest(f"form: field {name!r} needs a type among {', '.join(FIELD_TYPES)}",
                                        field="form")
        if unknown := set(spec) - FIELD_KEYS:
            raise errors.InvalidRequest(f"form: field {name!r} has unsupported keys {sorted(unknown)}", field="form")
    required = form.get("required", [])
    if not isinstance(required, list) or any(name not in fields for name in required):
        raise errors.InvalidRequest("form: required must list fields of its properties", field="form")
    try:
        Draft202012Validator.check_schema(form)
    except SchemaError as exc:
        raise errors.InvalidRequest(f"form is not a valid JSON Schema: {exc.message}", field="form") from None
    return form


def checked_approvers(approvers: object) -> list[str]:
    if approvers is None:
        return []
    if not isinstance(approvers, list) or not all(isinstance(a, str) and a.strip() for a in approvers):
        raise errors.InvalidRequest("approvers must be a list of usernames or group names", field="approvers")
    if len(approvers) > MAX_APPROVERS:
        raise errors.InvalidRequest(f"approvers: at most {MAX_APPROVERS}", field="approvers")
    if any(len(a) > MAX_NAME_CHARS for a in approvers):
        raise errors.InvalidRequest(f"approvers: a name is at most {MAX_NAME_CHARS} characters", field="approvers")
    return list(dict.fromkeys(approvers))


def checked_timeout(timeout_seconds: object, on_timeout: object) -> tuple[int | None, str]:
    if on_timeout not in ON_TIMEOUT:
        raise errors.InvalidRequest(f"on_timeout must be one of {', '.join(ON_TIMEOUT)}", field="on_timeout")
    if timeout_seconds is None:
        return None, on_timeout
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int) \
            or not 1 <= timeout_seconds <= MAX_APPROVAL_TIMEOUT_SECONDS:
        raise errors.InvalidRequest(f"timeout_seconds must be a whole number from 1 to {MAX_APPROVAL_TIMEOUT_SECONDS}",
                                    field="timeout_seconds")
    return timeout_seconds, on_timeout


def checked_answer(form: dict | None, approve: object, values: object, comment: object) -> tuple[bool, Any, str]:
    """The answer's (approve, values, comment) when valid against the approval's form. Values are
    checked only on an approval: a rejection's are kept if given but need not fill the form."""
    if not isinstance(approve, bool):
        raise errors.InvalidRequest("approve must be true or false", field="approve")
    if comment is None:
        comment = ""
    if not isinstance(comment, str) or len(comment) > MAX_QUESTION_CHARS or unstorable_text(comment):
        raise errors.InvalidRequest(f"comment must be text of at most {MAX_QUESTION_CHARS} characters", field="comment")
    if values is not None and not isinstance(values, dict):
        raise errors.InvalidRequest("values must be a JSON object", field="values")
    if values is not None and len(json.dumps(values, separators=(",", ":")).encode()) > MAX_APPROVAL_FORM_BYTES:
        raise errors.InvalidRequest(f"values are larger than {MAX_APPROVAL_FORM_BYTES} bytes of JSON", field="values")
    if (why := unstorable_text(values)) is not None:
        raise errors.InvalidRequest(f"values: {why}", field="values")
    if form is None:
        if values:
            raise errors.InvalidRequest("this approval has no form: send no values", field="values")
        return approve, None, comment
    if approve or values is not None:
        fields = form.get("properties", {})
        for field, value in (values or {}).items():
            if field not in fields:
                raise errors.InvalidRequest(f"values: {field!r} is not a field of the form", field="values")
        problem = next(iter(Draft202012Validator(form).iter_errors(values or {})), None)
        if problem is not None and approve:
            where = "".join(f".{p}" for p in problem.absolute_path)  # "values.replicas", or "values"
            raise errors.InvalidRequest(f"values{where}: {problem.message}", field="values")
    return approve, values, comment


def may_answer(approval: Any, *, username: str, groups: set[str], operator: bool, superuser: bool = False) -> bool:
    """Whether this caller may answer `approval` (module docstring). `operator`: an operator key,
    or a staff user with board.intervene."""
    if superuser:
        return True
    if approval.approvers:
        return username in approval.approvers or bool(groups & set(approval.approvers))
    return operator


def prefer_until(answered_at: datetime) -> datetime:
    """Until when the answered task waits for the agent that asked."""
    return answered_at + timedelta(seconds=APPROVAL_PREFER_SECONDS)


def kept_for(using: str, task: Any, now: datetime) -> str | None:
    """The agent QUEUED `task` is kept for, if any: the agent that asked the approval answered
    last, while APPROVAL_PREFER_SECONDS since the answer have not passed (its not_before). That
    agent's claim of it by id passes; the others wait. One read, only for a task that asked."""
    if not task.approvals_count or task.not_before is None or task.not_before <= now:
        return None
    last = Approval.objects.using(using).filter(task_id=task.pk).order_by("-id").first()
    if last is None or last.answered_at is None or task.not_before != prefer_until(last.answered_at):
        return None
    return last.asked_by


def refuse_awaiting(task: Any, verb: str) -> None:
    """Resume and requeue leave a task waiting for an answer alone: the answer moves it."""
    if task.stage == "PAUSED" and task.awaiting_approval:
        raise errors.InvalidTransition(f"cannot {verb} task {task.pk}: it waits for an answer to its approval; "
                                       "answer it, or cancel the task", task=task)


def public_approval(approval: Any) -> dict[str, Any]:
    """An approval as the API, the board and a lease show it."""
    return {"id": approval.id, "task": approval.task_id, "question": approval.question, "form": approval.form,
            "approvers": approval.approvers, "asked_by": approval.asked_by, "asked_at": approval.asked_at,
            "attempt": approval.attempt, "fence": approval.fence, "due_at": approval.due_at,
            "on_timeout": approval.on_timeout, "state": approval.state, "approved": approval.approved,
            "values": approval.values, "comment": approval.comment, "answered_by": approval.answered_by or None,
            "answered_at": approval.answered_at}
