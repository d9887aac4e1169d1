"""A snapshot's column counts followed from the history (tests/test_column_counts.py) on MongoDB:
its event ids follow commit order (the counter document), so nothing is ever unseen."""
import pytest
from django.conf import settings
from django.db import connections

from tests.test_column_counts import (  # noqa: F401  (following: a fixture, found by pytest by name)
    check_flush,
    check_follow,
    check_prune,
    check_race,
    following,
)

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_a_snapshots_counts_follow_the_history_after_one_count(following):
    assert connections["default"].vendor == "mongodb"
    check_follow("default")


def test_tasks_the_prune_deleted_leave_the_counts_they_were_in(following):
    check_prune("default")


def test_a_flushed_history_is_counted_again(following):
    check_flush("default")


def test_counts_followed_while_writers_move_tasks_equal_the_counted_ones_in_every_read(following):
    check_race("default", rounds=25 if settings.MONGODB_ON_TEST_SERVER else 100)
