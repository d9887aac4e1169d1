"""The admin's tests of tests/test_admin.py (operators' actions, each a compare-and-swap, racing
agents and other operators over many rounds; stale edits refused) on MongoDB: the same
functions, collected here where the default database is MongoDB."""
import pytest

from tests.test_admin import *  # noqa: F401,F403

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
