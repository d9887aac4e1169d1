"""The plan's graph data (issue 33, item 3: board/live/graph.py): which tasks a plan holds,
both ways through the dependencies, the cap, the tag view, who may ask and what a bad question
gets. The drawing is tested in Chromium (tests/test_browser_graph.py)."""
from __future__ import annotations

import pytest

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live import graph
from tests.support import db_state, sqlite_db_mark
from tests.test_api import session_client, staff_user

pytestmark = sqlite_db_mark()


def plan():
    transitions.create([
        TaskSpec(id="a", title="a", tags=["nightly"]),
        TaskSpec(id="b", title="b", deps=["a"], tags=["nightly"]),
        TaskSpec(id="c", title="c", deps=["a"]),
        TaskSpec(id="d", title="d", deps=["b", "c"], tags=["nightly"]),
        TaskSpec(id="x", title="x"),  # another plan
        TaskSpec(id="y", title="y", deps=["x"]),
    ])


def test_a_plan_is_everything_connected_to_its_root_either_way():
    plan()
    for root in ("a", "c", "d"):
        ids, complete = graph.plan_around(root)
        assert (ids[0], sorted(ids), complete) == (root, ["a", "b", "c", "d"], True)
    data = graph.graph_of(graph.plan_around("b")[0])
    assert sorted(map(tuple, data["edges"])) == [("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")]
    assert {n["id"]: n["stage"] for n in data["nodes"]} == {"a": "QUEUED", "b": "PENDING", "c": "PENDING", "d": "PENDING"}
    assert set(data["nodes"][0]) == set(graph.NODE_FIELDS)
    ids, complete = graph.plan_around("a", limit=3)
    assert (len(ids), complete) == (3, False)


def test_the_tag_view_holds_the_tagged_tasks_and_the_edges_among_them():
    plan()
    ids, complete = graph.tagged("nightly")
    assert (ids, complete) == (["a", "b", "d"], True)
    assert sorted(map(tuple, graph.graph_of(ids)["edges"])) == [("b", "a"), ("d", "b")]


def test_the_data_endpoint_answers_a_reader_and_refuses_the_rest():
    plan()
    client, _ = session_client(staff_user("reader", perms=("view_task",)))
    answer = client.get("/board/graph/data?root=b")
    assert answer.status_code == 200
    body = answer.json()
    assert (sorted(n["id"] for n in body["nodes"]), body["complete"], body["root"]) == (["a", "b", "c", "d"], True, "b")
    assert "lease_token_hash" not in answer.content.decode() and "token" not in body["nodes"][0]
    assert client.get("/board/graph/?root=b").status_code == 200
    before = db_state()
    for query, status in (("root=nope", 404), ("", 422), ("root=a&tag=t", 422), ("root=a%20b", 422),
                          ("tag=not%20a%20tag", 422), ("root=a&extra=1", 422)):
        refused = client.get(f"/board/graph/data?{query}")
        assert refused.status_code == status, (query, refused.content)
        assert set(refused.json()) == {"error"}
    stranger, _ = session_client(staff_user("stranger"))  # staff without board.view_task
    assert stranger.get("/board/graph/data?root=b").status_code == 403
    assert stranger.get("/board/graph/?root=b").status_code == 403
    assert db_state() == before


@pytest.mark.parametrize("path", ["/board/graph/?root=a", "/board/graph/data?root=a"])
def test_nobody_logged_in_is_sent_to_the_login(client, path):
    answer = client.get(path, secure=True)
    assert answer.status_code == 302 and "/login/" in answer["Location"]
