"""WSGI entry point, for a plain WSGI server in front of the HTTP side only (no websockets, and
waiting claims then hold their worker). The board's own server is taskflow_site.asgi."""
import os

from django.core.wsgi import get_wsgi_application

from server import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

tracing.setup_from_environment("server")  # only with OTEL_EXPORTER_OTLP_ENDPOINT set
application = get_wsgi_application()
