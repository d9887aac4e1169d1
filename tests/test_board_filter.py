"""The board's filter answered by the server (GET /board/filter, board/live/board_filter.py), through
the whole Django stack on SQLite: its counts are exact over every task (not only the finished
ones a snapshot holds), its finished cards page to the last match, it matches as the page's boxes
do (id or title, holder's name, both in any case; queue exactly), bad input is a 4xx in the JSON
error shape that writes nothing, and who may ask is who may see the board.
The page side (the counts and cards a person sees): tests/test_browser_tasks.py."""
from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live import board_filter
from board.live import frames as live_frames
from board.live import reads as live_reads
from board.models import Task
from tests.support import db_state
from tests.test_tasks_table import _client

pytestmark = pytest.mark.django_db(transaction=True)


def _finish(ids: list[str], *, queue: str = "ingest", owner: str = "worker-1") -> None:
    transitions.create([TaskSpec(id=i, title=f"title of {i}", queue=queue) for i in ids], actor="test")
    for task_id in ids:
        claim = transitions.claim(task_id, owner, 60)
        transitions.complete(task_id, claim.lease.token, {"ok": True})


def test_a_snapshots_columns_resume_page_by_page_to_the_whole_column_in_its_order(monkeypatch):
    check_snapshot_pages(monkeypatch)


def check_snapshot_pages(monkeypatch, page_size: int = 20) -> None:
    """A snapshot holds each column's first page and its cursor; GET /board/filter?stage=&cursor=
    pages on from there to the column's end: every task once, in the column's order (claim order
    for an unfinished column, most recent first for a finished one), ties in a time included.
    (tests/mongodb runs it on MongoDB too.)"""
    monkeypatch.setattr(live_reads, "COLUMN_PAGE", page_size)
    monkeypatch.setattr(board_filter, "CARDS_PER_PAGE", page_size)
    transitions.create([TaskSpec(id=f"q-{i:03}", title="q", priority=i % 3) for i in range(2 * page_size + 7)], actor="t")
    _finish([f"done-{i:03}" for i in range(page_size + 5)])
    # Finished in the same instant: the page's cursor tells them apart by id.
    tie = timezone.now()
    Task.objects.filter(pk__in=[f"done-{i:03}" for i in range(page_size - 3, page_size + 3)]).update(updated_at=tie)
    head = json.loads(live_frames.snapshot_frames(problems=[])[0])
    client = _client()
    for stage, order in (("QUEUED", ("claim_rank", "id")), ("COMPLETED", ("-updated_at", "-id"))):
        ids = [card["id"] for card in head["tasks"] if card["stage"] == stage]
        assert len(ids) == page_size
        cursor = head["next_pages"][stage]
        while cursor:
            page = client.get("/board/filter", {"stage": stage, "cursor": cursor}).json()
            ids += [card["id"] for card in page["tasks"]]
            cursor = page["more"][stage]
        assert ids == list(Task.objects.filter(stage=stage).order_by(*order).values_list("id", flat=True))
    assert head["next_pages"]["RUNNING"] is None


def test_counts_are_exact_over_every_task_and_the_finished_cards_page_to_the_last_match():
    check_counts_and_pages()


def check_counts_and_pages() -> None:
    """(tests/mongodb runs it on MongoDB too, with a smaller page.)"""
    page_size = board_filter.CARDS_PER_PAGE
    extra = page_size // 8  # the matches past the first page
    _finish([f"ux-run-{i:03}" for i in range(page_size + extra)])  # older than every other-* one
    _finish([f"other-{i:03}" for i in range(page_size + 10)], owner="Worker-2")
    transitions.create([TaskSpec(id="ux-run-queued", title="waiting"), TaskSpec(id="plain", title="UX-RUN in its title")],
                       actor="test")
    client = _client()

    answer = client.get("/board/filter", {"text": "UX-run"}).json()
    assert answer["counts"] == {"PENDING": 0, "QUEUED": 2, "RUNNING": 0, "PAUSED": 0,
                                "COMPLETED": page_size + extra, "FAILED": 0, "CANCELLED": 0}
    completed = [card["id"] for card in answer["tasks"] if card["stage"] == "COMPLETED"]
    assert completed == [f"ux-run-{i:03}" for i in reversed(range(extra, page_size + extra))]  # most recent first
    assert answer["more"]["CANCELLED"] is None and answer["more"]["COMPLETED"]
    assert all("token" not in key for card in answer["tasks"] for key in card)

    rest = client.get("/board/filter", {"text": "UX-run", "stage": "COMPLETED",
                                         "cursor": answer["more"]["COMPLETED"]}).json()
    assert [card["id"] for card in rest["tasks"]] == [f"ux-run-{i:03}" for i in reversed(range(extra))]
    assert rest["more"] == {"COMPLETED": None} and "counts" not in rest

    # The holder's name (a RUNNING task's: a finished one has none): a part, in any case.
    transitions.claim("ux-run-queued", "Worker-7", 60)
    transitions.claim("plain", "worker-8", 60)
    assert client.get("/board/filter", {"owner": "WORKER"}).json()["counts"]["RUNNING"] == 2
    assert client.get("/board/filter", {"owner": "worker-7"}).json()["counts"] == {
        "PENDING": 0, "QUEUED": 0, "RUNNING": 1, "PAUSED": 0, "COMPLETED": 0, "FAILED": 0, "CANCELLED": 0}
    # The queue: exactly.
    assert client.get("/board/filter", {"queue": "ingest", "text": "other-00"}).json()["counts"]["COMPLETED"] == 10
    assert client.get("/board/filter", {"queue": "inges"}).json()["counts"]["COMPLETED"] == 0


def test_with_no_filter_a_finished_column_pages_through_all_its_tasks_and_completed_cards_say_who_ran_them():
    transitions.create([TaskSpec(id=f"t-{i}", title="t") for i in range(3)], actor="test")
    for i in range(3):
        claim = transitions.claim(f"t-{i}", f"agent-{i}", 60)
        if i < 2:
            transitions.complete(f"t-{i}", claim.lease.token, {"n": i})
    answer = _client().get("/board/filter", {"stage": "COMPLETED"}).json()
    cards = {card["id"]: card for card in answer["tasks"]}
    assert list(cards) == ["t-1", "t-0"] and answer["more"] == {"COMPLETED": None}
    assert cards["t-0"]["ran_by"] == "agent-0" and cards["t-1"]["ran_by"] == "agent-1"
    assert all(card["run_seconds"] >= 0 and card["wait_seconds"] >= 0 for card in cards.values())


@pytest.mark.parametrize("query, message", [
    ({"q": "x"}, "unknown query parameter 'q'"),
    ({"stage": "DONE"}, "stage is one of"),
    ({"cursor": "abc"}, "a cursor is given with the stage it pages through"),
    ({"stage": "COMPLETED", "cursor": "not-ours"}, "cursor is not one this API gave out"),
    ({"queue": "no spaces allowed"}, "invalid queue name"),
    ({"text": "x" * 1000}, "text is at most"),
    ({"owner": "x" * 1000}, "owner is at most"),
])
def test_bad_input_is_a_4xx_in_the_json_error_shape_and_writes_nothing(query, message):
    _finish(["t-1"])
    client = _client()
    before = db_state()
    response = client.get("/board/filter", query)
    assert response.status_code == 422, response.content
    assert message in response.json()["error"]["message"]
    assert db_state() == before


def test_the_filter_takes_the_boards_permission():
    assert _client(perms=()).get("/board/filter").status_code == 403
    assert _client(perms=()).get("/board/filter").json()["error"]["code"] == "forbidden"
    assert _client(perms=(), staff=False).get("/board/filter").status_code == 302  # not staff: the login page
    assert Client().get("/board/filter").status_code == 302
    assert _client().get("/board/filter").status_code == 200
    assert _client().post("/board/filter").status_code == 405
