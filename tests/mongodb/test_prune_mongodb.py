"""History retention (tests/test_prune.py) on MongoDB: no cascading deletes and no row locks
there, so the prune deletes history and dependency rows itself and meets concurrent writers as
write conflicts; the same board, the same exact counts."""
import pytest
from django.db import connections

from tests.test_prune import (
    check_collapsed_twice,
    check_create_races_prune,
    check_depended_on_is_kept,
    check_dry_run,
    check_prune,
    check_removal_records_trimmed,
)

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_prune_deletes_old_terminal_tasks_collapses_old_renews_and_keeps_the_rest():
    assert connections["default"].vendor == "mongodb"
    check_prune("default")


def test_a_dry_run_writes_nothing_and_counts_what_the_real_run_then_does():
    check_dry_run("default")


def test_a_terminal_task_that_a_pending_task_depends_on_is_kept():
    check_depended_on_is_kept("default")


def test_renews_collapsed_twice_still_count_every_renew_and_the_first_time():
    check_collapsed_twice("default")


def test_a_create_racing_the_prune_of_its_dependency_never_leaves_a_dangling_dependency():
    check_create_races_prune("default")


def test_records_of_deleted_tasks_older_than_the_shortest_window_go_with_a_later_batch():
    check_removal_records_trimmed("default")
