"""board.live.insights on MongoDB: the scripted transitions of tests/test_insights.py, the same exact
agents, throughput and queue depths (its queries are ORM only, no join)."""
import pytest
from django.db import connections

from tests.test_insights import assert_exact, run_script

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_agents_throughput_and_queue_depth_are_exact_on_mongodb():
    assert connections["default"].vendor == "mongodb"
    assert_exact(run_script("default"))


def test_the_depth_is_exact_when_the_moved_tasks_queues_are_read_by_their_last_change_on_mongodb(monkeypatch):
    from board.live import reads

    monkeypatch.setattr(reads, "MOVED_BY_ID_MAX", 0)
    assert_exact(run_script("default"))
