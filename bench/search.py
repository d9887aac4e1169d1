"""Search at 100,000 tasks (issue 33, item 2): a tag and a payload path, through the search line
(board.engine.search, as GET /api/tasks?search= and the all-tasks table run it), against the
plain SQL that answers the same question, in the same run.

What is measured
----------------
The board of bench/big_board.py (`fill_board`: N tasks, default 100,000, in its mix of stages, 1 KB
payloads), then every task gets tags and a payload `repo` with plain SQL: 1 in 100 carries the tag
`urgent` (the others `batch`), and the repos are `acme/0` .. `acme/499` (200 tasks each). Then
ANALYZE, and for each search line, `--repeat` times (best and median printed):

- **page**: `listing.task_list(search=LINE, order="newest", count=100)`: the first page of the
  all-tasks table or the API (the ORM, the search's filter, the models built);
- **count**: `listing.count_tasks(...)`: the exact count the table and the board show;
- **baseline**: the same two questions in plain SQL with the driver (PostgreSQL: `tags @> '["urgent"]'`,
  `payload @> '{"repo": "acme/7"}'`, the GIN indexes' containment; SQLite: the same LIKE / json_extract
  the ORM sends), rows fetched into tuples.

The goal (issue 33): a tag or payload-path search answers in under 100 ms on PostgreSQL at 100,000
tasks. SQLite has no index for either (it scans; printed for reference). With `--explain`, the
PostgreSQL plans are printed too.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/search.py                  # PostgreSQL (taskflow_bench), 100,000 tasks
    .venv/bin/python bench/search.py --sqlite         # and SQLite
    .venv/bin/python bench/search.py --tasks 20000 --repeat 5 --explain

Figures are printed from this run's measurements only; on a shared machine compare the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench.big_board import DEFAULT_PG_URL, configure_django, ensure_postgres_database, prepare, timed  # noqa: E402

GOAL_MS = 100.0
LINES = ("tag:urgent", "payload.repo:acme/7", "tag:urgent stage:completed")
# The plain SQL of each line: (page, count), per backend.
BASELINE = {
    "postgresql": {
        "tag:urgent": "tags @> '[\"urgent\"]'",
        "payload.repo:acme/7": "payload @> '{\"repo\": \"acme/7\"}'",
        "tag:urgent stage:completed": "tags @> '[\"urgent\"]' AND stage = 'COMPLETED'",
    },
    "sqlite": {
        "tag:urgent": "CAST(tags AS text) LIKE '%\"urgent\"%'",
        "payload.repo:acme/7": "json_extract(payload, '$.repo') = 'acme/7'",
        "tag:urgent stage:completed": "CAST(tags AS text) LIKE '%\"urgent\"%' AND stage = 'COMPLETED'",
    },
}
TAG_EVERY = 100
REPOS = 500


def label(database_url: str, vendor: str) -> None:
    """Tags and repos on every task, in one statement each (not timed)."""
    from django.db import connections

    with connections["default"].cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                "UPDATE board_task SET tags = CASE WHEN abs(hashtext(id)) %% %s = 0 THEN '[\"urgent\"]'::jsonb"
                " ELSE '[\"batch\"]'::jsonb END,"
                " payload = coalesce(payload, '{}'::jsonb) || jsonb_build_object('repo', 'acme/' || (abs(hashtext(id)) %% %s))",
                [TAG_EVERY, REPOS])
            cursor.execute("ANALYZE board_task")
        else:
            rows = cursor.execute("SELECT id FROM board_task").fetchall()
            import hashlib
            import json

            updates = []
            for (task_id,) in rows:
                n = int.from_bytes(hashlib.sha1(task_id.encode()).digest()[:4], "big")
                updates.append((json.dumps(["urgent"] if n % TAG_EVERY == 0 else ["batch"]), f"acme/{n % REPOS}", task_id))
            cursor.executemany("UPDATE board_task SET tags = %s, payload = json_set(coalesce(payload, '{}'), '$.repo', %s)"
                               " WHERE id = %s", updates)
            cursor.execute("ANALYZE")


def ms(times: list[float]) -> str:
    return f"{min(times) * 1000:8.1f} {statistics.median(times) * 1000:8.1f}"


def measure(backend: str, database_url: str, args: argparse.Namespace) -> None:
    configure_django(database_url)
    from django.db import connections

    from board.engine import listing

    counts, fill_seconds = prepare(database_url, args.tasks)
    vendor = connections["default"].vendor
    label(database_url, vendor)
    print(f"\n{backend}: {args.tasks:,} tasks written in {fill_seconds:.1f} s, tagged 1 in {TAG_EVERY} "
          f"'urgent', payload repo acme/0..{REPOS - 1}")
    print(f"{'search line':30} {'what':9} {'rows':>6}  {'best ms':>8} {'median':>8}  "
          f"{'base best':>9} {'median':>8}  {'ours/base':>9}  goal < {GOAL_MS:.0f} ms")
    cursor = connections["default"].cursor()

    def fetch(sql: str) -> list:
        cursor.execute(sql)
        return cursor.fetchall()

    for line in LINES:
        where = BASELINE[vendor][line]
        page_sql = f"SELECT id FROM board_task WHERE {where} ORDER BY created_at DESC, id DESC LIMIT 100"
        count_sql = f"SELECT count(*) FROM board_task WHERE {where}"
        if vendor == "sqlite":  # Django's cursor takes %s placeholders: none here, but % must be doubled
            page_sql, count_sql = page_sql.replace("%", "%%"), count_sql.replace("%", "%%")
        for what, ours, base in (
            ("page", lambda: listing.task_list(search=line, order="newest", count=100),
             lambda: fetch(page_sql)),
            ("count", lambda: listing.count_tasks(listing.check_filters(search=line)),
             lambda: fetch(count_sql)),
        ):
            ours_times, result = timed(ours, args.repeat)
            base_times, base_rows = timed(base, args.repeat)
            rows = len(result) if what == "page" else result
            expected = len(base_rows) if what == "page" else base_rows[0][0]
            check = "" if rows == expected else f"  MISMATCH: baseline {expected}"
            ratio = statistics.median(ours_times) / statistics.median(base_times)
            met = "met" if statistics.median(ours_times) * 1000 < GOAL_MS else "NOT met"
            print(f"{line:30} {what:9} {rows:6}  {ms(ours_times)}  {ms(base_times):>18}  {ratio:9.2f}  "
                  f"{met if vendor == 'postgresql' else '(SQLite scans)'}{check}")
        if args.explain and vendor == "postgresql":
            print("    " + "\n    ".join(row[0] for row in fetch("EXPLAIN " + page_sql)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--sqlite", action="store_true", help="also measure SQLite (a temporary file)")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--explain", action="store_true", help="print PostgreSQL's plan of each page query")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend:  # one backend, in this process
        measure(args.backend, args.url, args)
        return 0
    options = ["--tasks", str(args.tasks), "--repeat", str(args.repeat)] + (["--explain"] if args.explain else [])
    runs = []
    if args.sqlite:
        runs.append(("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='taskflow-search-')}/bench.sqlite3"))
    if not args.no_postgres:
        why = ensure_postgres_database(args.pg_url)
        if why:
            print(f"PostgreSQL NOT RUN: {why}")
        else:
            runs.append(("postgresql", args.pg_url))
    for backend, url in runs:  # each in a process of its own: one Django setup per database
        subprocess.run([sys.executable, __file__, "--backend", backend, "--url", url, *options], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
