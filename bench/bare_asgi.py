"""The bare view (bench/bare_urls.py) through Django's own ASGI handler, for daphne
(``daphne bench.bare_asgi:application``). Not the project's asgi.py: that one hands HTTP to
Django's WSGI handler (server/serving.py); this is the stock ASGI path for comparison."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.bare_settings")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()
