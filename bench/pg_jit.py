"""PostgreSQL's JIT and the claim: claim_next's time on a board of N QUEUED tasks (default
100,000) with the server's JIT on and off, in the same run, with and without a queue filter.

Why: the claim statement's estimated cost grows with the table, and past `jit_above_cost`
(100,000 by default) PostgreSQL compiles it with LLVM before running it; on this project's
machine a claim of one queue then took seconds where it runs in milliseconds. The board's own
sessions turn it off (taskflow_site/settings.py, postgres_options: `-c jit=off`;
DATABASE_PG_JIT=1 leaves the server's setting); this script sets it per session to show both.

It fills the database ``taskflow_bench_jit`` on 127.0.0.1:5432 (created when missing, its board
tables emptied first) with N QUEUED tasks in one queue through the engine, then times --claims
claims (each completed at once) per setting, and prints the median and the ratio on / off.

    .venv/bin/python bench/pg_jit.py                 # 100,000 tasks
    .venv/bin/python bench/pg_jit.py --tasks 20000
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))
DATABASE = "taskflow_bench_jit"
URL = f"postgres://postgres@127.0.0.1:5432/{DATABASE}"


def setup() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            conn.execute(f"CREATE DATABASE {DATABASE}")
    os.environ.update(DATABASE_URL=URL, DATABASE_POOL="0", DEBUG="0", SECRET_KEY="bench-pg-jit-not-secret",
                      ALLOWED_HOSTS="localhost")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskflow_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(tasks: int) -> None:
    from django.db import connection

    from board.engine import transitions
    from board.engine.transitions import TaskSpec

    with connection.cursor() as cursor:
        for table in ("board_taskevent", "board_dependency", "board_taskresource", "board_task"):
            cursor.execute(f"DELETE FROM {table}")
    for start in range(0, tasks, 1000):
        transitions.create([TaskSpec(title="bench", queue="work", priority=-i)
                            for i in range(start, min(tasks, start + 1000))])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE board_task, board_taskevent")


def timed_claims(jit: str, queue: str | None, claims: int) -> list[float]:
    from django.db import connection

    from board.engine import transitions

    with connection.cursor() as cursor:
        cursor.execute(f"SET jit = {jit}")
    times = []
    for _ in range(claims):
        start = time.perf_counter()
        claim = transitions.claim_next("bench", 60, queue=queue)
        times.append(time.perf_counter() - start)
        transitions.complete(claim.task.pk, claim.lease.token, {})
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=5, help="claims timed per setting (default 5)")
    args = parser.parse_args()
    setup()
    started = time.perf_counter()
    fill(args.tasks)
    print(f"{args.tasks:,} QUEUED tasks in queue 'work' (filled in {time.perf_counter() - started:.0f} s)")
    print(f"{'claim':<22} {'jit on, ms':>11} {'jit off, ms':>12} {'on / off':>9}")
    for label, queue in (("claim_next", None), ("claim_next queue=work", "work")):
        on = statistics.median(timed_claims("on", queue, args.claims)) * 1000
        off = statistics.median(timed_claims("off", queue, args.claims)) * 1000
        print(f"{label:<22} {on:>11.1f} {off:>12.1f} {on / off:>9.0f}")
    print("the board's own sessions: jit off (postgres_options in taskflow_site/settings.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
