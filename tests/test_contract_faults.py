"""The criteria must raise, never report a winner count, when the store fails underneath them.

These run outside Django's test-case wrapper (which forbids connections to aliases a test did
not declare) with pytest-django's blocker lifted: the connection attempts are real and fail for
real, against a SQLite path that cannot exist and a PostgreSQL port nothing listens on."""
from dataclasses import dataclass

import pytest
from django.db import DatabaseError

from board import contract, errors, transitions
from board.contract import DjangoBoard
from board.models import Dependency, Task, TaskEvent
from board.transitions import TaskSpec

RACERS = 16


@pytest.fixture
def real_db(django_db_setup, django_db_blocker):
    """The real test database with no wrapping transaction; rows are removed afterwards."""
    with django_db_blocker.unblock():
        yield
        TaskEvent.objects.all().delete()
        Dependency.objects.all().delete()
        Task.objects.all().delete()


@pytest.mark.parametrize("alias", ["unreachable-sqlite", "unreachable-postgres"])
def test_criteria_on_an_unreachable_database_raise(alias, django_db_blocker):
    broken = DjangoBoard(using=alias)
    with django_db_blocker.unblock():
        with pytest.raises(contract.CriterionError) as caught:
            contract.concurrent_claim(broken, "any", [f"a{i}" for i in range(RACERS)], ttl=60)
        assert len(caught.value.faults) == RACERS
        assert all(isinstance(f, DatabaseError) for f in caught.value.faults)
        with pytest.raises(DatabaseError):  # its own claim, before the race, cannot connect
            contract.duplicate_token_submit(broken, "any", RACERS, ttl=60)


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


def test_one_winner_does_not_hide_racers_that_hit_a_dead_database(real_db):
    transitions.create(TaskSpec(id="half", title="half"))
    split = SplitBoard(good=DjangoBoard("default"), bad=DjangoBoard("unreachable-sqlite"))
    agents = [f"{'bad' if i % 2 else 'good'}-{i}" for i in range(RACERS)]
    with pytest.raises(contract.CriterionError) as caught:
        contract.concurrent_claim(split, "half", agents, ttl=60)
    assert len(caught.value.faults) == RACERS // 2
    assert all(isinstance(f, DatabaseError) for f in caught.value.faults)
    assert Task.objects.get(pk="half").stage == "RUNNING"  # the good half raced: one of them won


def test_a_loser_with_the_wrong_error_is_a_fault_not_a_loser(real_db):
    transitions.create([TaskSpec(id="dep", title="dep"), TaskSpec(id="blocked", title="b", deps=["dep"])])
    with pytest.raises(contract.CriterionError, match="Blocked") as caught:
        contract.concurrent_claim(DjangoBoard("default"), "blocked", ["a", "b", "c"], ttl=60)
    assert all(isinstance(f, errors.Blocked) for f in caught.value.faults)
