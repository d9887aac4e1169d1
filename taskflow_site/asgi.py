"""ASGI entry point served by daphne: HTTP to Django, /ws/board/ to the live board's socket
(session login required, Origin checked against ALLOWED_HOSTS)."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

django_asgi_app = get_asgi_application()

# Imported after Django is set up.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import path  # noqa: E402

from board.consumers import BoardConsumer  # noqa: E402

# daphne serves no static files itself: in development Django's handler serves them from the
# apps; in production put them behind the proxy (`manage.py collectstatic`, STATIC_ROOT).
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

websocket_app = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter([path("ws/board/", BoardConsumer.as_asgi())]))
)

application = ProtocolTypeRouter({"http": http_app, "websocket": websocket_app})
