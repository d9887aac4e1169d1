"""Fair claim order (issue 29, item 8): when does a small plan's last task start beside a big one?

What is measured
----------------
A plan of 500 tasks and a plan of 3, one queue, the same priority; AGENTS threads (default 4)
claim and complete through the engine (`transitions.claim_next`, `complete`) until the queue is
empty. The claim order is read from the history afterwards (the claims' rows, in id order). Three
runs per backend, in one process:

- **fifo** (the baseline): no fairness key, the big plan created first. Oldest first: the small
  plan's tasks start after all 500.
- **keys, together**: each plan names its own `fairness_key`, the small one created right after
  the big one. Its fair share with two keys of weight 1 is every second claim: its 3 tasks
  within the first 6 claims (give or take the claims AGENTS - 1 other agents have in flight).
- **keys, late**: the same, but the small plan is created only once 100 of the big plan's tasks
  have started: within 6 claims of its creation.

For each: the claim (1 = first) at which the small plan's last task started, the goal, and the
claims per second of the whole run, the median of `--repeat` runs (fifo's beside as the
baseline: what the keys cost the claim; late's includes the create made mid-run, during which
the other agents find nothing to claim).
Then the aging rule as the engine applies it (board.engine.fairness): how long a priority-0 task
waits before a newly created priority-1 task no longer goes first.

Databases: SQLite, a fresh file in a temporary directory, configured like the project's default;
PostgreSQL (`--postgres`): the database ``taskflow_bench_fairness`` on 127.0.0.1:5432 (user
postgres), created when missing and migrated, its board tables emptied before each run. Each
backend runs in a process of its own.

Run (from the project folder)
-----------------------------
    .venv/bin/python bench/fairness.py --postgres
    .venv/bin/python bench/fairness.py --agents 8

Figures are this run's only; on a shared machine compare the ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench.big_board import configure_django, run_backends  # noqa: E402

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/taskflow_bench_fairness"
BIG, SMALL, LATE_AFTER = 500, 3, 100
QUEUE = "fairness-bench"
TTL = 300


def empty_board() -> None:
    from django.db import connections, transaction

    with transaction.atomic(), connections["default"].cursor() as cursor:
        for table in ("board_taskevent", "board_dependency", "board_task", "board_fairnesskey"):
            cursor.execute(f"DELETE FROM {table}")


def create_plan(name: str, size: int, keyed: bool) -> None:
    from board.engine import transitions
    from board.engine.transitions import TaskSpec

    transitions.create([TaskSpec(id=f"{name}-{n:03}", title=f"{name} {n}", queue=QUEUE,
                                 fairness_key=f"plan:{name}" if keyed else None) for n in range(size)])


def run_agents(agents: int, after: int = 0, late=None) -> float:
    """AGENTS threads claim and complete until the queue is empty; `late()` runs once `after`
    claims have been made. Returns the run's seconds."""
    from django.db import connections

    from board.engine import transitions

    lock = threading.Lock()
    claims = [0]
    late_done = threading.Event()
    if late is None:
        late_done.set()
    barrier = threading.Barrier(agents)

    def agent(i: int) -> None:
        try:
            barrier.wait()
            while True:
                claim = transitions.claim_next(f"agent-{i}", TTL, queue=QUEUE)
                if claim is None:
                    if late_done.is_set():
                        return
                    continue  # the late plan is coming
                transitions.complete(claim.task.pk, claim.lease.token, {})
                with lock:
                    claims[0] += 1
                    due = late is not None and claims[0] == after
                if due:
                    late()
                    late_done.set()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def claim_positions() -> tuple[list[str], dict[str, int], int]:
    """The tasks in the order their claims were written, each one's position (1 = first), and
    how many claims were written before the small plan's creation."""
    from board.models import TaskEvent

    claims = list(TaskEvent.objects.filter(verb="claim").order_by("id").values_list("id", "task_id"))
    created = TaskEvent.objects.filter(verb="create", task_id__in=[f"small-{n:03}" for n in range(SMALL)]).order_by("-id")[0].id
    order = [task_id for _, task_id in claims]
    return order, {task_id: n for n, task_id in enumerate(order, 1)}, sum(1 for i, _ in claims if i < created)


def scenario(name: str, agents: int) -> dict:
    empty_board()
    if name == "late":
        create_plan("big", BIG, keyed=True)
        seconds = run_agents(agents, after=LATE_AFTER, late=lambda: create_plan("small", SMALL, keyed=True))
    else:
        keyed = name == "together"
        create_plan("big", BIG, keyed)
        create_plan("small", SMALL, keyed)
        seconds = run_agents(agents)
    order, position, before = claim_positions()
    assert len(order) == BIG + SMALL == len(set(order)), f"{len(order)} claims of {BIG + SMALL} tasks"
    small = sorted(position[f"small-{n:03}"] for n in range(SMALL))
    return {"small": small, "last": small[-1] - before, "rate": len(order) / seconds}


def measure(backend: str, database_url: str, args: argparse.Namespace) -> None:
    configure_django(database_url)
    from django.core.management import call_command

    from board.engine import fairness

    call_command("migrate", verbosity=0)
    goal = 2 * SMALL  # two keys of weight 1: every second claim
    slack = args.agents - 1  # claims other agents have in flight when the plan arrives
    runs = {}
    for name in ("fifo", "together", "late"):
        # A run is 503 claims, well under a second: its rate is the median of --repeat runs (the
        # positions are the same in each run bar the agents' interleaving: the first is shown).
        repeats = [scenario(name, args.agents) for _ in range(args.repeat)]
        runs[name] = {**repeats[0], "rate": statistics.median(run["rate"] for run in repeats)}
    print(f"{backend}: {BIG} + {SMALL} tasks, {args.agents} agents")
    print(f"  {'run':<10} {'small plan starts at claims':<30} {'last, counted from its creation':>32} "
          f"{'goal':>6} {'claims/s':>9} {'vs fifo':>8}")
    for name, run in runs.items():
        met = "" if name == "fifo" else ("met" if run["last"] <= goal + slack else "NOT met")
        print(f"  {name:<10} {', '.join(map(str, run['small'])):<30} {run['last']:>32} "
              f"{'' if name == 'fifo' else f'<= {goal}':>6} {run['rate']:9.0f} "
              f"{run['rate'] / runs['fifo']['rate']:8.2f} {met}")
    print(f"  (goal: the small plan's fair share with 2 keys of weight 1, every second claim, "
          f"+ up to {slack} claims other agents have in flight)")
    # The aging rule, as the engine computes ranks: a priority-0 task created `waited` seconds
    # before a priority-1 task is taken first once its rank is lower.
    waited = next(s for s in range(0, 3601) if fairness.rank(0.0, 0) < fairness.rank(float(s), 1))
    print(f"  aging: a priority-0 task created {waited - 1} s before a priority-1 task is still taken after it; "
          f"{waited} s before, first (one level per {fairness.AGING_SECONDS:.0f} s of waiting)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=4, help="claiming threads (default 4)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each case; claims/s is their median (default 5)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL too")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend:
        measure(args.backend, args.database_url, args)
        return 0
    print(f"bench/fairness.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
    return run_backends(__file__, "taskflow-fairness-", args.postgres, args.pg_url,
                        ["--agents", str(args.agents), "--repeat", str(args.repeat)])


if __name__ == "__main__":
    sys.exit(main())
