"""The criteria must raise, never report a winner count, when the store fails underneath them.

These run outside Django's test-case wrapper (which forbids connections to aliases a test did
not declare) with pytest-django's blocker lifted: the connection attempts are real and fail for
real, against a SQLite path that cannot exist and a PostgreSQL port nothing listens on."""
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connections

from board.engine import contract, errors, transitions
from board.engine.contract import DjangoBoard
from board.engine.transitions import TaskSpec
from board.models import Task

RACERS = 16


@pytest.fixture
def scratch(django_db_blocker):
    """A real SQLite store of its own (migrated here, deleted afterwards), with no wrapping
    transaction, so that racer threads may also reach the unreachable aliases."""
    with django_db_blocker.unblock():
        call_command("migrate", database="scratch", verbosity=0)
        try:
            yield "scratch"
        finally:
            connections["scratch"].close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{settings.SCRATCH_FILE}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("alias", ["unreachable-sqlite", "unreachable-postgres"])
def test_criteria_on_an_unreachable_database_raise(alias, django_db_blocker):
    broken = DjangoBoard(using=alias)
    with django_db_blocker.unblock():
        try:
            with pytest.raises(contract.CriterionError) as caught:
                contract.concurrent_claim(broken, "any", [f"a{i}" for i in range(RACERS)], ttl=60)
            assert len(caught.value.faults) == RACERS
            assert all(isinstance(f, DatabaseError) for f in caught.value.faults)
            with pytest.raises(DatabaseError):  # its own claim, before the race, cannot connect
                contract.duplicate_token_submit(broken, "any", RACERS, ttl=60)
        finally:
            # A PostgreSQL pool keeps retrying in the background (and logging) until closed.
            if hasattr(connections[alias], "close_pool"):
                connections[alias].close_pool()


@dataclass(frozen=True)
class SplitBoard:
    """Agents named bad-* talk to a database that cannot be reached, the others to the real one."""

    good: DjangoBoard
    bad: DjangoBoard

    def _for(self, agent: str) -> DjangoBoard:
        return self.bad if agent.startswith("bad") else self.good

    def snapshot(self):
        return self.good.snapshot()

    def claim(self, task_id, agent, ttl_seconds):
        return self._for(agent).claim(task_id, agent, ttl_seconds)

    def renew(self, task_id, token, ttl_seconds):
        return self.good.renew(task_id, token, ttl_seconds)

    def release(self, task_id, token):
        return self.good.release(task_id, token)

    def complete(self, task_id, token, result):
        return self.good.complete(task_id, token, result)

    def prepare_thread(self):
        self.good.prepare_thread()

    def end_thread(self):
        self.good.end_thread()
        self.bad.end_thread()


def test_one_winner_does_not_hide_racers_that_hit_a_dead_database(scratch):
    transitions.create(TaskSpec(id="half", title="half"), using=scratch)
    split = SplitBoard(good=DjangoBoard(scratch), bad=DjangoBoard("unreachable-sqlite"))
    agents = [f"{'bad' if i % 2 else 'good'}-{i}" for i in range(RACERS)]
    with pytest.raises(contract.CriterionError) as caught:
        contract.concurrent_claim(split, "half", agents, ttl=60)
    assert len(caught.value.faults) == RACERS // 2
    assert all(isinstance(f, DatabaseError) for f in caught.value.faults)
    assert Task.objects.using(scratch).get(pk="half").stage == "RUNNING"  # the good half raced: one won


def test_a_loser_with_the_wrong_error_is_a_fault_not_a_loser(scratch):
    transitions.create([TaskSpec(id="dep", title="dep"), TaskSpec(id="blocked", title="b", deps=["dep"])],
                       using=scratch)
    with pytest.raises(contract.CriterionError, match="Blocked") as caught:
        contract.concurrent_claim(DjangoBoard(scratch), "blocked", ["a", "b", "c"], ttl=60)
    assert all(isinstance(f, errors.Blocked) for f in caught.value.faults)
