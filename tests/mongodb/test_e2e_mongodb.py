"""The end-to-end tests of tests/test_e2e.py (agent processes racing through the real server
for the board's tasks, a killed agent's task reclaimed by the real reaper, the example worker)
on MongoDB: the same functions, collected here where the default database is MongoDB.

On the test server (SecantusDB, which scans a collection for every query but by `_id`) the race
runs over 200 tasks instead of 1,000; on any other server (TEST_MONGO_URL), 1,000."""
import pytest
from django.conf import settings

import tests.test_e2e
from tests.test_e2e import *  # noqa: F401,F403

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _tasks_for_this_server(monkeypatch):
    if settings.MONGODB_ON_TEST_SERVER:
        monkeypatch.setattr(tests.test_e2e, "TASKS", 200)
