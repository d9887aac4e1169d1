"""The API's read orders (tests/test_list_orders.py) on MongoDB."""
import pytest
from django.db import connections

from tests.test_list_orders import check_claim_order_pages, check_latest_events

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_claim_order_pages_are_the_order_claims_take():
    assert connections["default"].vendor == "mongodb"
    check_claim_order_pages("default")


def test_latest_events_are_the_most_recent_oldest_first():
    check_latest_events("default")
