"""Every frame the board's websocket sends, built here and only here, from board.public.

Each frame is a JSON text encoded once (`encode`) and handed as the same text to every socket:
`snapshot_frames` (a snapshot in parts), `changes_frame` ("tasks"), `removals_frame`
("removed"), `problems_frame`, `insights_frame`, `queues_frame`. Tasks appear as cards (`card_task`: the public
task without its bulky fields, never a lease token); datetimes as the API writes them. The frames,
field by field, and how the page applies them: docs/live-protocol.md (and its JSON Schema,
docs/live-protocol.schema.json, which tests/test_live_protocol.py checks these frames against).
"""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from websockets.frames import Frame, Opcode

from board.engine import resources, selectors
from board.live import reads
from board.models import RemovedTask, Task, TaskEvent
from board.public import FORMER_NAMES, public_event, public_task

# Tasks per snapshot frame: frames stay well under 1 MiB (daphne's limit, and a common proxy
# limit), and small, because a socket that stops reading keeps the frame it was being sent in the
# server's write buffer (with 300-character titles 250 cards are ~170 KiB; 1000 made 40 such
# sockets cost 28 MB more: docs/live-protocol.md, "Backpressure").
SNAPSHOT_PART = 250


def encode(frame: dict) -> str:
    """A frame as the text every socket is sent (datetimes as the API writes them)."""
    return json.dumps(frame, cls=DjangoJSONEncoder)


# The ASGI scope extension by which the board's server (server/websocket_protocol.py) takes a
# frame's websocket bytes, built once for every socket by `text_frame`, and writes them as they are.
SEND_FRAME = "taskflow.send_frame"


def text_frame(text: str) -> bytes:
    """A whole, final, unmasked websocket text frame (RFC 6455, 5.2) holding `text`: what a
    server sends, the same bytes for every socket (no extension such as compression is used).
    Framed by the websockets library, as uvicorn's own send frames it."""
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=False)


def card_task(task: Task, deps: list[str]) -> dict:
    """What a card shows: the public task without its bulky fields (reads.NOT_ON_CARDS:
    description, payload, checkpoint, result), which the details panel fetches from the API when
    opened. `task` is a Task or any object with its card fields (`card_of_row`)."""
    card = public_task(task, deps)
    for bulky_or_former in (*reads.NOT_ON_CARDS, *FORMER_NAMES, *reads.NOT_LIVE):
        del card[bulky_or_former]
    # Where its column's next page starts if the page lets go of the cards past this one.
    card["page_cursor"] = getattr(task, "page_cursor", None) or reads.page_cursor(task)
    return card


def card_of_row(row: dict, deps: list[str]) -> dict:
    """The card of a row the live board's reads return (a dict of reads.CARD_COLUMNS, no
    bulky field read): the same card as `card_task` makes of the whole Task, and for a
    COMPLETED task the figures of the run that completed it (`last_run`: ran_by, run_seconds,
    wait_seconds; board.engine.timing.last_runs) when the row carries them."""
    card = card_task(SimpleNamespace(**row, **_NOT_ON_CARDS), deps)
    if row.get("last_run"):
        card.update(row["last_run"])
    return card


def card_of_listed(task, deps: list[str], last_run: dict | None = None) -> dict:
    """The card of a task read with reads.CARD_COLUMNS only (board.engine.listing's `columns`),
    with its `last_run` when given (card_of_row)."""
    return card_of_row({**{name: getattr(task, name) for name in reads.CARD_COLUMNS}, "last_run": last_run,
                        "page_cursor": reads.page_cursor(task)}, deps)


def live_event(event: TaskEvent) -> dict:
    """The public event without a failure's traceback (up to 64 KiB each, and a frame carries
    up to a page of the outbox, board.live.outbox.EVENTS_PER_READ events): the details panel
    reads it from the API's history."""
    data = public_event(event)
    detail = data["detail"]
    if isinstance(detail, dict) and "traceback" in detail:
        data["detail"] = {**{k: v for k, v in detail.items() if k != "traceback"}, "has_traceback": True}
    return data


def changes_for(events: list[TaskEvent], using: str = "default") -> list[dict]:
    """One item per event, in commit-read order, each carrying the task as it is now (its
    version is at least the event's): the browser applies a task only when its version is newer
    than what it shows, and counts every event's move (from_stage -> to_stage) once: its
    columns' counts are the snapshot's plus the moves after it. An event of a task no longer
    there (deleted since) carries `"task": null`: its move still counts."""
    if not events:
        return []
    # Card columns only (reads.live_tasks): never the checkpoints the details panel reads.
    tasks = reads.live_tasks(list({e.task_id for e in events}), using=using)
    return [{"event": live_event(e), "task": card_of_row(*tasks[e.task_id]) if e.task_id in tasks else None}
            for e in events]


def changes_frame(events: list[TaskEvent]) -> str | None:
    """The "tasks" frame of a page of events, or None when there is none."""
    changes = changes_for(events)
    return encode({"type": "tasks", "items": changes}) if changes else None


def removals_frame(records: list[RemovedTask]) -> str:
    """The "removed" frame of records of deleted tasks (board.live.outbox.Removals)."""
    return encode({"type": "removed", "tasks": [{"id": r.id, "task": r.task_id, "stage": r.stage} for r in records]})


def problem_dicts(using: str = "default") -> list[dict]:
    return [{"task": p.task, "code": p.code, "text": p.text} for p in selectors.problems(using=using)]


def problems_message() -> dict:
    """The problems panel's content now (check() of the store), as the "problems" frame holds it."""
    return {"type": "problems", "problems": problem_dicts()}


def problems_frame(message: dict) -> str:
    return encode(message)


# Queues the strip shows at most (paused ones first): a frame of bounded size however many queues
# tasks name; the API's GET /api/queues lists them all.
QUEUES_SHOWN = 50
_LIVE_STAGES = ("PENDING", "QUEUED", "RUNNING", "PAUSED")


def queue_items(using: str = "default") -> tuple[list[dict], int]:
    """The queues strip's rows (selectors.queue_overview, one consistent read) and how many more
    queues were left out. A queue is shown when it is paused, has a limit or a rate, or has unfinished
    tasks; a queue whose tasks all finished and that nobody set is not news. Only what changes
    when something happens is sent (no "oldest queued for n seconds", which changes every second:
    a frame is pushed only when its content changed)."""
    shown = []
    for queue in selectors.queue_overview(live_only=True, using=using):
        depth = queue["depth"]
        if not (queue["paused"] or queue["concurrency"] is not None or queue["rate"] is not None
                or queue["budget"] is not None or any(depth[s] for s in _LIVE_STAGES)):
            continue
        shown.append({**{k: queue[k] for k in ("name", "concurrency", "running", "paused", "paused_by",
                                               "paused_reason", "paused_at", "rate", "budget", "spent",
                                               "budget_exhausted", "budget_exhausted_until")},
                      "queued": depth["QUEUED"], "next_claim_at": _next_claim_shown(queue)})
    shown.sort(key=lambda q: (not q["paused"], q["name"]))
    return shown[:QUEUES_SHOWN], max(0, len(shown) - QUEUES_SHOWN)


# A rated queue's next claim time is sent only when its claims are at least this far apart: it
# moves with every claim, so a frame per claim is then at most one per 10 s per queue, and the
# time is one a person can act on. A faster rate (60/min: a claim a second) would push a frame
# per claim for as long as work waits, to show a time that is past before it is read; its
# cards say the rate, not a time (docs/live-protocol.md).
RATE_TIME_SHOWN_SECONDS = 10


def _next_claim_shown(queue: dict):
    """A queue's (or a rate key's) next claim time, when its rate's claims are slow enough."""
    rate = queue["rate"]
    if rate is None or rate["per_seconds"] / rate["count"] < RATE_TIME_SHOWN_SECONDS:
        return None
    return queue["next_claim_at"]


# Concurrency keys the frame carries at most (the full ones first): bounded as the queues are.
KEYS_SHOWN = 50
# Resources the frame carries at most (the full ones first, board.engine.resources.overview), and
# holders shown per resource (a shared one may have thousands): bounded as the keys are.
RESOURCES_SHOWN = 50
HOLDERS_SHOWN = 5


def queues_message(using: str = "default") -> dict:
    """The queues strip's content now, as the "queues" frame holds it (datetimes still objects:
    `queues_frame` encodes): the queues, and the concurrency keys RUNNING tasks name (their
    QUEUED cards say when a key is at its limit), and the rate keys with a rate (their QUEUED
    cards say when a slow one lets the next claim start), and the resources RUNNING tasks hold
    (their QUEUED cards say which one they wait for and who holds it; a holder is a task and its
    agent, never a lease token), and the fairness keys with a budget (their QUEUED cards say when
    it is spent)."""
    queues, more = queue_items(using)
    keys, more_keys = selectors.key_overview(KEYS_SHOWN, using=using)
    rate_keys, more_rate_keys = selectors.rate_key_overview(KEYS_SHOWN, using=using)
    rate_keys = [{**key, "next_claim_at": _next_claim_shown(key)} for key in rate_keys]
    held, more_held = resources.overview(RESOURCES_SHOWN, HOLDERS_SHOWN, using=using)
    fairness_keys, more_fairness_keys = selectors.fairness_key_overview(KEYS_SHOWN, using=using)
    return {"type": "queues", "queues": queues, "more_queues": more, "keys": keys, "more_keys": more_keys,
            "rate_keys": rate_keys, "more_rate_keys": more_rate_keys, "resources": held,
            "more_resources": more_held, "fairness_keys": fairness_keys, "more_fairness_keys": more_fairness_keys}


def queues_frame(message: dict) -> str:
    return encode(message)


def bulk_frame(job) -> str:
    """A bulk job's progress (board.bulk.jobs: a BulkJob read without its items)."""
    return encode({"type": "bulk", **{k: getattr(job, k) for k in BULK_FIELDS}, "id": job.pk})


BULK_FIELDS = ("action", "actor", "state", "total", "done", "skipped", "lost", "skipped_reasons", "problems")


def insights_frame(data: dict) -> str:
    """The agents and throughput panel (board.live.insights.compute's data, typed "insights")."""
    return encode(data)


# snapshot_frames' `problems` when the caller has no check() result of its own: computed in the
# board's read.
CHECK_HERE: Any = object()


def snapshot_frames(problems: list | None = CHECK_HERE, using: str = "default") -> list[str]:
    """What a browser needs to draw the board: every column's count and first page of cards
    (reads.COLUMN_PAGE, in the column's order) with the cursor of its next page (`next_pages`,
    null when the page is the whole column; the page asks GET /board/filter?stage=&cursor= for
    more as the user scrolls), plus the event id it is current to, the ids below it that it does
    not hold yet (`unseen_event_ids`) and the last record of a deleted task it accounts for
    (`last_removal_id`), as encoded frames: {"type": "snapshot", ..., "more": bool} then
    {"type": "snapshot_more", "tasks", "more"} until "more" is false. Its size does not grow
    with the board (docs/live-protocol.md, "A bounded snapshot"). `problems`: a recent check()
    result to reuse, None for "not checked yet" (the tailer's first result follows as a problems
    frame), or CHECK_HERE.

    Read by reads.board_parts (one read that takes no write lock). A frame is encoded once the
    next part is read (its "more" depends on it)."""
    parts = reads.board_parts(part_size=SNAPSHOT_PART, using=using)
    head = next(parts)
    # The head says, from inside the board's read, the ids at or below last_event_id that this
    # read does not see. Every other event up to last_event_id is in the snapshot (its counts
    # and its cards), so the page counts and applies only the changes after it; a change of one
    # of these ids committed after the read, and the page applies it (board.live.outbox:
    # PostgreSQL). last_removal_id: the deletions this read already shows.
    if problems is CHECK_HERE:
        problems = problem_dicts(using)  # inside the board's read: the problems of the same board
    frames: list[str] = []
    frame = {"type": "snapshot", "last_event_id": head["last_event_id"], "unseen_event_ids": head["unseen_event_ids"],
             "last_removal_id": head["last_removal_id"], "counts": head["counts"], "next_pages": head["next_pages"],
             "tasks": [], "problems": problems}
    for part in parts:
        if frame["tasks"]:
            frames.append(encode({**frame, "more": True}))
            frame = {"type": "snapshot_more", "tasks": []}
        frame["tasks"] = [card_of_row(row, deps) for row, deps in part]
    frames.append(encode({**frame, "more": False}))
    return frames


# card_task drops these; rows read for cards (reads.CARD_COLUMNS) do not carry them.
_NOT_ON_CARDS = dict.fromkeys((*reads.NOT_ON_CARDS, *reads.NOT_LIVE))
