"""Helpers for tests: real rows in real databases, aged by writing the row (never by sleeping)."""
import random
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from board.models import Approval, Dependency, QueueShard, Task, TaskEvent, TaskNote


def postgres_db_mark():
    """Marks for tests on the PostgreSQL alias. When the server is absent the `postgres` marker
    makes them fail (CI) or skip loudly (laptop) before they touch the database."""
    databases = ["default", "postgres"] if settings.POSTGRES_AVAILABLE else ["default"]
    return [pytest.mark.postgres, pytest.mark.django_db(transaction=True, databases=databases)]


def sqlite_db_mark():
    return [pytest.mark.django_db(transaction=True, databases=["default"])]


def sql_stores() -> list:
    """Parameters for a test run on each SQL store: SQLite ("default") and PostgreSQL."""
    return [pytest.param("default", marks=sqlite_db_mark(), id="sqlite"),
            pytest.param("postgres", marks=postgres_db_mark(), id="postgres")]


def terminate_backends(cursor, pids: list[int], wait: float = 10.0) -> int:
    """pg_terminate_backend on each of `pids` (from `cursor`, a DB-API cursor of a connection
    that is not one of them), then wait until none of them is in pg_stat_activity; how many were
    signalled. Not PostgreSQL's own wait, pg_terminate_backend(pid, timeout): it polls with
    kill(pid, 0), and a pid an exited backend freed may already be another user's process, when
    the wait fails with "Operation not permitted" (seen in CI, 2026-12-06)."""
    cursor.execute("SELECT count(*) FROM unnest(%s::int[]) AS pid WHERE pg_terminate_backend(pid)", [pids])
    signalled = cursor.fetchone()[0]
    deadline = time.monotonic() + wait
    while True:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # read the activity afresh
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s::int[])", [pids])
        if cursor.fetchone()[0] == 0:
            return signalled
        assert time.monotonic() < deadline, f"the backends {pids} were still there after {wait} s"
        time.sleep(0.02)  # polled: a backend exits a moment after its signal


def database_file(using: str = "default") -> str:
    """The SQLite database file of `using` (the test database's, inside a test)."""
    return str(connections[using].settings_dict["NAME"])


def row(task_id: str, using: str = "default") -> dict:
    """Every column of a task, as stored."""
    return task_columns(Task.objects.using(using).get(pk=task_id))


def task_columns(task: Task) -> dict:
    """Every field of a task, the engine's own too (model_to_dict leaves out the fields that are
    not editable: claim_rank, has_deps, notes_count...)."""
    return {field.name: getattr(task, field.attname) for field in Task._meta.concrete_fields}


def db_state(using: str = "default") -> tuple:
    """Everything the board stores, to compare before and after a refused call."""
    tasks = [task_columns(t) for t in Task.objects.using(using).order_by("pk")]
    deps = list(Dependency.objects.using(using).order_by("pk").values_list("task_id", "depends_on_id"))
    events = list(TaskEvent.objects.using(using).order_by("pk").values())
    notes = list(TaskNote.objects.using(using).order_by("pk").values())
    approvals = list(Approval.objects.using(using).order_by("pk").values())
    shards = list(QueueShard.objects.using(using).order_by("queue", "kind", "number").values())
    return tasks, deps, events, notes, approvals, shards


def queue_shards(queue: str, kind: str, using: str = "default"):
    """A queue's shards of one kind ("run", "debt", "rate": board.models.QueueShard), for a test
    that ages a rate or writes a count behind the engine's back."""
    return QueueShard.objects.using(using).filter(queue=queue, kind=kind)


def expire_lease(task_id: str, using: str = "default", ago: timedelta = timedelta(seconds=5)) -> None:
    """Age a lease by writing its expiry into the past (a test's stand-in for time passing)."""
    updated = Task.objects.using(using).filter(pk=task_id, stage="RUNNING").update(
        lease_expires_at=timezone.now() - ago
    )
    assert updated == 1, f"{task_id} holds no lease to expire"


def end_backoff(task_id: str, using: str = "default") -> None:
    assert Task.objects.using(using).filter(pk=task_id).update(not_before=None) == 1


def rename_table(using: str, old: str, new: str) -> None:
    """Rename a table (a collection on MongoDB), as a broken migration would leave it."""
    connection = connections[using]
    if connection.vendor == "mongodb":
        connection.ensure_connection()
        connection.database[old].rename(new)
        return
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")


def close_connection(using: str) -> None:
    connections[using].close()


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL for another process to reach the same (test) database."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    if settings_dict["ENGINE"] == "board.engine.stores.mongodb.backend":  # the server's URL, on this database
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(settings_dict["HOST"])
        return urlunsplit((parts.scheme, parts.netloc, f"/{settings_dict['NAME']}", parts.query, ""))
    user, host, port = settings_dict["USER"], settings_dict["HOST"] or "127.0.0.1", settings_dict["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{settings_dict['NAME']}"


def race(calls, alias: str = "default", jitter=None) -> list:
    """Run `calls` in threads, each with its own connection (closed at its end), released
    together by a barrier. `jitter[i]` (seconds), when given, delays call i after the release by
    a random amount, only to vary who goes first from round to round: no assertion may depend
    on it. Returns each call's result or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i):
        try:
            connections[alias].ensure_connection()
            barrier.wait(timeout=60)
            if jitter and jitter[i]:
                time.sleep(random.uniform(0, jitter[i]))
            results[i] = calls[i]()
        except BaseException as exc:  # reported to the test, which judges it
            results[i] = exc
        finally:
            connections[alias].close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def plan_node_names(plan: list) -> list[str]:
    """A PostgreSQL plan (EXPLAIN's FORMAT JSON, parsed) as its nodes in order: "Index Scan
    board_taskevent_pkey", "Sort", ..."""
    nodes: list[str] = []

    def walk(node: dict) -> None:
        nodes.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    return nodes
