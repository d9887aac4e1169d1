"""ASGI entry point served by daphne. HTTP goes to Django; websocket routing arrives with the
live board."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up first)
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

# daphne serves no static files itself: in development Django's handler serves them from the
# apps; in production put them behind the proxy (`manage.py collectstatic`, STATIC_ROOT).
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

application = ProtocolTypeRouter({"http": http_app})
