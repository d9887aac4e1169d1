"""The tests' fixtures around the board's real server (harness.board_server.BoardServer, shared
with the benchmarks): `board_server` gives one per test module on the test database; tests
that use it must commit their rows (``sqlite_db_mark()``: transaction=True) so that the server
process sees them. `one_process_server` is the same with one worker process, and
`server_for_sessions` a server that signs sessions with the test run's SECRET_KEY.

The helpers themselves (BoardServer, free_port, wait_until, api_call, server_env, manage,
stop_process, LineReader, ROOT) live in harness.board_server, which needs no pytest, so that the
benchmarks can start a server after `make run`'s install; they are imported here under their
old names so that the test files keep importing them from tests.live_server.
"""
from __future__ import annotations

import pytest

from harness.board_server import (  # noqa: F401  (re-exported for the test files)
    ROOT,
    START_TIMEOUT,
    BoardServer,
    LineReader,
    api_call,
    free_port,
    manage,
    server_env,
    stop_process,
    wait_until,
)


@pytest.fixture(scope="module")
def board_server(django_db_setup, django_db_blocker):
    """The board's server on the test database for this module's tests."""
    from django.db import connections

    from tests.support import database_url

    with django_db_blocker.unblock():
        url = database_url(connections["default"].settings_dict)
    server = BoardServer(url).start()
    try:
        yield server
    finally:
        server.close()


def server_for_sessions(alias: str = "default", **options) -> BoardServer:
    """A started server on this test run's database `alias` that signs sessions with the run's
    SECRET_KEY, so that a session made in the test process logs a browser or socket in."""
    from django.conf import settings
    from django.db import connections

    from tests.support import database_url

    return BoardServer(database_url(connections[alias].settings_dict), secret_key=settings.SECRET_KEY,
                       **options).start()


@pytest.fixture(scope="module")
def sessions_server(django_db_setup, django_db_blocker):
    """`server_for_sessions()` on the test database for this module's tests."""
    with django_db_blocker.unblock():
        server = server_for_sessions()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def one_process_server(django_db_setup, django_db_blocker):
    """`board_server` with one worker process: every request meets the same process's locks."""
    from django.db import connections

    from tests.support import database_url

    with django_db_blocker.unblock():
        server = BoardServer(database_url(connections["default"].settings_dict), args=["--workers", "1"]).start()
    try:
        yield server
    finally:
        server.close()
