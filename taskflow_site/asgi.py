"""ASGI entry point: the board's own server (`manage.py serve` runs it under uvicorn, one worker
process per core); the application is built by server/application.py."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")

from server.application import build  # noqa: E402

application = build()
