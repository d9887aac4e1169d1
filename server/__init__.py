"""The board's server: what each process that serves runs around Django (HTTP through Django's
WSGI handler in a thread pool, parked claims, the websocket's origin check, the connection caps,
the log, tracing, the metrics directory). Above the board app's delivery layers, below its
management commands (`serve`, `reap`) and the project package (taskflow_site: settings, URLs,
the ASGI/WSGI entry points). tests/test_layers.py holds the order."""
