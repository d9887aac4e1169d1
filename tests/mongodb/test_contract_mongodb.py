"""The board's contract (tests/test_contract.py) on MongoDB, through django-mongodb-backend on
the ORM path (MongoDB runs no SQL)."""
import pytest
from django.conf import settings

from board.engine import errors
from tests.test_contract import ROUNDS, BoardContract


class TestMongoDBBoard(BoardContract):
    pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
    alias = "default"
    hot_path = "orm"
    # A collection that is gone reads as empty on MongoDB: every racer finds no task.
    missing_table_fault = errors.NotFound
    # SecantusDB runs each transaction through one Python server process: 100 rounds of each race
    # (instead of 200) keep this class under a few minutes. Any other server (TEST_MONGO_URL: a
    # real replica set) runs the full 200.
    rounds = 100 if settings.MONGODB_ON_TEST_SERVER else ROUNDS
