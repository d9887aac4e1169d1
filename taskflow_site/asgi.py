"""The ASGI application every server process runs (uvicorn, started by `manage.py serve`):
HTTP goes through Django's WSGI handler in a bounded thread pool (taskflow_site/serving.py: 5-6
times cheaper per request than Django's ASGI handler), /ws/board/ to the live board's socket
(Channels; session login required; the Origin must be the page's own scheme, host and port, or
one listed in CSRF_TRUSTED_ORIGINS: taskflow_site/ws_origin.py)."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

from taskflow_site import tracing  # noqa: E402
from taskflow_site.serving import http_app  # noqa: E402  (sets Django up)

# Traces when OTEL_EXPORTER_OTLP_ENDPOINT is set (taskflow_site/tracing.py): in this worker
# process, before Django builds its middleware; otherwise nothing is imported.
tracing.setup_from_environment("server")
http = http_app()

# Imported after Django is set up.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from board.live.consumers import BoardConsumer  # noqa: E402
from taskflow_site.ws_origin import SameOriginOnly  # noqa: E402

websocket_app = SameOriginOnly(
    AuthMiddlewareStack(URLRouter([path("ws/board/", BoardConsumer.as_asgi())]))
)

application = ProtocolTypeRouter({"http": http, "websocket": websocket_app})
