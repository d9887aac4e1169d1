"""Usage reports (issue 32, item 5, first half: no budgets yet) through the whole HTTP stack on
SQLite: `usage` on renew, complete and fail; GET /api/tasks/{id}/usage (by attempt) and
GET /api/usage (by agent and queue); refusals write nothing. The /metrics counters are tested
against the real server in tests/test_metrics.py; the engine's sums on every store in the
contract suite (test_usage_reports_add_up_by_attempt_and_a_missing_cost_stays_missing)."""
from __future__ import annotations

import pytest

from board.models import TaskUsage
from tests.support import db_state, end_backoff, expire_lease, sqlite_db_mark
from tests.test_api import agent, agent_b, assert_error, create, get, http, post  # noqa: F401 (fixtures)

pytestmark = sqlite_db_mark()

OPUS = {"model": "opus", "input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.05}


def claim_next(http, key) -> dict:  # noqa: F811
    response = post(http, "/claim", {"ttl_seconds": 60}, key)
    assert response.status_code == 200, response.content
    return response.json()


def test_reports_add_up_by_attempt_and_a_missing_cost_stays_missing(http, agent, agent_b):  # noqa: F811
    create(http, agent, id="t", queue="llm", max_retries=2)
    first = claim_next(http, agent)["lease"]["token"]
    renewed = post(http, "/tasks/t/renew", {"token": first, "ttl_seconds": 60, "usage": OPUS}, agent)
    assert renewed.status_code == 200 and set(renewed.json()["lease"]) == {"token", "fence", "expires_at"}
    assert post(http, "/tasks/t/fail", {"token": first, "error": "boom", "usage": OPUS}, agent).status_code == 200
    end_backoff("t")
    second = claim_next(http, agent_b)["lease"]["token"]
    done = post(http, "/tasks/t/complete", {"token": second, "result": {}, "usage": {
        "model": "haiku", "input_tokens": 10, "output_tokens": 5, "source": "estimated"}}, agent_b)
    assert done.status_code == 200 and done.json()["stage"] == "COMPLETED"
    body = get(http, "/tasks/t/usage", agent).json()
    assert body["total"] == {"input_tokens": 2010, "output_tokens": 405, "cost_usd": None, "cost_missing": 1, "reports": 3}
    assert body["attempts"] == [
        {"fence": 1, "agent": "agent-a", "models": ["opus"], "input_tokens": 2000, "output_tokens": 400,
         "cost_usd": 0.1, "cost_missing": 0, "reports": 2},
        {"fence": 2, "agent": "agent-b", "models": ["haiku"], "input_tokens": 10, "output_tokens": 5,
         "cost_usd": None, "cost_missing": 1, "reports": 1},
    ]
    assert TaskUsage.objects.get(fence=2).source == "estimated"
    overview = get(http, "/usage?hours=1", agent).json()
    assert [(a["agent"], a["input_tokens"]) for a in overview["agent"]] == [("agent-a", 2000), ("agent-b", 10)]
    assert [(q["queue"], q["output_tokens"], q["cost_usd"]) for q in overview["queue"]] == [("llm", 405, None)]


def test_a_task_without_reports_says_so(http, agent):  # noqa: F811
    create(http, agent, id="t")
    assert get(http, "/tasks/t/usage", agent).json() == {"task": "t", "attempts": [], "total": {
        "input_tokens": 0, "output_tokens": 0, "cost_usd": None, "cost_missing": 0, "reports": 0}}
    assert_error(get(http, "/tasks/nope/usage", agent), 404, "not_found")
    assert_error(get(http, "/usage?hours=0", agent), 422, "validation_error")


@pytest.mark.parametrize("bad", [
    {"input_tokens": -1}, {"input_tokens": 1.5}, {"input_tokens": True}, {"cost_usd": -0.01},
    {"source": "guessed", "input_tokens": 1}, {"model": "x" * 101, "input_tokens": 1}, {"tokens": 5}, {},
    "many", {"input_tokens": 10**13},
])
def test_a_bad_report_refuses_the_move_and_writes_nothing(http, agent, bad):  # noqa: F811
    create(http, agent, id="t")
    token = claim_next(http, agent)["lease"]["token"]
    before = db_state()
    for path, body in (("renew", {"token": token, "ttl_seconds": 60}), ("complete", {"token": token, "result": {}}),
                       ("fail", {"token": token, "error": "x"})):
        assert_error(post(http, f"/tasks/t/{path}", {**body, "usage": bad}, agent), 422, "validation_error")
    assert db_state() == before and TaskUsage.objects.count() == 0


def test_a_stale_holders_report_is_not_written(http, agent, agent_b):  # noqa: F811
    create(http, agent, id="t")
    old = claim_next(http, agent)["lease"]["token"]
    expire_lease("t")
    new = post(http, "/tasks/t/claim", {"ttl_seconds": 60}, agent_b).json()["lease"]["token"]
    assert_error(post(http, "/tasks/t/renew", {"token": old, "ttl_seconds": 60, "usage": OPUS}, agent), 409, "lease_lost")
    assert_error(post(http, "/tasks/t/complete", {"token": old, "result": {}, "usage": OPUS}, agent), 409, "lease_lost")
    assert TaskUsage.objects.count() == 0
    post(http, "/tasks/t/complete", {"token": new, "result": {}, "usage": OPUS, "next": {"ttl_seconds": 30}}, agent_b)
    assert list(TaskUsage.objects.values_list("fence", "agent")) == [(2, "agent-b")]
