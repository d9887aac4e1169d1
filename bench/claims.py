"""Claim throughput: the engine's claim_next + complete against the plain database driver.

What is measured
----------------
One *cycle* is: claim the best ready task, then complete it. Two loops run the cycle:

- **ours**: ``board.engine.transitions.claim_next(agent, ttl_seconds=60)`` then
  ``board.engine.transitions.complete(task_id, token, {"ok": True})``, i.e. the engine exactly as the
  API calls it (CAS, history row, admission of dependents after commit). On SQLite and
  PostgreSQL that is the hand-written statements of the SQL stores (``board.engine.stores``); ``--hot-path orm``
  measures the engine's ORM path instead (what other backends run). On MongoDB it is always
  the ORM path, through django-mongodb-backend (board/engine/stores/mongodb): session transactions,
  conflicts retried, history ids from the counter document (board/engine/stores/mongodb/store.py).
- **raw**: the same two moves written by hand with the plain driver (``sqlite3`` / ``psycopg``),
  one connection per thread. Each move is one transaction holding the same conditional UPDATE
  (filtered on id, stage and version, plus the token hash for complete) and one
  ``board_taskevent`` INSERT. Claim-next first selects the best ready task (claim_rank, id;
  ``FOR UPDATE SKIP LOCKED`` on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite). Token minting and
  hashing are done as the engine does them, so the baseline differs only in the layer.
- **raw on MongoDB**: plain ``pymongo``, one client shared by the threads, one session per
  thread. Each move is one session transaction with the engine's options (read concern
  snapshot, write concern majority): claim-next is a ``find_one_and_update`` of the best ready
  QUEUED task (not_before null or past; sorted claim_rank, id) setting the lease
  fields, version/fence/attempts + 1; complete is an ``update_one`` filtered on id, stage
  RUNNING, version and token hash; each then ``$inc``-s the counter document
  ``board_counter`` {_id: "board_taskevent"} (how the engine numbers history rows,
  the MongoDB store's number_rows) and inserts the history row, and commits. A transaction aborted as
  TransientTransactionError (a WriteConflict: another one wrote the task or the counter first)
  runs again after a random pause, with board.engine.stores' limits (retry_conflicts). "Now" is the
  process's clock (the engine asks the primary's: one ``hello`` per move more).

``--with-limit`` adds a third loop, **limited**: ours on a queue with a concurrency limit (issue 29;
board.engine.flow), by default as many as the threads, so that it never refuses a claim and the
difference is what enforcing it costs. An observer thread counts the RUNNING tasks all through
its slices (and through ours', so that both bear its cost); a read over the limit, or a problem
check() finds after a slice, fails the run. ``--with-rate`` gives that queue a rate as well (`RATE`,
never binding): check()'s over_rate is then read after each slice too. ``--with-rate-key`` makes
its tasks name a rate key with that rate too (`RATE_KEY`; a rate shared by the tasks of many
queues): each claim then also takes the key's opening, and check() reads the key's claims.

Both loops run in the same process (for MongoDB, a child process: see Databases), against the
same tables, on freshly seeded QUEUED tasks, with T threads (default 1 and 8, each with its own
connection, closed at the end) for a fixed time, in rounds that alternate ours and raw (default
3 rounds of 1 s each), so that the machine's changing load weighs on both alike; only the
cycles are timed. The tables are emptied
and seeded afresh before every slice. Every claimed task id is recorded per thread: a task id
claimed more than once is a *double claim* and makes the script exit with status 1 (so does a
thread stopped by an error: its figures would not be valid). Each thread also counts how often it
went to sleep during its loop (Linux: its voluntary context switches, from /proc), printed per
cycle: on SQLite, where every write is serialised, these hand-overs between threads are what
more threads cost.

Seeding: "ours" is seeded by ``transitions.create`` in batches of 500; "raw" gets the same rows
(same columns, one created_at per batch, a 'create' history row each) by plain SQL, because the
engine creates only a few thousand tasks per second. Each task gets its own priority, as tasks
created one by one get their own created_at, so the best ready task is the first index entry.
``--tied`` gives them all priority 0 instead: the 500 tasks of a batch then tie on claim_rank
(board.engine.fairness), which the line's index orders by id, so a claim-next still reads one
index entry (before the line's index of session 17, a tie was sorted by every claim).

The ratio ours/raw is compared with the project's goal (issue 8, raising DESIGN.md section 5's
0.2 for SQLite): at least 0.5 on SQLite and on PostgreSQL; none is set for MongoDB. Missing a
goal is reported, not an error.

Databases
---------
- SQLite: a fresh file in a temporary directory, configured like the project's default
  (``taskflow_site.settings.database_from_url("sqlite:///...")``: WAL, synchronous=FULL, or
  NORMAL with ``SQLITE_SYNCHRONOUS=normal``, BEGIN IMMEDIATE, busy timeout, no automatic WAL
  checkpoint). The raw loop sets the same PRAGMAs on its connections (its synchronous too) but one: by default its WAL is checkpointed as a plain program's
  is, by SQLite, inside the commit that takes it past 1,000 pages (a sync every ~70 commits,
  under the write lock), while ours is checkpointed by the project's thread, out of the
  writers' locks (board.engine.checkpoints). ``--raw-wal offloaded`` gives raw the project's
  checkpointer thread and backstop instead (``wal_autocheckpoint=10000``); raw's writers take
  none of the project's locks, so the step that holds them (starting a long WAL over) never
  holds raw up: its WAL is not started over until SQLite's backstop checkpoint, inside a commit
  every 10,000 pages, and raw pays almost no checkpoint in its own threads. The two raw figures
  bracket a fair baseline.
- PostgreSQL: the database ``taskflow_bench`` on 127.0.0.1:5432 (user postgres), created when
  missing and migrated; its board tables are emptied, never dropped. When the server does not
  answer, the PostgreSQL rows are skipped with a line saying so. ``--pg-url`` names another
  server.
- MongoDB (only with ``--backends ...,mongodb``; not in the default set, see below): the
  database ``taskflow_bench`` on the replica set named by ``--mongo-url``, else by
  TEST_MONGO_URL, else on a SecantusDB server started for the run (harness/mongodb_server.py,
  stopped at exit); without any, the MongoDB rows are skipped with a line saying why. It is
  migrated, and its board collections are emptied and seeded like the tables above (the
  engine's seed by transitions.create, raw's by insert_many, the same documents), both loops
  with the same count, sized by the server (MONGODB_SEED_PER_SECOND): on SecantusDB a claim
  costs more as the collection grows, so a larger seed would lower both rates.
  The project's settings decide at import, from the default database's ENGINE, the contrib
  apps, the key type and TaskEvent's id field (board/models.py), so MongoDB cannot share a
  process with the SQL aliases: its rows are measured by a child process (this script again,
  with DATABASE_URL set to the bench's mongodb:// URL) and printed in the same table, labelled
  with the server that ran them. SecantusDB is a Python server, one process: its figures say
  little about MongoDB itself (the script says so under the table); give ``--mongo-url`` a
  real replica set for figures about MongoDB. MongoDB is not in the default ``--backends``:
  with the default time, it adds more than 20 s to a run (server start, a second Django,
  migration, seeding) for figures that, on SecantusDB, say little.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/claims.py                  # both backends, 1 and 8 threads, 3 s each
    .venv/bin/python bench/claims.py --seconds 6 --rounds 6   # longer, more alternations
    .venv/bin/python bench/claims.py --seconds 5 --backends sqlite --threads 1,4,8
    .venv/bin/python bench/claims.py --queries        # also print the SQL of one engine cycle
    .venv/bin/python bench/claims.py --dir /dev/shm   # SQLite file in RAM: no disk in the figures
    .venv/bin/python bench/claims.py --profile        # only: cProfile of 1-thread ours on SQLite
                                                      # (top 25 by cumulative, top 15 by own time)
    .venv/bin/python bench/claims.py --profile --backends postgres   # the same on PostgreSQL
                                                      # (or mongodb)
    .venv/bin/python bench/claims.py --hot-path orm   # ours = the engine's ORM path
    .venv/bin/python bench/claims.py --backends mongodb --seconds 2 --rounds 2
                                                      # MongoDB: SecantusDB, or TEST_MONGO_URL
    .venv/bin/python bench/claims.py --backends sqlite,postgres,mongodb \
        --mongo-url 'mongodb://127.0.0.1:27017/?replicaSet=rs0'   # a real replica set
    .venv/bin/python bench/claims.py --backends mongodb --queries  # the commands of one cycle
                                                      # (ours and raw, pymongo's monitoring)

Figures are printed from this run's measurements only; compare ratios within one run, not
absolute numbers across machines.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import re
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunparse, urlunsplit

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench"
MONGODB_NAME = "taskflow_bench"
GOALS = {"sqlite": 0.5, "postgres": 0.5}  # the project's goals for ours/raw (issue 8); none for MongoDB
# Issue 29: a queue with a concurrency limit (never refusing) claims at least this fraction of the
# rate of one without, in the same interleaved run.
LIMIT_GOAL = 0.8
# --with-rate: the limited queue's rate, above any rate this machine claims at (one claim may
# start every 10 us), so that it never refuses one: what it costs is its check and its write.
RATE = {"count": 100_000, "per_seconds": 1}
# --with-rate-key: the rate key the limited queue's tasks name, with RATE (never binding).
RATE_KEY = "bench:provider"
# --with-resources: the resource each of the limited loop's tasks shares a unit of (issue 32;
# board.engine.resources), its capacity the limit (never refusing a claim).
RESOURCE = "bench:pool"
# MongoDB is "default" too, but in the child process only (run_mongodb), never beside SQLite's.
ALIASES = {"sqlite": "default", "postgres": "postgres", "mongodb": "default"}
SQL_BACKENDS = ("sqlite", "postgres")
TTL_SECONDS = 60
RESULT = {"ok": True}
SEED_BATCH = 500  # tasks per transitions.create call

# Tasks seeded per second of run: upper bounds of the rates on this kind of machine, with
# room. A run that exhausts its seed still reports a correct rate (over the time it ran) and
# says so; give a larger --seed-scale then.
SEED_PER_SECOND = {("sqlite", "ours"): 2_000, ("sqlite", "raw"): 15_000,
                   ("postgres", "ours"): 1_500, ("postgres", "raw"): 8_000}
SEED_MINIMUM = 1_000
# MongoDB: both loops get the same count, chosen by the server (mongodb_child). On SecantusDB
# every claim costs more as the collection grows (its claim query reads the whole collection,
# it seems: the rates fall as the seed grows), so there it is kept small, and equal, so that
# it weighs on both loops alike; a real server is seeded for its higher rates.
MONGODB_SEED_PER_SECOND = {"SecantusDB": 150, "MongoDB": 3_000}
MONGODB_SEED_MINIMUM = 100


# ---------------------------------------------------------------------------------------------
# Django, configured standalone with one alias per backend


def configure_django(sqlite_path: Path, pg_url: str | None, threads: int = 1) -> None:
    """The project's settings, with DATABASES replaced by the bench databases. DEBUG stays off
    so that Django does not keep a log of every query (which would slow the engine down). The
    PostgreSQL pool gets room for every bench thread plus the main one (its default size is
    made for a server's threads)."""
    # The bench names its own databases. A mongodb:// DATABASE_URL in the caller's environment
    # would put the project's settings in MongoDB mode (apps, key type), unfit for SQL aliases.
    os.environ.pop("DATABASE_URL", None)
    project = project_settings()

    databases = {ALIASES["sqlite"]: project.database_from_url(f"sqlite:///{sqlite_path}")}
    if pg_url:
        databases[ALIASES["postgres"]] = pg = project.database_from_url(pg_url)
        pool = pg.get("OPTIONS", {}).get("pool")
        if isinstance(pool, dict):
            pg["OPTIONS"]["pool"] = {**pool, "max_size": max(pool.get("max_size", 0), threads + 2)}
    _configure(project, databases)


def configure_django_mongodb() -> None:
    """The child process's settings (run_mongodb): the project's, in MongoDB mode because the
    parent set DATABASE_URL to the bench's mongodb:// URL before they were imported (contrib
    apps with ObjectId keys, MongoDB's migrations, TaskEvent's integer ids from the counter),
    with that database as the only alias."""
    from board.engine.stores.mongodb.settings import ENGINE as MONGODB_ENGINE

    project = project_settings()

    database = project.DATABASES["default"]
    if database["ENGINE"] != MONGODB_ENGINE:
        raise SystemExit(f"the MongoDB child needs DATABASE_URL=mongodb://...; got {database['ENGINE']}")
    _configure(project, {"default": database})


def project_settings() -> Any:
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    from taskflow_site import settings as project

    return project


def _configure(project: Any, databases: dict) -> None:
    import django
    from django.conf import settings

    values = {name: getattr(project, name) for name in dir(project) if name.isupper()}
    values.update(DEBUG=False, DATABASES=databases)
    if os.environ.get("TASKFLOW_HOT_PATH"):  # --hot-path (or the environment) wins
        values["TASKFLOW"] = {**values["TASKFLOW"], "HOT_PATH": os.environ["TASKFLOW_HOT_PATH"]}
    settings.configure(**values)
    django.setup()


def ensure_postgres_database(url: str) -> str | None:
    """Create the bench database when missing. Returns why PostgreSQL cannot be used, or None."""
    import psycopg
    from psycopg import sql

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    server = urlunparse(parts._replace(path="/postgres"))
    try:
        with psycopg.connect(server, autocommit=True, connect_timeout=3) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def migrate(alias: str) -> None:
    from django.core.management import call_command

    call_command("migrate", database=alias, verbosity=0)


BOARD_TABLES = ("board_taskevent", "board_dependency", "board_taskresource", "board_task", "board_queue",
                "board_queueshard", "board_concurrencykey", "board_queuechange", "board_resource")


def clear(alias: str) -> None:
    """Empty the board tables (children first) so that runs do not affect each other. On
    MongoDB the collections' documents are deleted; the history's counter (board_counter) is
    kept: ids only need to keep rising."""
    from django.db import connections, transaction

    connection = connections[alias]
    if connection.vendor == "mongodb":
        connection.ensure_connection()
        for table in BOARD_TABLES:
            connection.database[table].delete_many({})
        return
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        for table in BOARD_TABLES:
            cursor.execute(f"DELETE FROM {table}")
    tidy(alias)


def tidy(alias: str) -> None:
    """PostgreSQL only: reclaim dead rows and refresh the planner's statistics, so that each run
    starts from the same state whatever ran before."""
    from django.db import connections

    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # autocommit: VACUUM cannot run in a transaction
            cursor.execute("VACUUM ANALYZE board_task, board_taskevent, board_dependency, board_taskresource, "
                           "board_resource")


def seed_priority(i: int, tied: bool) -> int:
    """The i-th seeded task's priority. By default every task gets its own (falling with i, so
    they are claimed in seeding order), as tasks created one by one get their own created_at.
    `tied`: all 0, so the tasks of one create batch tie on (priority, created_at)."""
    return 0 if tied else -i


def seed_with_engine(alias: str, count: int, tied: bool, rate_key: str | None = None,
                     resources: Callable[[int], list] | None = None) -> None:
    """`count` QUEUED tasks, created by the engine (transitions.create) in batches (naming
    `rate_key`, declaring `resources(i)`, when given)."""
    from board.engine import transitions
    from board.engine.transitions import TaskSpec

    for start in range(0, count, SEED_BATCH):
        specs = [TaskSpec(title=f"bench task {i}", priority=seed_priority(i, tied), rate_key=rate_key,
                          resources=None if resources is None else resources(i))
                 for i in range(start, min(count, start + SEED_BATCH))]
        transitions.create(specs, using=alias)


# ---------------------------------------------------------------------------------------------
# The two loops. A driver opens a per-thread context, runs one cycle (returning the id of the
# task it claimed and completed, or None when no task was ready), and closes the context.


class OursDriver:
    """The engine: claim_next, then complete, through the Django ORM."""

    def __init__(self, alias: str):
        self.alias = alias

    def seed(self, count: int, tied: bool) -> None:
        seed_with_engine(self.alias, count, tied)

    def open(self) -> Any:
        from django.db import connections

        connections[self.alias].ensure_connection()  # connecting is not part of the race

    def cycle(self, _context: Any, agent: str) -> str | None:
        from board.engine import transitions

        claim = transitions.claim_next(agent, ttl_seconds=TTL_SECONDS, using=self.alias)
        if claim is None:
            return None
        transitions.complete(claim.task.id, claim.lease.token, RESULT, using=self.alias)
        return claim.task.id

    def close(self, _context: Any) -> None:
        from django.db import connections

        connections[self.alias].close()


class LimitedDriver(OursDriver):
    """ours on a queue with a concurrency limit (board.engine.flow, issue 29): every claim takes a
    counted slot of the queue in its own transaction and every complete gives it back. With the
    limit at the thread count it never refuses a claim: the difference with ours is what
    enforcing it costs. `over_limit` and `most_running` are what an observer thread saw."""

    def __init__(self, alias: str, limit: int, rate: dict | None = None, rate_key: bool = False,
                 resources: str | None = None, queue_limit: bool = True):
        super().__init__(alias)
        self.limit, self.rate, self.rate_key = limit, rate, rate_key
        self.resources, self.queue_limit = resources, queue_limit

    def seed(self, count: int, tied: bool) -> None:
        from board.engine import flow, resources

        if self.queue_limit:
            flow.change_queue("default", concurrency=self.limit, rate=self.rate, actor="bench", using=self.alias)
        if self.resources == "pool":
            # Each task shares a unit of one resource whose capacity is the limit: every claim
            # takes a unit of that one row in its own transaction, every complete gives it back.
            resources.change_capacity(RESOURCE, self.limit, actor="bench", using=self.alias)
            seed_with_engine(self.alias, count, tied, resources=lambda i: [{"name": RESOURCE, "units": 1}])
            return
        if self.resources == "own":
            # Each task holds a resource of its own exclusively, below one scheme
            # (bench:file/N, so every claim also takes an intent on bench:): the machinery's
            # cost where claims rarely meet on a row but the scheme's.
            seed_with_engine(self.alias, count, tied, resources=lambda i: [f"{RESOURCE}/{i}"])
            return
        if not self.rate_key:
            super().seed(count, tied)
            return
        flow.change_rate_key(RATE_KEY, rate=RATE, actor="bench", using=self.alias)
        seed_with_engine(self.alias, count, tied, rate_key=RATE_KEY)


class RunningObserver:
    """A thread reading, all through a slice, how many tasks RUNNING there are (the limited
    queue's tasks are all the board's): the most it saw, and how many reads found more than the
    limit. Then check()'s flow problems of the board as the slice left it."""

    def __init__(self, alias: str, limit: int):
        self.alias, self.limit = alias, limit
        self.most = self.over = self.reads = 0
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._observe)

    def __enter__(self) -> RunningObserver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        from board.engine import selectors
        from board.engine.stores import store

        with store(self.alias).read_transaction():
            self.problems += [f"{p.task} {p.code} ({p.text})" for p in selectors.flow_problems(using=self.alias)]

    def _observe(self) -> None:
        from django.db import connections

        from board.models import Task

        try:
            while not self._stop.is_set():
                running = Task.objects.using(self.alias).filter(stage="RUNNING").count()
                self.most, self.reads = max(self.most, running), self.reads + 1
                self.over += running > self.limit
                self._stop.wait(0.001)  # paced: the observer must not take the claimers' CPU
        except BaseException as exc:  # a fault is reported, never read as "nothing over the limit"
            self.problems.append(f"observer: {type(exc).__name__}: {exc}")
        finally:
            connections[self.alias].close()


@dataclass(frozen=True)
class Dialect:
    """What differs between the plain drivers: connecting, placeholders, how a transaction
    starts, row locking, and how times and JSON are passed."""

    connect: Callable[[], Any]
    placeholder: str  # "?" (sqlite3) or "%s" (psycopg)
    begin: str | None  # statement that opens a transaction; None when the driver opens it
    skip_locked: str  # suffix of the claim-next SELECT
    when: Callable[[datetime], Any]
    as_json: Callable[[Any], Any]
    committed: Callable[[], None] = lambda: None  # told after every commit

    def sql(self, text: str) -> str:
        return text.replace("?", self.placeholder)


# The project's init_command (taskflow_site.settings.sqlite_options), plus its busy timeout,
# but for its automatic checkpoint (see --raw-wal). Its synchronous too (FULL unless
# SQLITE_SYNCHRONOUS=normal): raw syncing less than ours made ours look half as fast (a9dfdac
# turned ours to FULL and left raw at NORMAL).
SQLITE_PRAGMAS = ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000")
RAW_WAL = ("sqlite", "offloaded")


def sqlite_dialect(path: Path, wal: str = "sqlite") -> Dialect:
    """`wal`: who checkpoints raw's WAL (--raw-wal): "sqlite", SQLite's default (the commit that
    takes the WAL past 1,000 pages); "offloaded", the project's checkpointer thread alone."""
    from board.engine.checkpoints import WAL_BACKSTOP_PAGES, checkpointer

    from taskflow_site.settings import sqlite_synchronous

    pragmas = (*SQLITE_PRAGMAS, f"synchronous={sqlite_synchronous()}",
               *((f"wal_autocheckpoint={WAL_BACKSTOP_PAGES}",) if wal == "offloaded" else ()))

    def connect() -> sqlite3.Connection:
        # isolation_level=None: the driver opens no transaction of its own; we BEGIN IMMEDIATE.
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        for pragma in pragmas:
            conn.execute(f"PRAGMA {pragma}")
        return conn

    def when(moment: datetime) -> str:  # how Django stores an aware datetime on SQLite: naive UTC
        return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ")

    dialect = Dialect(connect=connect, placeholder="?", begin="BEGIN IMMEDIATE", skip_locked="",
                      when=when, as_json=json.dumps)
    if wal == "offloaded":
        return replace(dialect, committed=lambda: checkpointer().committed(str(path), contextlib.nullcontext))
    return dialect


def postgres_dialect(url: str) -> Dialect:
    import psycopg
    from psycopg.types.json import Jsonb

    return Dialect(connect=lambda: psycopg.connect(url), placeholder="%s", begin=None,
                   skip_locked=" FOR UPDATE SKIP LOCKED", when=lambda moment: moment, as_json=Jsonb)


PICK_SQL = (  # the best ready task (QUEUED, past any retry backoff), as claim_next orders them
    "SELECT id, version, fence, attempts FROM board_task"
    " WHERE stage = 'QUEUED' AND (not_before IS NULL OR not_before <= ?)"
    " ORDER BY claim_rank, id LIMIT 1"
)
CLAIM_SQL = (  # QUEUED -> RUNNING, only if nobody moved the task since it was read
    "UPDATE board_task SET stage = 'RUNNING', version = ?, owner = ?, lease_token_hash = ?,"
    " fence = ?, lease_expires_at = ?, not_before = NULL, attempts = ?, updated_at = ?"
    " WHERE id = ? AND stage = 'QUEUED' AND version = ?"
)
COMPLETE_SQL = (  # RUNNING -> COMPLETED, only for the current holder of the lease
    "UPDATE board_task SET stage = 'COMPLETED', version = ?, owner = '', lease_token_hash = NULL,"
    " lease_expires_at = NULL, result = ?, updated_at = ?"
    " WHERE id = ? AND stage = 'RUNNING' AND version = ? AND lease_token_hash = ?"
)
SEED_TASK_SQL = (  # a QUEUED task as transitions.create writes it
    "INSERT INTO board_task (id, title, description, payload, queue, priority, on_hold, max_retries,"
    " stage, version, owner, lease_token_hash, fence, lease_expires_at, attempts, not_before,"
    " checkpoint, progress, result, last_error, created_at, updated_at, claim_rank)"
    " VALUES (?, ?, '', NULL, 'default', ?, FALSE, 3, 'QUEUED', 0, '', NULL, 0, NULL, 0, NULL,"
    " NULL, NULL, NULL, '', ?, ?, ?)"
)
EVENT_COLUMNS = "task_id, verb, from_stage, to_stage, version, fence, actor, at, detail"
SEED_EVENT_SQL = (
    f"INSERT INTO board_taskevent ({EVENT_COLUMNS}) VALUES (?, 'create', '', 'QUEUED', 0, 0, '', ?, NULL)"
)
EVENT_SQL = f"INSERT INTO board_taskevent ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)"


@dataclass(frozen=True)
class RawLease:
    task_id: str
    version: int
    fence: int
    token_hash: str
    token: str = ""  # the token whose hash the row holds (bench/bare_urls.py's plain views hand it out)


def mint_token() -> tuple[str, str]:
    """A fresh lease token and what the row keeps of it, as the engine mints and hashes them:
    32 random bytes as board.engine.tokens writes them, and its hash_token."""
    from board.engine.tokens import hash_token, token_text

    token = token_text(secrets.token_bytes(32))
    return token, hash_token(token)


def mint_token_hash() -> str:
    """What the row keeps of a fresh lease token (mint_token)."""
    return mint_token()[1]


class RawDriver:
    """The same cycle with the plain driver: one transaction per move, each an UPDATE + INSERT."""

    def __init__(self, dialect: Dialect):
        self.d = dialect
        self.pick = dialect.sql(PICK_SQL) + dialect.skip_locked
        self.claim_sql = dialect.sql(CLAIM_SQL)
        self.complete_sql = dialect.sql(COMPLETE_SQL)
        self.event_sql = dialect.sql(EVENT_SQL)

    def seed(self, count: int, tied: bool) -> None:
        """The same rows as seed_with_engine (one created_at per batch, same priorities and
        history rows), inserted with plain SQL: the engine seeds ~5k tasks/s, too slow to
        feed the raw loop."""
        from board.engine import fairness

        conn = self.d.connect()
        try:
            cursor = conn.cursor()
            self._begin(cursor)
            for start in range(0, count, SEED_BATCH):
                moment = datetime.now(UTC)
                at = self.d.when(moment)
                ids = [secrets.token_hex(8) for _ in range(start, min(count, start + SEED_BATCH))]
                cursor.executemany(self.d.sql(SEED_TASK_SQL), [
                    (task_id, f"bench task {start + n}", seed_priority(start + n, tied), at, at,
                     fairness.rank(moment.timestamp(), seed_priority(start + n, tied)))
                    for n, task_id in enumerate(ids)
                ])
                cursor.executemany(self.d.sql(SEED_EVENT_SQL), [(task_id, at) for task_id in ids])
                time.sleep(0.001)  # the next batch gets a later created_at, as with create()
            conn.commit()
        finally:
            conn.close()

    def open(self) -> Any:
        return self.d.connect()

    def close(self, conn: Any) -> None:
        conn.close()

    def cycle(self, conn: Any, agent: str) -> str | None:
        lease = self.claim_next(conn, agent)
        if lease is None:
            return None
        self.complete(conn, agent, lease)
        return lease.task_id

    def _begin(self, cursor: Any) -> None:
        if self.d.begin:
            cursor.execute(self.d.begin)

    def claim_next(self, conn: Any, agent: str) -> RawLease | None:
        """The best ready task, claimed in a transaction of its own; None when none is ready."""
        return self._transaction(conn, lambda cursor: self._claim_in(cursor, agent))

    def complete(self, conn: Any, agent: str, lease: RawLease) -> None:
        """The lease's task completed, in a transaction of its own."""
        self._transaction(conn, lambda cursor: self._complete_in(cursor, agent, lease))

    def complete_and_claim(self, conn: Any, agent: str, lease: RawLease) -> RawLease | None:
        """The lease's task completed and the best ready task claimed, in one transaction (as the
        engine's complete-and-claim-next does); the new lease, or None when none was ready."""
        def both(cursor):
            self._complete_in(cursor, agent, lease)
            return self._claim_in(cursor, agent)  # RACED: the completion is run again with it
        return self._transaction(conn, both)

    def claim_batch(self, conn: Any, agent: str, most: int) -> list[RawLease]:
        """Up to `most` of the best ready tasks claimed in one transaction, in claim order."""
        def claimed(cursor):
            leases = []
            while len(leases) < most and (lease := self._claim_in(cursor, agent)) is not None:
                if lease is RACED:
                    return RACED  # (PostgreSQL; rare with SKIP LOCKED): all again
                leases.append(lease)
            return leases
        return self._transaction(conn, claimed)

    def complete_batch(self, conn: Any, agent: str, leases: list[RawLease]) -> None:
        """Every lease's task completed, in one transaction."""
        self._transaction(conn, lambda cursor: [self._complete_in(cursor, agent, lease) for lease in leases])

    def _transaction(self, conn: Any, work: Callable[[Any], Any]) -> Any:
        """`work(cursor)` in a transaction, committed; rolled back if it raises, and run again
        from the start when it answers RACED (another writer moved a picked task first)."""
        while True:
            cursor = conn.cursor()
            self._begin(cursor)
            try:
                done = work(cursor)
            except BaseException:
                conn.rollback()
                raise
            if done is RACED:
                conn.rollback()
                continue
            conn.commit()
            self.d.committed()
            return done

    def _claim_in(self, cursor: Any, agent: str) -> RawLease | None | object:
        """The pick, then the claim's UPDATE + INSERT, in the open transaction: the lease; None
        when no task is ready; RACED when another writer moved the picked task first."""
        now = datetime.now(UTC)
        cursor.execute(self.pick, [self.d.when(now)])
        row = cursor.fetchone()
        if row is None:
            return None
        task_id, version, fence, attempts = row
        token, token_hash = mint_token()
        lease = RawLease(task_id, version + 1, fence + 1, token_hash, token)
        at, until = self.d.when(now), self.d.when(now + timedelta(seconds=TTL_SECONDS))
        cursor.execute(self.claim_sql, [lease.version, agent, lease.token_hash, lease.fence, until,
                                        attempts + 1, at, task_id, version])
        if cursor.rowcount != 1:
            return RACED
        cursor.execute(self.event_sql, [task_id, "claim", "QUEUED", "RUNNING", lease.version,
                                        lease.fence, agent, at])
        return lease

    def _complete_in(self, cursor: Any, agent: str, lease: RawLease) -> None:
        """The completion's UPDATE + INSERT in the open transaction; RuntimeError when the
        lease's task is not RUNNING under it."""
        at = self.d.when(datetime.now(UTC))
        cursor.execute(self.complete_sql, [lease.version + 1, self.d.as_json(RESULT), at,
                                           lease.task_id, lease.version, lease.token_hash])
        if cursor.rowcount != 1:
            raise RuntimeError(f"raw complete of {lease.task_id} matched {cursor.rowcount} rows")
        cursor.execute(self.event_sql, [lease.task_id, "complete", "RUNNING", "COMPLETED",
                                        lease.version + 1, lease.fence, agent, at])


RACED = object()  # RawDriver._claim_in: the picked task was moved by another writer first (run again)


class MongoRawDriver:
    """The same cycle with plain pymongo: one MongoClient shared by the threads (a pool, as the
    engine's backend shares one), one session per thread. Each move is one session transaction
    with the engine's options (board/engine/stores/mongodb/backend/base.py: read concern "snapshot", write concern
    "majority") holding a conditional find_one_and_update / update_one of the task, the $inc of
    the history's counter document (the MongoDB store's number_rows: ids in commit order) and the insert
    of the history row. A transaction that MongoDB aborts as TransientTransactionError (a
    WriteConflict: another transaction wrote the same task or the counter first) is run again
    from the start after a random pause, with board.engine.stores' limits, as retry_conflicts does.

    Documents are written as django-mongodb-backend writes the models (seen in the collections):
    the model's primary key in `_id` (board/models.py), a ForeignKey in `task_id`, datetimes as
    UTC. "Now" is this process's clock (the engine asks the primary's, one round trip more; the
    SQL baselines use the process's clock too)."""

    COUNTER_ID = "board_taskevent"  # number_rows' counter document: the history table's name

    def __init__(self, url: str, name: str):
        from pymongo import MongoClient

        from board.engine.stores import CONFLICT_PAUSE_SECONDS, CONFLICT_RETRIES
        from board.engine.stores.mongodb.backend.base import TRANSACTION_OPTIONS
        from board.engine.stores.mongodb.store import COMMIT_RETRIES, COUNTERS

        self.client = MongoClient(url, serverSelectionTimeoutMS=5000)
        database = self.client[name]
        self.tasks = database["board_task"]
        self.events = database["board_taskevent"]
        self.counters = database[COUNTERS]
        self.options = TRANSACTION_OPTIONS
        self.conflict_retries, self.pause, self.commit_retries = (
            CONFLICT_RETRIES, CONFLICT_PAUSE_SECONDS, COMMIT_RETRIES)

    def shutdown(self) -> None:
        self.client.close()

    def seed(self, count: int, tied: bool) -> None:
        """The same documents as seed_with_engine (one created_at per batch, same priorities, a
        'create' history row each, numbered from the counter), inserted in bulk: the engine
        creates too slowly to feed a loop."""
        from pymongo import ReturnDocument

        from board.engine import fairness

        for start in range(0, count, SEED_BATCH):
            at = datetime.now(UTC)
            ids = [secrets.token_hex(8) for _ in range(start, min(count, start + SEED_BATCH))]
            self.tasks.insert_many([
                {"_id": task_id, "title": f"bench task {start + n}", "description": "", "payload": None,
                 "queue": "default", "priority": seed_priority(start + n, tied), "on_hold": False,
                 "max_retries": 3, "stage": "QUEUED", "version": 0, "owner": "",
                 "lease_token_hash": None, "fence": 0, "lease_expires_at": None,
                 "claim_request_hash": None, "claim_token_seed": None, "attempts": 0,
                 "not_before": None, "checkpoint": None, "progress": None, "result": None,
                 "last_error": "", "created_at": at, "updated_at": at, "has_deps": False,
                 "has_dependents": False, "fairness_key": None,
                 "claim_rank": fairness.rank(at.timestamp(), seed_priority(start + n, tied))}
                for n, task_id in enumerate(ids)
            ])
            last = self.counters.find_one_and_update(
                {"_id": self.COUNTER_ID}, {"$inc": {"last": len(ids)}}, upsert=True,
                return_document=ReturnDocument.AFTER)["last"]
            first = last - len(ids) + 1
            self.events.insert_many([
                {"_id": first + n, "task_id": task_id, "verb": "create", "from_stage": "",
                 "to_stage": "QUEUED", "version": 0, "fence": 0, "actor": "", "at": at, "detail": None}
                for n, task_id in enumerate(ids)
            ])
            time.sleep(0.001)  # the next batch gets a later created_at, as with create()

    def open(self) -> Any:
        return self.client.start_session(default_transaction_options=self.options)

    def close(self, session: Any) -> None:
        session.end_session()

    def cycle(self, session: Any, agent: str) -> str | None:
        lease = self._transaction(session, lambda: self._claim_next(session, agent))
        if lease is None:
            return None
        self._transaction(session, lambda: self._complete(session, agent, lease))
        return lease.task_id

    def _transaction(self, session: Any, body: Callable[[], Any]) -> Any:
        """Run `body` in a transaction of `session` and commit it; a body that returns None
        wrote nothing, and its transaction is aborted. Transient aborts: run it all again."""
        from pymongo.errors import PyMongoError

        for attempt in range(self.conflict_retries):
            session.start_transaction()
            try:
                result = body()
                if result is None:
                    session.abort_transaction()
                    return None
                self._commit(session)
                return result
            except BaseException as exc:
                if session.in_transaction:
                    with contextlib.suppress(PyMongoError):  # the server may have aborted it
                        session.abort_transaction()
                transient = isinstance(exc, PyMongoError) and exc.has_error_label("TransientTransactionError")
                if not transient or attempt == self.conflict_retries - 1:
                    raise
            low, high = self.pause
            time.sleep(random.uniform(low, min(high, low * 2 ** attempt)))
        raise AssertionError("unreachable")

    def _commit(self, session: Any) -> None:
        """Commit, again when its outcome is unknown (MongoDB commits a transaction once at
        most), as the MongoDB store does."""
        from pymongo.errors import PyMongoError

        for attempt in range(self.commit_retries):
            try:
                session.commit_transaction()
                return
            except PyMongoError as exc:
                if not exc.has_error_label("UnknownTransactionCommitResult") or attempt == self.commit_retries - 1:
                    raise

    def _history(self, session: Any, task_id: str, verb: str, from_stage: str, to_stage: str,
                 version: int, fence: int, agent: str, at: datetime) -> None:
        from pymongo import ReturnDocument

        number = self.counters.find_one_and_update(
            {"_id": self.COUNTER_ID}, {"$inc": {"last": 1}}, upsert=True,
            return_document=ReturnDocument.AFTER, session=session)["last"]
        self.events.insert_one(
            {"_id": number, "task_id": task_id, "verb": verb, "from_stage": from_stage,
             "to_stage": to_stage, "version": version, "fence": fence, "actor": agent, "at": at,
             "detail": None},
            session=session)

    def _claim_next(self, session: Any, agent: str) -> RawLease | None:
        """The best ready task (claim_next's order: priority, age, id), moved QUEUED -> RUNNING
        by the same statement that finds it: in a snapshot transaction, a concurrent claimer of
        the same task fails with a WriteConflict and runs again."""
        from pymongo import ReturnDocument

        now = datetime.now(UTC)
        token_hash = mint_token_hash()
        task = self.tasks.find_one_and_update(
            {"stage": "QUEUED", "$or": [{"not_before": None}, {"not_before": {"$lte": now}}]},
            {"$set": {"stage": "RUNNING", "owner": agent, "lease_token_hash": token_hash,
                      "lease_expires_at": now + timedelta(seconds=TTL_SECONDS), "not_before": None,
                      "claim_request_hash": None, "claim_token_seed": None, "updated_at": now},
             "$inc": {"version": 1, "fence": 1, "attempts": 1}},
            sort=[("claim_rank", 1), ("_id", 1)],
            projection={"_id": True, "version": True, "fence": True},
            return_document=ReturnDocument.AFTER, session=session)
        if task is None:
            return None
        lease = RawLease(task["_id"], task["version"], task["fence"], token_hash)
        self._history(session, lease.task_id, "claim", "QUEUED", "RUNNING", lease.version,
                      lease.fence, agent, now)
        return lease

    def _complete(self, session: Any, agent: str, lease: RawLease) -> bool:
        now = datetime.now(UTC)
        done = self.tasks.update_one(
            {"_id": lease.task_id, "stage": "RUNNING", "version": lease.version,
             "lease_token_hash": lease.token_hash},
            {"$set": {"stage": "COMPLETED", "version": lease.version + 1, "owner": "",
                      "lease_token_hash": None, "lease_expires_at": None, "claim_request_hash": None,
                      "claim_token_seed": None, "result": RESULT, "updated_at": now}},
            session=session)
        if done.matched_count != 1:
            raise RuntimeError(f"raw complete of {lease.task_id} matched {done.matched_count} documents")
        self._history(session, lease.task_id, "complete", "RUNNING", "COMPLETED", lease.version + 1,
                      lease.fence, agent, now)
        return True


# ---------------------------------------------------------------------------------------------
# Running T threads for a fixed time


@dataclass
class Tally:
    ids: list[str] = field(default_factory=list)
    ran_dry: bool = False
    error: BaseException | None = None
    sleeps: int | None = None  # the thread's voluntary context switches in its loop (Linux)


@dataclass(frozen=True)
class Outcome:
    cycles: int
    seconds: float
    double_claims: int
    ran_dry: bool
    errors: list[str]
    sleeps: int | None = None  # voluntary context switches of the threads; None: not measured

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds if self.seconds > 0 else 0.0

    @property
    def sleeps_per_cycle(self) -> float | None:
        return self.sleeps / self.cycles if self.sleeps is not None and self.cycles else None

    @staticmethod
    def total(parts: list[Outcome]) -> Outcome:
        """Rounds added up (each round seeds its own tasks, so double claims add up too)."""
        return Outcome(
            cycles=sum(p.cycles for p in parts), seconds=sum(p.seconds for p in parts),
            double_claims=sum(p.double_claims for p in parts), ran_dry=any(p.ran_dry for p in parts),
            errors=[e for p in parts for e in p.errors], sleeps=_sum_known(p.sleeps for p in parts),
        )


def _sum_known(counts) -> int | None:
    counts = list(counts)
    return None if any(c is None for c in counts) else sum(counts)


def _thread_sleeps() -> int | None:
    """How many times this thread has gone to sleep (blocked on a lock, the GIL, I/O, a sleep):
    Linux's voluntary context switches of the calling thread, None where /proc does not say."""
    try:
        with open("/proc/thread-self/status") as status:
            for line in status:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _worker(driver: Any, agent: str, seconds: float, barrier: threading.Barrier, tally: Tally) -> None:
    opened, context = False, None
    try:
        context = driver.open()
        opened = True
        barrier.wait()
        slept = _thread_sleeps()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            task_id = driver.cycle(context, agent)
            if task_id is None:
                tally.ran_dry = True
                break
            tally.ids.append(task_id)
        if slept is not None and (now := _thread_sleeps()) is not None:
            tally.sleeps = now - slept
    except BaseException as exc:  # reported, and fails the run: a fault is never a result
        tally.error = exc
        barrier.abort()
    finally:
        if opened:
            driver.close(context)


def run_threads(driver: Any, threads: int, seconds: float) -> Outcome:
    """Release `threads` workers together; each loops cycles until `seconds` have passed or no
    task is ready. The rate is over the time from the release to the last worker's end."""
    barrier = threading.Barrier(threads + 1)
    tallies = [Tally() for _ in range(threads)]
    workers = [
        threading.Thread(target=_worker, args=(driver, f"agent-{n}", seconds, barrier, tally))
        for n, tally in enumerate(tallies)
    ]
    for worker in workers:
        worker.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    claimed = Counter(task_id for tally in tallies for task_id in tally.ids)
    return Outcome(
        cycles=sum(len(tally.ids) for tally in tallies),
        seconds=elapsed,
        double_claims=sum(1 for times in claimed.values() if times > 1),
        ran_dry=any(tally.ran_dry for tally in tallies),
        errors=[f"{type(t.error).__name__}: {t.error}" for t in tallies if t.error is not None],
        sleeps=_sum_known(tally.sleeps for tally in tallies),
    )


# ---------------------------------------------------------------------------------------------
# The comparison


@dataclass(frozen=True)
class Row:
    backend: str
    threads: int
    ours: Outcome
    raw: Outcome
    label: str = ""  # what the backend column shows, when more than its name (the server)
    limited: Outcome | None = None  # ours on a queue with a concurrency limit (--with-limit)
    observed: Observed | None = None  # what the limited slices' observers saw
    rate: dict | None = None  # the limited queue's rate (--with-rate)
    rate_key: str | None = None  # the rate key its tasks name (--with-rate-key)
    resources: str | None = None  # its tasks' resources (--with-resources: pool or own)
    queue_limited: bool = True  # its queue has the limit (--with-limit, --with-rate, --with-rate-key)

    @property
    def ratio(self) -> float:
        return self.ours.rate / self.raw.rate if self.raw.rate else 0.0

    @staticmethod
    def from_dict(data: dict, label: str = "") -> Row:
        """A row as the MongoDB child sent it (asdict, through JSON)."""
        return Row(data["backend"], data["threads"], Outcome(**data["ours"]), Outcome(**data["raw"]), label)


def seed_size(backend: str, mode: str, args: argparse.Namespace) -> int:
    if backend == "mongodb":
        return max(MONGODB_SEED_MINIMUM, int(args.mongo_seed_per_second * args.seconds * args.seed_scale))
    return max(SEED_MINIMUM, int(SEED_PER_SECOND[backend, mode] * args.seconds * args.seed_scale))


def measure(backend: str, alias: str, raw: Any, threads: int, args: argparse.Namespace) -> Row:
    """`args.rounds` rounds, each running ours then raw (then ours on a limited queue, with
    --with-limit) for seconds / rounds on fresh tables: the machine's load drifts (on a shared
    machine, by 2-3x within seconds), and alternating spreads the drift over all of them instead
    of charging it all to whichever ran last."""
    outcomes: dict[str, list[Outcome]] = {"ours": [], "raw": [], "limited": []}
    drivers: list[tuple[str, Any]] = [("ours", OursDriver(alias)), ("raw", raw)]
    queue_limit = args.with_limit or args.with_rate or args.with_rate_key
    limit = (args.queue_limit or threads) if queue_limit or args.with_resources else None
    if limit is not None:
        drivers.append(("limited", LimitedDriver(alias, limit, RATE if args.with_rate else None,
                                                 rate_key=args.with_rate_key, resources=args.with_resources,
                                                 queue_limit=queue_limit)))
    observed = Observed(limit or 0)
    slice_seconds = args.seconds / args.rounds
    for _ in range(args.rounds):
        for mode, driver in drivers:
            clear(alias)
            driver.seed(seed_size(backend, "ours" if mode == "limited" else mode, args) // args.rounds or 1,
                        args.tied)
            tidy(alias)
            if mode == "raw" or limit is None:
                outcomes[mode].append(run_threads(driver, threads, slice_seconds))
                continue
            # The observer reads beside ours as well, so that limited and ours bear its cost alike.
            with RunningObserver(alias, limit if mode == "limited" else threads) as observer:
                outcomes[mode].append(run_threads(driver, threads, slice_seconds))
            if mode == "limited":
                observed.add(observer)
    clear(alias)
    limited = Outcome.total(outcomes["limited"]) if limit is not None else None
    return Row(backend, threads, Outcome.total(outcomes["ours"]), Outcome.total(outcomes["raw"]),
               limited=limited, observed=observed if limit is not None else None,
               rate=RATE if limit is not None and args.with_rate else None,
               rate_key=RATE_KEY if limit is not None and args.with_rate_key else None,
               resources=args.with_resources, queue_limited=bool(queue_limit))


@dataclass
class Observed:
    """What the observers of one row's limited slices saw, added up."""

    limit: int
    most: int = 0
    over: int = 0
    reads: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, observer: RunningObserver) -> None:
        self.most = max(self.most, observer.most)
        self.over += observer.over
        self.reads += observer.reads
        self.problems += observer.problems


def print_limit_table(rows: list[Row]) -> None:
    """The limited queue beside ours without a limit, from the same interleaved rounds."""
    rows = [row for row in rows if row.limited is not None]
    if not rows:
        return
    line = "{:<9} {:>7} {:>6} {:>15} {:>13} {:>14} {:>22}  {}".format
    header = line("backend", "threads", "limit", "limited cyc/s", "ours cyc/s", "limited/ours",
                  "most running / over", "goal")
    print()
    if rows[0].rate is not None:
        print(f"limited: a concurrency limit and a rate of {rows[0].rate['count']:,} claims per "
              f"{rows[0].rate['per_seconds']} s on its queue")
    if rows[0].resources:
        what = (f"each task shares a unit of the resource {RESOURCE}, its capacity the limit"
                if rows[0].resources == "pool" else f"each task holds its own resource {RESOURCE}/N exclusively")
        print(f"limited: {what}" + ("" if rows[0].queue_limited else " (no queue limit)"))
    if rows[0].rate_key is not None:
        print(f"limited: its tasks name the rate key {rows[0].rate_key} ({RATE['count']:,} claims per "
              f"{RATE['per_seconds']} s)")
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row.limited.rate / row.ours.rate if row.ours.rate else 0.0
        seen = row.observed
        print(line(row.backend, row.threads, seen.limit, rate_text(row.limited.rate), rate_text(row.ours.rate),
                   f"{ratio:.2f}", f"{seen.most} / {seen.over} of {seen.reads:,} reads",
                   f">= {LIMIT_GOAL}: {'met' if ratio >= LIMIT_GOAL else 'NOT met'}"))
        for problem in seen.problems:
            print(f"note: {row.backend} x{row.threads} limited: check() found {problem}")


def rate_text(rate: float) -> str:
    """Cycles per second: whole ones, or tenths below 100 (SecantusDB's rates are that low)."""
    return f"{rate:,.1f}" if rate < 100 else f"{rate:,.0f}"


def print_table(rows: list[Row]) -> None:
    width = max([9] + [len(row.label or row.backend) for row in rows])
    line = f"{{:<{width}}} {{:>7}} {{:>11}} {{:>10}} {{:>6}}  {{:<25}} {{:<19}} {{}}".format
    header = line("backend", "threads", "ours cyc/s", "raw cyc/s", "ratio",
                  "double claims (ours/raw)", "sleeps/cycle (o/r)", "goal")
    print(header)
    print("-" * len(header))
    for row in rows:
        goal = GOALS.get(row.backend)
        print(line(
            row.label or row.backend, row.threads, rate_text(row.ours.rate), rate_text(row.raw.rate),
            f"{row.ratio:.2f}",
            f"{row.ours.double_claims}/{row.raw.double_claims}",
            "/".join("-" if o.sleeps_per_cycle is None else f"{o.sleeps_per_cycle:.2f}" for o in (row.ours, row.raw)),
            "none set" if goal is None else f">= {goal}: {'met' if row.ratio >= goal else 'NOT met'}",
        ))
    for row in rows:
        for mode, outcome in (("ours", row.ours), ("raw", row.raw)):
            where = f"{row.backend} x{row.threads} {mode}"
            if outcome.ran_dry:
                print(f"note: {where} ran out of seeded tasks after {outcome.seconds:.2f} s "
                      f"({outcome.cycles} cycles); its rate is over that time")
            for error in outcome.errors:
                print(f"ERROR: {where}: {error}")
    print()
    print("goals (issue 8): ours/raw >= 0.5 on SQLite and on PostgreSQL; none for MongoDB")
    print("sleeps/cycle: how often a thread went to sleep per cycle (its voluntary context switches: waiting for "
          "a lock, the GIL or the database); each is a hand-over between threads, what running more of them costs")


# ---------------------------------------------------------------------------------------------
# Looking inside: the SQL of one cycle, and a profile of the engine's loop


def print_cycle_queries(alias: str) -> None:
    """The statements one claim_next + complete sends (after-commit work included)."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    clear(alias)
    driver = OursDriver(alias)
    driver.seed(1, tied=False)
    with CaptureQueriesContext(connections[alias]) as captured:
        driver.cycle(None, "agent-q")
    print(f"\n{alias} ({connections[alias].vendor}): {len(captured)} statements per cycle")
    for query in captured.captured_queries:
        print(f"  {shorten_sql(query['sql'])}")
    clear(alias)


class CommandLog:
    """The commands this process's MongoDB clients send from one thread while recording
    (pymongo's command monitoring, installed before any client is made). Django's query log
    would miss some: the history counter's $inc, the clock's `hello`, the commit."""

    def __init__(self) -> None:
        self.thread: int | None = None
        self.commands: list[str] = []

    @classmethod
    def install(cls) -> CommandLog:
        from pymongo import monitoring

        log = cls()

        class Listener(monitoring.CommandListener):
            def started(self, event: Any) -> None:
                if log.thread == threading.get_ident():
                    target = event.command.get(event.command_name)
                    log.commands.append(f"{event.command_name} {target}" if isinstance(target, str)
                                        else event.command_name)

            def succeeded(self, event: Any) -> None:
                pass

            def failed(self, event: Any) -> None:
                pass

        monitoring.register(Listener())
        return log

    @contextlib.contextmanager
    def recording(self) -> Any:
        self.commands, self.thread = [], threading.get_ident()
        try:
            yield self.commands
        finally:
            self.thread = None


def print_cycle_commands(alias: str, raw: MongoRawDriver, log: CommandLog) -> None:
    """MongoDB's --queries: the commands one cycle of each loop sends."""
    for mode, driver in (("ours", OursDriver(alias)), ("raw", raw)):
        clear(alias)
        driver.seed(1, tied=False)
        context = driver.open()
        with log.recording() as commands:
            driver.cycle(context, "agent-q")
        driver.close(context)
        print(f"\nmongodb {mode}: {len(commands)} commands per cycle")
        for command in commands:
            print(f"  {command}")
    clear(alias)


# A list of eight or more columns (`a, t.b, c AS d, ...`), shown as its length.
COLUMN_LIST = re.compile(r"(?:[\w.]+(?: AS \w+)?, ){7,}[\w.]+(?: AS \w+)?")


def shorten_sql(sql: str) -> str:
    """One line, with long column lists replaced by their length."""
    sql = " ".join(sql.split())
    sql = COLUMN_LIST.sub(lambda m: f"<{m[0].count(',') + 1} columns>", sql)
    return re.sub(r"^SELECT .+? FROM", lambda m: f"SELECT <{m[0].count(',') + 1} columns> FROM", sql) \
        if sql.startswith("SELECT") and "<" not in sql[:40] else sql


def profile_ours(backend: str, alias: str, args: argparse.Namespace, top: int = 25) -> None:
    seconds = args.profile_seconds
    clear(alias)
    driver = OursDriver(alias)
    driver.seed(seed_size(backend, "ours", args), args.tied)
    driver.open()
    profiler = cProfile.Profile()
    cycles = 0
    deadline = time.perf_counter() + seconds
    profiler.enable()
    while time.perf_counter() < deadline and driver.cycle(None, "agent-profile") is not None:
        cycles += 1
    profiler.disable()
    driver.close(None)
    clear(alias)
    print(f"cProfile of the 1-thread ours loop on {backend}: {cycles} cycles in {seconds:g} s "
          f"(profiled, so slower than unprofiled)\n")
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(15)
    print(out.getvalue())


# ---------------------------------------------------------------------------------------------
# MongoDB: its rows come from a child process. The project's settings decide at import, from
# DATABASES["default"]["ENGINE"], the contrib apps, the key type and TaskEvent's id field
# (board/models.py), so MongoDB cannot share a process with the SQL aliases. The child is this
# script again (--mongo-child FILE) with DATABASE_URL set to the bench's mongodb:// URL; it
# writes its rows to FILE as JSON, and the parent prints them in the one table.


@dataclass
class MongoRun:
    rows: list[Row] = field(default_factory=list)
    server: str = ""  # what ran them
    secantus: bool = False
    queries: str = ""  # --queries: the child's printout
    failure: str = ""  # the child did not deliver its rows
    seconds: float = 0.0  # the child's whole run: migration and seeding included


def bench_mongodb_url(server_url: str) -> str:
    """The server's URL with the bench database as its path (its options kept)."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{MONGODB_NAME}", parts.query, ""))


def describe_mongodb(url: str) -> tuple[str, bool, str]:
    """(what the server is, whether it is SecantusDB, why it cannot run the bench or "").
    The engine needs multi-document transactions: a replica set (or a mongos)."""
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    client = MongoClient(url, serverSelectionTimeoutMS=3000)
    try:
        hello = client.admin.command("hello")
        build = client.admin.command("buildInfo")
    except PyMongoError as exc:
        return "", False, f"no server answers at {urlsplit(url).hostname}:{urlsplit(url).port}: {type(exc).__name__}"
    finally:
        client.close()
    where = urlsplit(url).netloc.rpartition("@")[2]
    if "secantusVersion" in build:
        return f"SecantusDB {build['secantusVersion']} at {where}", True, ""
    if "setName" not in hello and hello.get("msg") != "isdbgrid":
        return "", False, f"MongoDB {build.get('version')} at {where} is not a replica set (transactions need one)"
    kind = f"replica set {hello['setName']}" if "setName" in hello else "mongos"
    return f"MongoDB {build.get('version')}, {kind}, at {where}", False, ""


def find_mongodb(args: argparse.Namespace) -> tuple[str | None, str, bool]:
    """(server URL, why none, whether started here): --mongo-url, else TEST_MONGO_URL, else a
    SecantusDB server started for this run (harness/mongodb_server.py; it stops it at exit)."""
    if args.mongo_url:
        return args.mongo_url, "", False
    from harness import mongodb_server

    url, _what, why = mongodb_server.start()
    return url, why, not os.environ.get("TEST_MONGO_URL")


def run_mongodb(args: argparse.Namespace) -> MongoRun | None:
    """The MongoDB rows, from a child process. None (and a NOT RUN line) without a server."""
    url, why, started_here = find_mongodb(args)
    server, secantus = "", False
    if url is not None:
        server, secantus, why = describe_mongodb(url)
        server += ", started for this run" if started_here else ""
    if url is None or why:
        print(f"NOT RUN: the MongoDB rows were skipped ({why})")
        return None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="taskflow-bench-mongodb-") as tmp:
        out = Path(tmp) / "rows.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--mongo-child", str(out),
                   "--seconds", repr(args.seconds), "--rounds", str(args.rounds),
                   "--threads", ",".join(map(str, args.threads)), "--seed-scale", repr(args.seed_scale),
                   "--profile-seconds", repr(args.profile_seconds)]
        command += [flag for flag, on in (("--tied", args.tied), ("--queries", args.queries),
                                          ("--profile", args.profile)) if on]
        env = {**os.environ, "DATABASE_URL": bench_mongodb_url(url)}
        env.pop("TASKFLOW_HOT_PATH", None)  # MongoDB has no hot path: ours is the ORM path
        code = subprocess.run(command, env=env, cwd=PROJECT, check=False).returncode
        data = json.loads(out.read_text()) if out.exists() else None
    run = MongoRun(server=server, secantus=secantus)
    if args.profile:
        run.failure = "" if code == 0 else f"the MongoDB child exited with status {code}"
        return run
    if code != 0 or data is None:
        run.failure = f"the MongoDB child exited with status {code} without its rows"
        return run
    label = f"mongodb ({server.split(' at ')[0].split(',')[0]})"
    run.rows = [Row.from_dict(row, label) for row in data["rows"]]
    run.queries = data.get("queries", "")
    run.seconds = time.perf_counter() - started
    return run


def mongodb_child(args: argparse.Namespace) -> int:
    """The child's side of run_mongodb: migrate the bench database, measure, write the rows."""
    commands = CommandLog.install() if args.queries else None  # before any client exists
    configure_django_mongodb()
    from django.conf import settings

    alias = ALIASES["mongodb"]
    database = settings.DATABASES[alias]
    _server, secantus, why = describe_mongodb(database["HOST"])
    if why:
        raise SystemExit(why)
    args.mongo_seed_per_second = MONGODB_SEED_PER_SECOND["SecantusDB" if secantus else "MongoDB"]
    migrate(alias)
    if args.profile:
        profile_ours("mongodb", alias, args)
        return 0
    raw = MongoRawDriver(database["HOST"], database["NAME"])
    try:
        rows = [measure("mongodb", alias, raw, threads, args) for threads in args.threads]
        queries = io.StringIO()
        if commands is not None:
            with contextlib.redirect_stdout(queries):
                print_cycle_commands(alias, raw, commands)
    finally:
        raw.shutdown()
    Path(args.mongo_child).write_text(json.dumps(
        {"rows": [asdict(row) for row in rows], "queries": queries.getvalue()}))
    return 0


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# --requires: claim-next among 100,000 QUEUED tasks that require capabilities (issue 32, item 3)

REQUIRES_TASKS = 100_000
# The scenarios, each (name, what the QUEUED tasks require, the claimer's capabilities, what it says):
# the tasks' `requires` are rewritten in place between slices (one UPDATE), the tasks kept.
REQUIRES_SCENARIOS = (
    ("none", "none", (), "no task requires anything; a claimer without capabilities (the claim as before)"),
    ("held", "all", ("gpu",), "every task requires gpu; the claimer holds gpu (the capable statement)"),
    ("half", "alternate", ("python",), "tasks alternate gpu / python in line; the claimer holds python"),
    ("passed", "first-half", (), "the first 50,000 in line require gpu; a claimer without capabilities "
                                 "(its own line's index leaves them out)"),
)
# The claim cost the issue allows a requiring claim beside one without requirements.
REQUIRES_GOAL = 0.5


def _set_requirements(alias: str, layout: str) -> None:
    """Rewrite the QUEUED tasks' requires by `layout`, in one statement (the bench writes the rows
    before any claim reads them; the engine never changes a task's requires)."""
    from django.db import connections, transaction

    gpu, python = '["gpu"]', '["python"]'
    cast = "::jsonb" if connections[alias].vendor == "postgresql" else ""
    value = {"none": "NULL", "all": f"'{gpu}'{cast}",
             "alternate": f"CASE WHEN priority % 2 = 0 THEN '{gpu}'{cast} ELSE '{python}'{cast} END",
             "first-half": f"CASE WHEN priority > -{REQUIRES_TASKS // 2} THEN '{gpu}'{cast} ELSE NULL END"}[layout]
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(f"UPDATE board_task SET requires = {value} WHERE stage = 'QUEUED'")
        cursor.execute("UPDATE board_task SET has_requires = (requires IS NOT NULL) WHERE stage = 'QUEUED'")
    tidy(alias)


def _requiring_cycles(alias: str, caps: tuple[str, ...], seconds: float) -> Outcome:
    """One thread's claim-next (with `caps`) + complete cycles for `seconds`."""
    from board.engine import transitions

    done, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        claim = transitions.claim_next("bench", ttl_seconds=TTL_SECONDS, capabilities=caps, using=alias)
        if claim is None:
            break
        transitions.complete(claim.task.id, claim.lease.token, RESULT, using=alias)
        done.append(claim.task.id)
    elapsed = time.perf_counter() - start
    return Outcome(cycles=len(done), seconds=elapsed, double_claims=len(done) - len(set(done)),
                   ran_dry=len(done) == 0, errors=[])


def measure_requires(backend: str, alias: str, args: argparse.Namespace) -> list[tuple[str, Outcome, str]]:
    """Every REQUIRES_SCENARIOS slice in each of `args.rounds` rounds, alternating, on one table of
    REQUIRES_TASKS tasks seeded by the engine."""
    from board.models import Task

    clear(alias)
    started = time.perf_counter()
    seed_with_engine(alias, REQUIRES_TASKS, tied=False)
    print(f"{backend}: {REQUIRES_TASKS:,} tasks seeded in {time.perf_counter() - started:.1f} s")
    outcomes: dict[str, list[Outcome]] = {name: [] for name, *_ in REQUIRES_SCENARIOS}
    for _ in range(args.rounds):
        for name, layout, caps, _ in REQUIRES_SCENARIOS:
            _set_requirements(alias, layout)
            outcomes[name].append(_requiring_cycles(alias, caps, args.seconds / args.rounds))
    queued = Task.objects.using(alias).filter(stage="QUEUED").count()
    print(f"{backend}: {queued:,} tasks still QUEUED at the end")
    clear(alias)
    return [(name, Outcome.total(outcomes[name]), words) for name, _, _, words in REQUIRES_SCENARIOS]


def print_requires_table(results: dict[str, list[tuple[str, Outcome, str]]]) -> None:
    print(f"\nclaim-next + complete among {REQUIRES_TASKS:,} QUEUED tasks, by what they require "
          "(one thread; the ratio is to `none` in the same run)")
    print(f"{'backend':<9} {'scenario':<8} {'cycles/s':>9} {'ms/cycle':>9} {'vs none':>8}  what")
    for backend, rows in results.items():
        base = rows[0][1].rate
        for name, outcome, words in rows:
            ratio = outcome.rate / base if base else 0.0
            per = 1000 / outcome.rate if outcome.rate else float("inf")
            print(f"{backend:<9} {name:<8} {outcome.rate:>9.0f} {per:>9.2f} {ratio:>8.2f}  {words}")
    for backend, rows in results.items():
        held = dict((name, outcome) for name, outcome, _ in rows)
        ratio = held["held"].rate / held["none"].rate if held["none"].rate else 0.0
        verdict = "meets" if ratio >= REQUIRES_GOAL else "misses"
        print(f"{backend}: a claim of requiring tasks runs at {ratio:.2f} of one without requirements: "
              f"{verdict} the goal ({REQUIRES_GOAL}, within 2x)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="time each loop runs per row (default 3), in --rounds slices")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate ours and raw this many times per row (default 3)")
    parser.add_argument("--backends", default="sqlite,postgres",
                        help="comma-separated: sqlite,postgres,mongodb (default sqlite,postgres)")
    parser.add_argument("--threads", default="1,8", help="comma-separated thread counts (default 1,8)")
    parser.add_argument("--dir", default=None,
                        help="folder in which to make the SQLite temp dir (default: the system's "
                             "temp folder; /dev/shm takes the disk out of the SQLite figures)")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help=f"default {DEFAULT_PG_URL}")
    parser.add_argument("--raw-wal", choices=RAW_WAL, default="sqlite",
                        help="who checkpoints the raw loop's SQLite WAL: sqlite (its default, in the "
                             "commit) or offloaded (the project's checkpointer thread; see Databases)")
    parser.add_argument("--mongo-url", default=None,
                        help="a MongoDB replica set (mongodb://host:port/?replicaSet=...); default: "
                             "TEST_MONGO_URL, else a SecantusDB server started for the run")
    parser.add_argument("--mongo-child", default=None, metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--queries", action="store_true", help="also print the SQL of one engine cycle")
    parser.add_argument("--requires", action="store_true",
                        help=f"instead: claim-next among {REQUIRES_TASKS:,} QUEUED tasks that require capabilities "
                             "(issue 32), beside the same claims of tasks that require none (SQL backends)")
    parser.add_argument("--with-limit", action="store_true",
                        help="also run ours on a queue with a concurrency limit (issue 29), interleaved")
    parser.add_argument("--with-rate", action="store_true",
                        help=f"with --with-limit: the limited queue also has a rate ({RATE['count']:,} per "
                             f"{RATE['per_seconds']} s: never binding, so the difference is what enforcing it costs)")
    parser.add_argument("--with-rate-key", action="store_true",
                        help=f"with --with-limit: the limited queue's tasks also name a rate key with that rate "
                             f"({RATE_KEY}; never binding)")
    parser.add_argument("--with-resources", choices=("pool", "own"), default=None,
                        help=f"also run ours on tasks declaring resources (issue 32): pool: each shares a unit of "
                             f"{RESOURCE}, whose capacity is the limit (never refusing); own: each holds "
                             f"{RESOURCE}/N of its own (an intent on {RESOURCE.split(':')[0]}: too). Alone: no queue limit")
    parser.add_argument("--queue-limit", type=int, default=0,
                        help="that limit (default: the thread count, so that it never refuses a claim)")
    parser.add_argument("--hot-path", choices=("auto", "orm"), default=None,
                        help="the engine's path for ours (settings.TASKFLOW HOT_PATH / env "
                             "TASKFLOW_HOT_PATH; default: as configured, i.e. auto)")
    parser.add_argument("--profile", action="store_true",
                        help="only profile the 1-thread ours loop on the first backend (top 25 by "
                             "cumulative time)")
    parser.add_argument("--profile-seconds", type=float, default=2.0)
    parser.add_argument("--seed-scale", type=float, default=1.0,
                        help="seed this many times more tasks per run (when a run ran out)")
    parser.add_argument("--tied", action="store_true",
                        help="seed every task with priority 0, so each create batch of "
                             f"{SEED_BATCH} ties on (priority, created_at): shows the cost of ties")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(ALIASES)
    if unknown:
        parser.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    if not args.threads or min(args.threads) < 1:
        parser.error("--threads needs positive integers")
    if args.rounds < 1:
        parser.error("--rounds needs a positive integer")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mongo_child:
        return mongodb_child(args)
    if args.hot_path:
        os.environ["TASKFLOW_HOT_PATH"] = args.hot_path
    if args.profile:
        args.backends = args.backends[:1]
        if args.backends == ["mongodb"]:
            run = run_mongodb(args)
            if run is not None and run.failure:
                print(f"FAIL: {run.failure}")
            return 0 if run is not None and not run.failure else 1
    with tempfile.TemporaryDirectory(prefix="taskflow-bench-", dir=args.dir) as tmp:
        sqlite_path = Path(tmp) / "bench.sqlite3"
        pg_url = None
        if "postgres" in args.backends:
            why = ensure_postgres_database(args.pg_url)
            if why is None:
                pg_url = args.pg_url
            else:
                print(f"NOT RUN: the PostgreSQL rows ({args.pg_url} unreachable: {why})")
        configure_django(sqlite_path, pg_url, max(args.threads))
        dialects = {"sqlite": sqlite_dialect(sqlite_path, args.raw_wal)}
        if pg_url:
            dialects["postgres"] = postgres_dialect(pg_url)
        backends = [b for b in args.backends if b in dialects]
        for backend in backends:
            migrate(ALIASES[backend])

        if args.profile:
            if not backends:
                return 1
            profile_ours(backends[0], ALIASES[backends[0]], args)
            return 0
        if args.requires:
            results = {backend: measure_requires(backend, ALIASES[backend], args)
                       for backend in backends if backend in SQL_BACKENDS}
            print_requires_table(results)
            doubles = sum(outcome.double_claims for rows in results.values() for _, outcome, _ in rows)
            if doubles:
                print(f"\nFAIL: {doubles} double claim(s) seen")
            return 1 if doubles or not results else 0

        rows = []
        for backend in backends:
            for threads in args.threads:
                rows.append(measure(backend, ALIASES[backend], RawDriver(dialects[backend]), threads, args))
        # After the SQL rows, so that the server it may start is not running beside them.
        mongo = run_mongodb(args) if "mongodb" in args.backends else None
        if mongo is not None:
            rows += mongo.rows
        print()
        print_table(rows)
        print_limit_table(rows)
        from board.engine.stores import store

        STATEMENTS = "the store's statements"
        ran_on = [f"{b}: {STATEMENTS if store(ALIASES[b]).statements else 'the ORM path'}" for b in backends]
        if mongo is not None and mongo.rows:
            ran_on.append("mongodb: the ORM path (django-mongodb-backend; no hot path there)")
        if ran_on:
            print("ours ran on: " + ", ".join(ran_on))
        if "sqlite" in backends:
            print("SQLite's WAL: ours checkpointed by the project's thread (board.engine.checkpoints); raw's "
                  + ("by SQLite inside its commits (--raw-wal sqlite)" if args.raw_wal == "sqlite"
                     else "by the project's thread, started over only by SQLite's backstop (--raw-wal offloaded)"))
        if mongo is not None and mongo.rows:
            print(f"mongodb rows ran on: {mongo.server} (a child process; {mongo.seconds:.1f} s in all, "
                  f"migration and seeding included)")
            if mongo.secantus:
                print("note: SecantusDB is a MongoDB-compatible server written in Python, one process: "
                      "its figures (ours and raw alike) say little about MongoDB itself; "
                      "--mongo-url names a real replica set")
        if args.queries:
            for backend in backends:
                print_cycle_queries(ALIASES[backend])
            if mongo is not None and mongo.queries:
                print(mongo.queries, end="")

    limited = [row.limited for row in rows if row.limited is not None]
    doubles = sum(row.ours.double_claims + row.raw.double_claims for row in rows) + sum(
        o.double_claims for o in limited)
    faults = sum(len(row.ours.errors) + len(row.raw.errors) for row in rows) + sum(len(o.errors) for o in limited)
    over = sum(row.observed.over + len(row.observed.problems) for row in rows if row.observed is not None)
    if over:
        print(f"\nFAIL: the limited queue was seen over its limit, or check() objected, {over} time(s)")
    if doubles:
        print(f"\nFAIL: {doubles} double claim(s) seen")
    if faults:
        print(f"\nFAIL: {faults} thread(s) stopped on an error; their figures are not valid")
    if mongo is not None and mongo.failure:
        print(f"\nFAIL: {mongo.failure}")
    return 1 if doubles or faults or over or (mongo is not None and mongo.failure) else 0


if __name__ == "__main__":
    sys.exit(main())
