"""Secrets never reach a log line or an error page: agent keys, lease tokens, passwords.

One place scrubs them, for every way text leaves the server:

- `configure_logging` (settings.LOGGING_CONFIG) installs a log record factory, so that every
  record of every logger (Django's, django-ninja's, uvicorn's access log, ours) is scrubbed
  when it is made, whichever handler later writes it. Arguments are scrubbed one by one (the
  access log's formatter reads them by position) and a traceback is formatted and scrubbed.
- `SecretsReporterFilter` (settings.DEFAULT_EXCEPTION_REPORTER_FILTER) hides, on Django's
  DEBUG error page and in its error reports, every frame variable, POST field and header whose
  name says it is secret, and scrubs the rest; `SecretsReporter`
  (settings.DEFAULT_EXCEPTION_REPORTER) scrubs the finished page once more (the query string,
  GET parameters and the URL are shown by the page itself, not by the filter).

What "secret" means here: an agent key (`tfk_…`, recognisable anywhere); the value of an
Authorization header or a Bearer credential; a value named like token, key, password or secret
(a query parameter, a form field, a JSON or keyword field); and, on an error page, the very
strings the failing request carried in those places (a lease token looks like any other text).
"""
from __future__ import annotations

import json
import logging
import logging.config
import re

from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

REDACTED = "********"
# Names whose values are secret (Django's own list of hidden settings, plus the lease "token").
SECRET_NAME = re.compile(r"API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|COOKIE|CSRF", re.IGNORECASE)
_NAME = r"[\w-]*(?:token|key|pass(?:word)?|secret|auth(?:orization)?|signature)[\w-]*"

_PATTERNS = (
    # An agent key, wherever it is (board.agent_keys.KEY_PREFIX).
    (re.compile(r"tfk_[A-Za-z0-9_\-]+"), "tfk_" + REDACTED),
    # A credential after its scheme: "Bearer abc", "Token abc", "Basic abc".
    (re.compile(r"\b((?i:bearer)|Token|Basic)(\s+)[^\s\"',;&<>]+"), r"\1\2" + REDACTED),
    # name=value in a query string, a form body or a repr: ?token=abc, token='abc', token: "abc".
    (re.compile(rf"(?i)\b({_NAME})(=)(?!['\"])[^&\s\"',;<>)]+"), r"\1\2" + REDACTED),
    (re.compile(rf"(?i)\b({_NAME})(['\"]?\s*[:=]\s*)(['\"])(.*?)(\3)"), r"\1\2\3" + REDACTED + r"\5"),
    # The same once HTML-escaped (Django's error page): token=&#x27;abc&#x27;.
    (re.compile(rf"(?i)\b({_NAME})((?:&#x27;|&quot;)?\s*[:=]\s*)(&#x27;|&quot;)(.*?)(\3)"),
     r"\1\2\3" + REDACTED + r"\5"),
)


def scrub(text: str, known: tuple[str, ...] = ()) -> str:
    """`text` with every secret replaced by ********; `known` are literal secrets to remove too."""
    for secret in known:
        if secret:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _scrub_value(value):
    return scrub(value) if isinstance(value, str) else value


# ---------------------------------------------------------------------------------------------
# Logs


def _scrubbing_factory(make_record):
    def make(*args, **kwargs):
        record = make_record(*args, **kwargs)
        if isinstance(record.msg, str):
            record.msg = scrub(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_scrub_value(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {name: _scrub_value(arg) for name, arg in record.args.items()}
        if record.exc_info and not record.exc_text:
            # Formatters use exc_text when it is set: the traceback is written only scrubbed.
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return record

    make.scrubs_secrets = True
    return make


def install_record_factory() -> None:
    """Scrub every log record of this process from now on (idempotent)."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "scrubs_secrets", False):
        logging.setLogRecordFactory(_scrubbing_factory(current))


def configure_logging(config: dict) -> None:
    """settings.LOGGING_CONFIG: Django's dictConfig, with every record scrubbed."""
    install_record_factory()
    logging.config.dictConfig(config)


# ---------------------------------------------------------------------------------------------
# Django's error page and error reports


def request_secrets(request) -> tuple[str, ...]:
    """The secret strings this request carried: its Authorization header (and the credential in
    it), and secret-named query parameters, form fields and JSON fields, longest first."""
    if request is None:
        return ()
    found: set[str] = set()
    authorization = request.META.get("HTTP_AUTHORIZATION", "")
    if authorization:
        found.add(authorization)
        found.update(part for part in authorization.split() if len(part) >= 8)
    # `_post` only when the form was already parsed (never parse it here); a QueryDict either way.
    for params in (request.GET, getattr(request, "_post", None)):
        if not hasattr(params, "lists"):
            continue
        for name, values in params.lists():
            if SECRET_NAME.search(name):
                found.update(v for v in values if v)
    body = getattr(request, "_body", None)  # only a body already read: never read it here
    if body and request.META.get("CONTENT_TYPE", "").startswith("application/json"):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict):
            found.update(v for k, v in data.items() if isinstance(v, str) and v and SECRET_NAME.search(k))
    return tuple(sorted(found, key=len, reverse=True))


class _Shown:
    """A frame variable as the error page shows it: its repr, scrubbed."""

    def __init__(self, value, known: tuple[str, ...]):
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not break the error page
            text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
        self.text = scrub(text, known)

    def __repr__(self) -> str:
        return self.text


class SecretsReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = SECRET_NAME

    def is_active(self, request):
        return True  # in DEBUG too: that is when the page is shown to whoever made the request

    def get_post_parameters(self, request):
        params = super().get_post_parameters(request)
        if request is None:
            return params
        params = params.copy()
        for name in list(params):
            if SECRET_NAME.search(name):
                params[name] = self.cleansed_substitute
        return params

    def get_traceback_frame_variables(self, request, tb_frame):
        known = request_secrets(request)
        shown = []
        for name, value in super().get_traceback_frame_variables(request, tb_frame):
            if (isinstance(value, str) and value == self.cleansed_substitute) or SECRET_NAME.search(name):
                shown.append((name, self.cleansed_substitute))
            else:
                shown.append((name, _Shown(value, known)))
        return shown


class SecretsReporter(ExceptionReporter):
    """Django's error page and report text, scrubbed once more as a whole."""

    def get_traceback_html(self):
        return scrub(super().get_traceback_html(), request_secrets(self.request))

    def get_traceback_text(self):
        return scrub(super().get_traceback_text(), request_secrets(self.request))
