"""The project's settings serving only the bare view of bench/bare_urls.py: the baseline of
bench/http_claims.py (same apps, same middleware stack, same DEBUG/security settings from the
environment; only the URLs differ). Used as DJANGO_SETTINGS_MODULE=bench.bare_settings by the
servers the benchmark starts (``manage.py serve`` and daphne on bench.bare_asgi)."""
from taskflow_site.settings import *  # noqa: F401,F403

ROOT_URLCONF = "bench.bare_urls"
