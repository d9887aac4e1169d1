"""The admin's tests of tests/test_admin.py (operators' actions, each a compare-and-swap, racing
agents and other operators over many rounds; stale edits refused) on MongoDB: the same
functions, collected here where the default database is MongoDB.

On the test server (SecantusDB, a one-process server written in Python) each race runs 20 rounds
instead of 50; on any other server (TEST_MONGO_URL), 50."""
import pytest
from django.conf import settings

import tests.test_admin
from tests.test_admin import *  # noqa: F401,F403
from tests.test_admin_task_history import *  # noqa: F401,F403  (the history's grouped renews, the page's buttons)
from tests.test_admin_task_history import test_the_grouped_renewals_on_each_sql_store as _grouped_renewals

# That test is parametrized over the SQL stores (SQLite and PostgreSQL): here its PostgreSQL case
# would be a NOT RUN skip (a failure in CI). On MongoDB it runs once, on the default database.
del test_the_grouped_renewals_on_each_sql_store  # noqa: F821  (bound by the star import)


def test_the_grouped_renewals_on_mongodb():
    _grouped_renewals("default")

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _rounds_for_this_server(monkeypatch):
    if settings.MONGODB_ON_TEST_SERVER:
        monkeypatch.setattr(tests.test_admin, "ROUNDS", 20)
