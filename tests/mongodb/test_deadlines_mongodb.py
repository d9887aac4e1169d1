"""Deadlines beside the lease (tests/test_deadlines.py) on MongoDB, through django-mongodb-backend
on the ORM path: the queue, attempt and progress timeouts, the renew that makes progress, the
races of the deadline pass with the holder's complete and heartbeat, and bad input."""
import pytest

from tests.test_deadlines import DeadlineContract


class TestMongoDBDeadlines(DeadlineContract):
    pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
    alias = "default"
    hot_path = "orm"  # the races' 100 rounds take about 15 s each on the test server (SecantusDB)
