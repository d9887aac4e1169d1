"""The PostgreSQL pool's check (board/engine/stores/pg_pool.py): a healthy idle connection is handed
out without a round trip; one the server dropped is found out and replaced, and the request
that asked for it gets a working one. (The spy on the round trip sees only the quiet check's
calls: a pool holds Django's check as the function object it was made with.)"""
from __future__ import annotations

import psycopg
import pytest
from django.db import connections
from psycopg_pool import ConnectionPool

from board.engine.stores.pg_pool import check_quiet_connection
from tests.support import postgres_db_mark, terminate_backends

pytestmark = postgres_db_mark()
ALIAS = "postgres"


@pytest.fixture
def round_trips(monkeypatch) -> list:
    """The empty-query checks run while the test runs (psycopg_pool's own check, spied on)."""
    calls: list = []
    real = ConnectionPool.check_connection

    def counted(conn):
        calls.append(conn)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return calls


def backend_pid() -> int:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def terminate(pid: int) -> None:
    """pg_terminate_backend from a connection outside the pool, waiting until it has gone."""
    settings_dict = connections[ALIAS].settings_dict
    with psycopg.connect(host=settings_dict["HOST"], port=settings_dict["PORT"] or 5432,
                         user=settings_dict["USER"], dbname=settings_dict["NAME"], autocommit=True) as other:
        assert terminate_backends(other.cursor(), [pid]) == 1


def test_the_pool_checks_with_the_quiet_check_once_a_connection_was_taken():
    connections[ALIAS].close()
    connections[ALIAS].close_pool()  # a pool made now, with Django's check
    assert connections[ALIAS].pool._check is ConnectionPool.check_connection
    backend_pid()
    assert connections[ALIAS].pool._check is check_quiet_connection
    connections[ALIAS].close()


@pytest.fixture
def one_connection_pool():
    """A pool of one connection to the test database, checked as the project's are."""
    settings_dict = connections[ALIAS].settings_dict
    pool = ConnectionPool(kwargs={"host": settings_dict["HOST"], "port": settings_dict["PORT"] or 5432,
                                  "user": settings_dict["USER"], "dbname": settings_dict["NAME"],
                                  "autocommit": True},
                          min_size=1, max_size=1, timeout=10, check=check_quiet_connection, open=True)
    try:
        yield pool
    finally:
        pool.close()


def pid_of(pool: ConnectionPool) -> int:
    with pool.connection() as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_a_healthy_idle_connection_is_handed_out_without_a_round_trip(one_connection_pool, round_trips):
    first = pid_of(one_connection_pool)
    assert [pid_of(one_connection_pool) for _ in range(3)] == [first] * 3
    assert round_trips == []


def test_a_connection_the_server_dropped_is_replaced_before_it_is_handed_out(one_connection_pool, round_trips):
    dropped = pid_of(one_connection_pool)
    terminate(dropped)
    assert pid_of(one_connection_pool) != dropped  # the next user's first query works
    assert len(round_trips) == 1  # the dropped one was checked with the round trip, and thrown away


def test_a_closed_connection_fails_the_check_at_once():
    settings_dict = connections[ALIAS].settings_dict
    conn = psycopg.connect(host=settings_dict["HOST"], port=settings_dict["PORT"] or 5432,
                           user=settings_dict["USER"], dbname=settings_dict["NAME"], autocommit=True)
    check_quiet_connection(conn)  # open and quiet: passes
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        check_quiet_connection(conn)
