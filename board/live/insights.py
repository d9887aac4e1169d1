"""The board's agents and throughput panel: who works on what, and how the last hour went.

`compute()` reads, in a few ORM queries that run on every store (SQLite, PostgreSQL, MongoDB:
no join, no vendor function; they are in board.live.reads), the
history of the last WINDOW_MINUTES minutes and the tasks RUNNING and QUEUED now, and returns:

- `agents`: each agent that holds a task now or acted as a holder in the window (claim, resume,
  renew, complete, fail, pause, release): its name, the tasks it holds, its last heartbeat (its
  latest claim, resume or renew in the window), its completions and failures in the window, and
  the usage it reported in the window (tokens and cost; null when it reported none);
- `throughput`: completions and failures per minute;
- `queue_depth`: the most QUEUED tasks each queue held at any moment of each minute (a queue
  that filled and emptied within one minute shows its peak, not the empty end), reconstructed
  from today's counts: the level at the window's start is today's less every move into QUEUED
  since, plus every move out; the window's moves are then replayed in order. Renews never change
  stage and are not read for this.
- `queued_now`: QUEUED tasks per queue now (the queues of `queue_depth`).
- `timing`: per queue, the waits and runs that ended in the last hour, their count, p50 and p95
  (board.engine.timing, from the same read of the history as the rest: reads.history_window's
  `timing_from`; the MAX_QUEUES queues with the most samples); a process's `Insights` computes
  them again after TIMING_MAX_AGE (15 s), and the computations between read only the window.

Bucket i of each series covers [start + i min, start + (i + 1) min); the last bucket is the
current, partial minute (its depth is today's).

The queries are one read transaction (the store's snapshot): read one after the other, a
claim committed between the history's read and the count's was in the count (one fewer queued)
and not in the history, and the level replayed back to the window's start came out below 0 (a
chart bar of negative height under a churn). From one snapshot the level at the start is
today's count less the moves since: a number of tasks, never below 0. The transaction spans the
reads only, not the work on the rows, and gives way (`give_way`) to a TRUNCATE of the tables
on PostgreSQL instead of deadlocking with it. Names of agents only: nothing here carries a
lease token or a key. The tailer (board.live.tailer) computes it once per server process, at most
every INSIGHTS_MIN_INTERVAL_SECONDS when something changed, and at most INSIGHTS_DUTY of the
time where it is slow, on the process's background thread (board.live.background: a lower CPU
priority, so that it never takes the CPU a page load needs), and pushes it to every socket.

Reading the window: the first computation finds its start by time; the `Insights` object keeps
the id of the oldest event it found in the window, and later computations (the window only moves
forward) read ids from there on, by the primary key; that cursor stays below any id a
transaction still open may have been given (ids come at insert, commits in any order: compute
says how). Each still reads the whole hour: at 120,520 rows in it, 5.0 times a plain driver
read of the same rows (bench/insights.py, 2026-12-06; 7.0 before the moved tasks' queues were
read by their last change and `at` without Django's per-row conversion: reads.queues_of_moved,
reads.history_window).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from board.engine import clock, timing, usage
from board.engine.lifecycle import Stage, Verb
from board.engine.limits import MAX_AGENTS, MAX_HELD_IDS, MAX_QUEUES
from board.engine.stores import store
from board.live import reads
from board.live.reads import json_time

WINDOW_MINUTES = 60
USAGE_FIELDS = ("input_tokens", "output_tokens", "cost_usd", "cost_missing")

# What an agent does as the holder of a task: the actor of these events is the agent's name
# (the reaper's and the operators' events are not an agent's).
HOLDER_VERBS = frozenset({Verb.CLAIM, Verb.RESUME, Verb.RENEW, Verb.COMPLETE, Verb.FAIL, Verb.PAUSE,
                          Verb.RELEASE})


def window_start(now: datetime, minutes: int = WINDOW_MINUTES) -> datetime:
    """The start of the oldest bucket: `minutes` buckets of a minute, the last one holding now."""
    return now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)


@dataclass
class Insights:
    """The per-process state of the computation: where the window's events start, and the last
    `timing` figures with their time (kept TIMING_MAX_AGE: an hour's percentiles need not move
    every 3 s, and reading them was half of a computation's time at 11,000 rows in the hour)."""

    first_id: int = 0
    using: str = "default"
    timed: dict | None = None
    timed_at: datetime | None = None

    def compute(self, now: datetime | None = None) -> dict:
        now = now or clock.now(self.using)
        due = self.timed is None or self.timed_at is None or not timedelta(0) <= now - self.timed_at < TIMING_MAX_AGE
        data, first_id, timed = _compute(now, using=self.using, since_id=self.first_id,
                                         timed=None if due else self.timed)
        if due:
            self.timed, self.timed_at = timed, now
        self.first_id = max(self.first_id, first_id)
        return data


TIMING_MAX_AGE = timedelta(seconds=15)
# Twice the longest a write transaction stays open, as far as the window's cursor cares
# (compute: ids are given at insert, not at commit).
SETTLED_SECONDS = 60


def compute(now: datetime | None = None, *, using: str = "default", since_id: int = 0,
            minutes: int = WINDOW_MINUTES, timed: dict | None = None) -> tuple[dict, int]:
    """The panel's data at `now` (default: the store's clock), and where the next computation
    may start reading: the id of the oldest event of the window, or lower (`since_id` if none).
    `timed`: timing.queue_timings' figures when the caller has them (else computed here, from
    the same read of the history as the rest: reads.history_window's `timing_from`)."""
    data, cursor, _ = _compute(now, using=using, since_id=since_id, minutes=minutes, timed=timed)
    return data, cursor


def _compute(now: datetime | None = None, *, using: str = "default", since_id: int = 0,
             minutes: int = WINDOW_MINUTES, timed: dict | None = None) -> tuple[dict, int, dict]:
    """compute(), and the timing figures it used (all queues'; the panel shows MAX_QUEUES)."""
    now = now or clock.now(using)
    start = window_start(now, minutes)
    # One snapshot for every read: see the module's docstring.
    with store(using).read_transaction(give_way=True):
        timing_from = timing.first_window_id(now, using=using) if timed is None else None
        if timed is None and timing_from is None:
            timed = {}  # no history in the timing window: no wait or run ended in it
        # Every move but renews (the bulk of a busy history), oldest first; with `timing_from`,
        # also the rows the timing figures are computed from (one read for both).
        moves, heartbeats, first_renew, timing_rows = reads.history_window(
            start, since_id=since_id, using=using, timing_from=timing_from)
        held = reads.held_tasks(using=using)
        queued_now = reads.queued_per_queue(using=using)
        # What each agent reported it used in the window (board.engine.usage): two grouped reads.
        used = {group["agent"]: group for group in usage.by_agent_and_queue(start, using=using)["agent"]}
        moved = {task_id for _, task_id, _, from_stage, to_stage, _, _ in moves
                 if (from_stage == Stage.QUEUED) != (to_stage == Stage.QUEUED)}
        if timing_rows is None:
            queue_of = reads.queues_of_moved(sorted(moved), start, using=using)
        else:
            # One read of the queues for both: the tasks that moved in or out of QUEUED and
            # those with a row in the timing window (every task whose wait or run ended in it).
            timing_start = now - timing.WINDOW - timing.SLACK
            queue_of = reads.queues_of_moved(sorted(moved | {row[1] for row in timing_rows}), timing_start,
                                             using=using)
            timed = timing.timings_of(timing.samples_of_rows(
                timing_rows, timing_from, now, using=using, queue_of=queue_of))

    def bucket(at: datetime) -> int | None:
        i = int((at - start).total_seconds() // 60)
        return i if 0 <= i < minutes else None

    completed, failed = [0] * minutes, [0] * minutes
    done: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # agent -> [completed, failed]
    acted: set[str] = set()
    # Each queue's depth changes in history order: (bucket, +1 or -1); bucket `minutes`: after now.
    changes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for _, task_id, verb, from_stage, to_stage, actor, at in moves:
        i = bucket(at)
        if verb == Verb.COMPLETE and i is not None:
            completed[i] += 1
        elif verb == Verb.FAIL and i is not None:
            failed[i] += 1
        if verb in HOLDER_VERBS and _is_agent(actor):
            acted.add(actor)
            if verb == Verb.COMPLETE:
                done[actor][0] += 1
            elif verb == Verb.FAIL:
                done[actor][1] += 1
        delta = (to_stage == Stage.QUEUED) - (from_stage == Stage.QUEUED)
        if delta and task_id in queue_of:
            changes[queue_of[task_id]].append((minutes if i is None else i, delta))
    acted.update(actor for actor in heartbeats if _is_agent(actor))

    depth: dict[str, list[int]] = {}
    queues = sorted(set(queued_now) | set(changes))
    for queue in queues:
        depth[queue] = _peaks(queued_now.get(queue, 0), changes.get(queue, ()), minutes)
    kept_queues = sorted(depth, key=lambda q: (-queued_now.get(q, 0), -max(depth[q]), q))[:MAX_QUEUES]
    depth = {queue: depth[queue] for queue in sorted(kept_queues)}

    holds: dict[str, list[str]] = defaultdict(list)
    for owner, task_id in held:
        holds[owner].append(task_id)
    names = sorted(acted | set(holds))
    if len(names) > MAX_AGENTS:  # the busiest: holding the most, then the most done
        busiest = sorted(names, key=lambda n: (-len(holds.get(n, ())), -sum(done[n]) if n in done else 0, n))
        names = sorted(busiest[:MAX_AGENTS])
    agents = []
    for name in names:
        ids = holds.get(name, [])
        agents.append({
            "name": name,
            "holds": ids[:MAX_HELD_IDS],
            "holding": len(ids),
            "last_heartbeat": json_time(heartbeats.get(name)),
            "completed": done[name][0] if name in done else 0,
            "failed": done[name][1] if name in done else 0,
            # None when it reported nothing in the window: missing, never shown as zero.
            "usage": {key: used[name][key] for key in USAGE_FIELDS} if name in used else None,
        })
    timed_queues = sorted(timed, key=lambda q: (-(timed[q]["wait"]["count"] + timed[q]["run"]["count"]), q))
    first_ids = [moves[0][0]] if moves else []
    if first_renew is not None:
        first_ids.append(first_renew)
    # History ids are given at insert, not at commit: a move still in its transaction may hold a
    # lower id than every one seen, and the next computation must read it. So the cursor passes
    # no id above the last move stamped SETTLED_SECONDS ago (stamped at its transaction's start;
    # a transaction ends within half of that: that move's id was given before any transaction
    # still open began); with no such move, it stays.
    settled = now - timedelta(seconds=SETTLED_SECONDS)
    last_settled = next((row[0] for row in reversed(moves) if row[6] < settled), None)
    cursor = since_id if last_settled is None else max(since_id, min(first_ids + [last_settled + 1]))
    data = {
        "type": "insights",
        "now": json_time(now),
        "start": json_time(start),
        "minutes": minutes,
        "agents": agents,
        "more_agents": len(acted | set(holds)) - len(agents),
        "throughput": {"completed": completed, "failed": failed},
        "queue_depth": depth,
        "queued_now": {queue: queued_now.get(queue, 0) for queue in depth},
        "more_queues": len(queues) - len(depth),
        "timing": {queue: timed[queue] for queue in sorted(timed_queues[:MAX_QUEUES])},
    }
    return data, cursor, timed


def _is_agent(actor: str) -> bool:
    # "system" (retries, admissions, takeovers) and "system:reaper" act for the store.
    return bool(actor) and actor != "system" and not actor.startswith("system:")


def _peaks(now: int, changes, minutes: int) -> list[int]:
    """Each minute's most, from the depth `now` and the (bucket, +1/-1) changes in history order
    (bucket `minutes`: stamped after now), both from one snapshot: the level at the window's
    start is then the number of tasks queued at that moment, never below 0 (no clamp here: a
    negative level would be a move written without its history row, a bug to see)."""
    level = now - sum(delta for _, delta in changes)  # at the window's start
    changes = sorted(changes, key=lambda change: change[0])  # stable: history order within a minute
    series = [0] * minutes
    at = 0
    for i in range(minutes):
        peak = level
        while at < len(changes) and changes[at][0] == i:
            level += changes[at][1]
            peak = max(peak, level)
            at += 1
        series[i] = peak
    return series
