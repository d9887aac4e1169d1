"""Seed a plan of dependent tasks and run a few simulated agents on it, so that a newcomer who runs
this beside the server sees the board move. The agents use the engine as real agents use the
API: claim, renew with checkpoints, pause, fail, mostly complete; a simulated operator admits
the approval on hold and requeues what failed for good.

At the default speed a run lasts a minute or two, long enough to watch every column; what a
newcomer should see happens every run, not by chance (SCRIPT): a failure retried after its
backoff, a failure with no retries left that the operator requeues, a pause resumed later, and
a task on hold for approval. `--speed N` runs N times faster (the tests use it)."""
import random
import secrets
import threading
import time
from collections.abc import Iterable

from django.core.management.base import BaseCommand
from django.db import connections

from board.engine import errors, selectors, transitions
from board.engine.lifecycle import TERMINAL, Stage
from board.engine.transitions import TaskSpec
from board.models import Task

SOURCES = ["docs", "issues", "wiki", "mail", "chat", "code"]
# The demo's own queues: its agents claim only from these, so a demo run next to real work
# never takes (and fails) a task that is not its own.
QUEUES = ("demo-io", "demo-cpu", "demo")

# What happens to whom, every run ("<step>-<source>" or a plan task's name).
FAIL_ONCE = "fetch-mail"  # its first attempt fails; the engine retries it after the backoff
FAIL_FOR_GOOD = "check-chat"  # no retries: FAILED until the operator requeues it
PAUSE_ONCE = "parse-wiki"  # paused after its first step, resumed a while later from its checkpoint
SCRIPT_ERROR = "simulated failure: upstream timed out"

STEP_SECONDS = (2.0, 4.0)  # one step of work (2-4 steps per task), at speed 1
PAUSED_SECONDS = 8.0  # how long the paused task waits before an agent resumes it
REQUEUE_AFTER = 6.0  # how long the operator leaves a FAILED task before requeueing it


# The demo follows its own run by the prefix of its tasks' ids.
def ids_starting_with(prefix: str, *, stage: str, using: str = "default") -> list[str]:
    """Ids of the tasks in `stage` whose id starts with `prefix`."""
    return list(Task.objects.using(using).filter(pk__startswith=prefix, stage=stage).values_list("pk", flat=True))


def count_starting_with(prefix: str, *, excluding: Iterable[str] = (), using: str = "default") -> int:
    """How many tasks whose id starts with `prefix` are in none of the stages `excluding`."""
    return Task.objects.using(using).filter(pk__startswith=prefix).exclude(stage__in=list(excluding)).count()


def plan(run: str) -> list[TaskSpec]:
    """27 tasks: fetch -> parse -> index -> check per source, an approval on hold, the merge of the
    checked indexes, then the report (after the merge and the approval)."""
    specs = []
    for name in SOURCES:
        specs += [
            TaskSpec(id=f"{run}-fetch-{name}", title=f"Fetch {name}", queue="demo-io", priority=2,
                     payload={"source": name}),
            TaskSpec(id=f"{run}-parse-{name}", title=f"Parse {name}", queue="demo-cpu", priority=1,
                     deps=(f"{run}-fetch-{name}",), payload={"source": name}),
            TaskSpec(id=f"{run}-index-{name}", title=f"Index {name}", queue="demo-cpu",
                     deps=(f"{run}-parse-{name}",), payload={"source": name}),
            TaskSpec(id=f"{run}-check-{name}", title=f"Check {name} index", queue="demo-cpu",
                     max_retries=0 if f"check-{name}" == FAIL_FOR_GOOD else 2,
                     deps=(f"{run}-index-{name}",), payload={"source": name}),
        ]
    specs.append(TaskSpec(id=f"{run}-approve", title="Approve the release", queue="demo", on_hold=True,
                          description="Held until an operator admits it (the demo does, once every "
                                      "index is checked)."))
    specs.append(TaskSpec(id=f"{run}-merge", title="Merge the indexes", queue="demo-cpu",
                          deps=tuple(f"{run}-check-{name}" for name in SOURCES)))
    specs.append(TaskSpec(id=f"{run}-report", title="Write the report", queue="demo",
                          deps=(f"{run}-merge", f"{run}-approve")))
    return specs


class Command(BaseCommand):
    help = ("Seed a demo plan (27 dependent tasks) and run simulated agents on it until it is done "
            "(a minute or two; --speed 10 runs ten times faster).")

    def add_arguments(self, parser):
        parser.add_argument("--agents", type=int, default=4)
        parser.add_argument("--speed", type=float, default=1.0,
                            help="run this many times faster (default 1: a minute or two to watch)")
        parser.add_argument("--seed", type=int, default=None, help="make the agents' choices repeatable")

    def handle(self, *args, agents=4, speed=1.0, seed=None, **options):
        rng = random.Random(seed)
        self.run = run = f"demo-{secrets.token_hex(2)}"
        self.speed = speed
        self.paused_at: dict[str, float] = {}
        self.scripted: set[str] = set()  # the SCRIPT events that have happened (once each)
        self.lock = threading.Lock()
        started = time.monotonic()
        tasks = transitions.create(plan(run), actor="demo")
        self.say(f"seeded {len(tasks)} tasks ({run}-*) in the queues {', '.join(QUEUES)}; open /board/ to watch")
        stop = threading.Event()
        workers = [
            threading.Thread(target=self.agent, args=(f"demo-agent-{i + 1}", random.Random(rng.random()), stop),
                             daemon=True)
            for i in range(agents)
        ]
        for worker in workers:
            worker.start()
        try:
            self.supervise(stop)
        except KeyboardInterrupt:
            self.say("stopping")
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=30)
        left = count_starting_with(run, excluding=[Stage.COMPLETED])
        self.say(f"demo {run} finished in {time.monotonic() - started:.0f} s: "
                 f"{len(tasks) - left} of {len(tasks)} tasks completed")
        found = selectors.problems()
        self.say(f"check(): {len(found)} problem(s)")

    def say(self, line: str) -> None:
        with self.lock:  # agents' lines never interleave
            self.stdout.write(line)
            self.stdout.flush()

    def name(self, task_id: str) -> str:
        return task_id.removeprefix(f"{self.run}-")

    def supervise(self, stop: threading.Event) -> None:
        """Play the operator: admit the approval on hold once every index is checked (the merge is
        then ready), requeue what failed for good after a while; end when everything is done."""
        run, failed_since = self.run, {}
        while not stop.is_set():
            merge = selectors.stage_of(f"{run}-merge")
            if merge != Stage.PENDING:
                try:
                    transitions.admit(f"{run}-approve", actor="demo-operator", reason="every index checked")
                    self.say("demo-operator admitted the approve on hold (every index is checked)")
                except errors.BoardError:
                    pass  # already admitted
            now = time.monotonic()
            for failed in ids_starting_with(run, stage=Stage.FAILED):
                if now - failed_since.setdefault(failed, now) < REQUEUE_AFTER / self.speed:
                    continue
                try:
                    transitions.requeue(failed, actor="demo-operator", reset_attempts=True,
                                        reason="flaky upstream; retrying")
                    self.say(f"demo-operator requeued {self.name(failed)}")
                except errors.BoardError:
                    pass
                failed_since.pop(failed, None)
            unfinished = count_starting_with(run, excluding=TERMINAL)
            if unfinished == 0:
                return
            time.sleep(0.5 / self.speed)

    def agent(self, name: str, rng: random.Random, stop: threading.Event) -> None:
        ttl = max(2.0, 15 / self.speed)
        try:
            while not stop.is_set():
                claim = self.next_work(name, ttl)
                if claim is None:
                    time.sleep(0.3 / self.speed)
                    continue
                self.work(name, claim, ttl, rng, stop)
        finally:
            connections.close_all()

    def next_work(self, name: str, ttl: float):
        """A paused task that has waited long enough, else the next ready task of the demo's queues."""
        with self.lock:
            due = [task_id for task_id, at in self.paused_at.items()
                   if time.monotonic() - at >= PAUSED_SECONDS / self.speed]
        for task_id in due:
            try:
                claim = transitions.resume(task_id, name, ttl)
            except errors.BoardError:
                continue  # another agent resumed it first
            with self.lock:
                self.paused_at.pop(task_id, None)
            self.say(f"{name} resumed {self.name(task_id)} from its checkpoint")
            return claim
        for queue in QUEUES:
            claim = transitions.claim_next(name, ttl, queue=queue)
            if claim is not None:
                return claim
        return None

    def first_time(self, event: str) -> bool:
        """True once per run for each scripted event (a requeue resets attempts: not a guide)."""
        with self.lock:
            if event in self.scripted:
                return False
            self.scripted.add(event)
            return True

    def work(self, name, claim, ttl, rng, stop) -> None:
        task, token = claim.task, claim.lease.token
        script = self.name(task.pk)
        steps = rng.randint(2, 4)
        start = (task.checkpoint or {}).get("step", 0)
        try:
            for step in range(start, steps):
                if stop.is_set():
                    transitions.release(task.pk, token, agent=name)
                    return
                time.sleep(rng.uniform(*STEP_SECONDS) / self.speed)
                transitions.renew(task.pk, token, ttl, checkpoint={"step": step + 1},
                                  progress=(step + 1) / steps, agent=name)
                if script == PAUSE_ONCE and self.first_time(script):
                    transitions.pause(task.pk, token, {"step": step + 1}, agent=name)
                    with self.lock:
                        self.paused_at[task.pk] = time.monotonic()
                    self.say(f"{name} paused {script} after step {step + 1} (resumed later)")
                    return
            if script in (FAIL_ONCE, FAIL_FOR_GOOD) and self.first_time(script):
                transitions.fail(task.pk, token, SCRIPT_ERROR, agent=name)
                then = "retried after its backoff" if script == FAIL_ONCE else "no retries left: FAILED"
                self.say(f"{name} failed {script} ({SCRIPT_ERROR}); {then}")
            else:
                transitions.complete(task.pk, token, {"by": name, "steps": steps}, agent=name)
        except errors.LeaseLost:
            pass  # reclaimed or taken over meanwhile: a real agent stops here too
