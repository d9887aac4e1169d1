"""The board's HTTP stack in one process with OpenTelemetry's in-memory exporter, for the test
of the span tree (tests/test_tracing.py): the spans stay in this process, where the test asks
for them, instead of leaving through OTLP.

    DATABASE_URL=... SECRET_KEY=... python -m harness.traced_board

It sets tracing up as a server worker does (server.tracing.setup, with a processor that
hands each ended span to an InMemorySpanExporter), loads the server's own ASGI application
(server/application.py: HTTP through Django's WSGI handler in serving.py's thread pool), serves it
with uvicorn on a free port of 127.0.0.1, and prints ``ready <port>``. Each line then read from
stdin is a command: ``spans`` prints the finished spans as one JSON line (name, kind, trace and
span ids in hex, the parent's span id, attributes) and ``stop`` ends the process.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time


def span_record(span) -> dict:
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "parent_is_remote": bool(span.parent is not None and span.parent.is_remote),
        "status": span.status.status_code.name,
        "attributes": {key: value if isinstance(value, (str, int, float, bool)) else str(value)
                       for key, value in (span.attributes or {}).items()},
    }


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # the exporter is this process's memory
    import uvicorn
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from server import tracing

    exporter = InMemorySpanExporter()
    tracing.setup(SimpleSpanProcessor(exporter), set_global=False)
    from taskflow_site.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(application, lifespan="off", log_level="warning", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # bounded: uvicorn sets the flag once it listens
        if not thread.is_alive() or time.monotonic() > deadline:
            print("not started", flush=True)
            return 1
        time.sleep(0.02)
    print(f"ready {sock.getsockname()[1]}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "spans":
            print(json.dumps([span_record(span) for span in exporter.get_finished_spans()]), flush=True)
        elif command == "stop":
            break
    server.should_exit = True
    thread.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
