"""A rate key's row is locked by a claim only when the key has a rate (issue 29, item 2): on
PostgreSQL, on the store's statement (`rate_slot`'s FOR UPDATE) and on the ORM path
(flow.take_slot's conditional update), a claim of a task whose key has no rate never waits on the
key's row, so that a key nobody rated costs its tasks' claims no hot row. Shown with another
session holding the row locked and a lock timeout on the claimer's."""
from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError, connections

from board.engine import flow, stores, transitions
from board.engine.transitions import TaskSpec
from board.models import RateKey
from tests.support import database_url, postgres_db_mark

pytestmark = postgres_db_mark()
ALIAS = "postgres"


@pytest.mark.parametrize("hot_path", ["auto", "orm"])
def test_a_claim_waits_on_a_rate_keys_row_only_when_the_key_has_a_rate(settings, hot_path):
    settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": hot_path}
    assert (stores.store(ALIAS).statements is None) == (hot_path == "orm")
    transitions.create([TaskSpec(id="free", title="f", queue="qa", rate_key="unrated"),
                        TaskSpec(id="paced", title="p", queue="qb", rate_key="rated")], using=ALIAS)
    flow.change_rate_key("rated", rate={"count": 1, "per_seconds": 3600}, actor="op", using=ALIAS)
    table, pk = RateKey._meta.db_table, RateKey._meta.pk.column
    with psycopg.connect(database_url(connections[ALIAS].settings_dict)) as locker:
        locker.execute(f"SELECT 1 FROM {table} WHERE {pk} IN ('unrated', 'rated') FOR UPDATE")  # held
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("SET lock_timeout = '1s'")
        try:
            claim = transitions.claim_next("agent", 60, queue="qa", using=ALIAS)
            assert claim is not None and claim.task.pk == "free"  # no wait on the unrated key's row
            with pytest.raises(OperationalError, match="lock timeout"):
                transitions.claim_next("agent", 60, queue="qb", using=ALIAS)  # the rated one is locked
        finally:
            with connections[ALIAS].cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        locker.rollback()
    assert transitions.claim_next("agent", 60, queue="qb", using=ALIAS).task.pk == "paced"
    transitions.complete("free", claim.lease.token, {}, using=ALIAS)
