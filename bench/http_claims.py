"""Claim throughput over HTTP: N agent processes against the board's server, beside in-process.

N agent processes against the board's real server (``manage.py serve``: uvicorn worker
processes, HTTP through Django's WSGI handler in a small thread pool per process), beside the
in-process engine rate and a bare Django view's rate measured in the same run.

What is measured
----------------
One *cycle* is what an agent does over the JSON API: ``POST /api/claim {"ttl_seconds": 60}``,
then ``POST /api/tasks/{id}/complete {"token", "result"}``. For each backend (the embedded
SQLite default and PostgreSQL) and each server size (``--workers N``, default the serve default:
``TASKFLOW_WORKERS`` or one per core; ``--compare-workers 1,2`` measures each of those in turn)
the script:

1. makes a fresh database (SQLite: a new file in a temporary directory; PostgreSQL: the
   database ``taskflow_bench_http``, created when missing, board tables emptied) and migrates it;
2. mints one API key per agent (``board.agent_keys.create_key("bench-agent-N")``, revoked at
   the end) and starts the server (``harness.board_server.BoardServer``: ``manage.py serve --host
   127.0.0.1 --port P --no-reaper --workers N``) with ``DJANGO_SETTINGS_MODULE=taskflow_site.settings``,
   ``DEBUG=0`` (so Django keeps no query log), a throwaway ``SECRET_KEY``,
   ``ALLOWED_HOSTS=127.0.0.1``, ``SECURE_SSL_REDIRECT=0`` and ``DATABASE_URL`` naming that
   database (``TASKFLOW_HTTP_THREADS`` and the pool size come from this environment, as in
   production); it warms every worker up with a few requests;
3. for each agent count N (default 1, 4, 8): seeds QUEUED tasks with the engine
   (``transitions.create`` in batches, not timed), spawns N agent processes
   (``bench/http_agent.py``: stdlib ``http.client``, one keep-alive connection each, JSON
   bodies), releases them together with a barrier, lets them loop for ``--seconds`` (each
   finishes the cycle it is in), and merges their figures: cycles/s over the time from the
   release to the last agent's end, p50/p99 latency of claim and of complete requests (send
   to last byte read, in the agent), and *double claims* (task ids claimed more than once
   across all agents; must be 0). It also checks that the database holds exactly as many
   COMPLETED tasks as cycles were counted, and no RUNNING one;
4. right after (with the first server size only: it does not depend on the server), on the same
   database with the same number of threads, runs bench/claims.py's in-process "ours" loop
   (imported: ``OursDriver`` + ``run_threads``: ``transitions.claim_next`` then ``complete``,
   the engine as the API calls it, no HTTP) and prints the ratio http/in-process.

Interleaved runs (issue 34): at each agent count the script runs ``--rounds`` rounds (default 5),
each round the ``--modes`` in turn, then the bare view, each on a freshly seeded board:

- (a) ``cycle``: claim, then complete (two requests per task);
- (b) ``next``: complete-and-claim-next (``POST /api/tasks/{id}/complete`` with ``next``: one request
  per task; a plain claim only when ``next`` came back null);
- (c) ``batch``: ``POST /api/claim`` with ``max_tasks: 10``, then ``POST /api/complete`` with the
  ten items (two requests per ten tasks);
- the bare view (``GET /api/bare``) under a second ``manage.py serve`` with the same workers and
  ``bench.bare_settings``, started beside the board's server for the whole interleaving (idle while
  the board runs), on the same database;
- with (b) and (c), the same agents' requests answered by that second server as **plain SQL**
  (bench/bare_urls.py: bench/claims.py's RawDriver, the pick then UPDATE + INSERT per move; (b)'s
  completion and next claim in one transaction, (c)'s claims in one and its completions in one;
  no engine, no django-ninja, no key), on a freshly seeded board: what the same moves cost behind
  the same server without the engine. Its rows print ours' CPU per task over plain's;

so that the host's load swings touch every mode alike. For each mode it prints tasks/s (median
[min-max] over the rounds), the p99 of all the rounds' requests, and the **server CPU ms per
completed task**: the server's process tree's own CPU counters (``/proc/<pid>/stat`` utime + stime
of the supervisor and its worker processes, with their reaped children's) read before and after
each run, over the tasks the agents completed in it; beside the bare view's req/s of the same
interleaving. Issue 34's goals at 8 agents: (b) <= 1.0 ms and >= 400 tasks/s, (c) <= 0.4 ms and
>= 1,000 tasks/s, on SQLite and on PostgreSQL. The classic tables below (a's figures) show the
median run of (a)'s rounds.

The bare view under daphne (unless ``--no-bare`` or ``--no-daphne``), measured once per run before the board: the same
agent processes loop ``GET /api/bare`` (``probe-bare``), a JSON view with no database behind the
project's middleware stack as an API request meets it (bench/bare_urls.py, settings bench/bare_settings.py), for
``--bare-seconds`` at each agent count, served

- by the production server exactly as the board is (``manage.py serve``, same workers and
  threads, ``DJANGO_SETTINGS_MODULE=bench.bare_settings``): in the interleaved rounds above; and
- by daphne (one process, ``daphne -v 0 bench.bare_asgi:application``: Django's own ASGI
  handler, no access log), for comparison with the stock ASGI path.

Beside each board row it prints ``req/s`` (2 x cycles/s) over the bare view's req/s under the
same server (same workers) at the same agent count ("/bare").

The HTTP ceiling of the API, for context (unless ``--no-ceiling``): the same agent processes
against the same server, looping one cheap request instead of the cycle:

- ``GET /api/tasks/does-not-exist`` **without a key**: 401 from the API's auth before any
  database work (Django's middleware, URL routing, django-ninja, the JSON error body; no
  query, no connection). Measured once per server size, on the first backend's server.
- the same **with the agent's key**: one AgentKey lookup by hash + one task lookup by primary
  key, then 404, i.e. the API's fixed cost of opening a database connection and
  authenticating. Measured on each backend.

A cycle is two requests, so ``2 x cycles/s`` is compared with the 401 ceiling at the same agent
count ("% ceil").

Where the CPU goes: for every run the script also prints the CPU the server used (the whole
process tree: the supervisor and its worker processes, all their threads, from /proc), the
agents' own CPU (``time.process_time`` in each agent), the local PostgreSQL server's processes
(exited backends included), and what the whole machine spent (/proc/stat; the kernel and any
other load are "the rest"; "stolen" is the time the hypervisor gave other guests, which on a
shared virtual machine can take a good part of a core and depresses every rate of that run),
in cores busy over the run, and the server's CPU milliseconds per request. It starts by measuring the machine's load for one second: on a shared machine other
processes depress every figure, and the line says so.

Goals (the issue), at 8 agents: >= 150 cycles/s on SQLite and on PostgreSQL; p99 < 50 ms per
request (claim and complete); the board's req/s >= 0.25 x the bare view's req/s under the same
server (i.e. cycles/s >= 0.25 x bare req/s / 2); and, with ``--compare-workers``, two server
processes serve >= 1.3 x one process's cycles/s on PostgreSQL (on SQLite, where the processes
write to one file: more than one process's). Each row says whether it meets them (p99 and the
bare ratio are judged on every row, the rates at 8 agents only). Missing a goal is reported, not
an error. A double claim, an agent stopped by an error or a database that does not match the
counted cycles makes the script exit with status 1.

When PostgreSQL does not answer, its rows are skipped with a ``NOT RUN: PostgreSQL rows`` line.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/http_claims.py                         # sqlite+postgres, 1/4/8 agents, 5 s, 5 rounds
    .venv/bin/python bench/http_claims.py --agents 8 --rounds 5 --no-daphne --no-ceiling   # issue 34's figures
    .venv/bin/python bench/http_claims.py --backends sqlite --agents 8 --seconds 2 --rounds 2   # a short try
    .venv/bin/python bench/http_claims.py --modes cycle --rounds 1   # (a) only, once: the figures before issue 34
    .venv/bin/python bench/http_claims.py --backends sqlite --agents 8 --seconds 3
    .venv/bin/python bench/http_claims.py --backends postgres --agents 8 --compare-workers 1,2
    .venv/bin/python bench/http_claims.py --workers 1 --no-ceiling --no-inprocess --no-bare
    .venv/bin/python bench/http_claims.py --pg-url postgres://user@host:5432/name
    .venv/bin/python bench/http_claims.py --server granian --agents 8 --rounds 3 --no-daphne --no-ceiling --no-inprocess
                                                                  # the same ASGI application under granian (after
                                                                  # .venv/bin/pip install granian==2.8.9)
    .venv/bin/python bench/http_claims.py --py-spy /tmp/prof      # also sample the server (all its
                                                                  # processes) with py-spy in each run

Figures are printed from this run's measurements only; compare ratios within one run.
"""
from __future__ import annotations

import argparse
import http.client
import importlib.util
import math
import multiprocessing
import os
import shutil
import statistics
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
from bench.stats import percentile  # nearest-rank: the benchmarks' one percentile
from harness.board_server import BoardServer  # noqa: E402  (the one server launcher)

PROJECT = claims.PROJECT
DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench_http"
GOAL_AGENTS = 8  # the goals are stated at this many agents
GOAL_RATE = 150.0  # cycles/s at 8 agents, SQLite and PostgreSQL
GOAL_P99_MS = 50.0
GOAL_BARE_RATIO = 0.25  # board req/s over the bare view's req/s under the same server
# More server processes over fewer, cycles/s at 8 agents (PostgreSQL: >= 1.3; SQLite, where the
# processes write to one file: more than one process's, i.e. > 1.0).
GOAL_WORKERS = {"postgres": (1.3, ">="), "sqlite": (1.0, ">")}
# Tasks seeded per second of HTTP run: above the rates this kind of machine reaches over HTTP
# (DESIGN.md section 5). A run that exhausts it says so.
HTTP_SEED_PER_SECOND = 400
# The same for each mode of the interleaved runs: (b) and (c) aim at 400 and 1,000 tasks/s.
SEED_PER_SECOND = {"cycle": HTTP_SEED_PER_SECOND, "next": 1_000, "batch": 2_500}
# The interleaved runs' modes (http_agent's names), as the issue names them.
MODES = {"cycle": "(a) claim, then complete", "next": "(b) complete-and-claim-next",
         "batch": f"(c) batches of {http_agent.BATCH}"}
# Issue 34's goals at 8 agents, SQLite and PostgreSQL: server CPU ms per completed task at most,
# tasks/s at least.
GOALS_34 = {"next": (1.0, 400.0), "batch": (0.4, 1_000.0)}
# The modes whose moves the bare view's server also runs as plain SQL (bench/bare_urls.py), beside
# the bare view: what the same moves cost behind the same server without the engine.
PLAIN_MODES = ("next", "batch")
PLAIN_SEED_SCALE = 1.5  # plain SQL's runs go faster than ours: more tasks seeded, so that none runs dry
SERVER_START_TIMEOUT = 60.0
BARE_SETTINGS = "bench.bare_settings"
BARE_ASGI = "bench.bare_asgi:application"
# How the server is run here, as in production: DEBUG off (no query log), plain HTTP on
# 127.0.0.1 (so no HTTPS redirect), quiet logs.
SERVER_ENV = {"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1", "SECURE_SSL_REDIRECT": "0", "LOG_LEVEL": "WARNING"}


# ---------------------------------------------------------------------------------------------
# The servers


def _request(port: int, method: str, path: str, key: str | None = None, body: bytes | None = None
             ) -> tuple[int, bytes]:
    """One request on a new connection (so that, with several worker processes, requests
    spread over them as the kernel hands the connections out)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def warm_up_bare(port: int, rounds: int = 20) -> None:
    for _ in range(rounds):
        status, data = _request(port, "GET", http_agent.BARE_PATH)
        if status != 200:
            raise RuntimeError(f"warm-up GET {http_agent.BARE_PATH}: {status} {data[:300]!r}")


# --server granian: the same ASGI application (taskflow_site/asgi.py, which picks the settings
# from DJANGO_SETTINGS_MODULE) under granian (a Rust HTTP server; issue 34 asks for it to be
# measured against uvicorn): its workers, uvloop and no lifespan (asginl) as serve's, no access
# log, websockets on.
GRANIAN_APP = "taskflow_site.asgi:application"
GRANIAN_PIN = "granian==2.8.9"  # the version measured (docs/running.md, "Why uvicorn, not granian")
SERVER_NAMES = {"serve": "manage.py serve", "granian": f"granian (ASGI, {GRANIAN_APP})"}


def granian_command(workers: int) -> list[str]:
    return [sys.executable, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1", "--port", "{port}",
            "--workers", str(workers), "--loop", "uvloop", "--log-level", "warning", "--no-access-log",
            GRANIAN_APP]


class Server(BoardServer):
    """The board's server as in production (`manage.py serve`, via harness.board_server), with
    `workers` worker processes; `settings_module` replaces taskflow_site.settings (the bare
    view's baseline runs bench.bare_settings). `kind` "granian": the same application under
    granian instead (granian_command), with a metrics directory of its own as serve makes."""

    def __init__(self, database_url: str, workers: int, settings_module: str | None = None, kind: str = "serve"):
        env = dict(SERVER_ENV)
        if settings_module:
            env["DJANGO_SETTINGS_MODULE"] = settings_module
        self.metrics_dir = None
        if kind == "granian":
            self.metrics_dir = tempfile.mkdtemp(prefix="taskflow-granian-metrics-")
            env["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        super().__init__(database_url, env=env, args=["--workers", str(workers)],
                         command=granian_command(workers) if kind == "granian" else None)
        self.workers = workers
        self.start(timeout=SERVER_START_TIMEOUT)

    def close(self) -> None:
        super().close()
        if self.metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def request(self, method: str, path: str, key: str | None = None, body: bytes | None = None
                ) -> tuple[int, bytes]:
        return _request(self.port, method, path, key, body)

    def warm_up(self, key: str) -> None:
        """First requests pay for lazy imports and URL/schema setup, in every worker process;
        keep that out of the runs."""
        for _ in range(5 * self.workers):
            for method, path, body, expected in (
                ("GET", http_agent.MISSING_TASK, None, 404),
                ("POST", "/api/claim", b'{"ttl_seconds": 60}', 204),  # the board is empty now
                ("POST", "/api/tasks/does-not-exist/complete", b'{"token": "x", "result": 1}', 404),
            ):
                status, data = self.request(method, path, key, body)
                if status != expected:
                    raise RuntimeError(f"warm-up {method} {path}: {status} {data[:300]!r}")

    def check_alive(self, what: str) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the server died during {what}:\n{self.log_tail()}")

    def sqlite_writes(self, key: str) -> dict[str, float]:
        """The server's SQLite write-lock histograms as they stand (board/metrics.py, summed
        over its processes): wait and hold sums and counts, and holds of at most 2 ms."""
        status, data = self.request("GET", "/metrics", key)
        if status != 200:
            raise RuntimeError(f"GET /metrics: {status} {data[:300]!r}")
        from prometheus_client.parser import text_string_to_metric_families

        found: dict[str, float] = {}
        for family in text_string_to_metric_families(data.decode()):
            if family.name in ("taskflow_sqlite_write_wait_seconds", "taskflow_sqlite_write_hold_seconds"):
                what = family.name.split("_")[-2]  # wait, hold
                for sample in family.samples:
                    if sample.name.endswith(("_sum", "_count")):
                        found[f"{what}{sample.name[sample.name.rfind('_'):]}"] = sample.value
                    elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == HOLD_SHORT_SECONDS:
                        found[f"{what}_short"] = sample.value
        return found


HOLD_SHORT_SECONDS = 0.002  # a bucket bound of board.metrics' write-lock histograms


@dataclass(frozen=True)
class LockFigures:
    """SQLite's writers' lock over one HTTP run (from the server's /metrics before and after)."""

    transactions: int
    wait_ms: float  # mean wait for the lock
    hold_ms: float  # mean time holding it, commit included
    long_holds: float  # share of holds over HOLD_SHORT_SECONDS
    busy: float  # seconds the lock was held per second of the run (1.0: the file is the limit)

    @classmethod
    def between(cls, before: dict, after: dict, seconds: float) -> LockFigures | None:
        n = after.get("hold_count", 0) - before.get("hold_count", 0)
        if n <= 0:
            return None
        held = after["hold_sum"] - before["hold_sum"]
        short = after["hold_short"] - before["hold_short"]
        return cls(int(n), 1000 * (after["wait_sum"] - before["wait_sum"]) / n, 1000 * held / n,
                   1 - short / n, held / seconds)


class DaphneServer(BoardServer):
    """daphne (one process) serving the bare view through Django's ASGI handler
    (bench/bare_asgi.py), no access log, on a free port of 127.0.0.1."""

    def __init__(self, database_url: str):
        super().__init__(database_url, env={**SERVER_ENV, "DJANGO_SETTINGS_MODULE": BARE_SETTINGS},
                         command=[sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1",
                                  "-p", "{port}", BARE_ASGI])
        self.start(timeout=SERVER_START_TIMEOUT)

    def check_alive(self, what: str) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"daphne died during {what}:\n{self.log_tail()}")


# ---------------------------------------------------------------------------------------------
# Optional: sample the server with py-spy during each HTTP run


class Sampler:
    """`py-spy record --gil --subprocesses` attached to the server for one run (when --py-spy DIR
    is given): samples, in the server and each of its worker processes, only the thread holding
    the GIL, i.e. where the server's Python CPU goes (time waiting for the database or the
    network is not in it)."""

    def __init__(self, out_dir: Path | None, pid: int, name: str, seconds: float):
        self.process = None
        if out_dir is None:
            return
        exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if exe is None:
            print(f"note: py-spy is not on PATH; {name} not sampled")
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds) + 2),
             "--rate", "100", "--format", "raw", "--threads", "--gil", "--subprocesses",
             "--output", str(out_dir / f"{name}.txt")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attaching takes a moment; the run should be sampled from its start

    def wait(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------------------------------------
# Where the CPU goes (Linux /proc; NaN elsewhere)


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """(name, fields after the name) of /proc/<pid>/stat; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = text.partition("(")[2].rpartition(")")
    return name, rest.split()


def process_tree(pid: int) -> list[int]:
    """`pid` and all its live descendants (by scanning /proc for their parent ids)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return [pid]
    for entry in entries:
        stat = _stat(entry)
        if stat is not None:
            children.setdefault(int(stat[1][1]), []).append(int(entry))  # field 4: ppid
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    return tree


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of process `pid` and all its descendants (all their threads:
    the server's supervisor and its worker processes), plus what their exited children used
    (cutime + cstime: a reaped child's time moves there, so the sum does not drop)."""
    stat = _stat(pid)
    if stat is None:
        return math.nan
    total = 0
    for member in process_tree(pid):
        stat = _stat(member)
        if stat is not None:
            try:
                total += sum(int(v) for v in stat[1][11:15])  # utime, stime, cutime, cstime
            except (ValueError, IndexError):
                return math.nan
    return total / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """CPU seconds of the local PostgreSQL server: every live `postgres` process, plus what the
    exited backends used (the postmaster reaps them, so it is in its children's times). 0 when
    PostgreSQL does not run on this machine."""
    total = 0
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return math.nan
    for pid in pids:
        stat = _stat(pid)
        if stat is None or stat[0] != "postgres":
            continue  # gone meanwhile, or not PostgreSQL
        total += sum(int(v) for v in stat[1][11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def _cpu_line() -> list[int]:
    """/proc/stat's first line: user, nice, system, idle, iowait, irq, softirq, steal (ticks)."""
    return [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (summed over its cores), including the time
    the hypervisor gave to other guests while this one wanted to run (steal)."""
    try:
        values = _cpu_line()
        return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError, IndexError):
        return math.nan


def machine_stolen_seconds() -> float:
    """CPU seconds the hypervisor took from this machine (steal): a virtual machine's cores
    shared with other guests. Large values mean the run measured a busy host, not the board."""
    try:
        return _cpu_line()[7] / os.sysconf("SC_CLK_TCK")
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
    server_cpu: float = math.nan  # the server's whole process tree
    agents_cpu: float = math.nan
    postgres_cpu: float = math.nan
    machine_cpu: float = math.nan  # out of os.cpu_count()
    stolen_cpu: float = math.nan  # of machine_cpu: taken by the hypervisor (steal)

    server_cpu_seconds: float = math.nan  # the server's process tree, over the run (not divided)
    mode: str = "cycle"  # http_agent's mode: cycle (a), next (b), batch (c), or a probe

    @property
    def rate(self) -> float:
        """Tasks completed per second (cycle modes), requests per second (probes)."""
        return self.cycles / self.seconds if self.seconds > 0 else 0.0

    @property
    def requests_per_second(self) -> float:
        if self.claim_ms or self.complete_ms:
            return (len(self.claim_ms) + len(self.complete_ms)) / self.seconds if self.seconds > 0 else 0.0
        return self.rate

    @property
    def server_ms_per_request(self) -> float:
        rps = self.requests_per_second
        return 1000 * self.server_cpu / rps if rps else math.nan

    @property
    def server_ms_per_task(self) -> float:
        """Server CPU milliseconds per completed task: its process tree's own counters (utime +
        stime from /proc) over the run, divided by the tasks the agents completed."""
        return 1000 * self.server_cpu_seconds / self.cycles if self.cycles else math.nan

    @property
    def p99_ms(self) -> float:
        """p99 of every request of the run (claims and completes together)."""
        return percentile(self.claim_ms + self.complete_ms + self.probe_ms, 99)


def run_agents(port: int, keys: list[str], mode: str, seconds: float, server_pid: int) -> HttpOutcome:
    """Spawn len(keys) agent processes, release them together, merge what they report.
    `server_pid`: the server whose CPU (with all its descendants) is measured over the run."""
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
                  postgres_cpu_seconds(), machine_stolen_seconds())
    reports = []
    for _ in processes:  # drain before joining: a child blocks until its report is read
        try:
            reports.append(results.get(timeout=seconds + 120))
        except Exception as exc:
            errors.append(f"an agent sent no report: {type(exc).__name__}: {exc}")
            break
    cpu_after = (process_cpu_seconds(server_pid), machine_busy_seconds(), time.perf_counter(),
                 postgres_cpu_seconds(), machine_stolen_seconds())
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
        agents=agents, seconds=elapsed, mode=mode,
        server_cpu_seconds=cpu_after[0] - cpu_before[0],
        cycles=sum(r["done"] for r in reports) if mode in http_agent.CYCLE_MODES else len(probe_ms),
        claim_ms=as_ms("claim"), complete_ms=as_ms("complete"), probe_ms=probe_ms,
        double_claims=sum(1 for times in claimed.values() if times > 1),
        ran_dry=any(r["ran_dry"] for r in reports), errors=errors,
        server_cpu=(cpu_after[0] - cpu_before[0]) / wall,
        agents_cpu=sum(r["cpu"] for r in reports) / elapsed if elapsed else math.nan,
        machine_cpu=(cpu_after[1] - cpu_before[1]) / wall,
        postgres_cpu=(cpu_after[3] - cpu_before[3]) / wall,
        stolen_cpu=(cpu_after[4] - cpu_before[4]) / wall,
    )


# ---------------------------------------------------------------------------------------------
# The bare view baseline


@dataclass(frozen=True)
class BareRun:
    server: str  # "serve" (manage.py serve, as the board) or "daphne" (Django's ASGI handler)
    workers: int
    outcome: HttpOutcome


def measure_bare(database_url: str, args: argparse.Namespace, workers_list: list[int]) -> list[BareRun]:
    """The bare view under `manage.py serve` with each of `workers_list`, then under daphne; the
    same agent processes at each agent count. `database_url` only satisfies the settings: the
    view never opens a connection."""
    runs: list[BareRun] = []
    dummy_keys = ["-"] * max(args.agents)
    # manage.py serve's bare view runs interleaved with the board's runs (run_backend), beside it.
    servers = [] if args.no_daphne else [("daphne", 1)]
    for kind, workers in servers:
        server = (Server(database_url, workers, settings_module=BARE_SETTINGS) if kind == "serve"
                  else DaphneServer(database_url))
        try:
            warm_up_bare(server.port, rounds=10 * workers)
            print(f"bare view: {kind} ({workers} process{'es' if workers != 1 else ''}) pid "
                  f"{server.process.pid} on 127.0.0.1:{server.port}", flush=True)
            for agents in args.agents:
                sampler = Sampler(args.py_spy, server.process.pid, f"bare-{kind}-w{workers}-x{agents}",
                                  args.bare_seconds)
                outcome = run_agents(server.port, dummy_keys[:agents], "probe-bare", args.bare_seconds,
                                     server.process.pid)
                sampler.wait()
                runs.append(BareRun(kind, workers, outcome))
                print(f"  {agents} agent(s): {outcome.rate:,.0f} req/s", flush=True)
            server.check_alive("the bare view's runs")
        finally:
            server.close()
    return runs


# ---------------------------------------------------------------------------------------------
# One backend


@dataclass(frozen=True)
class Row:
    backend: str
    workers: int
    agents: int
    http: HttpOutcome
    inproc: claims.Outcome | None  # measured with the first server size only
    lock: LockFigures | None = None  # SQLite only

    @property
    def p99_ms(self) -> float:
        return max(percentile(self.http.claim_ms, 99), percentile(self.http.complete_ms, 99))


@dataclass(frozen=True)
class Probe:
    what: str
    backend: str
    workers: int
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


def seed_http_run(alias: str, seconds: float, scale: float, mode: str = "cycle") -> None:
    """An empty board with enough QUEUED tasks for one HTTP run of `seconds` in `mode`."""
    claims.clear(alias)
    per_second = SEED_PER_SECOND.get(mode, HTTP_SEED_PER_SECOND)
    claims.seed_with_engine(alias, max(1_000, int(per_second * seconds * scale)), tied=False)
    claims.tidy(alias)


@dataclass(frozen=True)
class Interleaved:
    """The interleaved runs at one agent count on one server: each mode's runs (one per round)
    and the bare view's, in the order ours (a), (b), (c), bare, (a), (b), (c), bare, ..."""

    backend: str
    workers: int
    agents: int
    runs: dict[str, list[HttpOutcome]]
    bare: list[HttpOutcome]
    # The plain SQL of (b) and (c) (bench/bare_urls.py), on the bare view's server: per mode, with the mode.
    plain: dict[str, list[HttpOutcome]]

    def outcomes(self) -> list[HttpOutcome]:
        return [o for runs in [*self.runs.values(), *self.plain.values()] for o in runs] + self.bare


def median_run(runs: list[HttpOutcome]) -> HttpOutcome:
    """The run with the median rate (of an even number, the upper middle one)."""
    return sorted(runs, key=lambda o: o.rate)[len(runs) // 2]


def run_backend(backend: str, database_url: str, args: argparse.Namespace, workers: int,
                probe_401: bool, inprocess: bool, bare_url: str | None = None
                ) -> tuple[list[Row], list[Probe], list[Interleaved]]:
    """The board on `backend` with `workers` server processes: at each agent count, `--rounds`
    rounds of the modes (`--modes`: (a) claim then complete, (b) complete-and-claim-next, (c)
    batches) and the bare view (a second server, bench.bare_settings on `bare_url`, same
    workers; unless --no-bare), interleaved; then the in-process loop and the ceiling probes.
    Returns the (a) rows of the classic tables (each the median run of its rounds), the probes,
    and every interleaved run."""
    from django.db import connections

    from board import agent_keys

    alias = claims.ALIASES[backend]
    claims.clear(alias)
    most = max(args.agents)
    made = [agent_keys.create_key(f"bench-agent-{n}", using=alias) for n in range(1, most + 1)]
    keys = [key for _row, key in made]
    made.append(agent_keys.create_key("bench-metrics", is_operator=True, using=alias))  # scrapes /metrics
    scrape_key = made[-1][1]
    rows: list[Row] = []
    probes: list[Probe] = []
    interleaved: list[Interleaved] = []
    server = bare_server = None
    try:
        server = Server(database_url, workers, kind=args.server)
        server.warm_up(keys[0])
        print(f"{backend}: {SERVER_NAMES[args.server]} ({workers} worker process{'es' if workers != 1 else ''}) "
              f"pid {server.process.pid} on 127.0.0.1:{server.port} ({database_url})", flush=True)
        if bare_url is not None:
            bare_server = Server(bare_url, workers, settings_module=BARE_SETTINGS, kind=args.server)
            warm_up_bare(bare_server.port, rounds=10 * workers)
            print(f"  bare view beside it: {SERVER_NAMES[args.server]} ({workers} worker process"
                  f"{'es' if workers != 1 else ''}, {BARE_SETTINGS}) pid {bare_server.process.pid} "
                  f"on 127.0.0.1:{bare_server.port}", flush=True)
        for agents in args.agents:
            runs: dict[str, list[HttpOutcome]] = {mode: [] for mode in args.modes}
            locks: list[LockFigures | None] = []
            bare_runs: list[HttpOutcome] = []
            plain_runs: dict[str, list[HttpOutcome]] = {mode: [] for mode in PLAIN_MODES
                                                         if mode in args.modes and bare_server is not None}
            for round_no in range(1, args.rounds + 1):
                for mode in args.modes:
                    seed_http_run(alias, args.seconds, args.seed_scale, mode)
                    name = f"{backend}-w{workers}-x{agents}" if mode == "cycle" else f"{backend}-w{workers}-{mode}-x{agents}"
                    sampler = Sampler(args.py_spy if round_no == 1 else None, server.process.pid, name, args.seconds)
                    lock_before = server.sqlite_writes(scrape_key) if backend == "sqlite" and mode == "cycle" else None
                    scraped = time.perf_counter()
                    outcome = run_agents(server.port, keys[:agents], mode, args.seconds, server.process.pid)
                    # Busy over the time between the two scrapes: the holds of the agents' start and end too.
                    if mode == "cycle":
                        locks.append(LockFigures.between(lock_before, server.sqlite_writes(scrape_key),
                                                         time.perf_counter() - scraped)
                                     if lock_before is not None else None)
                    sampler.wait()
                    if not outcome.errors:
                        outcome.errors.extend(verify_database(alias, outcome))
                    claims.clear(alias)
                    runs[mode].append(outcome)
                if bare_server is not None:
                    sampler = Sampler(args.py_spy if round_no == 1 else None, bare_server.process.pid,
                                      f"bare-serve-w{workers}-x{agents}", args.bare_seconds)
                    bare_runs.append(run_agents(bare_server.port, ["-"] * agents, "probe-bare", args.bare_seconds,
                                                bare_server.process.pid))
                    sampler.wait()
                    for mode in plain_runs:  # (b)'s and (c)'s moves as plain SQL, on the same database
                        seed_http_run(alias, args.seconds, args.seed_scale * PLAIN_SEED_SCALE, mode)
                        outcome = run_agents(bare_server.port, ["-"] * agents, mode, args.seconds,
                                             bare_server.process.pid)
                        if not outcome.errors:
                            outcome.errors.extend(verify_database(alias, outcome))
                        claims.clear(alias)
                        plain_runs[mode].append(outcome)
                print(f"  {agents} agent(s), round {round_no}/{args.rounds}: "
                      + ", ".join(f"{mode} {runs[mode][-1].rate:,.0f} tasks/s "
                                  f"({fmt_ms(runs[mode][-1].server_ms_per_task)} ms CPU/task)" for mode in args.modes)
                      + (f", bare {bare_runs[-1].rate:,.0f} req/s" if bare_runs else "")
                      + "".join(f", plain {mode} {plain[-1].rate:,.0f} tasks/s ({fmt_ms(plain[-1].server_ms_per_task)} "
                                "ms CPU/task)" for mode, plain in plain_runs.items()), flush=True)
            interleaved.append(Interleaved(backend, workers, agents, runs, bare_runs, plain_runs))
            if "cycle" not in runs:
                continue
            middle = median_run(runs["cycle"])
            lock = locks[runs["cycle"].index(middle)]
            inproc = None
            if inprocess:
                claims.clear(alias)
                claims.OursDriver(alias).seed(claims.seed_size(backend, "ours", args), tied=False)
                claims.tidy(alias)
                # This thread's connection goes back (to the pool, on PostgreSQL, whose size is
                # the server's: HTTP threads + 4): the loop's threads need one each.
                connections[alias].close()
                inproc = claims.run_threads(claims.OursDriver(alias), agents, args.seconds)
                claims.clear(alias)
            rows.append(Row(backend, workers, agents, middle, inproc, lock))
            if inproc:
                print(f"  {agents} agent(s): {inproc.rate:,.0f} cycles/s in-process", flush=True)
        if not args.no_ceiling:
            kinds = (["probe-401"] if probe_401 else []) + ["probe-404"]
            for mode in kinds:
                for agents in args.agents:
                    sampler = Sampler(args.py_spy, server.process.pid,
                                      f"{backend}-w{workers}-{mode}-x{agents}", args.ceiling_seconds)
                    outcome = run_agents(server.port, keys[:agents], mode, args.ceiling_seconds,
                                         server.process.pid)
                    sampler.wait()
                    probes.append(Probe(mode, backend, workers, outcome))
        server.check_alive("the run")
        if bare_server is not None:
            bare_server.check_alive("the bare view's runs")
    finally:
        for running in (server, bare_server):
            if running is not None:
                running.close()
        for row, _key in made:
            agent_keys.revoke(row.pk, using=alias)
    return rows, probes, interleaved


# ---------------------------------------------------------------------------------------------
# Printing


def fmt_ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def fmt_cpu(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def fmt_ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def divide(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def judged(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "NOT met")


def p50_p99(values: list[float]) -> str:
    return f"{fmt_ms(percentile(values, 50))}/{fmt_ms(percentile(values, 99))} ms"


def bare_rate(bare: list[BareRun], server: str, workers: int, agents: int) -> float:
    """The median req/s of the bare view's runs under `server` with `workers`, at `agents`."""
    rates = [run.outcome.rate for run in bare
             if run.server == server and run.outcome.agents == agents and (server == "daphne" or run.workers == workers)]
    return statistics.median(rates) if rates else math.nan


def spread(values: list[float], fmt) -> str:
    """median [min-max] of `values`, each through `fmt`."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}-{fmt(max(values))}]"


def print_interleaved(interleaved: list[Interleaved], args: argparse.Namespace) -> None:
    """Issue 34's table: each mode's rate, p99 and server CPU per completed task over the
    interleaved rounds, beside the bare view's req/s of the same interleaving."""
    if not interleaved:
        return
    print()
    print(f"Interleaved runs (ours {', '.join(m for m in args.modes)}, then the bare view; repeated "
          f"{args.rounds} times): median [min-max] over the rounds")
    line = "{:<9} {:>3} {:>6}  {:<29} {:>4} {:>22} {:>8} {:>24} {:>7} {:>7}  {}".format
    header = line("backend", "wkr", "agents", "run", "runs", "tasks/s (req/s: bare)", "p99 ms",
                  "server CPU ms/task (req)", "cores", "/bare", "goals at 8 agents (issue 34)")
    print(header)
    print("-" * len(header))
    count = lambda v: f"{v:,.0f}"  # noqa: E731
    ms = lambda v: f"{v:.2f}"  # noqa: E731
    for block in interleaved:
        bare_median = statistics.median([o.rate for o in block.bare]) if block.bare else math.nan
        for mode, runs in block.runs.items():
            if not runs:
                continue
            pooled = [t for o in runs for t in o.claim_ms + o.complete_ms]
            rps = statistics.median([o.requests_per_second for o in runs])
            goal = "-"
            if mode in GOALS_34 and block.agents == GOAL_AGENTS:
                cpu_goal, rate_goal = GOALS_34[mode]
                cpu = statistics.median([o.server_ms_per_task for o in runs])
                rate = statistics.median([o.rate for o in runs])
                goal = (f"CPU <= {cpu_goal:g} ms {judged(cpu <= cpu_goal)}, "
                        f">= {rate_goal:,.0f}/s {judged(rate >= rate_goal)}")
            print(line(block.backend, block.workers, block.agents, MODES[mode], len(runs),
                       spread([o.rate for o in runs], count), fmt_ms(percentile(pooled, 99)),
                       spread([o.server_ms_per_task for o in runs], ms),
                       fmt_cpu(statistics.median([o.server_cpu for o in runs])), fmt_ratio(divide(rps, bare_median)),
                       goal))
        if block.bare:
            pooled = [t for o in block.bare for t in o.probe_ms]
            print(line(block.backend, block.workers, block.agents, f"bare view (GET {http_agent.BARE_PATH})",
                       len(block.bare), spread([o.rate for o in block.bare], count), fmt_ms(percentile(pooled, 99)),
                       spread([o.server_ms_per_request for o in block.bare], ms),
                       fmt_cpu(statistics.median([o.server_cpu for o in block.bare])), "1.00", "-"))
        for mode, plain in block.plain.items():
            if not plain:
                continue
            pooled = [t for o in plain for t in o.claim_ms + o.complete_ms]
            ours_cpu = statistics.median([o.server_ms_per_task for o in block.runs[mode]])
            plain_cpu = statistics.median([o.server_ms_per_task for o in plain])
            print(line(block.backend, block.workers, block.agents, f"plain SQL {MODES[mode][:3]}, bare server",
                       len(plain), spread([o.rate for o in plain], count), fmt_ms(percentile(pooled, 99)),
                       spread([o.server_ms_per_task for o in plain], ms),
                       fmt_cpu(statistics.median([o.server_cpu for o in plain])),
                       fmt_ratio(divide(statistics.median([o.requests_per_second for o in plain]), bare_median)),
                       f"ours' CPU / plain's: {fmt_ratio(divide(ours_cpu, plain_cpu))}"))
    print("tasks/s = tasks completed per second (bare view: its req/s); p99 = of every request of the rounds "
          "(claims, completes, batch requests);")
    print("server CPU ms/task = the server's process tree's user+system CPU (/proc/<pid>/stat, its supervisor and "
          "workers) over the run / tasks completed")
    print("     (bare view: per request); cores = that CPU over the run's wall time; /bare = the mode's req/s over "
          "the bare view's req/s (medians);")
    print(f"(a) = POST /api/claim + POST /api/tasks/{{id}}/complete; (b) = POST /api/tasks/{{id}}/complete with "
          f"next (one request per task); (c) = POST /api/claim max_tasks={http_agent.BATCH} + POST /api/complete")
    if any(block.plain for block in interleaved):
        print("plain SQL = the same requests answered on the bare view's server by bench/claims.py's RawDriver (the pick, "
              "UPDATE + INSERT per move; (b)'s two moves in one transaction, (c)'s claims in one and its completions in "
              "one: bench/bare_urls.py): no engine, no django-ninja, no key")
    for block in interleaved:
        where = f"{block.backend} w{block.workers} x{block.agents}"
        for mode, runs in [*block.runs.items(), ("bare", block.bare),
                           *((f"plain {plain_mode}", plain) for plain_mode, plain in block.plain.items())]:
            for round_no, outcome in enumerate(runs, 1):
                if outcome.ran_dry and mode != "bare":
                    print(f"note: {where} {mode} round {round_no} ran out of seeded tasks after "
                          f"{outcome.seconds:.2f} s ({outcome.cycles} tasks); its rate is over that time "
                          "(try --seed-scale 2)")
                for error in outcome.errors:
                    print(f"ERROR: {where} {mode} round {round_no}: {error}")


def print_tables(rows: list[Row], probes: list[Probe], bare: list[BareRun], args: argparse.Namespace) -> None:
    if not rows and not probes and not bare:
        print("no rows measured")
        return
    ceiling = {(p.workers, p.outcome.agents): p.outcome.rate for p in probes if p.what == "probe-401"}
    inproc = {(row.backend, row.agents): row.inproc for row in rows if row.inproc}
    if rows:
        line = "{:<9} {:>3} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6} {:>7} {:>6}  {:>14}  {:>14}  {:>3}  {}".format
        header = line("backend", "wkr", "agents", "cycles/s", "req/s", "bare", "/bare", "% ceil",
                      "inproc", "ratio", "claim p50/p99", "compl p50/p99", "dbl",
                      f"goals (>= {GOAL_RATE:g} cyc/s, p99 < {GOAL_P99_MS:g} ms, /bare >= {GOAL_BARE_RATIO})")
        print(header)
        print("-" * len(header))
        for row in rows:
            h = row.http
            ceil = ceiling.get((row.workers, row.agents))
            base = bare_rate(bare, "serve", row.workers, row.agents)
            over_bare = divide(h.requests_per_second, base)
            ip = inproc.get((row.backend, row.agents))
            ratio = divide(h.rate, ip.rate) if ip else math.nan
            rate_ok = judged(h.rate >= GOAL_RATE if row.agents == GOAL_AGENTS else None)
            p99_ok = judged(row.p99_ms < GOAL_P99_MS)
            bare_ok = judged(None if math.isnan(over_bare) else over_bare >= GOAL_BARE_RATIO)
            print(line(
                row.backend, row.workers, row.agents, f"{h.rate:,.0f}", f"{h.requests_per_second:,.0f}",
                "-" if math.isnan(base) else f"{base:,.0f}", fmt_ratio(over_bare),
                f"{200 * h.rate / ceil:.0f}%" if ceil else "-",
                f"{ip.rate:,.0f}" if ip else "-", fmt_ratio(ratio),
                p50_p99(h.claim_ms), p50_p99(h.complete_ms), h.double_claims,
                f"rate {rate_ok}, p99 {p99_ok}, /bare {bare_ok}",
            ))
    if bare:
        print()
        print(f"Bare view baseline: GET {http_agent.BARE_PATH}, a JSON view with no database behind "
              "settings.MIDDLEWARE, same agent processes")
        bline = "{:<40} {:>3} {:>6} {:>8} {:>15} {:>9}  {:>6} {:>6} {:>7} {:>16}".format
        bheader = bline("server", "wkr", "agents", "req/s", "p50/p99", "vs daphne", "server", "agents",
                        "machine", "server CPU ms/req")
        print(bheader)
        print("-" * len(bheader))
        names = {"serve": "manage.py serve (WSGI handler, as board)",
                 "daphne": "daphne, Django's ASGI handler"}
        groups: dict[tuple[str, int, int], list[HttpOutcome]] = {}
        for run in bare:  # serve's runs: one per round of the interleaving; medians shown
            groups.setdefault((run.server, run.workers, run.outcome.agents), []).append(run.outcome)
        for (server_kind, workers, agents), outcomes in groups.items():
            rate = statistics.median([o.rate for o in outcomes])
            vs = divide(rate, bare_rate(bare, "daphne", 1, agents)) if server_kind == "serve" else math.nan
            med = lambda name: statistics.median([getattr(o, name) for o in outcomes])  # noqa: E731
            print(bline(names[server_kind], workers, agents, f"{rate:,.0f}",
                        p50_p99([t for o in outcomes for t in o.probe_ms]), fmt_ratio(vs), fmt_cpu(med("server_cpu")),
                        fmt_cpu(med("agents_cpu")), fmt_cpu(med("machine_cpu")), fmt_ms(med("server_ms_per_request"))))
    if probes:
        print()
        print("HTTP ceiling of the API: the same agent processes and server, looping one cheap request")
        pline = "{:<53} {:<9} {:>3} {:>6} {:>8} {:>15}  {:>6} {:>6} {:>7} {:>16}".format
        pheader = pline("request", "backend", "wkr", "agents", "req/s", "p50/p99", "server", "agents",
                        "machine", "server CPU ms/req")
        print(pheader)
        print("-" * len(pheader))
        names = {"probe-401": f"GET {http_agent.MISSING_TASK}, no key -> 401 (no DB)",
                 "probe-404": f"GET {http_agent.MISSING_TASK}, key -> 404 (2 SELECTs)"}
        for probe in probes:
            o = probe.outcome
            print(pline(names[probe.what], probe.backend, probe.workers, o.agents, f"{o.rate:,.0f}",
                        p50_p99(o.probe_ms), fmt_cpu(o.server_cpu), fmt_cpu(o.agents_cpu),
                        fmt_cpu(o.machine_cpu), fmt_ms(o.server_ms_per_request)))
    if rows:
        print()
        print(f"CPU during the claim->complete runs (cores busy; this machine has {os.cpu_count()}):")
        cline = "{:<9} {:>3} {:>6} {:>12} {:>12} {:>10} {:>12} {:>8} {:>14} {:>22}".format
        cheader = cline("backend", "wkr", "agents", "server procs", "agent procs", "postgres", "all the rest",
                        "stolen", "whole machine", "server CPU ms/request")
        print(cheader)
        print("-" * len(cheader))
        for row in rows:
            h = row.http
            print(cline(row.backend, row.workers, row.agents, fmt_cpu(h.server_cpu), fmt_cpu(h.agents_cpu),
                        fmt_cpu(h.postgres_cpu),
                        fmt_cpu(h.machine_cpu - h.server_cpu - h.agents_cpu - h.postgres_cpu - h.stolen_cpu),
                        fmt_cpu(h.stolen_cpu), fmt_cpu(h.machine_cpu), fmt_ms(h.server_ms_per_request)))
    locked = [row for row in rows if row.lock is not None]
    if locked:
        print()
        print("SQLite's writers' lock during the claim->complete runs (the server's /metrics, all its processes):")
        lline = "{:<9} {:>3} {:>6} {:>13} {:>10} {:>10} {:>16} {:>10}".format
        lheader = lline("backend", "wkr", "agents", "transactions", "wait ms", "hold ms",
                        f"holds > {HOLD_SHORT_SECONDS * 1000:g} ms", "lock busy")
        print(lheader)
        print("-" * len(lheader))
        for row in locked:
            lk = row.lock
            print(lline(row.backend, row.workers, row.agents, f"{lk.transactions:,}", f"{lk.wait_ms:.2f}",
                        f"{lk.hold_ms:.2f}", f"{100 * lk.long_holds:.1f}%", f"{lk.busy:.2f}"))
        print("wait/hold ms = mean per write transaction; lock busy = seconds held per second of the run "
              "(1.00: one writer all the time, the file is the limit)")
    print_workers_comparison(rows, bare)
    for row in rows:
        where = f"{row.backend} w{row.workers} x{row.agents}"
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
            print(f"ERROR: ceiling {probe.what} {probe.backend} w{probe.workers} x{probe.outcome.agents}: {error}")
    for run in bare:
        for error in run.outcome.errors:
            print(f"ERROR: bare view {run.server} w{run.workers} x{run.outcome.agents}: {error}")
    print()
    from taskflow_site.settings import http_threads  # what each server ran with, by its database

    threads = (f"HTTP threads each: {http_threads('django.db.backends.sqlite3')} on SQLite, "
               f"{http_threads('django.db.backends.postgresql')} on PostgreSQL")
    print(f"cycle = POST /api/claim + POST /api/tasks/{{id}}/complete; {args.seconds:g} s per run "
          f"({args.bare_seconds:g} s per bare-view run, {args.ceiling_seconds:g} s per ceiling run);")
    print(f"wkr = server worker processes (manage.py serve --workers), {threads} "
          "(TASKFLOW_HTTP_THREADS); req/s = 2 x cycles/s;")
    print("bare = the bare view's req/s under manage.py serve with as many workers, at the same agent "
          "count (on the SQLite settings, so with SQLite's HTTP threads); /bare = req/s over it;")
    print("% ceil = req/s over the 401 ceiling at the same agent count and workers;")
    print("inproc = bench/claims.py 'ours' loop (the engine's claim_next + complete, no HTTP) with as many "
          "threads, same database, same run; ratio = http/in-process (for context);")
    print("CPU: server procs = the server's supervisor and worker processes (all threads), agent procs = "
          "the agents' own loops,")
    print("     postgres = the local PostgreSQL server's processes, all the rest = the kernel's share and "
          "any other load, stolen = time the hypervisor")
    print("     gave other guests while this machine wanted to run (steal: figures of a run with much of it "
          "measured a busy host); 1.00 = one core busy for the run;")
    print(f"goals (issue): at {GOAL_AGENTS} agents >= {GOAL_RATE:g} cycles/s (SQLite and PostgreSQL), "
          f"p99 < {GOAL_P99_MS:g} ms (the worse of claim and complete),")
    print(f"     req/s >= {GOAL_BARE_RATIO} x the bare view's req/s under the same server (p99 and /bare "
          "judged on every row); with --compare-workers, more")
    print("     server processes >= 1.3 x fewer on PostgreSQL and > 1 x on SQLite; missing one is "
          "reported, not an error")


def print_workers_comparison(rows: list[Row], bare: list[BareRun]) -> None:
    sizes = sorted({row.workers for row in rows})
    if len(sizes) < 2:
        return
    first = sizes[0]
    by_key = {(row.backend, row.workers, row.agents): row for row in rows}
    print()
    print(f"Server processes: cycles/s with N workers over {first} worker(s), same backend, agents and run")
    wline = "{:<9} {:>6} {:>3} {:>11} {:>11} {:>6} {:>10}  {}".format
    wheader = wline("backend", "agents", "N", f"cyc/s (w{first})", "cyc/s (wN)", "ratio", "bare ratio", "goal")
    print(wheader)
    print("-" * (len(wheader) + 16))
    for row in rows:
        if row.workers == first:
            continue
        base = by_key.get((row.backend, first, row.agents))
        if base is None:
            continue
        ratio = divide(row.http.rate, base.http.rate)
        bare_ratio = divide(bare_rate(bare, "serve", row.workers, row.agents),
                            bare_rate(bare, "serve", first, row.agents))
        goal, op = GOAL_WORKERS[row.backend]
        ok = None
        if row.agents == GOAL_AGENTS and row.workers > first and not math.isnan(ratio):
            ok = ratio >= goal if op == ">=" else ratio > goal
        print(wline(row.backend, row.agents, row.workers, f"{base.http.rate:,.0f}", f"{row.http.rate:,.0f}",
                    fmt_ratio(ratio), fmt_ratio(bare_ratio),
                    f"{op} {goal:g} (at {GOAL_AGENTS} agents): {judged(ok)}"))
    print(f"bare ratio = the bare view's req/s with N workers over {first}, same agents (what the serving "
          "stack alone gains)")


# ---------------------------------------------------------------------------------------------


def parse_int_list(parser: argparse.ArgumentParser, value: str, what: str) -> list[int]:
    try:
        numbers = [int(a) for a in value.split(",") if a.strip()]
    except ValueError:
        parser.error(f"{what} needs positive integers")
    if not numbers or min(numbers) < 1:
        parser.error(f"{what} needs positive integers")
    return numbers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", default="1,4,8", help="comma-separated agent process counts (default 1,4,8)")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite,postgres")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each run (default 5)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds at each agent count: each round runs every --modes once, "
                             "then the bare view (default 5); medians and spreads are over the rounds")
    parser.add_argument("--modes", default="cycle,next,batch",
                        help="comma-separated, in this order in each round: cycle = (a) claim then complete, "
                             "next = (b) complete-and-claim-next, batch = (c) batches of "
                             f"{http_agent.BATCH} (default cycle,next,batch)")
    parser.add_argument("--workers", type=int, default=None,
                        help="server worker processes (manage.py serve --workers; default: the serve "
                             "default, TASKFLOW_WORKERS or one per core)")
    parser.add_argument("--server", choices=sorted(SERVER_NAMES), default="serve",
                        help="the board's server and the bare view's beside it: manage.py serve (uvicorn, "
                             "as in production; default) or the same ASGI application under granian")
    parser.add_argument("--compare-workers", default=None, metavar="N,M",
                        help="measure the board (and the bare view) with each of these worker counts in "
                             "turn and print the ratios (e.g. 1,2); replaces --workers")
    parser.add_argument("--bare-seconds", type=float, default=3.0,
                        help="duration of each bare-view run (default 3)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare view baseline")
    parser.add_argument("--no-daphne", action="store_true", help="skip the bare view under daphne")
    parser.add_argument("--ceiling-seconds", type=float, default=2.0,
                        help="duration of each ceiling probe run (default 2)")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the HTTP ceiling probes")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process comparison")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help=f"default {DEFAULT_PG_URL}")
    parser.add_argument("--dir", default=None, help="folder in which to make the SQLite temp dir")
    parser.add_argument("--seed-scale", type=float, default=1.0,
                        help="seed this many times more tasks per run (when a run ran out)")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="sample the server (all its processes) with `py-spy record --gil "
                             "--subprocesses --format raw` during each HTTP run into "
                             "DIR/<backend>-w<workers>[-<probe>]-x<agents>.txt and "
                             "DIR/bare-<server>-w<workers>-x<agents>.txt (py-spy on PATH or in the venv)")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(claims.ALIASES)
    if unknown:
        parser.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    args.agents = parse_int_list(parser, args.agents, "--agents")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - set(MODES) or len(set(args.modes)) != len(args.modes):
        parser.error(f"--modes takes some of {', '.join(MODES)}, each once")
    if args.rounds < 1:
        parser.error("--rounds needs a positive integer")
    if args.compare_workers is not None:
        args.compare_workers = parse_int_list(parser, args.compare_workers, "--compare-workers")
    if args.workers is not None and args.workers < 1:
        parser.error("--workers needs a positive integer")
    args.tied = False  # what claims.seed_size and OursDriver.seed expect
    return args


def machine_load(seconds: float = 1.0) -> float:
    """Cores busy over `seconds` before the bench starts: other load on a shared machine
    depresses every figure of the run."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - before) / seconds


def print_machine_load() -> None:
    load = machine_load()
    if not math.isnan(load):
        print(f"machine load before the bench: {load:.2f} of {os.cpu_count()} cores busy"
              + ("  (other processes are running: every figure below is depressed)" if load > 0.3 else ""))


def serve_default_workers() -> int:
    """What `manage.py serve` runs without --workers (its own rule; Django must be configured)."""
    from board.management.commands.serve import default_workers

    return default_workers()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.server == "granian" and importlib.util.find_spec("granian") is None:
        print(f"NOT RUN: --server granian needs granian, which the project does not pin: "
              f"{sys.executable} -m pip install {GRANIAN_PIN}")
        return 1
    rows: list[Row] = []
    probes: list[Probe] = []
    bare: list[BareRun] = []
    failures: list[str] = []
    interleaved: list[Interleaved] = []
    print_machine_load()
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
        claims.configure_django(sqlite_path, pg_url, threads=max(args.agents))  # in-process loop's pool
        workers_list = args.compare_workers or [args.workers or serve_default_workers()]
        urls = {"sqlite": f"sqlite:///{sqlite_path}"}
        if pg_url:
            urls["postgres"] = pg_url
        backends = [b for b in args.backends if b in urls]
        claims.migrate(claims.ALIASES["sqlite"])  # the bare view's servers name this database
        for backend in backends:
            claims.migrate(claims.ALIASES[backend])
        if not args.no_bare:
            try:
                bare = measure_bare(urls["sqlite"], args, workers_list)
            except RuntimeError as exc:
                failures.append(f"bare view: {exc}")
                print(f"ERROR: bare view: {exc}")
        for backend in backends:
            for n, workers in enumerate(workers_list):
                try:
                    more_rows, more_probes, more_interleaved = run_backend(
                        backend, urls[backend], args, workers,
                        probe_401=backend == backends[0], inprocess=n == 0 and not args.no_inprocess,
                        bare_url=None if args.no_bare else urls[backend])
                except RuntimeError as exc:  # the server did not start, or died
                    failures.append(f"{backend} w{workers}: {exc}")
                    print(f"ERROR: {backend} w{workers}: {exc}")
                    continue
                rows += more_rows
                probes += more_probes
                interleaved += more_interleaved
                bare += [BareRun("serve", workers, o) for block in more_interleaved for o in block.bare]
        print()
        print_tables(rows, probes, bare, args)
        print_interleaved(interleaved, args)
        from django.db import connections

        connections.close_all()
    if not_run:
        print(not_run)

    # Every interleaved run counts (the rows' HTTP runs are among them; the bare view's too).
    runs = [o for block in interleaved for o in block.outcomes()]
    doubles = sum(o.double_claims for o in runs)
    doubles += sum(row.inproc.double_claims for row in rows if row.inproc)
    faults = sum(len(o.errors) for o in runs) + sum(len(row.inproc.errors) for row in rows if row.inproc)
    faults += sum(len(p.outcome.errors) for p in probes)
    faults += sum(len(b.outcome.errors) for b in bare if b.server == "daphne")
    faults += len(failures)
    if doubles:
        print(f"\nFAIL: {doubles} double claim(s) seen")
    if faults:
        print(f"\nFAIL: {faults} error(s); the figures they touch are not valid")
    return 1 if doubles or faults else 0


if __name__ == "__main__":
    sys.exit(main())
