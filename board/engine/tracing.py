"""The engine's spans: one per move a verb is asked to make, when tracing is on.

Off by default, and then free: nothing here imports OpenTelemetry, and a traced verb costs one
test of a module global (`_tracer is None`) before it calls the verb. `server.tracing`
turns it on (only when OTEL_EXPORTER_OTLP_ENDPOINT is set) by handing `enable()` a tracer;
the engine never imports the SDK, the exporter or any instrumentation, only the API's span
calls, and only once enabled.

A span is named after the engine's entry point (`taskflow.claim_next`, `taskflow.complete`,
`taskflow.reclaim`, ...) and runs around the whole call, its retries and its transaction
included, so that the database's spans (opentelemetry-instrumentation-psycopg) are its
children and it is the child of the request's span (opentelemetry-instrumentation-django).
Its attributes (docs/tracing.md):

- `taskflow.verb`: the move's verb as the history writes it (`claim` for claim_next too)
- `taskflow.task.id`: the task's id, when the call names one or the move found one
- `taskflow.queue`: the task's queue, once the task is known
- `taskflow.fence`: the task's fence after the move (or as the refusal found it)
- `taskflow.outcome`: `won` (the move was made), `empty` (claim_next found nothing ready),
  `skipped` (reclaim: renewed or finished meanwhile), `refused` (a BoardError) or `error`
  (anything else: recorded as the span's exception, status ERROR)
- `taskflow.error.code`: a refusal's code (`lease_lost`, `taken`, ...)
- `taskflow.task.count`: create: how many tasks the batch made

Never a lease token, an agent key, a payload or a result: only the fields above are read, and
only from the task row the verb returns or the refusal carries (which hold a token's hash at
most, and that is not read either).
"""
from __future__ import annotations

import functools
from typing import Any

from board.engine import errors

# An opentelemetry Tracer while tracing is on; None (the default) turns every span into a plain call.
_tracer: Any = None
_span_kind_internal: Any = None
_status_error: Any = None

SPAN_PREFIX = "taskflow."


def enable(tracer: Any) -> None:
    """Turn the engine's spans on with `tracer` (an opentelemetry.trace.Tracer)."""
    global _tracer, _span_kind_internal, _status_error
    from opentelemetry.trace import SpanKind, StatusCode

    _span_kind_internal, _status_error = SpanKind.INTERNAL, StatusCode.ERROR
    _tracer = tracer


def disable() -> None:
    global _tracer
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def traced(verb: str, *, names_task: bool = True):
    """Decorator for a public verb: a span around each call while tracing is on. `names_task`:
    the verb's first argument is the task's id (claim_next and create name none)."""

    def wrap(function):
        name = SPAN_PREFIX + function.__name__

        @functools.wraps(function)
        def verb_call(*args, **kwargs):
            if _tracer is None:  # tracing off: this test is the whole cost
                return function(*args, **kwargs)
            task_id = args[0] if names_task and args and isinstance(args[0], str) else None
            with Move(name, verb, task_id) as move:
                result = function(*args, **kwargs)
                move.made(result)
                return result

        return verb_call

    return wrap


def moving(verb: str, task_id: str):
    """A span around one move inside a pass over many tasks (the reaper's reclaim):
    ``with tracing.moving(Verb.RECLAIM, task_id) as move: ... move.made(task)``. Tracing off:
    a shared object whose methods do nothing."""
    if _tracer is None:
        return _OFF
    return Move(SPAN_PREFIX + str(verb), verb, task_id)


class _Off:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def made(self, result: Any) -> None:
        pass


_OFF = _Off()


class Move:
    """One engine span: started current on entry (so the database's spans nest under it),
    given the task and the outcome, ended on exit."""

    def __init__(self, name: str, verb: str, task_id: str | None):
        attributes = {"taskflow.verb": str(verb)}
        if task_id is not None:
            attributes["taskflow.task.id"] = task_id
        self._scope = _tracer.start_as_current_span(
            name, kind=_span_kind_internal, attributes=attributes,
            record_exception=False, set_status_on_exception=False)
        self.span = None
        self.outcome = "skipped"

    def __enter__(self) -> Move:
        self.span = self._scope.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        span = self.span
        if isinstance(exc, errors.BoardError):
            # A refusal is an answer, not a failure of the board: the span's status stays unset.
            self.outcome = "refused"
            span.set_attribute("taskflow.error.code", exc.code)
            _describe_task(span, exc.task)
        elif exc is not None:
            self.outcome = "error"
            span.record_exception(exc)
            span.set_status(_status_error, type(exc).__name__)
        span.set_attribute("taskflow.outcome", self.outcome)
        return self._scope.__exit__(exc_type, exc, tb)

    def made(self, result: Any) -> None:
        """What the verb returned: a Claim, a Task, the list `create` made, or None (claim_next
        found nothing ready)."""
        if result is None:
            self.outcome = "empty"
            return
        self.outcome = "won"
        if isinstance(result, list):
            self.span.set_attribute("taskflow.task.count", len(result))
            if len(result) != 1:
                return
            result = result[0]
        _describe_task(self.span, getattr(result, "task", result))


def _describe_task(span: Any, task: Any) -> None:
    """The task's id, queue and fence on the span (a Task row; anything else is left out)."""
    task_id = getattr(task, "pk", None)
    if not isinstance(task_id, str):
        return
    span.set_attribute("taskflow.task.id", task_id)
    span.set_attribute("taskflow.queue", task.queue)
    span.set_attribute("taskflow.fence", task.fence)
