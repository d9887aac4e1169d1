"""OpenTelemetry traces of the board's processes: on only when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Off (the default) it costs nothing: `setup_from_environment()` reads one variable and returns,
so no OpenTelemetry module is imported and no middleware is added (tests/test_tracing.py runs
a request through the server's application and checks `sys.modules`).

On, every process that serves (server/application.py, in each uvicorn worker after it started;
taskflow_site/wsgi.py) or reaps (`manage.py reap`) calls it once, before Django builds its
middleware, and gets:

- a TracerProvider whose spans are batched to the OTLP/HTTP exporter (protobuf, POSTed to
  `$OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces`; the SDK's other `OTEL_*` variables apply:
  OTEL_SERVICE_NAME, default "taskflow-board", OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_*,
  OTEL_TRACES_SAMPLER...);
- opentelemetry-instrumentation-django: one server span per request, the child of the
  request's `traceparent` header when it has one (the Python client and the MCP server send
  one), so an agent's trace goes on into the board's;
- opentelemetry-instrumentation-psycopg: one span per PostgreSQL statement (the statement's
  text, never its parameters: a token's hash, a payload);
- the engine's spans, one per move (board/engine/tracing.py), between the two.

docs/tracing.md lists the spans and their attributes.
"""
from __future__ import annotations

import os
from typing import Any

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
DEFAULT_SERVICE_NAME = "taskflow-board"
# Probes and scrapes would make a trace every few seconds each. Regular expressions searched in
# the request's URL (without its query): anchored, so that a task id holding these words is kept.
DEFAULT_EXCLUDED_URLS = "/healthz$,/metrics$"


def configured() -> bool:
    return bool(os.environ.get(ENDPOINT_ENV, "").strip())


def setup_from_environment(process: str) -> bool:
    """Turn tracing on in this process when OTEL_EXPORTER_OTLP_ENDPOINT is set (`process`:
    "server" or "reaper", a resource attribute); returns whether it did. Call it once per
    process, after Django's settings are configured and before its WSGI handler is built."""
    global _provider
    if not configured():
        return False
    if _provider is None:  # once per process (a command run twice in one process)
        _provider = setup(process=process)
    return True


_provider: Any = None


def setup(span_processor: Any = None, *, process: str = "server", set_global: bool = True) -> Any:
    """Build the tracer provider (spans to `span_processor`; default: batched to the OTLP/HTTP
    exporter), instrument Django and psycopg with it, and turn the engine's spans on. Returns
    the provider. harness/traced_board.py passes its own processor (an in-memory exporter's)
    and `set_global=False`."""
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from board.engine import tracing as engine_tracing

    resource = Resource.create({"taskflow.process": process})
    # Unnamed by OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES, the SDK says "unknown_service...".
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource, sampler=_no_lone_statements())
    if span_processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        span_processor = BatchSpanProcessor(OTLPSpanExporter())
    provider.add_span_processor(span_processor)
    if set_global:
        trace.set_tracer_provider(provider)
    excluded = os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", DEFAULT_EXCLUDED_URLS)
    DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls=excluded,
                                    middleware_position=_request_span_position())
    if _uses_postgresql():
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(tracer_provider=provider)
    engine_tracing.enable(provider.get_tracer("board.engine"))
    return provider


def _request_span_position() -> int:
    """Where the request's span starts in MIDDLEWARE: just inside the API's error shape. The
    instrumentation reads the request's host as it starts (Django's get_host): a disallowed
    Host raises there, and only the middlewares outside it would answer Django's HTML 400
    instead of the API's JSON one."""
    from django.conf import settings

    return settings.MIDDLEWARE.index(API_ERROR_SHAPE) + 1


API_ERROR_SHAPE = "board.api.middleware.api_error_shape"


def _no_lone_statements() -> Any:
    """The sampler the SDK reads from OTEL_TRACES_SAMPLER (default: the parent's decision, else
    record), except that a database statement outside any request or move starts no trace of
    its own: the live board's outbox polls (several a second per process), the reaper's scan
    for expired leases every second, a pooled connection's set-up. Each would be a trace of
    one span, of no use and in great number."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult, _get_from_env_or_default
    from opentelemetry.trace import SpanKind, get_current_span

    class NoLoneStatements(Sampler):
        def __init__(self, base: Sampler):
            self.base = base

        def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                          trace_state=None):
            if kind == SpanKind.CLIENT and not get_current_span(parent_context).get_span_context().is_valid:
                return SamplingResult(Decision.DROP)
            return self.base.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return f"NoLoneStatements{{{self.base.get_description()}}}"

    return NoLoneStatements(_get_from_env_or_default())


def _uses_postgresql() -> bool:
    from board.engine.stores import drivers

    return "psycopg" in drivers()
