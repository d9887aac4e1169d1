"""Hand-offs (issue 32, item 4) through the whole HTTP stack on SQLite: notes on a task
(POST/GET /api/tasks/{id}/notes), and what a claim hands the new holder (`lease.notes`,
`lease.inputs`). The engine's rules on every store, with the race, are in the contract suite
(tests/test_contract.py, "notes and hand-offs")."""
from __future__ import annotations

import pytest

from board.engine import handoffs, selectors
from board.engine.limits import MAX_INPUTS_BYTES, MAX_NOTE_CHARS, MAX_NOTES_IN_CLAIM, MAX_NOTES_PER_TASK
from board.models import Task, TaskNote
from tests.support import db_state, end_backoff, expire_lease, sqlite_db_mark
from tests.test_api import (  # noqa: F401 (fixtures)
    agent,
    agent_b,
    assert_error,
    create,
    get,
    http,
    operator,
    post,
)

pytestmark = sqlite_db_mark()

NOTE_FIELDS = {"id", "text", "author", "by_holder", "attempt", "fence", "at"}


def claim_next(http, key, **fields) -> dict:  # noqa: F811
    response = post(http, "/claim", {"ttl_seconds": 60, **fields}, key)
    assert response.status_code == 200, response.content
    return response.json()


def note(http, key, task_id: str, text: str, token: str | None = None):  # noqa: F811
    return post(http, f"/tasks/{task_id}/notes", {"text": text, **({"token": token} if token else {})}, key)


def test_the_next_attempt_reads_the_notes_of_the_last_one(http, agent, agent_b, operator):  # noqa: F811
    create(http, agent, id="t", max_retries=3)
    first = claim_next(http, agent)
    assert "notes" not in first["lease"] and "inputs" not in first["lease"]  # a task without any
    written = note(http, agent, "t", "the v2 API rate-limits at 10/s", first["lease"]["token"])
    assert written.status_code == 201, written.content
    body = written.json()
    assert set(body) == NOTE_FIELDS
    assert (body["text"], body["author"], body["by_holder"], body["attempt"], body["fence"]) == (
        "the v2 API rate-limits at 10/s", "agent-a", True, 1, 1)
    # Staff add one without a token (operator rights).
    staff = note(http, operator, "t", "use the sandbox account")
    assert staff.status_code == 201, staff.content
    assert (staff.json()["author"], staff.json()["by_holder"]) == ("operator-1", False)
    # A renew hands nothing over again: the holder has them.
    renewed = post(http, "/tasks/t/renew", {"token": first["lease"]["token"], "ttl_seconds": 60}, agent)
    assert set(renewed.json()["lease"]) == {"token", "fence", "expires_at"}
    assert get(http, "/tasks/t", agent).json()["notes_count"] == 2

    failed = post(http, "/tasks/t/fail", {"token": first["lease"]["token"], "error": "rate limited"}, agent)
    assert failed.status_code == 200, failed.content
    end_backoff("t")
    second = claim_next(http, agent_b)
    assert second["task"]["id"] == "t" and second["lease"]["fence"] == 2
    assert [(n["text"], n["author"], n["attempt"]) for n in second["lease"]["notes"]] == [
        ("the v2 API rate-limits at 10/s", "agent-a", 1), ("use the sandbox account", "operator-1", 1)]
    listed = get(http, "/tasks/t/notes", agent_b)
    assert listed.status_code == 200
    assert listed.json()["items"] == second["lease"]["notes"]


def test_a_claim_carries_the_newest_notes_oldest_first(http, agent, operator):  # noqa: F811
    create(http, agent, id="t")
    for n in range(MAX_NOTES_IN_CLAIM + 5):
        assert note(http, operator, "t", f"note {n}").status_code == 201
    handed = claim_next(http, agent)["lease"]["notes"]
    assert [n["text"] for n in handed] == [f"note {n}" for n in range(5, MAX_NOTES_IN_CLAIM + 5)]
    assert len(get(http, "/tasks/t/notes", agent).json()["items"]) == MAX_NOTES_IN_CLAIM + 5


def test_a_stale_holder_writes_no_note(http, agent, agent_b):  # noqa: F811
    create(http, agent, id="t")
    old = claim_next(http, agent)
    expire_lease("t")
    new = post(http, "/tasks/t/claim", {"ttl_seconds": 60}, agent_b).json()
    assert new["lease"]["fence"] == 2
    before = db_state()
    assert_error(note(http, agent, "t", "late", old["lease"]["token"]), 409, "lease_lost")
    # Another agent with the holder's token acts as nobody (as complete's rule).
    assert_error(note(http, agent, "t", "not mine", new["lease"]["token"]), 403, "forbidden")
    assert db_state() == before
    assert note(http, agent_b, "t", "mine", new["lease"]["token"]).status_code == 201


@pytest.mark.parametrize("body, status, code", [
    ({"text": ""}, 422, "validation_error"),
    ({"text": "   "}, 422, "validation_error"),
    ({"text": "x" * (MAX_NOTE_CHARS + 1)}, 422, "validation_error"),
    ({"text": "nul \u0000 here"}, 422, "validation_error"),
    ({"text": 5}, 422, "validation_error"),
    ({}, 422, "validation_error"),
    ({"text": "ok", "author": "me"}, 422, "validation_error"),  # no such field
    ({"text": "ok", "token": "x" * 101}, 422, "validation_error"),
])
def test_a_bad_note_is_refused_and_writes_nothing(http, agent, operator, body, status, code):  # noqa: F811
    create(http, agent, id="t")
    before = db_state()
    assert_error(post(http, "/tasks/t/notes", body, operator), status, code)
    assert db_state() == before


def test_who_may_write_a_note(http, agent, operator):  # noqa: F811
    create(http, agent, id="t")
    before = db_state()
    # An agent without the task's token is not staff; an unknown task is 404; no key is 401.
    assert_error(note(http, agent, "t", "hi"), 403, "forbidden")
    assert_error(note(http, operator, "nope", "hi"), 404, "not_found")
    assert_error(get(http, "/tasks/nope/notes", agent), 404, "not_found")
    assert_error(post(http, "/tasks/t/notes", {"text": "hi"}), 401, "unauthorized")
    # A token on a task that is not RUNNING is no lease.
    assert_error(note(http, agent, "t", "hi", "some-token"), 409, "lease_lost")
    assert db_state() == before


def test_a_task_takes_at_most_its_notes_and_then_refuses(http, agent, operator):  # noqa: F811
    create(http, agent, id="t")
    TaskNote.objects.bulk_create([TaskNote(task_id="t", text=f"n{n}", author="operator", at=Task.objects.get().created_at)
                                  for n in range(MAX_NOTES_PER_TASK - 1)])
    Task.objects.filter(pk="t").update(notes_count=MAX_NOTES_PER_TASK - 1)
    assert note(http, operator, "t", "the last one").status_code == 201
    before = db_state()
    assert_error(note(http, operator, "t", "one more"), 409, "notes_full")
    assert db_state() == before
    assert selectors.problems() == []


def test_a_claim_carries_its_dependencies_results(http, agent):  # noqa: F811
    create(http, agent, id="fetch")
    create(http, agent, id="parse")
    create(http, agent, id="report", deps=["fetch", "parse"])
    for task_id, result in (("fetch", {"rows": 3}), ("parse", ["a", "b"])):
        held = post(http, f"/tasks/{task_id}/claim", {"ttl_seconds": 60}, agent).json()
        assert post(http, f"/tasks/{task_id}/complete", {"token": held["lease"]["token"], "result": result},
                    agent).status_code == 200
    claimed = claim_next(http, agent)
    assert claimed["task"]["id"] == "report"
    assert claimed["lease"]["inputs"] == {"fetch": {"rows": 3}, "parse": ["a", "b"]}
    assert "inputs_omitted" not in claimed["lease"]


def test_results_past_the_inputs_room_are_named_not_carried(http, agent):  # noqa: F811
    big = "x" * (200 * 1024)  # each result under the 256 KiB cap, together over the 1 MiB room
    deps = [f"d{n}" for n in range(7)]
    for dep in deps:
        create(http, agent, id=dep)
    create(http, agent, id="sum", deps=deps)
    for dep in deps:
        held = post(http, f"/tasks/{dep}/claim", {"ttl_seconds": 60}, agent).json()
        assert post(http, f"/tasks/{dep}/complete", {"token": held["lease"]["token"], "result": big},
                    agent).status_code == 200
    lease = claim_next(http, agent)["lease"]
    fits = MAX_INPUTS_BYTES // (len(big) + 2)
    assert list(lease["inputs"]) == deps[:fits] and lease["inputs_omitted"] == deps[fits:]
    assert all(value == big for value in lease["inputs"].values())
    assert handoffs.inputs_of(deps) == (lease["inputs"], lease["inputs_omitted"])


def test_the_admin_page_of_a_task_shows_its_notes(http, agent, operator):  # noqa: F811
    from tests.test_api import session_client, staff_user

    create(http, agent, id="t")
    assert note(http, operator, "t", "check <b>the</b> EU endpoint").status_code == 201
    client, _ = session_client(staff_user("admin-reader", perms=("view_task",)))
    page = client.get("/admin/board/task/t/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "operator-1</strong> (attempt 0, staff" in html
    assert "check &lt;b&gt;the&lt;/b&gt; EU endpoint" in html  # escaped, never markup
