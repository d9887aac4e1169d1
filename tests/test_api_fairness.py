"""The claim order over the API (issue 29, item 8): fairness keys and weights on create, each
task's `claim_rank`, `order=claim` listing the line, claim-next taking it in that order, and bad
input refused with nothing written. What every store does is tests/test_contract.py's claim
order section; this is the HTTP side."""
from __future__ import annotations

import pytest

from board.models import FairnessKey
from tests.support import db_state, sqlite_db_mark
from tests.test_api import assert_error, get, http, post, used_key  # noqa: F401

pytestmark = sqlite_db_mark()


def test_two_plans_take_turns_and_the_list_shows_the_line_claims_take(http):
    agent = used_key("agent-plans")
    big = post(http, "/tasks", [{"id": f"big-{n}", "title": "b", "queue": "fair", "fairness_key": "plan:big"}
                                for n in range(5)], agent)
    small = post(http, "/tasks", [{"id": f"small-{n}", "title": "s", "queue": "fair", "fairness_key": "plan:small",
                                   "fairness_weight": 2} for n in range(2)], agent)
    assert (big.status_code, small.status_code) == (201, 201)
    assert {t["fairness_key"] for t in small.json()["items"]} == {"plan:small"}
    listed = get(http, "/tasks?stage=QUEUED&queue=fair&order=claim&limit=3", agent).json()
    rest = get(http, f"/tasks?stage=QUEUED&queue=fair&order=claim&cursor={listed['next']}", agent).json()
    line = [t["id"] for t in listed["items"] + rest["items"]]
    ranks = [t["claim_rank"] for t in listed["items"] + rest["items"]]
    assert line == ["big-0", "small-0", "small-1", "big-1", "big-2", "big-3", "big-4"]  # weight 2: turns 30 s apart
    assert ranks == sorted(ranks)
    taken = []
    for _ in line:
        response = post(http, "/claim", {"ttl_seconds": 60, "queue": "fair"}, agent)
        assert response.status_code == 200, response.content
        taken.append(response.json()["task"]["id"])
    assert taken == line
    assert FairnessKey.objects.get(name="plan:small").weight == 2


@pytest.mark.parametrize("fields", [{"fairness_key": ""}, {"fairness_key": "x" * 201}, {"fairness_key": 5},
                                    {"fairness_key": "line\nbreak"}, {"fairness_key": "k", "fairness_weight": 0},
                                    {"fairness_key": "k", "fairness_weight": 1001},
                                    {"fairness_key": "k", "fairness_weight": "2"}, {"fairness_weight": 2},
                                    {"fairness_key": "k", "claim_rank": 0}])
def test_bad_fairness_fields_are_422_and_write_nothing(http, fields):
    agent = used_key("agent-bad-fair")
    before = db_state(), list(FairnessKey.objects.values_list("name", "weight"))
    assert_error(post(http, "/tasks", {"title": "t", **fields}, agent), 422, "validation_error")
    assert (db_state(), list(FairnessKey.objects.values_list("name", "weight"))) == before
