"""The admin's search on each SQL store: which indexes serve it (issue 11). What a search
matches is tested through the admin in tests/test_admin.py (on SQLite, and on MongoDB by its
session); here, the plans: on PostgreSQL every word's match is served by an index (none is a
sequential scan even when scans are forbidden); on SQLite the title's words are scanned, as the
docs/admin.md says."""
from __future__ import annotations

from collections import Counter

import pytest
from django.contrib import admin
from django.db import connections, transaction
from django.test import RequestFactory

from board.engine import errors, transitions
from board.engine.lifecycle import Stage
from board.engine.transitions import TaskSpec, create
from board.models import Task, TaskEvent
from tests.support import db_state, expire_lease, postgres_db_mark, race
from tests.test_admin import RenewingAgent

pytestmark = postgres_db_mark()


def searched(alias: str, words: str):
    task_admin = admin.site._registry[Task]
    request = RequestFactory().get("/admin/board/task/", {"q": words})
    queryset, _ = task_admin.get_search_results(request, Task.objects.using(alias), words)
    return queryset


def postgres_plan(words: str) -> str:
    """The plan PostgreSQL makes for the search with sequential scans priced out: a part of the
    query that no index can serve still shows as a Seq Scan."""
    with transaction.atomic(using="postgres"):
        with connections["postgres"].cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
        return searched("postgres", words).explain()


@pytest.fixture
def postgres():
    # Every test here has the postgres marker (pytestmark): without the server, tests/conftest.py
    # skips it with a NOT RUN line (fails it in CI) before this runs.
    create([TaskSpec(id=f"t-{n}", title=f"Resize image {n}", queue=f"q{n % 3}") for n in range(50)],
           actor="test", using="postgres")
    with connections["postgres"].cursor() as cursor:
        cursor.execute("ANALYZE board_task")


def test_the_title_trigram_index_exists_on_postgresql(postgres):
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'task_title_trgm'")
        [(definition,)] = cursor.fetchall()
    assert "gin" in definition and "gin_trgm_ops" in definition and "upper" in definition.lower()


@pytest.mark.parametrize("words", ["resize", "t-4", "q1", "agent-7", "resize q1"])
def test_every_search_word_is_served_by_an_index_on_postgresql(postgres, words):
    plan = postgres_plan(words)
    assert "Seq Scan" not in plan, plan
    assert "task_title_trgm" in plan, plan  # words of the title
    assert "_like" in plan, plan  # an id prefix: the primary key's pattern index
    assert "task_owner" in plan and "task_queue" in plan, plan
    assert sorted(t.pk for t in searched("postgres", "resize q1")) == sorted(
        f"t-{n}" for n in range(50) if n % 3 == 1)


def test_on_sqlite_the_title_is_scanned_as_the_readme_says():
    plan = searched("default", "resize").explain()
    assert "SCAN board_task" in plan, plan


# ---------------------------------------------------------------------------------------------
# The engine's force release held to a lease (what the admin's confirmation uses), on both SQL
# stores, against a holder renewing as fast as it can in its own thread and connection.


@pytest.fixture(params=["default", "postgres"])
def alias(request):
    return request.param  # a missing PostgreSQL: see the postgres fixture


ROUNDS = 20


def test_force_release_held_to_the_lease_wins_over_renewals(alias):
    for n in range(ROUNDS):
        task_id = f"held-{n}"
        create([TaskSpec(id=task_id, title="t")], actor="test", using=alias)
        claim = transitions.claim(task_id, "agent-1", 600, using=alias)
        seen = ("agent-1", claim.lease.fence)
        with RenewingAgent(task_id, claim.lease.token, every=0, using=alias) as agent:
            agent.wait_for(2)
            released = transitions.force_release(task_id, actor="op", held_by=seen, using=alias)
            agent.wait_for_loss()
        assert released.stage == Stage.QUEUED and agent.renewals >= 2, n
        assert isinstance(agent.lost, errors.LeaseLost)
        verbs = list(TaskEvent.objects.using(alias).filter(task_id=task_id).values_list("verb", flat=True))
        assert verbs[-1] == "force_release" and verbs.count("force_release") == 1


def test_force_release_held_to_a_lease_that_changed_hands_writes_nothing(alias):
    create([TaskSpec(id="moved", title="t")], actor="test", using=alias)
    first = transitions.claim("moved", "agent-1", 600, using=alias)
    transitions.force_release("moved", actor="other-op", using=alias)
    second = transitions.claim("moved", "agent-1", 600, using=alias)  # the same name, a new fence
    before = db_state(alias)
    with pytest.raises(errors.VersionConflict) as refused:
        transitions.force_release("moved", actor="op", held_by=("agent-1", first.lease.fence), using=alias)
    assert refused.value.task.fence == second.lease.fence == first.lease.fence + 1
    assert db_state(alias) == before
    transitions.complete("moved", second.lease.token, {}, using=alias)


def test_two_operators_and_a_takeover_race_for_an_expired_lease_one_move_wins(alias):
    """Two operators confirm a force release of the same lease (held to its holder and fence)
    while an agent claims the task, its lease having expired, all released by one barrier, over
    many rounds. Exactly one of them ends that lease: an operator's release (the other operator
    is refused: the lease is gone) or the agent's takeover (both operators refused). The agent's
    claim always succeeds: either it takes the lease over, or it claims the task released."""
    outcomes = Counter()
    for n in range(ROUNDS):
        task_id = f"three-{n}"
        create([TaskSpec(id=task_id, title="t")], actor="test", using=alias)
        first = transitions.claim(task_id, "agent-1", 600, using=alias)
        expire_lease(task_id, using=alias)
        seen = ("agent-1", first.lease.fence)
        results = race([
            lambda task_id=task_id, seen=seen: transitions.force_release(task_id, actor="op-a", held_by=seen,
                                                                         using=alias),
            lambda task_id=task_id, seen=seen: transitions.force_release(task_id, actor="op-b", held_by=seen,
                                                                         using=alias),
            lambda task_id=task_id: transitions.claim(task_id, "agent-2", 600, using=alias),
        ], alias=alias)
        *released, claimed = results
        assert isinstance(claimed, transitions.Claim), claimed
        assert claimed.lease.fence == first.lease.fence + 1
        wins = [r for r in released if isinstance(r, Task)]
        assert all(isinstance(r, errors.VersionConflict) for r in released if not isinstance(r, Task)), released
        verbs = list(TaskEvent.objects.using(alias).filter(task_id=task_id).order_by("id")
                     .values_list("verb", flat=True))
        if wins:
            assert len(wins) == 1 and verbs == ["create", "claim", "force_release", "claim"], (n, verbs)
            outcomes["an operator's release"] += 1
        else:
            assert verbs == ["create", "claim", "reclaim", "claim"], (n, verbs)
            outcomes["the agent's takeover"] += 1
        stored = Task.objects.using(alias).get(pk=task_id)
        # A release gives its attempt back; a takeover does not (that attempt's lease was lost).
        attempts = 1 if wins else 2
        assert (stored.stage, stored.owner, stored.fence, stored.attempts) == (Stage.RUNNING, "agent-2", 2, attempts)
        transitions.complete(task_id, claimed.lease.token, {}, using=alias)
    assert sum(outcomes.values()) == ROUNDS
    print(f"two force releases vs a takeover over {ROUNDS} rounds on {alias}: {dict(outcomes)}")
