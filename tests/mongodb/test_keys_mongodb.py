"""One live key per agent name on MongoDB (issue 27, item 14): the tests of
tests/test_key_names.py that need no SQL server, and a race of processes (threads of one process
queue on its writer lock; processes meet in MongoDB itself).

What enforces the rule here: the unique index on AgentKey.live_name, which the backend makes
partial (`partialFilterExpression: {live_name: {$type: "string"}}`), so that the many keys
without a live name (revoked, or ending after a rotation) do not collide, and a second key for
a live name fails its insert with a duplicate key error, inside the minting transaction."""
import multiprocessing
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections

from board import agent_keys
from board.engine import errors
from board.models import AgentKey
from tests import process_racer
from tests.support import database_url

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_the_live_name_index_is_unique_and_partial():
    connection = connections["default"]
    connection.ensure_connection()
    indexes = connection.database[AgentKey._meta.db_table].index_information()
    [index] = [i for i in indexes.values() if i["key"] == [("live_name", 1)]]
    assert index.get("unique") is True
    assert index["partialFilterExpression"] == {"live_name": {"$type": "string"}}


def test_a_second_key_for_a_live_name_is_refused_and_a_rotation_ends_the_old_one():
    old, old_key = agent_keys.create_key("worker-1")
    with pytest.raises(errors.InvalidRequest, match="already has a live key"):
        agent_keys.create_key("worker-1")
    assert AgentKey.objects.filter(name="worker-1").count() == 1
    new, new_key = agent_keys.create_key("worker-1", rotate=timedelta(hours=1))
    assert agent_keys.authenticate(old_key) is not None  # within its grace
    AgentKey.objects.filter(pk=old.pk).update(revoked_at=AgentKey.objects.get(pk=old.pk).revoked_at - timedelta(hours=2))
    assert agent_keys.authenticate(old_key) is None
    assert agent_keys.authenticate(new_key).name == "worker-1"
    assert agent_keys.revoke(new.pk)
    agent_keys.create_key("worker-1")
    assert AgentKey.objects.filter(live_name="worker-1").count() == 1


def test_processes_minting_one_name_at_once_make_one_key():
    processes, rounds = 4, 10
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    url = database_url(connections["default"].settings_dict)
    racers = [ctx.Process(target=process_racer.race, args=(i, url, rounds, barrier, results, "mint"))
              for i in range(processes)]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=120) for _ in range(processes * rounds)]
    for racer in racers:
        racer.join(timeout=60)
    faults = [o for o in outcomes if o[2] == "fault"]
    assert not faults, faults[:3]
    winners = Counter(n for n, _, outcome, _ in outcomes if outcome == "won")
    assert winners == Counter(range(rounds)), "every round must have exactly one key minted"
    for n in range(rounds):
        assert AgentKey.objects.filter(name=f"minted-{n}").count() == 1


# Queue scopes (issue 27, item 17): on MongoDB claim-next takes the ORM path, whose pick (inside
# the write transaction, then the CAS on the task's version) filters by the scope's patterns as
# $regex; the same checks as on the SQL stores.

def test_claim_next_with_a_scope_matches_patterns_exactly():
    from tests.test_key_scopes import check_patterns_match_exactly

    check_patterns_match_exactly("default")


def test_scoped_claimers_racing_take_only_their_queues_each_once():
    from tests.test_key_scopes import check_scoped_claimers_race

    check_scoped_claimers_race("default")


def test_a_scoped_key_is_stored_and_read_back_with_its_scope():
    _, key = agent_keys.create_key("ci-agent", queues="ci-*,docs")
    assert agent_keys.scope_of(agent_keys.authenticate(key)) == ("ci-*", "docs")
    assert agent_keys.authenticate_deferred(key).scope == ("ci-*", "docs")
