"""The board's contract (tests/test_contract.py) on MongoDB, through django-mongodb-backend on
the ORM path (MongoDB runs no SQL)."""
import os

import pytest

from board import errors
from tests.test_contract import ROUNDS, BoardContract


class TestMongoDBBoard(BoardContract):
    pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
    alias = "default"
    hot_path = "orm"
    # A collection that is gone reads as empty on MongoDB: every racer finds no task.
    missing_table_fault = errors.NotFound
    # SecantusDB runs each transaction through one Python server process: 100 rounds of each race
    # (instead of 200) keep this class under a few minutes. TEST_MONGO_URL runs them against a
    # real replica set, where the full 200 are cheap.
    rounds = ROUNDS if os.environ.get("TEST_MONGO_URL") else 100
