"""The tests of tests/test_commands.py on MongoDB: the same functions, collected here where the
default database is MongoDB."""
import pytest

from tests.test_commands import *  # noqa: F401,F403

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
