"""What one API request costs, part by part: an agent's requests through Django's WSGI handler
in this process (claim then complete; complete-and-claim-next; batches of 10), beside a bare
view and the plain-driver cycle, in CPU per request and per task.

Why this exists
---------------
bench/http_claims.py measures the board over HTTP, where the machine's noise (other processes,
the hypervisor's steal, the GIL shared by a server's threads) moves the figures from run to
run. This script takes the server out: one thread calls the WSGI application ``manage.py
serve`` runs every HTTP request through (server.serving.wsgi_application: Django's handler,
an agent's hot requests through server/hot_requests.py) with the same request an agent
sends, and reads this process's CPU clock (``time.process_time``) around it. On SQLite
everything a request costs, the database included, is CPU of this process, so the split below
adds up; on PostgreSQL the database server's own CPU is not in it (the wall time per request
is printed beside).

What is measured (each backend in a child process of its own, one thread)
---------------------------------------------------------------------------
- **bare view**: ``GET /api/bare`` of bench/bare_urls.py (a JSON answer, no database) behind the
  project's whole middleware stack, and again with no middleware at all: the floor that Django
  itself sets under any view.
- **ours**, in three modes (``--modes``, as bench/http_claims.py's (a), (b) and (c)), with a
  bearer key, on a database seeded with QUEUED tasks, the way bench/http_agent.py sends them:
  *cycle*: ``POST /api/claim {"ttl_seconds": 60}`` then ``POST /api/tasks/{id}/complete``;
  *next*: ``POST /api/tasks/{id}/complete`` with ``next`` (one request per task); *batch*:
  ``POST /api/claim`` with ``max_tasks: 10`` then ``POST /api/complete`` with the ten.
  Its CPU is split by timing, inside the same requests:
  - *engine verb*: ``transitions.claim_next`` / ``complete`` / ``complete_and_claim`` /
    ``claim_batch`` / ``complete_batch`` (the transaction, its statements, the commit);
  - *key check*: ``board.agent_keys.authenticate_deferred`` (what the hot verbs' requests
    call: a key verified in the last minute costs no query there, the move checks it) and
    ``authenticate`` (the lookup);
  - *input parsing*: the body to its schema: ``HotRoute.body`` for an agent's hot requests,
    django-ninja's ``Operation._get_values`` for the others (body and path to the schema);
  - *URL routing*: Django's ``URLResolver.resolve`` (the path to its view; an agent's hot
    requests are matched by server/hot_requests.py, counted in the rest);
  - *rendering*: the answer's JSON (``board.api.rendering.dumps``, and django-ninja's
    ``NinjaAPI.create_response`` for the endpoints that return a schema);
  - *the rest*: Django's request cycle, the middleware, django-ninja's own dispatch (for an
    agent's hot requests, server/hot_requests.py's) and our endpoint code around the verb.
  The timers are wrappers put around those functions for the measured loop only; they cost a
  little themselves, so the loop is run once more without them and both totals are printed.
- **raw**: bench/claims.py's plain-driver cycle (``RawDriver``: the same moves as one UPDATE +
  INSERT per transaction, no Django) on the same database: what the statements cost alone; and
  (b)'s two moves in one transaction (``RawDriver.complete_and_claim``), beside (b)'s engine verb.

It then prints, per request (and per task, for the modes whose requests move several): ours / bare (how many bare requests one of ours costs), and what
ours / bare could at best become if everything but the engine verb cost nothing more than the
bare view does ("floor": bare + engine verb). bench/http_claims.py's "/bare" goal (issue 8:
ours >= 0.25 of the bare view's req/s) is, in this process, ``bare / ours >= 0.25``.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/api_cost.py                        # SQLite and PostgreSQL, 2,000 tasks per mode
    .venv/bin/python bench/api_cost.py --backends sqlite --cycles 5000 --modes next
    .venv/bin/python bench/api_cost.py --pg-url postgres://postgres@127.0.0.1:5432/taskflow_bench

PostgreSQL: the database named by --pg-url (created when missing, board tables emptied); when
it does not answer, its row is skipped with a line saying so. Figures are printed from this
run's measurements only; compare within one run.
"""
from __future__ import annotations

import argparse
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench import claims  # after the path: run as a script from anywhere

WARMUP_CYCLES = 50
# The parts timed inside our requests: (label, module path, attribute path).
PARTS = (
    ("engine verb", "board.engine.transitions", "claim_next"),
    ("engine verb", "board.engine.transitions", "complete"),
    ("engine verb", "board.engine.transitions", "complete_and_claim"),
    ("engine verb", "board.engine.transitions", "claim_batch"),
    ("engine verb", "board.engine.transitions", "complete_batch"),
    ("key check", "board.agent_keys", "authenticate"),
    ("key check", "board.agent_keys", "authenticate_deferred"),  # the hot verbs' (it may call the above)
    ("input parsing", "ninja.operation", "Operation._get_values"),
    ("input parsing", "server.hot_requests", "HotRoute.body"),  # an agent's hot requests
    ("URL routing", "django.urls.resolvers", "URLResolver.resolve"),
    ("rendering", "board.api.rendering", "dumps"),
    ("rendering", "ninja.renderers", "JSONRenderer.render"),  # (before board.api.rendering)
    ("rendering", "ninja.main", "NinjaAPI.create_response"),
)
MODES = ("cycle", "next", "batch")
BATCH = 10  # tasks per batch in the batch mode (bench/http_claims.py's (c))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite,postgres")
    parser.add_argument("--cycles", type=int, default=2000, help="tasks per loop and mode (default 2000)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated: cycle (claim then complete), next (complete-and-claim-next), "
                             "batch (batches of 10); default all three")
    parser.add_argument("--pg-url", default=claims.DEFAULT_PG_URL)
    parser.add_argument("--dir", default=None, help="folder for the SQLite file (default: the system's temp folder)")
    parser.add_argument("--child", choices=("sqlite", "postgres"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The child: one backend, Django configured with it as the default database.


class Caller:
    """Requests straight into the server's WSGI application, as server/serving.py hands them."""

    def __init__(self, key: str):
        from server.serving import wsgi_application

        self.app = wsgi_application()
        self.auth = f"Bearer {key}"

    def __call__(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        environ = {
            "REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(data)),
            "HTTP_AUTHORIZATION": self.auth, "wsgi.input": io.BytesIO(data), "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
        }
        started = {}

        def start_response(status, headers, exc_info=None):
            started["status"] = int(status.split(" ", 1)[0])

        result = self.app(environ, start_response)
        try:
            answer = b"".join(result)
        finally:
            result.close()
        return started["status"], answer


def _ok(what: str, status: int, answer: bytes) -> dict:
    if status != 200:
        raise SystemExit(f"{what} answered {status}: {answer[:200]!r}")
    return json.loads(answer)


def cycle(call: Caller) -> tuple[int, int]:
    """(a) claim then complete: (tasks completed, requests)."""
    claimed = _ok("claim", *call("POST", "/api/claim", {"ttl_seconds": claims.TTL_SECONDS}))
    task_id, token = claimed["task"]["id"], claimed["lease"]["token"]
    _ok("complete", *call("POST", f"/api/tasks/{task_id}/complete", {"token": token, "result": claims.RESULT}))
    return 1, 2


class NextLoop:
    """(b) complete-and-claim-next: each call completes the lease held and gets the next one in
    the same request (the first call claims first, uncounted)."""

    def __init__(self, call: Caller):
        self.call = call
        self.held: tuple[str, str] | None = None

    def __call__(self) -> tuple[int, int]:
        if self.held is None:
            claimed = _ok("claim", *self.call("POST", "/api/claim", {"ttl_seconds": claims.TTL_SECONDS}))
            self.held = claimed["task"]["id"], claimed["lease"]["token"]
        task_id, token = self.held
        answer = _ok("complete with next", *self.call("POST", f"/api/tasks/{task_id}/complete", {
            "token": token, "result": claims.RESULT, "next": {"ttl_seconds": claims.TTL_SECONDS}}))
        following = answer["next"]
        if following is None:
            raise SystemExit("complete with next found no next task: the seed ran out")
        self.held = following["task"]["id"], following["lease"]["token"]
        return 1, 1


def batch(call: Caller) -> tuple[int, int]:
    """(c) claim BATCH, complete them in one request."""
    leases = _ok("batch claim", *call("POST", "/api/claim", {"ttl_seconds": claims.TTL_SECONDS,
                                                              "max_tasks": BATCH}))["leases"]
    answer = _ok("batch complete", *call("POST", "/api/complete", {"items": [
        {"id": lease["task"]["id"], "token": lease["lease"]["token"], "result": claims.RESULT} for lease in leases]}))
    if not all(item["ok"] for item in answer["items"]):
        raise SystemExit(f"a batch completion was refused: {answer['items'][:2]}")
    return len(leases), 2


class RawNextLoop:
    """(b)'s moves with the raw driver: each call completes the lease held and claims the next
    task in one transaction (RawDriver.complete_and_claim; the first call claims first)."""

    def __init__(self, raw, conn):
        self.raw, self.conn = raw, conn
        self.held = None

    def __call__(self) -> None:
        if self.held is None:
            self.held = self.raw.claim_next(self.conn, "api-cost-raw")
        self.held = self.raw.complete_and_claim(self.conn, "api-cost-raw", self.held)
        if self.held is None:
            raise SystemExit("the raw (b) loop found no next task: the seed ran out")


def bare(call: Caller) -> tuple[int, int]:
    from bench.http_agent import BARE_PATH

    status, answer = call("GET", BARE_PATH)
    if status != 200:
        raise SystemExit(f"the bare view answered {status}: {answer[:200]!r}")
    return 1, 1


class Measured(NamedTuple):
    cpu: float  # seconds of this process's CPU
    wall: float
    tasks: int
    requests: int

    def per_request(self) -> tuple[float, float]:
        """(CPU ms, wall ms) per request."""
        return self.cpu * 1000 / self.requests, self.wall * 1000 / self.requests

    def per_task(self) -> float:
        return self.cpu * 1000 / self.tasks


def measure(loop, tasks: int) -> Measured:
    """Call `loop` (which answers (tasks, requests)) until `tasks` tasks are done."""
    done = requests = 0
    cpu, wall = time.process_time(), time.perf_counter()
    while done < tasks:
        moved, sent = loop()
        done, requests = done + moved, requests + sent
    return Measured(time.process_time() - cpu, time.perf_counter() - wall, done, requests)


def per_request(loop, count: int, requests_per_call: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per request over `count` calls of `loop`."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        loop()
    return Measured(time.process_time() - cpu, time.perf_counter() - wall, count, count * requests_per_call).per_request()


class PartTimers:
    """CPU spent in each of PARTS, summed per label, while installed (outermost calls only, so
    that a timed part calling another is not counted twice)."""

    def __init__(self):
        import importlib

        self.cpu: dict[str, float] = {label: 0.0 for label, _, _ in PARTS}
        self._depth = 0
        self._saved = []
        for label, module_name, attribute in PARTS:
            try:  # a part this checkout does not have (an older one, for a comparison) stays at 0
                owner = importlib.import_module(module_name)
            except ImportError:
                continue
            *path, name = attribute.split(".")
            for step in path:
                owner = getattr(owner, step)
            self._saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, self._timed(label, owner.__dict__[name]))

    def _timed(self, label: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            self._depth += 1
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.cpu[label] += time.process_time() - started
        return timed

    def remove(self) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def child(args: argparse.Namespace) -> int:
    backend = args.child
    modes = [mode for mode in args.modes.split(",") if mode]
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        sqlite_path = Path(folder) / "api_cost.sqlite3"
        if backend == "sqlite":
            url = f"sqlite:///{sqlite_path}"
        else:
            why = claims.ensure_postgres_database(args.pg_url)
            if why:
                print(f"postgres: skipped, {args.pg_url} did not answer ({why})")
                return 0
            url = args.pg_url
        os.environ.pop("DATABASE_URL", None)
        project = claims.project_settings()
        claims._configure(project, {"default": project.database_from_url(url)})
        from django.test.utils import override_settings

        from board import agent_keys

        claims.migrate("default")
        claims.clear("default")
        key_row, key = agent_keys.create_key(f"api-cost-{os.getpid()}")
        call = Caller(key)
        cycles = args.cycles
        results = []
        for mode in modes:
            claims.clear("default")
            # Three loops (untimed, timed parts, untimed again) and the warm-up, a batch's worth spare.
            claims.seed_with_engine("default", 3 * cycles + 2 * WARMUP_CYCLES + 2 * BATCH, tied=False)
            ours = {"cycle": functools.partial(cycle, call), "next": NextLoop(call),
                    "batch": functools.partial(batch, call)}[mode]
            measure(ours, WARMUP_CYCLES)
            plain = measure(ours, cycles)
            timers = PartTimers()
            try:
                timed = measure(ours, cycles)
            finally:
                timers.remove()
            again = measure(ours, cycles)
            # The untimed loop with less CPU (the other was slowed by something else).
            best = min(plain, again, key=lambda m: m.cpu / m.tasks)
            parts = {label: cpu * 1000 / timed.requests for label, cpu in timers.cpu.items()}
            # The split is of the timed loop; "the rest" is what the timed parts leave of its total.
            parts["the rest"] = timed.cpu * 1000 / timed.requests - sum(parts.values())
            results.append({"mode": mode, "ours_cpu": best.per_request()[0], "ours_wall": best.per_request()[1],
                            "ours_task_cpu": best.per_task(),
                            "timed_cpu": timed.per_request()[0], "parts": parts})

        with override_settings(ROOT_URLCONF="bench.bare_urls"):
            bare_loop = functools.partial(bare, call)
            per_request(bare_loop, WARMUP_CYCLES, 1)
            bare_cpu, _ = per_request(bare_loop, 2 * cycles, 1)
            with override_settings(MIDDLEWARE=[]):
                call_plain = Caller(key)  # the handler reads MIDDLEWARE when it is built
                plain_loop = functools.partial(bare, call_plain)
                per_request(plain_loop, WARMUP_CYCLES, 1)
                plain_cpu, _ = per_request(plain_loop, 2 * cycles, 1)

        dialect = claims.sqlite_dialect(sqlite_path) if backend == "sqlite" else claims.postgres_dialect(url)
        raw = claims.RawDriver(dialect)
        claims.clear("default")
        raw.seed(2 * (cycles + WARMUP_CYCLES) + 1, tied=False)
        conn = raw.open()
        try:
            raw_loop = functools.partial(raw.cycle, conn, "api-cost-raw")
            per_request(raw_loop, WARMUP_CYCLES, 2)
            raw_cpu, raw_wall = per_request(raw_loop, cycles, 2)
            raw_next = RawNextLoop(raw, conn)
            per_request(raw_next, WARMUP_CYCLES, 1)
            raw_next_cpu, raw_next_wall = per_request(raw_next, cycles, 1)
        finally:
            raw.close(conn)
        key_row.delete()  # the bench's own key only

    print(json.dumps({
        "backend": backend, "cycles": cycles, "modes": results, "bare_cpu": bare_cpu, "plain_cpu": plain_cpu,
        "raw_cpu": raw_cpu, "raw_wall": raw_wall, "raw_next_cpu": raw_next_cpu, "raw_next_wall": raw_next_wall,
    }))
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: one child per backend, then the table.


MODE_NAMES = {"cycle": "claim then complete (a)", "next": "complete-and-claim-next (b)",
              "batch": f"batches of {BATCH} (c)"}


def report(result: dict) -> None:
    b = result["backend"]
    bare_cpu = result["bare_cpu"]
    print(f"\n{b}: {result['cycles']:,} tasks per mode, one thread, CPU of this process per request"
          + ("" if b == "sqlite" else " (PostgreSQL's own CPU not included)"))
    print(f"  bare view, whole middleware stack        {bare_cpu:7.3f} ms")
    print(f"  bare view, no middleware                 {result['plain_cpu']:7.3f} ms")
    print(f"  raw driver (no Django)                   {result['raw_cpu']:7.3f} ms   (wall {result['raw_wall']:.3f} ms)")
    print(f"  raw driver, (b)'s two moves in one       {result['raw_next_cpu']:7.3f} ms   (wall "
          f"{result['raw_next_wall']:.3f} ms)")
    for mode in result["modes"]:
        ours = mode["ours_cpu"]
        engine = mode["parts"]["engine verb"]
        print(f"  {MODE_NAMES[mode['mode']]}:")
        print(f"    ours                                   {ours:7.3f} ms   (wall {mode['ours_wall']:.3f} ms)"
              f"; per task {mode['ours_task_cpu']:.3f} ms")
        print(f"    ours, with the parts timed             {mode['timed_cpu']:7.3f} ms, of which:")
        for label, cpu in mode["parts"].items():
            print(f"      {label:<36} {cpu:7.3f} ms  {cpu / mode['timed_cpu']:5.0%}")
        print(f"    bare / ours                            {bare_cpu / ours:7.2f}    (issue 8's /bare goal: >= 0.25)")
        print(f"    bare / (bare + engine verb)            {bare_cpu / (bare_cpu + engine):7.2f}    "
              "(the best bare / ours if all but the verb cost what the bare view costs)")
        if mode["mode"] == "cycle":
            print(f"    engine verb / raw driver               {engine / result['raw_cpu']:7.2f}")
        if mode["mode"] == "next":
            print(f"    engine verb / raw driver's (b)         {engine / result['raw_next_cpu']:7.2f}")
    print("  (the rest: Django's request cycle, the middleware, the dispatch to the endpoint, our endpoint code)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(sorted(unknown))}: {', '.join(MODES)}")
    if args.child:
        return child(args)
    print(f"bench/api_cost.py, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if backend not in ("sqlite", "postgres"):
            raise SystemExit(f"unknown backend {backend!r}: sqlite or postgres")
        command = [sys.executable, __file__, "--child", backend, "--cycles", str(args.cycles), "--pg-url", args.pg_url,
                   "--modes", args.modes]
        if args.dir:
            command += ["--dir", args.dir]
        # Production settings (DEBUG off: no query log), served on 127.0.0.1 over plain HTTP.
        env = {**os.environ, "DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1", "SECURE_SSL_REDIRECT": "0"}
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(f"{backend}: the child failed ({done.returncode}):\n{done.stderr[-3000:]}")
            return 1
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                report(json.loads(line))
            else:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
