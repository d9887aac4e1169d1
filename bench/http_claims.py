"""Claim throughput over HTTP: N agent processes against one daphne server, beside in-process.

N agent processes against one real daphne server, beside the in-process engine rate measured in
the same run.

What is measured
----------------
One *cycle* is what an agent does over the JSON API: ``POST /api/claim {"ttl_seconds": 60}``,
then ``POST /api/tasks/{id}/complete {"token", "result"}``. For each backend (the embedded
SQLite default and PostgreSQL) the script:

1. makes a fresh database (SQLite: a new file in a temporary directory; PostgreSQL: the
   database ``taskflow_bench_http``, created when missing, board tables emptied) and migrates it;
2. mints one API key per agent (``board.agent_keys.create_key("bench-agent-N")``, revoked at
   the end) and starts ONE daphne process on a free port of 127.0.0.1 with
   ``DJANGO_SETTINGS_MODULE=taskflow_site.settings``, ``DEBUG=0`` (so Django keeps no query
   log), a throwaway ``SECRET_KEY``, ``ALLOWED_HOSTS=127.0.0.1``, ``SECURE_SSL_REDIRECT=0``
   and ``DATABASE_URL`` naming that database; it warms the server up with a few requests;
3. for each agent count N (default 1, 4, 8): seeds QUEUED tasks with the engine
   (``transitions.create`` in batches, not timed), spawns N agent processes
   (``bench/http_agent.py``: stdlib ``http.client``, one keep-alive connection each, JSON
   bodies), releases them together with a barrier, lets them loop for ``--seconds`` (each
   finishes the cycle it is in), and merges their figures: cycles/s over the time from the
   release to the last agent's end, p50/p99 latency of claim and of complete requests (send
   to last byte read, in the agent), and *double claims* (task ids claimed more than once
   across all agents; must be 0). It also checks that the database holds exactly as many
   COMPLETED tasks as cycles were counted, and no RUNNING one;
4. right after, on the same database with the same number of threads, runs bench/claims.py's
   in-process "ours" loop (imported: ``OursDriver`` + ``run_threads``: ``claim_next`` then
   ``complete`` through the ORM, no HTTP) and prints the ratio http/in-process.

The HTTP ceiling, for context: the same agent processes against the same server, looping one
cheap request instead of the cycle:

- ``GET /api/tasks/does-not-exist`` **without a key**: 401 from the API's auth before any
  database work (Django's middleware, URL routing, django-ninja, the JSON error body; no
  query, no connection). The most any endpoint of this API can do here; measured once, on the
  first backend's server.
- the same **with the agent's key**: one AgentKey lookup by hash + one task lookup by primary
  key, then 404, i.e. the API's fixed cost of opening a database connection and
  authenticating. Measured on each backend.

A cycle is two requests, so ``2 x cycles/s`` is compared with the 401 ceiling at the same agent
count ("% ceil").

Where the CPU goes: for every run the script also prints the CPU the daphne process used (all
its threads, from /proc), the agents' own CPU (``time.process_time`` in each agent), the local
PostgreSQL server's processes (exited backends included), and what the whole machine spent
(/proc/stat; the kernel and any other load are "the rest"),
in cores busy over the run, and the server's CPU milliseconds per request. It starts by
measuring the machine's load for one second: on a shared machine other processes depress every
figure, and the line says so. (daphne writes its access log to a file in the temporary
directory, as a default deployment would.)

Goals (the issue): at 8 agents, HTTP cycles/s >= 0.25 x the in-process rate, and p99 < 50 ms
(claim and complete). Each row says whether it meets them (the ratio goal is judged on every
row, but is stated for 8 agents). Missing a goal is reported, not an error. A double claim, an
agent stopped by an error or a database that does not match the counted cycles makes the
script exit with status 1.

When PostgreSQL does not answer, its rows are skipped with a ``NOT RUN: PostgreSQL rows`` line.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/http_claims.py                         # sqlite+postgres, 1/4/8 agents, 5 s
    .venv/bin/python bench/http_claims.py --backends sqlite --agents 8 --seconds 3
    .venv/bin/python bench/http_claims.py --no-ceiling --no-inprocess
    .venv/bin/python bench/http_claims.py --pg-url postgres://user@host:5432/name
    .venv/bin/python bench/http_claims.py --py-spy /tmp/prof      # also sample the server with
                                                                  # py-spy during each HTTP run

Figures are printed from this run's measurements only; compare ratios within one run.
"""
from __future__ import annotations

import argparse
import http.client
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import claims  # noqa: E402  (bench/claims.py: Django setup, seeding, the in-process loop)
import http_agent  # noqa: E402

sys.path.insert(0, str(BENCH.parent))
from tests.live_server import BoardServer  # noqa: E402  (the one daphne launcher)

PROJECT = claims.PROJECT
DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench_http"
GOAL_RATIO = 0.25  # HTTP cycles/s over in-process cycles/s, at 8 agents
GOAL_P99_MS = 50.0
# Tasks seeded per second of HTTP run: above the ceiling of this kind of machine
# (DESIGN.md section 5: ~250-325 cycles/s over HTTP). A run that exhausts it says so.
HTTP_SEED_PER_SECOND = 400
SERVER_START_TIMEOUT = 60.0


# ---------------------------------------------------------------------------------------------
# The daphne server


class Server(BoardServer):
    """The project's daphne launcher (tests.live_server), run as in production: DEBUG off (no
    query log), plain HTTP on 127.0.0.1, quiet logs."""

    def __init__(self, database_url: str):
        super().__init__(database_url, env={
            "DEBUG": "0",  # DEBUG off turns on HTTPS redirect (off here) and HSTS/secure cookies
            "ALLOWED_HOSTS": "127.0.0.1",
            "SECURE_SSL_REDIRECT": "0",
            "LOG_LEVEL": "WARNING",
        })
        self.start(timeout=SERVER_START_TIMEOUT)

    def request(self, method: str, path: str, key: str | None = None, body: bytes | None = None
                ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Authorization"] = f"Bearer {key}"
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def warm_up(self, key: str) -> None:
        """First requests pay for lazy imports and URL/schema setup; keep that out of the runs."""
        for _ in range(3):
            for method, path, body, expected in (
                ("GET", http_agent.MISSING_TASK, None, 404),
                ("POST", "/api/claim", b'{"ttl_seconds": 60}', 204),  # the board is empty now
                ("POST", "/api/tasks/does-not-exist/complete", b'{"token": "x", "result": 1}', 404),
            ):
                status, data = self.request(method, path, key, body)
                if status != expected:
                    raise RuntimeError(f"warm-up {method} {path}: {status} {data[:300]!r}")


# ---------------------------------------------------------------------------------------------
# Optional: sample the server with py-spy during each HTTP run


class Sampler:
    """`py-spy record --gil` attached to the server for one run (when --py-spy DIR is given):
    samples only the thread holding the GIL, i.e. where the server's Python CPU goes (time
    waiting for the database or the network is not in it)."""

    def __init__(self, out_dir: Path | None, pid: int, name: str, seconds: float):
        self.process = None
        if out_dir is None:
            return
        exe = shutil.which("py-spy")
        if exe is None:
            print(f"note: py-spy is not on PATH; {name} not sampled")
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds) + 2),
             "--rate", "100", "--format", "raw", "--threads", "--gil",
             "--output", str(out_dir / f"{name}.txt")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------------------------------------
# Where the CPU goes (Linux /proc; NaN elsewhere)


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of process `pid` (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


def postgres_cpu_seconds() -> float:
    """CPU seconds of the local PostgreSQL server: every live `postgres` process, plus what the
    exited backends used (the postmaster reaps them, so it is in its children's times). 0 when
    PostgreSQL does not run on this machine."""
    total = 0.0
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return math.nan
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, _, rest = text.partition("(")[2].rpartition(")")
        if name != "postgres":
            continue
        fields = rest.split()
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (summed over its cores)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError, IndexError):
        return math.nan


# ---------------------------------------------------------------------------------------------
# Running N agent processes


@dataclass(frozen=True)
class HttpOutcome:
    agents: int
    seconds: float
    cycles: int  # cycle mode: completed cycles; probe modes: requests
    claim_ms: list[float]
    complete_ms: list[float]
    probe_ms: list[float]
    double_claims: int
    ran_dry: bool
    errors: list[str] = field(default_factory=list)
    # CPU seconds used during the run, over its wall time: 1.0 = one core fully busy
    server_cpu: float = math.nan
    agents_cpu: float = math.nan
    postgres_cpu: float = math.nan
    machine_cpu: float = math.nan  # out of os.cpu_count()

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds if self.seconds > 0 else 0.0


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of `values` (already sorted); NaN when empty."""
    if not values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(values)))
    return values[min(rank, len(values)) - 1]


def run_agents(port: int, keys: list[str], mode: str, seconds: float, server_pid: int) -> HttpOutcome:
    """Spawn len(keys) agent processes, release them together, merge what they report."""
    ctx = multiprocessing.get_context("spawn")  # nothing of this process's Django/DB state
    agents = len(keys)
    barrier = ctx.Barrier(agents + 1)
    results = ctx.Queue()
    processes = [ctx.Process(target=http_agent.run_agent,
                             args=(n, port, key, mode, seconds, barrier, results), daemon=True)
                 for n, key in enumerate(keys)]
    for process in processes:
        process.start()
    errors = []
    try:
        barrier.wait(timeout=120)
    except Exception as exc:  # an agent that could not start aborts the barrier
        errors.append(f"start: {type(exc).__name__}: {exc}")
    cpu_before = (process_cpu_seconds(server_pid), machine_busy_seconds(), time.perf_counter(),
                  postgres_cpu_seconds())
    reports = []
    for _ in processes:  # drain before joining: a child blocks until its report is read
        try:
            reports.append(results.get(timeout=seconds + 120))
        except Exception as exc:
            errors.append(f"an agent sent no report: {type(exc).__name__}: {exc}")
            break
    cpu_after = (process_cpu_seconds(server_pid), machine_busy_seconds(), time.perf_counter(),
                 postgres_cpu_seconds())
    wall = cpu_after[2] - cpu_before[2]
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
            process.join()
    errors += [f"agent {r['index']}: {r['error']}" for r in reports if r["error"]]
    started = [r["start"] for r in reports if r["start"] is not None]
    elapsed = (max(r["end"] for r in reports) - min(started)) if started else 0.0
    claimed = Counter(task_id for r in reports for task_id in r["ids"])
    as_ms = lambda kind: sorted(t * 1000 for r in reports for t in r[kind])  # noqa: E731
    probe_ms = as_ms("probe")
    return HttpOutcome(
        agents=agents, seconds=elapsed,
        cycles=sum(len(r["complete"]) for r in reports) if mode == "cycle" else len(probe_ms),
        claim_ms=as_ms("claim"), complete_ms=as_ms("complete"), probe_ms=probe_ms,
        double_claims=sum(1 for times in claimed.values() if times > 1),
        ran_dry=any(r["ran_dry"] for r in reports), errors=errors,
        server_cpu=(cpu_after[0] - cpu_before[0]) / wall,
        agents_cpu=sum(r["cpu"] for r in reports) / elapsed if elapsed else math.nan,
        machine_cpu=(cpu_after[1] - cpu_before[1]) / wall,
        postgres_cpu=(cpu_after[3] - cpu_before[3]) / wall,
    )


# ---------------------------------------------------------------------------------------------
# One backend


@dataclass(frozen=True)
class Row:
    backend: str
    agents: int
    http: HttpOutcome
    inproc: claims.Outcome | None

    @property
    def ratio(self) -> float:
        return self.http.rate / self.inproc.rate if self.inproc and self.inproc.rate else math.nan

    @property
    def p99_ms(self) -> float:
        return max(percentile(self.http.claim_ms, 99), percentile(self.http.complete_ms, 99))


@dataclass(frozen=True)
class Probe:
    what: str
    backend: str
    outcome: HttpOutcome


def board_counts(alias: str) -> dict[str, int]:
    from django.db.models import Count

    from board.models import Task

    rows = Task.objects.using(alias).values("stage").annotate(n=Count("pk")).order_by()
    return {row["stage"]: row["n"] for row in rows}


def verify_database(alias: str, outcome: HttpOutcome) -> list[str]:
    """The database must hold exactly the cycles the agents counted: one COMPLETED task each,
    nothing left RUNNING."""
    counts = board_counts(alias)
    problems = []
    if counts.get("COMPLETED", 0) != outcome.cycles:
        problems.append(f"the database has {counts.get('COMPLETED', 0)} COMPLETED tasks, "
                        f"the agents counted {outcome.cycles} cycles")
    if counts.get("RUNNING", 0):
        problems.append(f"{counts['RUNNING']} task(s) left RUNNING")
    return problems


def run_backend(backend: str, database_url: str, tmp: Path, args: argparse.Namespace,
                probe_401: bool) -> tuple[list[Row], list[Probe]]:
    from board import agent_keys

    alias = claims.ALIASES[backend]
    claims.clear(alias)
    most = max(args.agents)
    made = [agent_keys.create_key(f"bench-agent-{n}", using=alias) for n in range(1, most + 1)]
    keys = [key for _row, key in made]
    server = Server(database_url)
    rows: list[Row] = []
    probes: list[Probe] = []
    try:
        server.warm_up(keys[0])
        print(f"{backend}: daphne pid {server.process.pid} on 127.0.0.1:{server.port} ({database_url})",
              flush=True)
        for agents in args.agents:
            claims.clear(alias)
            claims.seed_with_engine(alias, max(1_000, int(HTTP_SEED_PER_SECOND * args.seconds * args.seed_scale)),
                                    tied=False)
            claims.tidy(alias)
            sampler = Sampler(args.py_spy, server.process.pid, f"{backend}-x{agents}", args.seconds)
            outcome = run_agents(server.port, keys[:agents], "cycle", args.seconds, server.process.pid)
            sampler.wait()
            if not outcome.errors:
                outcome.errors.extend(verify_database(alias, outcome))
            inproc = None
            if not args.no_inprocess:
                claims.clear(alias)
                claims.OursDriver(alias).seed(claims.seed_size(backend, "ours", args), tied=False)
                claims.tidy(alias)
                inproc = claims.run_threads(claims.OursDriver(alias), agents, args.seconds)
            claims.clear(alias)
            rows.append(Row(backend, agents, outcome, inproc))
            print(f"  {agents} agent(s): {outcome.rate:,.0f} cycles/s over HTTP"
                  + (f", {inproc.rate:,.0f} in-process" if inproc else ""), flush=True)
        if not args.no_ceiling:
            kinds = (["probe-401"] if probe_401 else []) + ["probe-404"]
            for mode in kinds:
                for agents in args.agents:
                    sampler = Sampler(args.py_spy, server.process.pid, f"{backend}-{mode}-x{agents}",
                                      args.ceiling_seconds)
                    outcome = run_agents(server.port, keys[:agents], mode, args.ceiling_seconds,
                                         server.process.pid)
                    sampler.wait()
                    probes.append(Probe(mode, backend, outcome))
        if server.process.poll() is not None:
            raise RuntimeError(f"daphne died during the run:\n{server.log_tail()}")
    finally:
        server.close()
        for row, _key in made:
            agent_keys.revoke(row.pk, using=alias)
    return rows, probes


# ---------------------------------------------------------------------------------------------
# Printing


def fmt_ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def fmt_cpu(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def print_tables(rows: list[Row], probes: list[Probe], args: argparse.Namespace) -> None:
    if not rows and not probes:
        print("no rows measured")
        return
    ceiling = {p.outcome.agents: p.outcome.rate for p in probes if p.what == "probe-401"}
    line = "{:<9} {:>6} {:>10} {:>7} {:>7} {:>7} {:>6}  {:>13}  {:>13}  {:>7}  {}".format
    header = line("backend", "agents", "http cyc/s", "req/s", "% ceil", "inproc", "ratio",
                  "claim p50/p99", "compl p50/p99", "doubles", "goals (ratio >= 0.25, p99 < 50 ms)")
    print(header)
    print("-" * len(header))
    for row in rows:
        h = row.http
        ceil = ceiling.get(row.agents)
        ratio_ok = "-" if math.isnan(row.ratio) else ("met" if row.ratio >= GOAL_RATIO else "NOT met")
        p99_ok = "met" if row.p99_ms < GOAL_P99_MS else "NOT met"
        print(line(
            row.backend, row.agents, f"{h.rate:,.0f}", f"{2 * h.rate:,.0f}",
            f"{200 * h.rate / ceil:.0f}%" if ceil else "-",
            f"{row.inproc.rate:,.0f}" if row.inproc else "-",
            "-" if math.isnan(row.ratio) else f"{row.ratio:.2f}",
            f"{fmt_ms(percentile(h.claim_ms, 50))}/{fmt_ms(percentile(h.claim_ms, 99))} ms",
            f"{fmt_ms(percentile(h.complete_ms, 50))}/{fmt_ms(percentile(h.complete_ms, 99))} ms",
            h.double_claims, f"ratio {ratio_ok}, p99 {p99_ok}",
        ))
    if probes:
        print()
        print("HTTP ceiling: the same agent processes and server, looping one cheap request")
        pline = "{:<52} {:<9} {:>6} {:>8} {:>15}  {:>6} {:>6} {:>7}".format
        pheader = pline("request", "backend", "agents", "req/s", "p50/p99", "server", "agents", "machine")
        print(pheader)
        print("-" * len(pheader))
        names = {"probe-401": f"GET {http_agent.MISSING_TASK}, no key -> 401 (no DB)",
                 "probe-404": f"GET {http_agent.MISSING_TASK}, key -> 404 (2 SELECTs)"}
        for probe in probes:
            o = probe.outcome
            print(pline(names[probe.what], probe.backend, o.agents, f"{o.rate:,.0f}",
                        f"{fmt_ms(percentile(o.probe_ms, 50))}/{fmt_ms(percentile(o.probe_ms, 99))} ms",
                        fmt_cpu(o.server_cpu), fmt_cpu(o.agents_cpu), fmt_cpu(o.machine_cpu)))
    print()
    print(f"CPU during the claim->complete runs (cores busy; this machine has {os.cpu_count()}):")
    cline = "{:<9} {:>6} {:>12} {:>12} {:>10} {:>12} {:>14} {:>22}".format
    cheader = cline("backend", "agents", "server proc", "agent procs", "postgres", "all the rest",
                    "whole machine", "server CPU ms/request")
    print(cheader)
    print("-" * len(cheader))
    for row in rows:
        h = row.http
        per_request = 1000 * h.server_cpu / (2 * h.rate) if h.rate else math.nan
        print(cline(row.backend, row.agents, fmt_cpu(h.server_cpu), fmt_cpu(h.agents_cpu),
                    fmt_cpu(h.postgres_cpu),
                    fmt_cpu(h.machine_cpu - h.server_cpu - h.agents_cpu - h.postgres_cpu),
                    fmt_cpu(h.machine_cpu), fmt_ms(per_request)))
    for row in rows:
        where = f"{row.backend} x{row.agents}"
        if row.http.ran_dry:
            print(f"note: {where} http ran out of seeded tasks after {row.http.seconds:.2f} s "
                  f"({row.http.cycles} cycles); its rate is over that time (try --seed-scale 2)")
        if row.inproc and row.inproc.ran_dry:
            print(f"note: {where} in-process ran out of seeded tasks after {row.inproc.seconds:.2f} s; "
                  "its rate is over that time (try --seed-scale 2)")
        for error in row.http.errors:
            print(f"ERROR: {where} http: {error}")
        for error in row.inproc.errors if row.inproc else ():
            print(f"ERROR: {where} in-process: {error}")
    for probe in probes:
        for error in probe.outcome.errors:
            print(f"ERROR: ceiling {probe.what} {probe.backend} x{probe.outcome.agents}: {error}")
    print()
    print(f"cycle = POST /api/claim + POST /api/tasks/{{id}}/complete; {args.seconds:g} s per run; "
          "req/s = 2 x cycles/s; % ceil = req/s over the 401 ceiling at the same agent count;")
    print("inproc = bench/claims.py 'ours' loop (claim_next + complete via the ORM) with as many threads, "
          "same database, same run;")
    print("CPU: server proc = the daphne process (all threads), agent procs = the agents' own loops, "
          "postgres = the local PostgreSQL server's processes,")
    print("     all the rest = the kernel's share and any other load on the machine; "
          "1.00 = one core busy for the run's duration;")
    print(f"goals (issue): at 8 agents http/in-process >= {GOAL_RATIO} and p99 < {GOAL_P99_MS:g} ms "
          "(p99 = the worse of claim and complete); missing one is reported, not an error")


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", default="1,4,8", help="comma-separated agent process counts (default 1,4,8)")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite,postgres")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each run (default 5)")
    parser.add_argument("--ceiling-seconds", type=float, default=2.0,
                        help="duration of each ceiling probe run (default 2)")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the HTTP ceiling probes")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process comparison")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help=f"default {DEFAULT_PG_URL}")
    parser.add_argument("--dir", default=None, help="folder in which to make the SQLite temp dir")
    parser.add_argument("--seed-scale", type=float, default=1.0,
                        help="seed this many times more tasks per run (when a run ran out)")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="sample the server with `py-spy record --gil --format raw` during each "
                             "HTTP run into DIR/<backend>[-<probe>]-x<agents>.txt (py-spy must be on PATH)")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(claims.ALIASES)
    if unknown:
        parser.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    try:
        args.agents = [int(a) for a in args.agents.split(",") if a.strip()]
    except ValueError:
        parser.error("--agents needs positive integers")
    if not args.agents or min(args.agents) < 1:
        parser.error("--agents needs positive integers")
    args.tied = False  # what claims.seed_size and OursDriver.seed expect
    return args


def machine_load(seconds: float = 1.0) -> float:
    """Cores busy over `seconds` before the bench starts: other load on a shared machine
    depresses every figure of the run."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - before) / seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[Row] = []
    probes: list[Probe] = []
    failures: list[str] = []
    load = machine_load()
    if not math.isnan(load):
        print(f"machine load before the bench: {load:.2f} of {os.cpu_count()} cores busy"
              + ("  (other processes are running: every figure below is depressed)" if load > 0.3 else ""))
    with tempfile.TemporaryDirectory(prefix="taskflow-http-bench-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        sqlite_path = tmp / "bench.sqlite3"
        pg_url = None
        not_run = None
        if "postgres" in args.backends:
            why = claims.ensure_postgres_database(args.pg_url)
            if why is None:
                pg_url = args.pg_url
            else:
                not_run = f"NOT RUN: PostgreSQL rows ({args.pg_url} unreachable: {why})"
                print(not_run)
        claims.configure_django(sqlite_path, pg_url)
        urls = {"sqlite": f"sqlite:///{sqlite_path}"}
        if pg_url:
            urls["postgres"] = pg_url
        backends = [b for b in args.backends if b in urls]
        for backend in backends:
            claims.migrate(claims.ALIASES[backend])
        for backend in backends:
            try:
                more_rows, more_probes = run_backend(backend, urls[backend], tmp, args,
                                                     probe_401=not probes)
            except RuntimeError as exc:  # the server did not start, or died
                failures.append(f"{backend}: {exc}")
                print(f"ERROR: {backend}: {exc}")
                continue
            rows += more_rows
            probes += more_probes
        from django.db import connections

        connections.close_all()
    print()
    print_tables(rows, probes, args)
    if not_run:
        print(not_run)

    doubles = sum(row.http.double_claims for row in rows)
    doubles += sum(row.inproc.double_claims for row in rows if row.inproc)
    faults = sum(len(row.http.errors) + (len(row.inproc.errors) if row.inproc else 0) for row in rows)
    faults += sum(len(p.outcome.errors) for p in probes) + len(failures)
    if doubles:
        print(f"\nFAIL: {doubles} double claim(s) seen")
    if faults:
        print(f"\nFAIL: {faults} error(s); the figures they touch are not valid")
    return 1 if doubles or faults else 0


if __name__ == "__main__":
    sys.exit(main())
