"""Fairness-key budgets over HTTP (issue 32, item 5): `GET /api/fairness-keys`,
`GET /api/fairness-keys/{name}` and `PUT /api/fairness-keys/{name}` `{"budget": {...} | null,
"reason"}`. An operator sets a key's budget, usage reported with complete spends it whatever the
task's queue, and once it is spent claim-next passes the key's tasks by in every queue and a
claim of one by id is 409 budget_exhausted, until the budget is raised. The engine's rules and
the race on every store are in the contract suite (tests/test_contract.py, "budgets")."""
from __future__ import annotations

import pytest

from board import agent_keys
from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import FairnessKey, FairnessKeyChange
from tests.support import db_state, sqlite_db_mark
from tests.test_api import agent, assert_error, create, get, http, operator, post, used_key  # noqa: F401 (fixtures)
from tests.test_api_queues import put

pytestmark = sqlite_db_mark()

TOTAL_100 = {"tokens": 100, "cost_usd": None, "per": "total"}


def everything() -> tuple:
    return (db_state(), list(FairnessKey.objects.order_by("name").values()),
            list(FairnessKeyChange.objects.order_by("pk").values()))


def claim_next(http, key, **fields):  # noqa: F811
    return post(http, "/claim", {"ttl_seconds": 60, **fields}, key)


def complete_with(http, key, held: dict, tokens: int):  # noqa: F811
    done = post(http, f"/tasks/{held['task']['id']}/complete", {
        "token": held["lease"]["token"], "result": {},
        "usage": {"model": "m", "input_tokens": tokens, "output_tokens": 0, "source": "reported"}}, key)
    assert done.status_code == 200, done.content


def test_a_key_s_budget_is_spent_by_reports_from_any_queue_holds_its_tasks_back_everywhere_and_is_raised(
        http, agent, operator):  # noqa: F811
    set_ = put(http, "/fairness-keys/plan:big/1", {"budget": {"tokens": 100, "per": "total"}, "reason": "trial"},
               operator)
    assert set_.status_code == 200, set_.content
    assert set_.json() == {"name": "plan:big/1", "weight": 1, "budget": TOTAL_100,
                           "spent": {"tokens": 0, "cost_usd": 0.0}, "budget_exhausted": False,
                           "budget_exhausted_until": None}
    # The key's tasks in two queues, ahead of a task without a key in each.
    for n, queue in enumerate(("chat", "embed", "chat")):
        create(http, agent, id=f"k{n}", queue=queue, fairness_key="plan:big/1", priority=10 - n)
    create(http, agent, id="free-chat", queue="chat", priority=-10)
    create(http, agent, id="free-embed", queue="embed", priority=-10)

    first = claim_next(http, agent, queue="chat").json()
    assert first["task"]["id"] == "k0"
    complete_with(http, agent, first, 60)
    second = claim_next(http, agent, queue="embed").json()
    assert second["task"]["id"] == "k1"
    complete_with(http, agent, second, 50)  # reaches the budget: 110 of 100

    shown = get(http, "/fairness-keys/plan:big/1", agent).json()
    assert (shown["spent"], shown["budget_exhausted"], shown["budget_exhausted_until"]) == (
        {"tokens": 110, "cost_usd": 0.0}, True, None)
    assert get(http, "/fairness-keys", agent).json()["items"] == [shown]
    # k2 (chat) is held back: claim-next takes the keyless tasks, in its queue and in any.
    assert claim_next(http, agent, queue="chat").json()["task"]["id"] == "free-chat"
    assert claim_next(http, agent).json()["task"]["id"] == "free-embed"
    assert claim_next(http, agent).status_code == 204
    assert claim_next(http, agent, queue="chat").status_code == 204
    before = everything()
    error = assert_error(post(http, "/tasks/k2/claim", {"ttl_seconds": 60}, agent), 409, "budget_exhausted")
    assert error["message"].startswith("fairness key plan:big/1 has spent its budget (100 tokens in total)"), error
    assert everything() == before

    raised = put(http, "/fairness-keys/plan:big/1", {"budget": {"tokens": 500, "per": "total"}}, operator)
    assert raised.status_code == 200, raised.content
    assert (raised.json()["spent"], raised.json()["budget_exhausted"]) == ({"tokens": 110, "cost_usd": 0.0}, False)
    assert claim_next(http, agent).json()["task"]["id"] == "k2"
    assert list(FairnessKeyChange.objects.order_by("pk").values_list("key", "actor", "reason", "changes")) == [
        ("plan:big/1", "operator-1", "trial", {"budget": [None, TOTAL_100]}),
        ("plan:big/1", "operator-1", "", {"budget": [TOTAL_100, {"tokens": 500, "cost_usd": None, "per": "total"}]})]
    removed = put(http, "/fairness-keys/plan:big/1", {"budget": None, "reason": "done"}, operator).json()
    assert (removed["budget"], removed["spent"], removed["budget_exhausted"]) == (None, None, False)


def test_a_key_s_weight_is_shown_and_a_budget_left_as_it_was_is_not_recorded(http, agent, operator):  # noqa: F811
    create(http, agent, id="w0", fairness_key="heavy", fairness_weight=3)
    assert get(http, "/fairness-keys/heavy", agent).json() == {
        "name": "heavy", "weight": 3, "budget": None, "spent": None, "budget_exhausted": False,
        "budget_exhausted_until": None}
    budget = {"cost_usd": 2.5, "per": "day"}
    first = put(http, "/fairness-keys/heavy", {"budget": budget, "reason": "a day's allowance"}, operator).json()
    assert (first["weight"], first["budget"], first["spent"]) == (
        3, {"tokens": None, "cost_usd": 2.5, "per": "day"}, {"tokens": 0, "cost_usd": 0.0})
    before = everything()
    assert put(http, "/fairness-keys/heavy", {"budget": budget, "reason": "again"}, operator).json() == first
    assert everything() == before  # the same budget: nothing written, no history row


@pytest.mark.parametrize("body", [
    {"budget": {"per": "week", "tokens": 1}}, {"budget": {"tokens": 1}}, {"budget": {"per": "day"}},
    {"budget": {"per": "day", "tokens": 0}}, {"budget": {"per": "day", "cost_usd": 0}},
    {"budget": {"per": "day", "tokens": 1, "x": 1}}, {"budget": {"per": "day", "tokens": 10**15 + 1}},
    {"budget": {"per": "day", "tokens": "100"}}, {"budget": "100 a day"}, {"reason": "no budget given"},
    {"budget": None, "extra": 1}, {"budget": None, "reason": "x" * 501}, "not json", [],
])
def test_a_bad_body_is_422_and_writes_nothing(http, operator, body):  # noqa: F811
    transitions.create([TaskSpec(id="t", title="t", fairness_key="kept")])
    put(http, "/fairness-keys/kept", {"budget": {"tokens": 100, "per": "day"}}, operator)
    before = everything()
    assert_error(put(http, "/fairness-keys/kept", body, operator), 422, "validation_error")
    assert everything() == before


def test_a_bad_key_name_is_422_and_writes_nothing(http, operator):  # noqa: F811
    before = everything()
    for name in ("k" * 201, "tab%09in"):
        assert_error(put(http, f"/fairness-keys/{name}", {"budget": None}, operator), 422, "validation_error")
    assert everything() == before


def test_only_unscoped_queue_changers_set_a_key_s_budget(http, agent, operator):  # noqa: F811
    put(http, "/fairness-keys/plan", {"budget": {"tokens": 10, "per": "day"}}, operator)
    _, scoped = agent_keys.create_key("scoped-op", is_operator=True, queues="ci-*")
    before = everything()
    for key in (agent, scoped):
        for budget in ({"tokens": 1000, "per": "day"}, None):
            assert_error(put(http, "/fairness-keys/plan", {"budget": budget}, key), 403, "forbidden")
        assert_error(put(http, "/fairness-keys/new-key", {"budget": None}, key), 403, "forbidden")
    assert_error(put(http, "/fairness-keys/plan", {"budget": None}), 401, "unauthorized")
    assert everything() == before


def test_an_unknown_key_is_404_and_a_scoped_key_sees_the_keys_its_queues_name(http, agent, operator):  # noqa: F811
    assert_error(get(http, "/fairness-keys/nobody-named-me", agent), 404, "not_found")
    assert get(http, "/fairness-keys", agent).json() == {"items": []}
    transitions.create([TaskSpec(id="ci", title="t", queue="ci-main", fairness_key="seen"),
                        TaskSpec(id="docs", title="t", queue="docs", fairness_key="hidden")])
    for name in ("seen", "hidden"):
        put(http, f"/fairness-keys/{name}", {"budget": {"tokens": 5, "per": "month"}}, operator)
    assert [k["name"] for k in get(http, "/fairness-keys", agent).json()["items"]] == ["hidden", "seen"]
    _, scoped = agent_keys.create_key("scoped-reader", queues="ci-*")
    assert [k["name"] for k in get(http, "/fairness-keys", scoped).json()["items"]] == ["seen"]
    assert get(http, "/fairness-keys/seen", scoped).json()["budget"] == {"tokens": 5, "cost_usd": None, "per": "month"}
    assert_error(get(http, "/fairness-keys/hidden", scoped), 404, "not_found")
