"""Queue rates over the API (issue 29, item 2): `PUT /api/queues/{name}` `{"rate": {"count",
"per_seconds"}}`, what `GET /api/queues` shows of it, and a claim that finds only work the rate
holds back: 204 with Retry-After (a waiting claim too, answered at once when the rate opens within
its wait). What every store enforces is tests/test_contract.py's rate section."""
from __future__ import annotations

import time

import pytest

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import Queue, QueueChange
from tests.support import db_state, queue_shards, sqlite_db_mark
from tests.test_api import assert_error, get, http, operator, post, used_key  # noqa: F401
from tests.test_api_queues import put

pytestmark = sqlite_db_mark()


def test_a_rate_is_set_shown_and_spaces_the_claims(http, operator):
    agent = used_key("agent-rate")
    transitions.create([TaskSpec(id=f"call-{n}", title="call the model", queue="llm") for n in range(3)])
    response = put(http, "/queues/llm", {"rate": {"count": 2, "per_seconds": 60}, "reason": "provider RPM"}, operator)
    assert response.status_code == 200
    assert (response.json()["rate"], response.json()["next_claim_at"]) == ({"count": 2, "per_seconds": 60}, None)
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 200
    held_back = post(http, "/claim", {"ttl_seconds": 60}, agent)
    assert held_back.status_code == 204
    assert 29 <= int(held_back["Retry-After"]) <= 30  # 60 s / 2 claims, rounded up
    listed = {q["name"]: q for q in get(http, "/queues", agent).json()["items"]}
    assert listed["llm"]["next_claim_at"] is not None and listed["llm"]["depth"]["QUEUED"] == 2
    history = get(http, "/queues/llm/history", agent).json()["items"]
    assert history[0]["changes"] == {"rate": [None, {"count": 2, "per_seconds": 60}]}
    queue_shards("llm", "rate").update(open_at=time.time() - 1)  # as if 30 s had passed
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 200
    assert put(http, "/queues/llm", {"rate": None}, operator).json()["rate"] is None
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 200


def test_a_waiting_claim_is_told_when_the_rate_opens_instead_of_parked(http, operator):
    agent = used_key("agent-wait")
    transitions.create([TaskSpec(id=f"w{n}", title="w", queue="paced") for n in range(2)])
    put(http, "/queues/paced", {"rate": {"count": 1, "per_seconds": 5}}, operator)
    assert post(http, "/claim", {"ttl_seconds": 60}, agent).status_code == 200
    started = time.monotonic()
    answer = post(http, "/claim", {"ttl_seconds": 60, "wait_seconds": 20}, agent)
    assert answer.status_code == 204 and time.monotonic() - started < 2  # answered, not held for 20 s
    assert 1 <= int(answer["Retry-After"]) <= 5
    # Without ready work the rate holds back, a 204 has no Retry-After.
    assert "Retry-After" not in post(http, "/claim", {"ttl_seconds": 60, "queue": "empty"}, agent)


@pytest.mark.parametrize("rate", [{"count": 0, "per_seconds": 60}, {"count": 5}, {"per_seconds": 60},
                                  {"count": 5, "per_seconds": 0}, {"count": 5, "per_seconds": 86401},
                                  {"count": 5, "per_seconds": 60, "unit": "minute"}, "5/min", 5])
def test_a_bad_rate_is_422_and_writes_nothing(http, operator, rate):
    put(http, "/queues/kept", {"rate": {"count": 3, "per_seconds": 60}}, operator)
    before = (db_state(), list(Queue.objects.values()), list(QueueChange.objects.values()))
    assert_error(put(http, "/queues/kept", {"rate": rate}, operator), 422, "validation_error")
    assert (db_state(), list(Queue.objects.values()), list(QueueChange.objects.values())) == before


def test_an_agent_key_cannot_set_a_rate(http):
    agent = used_key("agent-no")
    before = (db_state(), list(Queue.objects.values()))
    assert_error(put(http, "/queues/any", {"rate": {"count": 1, "per_seconds": 1}}, agent), 403, "forbidden")
    assert (db_state(), list(Queue.objects.values())) == before
