"""Redis is only a doorbell: a Redis that accepts connections and never answers, or one that
refuses them, must neither slow the writes down nor close the board's sockets, which still get
every change through the tailer's poll. A real server (manage.py serve) with REDIS_URL pointing
at a tiny TCP server of the test (the silent Redis) or at a closed port (the refusing one)."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from django.conf import settings
from django.db import connections

from board import agent_keys
from board.live import doorbell
from tests.live_server import BoardServer, free_port, wait_until
from tests.support import database_url, sqlite_db_mark
from tests.test_live_board import WAIT, BoardSocket, staff_session, wait_for_versions

pytestmark = sqlite_db_mark()
WRITERS = 4


class SilentRedis:
    """Accepts every connection and never reads or answers: a Redis that hangs."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture(params=["silent", "refusing"])
def broken_redis_server(request, django_db_blocker):
    """The board's server with REDIS_URL at a Redis that hangs, or at a port that refuses."""
    silent = SilentRedis() if request.param == "silent" else None
    port = silent.port if silent else free_port()  # nothing listens on a fresh free port
    with django_db_blocker.unblock():
        url = database_url(connections["default"].settings_dict)
    server = BoardServer(url, secret_key=settings.SECRET_KEY, env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    server.start()
    try:
        yield server
    finally:
        server.close()
        if silent:
            silent.close()


def post(server: BoardServer, path: str, key: str, body) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        started = time.monotonic()
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        conn.close()


def test_a_broken_redis_neither_slows_writes_nor_closes_sockets(broken_redis_server):
    server = broken_redis_server
    _, key = agent_keys.create_key("creator", is_operator=True)
    _, session = staff_session("default")
    board = BoardSocket(server, session)
    wait_until(lambda: board.snapshots, WAIT, "the snapshot")
    barrier = threading.Barrier(WRITERS)
    results: list = [None] * WRITERS

    def create(n):
        barrier.wait(timeout=WAIT)
        results[n] = post(server, "/api/tasks", key, {"id": f"t{n}", "title": "t"})

    threads = [threading.Thread(target=create, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in results] == [201] * WRITERS
    took = sorted(seconds for _, seconds in results)
    # A write that waited for the ring would take at least the doorbell's timeout (a silent
    # Redis never answers); anything shorter is the write's own time, however loaded the machine.
    assert took[-1] < doorbell.DOORBELL_TIMEOUT_SECONDS, f"writes waited on the doorbell: {took}"
    wait_for_versions(board, "default")  # every change arrived, by the poll
    assert board.changes == WRITERS and board.close_code is None, board.close_code
    # And the socket is still there for the next change.
    assert post(server, "/api/tasks", key, {"id": "later", "title": "t"})[0] == 201
    wait_for_versions(board, "default")
    assert board.close_code is None
    board.close()
