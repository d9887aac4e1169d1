"""TaskFlow board settings, read from the environment.

Variables (all optional in development):

- ``DEBUG``          "1"/"true" for development. Off by default: production is the safe default.
                     In a checkout `make run` has marked (``.taskflow-dev``) it defaults to on.
- ``SECRET_KEY``     required when DEBUG is off. In development, when unset, a key is generated
                     once into ``.secret_key`` (git-ignored) so sessions survive restarts.
- ``ALLOWED_HOSTS``  comma-separated; defaults to localhost names in development.
- ``CSRF_TRUSTED_ORIGINS`` comma-separated origins trusted beside a request's own (CSRF, and
                     the board socket's Origin check).
- ``DATABASE_URL``   e.g. ``postgres://user@host:5432/taskflow``, or
                     ``mongodb://host:27017/taskflow?replicaSet=rs0`` (a replica set:
                     board/engine/stores/mongodb/settings.py); default is the embedded SQLite file ``db.sqlite3``
                     in the project folder (WAL, BEGIN IMMEDIATE, busy timeout, synchronous=FULL;
                     ``SQLITE_SYNCHRONOUS=normal`` trades power-cut durability for speed).
- ``SECURE_PROXY_SSL_HEADER`` set to "1" when a TLS-terminating proxy sets X-Forwarded-Proto.
"""
import importlib.util
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name, "")
    items = [item.strip() for item in value.split(",") if item.strip()]
    return items or default


# `make run` marks its checkout as a development one (this git-ignored file): there DEBUG
# defaults to on, so that the README's `.venv/bin/python manage.py ...` commands work as
# written, on the same settings as the server `make run` started. Anywhere else (a production
# host never runs `make run`) DEBUG defaults to off; DEBUG=0 always wins.
DEV_MARKER = BASE_DIR / ".taskflow-dev"
DEBUG = env_flag("DEBUG", DEV_MARKER.exists())


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY", "")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set it in the environment (production), "
            "or set DEBUG=1 to use a generated development key."
        )
    # Development only: generate once into an ignored file, never a committed default.
    key_file = BASE_DIR / ".secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
# Origins (scheme://host[:port]) other than a request's own that Django's CSRF check and the board
# socket's Origin check accept (server/ws_origin.py): e.g. the public https origin, when
# the TLS proxy in front says the scheme to neither. Comma-separated; none by default.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Not Channels nor django-ninja: an installed app is imported by every process as Django
    # starts, and a process that only moves rows (the reaper, contract_check) must not load
    # Channels, django-ninja or pydantic (tests/test_layers.py). Neither needs to be one: the
    # websocket is routed in asgi.py, and the API docs page's files are added below
    # (NINJA_FILES).
    "board",
]

# django-ninja's templates and static files, for the API docs page (board/api/docs.py), found
# without importing it.
NINJA_FILES = Path(importlib.util.find_spec("ninja").origin).parent

MIDDLEWARE = [
    # The response names its request's id (X-Request-ID; server/server_log.py).
    "server.server_log.request_id_header",
    # Outermost but one: the API's latency histogram times everything below it (board/metrics.py).
    "board.metrics.api_latency",
    # First: it also reshapes what the others answer under /api/ (a disallowed Host's 400).
    "board.api.middleware.api_error_shape",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Django's MessageMiddleware, skipped under /api/ (whose answers never carry a message).
    "board.api.middleware.MessagesOutsideApi",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "taskflow_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_FILES / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "taskflow_site.asgi.application"
WSGI_APPLICATION = "taskflow_site.wsgi.application"


# SQLITE_SYNCHRONOUS: "full" (default) syncs the WAL at every commit, so a commit the API has
# acknowledged survives a power cut; "normal" syncs only at checkpoints (faster commits; a power
# cut, not a crash of the process, may lose the commits since the last checkpoint: up to
# board.engine.checkpoints.CHECKPOINT_AFTER seconds of them). README "Deploying" has the cost.
SQLITE_SYNCHRONOUS_CHOICES = {"full": "FULL", "normal": "NORMAL"}


def sqlite_synchronous() -> str:
    chosen = os.environ.get("SQLITE_SYNCHRONOUS", "").strip().lower() or "full"
    if chosen not in SQLITE_SYNCHRONOUS_CHOICES:
        raise ImproperlyConfigured(f"SQLITE_SYNCHRONOUS must be full or normal, not {chosen!r}")
    return SQLITE_SYNCHRONOUS_CHOICES[chosen]


def sqlite_options() -> dict:
    """SQLite as a concurrent store: WAL so readers never block the writer, BEGIN IMMEDIATE so
    a transaction takes the write lock up front (no upgrade deadlock between two readers that
    both want to write), a busy timeout so writers queue instead of failing, and
    synchronous=FULL unless SQLITE_SYNCHRONOUS says normal (above), temporary files (a statement
    journal) in memory: on disk, SQLite made, wrote and unlinked one in /var/tmp for many of the
    hot transactions (strace of a server under eight agents). SQLite's
    automatic WAL checkpoint (inside a commit, under the writers' locks) only as a backstop, at
    WAL_BACKSTOP_PAGES: each process runs checkpoints from a thread of its own
    (board.engine.checkpoints, a module without Django imports)."""
    from board.engine.checkpoints import WAL_BACKSTOP_PAGES

    return {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={sqlite_synchronous()}; PRAGMA foreign_keys=ON; "
                        f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}; PRAGMA temp_store=MEMORY;",
    }


def postgres_options() -> dict:
    """A connection pool per process. A server process holds at most TASKFLOW_HTTP_THREADS + 4
    connections at once (its request threads, plus asgiref's thread of the live board's tailer,
    the waiting claims' poll and the websockets' session lookups, the snapshot builder, the
    /healthz checker and one spare: serve.BACKGROUND_CONNECTIONS); a waiting claim holds none
    while it waits, so no request ever waits for a connection (`manage.py serve` refuses a pool
    smaller than that). The default also covers `contract_check`'s 16 racing threads; the pool
    opens connections only as they are needed. DATABASE_POOL=0 turns it off (e.g. behind
    PgBouncer)."""
    # PostgreSQL's JIT off for the board's sessions (a startup parameter: no cost per request).
    # The claim statement's estimated cost passes jit_above_cost on a board of ~100,000 tasks, and
    # a claim then compiled for ~3 s to run for ~5 ms (measured: docs/stores.md, "JIT"); no query
    # of the board gains from it. DATABASE_PG_JIT=1 leaves the server's setting alone (e.g. behind
    # a PgBouncer that refuses startup parameters: then set jit = off on the role or database).
    jit = {} if env_flag("DATABASE_PG_JIT", False) else {"options": "-c jit=off"}
    if not env_flag("DATABASE_POOL", True):
        return jit
    size = int(os.environ.get("DATABASE_POOL_MAX", "20"))
    # A request waits at most 5 s for a connection, then fails (e.g. while the database is down).
    return {**jit, "pool": {"min_size": 1, "max_size": size, "timeout": 5}}


def database_from_url(url: str) -> dict:
    if url.startswith(("mongodb://", "mongodb+srv://")):  # dj-database-url does not parse these
        from board.engine.stores.mongodb.settings import database_from_mongodb_url

        return database_from_mongodb_url(url)
    config = dj_database_url.parse(url, conn_max_age=0)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {**sqlite_options(), **config.get("OPTIONS", {})}
        # The server's threads live as long as the process: each keeps its SQLite connection
        # (opening one, with its PRAGMAs, costs more than a claim).
        config["CONN_MAX_AGE"] = None
    elif config["ENGINE"] == "django.db.backends.postgresql":
        config["OPTIONS"] = {**postgres_options(), **config.get("OPTIONS", {})}
        # A pooled connection the server dropped (restart, pg_terminate_backend, idle timeout)
        # is noticed when it is handed out and replaced, instead of failing the next requests
        # (with a pool this is psycopg_pool's check, which the board makes cheaper:
        # board/engine/stores/pg_pool.py). The server then checks all the idle ones at once
        # (server/serving.py).
        config["CONN_HEALTH_CHECKS"] = True
    return config


DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    )
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Threads per server process that run Django requests (server/serving.py). More than a
# few buys nothing on CPU-bound requests (the GIL) and costs database connections. PostgreSQL
# and MongoDB requests wait on the network and the log flush: four threads overlap those waits.
# SQLite has one writer at a time, and its writes take no network wait: a second request thread
# in a process only competes for the GIL with the thread that holds the write lock, which then
# holds it longer while the others queue behind it. So one thread per process on SQLite (the
# README, "Serving", has the figures). The price: a slow request (a large admin page), or a write
# waiting for another process's (a prune batch), holds its process's other requests until it
# ends; raise it for a board that serves such pages to many.
def http_threads(engine: str) -> int:
    """TASKFLOW_HTTP_THREADS, or the default for a server on a database of this ENGINE."""
    return int(os.environ.get("TASKFLOW_HTTP_THREADS") or (1 if engine == "django.db.backends.sqlite3" else 4))


HTTP_THREADS = http_threads(DATABASES["default"]["ENGINE"])


# On MongoDB, rows are keyed by ObjectIds, and the contrib apps and the board have migrations of
# their own (board/engine/stores/mongodb/settings.py); the SQL migrations stay as they are.
from board.engine.stores.mongodb import settings as mongodb  # noqa: E402  (builds settings only)

if DATABASES["default"]["ENGINE"] == mongodb.ENGINE:
    INSTALLED_APPS = mongodb.installed_apps(INSTALLED_APPS)
    DEFAULT_AUTO_FIELD = mongodb.DEFAULT_AUTO_FIELD
    MIGRATION_MODULES = mongodb.MIGRATION_MODULES
    # The dependency table's CHECK (no self-dependency) is not enforced by MongoDB; the engine
    # refuses self-dependencies before writing, and check() reports one found in the store.
    SILENCED_SYSTEM_CHECKS = ["models.W027"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_FILES / "static"]
STATIC_ROOT = BASE_DIR / ".staticfiles"

# The agents' API refuses bodies over 1 MiB (413 too_large).
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# Channel layer: in-memory on one process; Redis when REDIS_URL is set (several processes). The
# live board does not depend on it delivering every message (see board/live/doorbell.py).
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                  "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                  "CONFIG": {"capacity": 1000, "expiry": 30}}}

LOGIN_URL = "/admin/login/"

# TaskFlow engine knobs.
TASKFLOW = {
    # Retry backoff after a retryable failure: base * 2**(attempt-1), capped.
    "RETRY_BACKOFF_BASE_SECONDS": float(os.environ.get("TASKFLOW_RETRY_BACKOFF_BASE", "2")),
    "RETRY_BACKOFF_MAX_SECONDS": float(os.environ.get("TASKFLOW_RETRY_BACKOFF_MAX", "300")),
    # How often the reaper started by `make run` looks for expired leases.
    "REAP_INTERVAL_SECONDS": float(os.environ.get("TASKFLOW_REAP_INTERVAL", "1")),
    # /healthz fails when no reaper has finished a pass for this long (board/health.py).
    "REAPER_STALE_SECONDS": float(os.environ.get("TASKFLOW_REAPER_STALE_SECONDS", "30")),
    "HTTP_THREADS": HTTP_THREADS,
    # claim_next, renew and complete as hand-written statements on SQLite and PostgreSQL
    # (board/engine/stores/statements.py): "auto"; "orm" forces the ORM path everywhere (the contract suite runs
    # both).
    "HOT_PATH": os.environ.get("TASKFLOW_HOT_PATH", "auto"),
    # Waiting claims (wait_seconds) parked at once per server process; past it a new wait is
    # refused with 503 + Retry-After. A parked claim costs a few KB and no connection.
    "MAX_WAITERS": int(os.environ.get("TASKFLOW_MAX_WAITERS", "1000")),
    # ... and per agent (key name) per process, so that one agent cannot take every slot.
    "MAX_WAITERS_PER_KEY": int(os.environ.get("TASKFLOW_MAX_WAITERS_PER_KEY", "32")),
    # Under a plain WSGI server (taskflow_site/wsgi.py) a waiting claim holds a worker thread for
    # its whole wait: at most this many at once per process.
    "WSGI_MAX_WAITERS": int(os.environ.get("TASKFLOW_WSGI_MAX_WAITERS", "2")),
    # The claim endpoints' bodies: a few small fields (a waiting claim is kept while it waits).
    "MAX_CLAIM_BODY_BYTES": int(os.environ.get("TASKFLOW_MAX_CLAIM_BODY", "4096")),
    # The server's connections (server/http_protocol.py, README "Limits" and "Deploying"): a
    # request head (request line + headers) of at most MAX_HEAD_BYTES and MAX_HEAD_FIELDS fields
    # (else 431), arriving within HEADER_TIMEOUT_SECONDS of its first byte; a body never silent
    # for BODY_TIMEOUT_SECONDS (else 408); an idle connection closed after KEEPALIVE_TIMEOUT_SECONDS.
    "MAX_HEAD_BYTES": int(os.environ.get("TASKFLOW_MAX_HEAD_BYTES", str(64 * 1024))),
    "MAX_HEAD_FIELDS": int(os.environ.get("TASKFLOW_MAX_HEAD_FIELDS", "100")),
    "HEADER_TIMEOUT_SECONDS": float(os.environ.get("TASKFLOW_HEADER_TIMEOUT", "10")),
    "BODY_TIMEOUT_SECONDS": float(os.environ.get("TASKFLOW_BODY_TIMEOUT", "10")),
    "KEEPALIVE_TIMEOUT_SECONDS": float(os.environ.get("TASKFLOW_KEEPALIVE_TIMEOUT", "5")),
    # The live board's socket (board/live/consumers.py): how often an open socket checks that its
    # session and user may still watch, and how far (characters of frames not yet sent) a client
    # may fall behind before its socket is dropped (it reconnects and resyncs from a snapshot).
    # 5 s: a logout handled by another server process (its signal reaches only its own sockets)
    # ends the open boards within a few seconds; the cost is one session read per socket.
    "SOCKET_RECHECK_SECONDS": float(os.environ.get("TASKFLOW_SOCKET_RECHECK", "5")),
    "SOCKET_MAX_UNSENT_BYTES": int(os.environ.get("TASKFLOW_SOCKET_MAX_UNSENT", str(8 * 1024 * 1024))),
    "SOCKET_SEND_TIMEOUT_SECONDS": float(os.environ.get("TASKFLOW_SOCKET_SEND_TIMEOUT", "30")),
    # The board page keeps the newest state of each changed task it does not show (below a
    # column's loaded window). Past this many it takes a fresh snapshot, which starts it over:
    # a tab left open on a busy board of a million tasks does not grow without end.
    "BOARD_OFF_WINDOW_MAX": int(os.environ.get("TASKFLOW_BOARD_OFF_WINDOW_MAX", "10000")),
    # The Prometheus scraper's bearer token for /metrics (board/metrics.py); empty: only an
    # operator key or a staff session may scrape.
    "METRICS_TOKEN": os.environ.get("TASKFLOW_METRICS_TOKEN", ""),
    # History retention (board/engine/retention.py, README "History retention"): the reaper started
    # by `manage.py serve` prunes every PRUNE_INTERVAL_SECONDS (0: never; `manage.py prune` still
    # works), collapsing renews older than PRUNE_RENEWS_AFTER_SECONDS and deleting terminal tasks
    # untouched for PRUNE_TERMINAL_AFTER_SECONDS. On by default: renew writes a row per heartbeat, so
    # an unpruned board grows without bound; an hour keeps each run small.
    "PRUNE_INTERVAL_SECONDS": float(os.environ.get("TASKFLOW_PRUNE_INTERVAL", "3600")),
    "PRUNE_RENEWS_AFTER_SECONDS": float(os.environ.get("TASKFLOW_PRUNE_RENEWS_AFTER", str(24 * 3600))),
    "PRUNE_TERMINAL_AFTER_SECONDS": float(os.environ.get("TASKFLOW_PRUNE_TERMINAL_AFTER", str(30 * 86400))),
}

# Webhooks (board/webhooks/ssrf.py, docs/webhooks.md): hosts a delivery may reach although they
# resolve to a loopback, private, link-local or metadata address (a comma list of host names or IP
# addresses, e.g. "localhost,hooks.internal"). Empty: only public addresses.
TASKFLOW_WEBHOOK_ALLOWED_HOSTS = [h.strip() for h in os.environ.get("TASKFLOW_WEBHOOK_ALLOWED_HOSTS", "").split(",")
                                  if h.strip()]

# Production hardening: on whenever DEBUG is off (what `manage.py check --deploy` asks for).
if not DEBUG:
    SECURE_SSL_REDIRECT = env_flag("SECURE_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # a load balancer probes the backends over plain HTTP
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_flag("SECURE_HSTS_PRELOAD", True)
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"
    if env_flag("SECURE_PROXY_SSL_HEADER"):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# The server's log (server/server_log.py, README "Deploying"): every line to stderr, DEBUG
# on or off, so that a 500's traceback reaches the output of `manage.py serve` in production
# (Django's default writes it only to a DEBUG console, or mails ADMINS). No log line and no error
# page ever holds an agent key, a lease token or a password (server/redaction.py): every
# log record is scrubbed when it is made, whichever logger and handler (uvicorn's access log
# too), and Django's DEBUG page and error reports hide them.
LOGGING_CONFIG = "server.server_log.configure_logging"
DEFAULT_EXCEPTION_REPORTER_FILTER = "server.redaction.SecretsReporterFilter"
DEFAULT_EXCEPTION_REPORTER = "server.redaction.SecretsReporter"

# LOG_FORMAT: "text" (a line per record, the traceback after it) or "json" (one object per line,
# with the request's id, method, path, status and duration: for log shippers).
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text").strip().lower() or "text"
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be text or json, not {LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"text": {"()": "server.server_log.TextFormatter"},
                   "json": {"()": "server.server_log.JsonFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                            "formatter": LOG_FORMAT}},
    # Every library's warnings and errors (psycopg's pool, Channels, redis) in the same format.
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        "board": {"level": os.environ.get("LOG_LEVEL", "INFO")},
        # Replaces Django's own handlers (a console only when DEBUG, mail to ADMINS): a 5xx and
        # its traceback (django.request, ERROR) reach stderr through the root's handler. ERROR
        # and up only, DEBUG on or off: an ordinary 4xx (WARNING) is the client's business, a
        # scan must not flood the log, and under `make run` the banner (with the first run's
        # password) must not scroll away; a Host that ALLOWED_HOSTS refuses is still logged
        # (django.security.DisallowedHost, ERROR): it is how a wrong ALLOWED_HOSTS shows.
        "django": {"handlers": [], "level": "ERROR"},
        # uvicorn's lines (its errors; the access log, TASKFLOW_ACCESS_LOG=1) in JSON too.
        **({"uvicorn": {"handlers": ["stderr"], "propagate": False},
            "uvicorn.access": {"handlers": ["stderr"], "propagate": False}} if LOG_FORMAT == "json" else {}),
    },
}
