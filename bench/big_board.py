"""Reads from 10,000 to 1,000,000 tasks: check() and the live board's snapshot, against a plain SQL read.

What is measured
----------------
For each size of --tasks (default 100,000; a comma-separated list measures several in turn), a
board of that many tasks in a realistic mix of stages is written once per backend
(`fill_board`, also used by tests/test_scale_reads.py), then, in the same process:

- **check()**: `board.engine.selectors.problems()`, what `GET /api/check`, `manage.py check_board` and
  the live board's problems panel run: seconds per call (best and median of --repeat runs)
  and its tracemalloc peak (measured in a separate run, since tracing slows Python down).
- **snapshot**: `board.live.frames.snapshot_frames()`, everything the server does before a new
  websocket's first frame (the read, the cards, the encoded frames: all are built before the
  first is sent), with the problems it carries computed by the same call (what the server's
  sockets never wait for: a process's first snapshot says "not checked yet" and the tailer's
  result follows), and again without them ("cards": the server reuses its tailer's last
  check(), `Tailer.recent_problems`):
  seconds and tracemalloc peak, the first frame's size and all frames' size in bytes, and the
  cards they hold. The snapshot holds every column's count and its first page
  (`board.live.reads.COLUMN_PAGE`, 100 cards, in the column's order), so none of these should
  grow with the board.
- **baseline**: a plain `SELECT` with the database driver of the same rows each one reads,
  fetched into Python tuples on one connection opened beforehand (as the server's is): every
  task's check columns and every dependency for check(); for the snapshot, the count per stage
  (one GROUP BY), each column's first 101 rows in its order (7 LIMIT queries, card columns only:
  the page and the row that says whether a next page exists) and the dependencies of the
  pages' tasks. The ratio ours/baseline says what the layer costs on top of reading the rows.

The bounds are printed beside the figures: check() <= 0.5 s and memory <= 100 MB (issue 9,
item 5); the snapshot <= 0.1 s and its first frame <= 1 MB (1,000,000 bytes), alike from 10,000
to 1,000,000 tasks (issue 31). The first socket's snapshot also runs check(), which reads every
task: the "cards" row is the one that must not grow. Missing a bound is reported, not an error.
With several sizes the run ends with one table of the snapshot's figures, a line per size and
backend.

The mix (per 100 tasks, interleaved): 67 COMPLETED (with results), 12 QUEUED, 15 PENDING
(waiting for a live task), 2 RUNNING with live leases, 1 PAUSED (with a checkpoint), 2 FAILED,
1 CANCELLED, over 4 queues; about half the tasks depend on one or two earlier ones (a COMPLETED
one, unless the task is PENDING). Every task has a 100-200 byte description and a 1 KB payload;
results are 0.5 KB. The filled board has no check() problem (the script says so if it finds
any). At 100,000 tasks the snapshot shows 700 cards, the first 100 of each of the 7 columns
(COMPLETED and CANCELLED most recent first, the others in claim order), where it used to show
the 32,000 unfinished tasks and 200 per terminal stage (32,400 cards, 25 MB).

The fill writes each row once, by COPY on PostgreSQL and one executemany on SQLite
(`insert_rows`), with the values bulk_create wrote, so that 1,000,000 tasks take minutes: 200,000
tasks on PostgreSQL took 34 s, against 103 s with bulk_create and a later UPDATE of has_dependents
(2026-12-06, this shared 2-core machine).

Databases
---------
- SQLite: a fresh file in a temporary directory (`--dir`) per size, configured like the
  project's default (WAL, synchronous=NORMAL, BEGIN IMMEDIATE, busy timeout).
- PostgreSQL (`--postgres`): the database ``taskflow_bench`` on 127.0.0.1:5432, created when
  missing and migrated; its board tables are emptied before each fill (and left filled after).

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/big_board.py                   # SQLite, 100,000 tasks
    .venv/bin/python bench/big_board.py --postgres        # SQLite and PostgreSQL
    .venv/bin/python bench/big_board.py --tasks 20000 --repeat 5
    .venv/bin/python bench/big_board.py --tasks 10000,100000,1000000 --postgres

Each size and backend is measured in a process of its own (this script runs itself with
--backend), so that one's memory does not weigh on another's figures.

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
BOUNDS = {"check_seconds": 0.5, "snapshot_seconds": 0.1, "first_frame_bytes": 1_000_000, "memory_mb": 100.0}
FILL_BATCH = 2000

# Stage of each of 100 consecutive tasks (see the module docstring).
MIX = (["COMPLETED"] * 67 + ["QUEUED"] * 12 + ["PENDING"] * 15 + ["RUNNING"] * 2 + ["PAUSED"]
       + ["FAILED"] * 2 + ["CANCELLED"])
QUEUES = ("default", "gpu", "io", "batch")


def fill_board(count: int, *, using: str = "default", seed: int = 9, now: datetime | None = None) -> dict:
    """Write `count` tasks in the mix above, with dependencies, in bulk (no history rows: this
    is a board as it stands, the reads under test do not read the history). Tasks are written
    in batches of FILL_BATCH (`insert_rows`); dependencies point only backwards, to a COMPLETED
    task for every task that has been claimed or queued, so the board is valid. Returns the
    count per stage."""
    from django.db import connections, transaction

    from board.engine import fairness
    from board.models import Dependency, Task

    rng = random.Random(seed)
    now = now or datetime.now(timezone.utc)
    stages = [MIX[(i * 37) % len(MIX)] for i in range(count)]  # interleaved, not in blocks
    # The random draws first (each task's dependencies and priority, in the order they were
    # always drawn): a task's dependents come after it, and knowing them before any row is written
    # writes has_dependents with the row (an UPDATE of those rows afterwards, and the vacuum of
    # their old versions, were half of PostgreSQL's work in a fill).
    completed: list[str] = []
    live: list[str] = []  # unfinished and not a dead end: what a PENDING task may wait for
    picks: list[tuple[str, ...]] = []
    priorities: list[int] = []
    dependents: set[str] = set()
    for i in range(count):
        task_id, stage = f"task-{i:06d}", stages[i]
        wants = rng.random() < 0.5 and i > 10
        pool = completed if stage != "PENDING" else (live or completed)
        picked = sorted({rng.choice(pool) for _ in range(rng.choice((1, 2)))}) if wants and pool else []
        if stage == "PENDING" and picked == [] and live:
            picked = [rng.choice(live)]  # PENDING because it waits
        picks.append(tuple(picked))
        dependents.update(picked)
        priorities.append(rng.randint(0, 3))
        if stage == "COMPLETED":
            completed.append(task_id)
        elif stage in ("PENDING", "QUEUED", "RUNNING", "PAUSED"):
            live.append(task_id)
    counts: dict[str, int] = {}
    text = "lorem ipsum dolor sit amet " * 8
    with transaction.atomic(using=using):
        for start in range(0, count, FILL_BATCH):
            tasks, deps = [], []
            for i in range(start, min(count, start + FILL_BATCH)):
                task_id, stage, picked = f"task-{i:06d}", stages[i], picks[i]
                counts[stage] = counts.get(stage, 0) + 1
                deps += [{"task_id": task_id, "depends_on_id": d} for d in picked]
                leased = stage == "RUNNING"
                claimed = stage in ("RUNNING", "PAUSED", "COMPLETED", "FAILED")
                created_at = now - timedelta(seconds=count - i)
                tasks.append(dict(
                    id=task_id, title=f"big board task {i}", description=text[: 100 + i % 100],
                    payload={"n": i, "blob": "x" * 1000}, queue=QUEUES[i % len(QUEUES)],
                    priority=priorities[i], stage=stage, version=3 if claimed else 1,
                    owner=f"agent-{i % 50}" if leased else "",
                    lease_token_hash=hashlib.sha256(task_id.encode()).hexdigest() if leased else None,
                    fence=1 if claimed else 0,
                    lease_expires_at=now + timedelta(hours=1) if leased else None,
                    attempts=1 if claimed else 0, max_retries=3,
                    checkpoint={"step": i % 10} if stage == "PAUSED" else None,
                    progress=0.5 if leased else None,
                    result={"value": i, "blob": "y" * 500} if stage == "COMPLETED" else None,
                    last_error="boom" if stage == "FAILED" else "",
                    created_at=created_at, updated_at=now - timedelta(seconds=(count - i) // 2),
                    claim_rank=fairness.rank(created_at.timestamp(), priorities[i]),
                    has_deps=bool(picked), has_dependents=task_id in dependents,
                ))
            insert_rows(Task, tasks, using)
            insert_rows(Dependency, deps, using)
    if connections[using].vendor == "postgresql":
        # As autovacuum leaves a board that has stood a while: statistics for the planner, and
        # the visibility map that lets index-only scans skip the table.
        with connections[using].cursor() as cursor:
            cursor.execute("VACUUM ANALYZE board_task, board_dependency")
    return counts


def insert_rows(model, rows: list[dict], using: str) -> None:
    """Insert `rows` (field values by attname; the others get their default) as
    `bulk_create([model(**row) ...])` would, each value prepared for the database by its field
    as Django's insert prepares it, but by COPY on PostgreSQL and one executemany on SQLite,
    without a model instance per row: most of bulk_create's time was Python's, building the
    instances and one statement of every value. An auto-increment id left out is left to the
    database."""
    from django.db import connections

    if not rows:
        return
    connection = connections[using]
    if connection.vendor not in ("postgresql", "sqlite"):
        model.objects.using(using).bulk_create([model(**row) for row in rows])
        return
    fields = [f for f in model._meta.concrete_fields
              if not f.generated and not (f is model._meta.auto_field and f.attname not in rows[0])]
    # pre_save() is not called: it would change no value of these models (no auto_now field).
    assert not any(getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False) for f in fields)
    # The defaults of the fields a row leaves out, as a model instance gets them; made once
    # (these models have no default that differs per row, such as a uuid).
    unset = model()
    columns = [(f.attname, getattr(unset, f.attname), f.get_db_prep_save, {}) for f in fields]

    def db_row(row: dict) -> list:
        values = []
        for name, default, prep, prepared in columns:  # prepared: {(type, value): value to write}
            value = row.get(name, default)
            try:
                values.append(prepared[type(value), value])
            except KeyError:  # the first time (most columns repeat a few values)
                values.append(prepared.setdefault((type(value), value), prep(value, connection)))
            except TypeError:  # unhashable: a JSON value
                values.append(prep(value, connection))
        return values

    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # each row made as it is written
            with cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(db_row(row))
        else:
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join(['%s'] * len(fields))})",
                               map(db_row, rows))


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


def board_moves(n: int) -> None:
    """`n` tasks created, claimed and completed through the engine: 3n events of history."""
    from board.engine import transitions
    from board.engine.transitions import TaskSpec

    prefix = f"moving-{secrets.token_hex(4)}"
    transitions.create([TaskSpec(id=f"{prefix}-{i}", title="a task on the moving board", queue="live")
                        for i in range(n)], actor="bench")
    for i in range(n):
        claim = transitions.claim(f"{prefix}-{i}", "bench-agent", 60)
        transitions.complete(f"{prefix}-{i}", claim.lease.token, {"ok": True})


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


def raw_read(conn, statements: list[str]):
    """Fetch every row of `statements` into Python tuples, in one read transaction on `conn`."""
    conn.execute("BEGIN")
    rows = [conn.execute(sql).fetchall() for sql in statements]
    conn.execute("COMMIT")
    return rows


CHECK_BASELINE = [
    "SELECT id, stage, owner, lease_token_hash, lease_expires_at, attempts, max_retries,"
    " checkpoint IS NOT NULL, result IS NOT NULL FROM board_task",
    "SELECT task_id, depends_on_id FROM board_dependency",
]
# Each column's order (board.live.reads.column_order names it) in SQL.
COLUMN_SQL_ORDER = {"claim": "claim_rank, id", "updated": "updated_at DESC, id DESC"}


def snapshot_baseline() -> list[str]:
    """What the snapshot reads (board.live.reads.board_parts), as plain SQL: every stage's count,
    then each column's first page in the column's order and the row after it (which says whether
    there is a next page), card columns only. The dependencies of the page's tasks follow:
    `raw_snapshot_read`."""
    from board.engine.lifecycle import Stage
    from board.live import reads

    columns = ", ".join((*reads.CARD_COLUMNS, "has_deps"))
    return ["SELECT stage, COUNT(*) FROM board_task GROUP BY stage"] + [
        f"SELECT {columns} FROM board_task WHERE stage = '{stage.value}'"
        f" ORDER BY {COLUMN_SQL_ORDER[reads.column_order(stage)]} LIMIT {reads.COLUMN_PAGE + 1}"
        for stage in Stage]


def raw_snapshot_read(conn, statements: list[str], page: int):
    """`statements` (snapshot_baseline) then the dependencies of the pages' tasks that have some,
    in one read transaction on `conn`: the counts, the pages and the dependencies."""
    marker = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute("BEGIN")
    counts, *pages = [conn.execute(sql).fetchall() for sql in statements]
    pages = [rows[:page] for rows in pages]
    wanted = [row[0] for rows in pages for row in rows if row[-1]]  # has_deps, the last column
    deps = conn.execute(f"SELECT task_id, depends_on_id FROM board_dependency WHERE task_id IN"
                        f" ({', '.join([marker] * len(wanted))}) ORDER BY id", wanted).fetchall() if wanted else []
    conn.execute("COMMIT")
    return counts, pages, deps


def measure(backend: str, database_url: str, tasks: int, repeat: int) -> dict:
    """Fill a board of `tasks` tasks, measure, print; returns the figures of the summary table."""
    configure_django(database_url)
    from board.engine import selectors
    from board.live import column_counts, reads
    from board.live import frames as live_frames

    counts, fill_seconds = prepare(database_url, tasks)
    board_moves(5)  # a history for the snapshot's counts to follow (the fill writes none)
    print(f"{backend}: {tasks:,} tasks written in {fill_seconds:.1f} s "
          f"({', '.join(f'{stage} {n:,}' for stage, n in sorted(counts.items()))})")
    problems = selectors.problems()
    if problems:
        print(f"  WARNING: the filled board has {len(problems)} check() problems, e.g. {problems[0]}")

    # One connection for the plain driver, opened once as the server's is: at a few milliseconds
    # a read, a connect per call would be most of the baseline.
    raw = raw_connection(database_url)
    try:
        statements = snapshot_baseline()
        check_times, _ = timed(selectors.problems, repeat)
        check_base, _ = timed(lambda: raw_read(raw, CHECK_BASELINE), repeat)
        snap_times, frames = timed(live_frames.snapshot_frames, repeat)
        counted_times, _ = timed(lambda: (column_counts.forget(), live_frames.snapshot_frames(problems=[])), repeat)
        cards_times = []
        for _ in range(repeat):
            board_moves(5)  # the board moves between two sockets' snapshots (not timed)
            cards_times += timed(lambda: live_frames.snapshot_frames(problems=[]), 1)[0]
        snap_base, _ = timed(lambda: raw_snapshot_read(raw, statements, reads.COLUMN_PAGE), repeat)
    finally:
        raw.close()
    check_peak = traced_peak(selectors.problems)
    snap_peak = traced_peak(live_frames.snapshot_frames)
    cards = sum(len(json.loads(frame)["tasks"]) for frame in frames)
    sizes = [len(frame.encode()) for frame in frames]

    def row(what, times, base, peak, bound_seconds):
        best, median = min(times), statistics.median(times)
        verdict = "ok" if median <= bound_seconds and peak <= BOUNDS["memory_mb"] else "OVER THE BOUND"
        print(f"  {what:<10} {best:8.3f} {median:8.3f} {min(base):10.3f} {median / min(base):7.1f} "
              f"{peak:9.1f}   <= {bound_seconds:g} s, <= {BOUNDS['memory_mb']:g} MB: {verdict}")

    print(f"  {'':<10} {'best s':>8} {'median s':>8} {'raw SELECT':>10} {'ratio':>7} {'peak MB':>9}")
    row("check()", check_times, check_base, check_peak, BOUNDS["check_seconds"])
    row("snapshot", snap_times, snap_base, snap_peak, BOUNDS["snapshot_seconds"])
    row("  cards", cards_times, snap_base, snap_peak, BOUNDS["snapshot_seconds"])
    row("  counted", counted_times, snap_base, snap_peak, BOUNDS["snapshot_seconds"])
    print("  (snapshot: with its check() computed in the same call, which no socket waits for (a"
          " process's first snapshot carries none and the tailer's result follows); cards: reusing the tailer's recent"
          " problems, as the server does for the sockets after it, with the counts followed from"
          " the history since the last snapshot (board.live.column_counts; 15 moves between two);"
          " counted: the same with the counts counted, as a process's first snapshot or one a"
          " minute after the last count)")
    verdict = "ok" if sizes[0] <= BOUNDS["first_frame_bytes"] else "OVER THE BOUND"
    print(f"  the snapshot: {cards:,} cards in {len(frames)} frames; the first frame {sizes[0]:,} bytes"
          f" (<= {BOUNDS['first_frame_bytes']:,}: {verdict}), all frames {sum(sizes):,} bytes")
    print(f"  (median of {repeat} runs; ratio = median / the best plain-driver SELECT of the same rows;"
          " peak = tracemalloc, one more run)")
    return {"backend": backend, "tasks": tasks, "cards_ms": statistics.median(cards_times) * 1000,
            "counted_ms": statistics.median(counted_times) * 1000,
            "snapshot_ms": statistics.median(snap_times) * 1000, "first_kb": sizes[0] / 1000,
            "total_kb": sum(sizes) / 1000, "cards": cards}


def print_summary(rows: list[dict]) -> None:
    """One line per size and backend: the snapshot's figures side by side, to see they do not grow."""
    print(f"\n{'backend':<9} {'tasks':>10} {'snapshot ms':>11} {'counted ms':>10} {'with check() ms':>15} "
          f"{'first frame KB':>14} {'total KB':>9} {'cards':>6}")
    for r in rows:
        print(f"{r['backend']:<9} {r['tasks']:>10,} {r['cards_ms']:>11.1f} {r['counted_ms']:>10.1f} "
              f"{r['snapshot_ms']:>15.1f} {r['first_kb']:>14.1f} {r['total_kb']:>9.1f} {r['cards']:>6,}")
    print("(medians; snapshot: reusing the last check() and following the counts, as the server does;"
          " counted: its counts counted, as a process's first; with check(): as for a first socket;"
          " KB = 1,000 bytes)")


# ---------------------------------------------------------------------------------------------


def task_counts(text: str) -> list[int]:
    """--tasks: "10000,100000" -> [10000, 100000]."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of task counts: {text!r}") from None
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"a board has at least one task: {text!r}")
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=task_counts, default=[100_000],
                        help="board sizes, comma-separated (default 100000), each filled and measured in turn")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each read (default 3)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL too")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--dir", default=None, help="where the SQLite file goes (default: a temporary folder)")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--summary", help=argparse.SUPPRESS)  # where a child adds its figures (a JSON line)
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
    if args.backend:  # a child: one backend, one size
        figures = measure(args.backend, args.database_url, args.tasks[0], args.repeat)
        if args.summary:
            with open(args.summary, "a") as out:
                out.write(json.dumps(figures) + "\n")
        return 0
    print(f"bench/big_board.py: {', '.join(f'{n:,}' for n in args.tasks)} tasks, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} cores; pid {os.getpid()}")
    status = 0
    with tempfile.TemporaryDirectory(prefix="taskflow-big-board-summary-") as tmp:
        summary = Path(tmp) / "figures.jsonl"
        summary.touch()
        for tasks in args.tasks:
            status = run_backends(__file__, "taskflow-big-board-", args.postgres, args.pg_url,
                                  ["--tasks", str(tasks), "--repeat", str(args.repeat), "--summary", str(summary)],
                                  folder=args.dir) or status
        if len(args.tasks) > 1:
            print_summary([json.loads(line) for line in summary.read_text().splitlines()])
    return status

if __name__ == "__main__":
    sys.exit(main())
