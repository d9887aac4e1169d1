"""board.live.insights on MongoDB: the scripted transitions of tests/test_insights.py, the same exact
agents, throughput and queue depths (its queries are ORM only, no join)."""
import pytest
from django.db import connections

from tests.test_insights import assert_exact, run_script

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_agents_throughput_and_queue_depth_are_exact_on_mongodb():
    assert connections["default"].vendor == "mongodb"
    assert_exact(run_script("default"))
