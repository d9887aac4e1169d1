"""WSGI entry point, for a plain WSGI server in front of the HTTP side only (no websockets, and
waiting claims then hold their worker). The board's own server is taskflow_site.asgi."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

application = get_wsgi_application()
