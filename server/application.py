"""The ASGI application every server process runs (uvicorn, started by `manage.py serve`):
HTTP goes through Django's WSGI handler in a bounded thread pool (server/serving.py: 5-6 times
cheaper per request than Django's ASGI handler), /ws/board/ to the live board's socket
(Channels; session login required; the Origin must be the page's own scheme, host and port, or
one listed in CSRF_TRUSTED_ORIGINS: server/ws_origin.py). taskflow_site/asgi.py builds it."""
from server import tracing
from server.serving import http_app


def build():
    """The application, once Django's settings module is named (its first call sets Django up)."""
    # Traces when OTEL_EXPORTER_OTLP_ENDPOINT is set (server/tracing.py): in this worker
    # process, before Django builds its middleware; otherwise nothing is imported.
    tracing.setup_from_environment("server")
    http = http_app()

    # Imported after Django is set up.
    from channels.routing import ProtocolTypeRouter, URLRouter
    from channels.sessions import CookieMiddleware
    from django.urls import path

    from board.live.consumers import BoardConsumer
    from server.ws_origin import SameOriginOnly

    # Cookies only: the socket reads its session itself (board.live.consumers.session_verdict).
    websocket_app = SameOriginOnly(CookieMiddleware(URLRouter([path("ws/board/", BoardConsumer.as_asgi())])))
    return ProtocolTypeRouter({"http": http, "websocket": websocket_app})
