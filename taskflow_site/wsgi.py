"""WSGI entry point, for a plain WSGI server in front of the HTTP side only (no websockets, and
waiting claims then hold their worker). The board's own server is taskflow_site.asgi."""
import os

from server import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

tracing.setup_from_environment("server")  # only with OTEL_EXPORTER_OTLP_ENDPOINT set
# Django's handler, an agent's hot requests through server/hot_requests.py (as the board's server).
from server.serving import wsgi_application  # noqa: E402  (after the settings module is named)

application = wsgi_application()
