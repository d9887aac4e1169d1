"""Working agents beside many idle ones: do waiting claims cost the others anything?

On PostgreSQL, against the board's real server (``manage.py serve``, default workers unless
``--workers``), the script measures the claim->complete rate of 8 working agents alone, then
again while 200 idle agents hold waiting claims on a queue that never gets work.

What is measured
----------------
1. A fresh bench database (``taskflow_bench_idle`` on the local PostgreSQL, created when
   missing, board tables emptied, migrated: bench/claims.py's helpers), one API key per working
   agent plus one shared by the idle agents (all revoked at the end), and the server started as
   bench/http_claims.py starts it (``Server``: DEBUG off, no reaper) and warmed up.
2. **Alone**: QUEUED tasks seeded by the engine, then ``--agents`` (8) working agent processes
   (bench/http_agent.py, one keep-alive connection each) loop ``POST /api/claim`` +
   ``POST /api/tasks/{id}/complete`` for ``--seconds``, released together (http_claims's
   ``run_agents``): cycles/s, p50/p99 per request, double claims, and the database must hold
   exactly the counted cycles as COMPLETED tasks.
3. ``--idle`` (200) idle agents start: threads spread over ``--idle-processes`` (2) processes,
   each thread with its own keep-alive connection (stdlib http.client), looping
   ``POST /api/claim {"ttl_seconds": 60, "queue": "idle", "wait_seconds": 30}`` on the queue
   ``idle``, which never gets a task. The script waits (bounded) until every one of them has a
   request in flight (counted on the agent side), plus a second to settle: then they are all
   parked in the server, which holds no thread and no database connection for them.
4. **With the idle agents waiting**: the same working run again (fresh seed).
5. The idle agents are told to stop; each finishes the request it has in flight, which ends
   when its wait is over (up to ``--wait-seconds``). Every idle request must have ended with
   204 (no work) — a 200 (work from a queue that has none), any other status (a 5xx above
   all), a connection error or a thread that does not finish is a failure; 503s (the server's
   ``TASKFLOW_MAX_WAITERS`` cap) are counted apart: there must be none at the default cap.

During both working runs a thread of this process samples PostgreSQL every
``--sample-interval`` seconds (default 0.1) on its own connection (excluded):
``pg_stat_activity`` rows of the bench database that are not idle (connections in use: a query
or a transaction running) and all of them (connections open), and prints the maximum of each
beside the pool capacity: DATABASE_POOL_MAX (default TASKFLOW_HTTP_THREADS + 4, see
taskflow_site/settings.py) per process x worker processes. The script's own Django connection
(and its pool) is closed before each run.

Goals (the issue): rate with the idle agents waiting >= 0.8 x the rate alone; no failed idle
request; connections in use under the pool capacity. Missing the rate goal is reported, not an
error; a failed request (idle or working), a double claim or a database that does not match
the counted cycles makes the script exit with status 1.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/idle_agents.py                   # 8 working agents, 200 idle, 5 s runs
    .venv/bin/python bench/idle_agents.py --idle 500 --seconds 3
    .venv/bin/python bench/idle_agents.py --wait-seconds 10 # shorter waits: a faster end
    .venv/bin/python bench/idle_agents.py --py-spy /tmp/prof

Figures are printed from this run's measurements only; compare ratios within one run.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import claims  # noqa: E402  (Django setup, the bench database)
import http_agent  # noqa: E402  (the agents, working and idle)
import http_claims  # noqa: E402  (the server, running N agent processes, CPU accounting)

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench_idle"
ALIAS = claims.ALIASES["postgres"]
IDLE_QUEUE = "idle"  # no task is ever created in it
GOAL_RATIO = 0.8  # rate with the idle agents waiting over the rate alone
PARK_TIMEOUT = 60.0  # seconds for every idle agent to have its claim in flight


# ---------------------------------------------------------------------------------------------
# PostgreSQL connections, sampled from this process


@dataclass
class Connections:
    samples: int = 0
    max_in_use: int = 0  # pg_stat_activity rows of the bench database not 'idle'
    max_open: int = 0  # all its rows
    error: str | None = None


class ConnectionSampler:
    """A thread sampling pg_stat_activity for one database on its own connection (excluded)."""

    QUERY = ("SELECT count(*) FILTER (WHERE state IS DISTINCT FROM 'idle'), count(*) "
             "FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()")

    def __init__(self, url: str, database: str, interval: float):
        self.url, self.database, self.interval = url, database, interval
        self.result = Connections()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ConnectionSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                while not self._stop.is_set():
                    in_use, total = conn.execute(self.QUERY, [self.database]).fetchone()
                    r = self.result
                    r.samples += 1
                    r.max_in_use, r.max_open = max(r.max_in_use, in_use), max(r.max_open, total)
                    self._stop.wait(self.interval)
        except Exception as exc:  # reported: the figure is then missing
            self.result.error = f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# The idle agents


@dataclass
class IdleOutcome:
    agents: int
    parked_after: float = math.nan  # seconds until every idle agent had its claim in flight
    statuses: Counter = field(default_factory=Counter)
    seconds: dict = field(default_factory=dict)  # status -> (fastest, slowest)
    ids: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def unavailable(self) -> int:
        return self.statuses.get(503, 0)

    @property
    def failed(self) -> int:
        """Requests that did not end with 204, plus connection errors and stuck agents."""
        return self.requests - self.statuses.get(204, 0) + len(self.errors)


class IdleAgents:
    """`count` idle agents as threads over `processes` processes (http_agent.run_idle_process)."""

    def __init__(self, port: int, key: str, count: int, processes: int, wait_seconds: float):
        ctx = multiprocessing.get_context("spawn")
        self.count = count
        self.wait_seconds = wait_seconds
        self.stop = ctx.Event()
        self.in_flight = ctx.Value("i", 0)
        self.results = ctx.Queue()
        shares = [count // processes + (1 if n < count % processes else 0) for n in range(processes)]
        self.processes = [
            ctx.Process(target=http_agent.run_idle_process, daemon=True,
                        args=(n, port, key, threads, IDLE_QUEUE, wait_seconds, self.stop,
                              self.in_flight, self.results))
            for n, threads in enumerate(shares) if threads]
        self.outcome = IdleOutcome(agents=count)
        self.started = time.perf_counter()
        for process in self.processes:
            process.start()

    def wait_parked(self, timeout: float) -> bool:
        """Until every idle agent has a claim in flight (bounded); then a second to settle, so that
        the server has tried each claim once and parked it."""
        deadline = time.monotonic() + timeout
        while self.in_flight.value < self.count:
            if time.monotonic() > deadline or not all(p.is_alive() for p in self.processes):
                return False
            time.sleep(0.05)
        self.outcome.parked_after = time.perf_counter() - self.started
        time.sleep(1.0)
        return self.in_flight.value == self.count

    def finish(self) -> IdleOutcome:
        """Stop looping; every agent's last claim runs to the end of its wait; merge the reports."""
        self.stop.set()
        out = self.outcome
        for _ in self.processes:
            try:
                report = self.results.get(timeout=self.wait_seconds + 90)
            except Exception as exc:
                out.errors.append(f"an idle process sent no report: {type(exc).__name__}: {exc}")
                break
            out.statuses.update(report["statuses"])
            for status, (low, high) in report["seconds"].items():
                old_low, old_high = out.seconds.get(status, (low, high))
                out.seconds[status] = (min(low, old_low), max(high, old_high))
            out.ids += report["ids"]
            out.answers += report["answers"]
            out.errors += [f"idle process {report['index']}: {e}" for e in report["errors"]]
            if report["stuck"]:
                out.errors.append(f"idle process {report['index']}: {report['stuck']} agent(s) "
                                  "still waiting for an answer")
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()
        return out


# ---------------------------------------------------------------------------------------------
# One working run


@dataclass(frozen=True)
class WorkRun:
    what: str
    http: http_claims.HttpOutcome
    connections: Connections


def working_run(what: str, server: http_claims.Server, keys: list[str], args: argparse.Namespace,
                database: str) -> WorkRun:
    from django.db import connections

    http_claims.seed_http_run(ALIAS, args.seconds, args.seed_scale)
    # This process's own connections are not the server's: close them, and its pool's idle one.
    connections.close_all()
    if hasattr(connections[ALIAS], "close_pool"):
        connections[ALIAS].close_pool()
    sampler = http_claims.Sampler(args.py_spy, server.process.pid, f"idle-{what.replace(' ', '-')}", args.seconds)
    with ConnectionSampler(args.pg_url, database, args.sample_interval) as pg:
        outcome = http_claims.run_agents(server.port, keys, "cycle", args.seconds, server.process.pid)
    sampler.wait()
    if not outcome.errors:
        outcome.errors.extend(http_claims.verify_database(ALIAS, outcome))
    print(f"  {what}: {outcome.rate:,.0f} cycles/s", flush=True)
    return WorkRun(what, outcome, pg.result)


# ---------------------------------------------------------------------------------------------
# Printing


def print_report(runs: list[WorkRun], idle: IdleOutcome | None, workers: int, pool: int,
                 args: argparse.Namespace) -> None:
    from taskflow_site.settings import http_threads  # the servers run on PostgreSQL

    fmt_ms, fmt_cpu = http_claims.fmt_ms, http_claims.fmt_cpu
    capacity = pool * workers
    line = "{:<26} {:>8} {:>15} {:>15} {:>4} {:>7} {:>7} {:>8} {:>7} {:>12} {:>10}".format
    header = line("working agents", "cycles/s", "claim p50/p99", "compl p50/p99", "dbl", "server",
                  "ms/req", "postgres", "machine", "conns in use", "conns open")
    print(header)
    print("-" * len(header))
    for run in runs:
        h, c = run.http, run.connections
        print(line(run.what, f"{h.rate:,.0f}", http_claims.p50_p99(h.claim_ms),
                   http_claims.p50_p99(h.complete_ms), h.double_claims, fmt_cpu(h.server_cpu),
                   fmt_ms(h.server_ms_per_request), fmt_cpu(h.postgres_cpu), fmt_cpu(h.machine_cpu),
                   "-" if c.error else f"max {c.max_in_use}", "-" if c.error else f"max {c.max_open}"))
    print()
    alone = runs[0].http.rate if runs else math.nan
    loaded = runs[1].http.rate if len(runs) > 1 else math.nan
    ratio = http_claims.divide(loaded, alone)
    print(f"{'rate alone:':<30}{alone:,.0f} cycles/s ({args.agents} working agents)")
    print(f"{f'rate with {args.idle} idle waiting:':<30}{loaded:,.0f} cycles/s")
    print(f"{'ratio:':<30}{http_claims.fmt_ratio(ratio)}   goal >= {GOAL_RATIO}: "
          f"{http_claims.judged(None if math.isnan(ratio) else ratio >= GOAL_RATIO)}")
    if idle is not None:
        statuses = ", ".join(f"{status}: {n}" for status, n in sorted(idle.statuses.items())) or "none"
        timing = ", ".join(f"{status} after {low:.1f}-{high:.1f} s"
                           for status, (low, high) in sorted(idle.seconds.items()))
        print(f"{'idle requests:':<30}{idle.requests} ({statuses}; {timing}); all {idle.agents} "
              f"had a claim in flight {idle.parked_after:.1f} s after they started")
        print(f"{'failed idle requests:':<30}{idle.failed} (503: {idle.unavailable}, claimed work: "
              f"{len(idle.ids)}, connection errors: {len(idle.errors)})   goal 0: "
              f"{http_claims.judged(idle.failed == 0)}")
    in_use = [run.connections.max_in_use for run in runs if not run.connections.error]
    opened = [run.connections.max_open for run in runs if not run.connections.error]
    if in_use and pool:
        print(f"{'max connections in use:':<30}{max(in_use)} (open: {max(opened)}) of pool capacity "
              f"{capacity} = {pool} per process x {workers} worker(s)   goal under: "
              f"{http_claims.judged(max(in_use) < capacity)}")
    elif in_use:
        print(f"{'max connections in use:':<30}{max(in_use)} (open: {max(opened)}); no pool in the "
              "server (DATABASE_POOL=0): no capacity to compare with")
    for run in runs:
        if run.connections.error:
            print(f"note: {run.what}: pg_stat_activity not sampled: {run.connections.error}")
        if run.http.ran_dry:
            print(f"note: {run.what} ran out of seeded tasks after {run.http.seconds:.2f} s; its rate is "
                  "over that time (try --seed-scale 2)")
        for error in run.http.errors:
            print(f"ERROR: working agents, {run.what}: {error}")
    if idle is not None:
        for answer in idle.answers:
            print(f"ERROR: idle agent answered: {answer}")
        for error in idle.errors:
            print(f"ERROR: idle agents: {error}")
    print()
    print(f"{args.seconds:g} s per working run; {workers} server worker process(es), "
          f"{http_threads('django.db.backends.postgresql')} HTTP threads each; idle = POST /api/claim "
          f'{{"ttl_seconds": 60, "queue": "{IDLE_QUEUE}", "wait_seconds": {args.wait_seconds:g}}} in a loop, '
          f"{args.idle} threads over {args.idle_processes} processes;")
    print(f"server, postgres, machine = CPU of the server's processes, of PostgreSQL, of the whole machine "
          f"in cores busy (of {os.cpu_count()}); ms/req = the server's CPU per request;")
    print(f"conns = pg_stat_activity rows of the bench database every {args.sample_interval:g} s (in use: "
          "state not idle), this script's excluded;")
    print(f"goals (issue): rate with the idle agents >= {GOAL_RATIO} x alone, no failed idle request "
          "(503s at the default cap included), connections in use under the pool capacity")


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=8, help="working agent processes (default 8)")
    parser.add_argument("--idle", type=int, default=200, help="idle agents (default 200)")
    parser.add_argument("--idle-processes", type=int, default=2,
                        help="processes the idle agents' threads are spread over (default 2)")
    parser.add_argument("--wait-seconds", type=float, default=30.0,
                        help="wait_seconds of the idle agents' claims (default 30, the API's maximum)")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each working run (default 5)")
    parser.add_argument("--workers", type=int, default=None,
                        help="server worker processes (default: the serve default)")
    parser.add_argument("--sample-interval", type=float, default=0.1,
                        help="seconds between pg_stat_activity samples (default 0.1)")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help=f"default {DEFAULT_PG_URL}")
    parser.add_argument("--seed-scale", type=float, default=1.0,
                        help="seed this many times more tasks per run (when a run ran out)")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="sample the server with py-spy during each working run into "
                             "DIR/idle-alone.txt and DIR/idle-with-N-idle-waiting.txt")
    args = parser.parse_args(argv)
    for name in ("agents", "idle", "idle_processes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} needs a positive integer")
    if args.workers is not None and args.workers < 1:
        parser.error("--workers needs a positive integer")
    return args


def main(argv: list[str] | None = None) -> int:
    from urllib.parse import urlparse

    args = parse_args(argv)
    http_claims.print_machine_load()
    why = claims.ensure_postgres_database(args.pg_url)
    if why is not None:
        print(f"NOT RUN: {args.pg_url} unreachable: {why}")
        return 1
    database = urlparse(args.pg_url).path.lstrip("/")
    runs: list[WorkRun] = []
    idle: IdleOutcome | None = None
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="taskflow-idle-bench-") as tmp:
        claims.configure_django(Path(tmp) / "unused.sqlite3", args.pg_url)
        from board import agent_keys

        from taskflow_site.settings import postgres_options

        workers = args.workers or http_claims.serve_default_workers()
        # The server's pool per process (this process's may be sized for its own threads).
        pool = postgres_options().get("pool", {}).get("max_size", 0)
        claims.migrate(ALIAS)
        claims.clear(ALIAS)
        made = [agent_keys.create_key(f"bench-agent-{n}", using=ALIAS) for n in range(1, args.agents + 1)]
        idle_made = agent_keys.create_key("bench-idle", using=ALIAS)
        keys = [key for _row, key in made]
        server = idle_agents = None
        try:
            server = http_claims.Server(args.pg_url, workers)
            server.warm_up(keys[0])
            print(f"postgres: manage.py serve ({workers} worker process{'es' if workers != 1 else ''}) pid "
                  f"{server.process.pid} on 127.0.0.1:{server.port} ({args.pg_url})", flush=True)
            runs.append(working_run("alone", server, keys, args, database))
            idle_agents = IdleAgents(server.port, idle_made[1], args.idle, args.idle_processes,
                                     args.wait_seconds)
            if not idle_agents.wait_parked(PARK_TIMEOUT):
                failures.append(f"only {idle_agents.in_flight.value} of {args.idle} idle agents had a "
                                f"claim in flight within {PARK_TIMEOUT:g} s")
            else:
                print(f"  {args.idle} idle agents waiting ({idle_agents.outcome.parked_after:.1f} s)", flush=True)
                runs.append(working_run(f"with {args.idle} idle waiting", server, keys, args, database))
            if idle_agents.in_flight.value < args.idle:
                failures.append(f"{args.idle - idle_agents.in_flight.value} idle agent(s) were not waiting "
                                "at the end of the loaded run")
            print(f"  waiting for the idle agents' last claims to end (up to {args.wait_seconds:g} s)", flush=True)
            idle = idle_agents.finish()
            idle_agents = None
            server.check_alive("the run")
            claims.clear(ALIAS)
        except RuntimeError as exc:  # the server did not start, or died
            failures.append(str(exc))
        finally:
            if idle_agents is not None:
                idle = idle_agents.finish()
            if server is not None:
                server.close()
            for row, _key in [*made, idle_made]:
                agent_keys.revoke(row.pk, using=ALIAS)
        print()
        print_report(runs, idle, workers, pool, args)
        from django.db import connections

        connections.close_all()
    for failure in failures:
        print(f"ERROR: {failure}")
    doubles = sum(run.http.double_claims for run in runs)
    faults = sum(len(run.http.errors) for run in runs) + len(failures) + (idle.failed if idle else 0)
    if doubles:
        print(f"\nFAIL: {doubles} double claim(s) seen")
    if faults:
        print(f"\nFAIL: {faults} failed request(s) or error(s); the figures they touch are not valid")
    return 1 if doubles or faults else 0


if __name__ == "__main__":
    sys.exit(main())
