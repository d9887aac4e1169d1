"""Settings of the MongoDB test session (`make test` runs it after the main one:
`pytest --ds=tests.mongodb_settings tests/mongodb`): the default database is a MongoDB replica
set (harness/mongodb_server.py: TEST_MONGO_URL, or a SecantusDB server started for the run), with
a test database of its own per run. When none can be reached, the tests are skipped with a
NOT RUN line (and fail under CI=true): the settings still load, on a URL nothing answers."""
import os
import secrets

from harness import mongodb_server
from harness.board_server import free_port

os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("DEBUG", "0")

MONGODB_URL, MONGODB_SERVER, MONGODB_MISSING = mongodb_server.start()
MONGODB_AVAILABLE = MONGODB_URL is not None
# The test server (SecantusDB) is slow: the session's races run fewer rounds there.
MONGODB_ON_TEST_SERVER = MONGODB_AVAILABLE and mongodb_server.is_secantus(MONGODB_URL)
_server = MONGODB_URL or "mongodb://127.0.0.1:1/?directConnection=true"
# taskflow_site.settings reads DATABASE_URL to pick the MongoDB apps, migrations and key type.
os.environ["DATABASE_URL"] = _server.replace("/?", "/taskflow?", 1)

from tests.settings import *  # noqa: E402,F401,F403
from taskflow_site.settings import DATABASES as _SITE_DATABASES  # noqa: E402

# Only MongoDB: the SQL aliases of the main session would need SQL migrations of models whose
# keys are ObjectIds here.
DATABASES = {"default": {**_SITE_DATABASES["default"], "TEST": {"NAME": f"test_taskflow_{os.getpid()}"}}}
POSTGRES_AVAILABLE = False

# tests/mongodb/test_wire.py: a scripted MongoDB wire server (mockupdb) that a real pymongo client
# talks to, so the tests can read the exact commands the engine sends. Its port is chosen now,
# while the settings load (the alias's URL needs it); the tests start the server on it. Not the
# default alias and not given to any test's `databases`: no test database is created on it.
# A socket timeout bounds any wait for an answer the script never sends (pymongo has none by default).
from board.engine.stores.mongodb.settings import database_from_mongodb_url  # noqa: E402

WIRE_PORT = free_port()
DATABASES["wire"] = database_from_mongodb_url(
    f"mongodb://127.0.0.1:{WIRE_PORT}/wire?directConnection=true&socketTimeoutMS=30000")
