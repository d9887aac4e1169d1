"""The live board's queues strip at 100,000 tasks: what the tailer reads for each "queues" frame,
against a plain SQL GROUP BY.

What is measured
----------------
A board of N tasks (default 100,000) over Q queues (default 50) is written once per backend, then,
in the same process:

- **queues**: `board.live.frames.queue_items()`, the strip's rows (board.engine.selectors
  .queue_overview: every queue's settings, tasks per stage and oldest QUEUED age, one read).
- **keys**: `board.engine.selectors.key_overview(KEYS_SHOWN)`, the concurrency keys the frame
  carries (full ones first, then the others RUNNING tasks name, at most 50, and how many more),
  read from the keys' own rows.
- **frame**: `board.live.frames.queues_message()` encoded: both, as the tailer does after a
  commit (at most twice a second while commits come, and every 2 s).
- **baseline**: the plain driver, in one read transaction, fetching the same figures into
  Python tuples: `SELECT queue, stage, COUNT(*) FROM board_task WHERE stage IN (the unfinished
  stages) GROUP BY queue, stage`, the
  oldest QUEUED per queue (`MIN(stage_changed_at) ... GROUP BY queue`) and the queue rows; for
  the keys, the same three reads of the key rows (full, the others with running tasks, their
  count). The depths are counted over the unfinished tasks only, as the strip's read does;
  printed beside: the same GROUP BY over every stage (what GET /api/queues reads). The ratio ours/baseline is what the layer costs on top of the database's own work; the
  baseline's time is what any strip that shows per-queue depths pays at this size.

The mix: bench/big_board.py's stages (per 100: 67 COMPLETED, 12 QUEUED, 15 PENDING, 2 RUNNING,
1 PAUSED, 2 FAILED, 1 CANCELLED), queue i % Q; one task in five names one of 500 concurrency keys
(limit 2; the RUNNING ones counted on the key rows, so some are full); queue rows for every queue:
10 with a limit (running counted), 5 with a rate, 3 paused.

`--profile` prints, per backend, cProfile's top functions of one `queues_message()` (what to look
at before optimising anything).

Databases: SQLite, a fresh file in a temporary directory, configured like the project's default;
PostgreSQL (`--postgres`): the database ``taskflow_bench_queues`` on 127.0.0.1:5432 (user
postgres), created when missing and migrated, its board tables emptied before the fill. Each
backend runs in a process of its own.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/queues_strip.py --postgres
    .venv/bin/python bench/queues_strip.py --tasks 20000 --queues 30 --profile

Figures are this run's only; on a shared machine compare the ratios.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench.big_board import MIX, configure_django, raw_connection, run_backends  # noqa: E402

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench_queues"
FILL_BATCH = 5000
KEYS = 500
LIVE = ("PENDING", "QUEUED", "RUNNING", "PAUSED")


def fill(count: int, queues: int) -> dict:
    """Write the board (see the module docstring), in bulk, with consistent running counts."""
    from django.db import connections, transaction

    from board.engine import fairness, flow
    from board.engine.stores import store
    from board.models import ConcurrencyKey, Queue, QueueShard, Task

    now = datetime.now(timezone.utc)
    running_by_queue: dict[str, int] = {}
    running_by_key: dict[str, int] = {}
    counts: dict[str, int] = {}
    with transaction.atomic():
        for start in range(0, count, FILL_BATCH):
            rows = []
            for i in range(start, min(count, start + FILL_BATCH)):
                stage = MIX[(i * 37) % len(MIX)]
                queue = f"queue-{i % queues:02d}"
                key = f"repo:org/r{i % KEYS:03d}" if i % 5 == 0 else None
                counts[stage] = counts.get(stage, 0) + 1
                if stage == "RUNNING":
                    running_by_queue[queue] = running_by_queue.get(queue, 0) + 1
                    if key:
                        running_by_key[key] = running_by_key.get(key, 0) + 1
                when = now - timedelta(seconds=count - i)
                rows.append(Task(id=f"task-{i:06d}", title=f"task {i}", queue=queue, priority=i % 4, stage=stage,
                                 version=1, concurrency_key=key, created_at=when, updated_at=when,
                                 stage_changed_at=when, owner=f"agent-{i % 50}" if stage == "RUNNING" else "",
                                 lease_expires_at=now + timedelta(hours=1) if stage == "RUNNING" else None,
                                 claim_rank=fairness.rank(when.timestamp(), i % 4)))
            Task.objects.bulk_create(rows)
        names = [f"queue-{n:02d}" for n in range(queues)]
        queue_rows = [Queue(
            name=name, concurrency=(running_by_queue.get(name, 0) + n % 3) or 1 if n < 10 else None,
            rate_count=60 if 10 <= n < 15 else None, rate_per_seconds=60 if 10 <= n < 15 else None,
            paused=15 <= n < 18, paused_by="op" if 15 <= n < 18 else "", paused_at=now if 15 <= n < 18 else None,
            updated_at=now) for n, name in enumerate(names)]
        Queue.objects.bulk_create(queue_rows)
        shards = store("default").queue_shards
        QueueShard.objects.bulk_create([
            *(shard for q in queue_rows for shard in flow.limit_shards(
                q.name, q.concurrency, running_by_queue.get(q.name, 0), shards)),
            *(shard for q in queue_rows if q.rate_count
              for shard in flow.rate_shards(q.name, (q.rate_count, q.rate_per_seconds), shards))])
        # Each rated queue as if a claim had just moved its rate.
        QueueShard.objects.filter(kind=QueueShard.RATE).update(open_at=now.timestamp())
        ConcurrencyKey.objects.bulk_create([ConcurrencyKey(
            name=f"repo:org/r{k:03d}", concurrency=2, running=running_by_key.get(f"repo:org/r{k:03d}", 0),
            updated_at=now) for k in range(KEYS)])
    if connections["default"].vendor == "postgresql":
        with connections["default"].cursor() as cursor:  # as autovacuum leaves a board that stood a while
            cursor.execute("VACUUM ANALYZE board_task, board_queue, board_queueshard, board_concurrencykey")
    return counts


def prepare(tasks: int, queues: int) -> tuple[dict, float]:
    from django.core.management import call_command
    from django.db import connections, transaction

    call_command("migrate", verbosity=0)
    with transaction.atomic(), connections["default"].cursor() as cursor:
        for table in ("board_taskevent", "board_dependency", "board_task", "board_queue", "board_concurrencykey",
                      "board_queuechange"):
            cursor.execute(f"DELETE FROM {table}")
    started = time.perf_counter()
    counts = fill(tasks, queues)
    return counts, time.perf_counter() - started


_LIVE_SQL = ", ".join(f"'{s}'" for s in LIVE)
# The strip counts only the unfinished tasks (queue_overview(live_only=True): it shows no
# finished count), as this does.
QUEUES_BASELINE = [
    f"SELECT queue, stage, COUNT(*) FROM board_task WHERE stage IN ({_LIVE_SQL}) GROUP BY queue, stage",
    "SELECT queue, MIN(stage_changed_at) FROM board_task WHERE stage = 'QUEUED' GROUP BY queue",
    "SELECT * FROM board_queue",
]
# What counting every stage would read (GET /api/queues does, for its depth of each stage):
# printed beside, not timed as ours.
QUEUES_EVERY_STAGE = [
    "SELECT queue, stage, COUNT(*) FROM board_task GROUP BY queue, stage",
    QUEUES_BASELINE[1], QUEUES_BASELINE[2],
]
KEYS_BASELINE = [
    "SELECT name, concurrency, running FROM board_concurrencykey WHERE running >= concurrency AND running > 0"
    " ORDER BY name LIMIT 50",
    "SELECT name, concurrency, running FROM board_concurrencykey WHERE running < concurrency AND running > 0"
    " ORDER BY name LIMIT 50",
    "SELECT COUNT(*) FROM board_concurrencykey WHERE running > 0",
]


def raw_read(database_url: str, statements: list[str]):
    conn = raw_connection(database_url)
    try:
        conn.execute("BEGIN")
        rows = [conn.execute(sql).fetchall() for sql in statements]
        conn.execute("COMMIT")
        return rows
    finally:
        conn.close()


def timed(call, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def measure(backend: str, database_url: str, args: argparse.Namespace) -> None:
    configure_django(database_url)
    from board.engine import selectors
    from board.live import frames

    counts, fill_seconds = prepare(args.tasks, args.queues)
    print(f"{backend}: {args.tasks:,} tasks over {args.queues} queues written in {fill_seconds:.1f} s "
          f"({', '.join(f'{stage} {n:,}' for stage, n in sorted(counts.items()))})")
    # A first call of each, untimed: connections opened, statements prepared.
    message = frames.queues_message()
    raw_read(database_url, QUEUES_BASELINE + KEYS_BASELINE)
    rows = [
        ("queues", timed(frames.queue_items, args.repeat), timed(lambda: raw_read(database_url, QUEUES_BASELINE),
                                                                 args.repeat)),
        ("keys", timed(lambda: selectors.key_overview(frames.KEYS_SHOWN), args.repeat),
         timed(lambda: raw_read(database_url, KEYS_BASELINE), args.repeat)),
        ("frame", timed(lambda: frames.queues_frame(frames.queues_message()), args.repeat),
         timed(lambda: raw_read(database_url, QUEUES_BASELINE + KEYS_BASELINE), args.repeat)),
    ]
    every_stage = min(timed(lambda: raw_read(database_url, QUEUES_EVERY_STAGE), args.repeat))
    print(f"  {'':<8} {'best ms':>9} {'median ms':>10} {'raw ms':>8} {'ratio':>7}")
    for what, ours, base in rows:
        median = statistics.median(ours)
        print(f"  {what:<8} {min(ours) * 1000:9.1f} {median * 1000:10.1f} {min(base) * 1000:8.1f} "
              f"{median / min(base):7.2f}")
    print(f"  raw GROUP BY of every stage (what GET /api/queues counts; the strip does not): "
          f"{every_stage * 1000:.1f} ms")
    size = len(frames.queues_frame(message))
    print(f"  the frame: {len(message['queues'])} queues (+{message['more_queues']}), {len(message['keys'])} keys "
          f"(+{message['more_keys']}), {size / 1024:.1f} KiB")
    print(f"  (median of {args.repeat} runs; raw = the best plain-driver read of the same figures; "
          "ratio = median / raw)")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        frames.queues_message()
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(12)
        print("  cProfile of one queues_message(), by own time:")
        for line in out.getvalue().splitlines():
            if line.strip():
                print("   ", line[:150])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each read (default 7)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL too")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--profile", action="store_true", help="cProfile one frame per backend")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend:
        measure(args.backend, args.database_url, args)
        return 0
    print(f"bench/queues_strip.py: {args.tasks:,} tasks, {args.queues} queues, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} cores")
    return run_backends(__file__, "taskflow-queues-strip-", args.postgres, args.pg_url,
                        ["--tasks", str(args.tasks), "--queues", str(args.queues), "--repeat", str(args.repeat)]
                        + (["--profile"] if args.profile else []))


if __name__ == "__main__":
    sys.exit(main())
