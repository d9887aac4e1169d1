"""The agents and throughput panel's computation on a board with a busy last hour (issue 31).

What is measured
----------------
A fresh SQLite board is filled by bench/board.py's `fill_board` (--tasks, default 100,000: each
task created, many claimed, paused, completed or cancelled through the engine's verbs, so the
last hour's history holds every one of those rows). Then, in this process:

- **first computation**: `board.live.insights.Insights().compute()`, what a server process's
  tailer runs for its first socket: the hour's history, the held and queued tasks, the usage,
  and the wait and run times per queue (`board.engine.timing.queue_timings`);
- **later computation**: the same object again (the timing figures are reused for 15 s, so this
  is the part the tailer repeats when something changed);
- **queue timings** alone;
- **baseline**: a plain `SELECT` with the database driver of the rows the computation's main read
  returns (the window's history but renews: id, task, verb, stages, actor, time), fetched into
  tuples on a connection opened beforehand. The ratio ours/baseline says what the layer costs
  on top of reading the rows.

Printed beside them: how often the tailer recomputes the panel at that cost
(board.live.tailer: at most every INSIGHTS_MIN_INTERVAL_SECONDS, and at most INSIGHTS_DUTY of
the time).

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/insights.py                 # 100,000 tasks
    .venv/bin/python bench/insights.py --tasks 20000 --repeat 3
"""
from __future__ import annotations

import argparse
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench.board import fill_board, migrate_and_login, setup_django  # noqa: E402
from bench.queues_strip import timed  # noqa: E402  (seconds of each of `repeat` calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks on the board (default 100,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (default 3)")
    parser.add_argument("--dir", default=None, help="where the temporary SQLite file goes")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="taskflow-bench-insights-", dir=args.dir) as tmp:
        path = Path(tmp) / "board.sqlite3"
        setup_django(f"sqlite:///{path}", secrets.token_urlsafe(50))
        migrate_and_login()
        started = time.perf_counter()
        fill_board(args.tasks)
        print(f"bench/insights.py: {args.tasks:,} tasks written through the engine's verbs in "
              f"{time.perf_counter() - started:.0f} s (SQLite, {path})")

        from board.engine import clock, timing
        from board.engine.lifecycle import Verb
        from board.live import insights, tailer
        from board.models import TaskEvent

        now = clock.now()
        start = insights.window_start(now)
        rows = TaskEvent.objects.filter(at__gte=start).exclude(verb=Verb.RENEW).count()
        print(f"history rows in the last hour (renews left out): {rows:,}")

        first = timed(lambda: insights.Insights().compute(), 1)[0]
        kept = insights.Insights()
        kept.compute()
        later = timed(kept.compute, args.repeat)
        timings = timed(timing.queue_timings, args.repeat)

        table = TaskEvent._meta.db_table
        connection = sqlite3.connect(path)
        statement = (f"SELECT id, task_id, verb, from_stage, to_stage, actor, at FROM {table} "
                     f"WHERE at >= ? AND verb != ? ORDER BY id")
        stamp = start.strftime("%Y-%m-%d %H:%M:%S")
        baseline = timed(lambda: connection.execute(statement, (stamp, Verb.RENEW.value)).fetchall(), args.repeat)
        connection.close()

        best_base = min(baseline)
        print(f"\n  {'':<22} {'best s':>8} {'median s':>9} {'raw SELECT':>10} {'ratio':>6}")
        print(f"  {'first computation':<22} {first:8.3f} {first:9.3f} {best_base:10.3f} {first / best_base:6.1f}")
        print(f"  {'later computation':<22} {min(later):8.3f} {statistics.median(later):9.3f} {best_base:10.3f} "
              f"{statistics.median(later) / best_base:6.1f}")
        print(f"  {'queue timings':<22} {min(timings):8.3f} {statistics.median(timings):9.3f}")
        gap = max(tailer.INSIGHTS_MIN_INTERVAL_SECONDS, statistics.median(later) / tailer.INSIGHTS_DUTY)
        print(f"\n(raw SELECT: the window's history rows but renews, by the sqlite3 driver, best of {args.repeat}.)"
              f"\nAt this cost a server process's tailer recomputes the panel at most every {gap:.1f} s "
              f"(INSIGHTS_MIN_INTERVAL_SECONDS {tailer.INSIGHTS_MIN_INTERVAL_SECONDS:g} s, INSIGHTS_DUTY "
              f"{tailer.INSIGHTS_DUTY:g}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
