"""A bulk job at 50,000 tasks on PostgreSQL with agents working beside it (issue 33, item 1).

What is measured
----------------
The board holds N tasks (default 50,000) in queues ci-0 .. ci-9, the job's target, and W tasks
(default 100,000: the agents must not run out) in the queue `work`. Three kinds of threads, each with its own connection:

- **agents** (default 4): claim_next + complete on the queue `work`, as fast as they can: the
  claims/s the board gives its agents;
- **racer** (1): claim_next + complete on the ci-* queues (one after the other): an agent working
  on the very tasks the job acts on, so that the job loses races for real;
- **watcher** (1): what an open board reads, every second (as the page asks again): the board filter's counts for
  `queue:ci-*` (listing.stage_counts, as GET /board/filter) and the queues strip
  (frames.queues_message): its latency says whether the board stays live.

The crew runs in a process of its own (agents are other processes; the job runs in the server's),
the job in this one. Two phases in one run, the same threads:

1. **without the job**, for --seconds once every crew thread is connected: the agents' claims/s,
   the watcher's latencies;
2. **with the job** (then 3. without it again, --seconds: the machine's load moves): `cancel` on `{"queue": "ci-*"}` created (its ids and versions read at once)
   and run by board.bulk.jobs.run in its own thread, exactly as the server's thread runs it; the
   agents, racer and watcher keep going until it ends. Printed: the job's tasks/s (create: the
   read of the ids; run: the moves), its done / skipped / lost, the agents' claims/s during it.

Then the run checks what it must: done + skipped + lost == total; every task the job did not move
was changed by the racer (a claim) after the job read it, so `lost` equals the job's tasks the
racer claimed (no lost update: none of them was cancelled over its claim), and every job task the
racer did not claim is CANCELLED by the job; check() finds no problem. A failed check makes the
script exit with status 1.

JIT: by default the bench database runs with PostgreSQL's JIT off (`--jit on` to keep the
server's setting). On this board the planner costs the claim's statement (claim_next's `picked`
CTE, with its hashed subplans for keys, rate keys and resources) above `jit_above_cost`, so with
JIT on each claim compiles it: about 0.7 s of JIT for 0.2 ms of execution (EXPLAIN ANALYZE on
2026-12-05), which makes the agents' claims/s measure the compiler, not the board or the job.

Database: `taskflow_bench_bulk` on 127.0.0.1:5432 (user postgres; --pg-url for another), created
when missing, migrated, its board tables emptied first. With --sqlite, a fresh SQLite file too.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/bulk.py                       # 50,000 + 100,000 tasks, PostgreSQL
    .venv/bin/python bench/bulk.py --tasks 5000 --work 10000 --seconds 3

Figures are printed from this run's measurements only; on a shared machine compare the ratios
(claims/s with the job / without it) within one run.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench.big_board import configure_django, ensure_postgres_database  # noqa: E402

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench_bulk"
CI_QUEUES = [f"ci-{n}" for n in range(10)]
TABLES = ("board_bulkjob", "board_taskevent", "board_dependency", "board_task", "board_queue",
          "board_concurrencykey", "board_queuechange", "board_removedtask")


def prepare(tasks: int, work: int) -> float:
    from django.core.management import call_command
    from django.db import connection

    from board.engine import transitions
    from board.engine.transitions import TaskSpec

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
    started = time.perf_counter()
    for start in range(0, tasks, 1000):
        transitions.create([TaskSpec(id=f"ci-{i:06d}", title=f"build {i}", queue=CI_QUEUES[i % 10])
                            for i in range(start, min(tasks, start + 1000))])
    for start in range(0, work, 1000):
        transitions.create([TaskSpec(id=f"w-{i:06d}", title=f"work {i}", queue="work")
                            for i in range(start, min(work, start + 1000))])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE board_task, board_taskevent")
    return time.perf_counter() - started


PHASES = ("without", "with", "after")


class Crew:
    """The agents, the racer and the watcher, in a process of their own (as agents are: the job
    runs in a server's process), counting per phase (`phase`: a shared index into PHASES)."""

    def __init__(self, agents: int, phase, stop, ready):
        self.phase, self.stop, self.ready = phase, stop, ready
        self.started = threading.Barrier(agents + 2, action=ready.set)  # every thread connected: ready
        self.lock = threading.Lock()
        self.claims = {name: 0 for name in PHASES}
        self.racer_claims = {name: 0 for name in PHASES}
        self.reads = {name: [] for name in PHASES}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.agent, args=(f"agent-{n}",)) for n in range(agents)]
        self.threads += [threading.Thread(target=self.racer), threading.Thread(target=self.watcher)]

    def now(self) -> str:
        return PHASES[self.phase.value]

    def run(self) -> dict:
        for thread in self.threads:
            thread.start()
        for thread in self.threads:
            thread.join()
        return {"claims": self.claims, "racer_claims": self.racer_claims, "reads": self.reads,
                "errors": self.errors[:5], "error_count": len(self.errors)}

    def _guard(self, work):
        from django.db import connections

        from board.engine import errors
        try:
            connections["default"].ensure_connection()
            self.started.wait()
            while not self.stop.is_set():
                try:
                    work()
                except errors.BoardError as exc:  # a claim refused or a lease lost: reported
                    with self.lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connections["default"].close()

    def agent(self, name: str):
        from board.engine import transitions

        def work():
            claim = transitions.claim_next(name, 60, queue="work")
            if claim is None:
                time.sleep(0.05)
                return
            transitions.complete(claim.task.pk, claim.lease.token, {"ok": True})
            with self.lock:
                self.claims[self.now()] += 1
        self._guard(work)

    def racer(self):
        from board.engine import transitions
        turn = [0]

        def work():
            queue = CI_QUEUES[turn[0] % 10]
            turn[0] += 1
            claim = transitions.claim_next("racer", 60, queue=queue)
            if claim is None:
                time.sleep(0.01)
                return
            transitions.complete(claim.task.pk, claim.lease.token, {"ok": True})
            with self.lock:
                self.racer_claims[self.now()] += 1
        self._guard(work)

    def watcher(self):
        from board.engine import listing
        from board.live import frames
        filters = listing.check_filters(search="queue:ci-*")

        def work():
            started = time.perf_counter()
            listing.stage_counts(filters)
            frames.queues_message()
            with self.lock:
                self.reads[self.now()].append(time.perf_counter() - started)
            time.sleep(1.0)  # the board asks again at most every second (static/board/view.js REFRESH_MS)
        self._guard(work)


def crew_process(pg_url: str, agents: int, phase, stop, ready, results) -> None:
    sys.path.insert(0, str(PROJECT))
    configure_django(pg_url)
    results.put(Crew(agents, phase, stop, ready).run())


def set_jit(url: str, jit: str) -> None:
    """JIT on or off for every new connection to the bench database (this script's own)."""
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        statement = "ALTER DATABASE {} SET jit = off" if jit == "off" else "ALTER DATABASE {} RESET jit"
        conn.execute(sql.SQL(statement).format(sql.Identifier(name)))
    print(f"PostgreSQL JIT {jit} for {name}")


def ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50_000, help="tasks in the job's queues (default %(default)s)")
    parser.add_argument("--work", type=int, default=100_000,
                        help="tasks in the agents' queue, enough for all three phases (default %(default)s)")
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="the phase without the job (default %(default)s)")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--jit", choices=("off", "on"), default="off",
                        help="PostgreSQL's JIT for the bench database (default %(default)s: see the docstring)")
    args = parser.parse_args(argv)

    why = ensure_postgres_database(args.pg_url)
    if why:
        print(f"PostgreSQL not reached ({args.pg_url}): {why}")
        return 1
    set_jit(args.pg_url, args.jit)
    configure_django(args.pg_url)
    from board.bulk import jobs
    from board.engine import selectors
    from board.models import BulkJob, Task, TaskEvent

    print(f"seeding {args.tasks:,} tasks in ci-0..ci-9 and {args.work:,} in work (PostgreSQL) ...", flush=True)
    seeded = prepare(args.tasks, args.work)
    print(f"seeded in {seeded:.1f} s", flush=True)

    context = multiprocessing.get_context("spawn")
    phase, stop, ready, results = context.Value("i", 0), context.Event(), context.Event(), context.Queue()
    crew = context.Process(target=crew_process, args=(args.pg_url, args.agents, phase, stop, ready, results))
    crew.start()
    if not ready.wait(timeout=300):  # the crew's Django started and every thread connected
        print("the crew did not start")
        return 1
    phase_started = time.perf_counter()
    time.sleep(args.seconds)  # phase 1: the agents alone (a fixed time; nothing asserted on it)
    without_seconds = time.perf_counter() - phase_started

    phase.value = 1
    started = time.perf_counter()
    request = jobs.check_request({"queue": "ci-*"}, "cancel", "bench")
    job = jobs.create(request, actor="bench")
    created = time.perf_counter() - started
    items = {task_id: version for task_id, version in BulkJob.objects.get(pk=job.pk).items}
    run_started = time.perf_counter()
    jobs.run(job.pk)  # as the server's thread runs it (this process: the server's)
    ran = time.perf_counter() - run_started
    phase.value = 2
    time.sleep(args.seconds)  # phase 3: the agents alone again (the machine's load moves)
    after_seconds = time.perf_counter() - run_started - ran
    stop.set()
    report = results.get(timeout=120)
    crew.join(timeout=60)

    job = jobs.get(job.pk)
    by_job = set(TaskEvent.objects.filter(actor=f"bench (bulk {job.pk})").values_list("task_id", flat=True))
    cancelled = set(Task.objects.filter(pk__in=list(items), stage="CANCELLED").values_list("pk", flat=True))
    # The job's tasks it did not move: each was changed by the racer after the job read it.
    left = set(items) - by_job
    changed_by_racer = {task_id for task_id, version in TaskEvent.objects.filter(
        actor="racer", task_id__in=list(left)).values_list("task_id", "version") if version > items[task_id]}
    problems = selectors.problems()
    reads = report["reads"]

    claims_after = report["claims"]["after"] / after_seconds
    claims_without = report["claims"]["without"] / without_seconds
    claims_with = report["claims"]["with"] / ran if ran else 0.0
    print()
    print(f"job: cancel {job.total:,} tasks (queue:ci-*, {job.matching:,} matching) -> {job.state}")
    print(f"  create (read ids and versions, insert the row): {created * 1000:.0f} ms")
    print(f"  run: {ran:.1f} s = {job.total / ran:,.0f} tasks/s  "
          f"(done {job.done:,}, skipped {job.skipped:,} {job.skipped_reasons or ''}, lost {job.lost:,}; "
          f"check() after: {job.problems} problems)")
    baseline = (report["claims"]["without"] + report["claims"]["after"]) / (without_seconds + after_seconds)
    print(f"agents on `work` ({args.agents} threads, another process), claim+complete/s: {claims_without:,.1f} before "
          f"the job ({without_seconds:.0f} s), {claims_with:,.1f} during it ({ran:.0f} s), {claims_after:,.1f} after it "
          f"({after_seconds:.0f} s); during / without = {claims_with / baseline if baseline else 0:.2f}")
    print(f"racer on ci-*: {report['racer_claims']['without']:,} claims before the job, "
          f"{report['racer_claims']['with']:,} while it ran; {len(changed_by_racer):,} of the job's tasks changed by it")
    reads["without"] = reads["without"] + reads["after"]
    print(f"board reads every second (filter counts for queue:ci-* + queues strip), p50 / p95 / max ms: "
          f"without {ms(reads['without'], .5)} / {ms(reads['without'], .95)} / {ms(reads['without'], 1)}  "
          f"with {ms(reads['with'], .5)} / {ms(reads['with'], .95)} / {ms(reads['with'], 1)}  "
          f"({len(reads['with'])} reads during the job)")
    print(f"agent errors: {report['error_count']} {report['errors']}")
    left_for_agents = Task.objects.filter(queue="work", stage="QUEUED").count()
    if not left_for_agents:
        print("WARNING: the agents' queue ran dry: their figures are low; run again with a larger --work")

    failures = []
    if job.state != "done" or job.done + job.skipped + job.lost != job.total:
        failures.append(f"counts do not add up: {job.done} + {job.skipped} + {job.lost} != {job.total}")
    if by_job != cancelled or len(by_job) != job.done:
        failures.append(f"the job's moves ({len(by_job)}) are not the cancelled tasks ({len(cancelled)}) / done")
    if left != changed_by_racer or job.lost != len(left):
        failures.append(f"lost {job.lost}; {len(left)} tasks not moved, {len(changed_by_racer)} of them changed by the racer")
    if problems:
        failures.append(f"check(): {len(problems)} problems, e.g. {problems[0]}")
    if report["error_count"]:
        failures.append(f"agent errors, e.g. {report['errors'][0]}")
    print("no lost update: every task moved by the job or by the racer, never both; check() clean"
          if not failures else "FAILED:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
