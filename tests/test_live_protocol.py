"""The websocket's frames as docs/live-protocol.schema.json declares them: every kind of frame,
built by board.live.frames from a real board on the SQLite test database, validates against the
schema, and the schema refuses what no frame may hold (a lease token, an unknown field, an
unknown type). docs/live-protocol.md names the close codes and the snapshot part's size the
consumer uses."""
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from jsonschema import Draft202012Validator

from board.engine import clock, flow, limits, resources, transitions
from board.engine.transitions import TaskSpec
from board.bulk import jobs as bulk_jobs
from board.live import consumers, insights
from board.live import frames as live_frames
from board.live import reads as live_reads
from board.models import RemovedTask, Task, TaskEvent
from tests.support import sqlite_db_mark

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "docs" / "live-protocol.schema.json").read_text())
DOC = (ROOT / "docs" / "live-protocol.md").read_text()
VALIDATOR = Draft202012Validator(SCHEMA)

pytestmark = sqlite_db_mark()


def errors(frame: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(frame)]


def test_the_schema_is_a_valid_json_schema():
    Draft202012Validator.check_schema(SCHEMA)


@pytest.fixture
def busy_board(monkeypatch):
    """A board with every kind of row a frame shows: more tasks than one snapshot part (made
    small here: a snapshot holds at most a column page of each stage) and than a column's page,
    a completion, a retry, a failure with a traceback, a live lease, an expired one (a problem),
    and a record of a pruned task."""
    monkeypatch.setattr(live_frames, "SNAPSHOT_PART", 40)
    extra = [TaskSpec(id=f"bulk-{n:03d}", title="bulk") for n in range(live_reads.COLUMN_PAGE + 10)]
    transitions.create([TaskSpec(id="a", title="first", queue="q", payload={"n": 1}),
                        TaskSpec(id="b", title="second", deps=["a"], queue="q"),
                        TaskSpec(id="c", title="third", queue="r", max_retries=0),
                        TaskSpec(id="d", title="fourth", queue="r", on_hold=True), *extra])
    held = transitions.claim("a", "agent-1", 30)
    transitions.renew("a", held.lease.token, 30, progress=0.5)
    transitions.complete("a", held.lease.token, {"ok": True})
    failing = transitions.claim("c", "agent-2", 30)
    transitions.fail("c", failing.lease.token, "boom", traceback="Traceback (most recent call last):\n...",
                     retryable=False)
    transitions.claim("b", "agent-1", 30)
    transitions.claim("bulk-000", "agent-2", 30)
    Task.objects.filter(pk="bulk-000").update(lease_expires_at=clock.now() - timedelta(minutes=1))
    RemovedTask.objects.create(task_id="gone", stage="COMPLETED", at=timezone.now())
    flow.change_queue("r", actor="op-1", reason="provider outage", paused=True)  # a paused queue
    flow.change_queue("q", actor="op-1", concurrency=2)  # and one with a limit
    # A bulk job that ran (a task changed after it read them: one lost), and one still pending.
    request = bulk_jobs.check_request({"queue": "r"}, "cancel", "tidy")
    job = bulk_jobs.create(request, actor="op-1")
    transitions.edit("d", actor="op-1", version=0, title="changed")
    bulk_jobs.run(job.pk)
    bulk_jobs.create(bulk_jobs.check_request({"search": "tag:none"}, "add-tag", tag="x"), actor="op-1")


def every_frame() -> dict[str, list[dict]]:
    built: dict[str, list[dict]] = {}
    snapshot = live_frames.snapshot_frames()
    # A task deleted after its events were read: its item carries "task": null.
    events = list(TaskEvent.objects.order_by("id"))
    Task.objects.filter(pk="bulk-109").delete()
    texts = [*snapshot,
             live_frames.changes_frame(events),
             live_frames.removals_frame(list(RemovedTask.objects.order_by("id"))),
             live_frames.problems_frame(live_frames.problems_message()),
             live_frames.insights_frame(insights.compute()[0]),
             live_frames.queues_frame(live_frames.queues_message()),
             *[live_frames.bulk_frame(job) for job in bulk_jobs.recent()]]
    for text in texts:
        frame = json.loads(text)
        built.setdefault(frame["type"], []).append(frame)
    return built


def test_every_frame_the_board_builds_is_valid(busy_board):
    built = every_frame()
    assert set(built) == {"snapshot", "snapshot_more", "tasks", "removed", "problems", "insights", "queues", "bulk"}
    for kind, frames in built.items():
        for frame in frames:
            assert errors(frame) == [], f"{kind}: {errors(frame)}"
    # The rows behind them are the ones the fixture meant to show.
    head = built["snapshot"][0]
    cards = [card for f in built["snapshot"] + built["snapshot_more"] for card in f["tasks"]]
    assert len(cards) == sum(min(n, live_reads.COLUMN_PAGE) for n in head["counts"].values())
    assert head["counts"]["QUEUED"] > live_reads.COLUMN_PAGE
    assert head["next_pages"]["QUEUED"] and not head["next_pages"]["COMPLETED"]
    assert [i["task"] for i in built["tasks"][0]["items"] if i["event"]["task"] == "bulk-109"] == [None]
    assert any(p["code"] == "lease_expired" for p in built["problems"][0]["problems"])
    details = [item["event"]["detail"] for item in built["tasks"][0]["items"]]
    assert any(isinstance(d, dict) and d.get("has_traceback") is True for d in details)
    assert {a["name"] for a in built["insights"][0]["agents"]} == {"agent-1", "agent-2"}
    queues = built["queues"][0]["queues"]
    assert [q["name"] for q in queues] == ["r", "default", "q"]  # paused first, then by name
    by_name = {q["name"]: q for q in queues}
    assert (by_name["r"]["paused"], by_name["r"]["paused_by"], by_name["r"]["paused_reason"]) == (
        True, "op-1", "provider outage")
    assert (by_name["q"]["concurrency"], by_name["q"]["running"], by_name["q"]["queued"]) == (2, 1, 0)
    assert [(b["state"], b["total"], b["done"], b["lost"], b["skipped"]) for b in built["bulk"]] == [
        ("done", 2, 1, 1, 0), ("pending", 0, 0, 0, 0)]


def test_the_schema_refuses_what_no_frame_may_hold(busy_board):
    built = every_frame()
    snapshot = built["snapshot"][0]
    card = snapshot["tasks"][0]
    assert errors({**snapshot, "tasks": [{**card, "lease_token": "x"}]})  # a token field
    assert errors({**snapshot, "tasks": [{**card, "payload": {"n": 1}}]})  # a bulky field
    assert errors({**snapshot, "extra": 1})
    assert errors({"type": "unknown"})
    item = built["tasks"][0]["items"][0]
    assert errors({"type": "tasks", "items": [{**item, "event": {**item["event"], "detail": {"traceback": "x"}}}]})
    assert errors({**card, "type": "tasks"})
    queues = built["queues"][0]
    assert errors({**queues, "queues": [{**queues["queues"][0], "oldest_queued_seconds": 1.0}]})  # not sent
    assert errors({**queues, "queues": [{**queues["queues"][0], "concurrency": 0}]})
    bulk = built["bulk"][0]
    assert errors({**bulk, "items": [["a", 1]]}) and errors({**bulk, "state": "paused"}) and errors({**bulk, "done": -1})


def test_a_queues_frame_with_held_resources_is_valid_and_a_holder_carries_no_lease():
    transitions.create([TaskSpec(id="m1", title="m", resources=["merge-slot", "file:src/app/**"]),
                        TaskSpec(id="m2", title="m", resources=["merge-slot"]),
                        TaskSpec(id="g1", title="g", resources=[{"name": "gpu", "units": 2}])])
    resources.change_capacity("gpu", 4, actor="op")
    held = transitions.claim("m1", "worker-3", 30)
    transitions.claim("g1", "worker-4", 30)
    # The cards carry what each task declares, as the API gives it (SQLite's JSON text decoded).
    snapshot = json.loads(live_frames.snapshot_frames()[0])
    assert errors(snapshot) == []
    assert {c["id"]: c["resources"] for c in snapshot["tasks"]} == {
        "m1": ["merge-slot", "file:src/app/**"], "m2": ["merge-slot"], "g1": [{"name": "gpu", "units": 2}]}
    text = live_frames.queues_frame(live_frames.queues_message())
    assert held.lease.token not in text
    frame = json.loads(text)
    assert errors(frame) == []
    assert [(r["name"], r["held"]) for r in frame["resources"]] == [
        ("file:src/app/", "exclusive"), ("merge-slot", "exclusive"), ("gpu", 2), ("file:", 0), ("file:src/", 0)]
    assert frame["resources"][1]["holders"] == [{"task": "m1", "agent": "worker-3"}]
    resource = frame["resources"][1]
    holder = resource["holders"][0]
    for extra in ({"lease_token": "x"}, {"fence": 1}, {"expires_at": "2026-01-01T00:00:00Z"}):
        assert errors({**frame, "resources": [{**resource, "holders": [{**holder, **extra}]}]})
    assert errors({**frame, "resources": [{**resource, "held": "some"}]})
    assert SCHEMA["$defs"]["queues"]["properties"]["resources"]["maxItems"] == live_frames.RESOURCES_SHOWN
    assert SCHEMA["$defs"]["held_resource"]["properties"]["holders"]["maxItems"] == live_frames.HOLDERS_SHOWN


def test_cards_carry_what_a_task_requires_and_prefers_as_the_api_gives_it():
    """Capabilities (issue 32, item 3): a card says what its claimer must hold and is preferred
    for (the page's "needs gpu, python"), in the snapshot and in a change, SQLite's JSON text
    decoded; the schema's bounds are the engine's."""
    transitions.create([TaskSpec(id="train", title="t", requires=["python", "gpu"], prefers={"model:opus": 3}),
                        TaskSpec(id="any", title="a", prefers=["fast"])])
    snapshot = json.loads(live_frames.snapshot_frames()[0])
    assert errors(snapshot) == []
    assert {c["id"]: (c["requires"], c["prefers"]) for c in snapshot["tasks"]} == {
        "train": (["gpu", "python"], {"model:opus": 3}), "any": (None, {"fast": 1})}
    changes = json.loads(live_frames.changes_frame(list(TaskEvent.objects.order_by("id"))))
    assert errors(changes) == []
    requires = {i["task"]["id"]: i["task"]["requires"] for i in changes["items"]}
    assert requires == {"train": ["gpu", "python"], "any": None}
    card = snapshot["tasks"][0]
    assert errors({**snapshot, "tasks": [{**card, "prefers": {"gpu": 0}}]})
    assert errors({**snapshot, "tasks": [{**card, "requires": "gpu"}]})
    card_schema = SCHEMA["$defs"]["card"]["properties"]
    assert card_schema["requires"]["maxItems"] == limits.MAX_REQUIRES
    assert card_schema["prefers"]["maxProperties"] == limits.MAX_PREFERS
    assert card_schema["prefers"]["additionalProperties"]["maximum"] == limits.MAX_PREFER_WEIGHT


def test_the_doc_and_the_schema_name_the_consumers_figures():
    for code in (consumers.NOT_ALLOWED, consumers.TOO_SLOW, consumers.INTERNAL_ERROR):
        assert re.search(rf"^\| {code} \|", DOC, flags=re.MULTILINE), f"close code {code} not in the table"
    assert f"{consumers.MAX_CLIENT_MESSAGE_CHARS:,}" in DOC
    assert f"`SNAPSHOT_PART` ({live_frames.SNAPSHOT_PART})" in DOC
    for part in ("snapshot", "snapshot_more"):
        assert SCHEMA["$defs"][part]["properties"]["tasks"]["maxItems"] == live_frames.SNAPSHOT_PART
    assert SCHEMA["$defs"]["queues"]["properties"]["queues"]["maxItems"] == live_frames.QUEUES_SHOWN
    for kind in ("snapshot", "snapshot_more", "tasks", "removed", "problems", "insights", "queues", "bulk"):
        assert f'"type": "{kind}"' in DOC



@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65_535, 65_536, 1_048_576])
def test_a_frame_built_once_for_every_socket_is_the_text_frame_websockets_would_send(size):
    # The server writes these bytes to every socket as they are (server/websocket_protocol.py):
    # they must be what uvicorn's websockets would have framed for each, at every length
    # encoding (7-bit, 16-bit from 126, 64-bit from 65,536).
    from websockets.frames import Frame, Opcode

    text = json.dumps({"type": "tasks", "items": ["x" * max(0, size - 30)]})[:size] if size else ""
    expected = Frame(Opcode.TEXT, text.encode()).serialize(mask=False)
    assert live_frames.text_frame(text) == expected
    # And read by hand (RFC 6455, 5.2), not only by the library that framed it: FIN and the text
    # opcode, no mask bit, the length in 7, 7+16 or 7+64 bits, then the payload as it is.
    framed = live_frames.text_frame(text)
    assert framed[0] == 0x81 and framed[1] & 0x80 == 0
    head = 2 if size < 126 else 4 if size < 65_536 else 10
    length = framed[1] if head == 2 else int.from_bytes(framed[2:head], "big")
    assert length == len(text.encode()) == len(framed) - head and framed[head:] == text.encode()
    non_ascii = "é" * size  # json.dumps writes ASCII, but a frame's length is its bytes'
    assert live_frames.text_frame(non_ascii) == Frame(Opcode.TEXT, non_ascii.encode()).serialize(mask=False)
