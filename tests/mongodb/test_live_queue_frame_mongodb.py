"""The "queues" frame's concurrency keys and rate times on MongoDB: tests/test_live_queue_frame.py's
checks, run on the MongoDB store (key_overview's and resources.overview's reads are ORM only: filters,
counts, no join)."""
import pytest
from django.db import connections

from tests import test_live_queue_frame as frame_checks

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("check", [
    frame_checks.test_the_frame_carries_the_keys_running_tasks_name_full_ones_first,
    frame_checks.test_the_keys_are_bounded_with_the_full_ones_kept,
    frame_checks.test_a_rate_time_is_sent_only_for_claims_at_least_ten_seconds_apart,
    frame_checks.test_the_frame_text_changes_only_with_what_it_shows,
    frame_checks.test_the_frame_carries_the_held_resources_and_their_holders_never_a_token,
    frame_checks.test_the_resources_and_their_holders_are_bounded_full_ones_kept,
], ids=lambda check: check.__name__.removeprefix("test_"))
def test_on_mongodb(check):
    assert connections["default"].vendor == "mongodb"
    check("default")
