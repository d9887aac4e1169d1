"""Rate keys over the API (issue 29, item 2): `GET /api/rate-keys`, `PUT /api/rate-keys/{name}`
`{"rate": {"count", "per_seconds"} | null, "reason"}`, a create's `rate_key`, and a claim that finds
only work a rate key holds back: 204 with Retry-After. What every store enforces is
tests/test_contract.py's rate key section."""
from __future__ import annotations

import time

import pytest

from board import agent_keys
from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import RateKey, RateKeyChange
from tests.support import db_state, sqlite_db_mark
from tests.test_api import assert_error, create, get, http, operator, post, used_key  # noqa: F401
from tests.test_api_queues import put

pytestmark = sqlite_db_mark()


def everything() -> tuple:
    return db_state(), list(RateKey.objects.values()), list(RateKeyChange.objects.values())


def test_a_rate_key_is_named_by_creates_set_by_an_operator_and_spaces_claims_across_queues(http, operator):
    agent = used_key("agent-rk")
    made = create(http, agent, id="c0", queue="chat", rate_key="provider:llm/gpt")
    assert made["rate_key"] == "provider:llm/gpt"
    create(http, agent, id="e0", queue="embed", rate_key="provider:llm/gpt")
    listed = get(http, "/rate-keys", agent).json()["items"]
    assert listed == [{"name": "provider:llm/gpt", "rate": None, "next_claim_at": None}]  # made by the create
    changed = put(http, "/rate-keys/provider:llm/gpt", {"rate": {"count": 2, "per_seconds": 60},
                                                         "reason": "provider RPM"}, operator)
    assert changed.status_code == 200, changed.content
    assert changed.json() == {"name": "provider:llm/gpt", "rate": {"count": 2, "per_seconds": 60},
                              "next_claim_at": None}
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).json()["task"]["id"] == "c0"
    held_back = post(http, "/claim", {"ttl_seconds": 60}, agent)  # e0, of another queue, waits for the key
    assert held_back.status_code == 204
    assert 29 <= int(held_back["Retry-After"]) <= 30  # 60 s / 2 claims, rounded up
    assert "Retry-After" not in post(http, "/claim", {"ttl_seconds": 60, "queue": "other"}, agent)
    assert get(http, "/rate-keys", agent).json()["items"][0]["next_claim_at"] is not None
    history = list(RateKeyChange.objects.values_list("key", "actor", "reason", "changes"))
    assert history == [("provider:llm/gpt", "operator-1", "provider RPM",
                        {"rate": [None, {"count": 2, "per_seconds": 60}]})]
    RateKey.objects.filter(name="provider:llm/gpt").update(rate_open_at=time.time() - 1)  # as if 30 s had passed
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).json()["task"]["id"] == "e0"
    assert put(http, "/rate-keys/provider:llm/gpt", {"rate": None}, operator).json()["rate"] is None


def test_a_waiting_claim_is_told_when_the_rate_key_opens_instead_of_parked(http, operator):
    agent = used_key("agent-wait")
    transitions.create([TaskSpec(id=f"w{n}", title="w", queue=f"q{n}", rate_key="paced") for n in range(2)])
    put(http, "/rate-keys/paced", {"rate": {"count": 1, "per_seconds": 5}}, operator)
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 200
    started = time.monotonic()
    answer = post(http, "/claim", {"ttl_seconds": 60, "wait_seconds": 20}, agent)
    assert answer.status_code == 204 and time.monotonic() - started < 2  # answered, not held for 20 s
    assert 1 <= int(answer["Retry-After"]) <= 5


@pytest.mark.parametrize("body", [{"rate": {"count": 0, "per_seconds": 60}}, {"rate": {"count": 5}},
                                  {"rate": {"count": 5, "per_seconds": 86401}}, {"rate": "5/min"},
                                  {"rate": {"count": 5, "per_seconds": 60, "unit": "minute"}},
                                  {"reason": "no rate"}, {"rate": None, "extra": 1}, {"rate": None, "reason": "x" * 501}])
def test_a_bad_rate_is_422_and_writes_nothing(http, operator, body):
    put(http, "/rate-keys/kept", {"rate": {"count": 3, "per_seconds": 60}}, operator)
    before = everything()
    assert_error(put(http, "/rate-keys/kept", body, operator), 422, "validation_error")
    assert everything() == before


def test_a_bad_rate_key_name_is_422_on_create_and_put(http, operator):
    agent = used_key("agent-bad")
    before = everything()
    assert_error(post(http, "/tasks", {"title": "t", "rate_key": ""}, agent), 422, "validation_error")
    assert_error(post(http, "/tasks", {"title": "t", "rate_key": "k" * 201}, agent), 422, "validation_error")
    assert_error(put(http, "/rate-keys/" + "k" * 201, {"rate": None}, operator), 422, "validation_error")
    assert everything() == before


def test_only_unscoped_queue_changers_set_a_rate_key(http):
    agent = used_key("agent-no")
    _, scoped = agent_keys.create_key("scoped-op", is_operator=True, queues="ci-*")
    before = everything()
    assert_error(put(http, "/rate-keys/any", {"rate": {"count": 1, "per_seconds": 1}}, agent), 403, "forbidden")
    assert_error(put(http, "/rate-keys/any", {"rate": {"count": 1, "per_seconds": 1}}, scoped), 403, "forbidden")
    assert everything() == before


def test_a_scoped_key_lists_the_rate_keys_its_queues_name(http):
    transitions.create([TaskSpec(id="ci", title="t", queue="ci-main", rate_key="seen"),
                        TaskSpec(id="docs", title="t", queue="docs", rate_key="hidden")])
    _, scoped = agent_keys.create_key("scoped-reader", queues="ci-*")
    assert [k["name"] for k in get(http, "/rate-keys", scoped).json()["items"]] == ["seen"]
