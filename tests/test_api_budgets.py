"""Queue budgets over HTTP (issue 32, item 5): an operator sets one with PUT /api/queues/{name},
usage reported with complete adds to it, and at the budget a claim of the queue is 409
budget_exhausted until the budget is raised; through the Python client too. The engine's rules
and the race on every store are in the contract suite (tests/test_contract.py, "budgets")."""
from __future__ import annotations

from board.models import Queue
from tests.support import db_state, sqlite_db_mark
from tests.test_api import agent, assert_error, create, get, http, operator, post  # noqa: F401 (fixtures)
from tests.test_api_queues import put

pytestmark = sqlite_db_mark()


def claim_next(http, key, **fields):  # noqa: F811
    return post(http, "/claim", {"ttl_seconds": 60, **fields}, key)


def test_a_budget_is_set_spent_by_reports_and_raised(http, agent, operator):  # noqa: F811
    set_ = put(http, "/queues/llm", {"budget": {"tokens": 100, "per": "total"}, "reason": "trial"}, operator)
    assert set_.status_code == 200, set_.content
    body = set_.json()
    assert (body["budget"], body["spent"], body["budget_exhausted"]) == (
        {"tokens": 100, "cost_usd": None, "per": "total"}, {"tokens": 0, "cost_usd": 0.0}, False)
    for n in range(3):
        create(http, agent, id=f"l{n}", queue="llm", priority=-n)
    for tokens in (60, 50):
        held = claim_next(http, agent, queue="llm").json()
        done = post(http, f"/tasks/{held['task']['id']}/complete", {
            "token": held["lease"]["token"], "result": {},
            "usage": {"model": "m", "input_tokens": tokens, "output_tokens": 0, "source": "reported"}}, agent)
        assert done.status_code == 200, done.content
    queue = get(http, "/queues/llm", agent).json()
    assert (queue["spent"], queue["budget_exhausted"], queue["budget_exhausted_until"]) == (
        {"tokens": 110, "cost_usd": 0.0}, True, None)
    error = assert_error(claim_next(http, agent, queue="llm"), 409, "budget_exhausted")
    assert error["message"].startswith("queue llm has spent its budget (100 tokens in total)")
    assert_error(post(http, "/tasks/l2/claim", {"ttl_seconds": 60}, agent), 409, "budget_exhausted")
    assert claim_next(http, agent).status_code == 204  # without a queue: passed by

    before = db_state(), list(Queue.objects.values_list())
    for bad in ({"per": "week", "tokens": 1}, {"tokens": 1}, {"per": "day"}, {"per": "day", "tokens": 0},
                {"per": "day", "cost_usd": 0}, {"per": "day", "tokens": 1, "x": 1}):
        assert_error(put(http, "/queues/llm", {"budget": bad}, operator), 422, "validation_error")
    assert_error(put(http, "/queues/llm", {"budget": {"tokens": 500, "per": "total"}}, agent), 403, "forbidden")
    assert (db_state(), list(Queue.objects.values_list())) == before

    raised = put(http, "/queues/llm", {"budget": {"tokens": 500, "per": "total"}}, operator).json()
    assert (raised["spent"], raised["budget_exhausted"]) == ({"tokens": 110, "cost_usd": 0.0}, False)
    assert claim_next(http, agent, queue="llm").json()["task"]["id"] == "l2"
    history = get(http, "/queues/llm/history", agent).json()["items"]
    assert [h["changes"] for h in history][:1] == [{"budget": [{"tokens": 100, "cost_usd": None, "per": "total"},
                                                               {"tokens": 500, "cost_usd": None, "per": "total"}]}]
