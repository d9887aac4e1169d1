"""The board at any moment (tests/test_board_at.py) on MongoDB: no SQL there, so
board.engine.moments folds the history's rows in Python; the same histories, the same answers."""
import pytest
from django.db import connections

from tests.test_board_at import check_horizon, check_moves, check_pages_scopes_problems, check_problems_equal

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_the_board_at_each_move_and_between_moves_is_the_board_as_it_was():
    assert connections["default"].vendor == "mongodb"
    check_moves("default")


def test_pages_scopes_and_problems_at_a_past_moment():
    check_pages_scopes_problems("default")


def test_after_a_prune_a_moment_before_the_horizon_says_it_is_not_exact():
    check_horizon("default")


def test_problems_at_equal_check_of_the_whole_rebuilt_board():
    check_problems_equal("default")
