import pytest

from board import transitions
from board.transitions import TaskSpec
from tests.support import postgres_db_mark, sqlite_db_mark


@pytest.mark.parametrize("alias", [pytest.param("default", marks=sqlite_db_mark()), pytest.param("postgres", marks=postgres_db_mark())])
def test_create_and_claim(alias):
    transitions.create(TaskSpec(id="x", title="x"), using=alias)
    assert transitions.claim("x", "a", 10, using=alias).lease.fence == 1
