"""The check psycopg_pool runs on a PostgreSQL connection before handing it out of the pool.

Django's own (CONN_HEALTH_CHECKS with a pool) is psycopg_pool's `check_connection`: an empty
query, one round trip to the server on every request. A connection the server dropped (a
restart, `pg_terminate_backend`, an idle timeout) is always left with something to read: the
server's error message, or the end of the stream. A healthy idle connection is sent nothing
(the pool's connections never LISTEN). So the round trip is only needed when the socket has
something to read: the empty query then reads it, and raises if the connection is gone (the
pool throws it away and hands out another), or passes if it was only a notice. A connection cut
off silently (no packet ever arrives) escapes both checks alike; the first query on it fails.

Django creates the pool with its check (the settings keep CONN_HEALTH_CHECKS on, so that
without this module the safe check applies) and offers no way to pass another: the board's app
(board/apps.py) connects `use_quiet_check` to `connection_created`, which replaces it on each
pool the first time a connection is taken from it.
"""
from __future__ import annotations

import select


def check_quiet_connection(conn) -> None:
    """Return if the pooled connection `conn` is fit to hand out; raise psycopg's
    OperationalError if not."""
    import psycopg
    from psycopg_pool import ConnectionPool

    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the pooled connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    if poller.poll(0):  # readable, or hung up (POLLHUP and POLLERR are always reported)
        ConnectionPool.check_connection(conn)


def use_quiet_check(sender, connection, **kwargs) -> None:
    """`connection_created` receiver: the pool `connection` came from checks with
    check_quiet_connection from now on (its first hand-out used Django's check)."""
    if connection.vendor != "postgresql":
        return
    pool = connection.pool
    # Only in place of Django's check: with CONN_HEALTH_CHECKS off the pool has none, and keeps none.
    if pool is not None and pool._check is _djangos_check():
        pool._check = check_quiet_connection  # psycopg_pool keeps it there; no public setter


def _djangos_check():
    from psycopg_pool import ConnectionPool

    return ConnectionPool.check_connection
