"""The live board reads only what its cards show (issue 27, item 15): the tailer's read of the
tasks behind a page of events, and the snapshot's, select the card columns
(board.live.reads.CARD_COLUMNS), never a task's payload, checkpoint, result or description
(up to 256 KiB each: the reaper reclaiming 500 leases with big checkpoints used to load hundreds
of MB into every server process), and the cards are the same as those built from the whole row."""
from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from board.engine import clock, selectors, transitions
from board.engine.transitions import TaskSpec
from board.live import frames, reads
from board.models import Task
from board.public import FORMER_NAMES, public_task
from tests.live_server import sessions_server, wait_until  # noqa: F401  (sessions_server: a fixture)
from tests.support import sql_stores
from tests.test_live_board import WAIT, BoardSocket, staff_session
from tests.test_outbox import cursor_at_the_end, read

BULKY = ("description", "payload", "checkpoint", "result")
BIG = 256 * 1024 - 64  # a checkpoint just under the engine's limit (MAX_JSON_FIELD_BYTES)
TASKS = 50


def reclaimed_with_big_checkpoints(prefix: str, alias: str) -> list[str]:
    """TASKS running tasks, each with a checkpoint of BIG bytes saved by a renew and a big
    payload, description; their leases aged by writing the row, then taken back by the reaper's
    verb. Returns their ids."""
    ids = [f"{prefix}-{n}" for n in range(TASKS)]
    transitions.create([TaskSpec(id=i, title=f"big {i}", description="d" * 65536, payload={"p": "p" * BIG})
                        for i in ids], using=alias)
    for task_id in ids:
        claim = transitions.claim(task_id, "agent", 60, using=alias)
        transitions.renew(task_id, claim.lease.token, 60, checkpoint={"c": "c" * BIG}, using=alias)
    now = clock.now(using=alias)
    Task.objects.using(alias).filter(pk__in=ids).update(lease_expires_at=now - timedelta(seconds=1))
    moved = transitions.reclaim_expired(now=now, task_ids=ids, using=alias)
    assert len(moved) == TASKS
    return ids


def selected_columns(sql: str) -> str:
    """The select list of a query on the tasks table ('' for any other query)."""
    found = re.match(r'\s*SELECT (.*?) FROM "board_task"', sql, re.S)
    return found.group(1) if found else ""


def expected_card(task: Task, deps: list[str]) -> dict:
    """The card as the page always received it: the public task without its bulky fields (nor
    the API's former names), built from the whole row, and the cursor of its column's page after it."""
    card = public_task(task, deps)
    for name in (*BULKY, *FORMER_NAMES, *reads.NOT_LIVE):
        del card[name]
    card["page_cursor"] = reads.page_cursor(task)  # where its column's next page starts after it
    return json.loads(frames.encode({"card": card}))["card"]


@pytest.mark.parametrize("alias", sql_stores())
def test_the_changes_read_selects_the_card_columns_only(alias):
    cursor = cursor_at_the_end(alias)
    ids = reclaimed_with_big_checkpoints("reads", alias)
    events = read(cursor)
    with CaptureQueriesContext(connections[alias]) as queries:
        items = frames.changes_for(events, using=alias)
    task_reads = [selected_columns(q["sql"]) for q in queries.captured_queries if selected_columns(q["sql"])]
    assert task_reads, "the changes read no task row"
    for columns in task_reads:
        for bulky in BULKY:
            assert f'"{bulky}"' not in columns, f"the tailer's read selects {bulky}: {columns}"
    # Same cards as from the whole rows, one per event.
    whole = {t.pk: t for t in Task.objects.using(alias).filter(pk__in=ids)}
    deps = selectors.deps_of(ids, using=alias)
    assert len(items) == len(events)
    for item in items:
        task_id = item["task"]["id"]
        assert json.loads(frames.encode(item["task"])) == expected_card(whole[task_id], deps[task_id])


@pytest.mark.parametrize("alias", sql_stores())
def test_the_snapshot_read_selects_the_card_columns_only(alias):
    reclaimed_with_big_checkpoints("snap", alias)
    with CaptureQueriesContext(connections[alias]) as queries:
        sent = frames.snapshot_frames(problems=[], using=alias)
    task_reads = [selected_columns(q["sql"]) for q in queries.captured_queries if selected_columns(q["sql"])]
    assert task_reads
    for columns in task_reads:
        for bulky in BULKY:
            assert f'"{bulky}"' not in columns, f"the snapshot's read selects {bulky}: {columns}"
    # 50 tasks of three 256 KiB fields each (38 MiB): the cards carry none of them.
    assert sum(len(f) for f in sent) < 200 * 1024


def test_a_card_is_the_public_task_without_exactly_the_fields_cards_do_not_read():
    """Frames and the live board's reads share one list (reads.CARD_COLUMNS / NOT_ON_CARDS): every
    public field of a task is either read for the card or named as left out (the API's former
    names too: the page reads the new ones)."""
    fields = set(public_task(Task(id="x", title="x"), [])) - set(FORMER_NAMES)
    read_for_cards = {"error" if c == "last_error" else c for c in reads.CARD_COLUMNS} | {"deps"}
    assert fields == read_for_cards | set(reads.NOT_ON_CARDS) | set(reads.NOT_LIVE)
    assert not read_for_cards & set(reads.NOT_ON_CARDS)




class CardSocket(BoardSocket):
    """A board socket that also keeps the newest card of each task it was sent in a change."""

    def __init__(self, *args, **kwargs):
        self.cards: dict[str, dict] = {}
        super().__init__(*args, **kwargs)

    def _apply(self, task: dict) -> None:
        super()._apply(task)
        if task["version"] >= self.cards.get(task["id"], {}).get("version", -1):
            self.cards[task["id"]] = task


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_fifty_reclaimed_tasks_with_big_checkpoints_reach_a_real_socket_as_the_same_cards(sessions_server):
    _, key = staff_session("default")
    socket = CardSocket(sessions_server, key)
    try:
        wait_until(lambda: socket.snapshots, WAIT, "the snapshot arrived")
        ids = reclaimed_with_big_checkpoints("e2e", "default")
        whole = {t.pk: t for t in Task.objects.filter(pk__in=ids)}
        wait_until(lambda: all(socket.versions.get(i) == whole[i].version for i in ids), WAIT,
                   "every reclaim reached the socket")
        deps = selectors.deps_of(ids)
        for task_id in ids:
            assert socket.cards[task_id] == expected_card(whole[task_id], deps[task_id])
    finally:
        socket.close()
