"""The server's log: where its lines go, what they look like, and which request each belongs to.

Every line goes to stderr (the output of `manage.py serve`, which a supervisor or journald
keeps), DEBUG on or off: Django's own logger writes there too, so a 500 is logged with its
traceback in production (Django's default sends it only to a DEBUG console or to ADMINS by mail).
Every record is scrubbed of keys and tokens when it is made (server/redaction.py); the
request's path and id, which this module adds, are scrubbed here.

`LOG_FORMAT=text` (default): `time level logger [request id method path status duration]
message`, the traceback on the lines after. `LOG_FORMAT=json`: one JSON object per line, for log
shippers: `time` (UTC, ISO 8601), `level`, `logger`, `message`, `request_id`, `method`, `path`,
`status`, `duration_ms` (null outside a request or where unknown) and, when there is one,
`traceback`.

The request id: an incoming `X-Request-ID` of 1-64 characters from [A-Za-z0-9._:-] (and no
secret in it) is kept, so a proxy's or a client's id follows the request into this log; any other
value, or none, is replaced by a fresh one (32 hex digits). Either way the response carries it
in `X-Request-ID` (`request_id_header`, the outermost middleware), and every line logged while
the request runs names it. `duration_ms` is the time since the request began, when the line was
logged (for Django's line about a 5xx or a 4xx, which comes last, the request's whole time).
"""
from __future__ import annotations

import contextvars
import json
import logging
import logging.config
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from server.redaction import install_record_factory, scrub

REQUEST_ID_HEADER = "X-Request-ID"
_WELL_FORMED_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_MAX_PATH = 2000  # characters of a path a line shows


@dataclass(frozen=True)
class RequestContext:
    id: str
    method: str
    raw_path: str  # as the request sent it: scrubbed and escaped only when a line shows it
    started: float  # time.perf_counter()

    @property
    def path(self) -> str:
        # Escaped as Django escapes the path in its own lines: a %0A in a URL never starts a new
        # line. Done here, not per request: scrubbing a path costs ~10 us, and most requests log nothing.
        return scrub(self.raw_path[:_MAX_PATH]).encode("unicode_escape").decode("ascii")


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("request", default=None)


def current() -> RequestContext | None:
    return _current.get()


def request_id_from(sent: str | None) -> str:
    """The id a request goes by: the one it sent when well-formed, else a fresh one."""
    if sent and _WELL_FORMED_ID.fullmatch(sent) and scrub(sent) == sent:
        return sent
    return secrets.token_hex(16)


def _begin(sender, environ=None, scope=None, **kwargs) -> None:
    """request_started: Django's handler is taking a request (WSGI environ, or ASGI scope)."""
    if environ is not None:
        method = environ.get("REQUEST_METHOD", "")
        path = environ.get("PATH_INFO", "").encode("latin-1", "replace").decode("utf-8", "replace")
        sent = environ.get("HTTP_X_REQUEST_ID")
    elif scope is not None:
        method, path = scope.get("method", ""), scope.get("path", "")
        sent = dict(scope.get("headers") or ()).get(b"x-request-id", b"").decode("latin-1") or None
    else:
        return
    _current.set(RequestContext(request_id_from(sent), method, path, time.perf_counter()))


def _end(sender, **kwargs) -> None:
    """request_finished: after the response is sent, and after Django's line about a 4xx/5xx."""
    _current.set(None)


def request_id_header(get_response):
    """Outermost middleware: the response names the request's id (X-Request-ID)."""

    def middleware(request):
        response = get_response(request)
        context = current()
        if context is not None:
            response[REQUEST_ID_HEADER] = context.id
        return response

    return middleware


def configure_logging(config: dict) -> None:
    """settings.LOGGING_CONFIG: every record scrubbed (redaction), Django's dictConfig, and the
    request context kept for the lines logged while a request runs."""
    from django.core.signals import request_finished, request_started

    install_record_factory()
    logging.config.dictConfig(config)
    request_started.connect(_begin, dispatch_uid="server.server_log.begin")
    request_finished.connect(_end, dispatch_uid="server.server_log.end")


# ---------------------------------------------------------------------------------------------
# What a line holds


def _status(record: logging.LogRecord) -> int | None:
    status = getattr(record, "status_code", None)  # Django's django.request lines
    if status is None and record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        status = record.args[4]  # (client, method, path, http version, status)
    return status if isinstance(status, int) else None


def fields(record: logging.LogRecord) -> dict:
    """The request's fields of a record: its id, method, path, status and duration so far."""
    context = current()
    method = path = None
    if context is not None:
        method, path = context.method, context.path
    elif record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        method, path = record.args[1], record.args[2]  # already scrubbed with the record
    return {
        "request_id": context.id if context else None,
        "method": method,
        "path": path,
        "status": _status(record),
        "duration_ms": round((time.perf_counter() - context.started) * 1000, 3) if context else None,
    }


def _traceback(record: logging.LogRecord, formatter: logging.Formatter) -> str | None:
    text = record.exc_text  # set (and scrubbed) by the record factory when there is exc_info
    if not text and record.exc_info:
        text = scrub(formatter.formatException(record.exc_info))
    if record.stack_info:
        text = f"{text}\n{record.stack_info}" if text else record.stack_info
    return text or None


def _time(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """LOG_FORMAT=json: one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": _time(record), "level": record.levelname, "logger": record.name,
                "message": scrub(record.getMessage()), **fields(record)}
        traceback = _traceback(record, self)
        if traceback:
            line["traceback"] = traceback
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """LOG_FORMAT=text: `time level logger [request…] message`, then the traceback's lines."""

    def format(self, record: logging.LogRecord) -> str:
        request = fields(record)
        shown = ""
        if request["request_id"]:
            parts = [request["request_id"], request["method"], request["path"]]
            if request["status"] is not None:
                parts.append(str(request["status"]))
            parts.append(f"{request['duration_ms']:.1f}ms")
            shown = f" [{' '.join(parts)}]"
        text = f"{_time(record)} {record.levelname} {record.name}{shown} {scrub(record.getMessage())}"
        traceback = _traceback(record, self)
        return f"{text}\n{traceback}" if traceback else text
