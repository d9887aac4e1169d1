"""The tailer (board.live.tailer): what it hands to sockets and parked claims, and that a pass
that fails delivers the same events on the next one."""
import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.live import frames, tailer
from tests.test_outbox import BACKENDS, cursor_at_the_end, read


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_parked_claims_are_woken_once_per_move_to_queued_of_a_task_still_queued(alias):
    from board.live.parked import newly_ready

    cursor = cursor_at_the_end(alias)
    transitions.create([TaskSpec(id="a1", title="a", queue="alpha"), TaskSpec(id="a2", title="a", queue="alpha"),
                        TaskSpec(id="b1", title="b", queue="beta"),
                        TaskSpec(id="held", title="h", queue="beta", on_hold=True)])
    taken = transitions.claim("a2", "agent", 60)
    transitions.release("a2", taken.lease.token)  # back to QUEUED: a second event for a2
    transitions.claim("b1", "agent", 60)  # no longer ready when the tailer reads
    events = read(cursor)
    # a1 (create), a2 (create, release: both QUEUED events while it is QUEUED), b1 claimed since
    assert newly_ready(events) == {"alpha": 3}
    assert newly_ready([e for e in events if e.to_stage != "QUEUED"]) == {}


class Socket:
    """Stands in for a websocket: what is under test is what the tailer hands out."""

    def __init__(self):
        self.frames: asyncio.Queue = asyncio.Queue()

    async def deliver(self, frame, wire=None):
        await self.frames.put(json.loads(frame))


def tailer_scenario(work, expect_tasks: int, timeout: float = 30):
    """Run this process's tailer with one socket, do `work` (committed, in a thread), and return
    the task ids of the changes the socket received until it has `expect_tasks` of them."""

    async def scenario():
        running = tailer.ensure_tailer()
        socket = Socket()
        running.subscribers.add(socket)
        try:
            await asyncio.wait_for(running.ready.wait(), timeout=timeout)
            await sync_to_async(work)()
            seen: list[str] = []
            while len(seen) < expect_tasks:
                frame = await asyncio.wait_for(socket.frames.get(), timeout=timeout)
                if frame["type"] == "tasks":
                    seen += [item["event"]["task"] for item in frame["items"]]
            return seen
        finally:
            running.task.cancel()

    return asyncio.run(scenario())


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_a_pass_that_fails_while_building_its_frame_is_read_again_not_lost(alias, monkeypatch):
    real, failures = frames.changes_for, []

    def fails_once(batch):
        if not failures:
            failures.append([e.task_id for e in batch])
            raise DatabaseError("the connection dropped while the frame was built")
        return real(batch)

    monkeypatch.setattr(frames, "changes_for", fails_once)
    work = lambda: transitions.create([TaskSpec(id=f"f{i}", title="f") for i in range(3)])
    seen = tailer_scenario(work, 3)
    assert failures == [["f0", "f1", "f2"]]  # the first attempt failed...
    assert seen == ["f0", "f1", "f2"]  # ...and the same events were delivered by the next pass


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_with_only_parked_claims_listening_passes_are_a_poll_apart_however_often_commits_ring(alias, monkeypatch):
    """No socket: the tailer serves parked claims only, and passes at most every
    WAITERS_ONLY_PASS_SECONDS while this process commits (each commit rings it) as fast as it can."""
    passes: list[float] = []
    real_pass = tailer.Tailer._pass

    async def counted(self, cursor):
        passes.append(time.monotonic())
        return await real_pass(self, cursor)

    monkeypatch.setattr(tailer.Tailer, "_pass", counted)

    def commit_for(seconds: float) -> int:
        n, until = 0, time.monotonic() + seconds
        while time.monotonic() < until:
            transitions.create(TaskSpec(title="ring"))
            n += 1
        return n

    async def scenario():
        running = tailer.ensure_tailer()
        assert not running.subscribers
        try:
            await asyncio.wait_for(running.ready.wait(), timeout=30)
            started = time.monotonic()
            # A thread of its own: the tailer's reads run in asgiref's one sync thread.
            commits = await asyncio.to_thread(commit_for, 1.0)
            return commits, time.monotonic() - started
        finally:
            running.task.cancel()

    commits, elapsed = asyncio.run(scenario())
    assert commits >= 20  # the commits rang far more often than the passes ran
    during = [t for t in passes if t <= passes[0] + elapsed]
    assert len(during) <= elapsed / tailer.WAITERS_ONLY_PASS_SECONDS + 2, (len(during), elapsed, commits)


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_deleted_tasks_reach_the_sockets_even_after_a_read_of_them_failed(alias, monkeypatch, caplog):
    """The prune's records of deleted tasks go out as a "removed" frame; a read of them that
    fails is logged, leaves the rest of the pass alone, and the next read delivers them."""
    from board.engine import retention
    from board.live import outbox
    from tests.test_prune import LONG_AGO, age_tasks, run_task

    real, failures = outbox.Removals.read, []

    def fails_once(self):
        if not failures:
            failures.append(self.last_id)
            raise DatabaseError("the connection dropped while reading the records")
        return real(self)

    monkeypatch.setattr(outbox.Removals, "read", fails_once)
    for task_id in ("old-a", "old-b"):
        run_task(task_id, alias)
    age_tasks(["old-a", "old-b"], LONG_AGO, alias)

    async def scenario():
        running = tailer.ensure_tailer()
        socket = Socket()
        running.subscribers.add(socket)
        try:
            await asyncio.wait_for(running.ready.wait(), timeout=30)
            await sync_to_async(retention.prune)(using=alias)
            await sync_to_async(transitions.create)(TaskSpec(id="after", title="after the prune"))
            kinds = []
            while True:
                frame = await asyncio.wait_for(socket.frames.get(), timeout=30)
                kinds.append(frame["type"])
                if frame["type"] == "removed":
                    return frame, kinds
        finally:
            running.task.cancel()

    frame, kinds = asyncio.run(scenario())
    assert failures  # a read failed first...
    assert sorted((r["task"], r["stage"]) for r in frame["tasks"]) == [("old-a", "COMPLETED"), ("old-b", "COMPLETED")]
    assert "tasks" in kinds[:-1]  # ...and the pass went on: the change after the prune came first
    said = [r.getMessage() for r in caplog.records if r.name == "board.live.tailer"]
    assert said == ["could not read the records of deleted tasks; retrying"]  # not a failed pass


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_a_socket_waits_for_the_tailers_cursors_and_is_told_when_they_never_come(alias, monkeypatch):
    """A socket reads its snapshot only once its tailer's cursors are placed (wait_placed); a
    tailer that fails as it starts makes wait_placed raise instead of hanging (the socket then
    closes and the page reconnects)."""
    from board.live import outbox

    async def placed():
        running = tailer.ensure_tailer()
        try:
            await asyncio.wait_for(running.wait_placed(), timeout=30)
            return running.removals is not None
        finally:
            running.task.cancel()

    assert asyncio.run(placed())

    def unreachable(using="default"):
        raise DatabaseError("the database is away")

    monkeypatch.setattr(outbox, "starting_cursor", unreachable)

    async def never():
        running = tailer.ensure_tailer()
        with pytest.raises(RuntimeError, match="before its cursors were placed"):
            await asyncio.wait_for(running.wait_placed(), timeout=30)
        assert running.task.done()

    asyncio.run(never())


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_a_parked_claim_is_woken_by_the_tailers_poll_when_no_event_announces_the_work(alias):
    """board.live.parked: ready work that no event announced after the tailer started (as a
    retry backoff ending) wakes a claim parked on its queue within about parked.POLL_SECONDS;
    a claim parked on an empty queue is not woken."""
    from board.live import parked

    transitions.create(TaskSpec(id="quiet", title="q", queue="poll-alpha"))  # before the cursor

    async def scenario():
        running = tailer.ensure_tailer()
        try:
            await asyncio.wait_for(running.ready.wait(), timeout=30)
            waiters = parked.waiters()
            started = time.monotonic()
            woken, idle = await asyncio.gather(waiters.wait("poll-alpha", 10), waiters.wait("poll-empty", 3))
            return woken, idle, time.monotonic() - started
        finally:
            running.task.cancel()

    woken, idle, took = asyncio.run(scenario())
    assert (woken, idle) == (True, False)
    assert took < 10


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_the_poll_wakes_a_parked_claim_for_work_its_capabilities_can_take_and_only_then(alias):
    """Waiters are kept by their claim's capabilities (board.engine.capabilities): ready work
    requiring gpu that no event announced wakes a claim parked with gpu, never one parked without
    it (which would only find nothing and park again, every poll)."""
    from board.live import parked

    transitions.create(TaskSpec(id="needs-gpu", title="g", queue="poll-gpu", requires=["gpu"]))

    async def scenario():
        running = tailer.ensure_tailer()
        try:
            await asyncio.wait_for(running.ready.wait(), timeout=30)
            waiters = parked.waiters()
            return await asyncio.gather(waiters.wait("poll-gpu", 10, ("gpu",)), waiters.wait("poll-gpu", 3),
                                        waiters.wait(parked.ANY_QUEUE, 3, ("python",)))
        finally:
            running.task.cancel()

    assert asyncio.run(scenario()) == [True, False, False]


@pytest.mark.parametrize("alias", [BACKENDS[0]])
def test_changes_made_while_no_socket_watched_are_in_the_next_sockets_insights(alias, monkeypatch):
    """The panel's figures were marked stale only by a pass that had sockets to feed: work done
    while nobody watched left the last frame cached, and the next socket got that old frame
    until the refresh timer (30 s) ran. Here the timer is an hour: the new figures come from the
    changes alone."""
    monkeypatch.setattr(tailer, "INSIGHTS_REFRESH_SECONDS", 3600.0)
    monkeypatch.setattr(tailer, "INSIGHTS_MIN_INTERVAL_SECONDS", 0.0)
    passes: list[int] = []
    real_pass = tailer.Tailer._pass

    async def counted(self, cursor):
        result = await real_pass(self, cursor)
        passes.append(len(self.subscribers))
        return result

    monkeypatch.setattr(tailer.Tailer, "_pass", counted)

    async def next_insights(socket, timeout=10):
        while True:
            frame = await asyncio.wait_for(socket.frames.get(), timeout=timeout)
            if frame["type"] == "insights":
                return frame

    async def scenario():
        running = tailer.ensure_tailer()
        try:
            await asyncio.wait_for(running.ready.wait(), timeout=30)
            first = Socket()
            running.subscribers.add(first)
            running.want_insights()
            assert (await next_insights(first))["queued_now"] == {}
            running.subscribers.discard(first)
            await sync_to_async(transitions.create)([TaskSpec(id=f"q{i}", title="q", queue="quiet") for i in range(3)])
            seen = len(passes)
            while len(passes) < seen + 2 or passes[-1]:  # two passes with nobody watching
                running.wake.set()
                await asyncio.sleep(0.05)
            second = Socket()
            running.subscribers.add(second)  # the cached frame is not None: no want_insights()
            running.wake.set()
            return await next_insights(second)
        finally:
            running.task.cancel()

    assert asyncio.run(scenario())["queued_now"] == {"quiet": 3}
