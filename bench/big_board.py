"""Reads at 100,000 tasks: check() and the live board's snapshot, against a plain SQL read.

What is measured
----------------
A board of N tasks (default 100,000) in a realistic mix of stages is written once per backend
(`fill_board`, also used by tests/test_scale_reads.py), then, in the same process:

- **check()**: `board.engine.selectors.problems()`, what `GET /api/check`, `manage.py check_board` and
  the live board's problems panel run: seconds per call (best and median of --repeat runs)
  and its tracemalloc peak (measured in a separate run, since tracing slows Python down).
- **snapshot**: `board.live.frames.snapshot_frames()`, everything the server does to answer a
  websocket's snapshot (the read, the cards, the encoded frames), with the problems it carries
  computed by the same call, and again without them ("cards": the server reuses a check() under
  half a second old, `Tailer.recent_problems`): seconds and tracemalloc peak, plus the frames'
  total size.
- **baseline**: a plain `SELECT` with the database driver of the same rows each one reads (every
  task's check columns and every dependency for check(); the card columns of the tasks the
  snapshot shows, and every dependency, for the snapshot), fetched into Python tuples. The
  ratio ours/baseline says what the layer costs on top of reading the rows.

The issue's bounds (issue 9, item 5) are printed beside the figures: check() <= 0.5 s, snapshot
<= 1 s of server time, memory <= 100 MB. Missing one is reported, not an error.

The mix (per 100 tasks, interleaved): 67 COMPLETED (with results), 12 QUEUED, 15 PENDING
(waiting for a live task), 2 RUNNING with live leases, 1 PAUSED (with a checkpoint), 2 FAILED,
1 CANCELLED, over 4 queues; about half the tasks depend on one or two earlier ones (a COMPLETED
one, unless the task is PENDING). Every task has a 100-200 byte description and a 1 KB payload;
results are 0.5 KB. The filled board has no check() problem (the script says so if it finds
any). At 100,000 tasks the snapshot shows the 32,000 unfinished ones and 200 per terminal stage.

Databases
---------
- SQLite: a fresh file in a temporary directory (`--dir`), configured like the project's default
  (WAL, synchronous=NORMAL, BEGIN IMMEDIATE, busy timeout).
- PostgreSQL (`--postgres`): the database ``taskflow_bench`` on 127.0.0.1:5432, created when
  missing and migrated; its board tables are emptied before the fill.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/big_board.py                   # SQLite, 100,000 tasks
    .venv/bin/python bench/big_board.py --postgres        # SQLite and PostgreSQL
    .venv/bin/python bench/big_board.py --tasks 20000 --repeat 5

Each backend is measured in a process of its own (this script runs itself with --backend), so
that one's memory does not weigh on the other's figures.

Figures are printed from this run's measurements only; on a shared machine compare the ratios.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlparse, urlunparse

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench"
BOUNDS = {"check_seconds": 0.5, "snapshot_seconds": 1.0, "memory_mb": 100.0}
FILL_BATCH = 2000

# Stage of each of 100 consecutive tasks (see the module docstring).
MIX = (["COMPLETED"] * 67 + ["QUEUED"] * 12 + ["PENDING"] * 15 + ["RUNNING"] * 2 + ["PAUSED"]
       + ["FAILED"] * 2 + ["CANCELLED"])
QUEUES = ("default", "gpu", "io", "batch")


def fill_board(count: int, *, using: str = "default", seed: int = 9, now: datetime | None = None) -> dict:
    """Write `count` tasks in the mix above, with dependencies, in bulk (no history rows: this
    is a board as it stands, the reads under test do not read the history). Tasks are written
    in batches of FILL_BATCH; dependencies point only backwards, to a COMPLETED task for every
    task that has been claimed or queued, so the board is valid. Returns the count per stage."""
    from django.db import connections, transaction

    from board.engine import fairness
    from board.models import Dependency, Task

    rng = random.Random(seed)
    now = now or datetime.now(timezone.utc)
    stages = [MIX[(i * 37) % len(MIX)] for i in range(count)]  # interleaved, not in blocks
    completed: list[str] = []
    live: list[str] = []  # unfinished and not a dead end: what a PENDING task may wait for
    dependents: set[str] = set()
    counts: dict[str, int] = {}
    text = "lorem ipsum dolor sit amet " * 8
    with transaction.atomic(using=using):
        for start in range(0, count, FILL_BATCH):
            tasks, deps = [], []
            for i in range(start, min(count, start + FILL_BATCH)):
                task_id, stage = f"task-{i:06d}", stages[i]
                counts[stage] = counts.get(stage, 0) + 1
                wants = rng.random() < 0.5 and i > 10
                pool = completed if stage != "PENDING" else (live or completed)
                picked = sorted({rng.choice(pool) for _ in range(rng.choice((1, 2)))}) if wants and pool else []
                if stage == "PENDING" and picked == [] and live:
                    picked = [rng.choice(live)]  # PENDING because it waits
                deps += [Dependency(task_id=task_id, depends_on_id=d) for d in picked]
                dependents.update(picked)
                leased = stage == "RUNNING"
                claimed = stage in ("RUNNING", "PAUSED", "COMPLETED", "FAILED")
                tasks.append(Task(
                    id=task_id, title=f"big board task {i}", description=text[: 100 + i % 100],
                    payload={"n": i, "blob": "x" * 1000}, queue=QUEUES[i % len(QUEUES)],
                    priority=rng.randint(0, 3), stage=stage, version=3 if claimed else 1,
                    owner=f"agent-{i % 50}" if leased else "",
                    lease_token_hash=hashlib.sha256(task_id.encode()).hexdigest() if leased else None,
                    fence=1 if claimed else 0,
                    lease_expires_at=now + timedelta(hours=1) if leased else None,
                    attempts=1 if claimed else 0, max_retries=3,
                    checkpoint={"step": i % 10} if stage == "PAUSED" else None,
                    progress=0.5 if leased else None,
                    result={"value": i, "blob": "y" * 500} if stage == "COMPLETED" else None,
                    last_error="boom" if stage == "FAILED" else "",
                    created_at=now - timedelta(seconds=count - i), updated_at=now - timedelta(seconds=(count - i) // 2),
                    has_deps=bool(picked),
                ))
                tasks[-1].claim_rank = fairness.rank(tasks[-1].created_at.timestamp(), tasks[-1].priority)
                if stage == "COMPLETED":
                    completed.append(task_id)
                elif stage in ("PENDING", "QUEUED", "RUNNING", "PAUSED"):
                    live.append(task_id)
            Task.objects.using(using).bulk_create(tasks)
            Dependency.objects.using(using).bulk_create(deps)
        # Set once every dependency is written (a task's dependents come after it).
        ids = sorted(dependents)
        for start in range(0, len(ids), FILL_BATCH):
            Task.objects.using(using).filter(pk__in=ids[start:start + FILL_BATCH]).update(has_dependents=True)
    if connections[using].vendor == "postgresql":
        # As autovacuum leaves a board that has stood a while: statistics for the planner, and
        # the visibility map that lets index-only scans skip the table.
        with connections[using].cursor() as cursor:
            cursor.execute("VACUUM ANALYZE board_task, board_dependency")
    return counts


# ---------------------------------------------------------------------------------------------
# One backend, in this process


def configure_django(database_url: str) -> None:
    """The project's settings with DATABASES replaced by the bench database (as "default": the
    snapshot reads the default alias). DEBUG off: Django keeps no log of the queries."""
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    import django
    from django.conf import settings

    from taskflow_site import settings as project

    values = {name: getattr(project, name) for name in dir(project) if name.isupper()}
    values.update(DEBUG=False, DATABASES={"default": project.database_from_url(database_url)})
    settings.configure(**values)
    django.setup()


def ensure_postgres_database(url: str) -> str | None:
    """Create the bench database when missing. Returns why PostgreSQL cannot be used, or None."""
    import psycopg
    from psycopg import sql

    parts = urlparse(url)
    server = urlunparse(parts._replace(path="/postgres"))
    try:
        with psycopg.connect(server, autocommit=True, connect_timeout=3) as conn:
            name = parts.path.lstrip("/")
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def prepare(database_url: str, tasks: int) -> tuple[dict, float]:
    from django.core.management import call_command
    from django.db import connections, transaction

    call_command("migrate", verbosity=0)
    with transaction.atomic(), connections["default"].cursor() as cursor:
        for table in ("board_taskevent", "board_dependency", "board_task"):
            cursor.execute(f"DELETE FROM {table}")
    started = time.perf_counter()
    counts = fill_board(tasks)
    return counts, time.perf_counter() - started


def timed(call, repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return times, result


def traced_peak(call) -> float:
    """tracemalloc's peak (MB) while `call` runs: what Python allocated for it at most."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def raw_connection(database_url: str):
    """The plain driver on the same database (the baseline), in autocommit."""
    if database_url.startswith("sqlite"):
        return sqlite3.connect(urlparse(database_url).path, isolation_level=None)
    import psycopg

    return psycopg.connect(database_url, autocommit=True)


def raw_read(database_url: str, statements: list[str]):
    """Fetch every row of `statements` into Python tuples, in one read transaction."""
    conn = raw_connection(database_url)
    try:
        conn.execute("BEGIN")
        rows = [conn.execute(sql).fetchall() for sql in statements]
        conn.execute("COMMIT")
        return rows
    finally:
        conn.close()


CHECK_BASELINE = [
    "SELECT id, stage, owner, lease_token_hash, lease_expires_at, attempts, max_retries,"
    " checkpoint IS NOT NULL, result IS NOT NULL FROM board_task",
    "SELECT task_id, depends_on_id FROM board_dependency",
]
CARD_SQL = ("SELECT id, title, queue, priority, on_hold, max_retries, stage, version, owner, fence,"
            " lease_expires_at, attempts, not_before, progress, last_error, created_at, updated_at FROM board_task")
SNAPSHOT_BASELINE = [
    CARD_SQL + " WHERE stage NOT IN ('COMPLETED', 'CANCELLED') ORDER BY priority DESC, created_at, id",
    CARD_SQL + " WHERE stage = 'COMPLETED' ORDER BY updated_at DESC, id DESC LIMIT 200",
    CARD_SQL + " WHERE stage = 'CANCELLED' ORDER BY updated_at DESC, id DESC LIMIT 200",
    "SELECT task_id, depends_on_id FROM board_dependency",
]


def measure(backend: str, database_url: str, args: argparse.Namespace) -> None:
    configure_django(database_url)
    from board.engine import selectors
    from board.live import frames as live_frames

    counts, fill_seconds = prepare(database_url, args.tasks)
    print(f"{backend}: {args.tasks:,} tasks written in {fill_seconds:.1f} s "
          f"({', '.join(f'{stage} {n:,}' for stage, n in sorted(counts.items()))})")
    problems = selectors.problems()
    if problems:
        print(f"  WARNING: the filled board has {len(problems)} check() problems, e.g. {problems[0]}")

    check_times, _ = timed(selectors.problems, args.repeat)
    check_base, _ = timed(lambda: raw_read(database_url, CHECK_BASELINE), args.repeat)
    snap_times, frames = timed(live_frames.snapshot_frames, args.repeat)
    cards_times, _ = timed(lambda: live_frames.snapshot_frames(problems=[]), args.repeat)
    snap_base, _ = timed(lambda: raw_read(database_url, SNAPSHOT_BASELINE), args.repeat)
    check_peak = traced_peak(selectors.problems)
    snap_peak = traced_peak(live_frames.snapshot_frames)
    cards = sum(len(json.loads(frame)["tasks"]) for frame in frames)
    size = sum(len(frame) for frame in frames) / 2**20

    def row(what, times, base, peak, bound_seconds):
        best, median = min(times), statistics.median(times)
        verdict = "ok" if median <= bound_seconds and peak <= BOUNDS["memory_mb"] else "OVER THE BOUND"
        print(f"  {what:<10} {best:8.3f} {median:8.3f} {min(base):10.3f} {median / min(base):7.1f} "
              f"{peak:9.1f}   <= {bound_seconds:g} s, <= {BOUNDS['memory_mb']:g} MB: {verdict}")

    print(f"  {'':<10} {'best s':>8} {'median s':>8} {'raw SELECT':>10} {'ratio':>7} {'peak MB':>9}")
    row("check()", check_times, check_base, check_peak, BOUNDS["check_seconds"])
    row("snapshot", snap_times, snap_base, snap_peak, BOUNDS["snapshot_seconds"])
    row("  cards", cards_times, snap_base, snap_peak, BOUNDS["snapshot_seconds"])
    print("  (snapshot: with its check(), as for a first socket; cards: reusing the tailer's recent"
          " problems, as the server does for the sockets after it)")
    print(f"  the snapshot: {len(frames)} frames, {cards:,} cards, {size:.1f} MB of JSON (the peak includes it)")
    print(f"  (median of {args.repeat} runs; ratio = median / the best plain-driver SELECT of the same rows;"
          " peak = tracemalloc, one more run)")


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each read (default 3)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL too")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--dir", default=None, help="where the SQLite file goes (default: a temporary folder)")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_backends(script: str, prefix: str, postgres: bool, pg_url: str, options: list[str],
                 folder: str | None = None) -> int:
    """Run `script` once per backend, each in a child process of its own: SQLite (a fresh file in
    a temporary folder) and, with `postgres`, the database at `pg_url` (created when missing; a
    NOT RUN line when unreachable). `options` go to every child. Returns the first failing exit code."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=folder) as tmp:
        runs = [("sqlite", f"sqlite:///{Path(tmp) / 'board.sqlite3'}")]
        if postgres:
            why = ensure_postgres_database(pg_url)
            if why:
                print(f"NOT RUN: PostgreSQL ({pg_url} unreachable: {why})")
            else:
                runs.append(("postgres", pg_url))
        status = 0
        for backend, url in runs:
            child = subprocess.run([sys.executable, script, "--backend", backend, "--database-url", url, *options],
                                   cwd=PROJECT)
            status = status or child.returncode
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend:  # a child: one backend
        measure(args.backend, args.database_url, args)
        return 0
    print(f"bench/big_board.py: {args.tasks:,} tasks, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} cores; pid {os.getpid()}")
    return run_backends(__file__, "taskflow-big-board-", args.postgres, args.pg_url,
                        ["--tasks", str(args.tasks), "--repeat", str(args.repeat)], folder=args.dir)


if __name__ == "__main__":
    sys.exit(main())
