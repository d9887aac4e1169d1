"""Seed a plan of dependent tasks and run a few simulated agents on it, so that a newcomer who runs
this beside the server sees the board move. The agents use the engine as real agents use the
API: claim, renew with checkpoints, sometimes pause, fail or hand back, mostly complete."""
import random
import secrets
import threading
import time

from django.core.management.base import BaseCommand
from django.db import connections

from board import errors, transitions
from board.lifecycle import Stage
from board.models import Task
from board.transitions import TaskSpec


def plan(run: str) -> list[TaskSpec]:
    """About 30 tasks: fetch -> parse -> index per source, a held approval, then the report."""
    specs = []
    sources = ["docs", "issues", "wiki", "mail", "chat", "code"]
    for name in sources:
        specs += [
            TaskSpec(id=f"{run}-fetch-{name}", title=f"Fetch {name}", queue="io", priority=2,
                     payload={"source": name}),
            TaskSpec(id=f"{run}-parse-{name}", title=f"Parse {name}", queue="cpu", priority=1,
                     deps=(f"{run}-fetch-{name}",), payload={"source": name}),
            TaskSpec(id=f"{run}-index-{name}", title=f"Index {name}", queue="cpu",
                     deps=(f"{run}-parse-{name}",), payload={"source": name}),
            TaskSpec(id=f"{run}-check-{name}", title=f"Check {name} index", queue="cpu", max_retries=2,
                     deps=(f"{run}-index-{name}",), payload={"source": name}),
        ]
    specs.append(TaskSpec(id=f"{run}-approve", title="Approve the release", hold=True,
                          description="Held until an operator admits it (the demo does, after a while)."))
    specs.append(TaskSpec(id=f"{run}-merge", title="Merge the indexes", queue="cpu",
                          deps=tuple(f"{run}-check-{name}" for name in sources)))
    specs.append(TaskSpec(id=f"{run}-report", title="Write the report",
                          deps=(f"{run}-merge", f"{run}-approve")))
    return specs


class Command(BaseCommand):
    help = "Seed a demo plan (~30 dependent tasks) and run simulated agents on it until it is done."

    def add_arguments(self, parser):
        parser.add_argument("--agents", type=int, default=4)
        parser.add_argument("--speed", type=float, default=1.0, help="time runs this many times faster")
        parser.add_argument("--seed", type=int, default=None, help="make the agents' choices repeatable")

    def handle(self, *args, agents=4, speed=1.0, seed=None, **options):
        rng = random.Random(seed)
        run = f"demo-{secrets.token_hex(2)}"
        tasks = transitions.create(plan(run), actor="demo")
        self.stdout.write(f"seeded {len(tasks)} tasks ({run}-*); open /board/ to watch")
        stop = threading.Event()
        workers = [
            threading.Thread(target=self.agent, args=(f"demo-agent-{i + 1}", run, speed,
                                                      random.Random(rng.random()), stop), daemon=True)
            for i in range(agents)
        ]
        for worker in workers:
            worker.start()
        try:
            self.supervise(run, speed, stop)
        except KeyboardInterrupt:
            self.stdout.write("stopping")
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=30)
        left = Task.objects.filter(pk__startswith=run).exclude(stage=Stage.COMPLETED).count()
        self.stdout.write(f"demo {run} finished: {len(tasks) - left} of {len(tasks)} tasks completed")

    def supervise(self, run: str, speed: float, stop: threading.Event) -> None:
        """Play the operator: admit the held approval after a while, requeue what failed for
        good; end when everything is done."""
        started = time.monotonic()
        while not stop.is_set():
            if time.monotonic() - started > 8 / speed:
                try:
                    transitions.admit(f"{run}-approve", actor="demo-operator", reason="looks good")
                except errors.BoardError:
                    pass  # already admitted
            for failed in Task.objects.filter(pk__startswith=run, stage=Stage.FAILED).values_list("pk", flat=True):
                try:
                    transitions.requeue(failed, actor="demo-operator", reset_attempts=True,
                                        reason="flaky upstream; retrying")
                except errors.BoardError:
                    pass
            unfinished = Task.objects.filter(pk__startswith=run).exclude(
                stage__in=[Stage.COMPLETED, Stage.CANCELLED]).count()
            if unfinished == 0:
                return
            time.sleep(0.5 / speed)

    def agent(self, name: str, run: str, speed: float, rng: random.Random, stop: threading.Event) -> None:
        ttl = max(2.0, 10 / speed)
        try:
            while not stop.is_set():
                claim = self.next_work(name, run, ttl)
                if claim is None:
                    time.sleep(0.3 / speed)
                    continue
                self.work(name, claim, ttl, speed, rng, stop)
        finally:
            connections.close_all()

    def next_work(self, name: str, run: str, ttl: float):
        paused = Task.objects.filter(pk__startswith=run, stage=Stage.PAUSED).values_list("pk", flat=True).first()
        if paused:
            try:
                return transitions.resume(paused, name, ttl)
            except errors.BoardError:
                pass  # another agent resumed it first
        return transitions.claim_next(name, ttl)

    def work(self, name, claim, ttl, speed, rng, stop) -> None:
        task, token = claim.task, claim.lease.token
        steps = rng.randint(2, 5)
        start = (task.checkpoint or {}).get("step", 0)
        try:
            for step in range(start, steps):
                if stop.is_set():
                    transitions.release(task.pk, token, agent=name)
                    return
                time.sleep(rng.uniform(0.5, 1.5) / speed)
                transitions.renew(task.pk, token, ttl, checkpoint={"step": step + 1},
                                  progress=(step + 1) / steps, agent=name)
                if step == 0 and rng.random() < 0.08:
                    transitions.pause(task.pk, token, {"step": step + 1}, agent=name)
                    return
            if rng.random() < 0.12:
                transitions.fail(task.pk, token, "simulated failure: upstream timed out", agent=name)
            else:
                transitions.complete(task.pk, token, {"by": name, "steps": steps}, agent=name)
        except errors.LeaseLost:
            pass  # reclaimed or taken over meanwhile: a real agent stops here too
