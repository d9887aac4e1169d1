"""The API's one error shape, `{"error": {"code", "message", "task"?, "details"?}}`, and the
exception handlers that give it to every refusal: the engine's errors (board.engine.errors),
django-ninja's (validation, authentication, HttpError) and Django's own (a body too big, a
malformed request). `install(api)` registers them on the NinjaAPI (board/api/main.py).
"""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import (
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.http import HttpResponse
from ninja.errors import AuthenticationError, HttpError, ValidationError

from board.api.auth import Principal
from board.api.rendering import Renderer
from board.api.schemas import ErrorOut
from board.engine import errors, scopes, selectors
from board.engine.limits import MAX_BATCH_TASKS
from board.models import Task
from board.public import public_task

# The error answers every endpoint documents.
ERRORS = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 413: ErrorOut, 422: ErrorOut}

# The API's renderer (board/api/main.py gives it to the NinjaAPI), for the answers made here and
# by the routers, which are defined before the NinjaAPI whose create_response they would call.
RENDERER = Renderer()


def respond(request, data, status: int) -> HttpResponse:
    """`data` as the NinjaAPI renders an answer (NinjaAPI.create_response), unvalidated."""
    return HttpResponse(RENDERER.render(request, data, response_status=status), status=status,
                        content_type=f"{RENDERER.media_type}; charset={RENDERER.charset}")


def error_response(request, status: int, code: str, message: str, *, task: Task | None = None, details=None):
    body: dict = {"code": code, "message": message}
    if task is not None:
        body["task"] = public_task(task, selectors.deps_of([task.pk])[task.pk])
    if details is not None:
        body["details"] = details
    return respond(request, {"error": body}, status)


def _may_see(request, task: Task | None) -> bool:
    """Whether the caller may be shown `task` in an error (issue 27): only a principal that may
    read tasks (a session without board.view_task may not), and, for a key limited to some
    queues, only a task of those queues. Everyone else gets the refusal without the task."""
    principal = getattr(request, "auth", None)
    return (task is not None and isinstance(principal, Principal) and principal.can_read
            and scopes.allows(principal.scope, task.queue))


def on_board_error(request, exc: errors.BoardError):
    # Machine-readable specifics the engine gives (a cycle's path, unknown dependency ids).
    details = exc.details or None
    task = exc.task if _may_see(request, exc.task) else None
    return error_response(request, exc.http_status, exc.code, exc.message, task=task, details=details)


def _field_path(loc) -> list:
    """A field's location as the client wrote it: without ninja's 'body' wrappers and
    pydantic's names for the branches of a union (`function-wrap[...]`, `list[...]`)."""
    return [part for part in loc if part != "body" and not (isinstance(part, str) and "[" in part)]


def on_validation_error(request, exc: ValidationError):
    details = [{"loc": _field_path(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
               for e in exc.errors]
    # A body that may be one task or a list fails both branches; report the branch it was meant
    # for (the one whose error is not merely "wrong container type").
    specific = [d for d in details
                if d["type"] not in ("list_type", "model_type", "dict_type", "model_attributes_type")]
    details = specific or details
    batch_too_long = next((e for e in exc.errors
                           if e.get("type") == "too_long" and not _field_path(e.get("loc", ()))), None)
    if batch_too_long is not None:  # the create body's list, judged by its length alone
        count = batch_too_long.get("ctx", {}).get("actual_length")
        return error_response(request, errors.TooLarge.http_status, errors.TooLarge.code,
                              f"a batch creates at most {MAX_BATCH_TASKS} tasks; this one has {count}")
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(part) for part in first["loc"])
    return error_response(request, errors.InvalidRequest.http_status, errors.InvalidRequest.code, f"{where + ': ' if where else ''}{first['msg']}",
                          details=details)


def on_unauthorized(request, exc):
    return error_response(request, 401, "unauthorized", "send 'Authorization: Bearer <agent key>' "
                          "(or log in as staff and send the CSRF token)")


def on_too_big(request, exc):
    return error_response(request, errors.TooLarge.http_status, errors.TooLarge.code,
                          f"request body over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


def on_suspicious(request, exc: SuspiciousOperation):
    """What Django refuses while reading a request (it would answer an HTML 400 or, raised
    inside a view, a 500)."""
    if isinstance(exc, TooManyFieldsSent):
        return error_response(request, errors.TooLarge.http_status, errors.TooLarge.code, f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} "
                              "query parameters or form fields")
    return error_response(request, 400, "bad_request", str(exc) or "malformed request")


def on_http_error(request, exc: HttpError):
    # django-ninja's own 400 (a body it cannot parse) is the engine's InvalidRequest on the wire.
    codes = {400: errors.InvalidRequest.code, 401: "unauthorized", 403: errors.Forbidden.code,
             404: errors.NotFound.code, 413: errors.TooLarge.code}
    status = errors.InvalidRequest.http_status if exc.status_code == 400 else exc.status_code
    return error_response(request, status, codes.get(exc.status_code, "error"), str(exc))


def install(api) -> None:
    """Register the handlers above on `api` (django-ninja picks one by the exception's class)."""
    for exc_class, handler in (
            (errors.BoardError, on_board_error),
            (ValidationError, on_validation_error),
            # A verb that found its deferred key gone (errors.KeyRevoked) answers as any bad key does.
            (errors.KeyRevoked, on_unauthorized),
            (AuthenticationError, on_unauthorized),
            (RequestDataTooBig, on_too_big),
            (SuspiciousOperation, on_suspicious),
            (HttpError, on_http_error)):
        api.add_exception_handler(exc_class, handler)
