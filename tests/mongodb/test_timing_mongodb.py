"""board.engine.timing on MongoDB: the scripted history of tests/test_timing.py, the same exact waits,
runs and percentiles (its reads are ORM only: the primary key's binary search, an id range,
the task's rows by task id)."""
import pytest
from django.db import connections

from tests.test_timing import assert_exact, assert_last_runs, run_script

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_per_queue_waits_and_runs_over_the_last_hour_are_exact_on_mongodb():
    assert connections["default"].vendor == "mongodb"
    run_script("default")
    assert_exact("default")


def test_a_completed_tasks_last_run_is_read_from_its_history_on_mongodb():
    run_script("default")
    assert_last_runs("default")
