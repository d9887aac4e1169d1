"""Run the concurrency criteria against the configured database and print the verdict."""
import secrets
import sys

from django.core.management.base import BaseCommand

from board.engine import contract, selectors, transitions
from board.engine.transitions import TaskSpec


class Command(BaseCommand):
    help = (
        "Race N real threads on fresh tasks: concurrent_claim (exactly one winner) and "
        "duplicate_token_submit (exactly one success). Creates and completes its own tasks, "
        "in queue 'contract-check'."
    )

    def add_arguments(self, parser):
        parser.add_argument("--database", default="default")
        parser.add_argument("--racers", type=int, default=16)
        parser.add_argument("--rounds", type=int, default=20)

    def handle(self, *args, database="default", racers=16, rounds=20, **options):
        board = contract.DjangoBoard(using=database)
        failures = 0
        for name in ("concurrent_claim", "duplicate_token_submit"):
            counts = []
            for _ in range(rounds):
                task_id = f"contract-check-{secrets.token_hex(6)}"
                transitions.create(
                    TaskSpec(id=task_id, title=f"{name} probe", queue="contract-check"),
                    actor="contract_check", using=database,
                )
                try:
                    if name == "concurrent_claim":
                        agents = [f"agent-{i}" for i in range(racers)]
                        counts.append(contract.concurrent_claim(board, task_id, agents, ttl=60))
                    else:
                        counts.append(contract.duplicate_token_submit(board, task_id, racers, ttl=60))
                except contract.CriterionError as exc:
                    self.stdout.write(f"{name}: FAULT {exc}")
                    failures += 1
                    break
                finally:
                    self._finish(task_id, database)
            else:
                bad = [c for c in counts if c != 1]
                verdict = "ok" if not bad else f"FAILED winners per round {counts}"
                failures += bool(bad)
                self.stdout.write(f"{name}: {rounds} rounds x {racers} racers, winners per round "
                                  f"{sorted(set(counts))} -> {verdict}")
        problems = selectors.problems(using=database)
        self.stdout.write(f"check(): {len(problems)} problem(s)")
        if failures:
            sys.exit(1)

    def _finish(self, task_id: str, database: str) -> None:
        """Leave no probe running: cancel whatever the race left unfinished."""
        task = selectors.get_task(task_id, using=database)
        if task is not None and task.stage not in ("COMPLETED", "CANCELLED"):
            transitions.cancel(task_id, actor="contract_check", reason="probe finished", using=database)
