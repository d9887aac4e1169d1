"""The tests of tests/test_consumers.py on MongoDB: the same functions, collected here where the
default database is MongoDB."""
import pytest

from tests.test_consumers import *  # noqa: F401,F403

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
