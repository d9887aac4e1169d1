"""An operator's edit over the API (PATCH /api/tasks/{id}; issue 33: tags set by operators)
through the whole HTTP stack on SQLite. The engine's rule (one compare-and-swap held to the
version) on every store is the contract suite's test_operator_edit_is_guarded_by_the_version."""
from __future__ import annotations

import json

import pytest

from tests.support import db_state, sqlite_db_mark
from tests.test_api import agent, assert_error, auth, create, get, http, operator  # noqa: F401 (fixtures)

pytestmark = sqlite_db_mark()


def patch(http, path: str, body, key: str | None = None):  # noqa: F811
    return http.patch(f"/api{path}", data=json.dumps(body), content_type="application/json", **auth(key))


def test_an_operator_edits_a_task_and_its_tags_at_the_version_seen(http, agent, operator):  # noqa: F811
    create(http, agent, id="t", title="old", tags=["a"])
    response = patch(http, "/tasks/t", {"version": 0, "title": "new", "tags": ["urgent", "ci", "urgent"]}, operator)
    assert response.status_code == 200, response.content
    task = response.json()
    assert (task["title"], task["tags"], task["version"]) == ("new", ["urgent", "ci"], 1)
    assert [t["id"] for t in get(http, "/tasks?search=tag:urgent", agent).json()["items"]] == ["t"]
    events = get(http, "/tasks/t/events", agent).json()["items"]
    assert (events[-1]["verb"], events[-1]["actor"], events[-1]["detail"]) == ("edit", "operator-1", {"changed": ["tags", "title"]})
    # Fields not sent (or sent as null) stay.
    kept = patch(http, "/tasks/t", {"version": 1, "priority": 3, "payload": None}, operator).json()
    assert (kept["title"], kept["tags"], kept["priority"], kept["payload"]) == ("new", ["urgent", "ci"], 3, None)


@pytest.mark.parametrize("body, status, code", [
    ({"version": 0}, 200, None),  # nothing to change: answered as it is
    ({"version": 5, "title": "x"}, 409, "version_conflict"),
    ({"title": "x"}, 422, "validation_error"),  # version is required
    ({"version": 0, "tags": ["no spaces"]}, 422, "validation_error"),
    ({"version": 0, "tags": [f"t{n}" for n in range(21)]}, 422, "validation_error"),
    ({"version": 0, "title": ""}, 422, "validation_error"),
    ({"version": 0, "queue": "other"}, 422, "validation_error"),  # not editable
    ({"version": 0, "payload": "x" * 300_000}, 413, "too_large"),
])
def test_a_bad_or_stale_edit_writes_nothing(http, agent, operator, body, status, code):  # noqa: F811
    create(http, agent, id="t", title="old")
    before = db_state()
    response = patch(http, "/tasks/t", body, operator)
    if code is None:
        assert response.status_code == status and response.json()["title"] == "old"
    else:
        assert_error(response, status, code)
    assert db_state() == before


def test_only_operators_edit(http, agent, operator):  # noqa: F811
    create(http, agent, id="t")
    before = db_state()
    assert_error(patch(http, "/tasks/t", {"version": 0, "title": "x"}, agent), 403, "forbidden")
    assert_error(patch(http, "/tasks/nope", {"version": 0, "title": "x"}, operator), 404, "not_found")
    assert db_state() == before
