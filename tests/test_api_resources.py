"""Resource leases over HTTP (issue 32, item 1): `resources` at create and on the task, GET
/api/resources, PUT /api/resources/{name} (operators), GET /api/resource-holder (a downstream
system's fence check), and bad input refused with nothing written. The engine's rules and the
race on every store are in the contract suite (tests/test_contract.py, "resource leases")."""
from __future__ import annotations

import pytest

from board.models import Resource, TaskResource
from tests.support import db_state, expire_lease, sqlite_db_mark
from tests.test_api import (  # noqa: F401 (fixtures)
    agent,
    agent_b,
    assert_error,
    claim,
    create,
    get,
    http,
    operator,
    post,
)
from tests.test_api_queues import put

pytestmark = sqlite_db_mark()


def claim_next(http, key, **fields):  # noqa: F811
    return post(http, "/claim", {"ttl_seconds": 60, **fields}, key)


def test_two_workers_and_a_merge_slot(http, agent, agent_b, operator):  # noqa: F811
    """The README's example: the second worker's claim passes the task that needs the held
    merge-slot by; GET /api/resources says who holds it until when; completing frees it."""
    first = create(http, agent, id="merge-1", resources=["merge-slot"], priority=1)
    assert first["resources"] == ["merge-slot"]
    create(http, agent, id="merge-2", resources=["merge-slot"])
    create(http, agent, id="docs", resources=[{"name": "gpu", "units": 1}])
    held = claim_next(http, agent).json()
    assert held["task"]["id"] == "merge-1"
    assert claim_next(http, agent_b).json()["task"]["id"] == "docs"  # merge-2 waits
    assert claim_next(http, agent_b).status_code == 204
    refused = assert_error(post(http, "/tasks/merge-2/claim", {"ttl_seconds": 60}, agent_b), 409, "blocked")
    assert refused["details"]["waiting"] == "resource merge-slot held by agent-a (task merge-1)"

    listed = get(http, "/resources", agent).json()["items"]
    slot = next(r for r in listed if r["name"] == "merge-slot")
    assert slot == {"name": "merge-slot", "capacity": 1, "held": "exclusive", "holds_below": 0, "holders": [
        {"task": "merge-1", "agent": "agent-a", "fence": 1, "units": None, "exclusive": True,
         "expires_at": held["lease"]["expires_at"]}]}
    gpu = next(r for r in listed if r["name"] == "gpu")
    assert (gpu["held"], [h["units"] for h in gpu["holders"]]) == (1, [1])

    done = post(http, "/tasks/merge-1/complete", {"token": held["lease"]["token"], "result": {}}, agent)
    assert done.status_code == 200, done.content
    assert claim_next(http, agent_b).json()["task"]["id"] == "merge-2"


def test_the_resources_come_a_page_at_a_time_by_name(http, agent):  # noqa: F811
    for n in range(5):
        create(http, agent, id=f"r{n}", resources=[f"slot-{n}"])
    first = get(http, "/resources?limit=2", agent).json()
    assert [r["name"] for r in first["items"]] == ["slot-0", "slot-1"] and first["next_after"] == "slot-1"
    second = get(http, "/resources?limit=2&after=slot-1", agent).json()
    assert [r["name"] for r in second["items"]] == ["slot-2", "slot-3"]
    last = get(http, f"/resources?limit=2&after={second['next_after']}", agent).json()
    assert ([r["name"] for r in last["items"]], last["next_after"]) == (["slot-4"], None)
    assert_error(get(http, "/resources?limit=0", agent), 422, "validation_error")


def test_the_holder_check_refuses_a_lease_that_was_taken_over(http, agent, agent_b):  # noqa: F811
    create(http, agent, id="push", resources=["branch:main"])
    _, _token = claim(http, agent, "push")

    def holds(fence: int) -> bool:
        response = get(http, f"/resource-holder?name=branch:main&task=push&fence={fence}", agent)
        assert response.status_code == 200, response.content
        return response.json()["holds"]

    assert holds(1) is True and holds(2) is False
    expire_lease("push")
    task, _ = claim(http, agent_b, "push")  # a takeover: fence 2
    assert task["fence"] == 2
    assert holds(1) is False and holds(2) is True
    answer = get(http, "/resource-holder?name=branch:main&task=push&fence=2", agent).json()
    assert [(h["task"], h["agent"], h["fence"]) for h in answer["holders"]] == [("push", "agent-b", 2)]


def test_operators_set_a_capacity_and_agents_may_not(http, agent, operator):  # noqa: F811
    before = db_state(), list(Resource.objects.values_list())
    assert_error(put(http, "/resources/gpu", {"capacity": 2}, agent), 403, "forbidden")
    for bad in ({"capacity": 0}, {"capacity": "2"}, {"capacity": 10_001}, {}, {"capacity": 2, "extra": 1}):
        assert_error(put(http, "/resources/gpu", bad, operator), 422, "validation_error")
    assert_error(put(http, "/resources/a%20b", {"capacity": 2}, operator), 422, "validation_error")
    assert (db_state(), list(Resource.objects.values_list())) == before
    changed = put(http, "/resources/gpu", {"capacity": 2, "reason": "second card"}, operator)
    assert changed.status_code == 200, changed.content
    assert changed.json() == {"name": "gpu", "capacity": 2, "held": 0, "holds_below": 0, "holders": []}


@pytest.mark.parametrize("resources", [
    "merge-slot", ["a b"], [""], [{"name": "gpu", "units": 0}], [{"name": "gpu"}, {"name": "gpu"}],
    ["file:src/**", "file:src/a.py"], [f"r{n}" for n in range(17)], [7], [{"name": "gpu", "extra": 1}],
])
def test_bad_resources_at_create_are_422_and_write_nothing(http, agent, resources):  # noqa: F811
    before = db_state(), list(Resource.objects.values_list()), TaskResource.objects.count()
    response = post(http, "/tasks", {"title": "t", "resources": resources}, agent)
    # The schema's check or the engine's: one code.
    assert_error(response, 422, "validation_error")
    assert (db_state(), list(Resource.objects.values_list()), TaskResource.objects.count()) == before
