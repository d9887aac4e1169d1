"""On SQLite the threads of one process run write verbs one at a time, whole verbs and not only
their transactions (the SQLite store's verb_gate, board.engine.stores.sqlite): a verb's Python around its
transaction would otherwise compete for the GIL with the thread holding the write lock."""
from __future__ import annotations

import sys
import threading

from django.db import connections

from contextlib import nullcontext

from board.engine import outcomes, stores, transitions
from board.engine.stores import base
from board.engine.transitions import TaskSpec
from board.models import TaskEvent
from tests.live_server import wait_until
from tests.support import sqlite_db_mark

pytestmark = sqlite_db_mark()
WAIT = 30


def waiting_at_the_gate(thread: threading.Thread) -> bool:
    """Whether `thread` is blocked entering a verb: its innermost Python frame is the verb
    wrapper's `with the_store.verb_gate()` (the lock's acquire is C, below it)."""
    frame = sys._current_frames().get(thread.ident)
    return (frame is not None and frame.f_code.co_name == "run"
            and frame.f_code.co_filename == stores.__file__ and "verb_gate" in _line(frame))


def _line(frame) -> str:
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def test_a_second_verb_waits_for_the_first_to_end_not_only_its_transaction():
    transitions.create([TaskSpec(id="a", title="a"), TaskSpec(id="b", title="b")])
    inside, release = threading.Event(), threading.Event()

    def hold_the_first_claim(verb, outcome, code, count):
        # Runs after the first claim's commit, still inside its verb: the gate is held.
        if verb == "claim" and outcome == outcomes.WON and not inside.is_set():
            inside.set()
            assert release.wait(timeout=WAIT)

    outcomes.subscribe(hold_the_first_claim)
    results: dict[str, object] = {}

    def claim(name):
        try:
            results[name] = transitions.claim_next(name, 60)
        finally:
            connections.close_all()

    first = threading.Thread(target=claim, args=("first",))
    second = threading.Thread(target=claim, args=("second",))
    try:
        first.start()
        assert inside.wait(timeout=WAIT)
        second.start()
        wait_until(lambda: waiting_at_the_gate(second), WAIT, "the second claim waits at the gate")
        # The first claim committed; the second has written nothing while the first's verb runs.
        assert list(TaskEvent.objects.filter(verb="claim").values_list("actor", flat=True)) == ["first"]
    finally:
        release.set()
        first.join(timeout=WAIT)
        second.join(timeout=WAIT)
        outcomes._observers.remove(hold_the_first_claim)
    assert {results["first"].task.id, results["second"].task.id} == {"a", "b"}


def test_inside_a_callers_transaction_the_verb_takes_no_gate_of_its_own():
    """As write_transaction: inside a transaction the caller opened, the caller's order holds
    (taking the gate there could wait on a thread that waits on the caller's write lock)."""
    transitions.create([TaskSpec(id="c", title="c")])
    with stores.store().write_transaction():
        assert isinstance(stores.store().verb_gate(), nullcontext)
        assert transitions.claim_next("agent", 60) is not None


def test_outside_a_transaction_the_gate_is_the_writer_lock():
    assert stores.store().verb_gate() is base.process_lock("default")
