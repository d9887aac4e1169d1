"""The API's read orders (tests/test_list_orders.py), the board's filter (tests/test_board_filter.py) and the
search grammar (tests/test_search.py) on MongoDB."""
import pytest
from django.db import connections

from board.live import board_filter
from tests.test_board_filter import check_counts_and_pages, check_snapshot_pages
from tests.test_search import check_search
from tests.test_list_orders import check_claim_order_pages, check_every_order_pages_by_cursor, check_latest_events

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_claim_order_pages_are_the_order_claims_take():
    assert connections["default"].vendor == "mongodb"
    check_claim_order_pages("default")


def test_latest_events_are_the_most_recent_oldest_first():
    check_latest_events("default")


def test_every_order_of_the_task_list_pages_by_cursor_in_exactly_its_sort():
    check_every_order_pages_by_cursor("default")


def test_the_boards_filter_counts_every_task_and_pages_the_finished_matches(monkeypatch):
    monkeypatch.setattr(board_filter, "CARDS_PER_PAGE", 20)
    check_counts_and_pages()


def test_a_snapshots_columns_resume_page_by_page_to_the_whole_column(monkeypatch):
    check_snapshot_pages(monkeypatch)


def test_each_search_qualifier_finds_exactly_its_tasks():
    check_search("default")
