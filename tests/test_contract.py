"""The board's contract, written once and run on every backend (the fsspec pattern).

`BoardContract` holds the tests; each backend opts in with a three-line subclass at the bottom
naming its database alias, once per engine path: the hand-written statements of the SQL stores (board.engine.stores)
(HOT_PATH "auto", what SQLite and PostgreSQL run) and the ORM path (HOT_PATH "orm", what any
other backend runs). All races use real threads with their own connections, released
together by a barrier, over hundreds of rounds, and assert exact counts. Leases are aged by
writing the row, never by sleeping. After every test, check() must find no problem.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from board import agent_keys
from board.engine import (
    approvals,
    capabilities,
    contract,
    invariants,
    errors,
    flow,
    handoffs,
    resources,
    search,
    selectors,
    stores,
    transitions,
    usage,
)
from board.engine.contract import DjangoBoard
from board.engine.lifecycle import Stage
from board.engine.transitions import TaskSpec
from board.engine.limits import MAX_NOTES_PER_TASK
from board.models import (
    AgentKey,
    Approval,
    ConcurrencyKey,
    FairnessKey,
    FairnessKeyChange,
    Queue,
    QueueChange,
    QueueShard,
    RateKey,
    RateKeyChange,
    Resource,
    Task,
    TaskEvent,
    TaskNote,
)
from tests import process_racer
from tests.support import (
    database_url,
    db_state,
    end_backoff,
    expire_lease,
    postgres_db_mark,
    queue_shards,
    race,
    rename_table,
    row,
    sqlite_db_mark,
    task_columns,
)

ROUNDS = 200
RACERS = 16
TTL = 60
OBSERVER_PAUSES = 4  # FlowObserver: after a read, a pause of this many times the read's length


class FlowObserver:
    """A thread reading a check() of the race's rule (by default the limits') all through a race, in
    one consistent read each time, paced (stop.wait) so as not to starve the racers of the GIL.
    `seen` counts its reads and gathers what it found; a fault of its own is one of them."""

    def __init__(self, alias: str, read=None):
        self.alias, self.seen = alias, {"reads": 0, "problems": []}
        # What it reads: the limits' problems, or `read()`: a race reads its own rule's check (one
        # or two queries, where all the flow checks are a dozen), so that the observer, a thread
        # of the racers' process, does not take their CPU (the races ran ~20% longer with it).
        self._read = read or (lambda: selectors.limit_problems(using=alias))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._observe)

    def __enter__(self) -> dict:
        self._thread.start()
        return self.seen

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def _observe(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                with stores.store(self.alias).read_transaction():
                    self.seen["problems"] += self._read()
                self.seen["reads"] += 1
                # Paced, never a condition: a read every 20 ms still reads each round a few
                # times (a round takes 40 ms or more); every 5 ms, the reads took the racers' CPU
                # (MongoDB's rate race: 72 s, now 42 s; SQLite's plans race: 33 s, now 16 s).
                # A read that takes longer (a board that grew, SecantusDB's one Python process)
                # waits OBSERVER_PAUSES times its own length: the observer takes at most a fifth
                # of the store's time whatever its read costs.
                self._stop.wait(max(0.02, OBSERVER_PAUSES * (time.monotonic() - started)))
        except BaseException as exc:  # a fault of the observer fails the test, never passes it
            self.seen["problems"].append(exc)
        finally:
            connections[self.alias].close()


class BoardContract:
    """Every backend must pass all of these. Subclasses set `alias`, and `hot_path` ("auto":
    the store's statements; "orm": the ORM path)."""

    alias: str
    hot_path: str = "auto"
    # Rounds of each race (a slower test server, or a store's second engine path, may run fewer:
    # its subclass says why).
    rounds: int = ROUNDS
    # What a racer gets from a store whose task table is gone: SQL stores fail the statement.
    missing_table_fault: type[Exception] = DatabaseError

    @pytest.fixture(autouse=True)
    def _engine_path(self, settings):
        settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": self.hot_path}
        statements = stores.store(self.alias).statements
        assert (statements is None) == (self.hot_path == "orm"), f"{self.alias}: not on the {self.hot_path} path"

    @pytest.fixture(autouse=True)
    def _board_stays_consistent(self, _engine_path):
        yield
        assert selectors.problems(using=self.alias) == [], "check() found problems after the test"

    # -- helpers ------------------------------------------------------------------------------

    @property
    def board(self) -> DjangoBoard:
        return DjangoBoard(using=self.alias)

    def new(self, task_id: str, **fields) -> Task:
        return transitions.create(TaskSpec(id=task_id, title=task_id, **fields), using=self.alias)[0]

    def claim(self, task_id: str, agent: str = "agent", ttl: float = TTL):
        return transitions.claim(task_id, agent, ttl, using=self.alias)

    def stage(self, task_id: str) -> str:
        return Task.objects.using(self.alias).get(pk=task_id).stage

    # -- the two criteria ---------------------------------------------------------------------

    def test_exactly_one_of_16_concurrent_claimers_wins_over_200_rounds(self):
        agents = [f"agent-{i}" for i in range(RACERS)]
        for n in range(self.rounds):
            self.new(f"race-{n}")
            winners = contract.concurrent_claim(self.board, f"race-{n}", agents, TTL)
            assert winners == 1, f"round {n}: {winners} winners"
            task = Task.objects.using(self.alias).get(pk=f"race-{n}")
            assert (task.stage, task.version, task.fence, task.attempts) == (Stage.RUNNING, 1, 1, 1)
            assert TaskEvent.objects.using(self.alias).filter(task_id=task.pk, verb="claim").count() == 1
        transitions.reclaim_expired(now=timezone.now() + timedelta(seconds=TTL + 1), using=self.alias)

    def test_exactly_one_of_16_submitters_of_one_token_succeeds_over_200_rounds(self):
        for n in range(self.rounds):
            self.new(f"dup-{n}")
            successes = contract.duplicate_token_submit(self.board, f"dup-{n}", RACERS, TTL)
            assert successes == 1, f"round {n}: {successes} successes"
            task = Task.objects.using(self.alias).get(pk=f"dup-{n}")
            assert (task.stage, task.version) == (Stage.COMPLETED, 2)
            assert TaskEvent.objects.using(self.alias).filter(task_id=task.pk, verb="complete").count() == 1

    def test_exactly_one_of_8_racing_processes_wins_over_100_rounds(self):
        """Processes, not threads: each has its own connection and nothing in common but the
        database (on SQLite they meet in its file lock, not in any in-process lock)."""
        processes, rounds = 8, 100
        transitions.create([TaskSpec(id=f"proc-{n}", title="p") for n in range(rounds)], using=self.alias)
        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(processes), ctx.Queue()
        url = database_url(connections[self.alias].settings_dict)
        racers = [ctx.Process(target=process_racer.race, args=(i, url, rounds, barrier, results))
                  for i in range(processes)]
        for racer in racers:
            racer.start()
        outcomes = [results.get(timeout=120) for _ in range(processes * rounds)]
        for racer in racers:
            racer.join(timeout=60)
        faults = [o for o in outcomes if o[2] == "fault"]
        assert not faults, faults[:3]
        winners = Counter(n for n, _, outcome, _ in outcomes if outcome == "won")
        assert winners == Counter(range(rounds)), "every round must have exactly one winner"
        assert Task.objects.using(self.alias).filter(stage=Stage.RUNNING, fence=1).count() == rounds
        transitions.reclaim_expired(now=timezone.now() + timedelta(seconds=TTL + 1), using=self.alias)

    def test_criterion_on_a_database_without_its_tables_raises_instead_of_counting(self):
        """A broken store (here: the task table gone, as after a failed migration) must make the
        criterion raise; counting the failures as losers would report 0 winners quietly."""
        self.new("gone")
        rename_table(self.alias, "board_task", "board_task_hidden")
        try:
            with pytest.raises(contract.CriterionError) as caught:
                contract.concurrent_claim(self.board, "gone", [f"a{i}" for i in range(RACERS)], TTL)
            assert len(caught.value.faults) == RACERS
            assert all(isinstance(f, self.missing_table_fault) for f in caught.value.faults), caught.value.faults
        finally:
            rename_table(self.alias, "board_task_hidden", "board_task")
        assert row("gone", self.alias)["version"] == 0
        transitions.cancel("gone", actor="test", using=self.alias)

    # -- leases and fences --------------------------------------------------------------------

    def test_fences_strictly_increase_across_every_new_holder(self):
        self.new("f", max_retries=10)
        fences = [self.claim("f", "a").lease.fence]
        expire_lease("f", self.alias)
        takeover = self.claim("f", "b")  # claim of an expired lease: a takeover
        fences.append(takeover.lease.fence)
        renewed = transitions.renew("f", takeover.lease.token, TTL, using=self.alias)
        assert renewed.lease.fence == takeover.lease.fence  # renew is not a new holder
        assert renewed.lease.token == takeover.lease.token
        transitions.release("f", takeover.lease.token, using=self.alias)
        c = self.claim("f", "c")
        fences.append(c.lease.fence)
        transitions.pause("f", c.lease.token, {"step": 1}, using=self.alias)
        r = transitions.resume("f", "d", TTL, using=self.alias)
        fences.append(r.lease.fence)
        transitions.force_release("f", actor="operator", using=self.alias)
        fences.append(self.claim("f", "e").lease.fence)
        expire_lease("f", self.alias)
        assert [m.task_id for m in transitions.reclaim_expired(using=self.alias)] == ["f"]
        last = self.claim("f", "g")
        fences.append(last.lease.fence)
        assert fences == sorted(set(fences)) and fences == list(range(1, 7))
        transitions.complete("f", last.lease.token, {"done": True}, using=self.alias)

    def test_tokens_are_minted_by_the_store_and_never_stored(self):
        self.new("t")
        first = self.claim("t", "a")
        assert len(first.lease.token) >= 40
        stored = row("t", self.alias)
        assert first.lease.token not in str(stored)
        assert first.lease.token not in str(list(TaskEvent.objects.using(self.alias).values()))
        assert stored["lease_token_hash"] == transitions.hash_token(first.lease.token)
        transitions.release("t", first.lease.token, using=self.alias)
        second = self.claim("t", "a")
        assert second.lease.token != first.lease.token  # same agent name, a different lease
        transitions.complete("t", second.lease.token, {}, using=self.alias)

    # -- claim request ids: a claim retried after its answer was lost -------------------------

    def claim_request(self, task_id: str) -> tuple:
        return Task.objects.using(self.alias).filter(pk=task_id).values_list(
            "claim_request_hash", "claim_token_seed").get()

    def test_a_claim_retried_with_its_request_id_returns_the_same_lease(self):
        a = self.alias
        self.new("rq", max_retries=5)
        first = transitions.claim("rq", "agent", TTL, request_id="r-1", using=a)
        state = db_state(a)
        again = transitions.claim("rq", "agent", TTL, request_id="r-1", using=a)
        assert (again.task.pk, again.lease) == ("rq", first.lease)
        assert db_state(a) == state and TaskEvent.objects.using(a).filter(verb="claim").count() == 1
        # Neither the request id nor the token is stored: a hash and the seed.
        stored = str(list(Task.objects.using(a).filter(pk="rq").values()))
        assert "r-1" not in stored and first.lease.token not in stored
        assert row("rq", a)["lease_token_hash"] == transitions.hash_token(first.lease.token)
        # Another agent's request with that id, or another id of the same agent: a new claim.
        for agent, request_id in (("other", "r-1"), ("agent", "r-2"), ("agent", None)):
            with pytest.raises(errors.Taken):
                transitions.claim("rq", agent, TTL, request_id=request_id, using=a)
        assert db_state(a) == state
        # Renewed, the lease is still the request's: a retry returns it with its new expiry.
        renewed = transitions.renew("rq", first.lease.token, 2 * TTL, agent="agent", using=a)
        again = transitions.claim("rq", "agent", TTL, request_id="r-1", using=a)
        assert again.lease == renewed.lease and again.lease.expires_at > first.lease.expires_at
        # Expired, it is not returned: the retry is an ordinary claim, a takeover.
        expire_lease("rq", a)
        taken = transitions.claim("rq", "agent", TTL, request_id="r-1", using=a)
        assert taken.lease.fence == 2 and taken.lease.token != first.lease.token
        with pytest.raises(errors.LeaseLost):
            transitions.renew("rq", first.lease.token, TTL, using=a)
        # Ended, its request is forgotten with the rest of the lease.
        transitions.release("rq", taken.lease.token, using=a)
        assert self.claim_request("rq") == (None, None)
        plain = self.claim("rq", "agent")
        assert self.claim_request("rq") == (None, None)
        transitions.complete("rq", plain.lease.token, {}, using=a)

    def test_claim_next_retried_with_its_request_id_returns_the_same_task(self):
        a = self.alias
        self.new("q1")
        self.new("q2")
        first = transitions.claim_next("agent", TTL, request_id="n-1", using=a)
        state = db_state(a)
        again = transitions.claim_next("agent", TTL, request_id="n-1", using=a)
        assert (again.task.pk, again.lease) == (first.task.pk, first.lease)
        assert db_state(a) == state
        assert self.claim_request(first.task.pk)[0] is not None
        other = transitions.claim_next("other", TTL, request_id="n-1", using=a)  # another agent's
        assert other.task.pk != first.task.pk
        assert transitions.claim_next("agent", TTL, request_id="n-1", using=a).lease == first.lease
        # Completed (the hot statement too), the request is forgotten: the id claims anew.
        done = transitions.complete(first.task.pk, first.lease.token, {}, using=a)
        assert (done.claim_request_hash, done.claim_token_seed) == (None, None) == self.claim_request(done.pk)
        assert transitions.claim_next("agent", TTL, request_id="n-1", using=a) is None
        transitions.complete(other.task.pk, other.lease.token, {}, using=a)

    def test_a_bad_request_id_is_refused_and_changes_nothing(self):
        a = self.alias
        self.new("bad")
        before = db_state(a)
        for bad in ("", "x" * 65, "with space", "é", "line\n", 12):
            with pytest.raises(errors.InvalidRequest):
                transitions.claim("bad", "agent", TTL, request_id=bad, using=a)
            with pytest.raises(errors.InvalidRequest):
                transitions.claim_next("agent", TTL, request_id=bad, using=a)
        assert db_state(a) == before

    def test_16_copies_of_one_claim_make_one_lease_over_100_rounds(self):
        """The criterion: copies of one claim (a client's retries) released together get one
        lease between them, whether it names its task or takes the next one, while other ready
        tasks would let a second claim succeed."""
        a = self.alias
        for n in range(self.rounds // 2):
            transitions.create([TaskSpec(id=f"copy-{n}-{i}", title="c") for i in range(2)], using=a)
            assert contract.retried_claim(self.board, "agent", f"next-{n}", RACERS, TTL) == 1, n
            assert contract.retried_claim(self.board, "agent", f"this-{n}", RACERS, TTL,
                                          task_id=f"copy-{n}-1") == 1, n
        claims = Counter(TaskEvent.objects.using(a).filter(verb="claim").values_list("task_id", flat=True))
        assert sum(claims.values()) == Task.objects.using(a).filter(stage=Stage.RUNNING).count()
        assert set(claims.values()) == {1}

    def test_renew_extends_a_live_lease_and_saves_progress(self):
        self.new("r")
        c = self.claim("r", ttl=5)
        renewed = transitions.renew("r", c.lease.token, 120, checkpoint={"at": 3}, progress=0.25,
                                    using=self.alias)
        stored = row("r", self.alias)
        assert renewed.lease.expires_at > c.lease.expires_at
        assert stored["lease_expires_at"] == renewed.lease.expires_at
        assert (stored["checkpoint"], stored["progress"], stored["version"]) == ({"at": 3}, 0.25, 2)
        transitions.complete("r", c.lease.token, {"ok": 1}, using=self.alias)

    def test_renew_after_expiry_is_refused_and_changes_nothing(self):
        self.new("e")
        c = self.claim("e")
        expire_lease("e", self.alias)
        before = db_state(self.alias)
        with pytest.raises(errors.LeaseLost):
            transitions.renew("e", c.lease.token, TTL, checkpoint={"x": 1}, using=self.alias)
        assert db_state(self.alias) == before
        transitions.reclaim_expired(using=self.alias)

    def test_late_holder_is_refused_after_takeover_and_the_new_holder_completes(self):
        self.new("late")
        old = self.claim("late", "slow-agent")
        expire_lease("late", self.alias)
        new = self.claim("late", "fresh-agent")
        before = db_state(self.alias)
        for late_call in (
            lambda: transitions.complete("late", old.lease.token, {"stale": True}, using=self.alias),
            lambda: transitions.renew("late", old.lease.token, TTL, using=self.alias),
            lambda: transitions.fail("late", old.lease.token, "stale", using=self.alias),
            lambda: transitions.release("late", old.lease.token, using=self.alias),
            lambda: transitions.pause("late", old.lease.token, {"c": 1}, using=self.alias),
        ):
            with pytest.raises(errors.LeaseLost):
                late_call()
            assert db_state(self.alias) == before
        done = transitions.complete("late", new.lease.token, {"fresh": True}, using=self.alias)
        assert (done.stage, row("late", self.alias)["result"]) == (Stage.COMPLETED, {"fresh": True})

    def test_lost_lease_is_reclaimed_and_the_late_holder_refused(self):
        self.new("lost")
        c = self.claim("lost")
        live = self.new("live")
        live_claim = self.claim(live.pk)
        expire_lease("lost", self.alias)
        moved = transitions.reclaim_expired(using=self.alias)
        assert moved == [transitions.Reclaimed("lost", Stage.QUEUED)]  # the live lease untouched
        assert row("live", self.alias)["lease_token_hash"] == transitions.hash_token(live_claim.lease.token)
        stored = row("lost", self.alias)
        assert (stored["stage"], stored["owner"], stored["lease_token_hash"]) == (Stage.QUEUED, "", None)
        with pytest.raises(errors.LeaseLost):
            transitions.complete("lost", c.lease.token, {}, using=self.alias)
        transitions.complete("live", live_claim.lease.token, {}, using=self.alias)
        again = self.claim("lost")
        assert again.lease.fence == 2
        transitions.complete("lost", again.lease.token, {}, using=self.alias)

    def test_lost_lease_on_the_last_attempt_fails_the_task(self):
        self.new("spent", max_retries=0)
        self.claim("spent")
        expire_lease("spent", self.alias)
        assert transitions.reclaim_expired(using=self.alias) == [transitions.Reclaimed("spent", Stage.FAILED)]
        stored = row("spent", self.alias)
        assert stored["stage"] == Stage.FAILED and "expired" in stored["last_error"]

    def test_reaper_takes_back_a_lease_renewed_meanwhile_only_if_still_expired(self):
        """release-stale against a concurrent renew: exactly one side wins, over 200 rounds."""
        outcomes = {"renew": 0, "reclaim": 0}
        for n in range(self.rounds):
            task_id = f"rr-{n}"
            self.new(task_id)
            c = self.claim(task_id)
            soon = timezone.now() + timedelta(seconds=30)
            Task.objects.using(self.alias).filter(pk=task_id).update(lease_expires_at=soon)
            reaper_now = soon + timedelta(seconds=1)  # the reaper's clock sees it expired
            renewed, reclaimed = race(alias=self.alias, calls=[
                lambda: transitions.renew(task_id, c.lease.token, 600, using=self.alias),
                lambda: transitions.reclaim_expired(now=reaper_now, task_ids=[task_id], using=self.alias),
            ])
            if isinstance(renewed, transitions.Claim):
                assert reclaimed == [], f"round {n}: both won"
                outcomes["renew"] += 1
                transitions.complete(task_id, c.lease.token, {}, using=self.alias)
            else:
                assert isinstance(renewed, errors.LeaseLost), renewed
                assert reclaimed == [transitions.Reclaimed(task_id, Stage.QUEUED)]
                outcomes["reclaim"] += 1
                transitions.cancel(task_id, actor="test", using=self.alias)
        assert sum(outcomes.values()) == self.rounds

    # -- versions and refusals ------------------------------------------------------------------

    def test_version_rises_by_exactly_one_per_transition(self):
        self.new("v", max_retries=2)
        steps = []
        c = self.claim("v")
        steps.append(("claim", c.task.version))
        steps.append(("renew", transitions.renew("v", c.lease.token, TTL, using=self.alias).task.version))
        steps.append(("pause", transitions.pause("v", c.lease.token, {"k": 1}, using=self.alias).version))
        r = transitions.resume("v", "b", TTL, using=self.alias)
        steps.append(("resume", r.task.version))
        steps.append(("fail+retry", transitions.fail("v", r.lease.token, "oops", using=self.alias).version))
        end_backoff("v", self.alias)
        c2 = self.claim("v")
        steps.append(("claim", c2.task.version))
        steps.append(("release", transitions.release("v", c2.lease.token, using=self.alias).version))
        c3 = self.claim("v")
        steps.append(("claim", c3.task.version))
        steps.append(("complete", transitions.complete("v", c3.lease.token, {}, using=self.alias).version))
        assert [v for _, v in steps] == [1, 2, 3, 4, 6, 7, 8, 9, 10]
        history = list(TaskEvent.objects.using(self.alias).filter(task_id="v").values_list("verb", "version"))
        assert [v for _, v in history] == list(range(0, 11))
        assert [verb for verb, _ in history] == [
            "create", "claim", "renew", "pause", "resume", "fail", "retry", "claim", "release",
            "claim", "complete",
        ]
        assert row("v", self.alias)["version"] == 10

    def test_every_refused_call_leaves_the_database_unchanged(self):
        a = self.alias
        self.new("done")
        done = self.claim("done")
        transitions.complete("done", done.lease.token, {"r": 1}, using=a)
        self.new("running")
        running = self.claim("running", "holder")
        self.new("queued")
        self.new("waiting", deps=["queued"])
        self.new("held", on_hold=True)
        self.new("paused-t")
        p = self.claim("paused-t")
        transitions.pause("paused-t", p.lease.token, {"step": 2}, using=a)
        version_of_queued = row("queued", a)["version"]

        refused = [
            (errors.NotFound, lambda: self.claim("missing")),
            (errors.Taken, lambda: self.claim("running", "intruder")),
            (errors.Blocked, lambda: self.claim("waiting")),
            (errors.Blocked, lambda: self.claim("held")),
            (errors.Terminal, lambda: self.claim("done")),
            (errors.InvalidTransition, lambda: self.claim("paused-t")),
            (errors.InvalidRequest, lambda: self.claim("queued", ttl=0)),
            (errors.InvalidRequest, lambda: self.claim("queued", ttl=24 * 3600 + 1)),
            (errors.InvalidRequest, lambda: self.claim("queued", agent="")),
            (errors.LeaseLost, lambda: transitions.renew("running", "forged", TTL, using=a)),
            (errors.LeaseLost, lambda: transitions.complete("running", "forged", {}, using=a)),
            (errors.LeaseLost, lambda: transitions.fail("running", "forged", "x", using=a)),
            (errors.LeaseLost, lambda: transitions.pause("running", "forged", {}, using=a)),
            (errors.LeaseLost, lambda: transitions.release("running", "forged", using=a)),
            (errors.LeaseLost, lambda: transitions.complete("done", done.lease.token, {}, using=a)),
            (errors.InvalidRequest, lambda: transitions.complete("running", running.lease.token, None, using=a)),
            (errors.InvalidRequest, lambda: transitions.pause("running", running.lease.token, None, using=a)),
            (errors.InvalidRequest, lambda: transitions.renew("running", running.lease.token, TTL,
                                                              progress=2, using=a)),
            (errors.InvalidTransition, lambda: transitions.resume("queued", "b", TTL, using=a)),
            (errors.Taken, lambda: transitions.resume("running", "b", TTL, using=a)),
            (errors.Terminal, lambda: transitions.resume("done", "b", TTL, using=a)),
            (errors.Blocked, lambda: transitions.admit("waiting", actor="op", using=a)),
            (errors.InvalidTransition, lambda: transitions.admit("queued", actor="op", using=a)),
            (errors.InvalidTransition, lambda: transitions.requeue("queued", actor="op", using=a)),
            (errors.InvalidTransition, lambda: transitions.force_release("queued", actor="op", using=a)),
            (errors.Terminal, lambda: transitions.cancel("done", actor="op", using=a)),
            (errors.VersionConflict, lambda: transitions.cancel("queued", actor="op",
                                                                version=version_of_queued + 1, using=a)),
            (errors.DuplicateId, lambda: self.new("queued")),
            (errors.InvalidRequest, lambda: self.new("self", deps=["self"])),
            (errors.InvalidRequest, lambda: self.new("orphan", deps=["nowhere"])),
            (errors.InvalidRequest, lambda: self.new("-bad-id")),
            (errors.InvalidRequest, lambda: transitions.create(
                [TaskSpec(id="c1", title="c1", deps=["c2"]), TaskSpec(id="c2", title="c2", deps=["c1"])], using=a)),
            (errors.InvalidRequest, lambda: transitions.create(
                [TaskSpec(id="ok1", title="fine"), TaskSpec(id="ok1", title="twice")], using=a)),
            (errors.InvalidRequest, lambda: transitions.create(
                [TaskSpec(id="ok2", title="fine"), TaskSpec(id="ok3", title="")], using=a)),
            (errors.DuplicateId, lambda: transitions.create(
                [TaskSpec(id="ok4", title="fine"), TaskSpec(id="done", title="taken")], using=a)),
        ]
        for expected, call in refused:
            before = db_state(a)
            with pytest.raises(expected):
                call()
            assert db_state(a) == before, f"{expected.__name__} changed the database"
        transitions.complete("running", running.lease.token, {}, using=a)
        for task_id in ("waiting", "held", "paused-t", "queued"):
            if self.stage(task_id) not in (Stage.COMPLETED, Stage.CANCELLED):
                transitions.cancel(task_id, actor="cleanup", using=a)

    def test_errors_carry_the_current_task_without_its_token(self):
        self.new("e1")
        held = self.claim("e1", "holder")
        with pytest.raises(errors.Taken) as caught:
            self.claim("e1", "other")
        assert caught.value.task.owner == "holder" and caught.value.code == "taken"
        assert held.lease.token not in str(vars(caught.value))
        transitions.complete("e1", held.lease.token, {}, using=self.alias)

    def test_a_holders_verbs_under_another_agents_name_are_forbidden_and_change_nothing(self):
        a = self.alias
        self.new("own")
        c = self.claim("own", "holder")
        before = db_state(a)
        with pytest.raises(errors.Forbidden):
            transitions.renew("own", c.lease.token, TTL, agent="intruder", using=a)
        with pytest.raises(errors.Forbidden):
            transitions.complete("own", c.lease.token, {}, agent="intruder", using=a)
        with pytest.raises(errors.LeaseLost):  # a wrong token is LeaseLost whoever presents it
            transitions.complete("own", "forged", {}, agent="holder", using=a)
        assert db_state(a) == before
        expire_lease("own", a)
        before = db_state(a)
        with pytest.raises(errors.LeaseLost, match="expired"):  # expiry is judged before the agent
            transitions.renew("own", c.lease.token, TTL, agent="intruder", using=a)
        assert db_state(a) == before
        done = transitions.complete("own", c.lease.token, {"late": "but mine"}, agent="holder", using=a)
        assert (done.stage, done.result) == (Stage.COMPLETED, {"late": "but mine"})

    def test_what_a_hot_verb_returns_is_the_row_as_stored_and_its_history(self):
        """claim_next, renew and complete return the task as written (no re-read on either
        path must make it differ from a fresh read) and record who did what, with which
        version and fence."""
        a = self.alias
        self.new("hv", queue="hot", payload={"in": [1, 2.5, "ü"]})
        claim = transitions.claim_next("hv-agent", TTL, queue="hot", using=a)
        assert task_columns(claim.task) == row("hv", a)
        assert (claim.lease.fence, claim.lease.expires_at) == (1, row("hv", a)["lease_expires_at"])
        renewed = transitions.renew("hv", claim.lease.token, 2 * TTL, checkpoint={"page": [3, None]},
                                    progress=0.5, agent="hv-agent", using=a)
        assert task_columns(renewed.task) == row("hv", a)
        assert renewed.lease.expires_at == row("hv", a)["lease_expires_at"] > claim.lease.expires_at
        kept = transitions.renew("hv", claim.lease.token, TTL, using=a)  # no checkpoint: kept
        assert (kept.task.checkpoint, kept.task.progress) == ({"page": [3, None]}, 0.5)
        done = transitions.complete("hv", claim.lease.token, {"out": {"nested": [True, 1e-3]}}, using=a)
        assert task_columns(done) == row("hv", a)
        assert (done.stage, done.owner, done.lease_token_hash, done.lease_expires_at, done.fence, done.version) == (
            Stage.COMPLETED, "", None, None, 1, 4)
        history = list(TaskEvent.objects.using(a).filter(task_id="hv").values_list(
            "verb", "from_stage", "to_stage", "version", "fence", "actor", "detail"))
        assert history == [
            ("create", "", "QUEUED", 0, 0, "", None),
            ("claim", "QUEUED", "RUNNING", 1, 1, "hv-agent", None),
            ("renew", "RUNNING", "RUNNING", 2, 1, "hv-agent", None),
            ("renew", "RUNNING", "RUNNING", 3, 1, "hv-agent", None),
            ("complete", "RUNNING", "COMPLETED", 4, 1, "hv-agent", None),
        ]
        stamps = TaskEvent.objects.using(a).filter(task_id="hv").values_list("at", flat=True)
        assert list(stamps)[-1] == done.updated_at

    # -- dependencies -------------------------------------------------------------------------

    def test_dependencies_block_and_completion_admits_dependents(self):
        a = self.alias
        transitions.create([
            TaskSpec(id="base", title="base"),
            TaskSpec(id="mid", title="mid", deps=["base"]),
            TaskSpec(id="top", title="top", deps=["base", "mid"]),
            TaskSpec(id="gated", title="gated", deps=["base"], on_hold=True),
        ], using=a)
        assert [self.stage(t) for t in ("base", "mid", "top", "gated")] == ["QUEUED", "PENDING", "PENDING", "PENDING"]
        with pytest.raises(errors.Blocked, match="base"):
            self.claim("top")
        c = self.claim("base")
        transitions.complete("base", c.lease.token, {}, using=a)
        assert [self.stage(t) for t in ("mid", "top", "gated")] == ["QUEUED", "PENDING", "PENDING"]
        with pytest.raises(errors.Blocked, match="held"):
            self.claim("gated")
        transitions.admit("gated", actor="operator", using=a)
        m = self.claim("mid")
        transitions.complete("mid", m.lease.token, {}, using=a)
        assert [self.stage(t) for t in ("top", "gated")] == ["QUEUED", "QUEUED"]
        admitted_by = TaskEvent.objects.using(a).filter(task_id="gated", verb="admit").values_list("actor", flat=True)
        assert list(admitted_by) == ["operator"]
        assert self.new("after", deps=["base"]).stage == Stage.QUEUED  # deps already complete
        for t in ("top", "gated", "after"):
            transitions.cancel(t, actor="cleanup", using=a)

    def test_two_dependencies_completing_at_once_always_admit_the_dependent(self):
        """Neither completion sees the other's uncommitted write; the after-commit admission
        pass must still admit the dependent, every round."""
        a = self.alias
        for n in range(self.rounds):
            left, right, both = f"l{n}", f"r{n}", f"both{n}"
            transitions.create([TaskSpec(id=left, title="l"), TaskSpec(id=right, title="r"),
                                TaskSpec(id=both, title="both", deps=[left, right])], using=a)
            cl, cr = self.claim(left), self.claim(right)
            results = race(alias=self.alias, calls=[
                lambda: transitions.complete(left, cl.lease.token, {}, using=a),
                lambda: transitions.complete(right, cr.lease.token, {}, using=a),
            ])
            assert all(isinstance(r, Task) for r in results), results
            assert self.stage(both) == Stage.QUEUED, f"round {n}: dependent left {self.stage(both)}"
            transitions.cancel(both, actor="cleanup", using=a)

    def test_a_task_created_while_its_dependency_completes_is_admitted(self):
        a = self.alias
        for n in range(self.rounds):
            dep, child = f"d{n}", f"c{n}"
            self.new(dep)
            c = self.claim(dep)
            results = race(alias=self.alias, calls=[
                lambda: transitions.complete(dep, c.lease.token, {}, using=a),
                lambda: self.new(child, deps=[dep]),
            ])
            assert not any(isinstance(r, BaseException) for r in results), results
            assert self.stage(child) == Stage.QUEUED, f"round {n}: child left {self.stage(child)}"
            transitions.cancel(child, actor="cleanup", using=a)

    # -- claim_next, failure, operators ----------------------------------------------------------

    def test_claim_next_takes_highest_priority_then_oldest_in_the_queue(self):
        a = self.alias
        for task_id, priority, queue in [("old-low", 0, "q"), ("old-high", 5, "q"), ("new-high", 5, "q"),
                                         ("other-queue", 9, "elsewhere"), ("new-low", 0, "q")]:
            self.new(task_id, priority=priority, queue=queue)
        order = []
        while (c := transitions.claim_next("agent", TTL, queue="q", using=a)) is not None:
            order.append(c.task.id)
            transitions.complete(c.task.id, c.lease.token, {}, using=a)
        assert order == ["old-high", "new-high", "old-low", "new-low"]
        c = transitions.claim_next("agent", TTL, using=a)
        assert c.task.id == "other-queue"
        transitions.complete(c.task.id, c.lease.token, {}, using=a)

    def test_concurrent_claim_next_never_hands_out_a_task_twice(self):
        a = self.alias
        transitions.create([TaskSpec(id=f"w{i}", title="w", priority=i % 3) for i in range(300)], using=a)
        claimed: list[list[str]] = [[] for _ in range(8)]

        def worker(i):
            def loop():
                while (c := transitions.claim_next(f"worker-{i}", TTL, using=a)) is not None:
                    claimed[i].append(c.task.id)
                    transitions.complete(c.task.id, c.lease.token, {"by": i}, using=a)
            return loop

        results = race(alias=self.alias, calls=[worker(i) for i in range(8)])
        assert not any(isinstance(r, BaseException) for r in results), results
        every = [t for ids in claimed for t in ids]
        assert len(every) == len(set(every)) == 300
        assert Task.objects.using(a).filter(stage=Stage.COMPLETED).count() == 300

    def test_failure_retries_with_backoff_then_stays_failed(self):
        a = self.alias
        self.new("flaky", max_retries=1)
        c = self.claim("flaky")
        retried = transitions.fail("flaky", c.lease.token, "boom", using=a)
        assert retried.stage == Stage.QUEUED and retried.not_before > timezone.now()
        assert transitions.claim_next("agent", TTL, using=a) is None  # backing off
        with pytest.raises(errors.Blocked, match="backoff"):
            self.claim("flaky")
        end_backoff("flaky", a)
        c = self.claim("flaky")
        final = transitions.fail("flaky", c.lease.token, "boom again", using=a)
        assert (final.stage, final.attempts, final.last_error) == (Stage.FAILED, 2, "boom again")
        with pytest.raises(errors.InvalidTransition, match="no attempt left"):
            transitions.requeue("flaky", actor="op", using=a)
        requeued = transitions.requeue("flaky", actor="op", reset_attempts=True, using=a)
        assert (requeued.stage, requeued.attempts) == (Stage.QUEUED, 0)
        c = self.claim("flaky")
        assert transitions.fail("flaky", c.lease.token, "fatal", retryable=False, using=a).stage == Stage.FAILED
        transitions.cancel("flaky", actor="op", using=a)

    def test_cancel_ends_a_live_lease(self):
        self.new("x")
        c = self.claim("x")
        cancelled = transitions.cancel("x", actor="op", reason="not needed", using=self.alias)
        assert (cancelled.stage, cancelled.owner, cancelled.lease_token_hash) == (Stage.CANCELLED, "", None)
        with pytest.raises(errors.LeaseLost):
            transitions.complete("x", c.lease.token, {}, using=self.alias)
        event = TaskEvent.objects.using(self.alias).filter(task_id="x").last()
        assert (event.verb, event.actor, event.detail) == ("cancel", "op", {"reason": "not needed"})

    def test_operator_pause_keeps_the_last_checkpoint_and_ends_the_lease(self):
        a = self.alias
        self.new("op-p")
        c = self.claim("op-p", "worker")
        transitions.renew("op-p", c.lease.token, TTL, checkpoint={"row": 40}, using=a)
        paused = transitions.force_pause("op-p", actor="operator", reason="maintenance", using=a)
        assert (paused.stage, paused.checkpoint, paused.owner) == (Stage.PAUSED, {"row": 40}, "")
        with pytest.raises(errors.LeaseLost):
            transitions.renew("op-p", c.lease.token, TTL, using=a)
        resumed = transitions.resume("op-p", "worker-2", TTL, using=a)
        assert resumed.lease.fence == c.lease.fence + 1 and resumed.task.checkpoint == {"row": 40}
        transitions.complete("op-p", resumed.lease.token, {}, using=a)

    def test_operator_edit_is_guarded_by_the_version(self):
        a = self.alias
        self.new("ed", max_retries=3)
        opened_at = row("ed", a)["version"]
        c = self.claim("ed")  # an agent moves the task after the operator opened the form
        before = db_state(a)
        with pytest.raises(errors.VersionConflict):
            transitions.edit("ed", actor="operator", version=opened_at, title="renamed", using=a)
        assert db_state(a) == before
        edited = transitions.edit("ed", actor="operator", version=opened_at + 1, title="renamed",
                                  priority=7, using=a)
        assert (edited.title, edited.priority, edited.version, edited.stage) == ("renamed", 7, 2, Stage.RUNNING)
        event = TaskEvent.objects.using(a).filter(task_id="ed").last()
        assert (event.verb, event.detail) == ("edit", {"changed": ["priority", "title"]})
        before = db_state(a)
        for bad in ({"title": ""}, {"max_retries": -1}, {"stage": "COMPLETED"}, {"tags": ["no spaces"]},
                    {"tags": "urgent"}, {"tags": [f"t{n}" for n in range(21)]}):
            with pytest.raises(errors.InvalidRequest):
                transitions.edit("ed", actor="operator", version=2, using=a, **bad)
            assert db_state(a) == before
        # Tags (issue 33): set by an operator, kept as create keeps them; the search finds them.
        tagged = transitions.edit("ed", actor="operator", version=2, tags=["urgent", "ci", "urgent"], using=a)
        assert (tagged.tags, row("ed", a)["tags"], tagged.version) == (["urgent", "ci"], ["urgent", "ci"], 3)
        assert list(Task.objects.using(a).filter(search.parse("tag:urgent").q(a)).values_list("pk", flat=True)) == ["ed"]
        assert transitions.edit("ed", actor="operator", version=3, tags=[], using=a).tags == []
        transitions.complete("ed", c.lease.token, {}, using=a)
        with pytest.raises(errors.Terminal):
            transitions.edit("ed", actor="operator", version=5, title="late", using=a)

    def test_pause_and_resume_keep_the_checkpoint(self):
        self.new("p")
        c = self.claim("p", "first")
        transitions.pause("p", c.lease.token, {"page": 7}, using=self.alias)
        r = transitions.resume("p", "second", TTL, using=self.alias)
        assert r.task.checkpoint == {"page": 7} and r.task.owner == "second" and r.task.attempts == 1
        transitions.complete("p", r.lease.token, {"pages": 9}, using=self.alias)

    # -- flow control: queue limits, concurrency keys, the brake (board.engine.flow) -------------

    def running_in(self, queue: str) -> tuple[int, int]:
        """(RUNNING tasks of the queue, the engine's count: its shards')."""
        return (Task.objects.using(self.alias).filter(queue=queue, stage=Stage.RUNNING).count(),
                flow.counts([queue], using=self.alias)[0].get(queue, 0))

    def claim_next(self, agent: str = "agent", queue: str | None = None):
        return transitions.claim_next(agent, TTL, queue=queue, using=self.alias)

    def test_a_queue_limit_caps_running_and_the_next_eligible_task_is_taken_instead(self):
        flow.change_queue("capped", concurrency=2, actor="op", using=self.alias)
        for n in range(4):
            self.new(f"capped-{n}", queue="capped", priority=10)
        self.new("free-0", queue="free")
        taken = [self.claim_next() for _ in range(4)]
        assert [c.task.pk if c else None for c in taken] == ["capped-0", "capped-1", "free-0", None]
        assert self.running_in("capped") == (2, 2)
        with pytest.raises(errors.Blocked) as refused:
            self.claim("capped-2")
        assert refused.value.details["waiting"] == "queue capped is at its limit 2/2"
        assert self.stage("capped-2") == Stage.QUEUED
        transitions.complete("capped-0", taken[0].lease.token, {}, using=self.alias)
        assert self.claim_next().task.pk == "capped-2"
        assert self.running_in("capped") == (2, 2)

    def test_a_concurrency_key_caps_running_tasks_across_queues(self):
        self.new("repo-a", queue="q1", concurrency_key="repo:acme/web")
        self.new("repo-b", queue="q2", concurrency_key="repo:acme/web")
        self.new("other", queue="q2", concurrency_key="repo:acme/api", concurrency_limit=2)
        first = self.claim_next()
        assert first.task.pk == "repo-a"
        assert self.claim_next().task.pk == "other"
        assert self.claim_next() is None
        with pytest.raises(errors.Blocked) as refused:
            self.claim("repo-b")
        assert refused.value.details["waiting"] == "repo:acme/web is at its limit 1/1"
        transitions.release("repo-a", first.lease.token, using=self.alias)
        assert self.claim_next().task.pk == "repo-a"  # older than repo-b, and its key has room again
        keys = dict(ConcurrencyKey.objects.using(self.alias).values_list("name", "running"))
        assert keys == {"repo:acme/web": 1, "repo:acme/api": 1}
        assert ConcurrencyKey.objects.using(self.alias).get(name="repo:acme/api").concurrency == 2

    def test_every_way_out_of_running_gives_its_slot_back(self):
        flow.change_queue("one", concurrency=1, actor="op", using=self.alias)
        for n in range(8):
            self.new(f"one-{n}", queue="one", max_retries=5)
        exits = {
            "complete": lambda c: transitions.complete(c.task.pk, c.lease.token, {}, using=self.alias),
            "fail": lambda c: transitions.fail(c.task.pk, c.lease.token, "boom", using=self.alias),
            "release": lambda c: transitions.release(c.task.pk, c.lease.token, using=self.alias),
            "pause": lambda c: transitions.pause(c.task.pk, c.lease.token, {"at": 1}, using=self.alias),
            "cancel": lambda c: transitions.cancel(c.task.pk, actor="op", using=self.alias),
            "force_release": lambda c: transitions.force_release(c.task.pk, actor="op", using=self.alias),
            "force_pause": lambda c: transitions.force_pause(c.task.pk, actor="op", using=self.alias),
            "reap": lambda c: (expire_lease(c.task.pk, self.alias),
                               transitions.reclaim_expired(task_ids=[c.task.pk], using=self.alias)),
        }
        for way, leave in exits.items():
            held = self.claim_next(queue="one")
            assert held is not None, f"no slot after {way}'s predecessor"
            assert self.running_in("one") == (1, 1)
            assert self.claim_next(queue="one") is None, way
            leave(held)
            assert self.running_in("one") == (0, 0), way
        paused = list(Task.objects.using(self.alias).filter(queue="one", stage=Stage.PAUSED).values_list("pk", flat=True))
        resumed = transitions.resume(paused[0], "agent", TTL, using=self.alias)  # a resume takes a slot too
        assert self.running_in("one") == (1, 1)
        with pytest.raises(errors.Blocked):
            transitions.resume(paused[1], "agent", TTL, using=self.alias)
        transitions.complete(resumed.task.pk, resumed.lease.token, {}, using=self.alias)
        assert self.running_in("one") == (0, 0)

    def test_a_paused_queue_takes_no_claim_while_its_leases_go_on(self):
        self.new("held", queue="brake")
        self.new("waiting", queue="brake")
        held = self.claim_next()
        flow.change_queue("brake", paused=True, actor="op", reason="provider outage", using=self.alias)
        assert self.claim_next() is None
        with pytest.raises(errors.Blocked) as refused:
            self.claim("waiting")
        assert refused.value.details["waiting"] == "queue brake is paused"
        renewed = transitions.renew("held", held.lease.token, TTL, using=self.alias)
        transitions.complete("held", renewed.lease.token, {}, using=self.alias)
        assert self.stage("waiting") == Stage.QUEUED
        queue = Queue.objects.using(self.alias).get(name="brake")
        assert (queue.paused, queue.paused_by, queue.paused_reason) == (True, "op", "provider outage")
        flow.change_queue("brake", paused=False, actor="op2", using=self.alias)
        assert self.claim_next().task.pk == "waiting"
        history = list(QueueChange.objects.using(self.alias).filter(queue="brake").order_by("at", "pk")
                       .values_list("actor", "reason", "changes"))
        assert history == [("op", "provider outage", {"paused": [False, True]}), ("op2", "", {"paused": [True, False]})]

    def test_bad_flow_settings_are_refused_and_change_nothing(self):
        flow.change_queue("kept", concurrency=3, actor="op", using=self.alias)
        before = db_state(self.alias), list(Queue.objects.using(self.alias).values_list())
        for settings_ in ({"concurrency": 0}, {"concurrency": -1}, {"concurrency": "2"}, {"concurrency": True},
                          {"concurrency": 10_001}, {"paused": "yes"}, {"reason": "x" * 501}):
            with pytest.raises(errors.InvalidRequest):
                flow.change_queue("kept", actor="op", using=self.alias, **settings_)
        for fields in ({"concurrency_key": ""}, {"concurrency_key": "k" * 201}, {"concurrency_key": "a\nb"},
                       {"concurrency_key": "k", "concurrency_limit": 0}, {"concurrency_limit": 2}):
            with pytest.raises(errors.InvalidRequest):
                self.new("refused", **fields)
        assert (db_state(self.alias), list(Queue.objects.using(self.alias).values_list())) == before
        assert not ConcurrencyKey.objects.using(self.alias).exists()

    def test_check_reports_a_drifted_count_and_running_over_a_limit(self):
        flow.change_queue("watched", concurrency=1, actor="op", using=self.alias)
        self.new("w-0", queue="watched")
        self.new("w-1", queue="watched")
        first = self.claim_next()
        queue_shards("watched", "run", self.alias).update(running=0)  # a count written behind the engine's back
        assert [(p.task, p.code) for p in selectors.problems(using=self.alias)] == [
            ("queue:watched", "running_count_drift")]
        second = self.claim_next()  # the count let it through: two run under a limit of one
        assert second is not None
        assert [(p.task, p.code) for p in selectors.problems(using=self.alias)] == [
            ("queue:watched", "over_concurrency"), ("queue:watched", "running_count_drift")]
        # Lowered while two run (counted again from the tasks: one slot and a debt of one): no breach.
        flow.change_queue("watched", concurrency=2, actor="op", using=self.alias)
        flow.change_queue("watched", concurrency=1, actor="op", using=self.alias)
        assert [(s.kind, s.capacity, s.running) for s in QueueShard.objects.using(self.alias).filter(
            queue="watched").order_by("kind")] == [("debt", 0, 1), ("run", 1, 1)]
        assert selectors.problems(using=self.alias) == []
        for claim in (first, second):
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)

    def test_16_claimers_never_run_more_than_the_queue_limit_over_200_rounds(self):
        self._race_a_limit(queue_limit=3, key=None)

    def test_claims_racing_completions_on_a_limited_queue_keep_its_shards_exact_over_100_rounds(self):
        """Each round the 3 tasks running under a limit of 3 complete while 6 claimers race for
        their slots, all released together: each completion gives its slot back to the shard it
        was taken from (Task.slot), so every round ends with 3 running, check() finding nothing,
        and each shard counting exactly the RUNNING tasks that name it."""
        a = self.alias
        flow.change_queue("raced", concurrency=3, actor="op", using=a)
        rounds = self.rounds // 2  # 100 on the SQL stores
        transitions.create([TaskSpec(id=f"rc-{n}", title="r", queue="raced") for n in range(3 * rounds + 3)],
                           using=a)
        held = [self.claim_next(queue="raced") for _ in range(3)]
        for n in range(rounds):
            calls = [lambda c=c: transitions.complete(c.task.pk, c.lease.token, {}, using=a) for c in held]
            calls += [lambda i=i: transitions.claim_next(f"agent-{i}", TTL, queue="raced", using=a) for i in range(6)]
            results = race(calls, a)
            faults = [r for r in results if isinstance(r, BaseException)]
            assert not faults, f"round {n}: {faults[:3]}"
            claimed = [r for r in results[3:] if r is not None]
            # Completions that committed before a claimer's pick made room for it: never more than 3.
            assert len(claimed) <= 3, f"round {n}: {len(claimed)} claims under a limit of 3"
            held = claimed + [self.claim_next(queue="raced") for _ in range(3 - len(claimed))]
            assert all(held), f"round {n}: a slot stayed taken after its task completed"
            with stores.store(a).read_transaction():
                assert selectors.limit_problems(using=a) == [], f"round {n}"
                slots = Counter(Task.objects.using(a).filter(stage=Stage.RUNNING).values_list("slot", flat=True))
                shards = {s.number: s.running for s in queue_shards("raced", "run", a)}
            assert slots == {number: taken for number, taken in shards.items() if taken}, f"round {n}"
        for claim in held:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)
        assert flow.counts(["raced"], using=a)[0] == {"raced": 0}

    def test_a_lowered_limit_holds_claims_back_until_the_tasks_over_it_have_left(self):
        """Lowered from 3 to 1 while 3 run: the first claimed keeps the one slot, the two others
        are the queue's debt. No claim starts until both the debt and the slot are given back,
        whichever leaves first; check() finds nothing at each step."""
        a = self.alias
        flow.change_queue("lowered", concurrency=3, actor="op", using=a)
        for n in range(6):
            self.new(f"low-{n}", queue="lowered")
        first, second, third = (self.claim_next(queue="lowered") for _ in range(3))
        flow.change_queue("lowered", concurrency=1, actor="op", using=a)
        assert [(s.kind, s.capacity, s.running) for s in QueueShard.objects.using(a).filter(
            queue="lowered").order_by("kind")] == [("debt", 0, 2), ("run", 1, 1)]
        assert [Task.objects.using(a).get(pk=c.task.pk).slot for c in (first, second, third)] == [0, None, None]
        assert flow.counts(["lowered"], using=a)[0] == {"lowered": 3}
        transitions.complete(second.task.pk, second.lease.token, {}, using=a)  # pays one debt back
        assert self.claim_next(queue="lowered") is None
        transitions.complete(first.task.pk, first.lease.token, {}, using=a)  # frees the slot; a debt is left
        assert self.claim_next(queue="lowered") is None
        with pytest.raises(errors.Blocked):
            self.claim("low-3")
        assert selectors.limit_problems(using=a) == []
        transitions.complete(third.task.pk, third.lease.token, {}, using=a)
        fourth = self.claim_next(queue="lowered")
        assert fourth is not None and self.claim_next(queue="lowered") is None
        assert Task.objects.using(a).get(pk=fourth.task.pk).slot == 0
        assert selectors.limit_problems(using=a) == []
        transitions.complete(fourth.task.pk, fourth.lease.token, {}, using=a)
        assert flow.counts(["lowered"], using=a)[0] == {"lowered": 0}

    def test_16_claimers_never_run_two_tasks_of_one_concurrency_key_over_200_rounds(self):
        self._race_a_limit(queue_limit=None, key="branch:main")

    def _race_claims_and_a_limit_being_set(self, queue: str, n: int, finishing: list) -> tuple[list, list]:
        """One round of the two races below: the queue's limit removed, then 12 claimers, the
        `finishing` calls and the limit being set to 4 released together. No call faults, check()
        finds no drift, the count is the queue's RUNNING tasks, and a claim after it obeys the
        limit. Answers (the claims made, the probe's included; what the finishing calls answered)."""
        flow.change_queue(queue, concurrency=None, actor="op", using=self.alias)
        calls = [lambda i=i: transitions.claim_next(f"a{i}", 600, queue=queue, using=self.alias) for i in range(12)]
        calls += finishing
        calls.append(lambda: flow.change_queue(queue, concurrency=4, actor="op", using=self.alias))
        results = race(calls, self.alias)
        faults = [r for r in results if isinstance(r, BaseException)]
        assert not faults, f"round {n}: {faults[:3]}"
        found = selectors.problems(using=self.alias)
        # What a failure needs to be understood: the shards, the slots, what the race answered.
        shards = list(QueueShard.objects.using(self.alias).filter(queue=queue).values_list(
            "kind", "number", "capacity", "running"))
        slots = sorted(Task.objects.using(self.alias).filter(stage=Stage.RUNNING).values_list("pk", "slot"))
        assert found == [], f"round {n}: {[p.text for p in found]}; shards {shards}; slots {slots}; {results}"
        running, counted = self.running_in(queue)
        assert running == counted
        claimed = [r for r in results[:12] if r is not None]
        probe = transitions.claim_next("probe", 600, queue=queue, using=self.alias)
        assert probe is None or running < 4, f"round {n}: a claim over the limit"
        return claimed + ([probe] if probe is not None else []), results[12:-1]

    def test_a_limit_set_while_claims_and_completes_run_starts_an_exact_count_over_100_rounds(self):
        """A queue without a limit is not counted; setting one counts its RUNNING tasks with the
        task writers held off. Racing 12 claimers and 3 completers each round, the count it
        starts is exact (check() finds no drift), and claims after it obey it."""
        rounds = self.rounds // 2  # 100 on the SQL stores
        for start in range(0, 12 * rounds, 600):
            transitions.create([TaskSpec(id=f"lim-{n}", title="l", queue="late") for n in range(start, start + 600)],
                               using=self.alias)
        held: list = []
        for n in range(rounds):
            finishing, held = held[:3], held[3:]
            claimed, _ = self._race_claims_and_a_limit_being_set("late", n, [
                lambda c=c: transitions.complete(c.task.pk, c.lease.token, {}, using=self.alias) for c in finishing])
            held += claimed
            for claim in list(held):  # back under the limit for the next round
                if self.running_in("late")[0] <= 4:
                    break
                transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
                held.remove(claim)
        for claim in held:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)

    def test_a_limit_set_and_removed_while_batches_of_completions_run_keeps_an_exact_count_over_50_rounds(self):
        """Batches of completions (on PostgreSQL, those of tasks that hold nothing share one
        transaction, the others one each) race 12 claimers and a limit being set on their queue,
        which was removed before the round (so the tasks held then hold no slot): every
        completion is made, the count the limit starts is exact (check() finds no drift) and no
        claim goes over it. (Half the rounds of the race above, which runs the same change against
        single completions: the suite's time is kept under CI's budget.)"""
        rounds = self.rounds // 4  # 50 on the SQL stores
        for start in range(0, 12 * rounds, 600):
            transitions.create([TaskSpec(id=f"bat-{n}", title="b", queue="batched") for n in range(start, start + 600)],
                               using=self.alias)
        held: list = []
        for n in range(rounds):
            finishing, held = held[:9], held[9:]
            batches = [finishing[i::3] for i in range(3) if finishing[i::3]]
            claimed, answers = self._race_claims_and_a_limit_being_set("batched", n, [
                lambda b=b: transitions.complete_batch(
                    [transitions.CompleteItem(c.task.pk, c.lease.token, {}) for c in b], using=self.alias)
                for b in batches])
            for batch, done in zip(batches, answers):
                assert [getattr(t, "stage", t) for t in done] == [Stage.COMPLETED] * len(batch), f"round {n}: {done}"
            held += claimed
        for claim in held:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
        assert self.running_in("batched") == (0, 0)

    def test_a_pause_racing_claims_lets_none_start_after_it_over_100_rounds(self):
        """The brake stops claims at once: each round 12 claimers race a pause of their queue,
        and every claim that got through started before the pause's time (check()'s
        claimable_while_paused, read each round), none after."""
        rounds = self.rounds // 2
        for start in range(0, 12 * rounds, 600):
            transitions.create([TaskSpec(id=f"brake-{n}", title="b", queue="braked") for n in range(start, start + 600)],
                               using=self.alias)
        for n in range(rounds):
            calls = [lambda i=i: transitions.claim_next(f"a{i}", 600, queue="braked", using=self.alias)
                     for i in range(12)]
            calls.append(lambda: flow.change_queue("braked", paused=True, actor="op", using=self.alias))
            results = race(calls, self.alias)
            faults = [r for r in results if isinstance(r, BaseException)]
            assert not faults, f"round {n}: {faults[:3]}"
            assert selectors.problems(using=self.alias) == [], f"round {n}"
            paused_at = Queue.objects.using(self.alias).get(name="braked").paused_at
            won = [r for r in results[:12] if r is not None]
            assert all(claim.task.stage_changed_at <= paused_at for claim in won), f"round {n}"
            assert transitions.claim_next("probe", 600, queue="braked", using=self.alias) is None
            for claim in won:
                transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
            flow.change_queue("braked", paused=False, actor="op", using=self.alias)

    def test_a_waiting_claim_sees_no_ready_work_in_a_paused_full_or_rate_held_queue(self):
        """has_ready_task (a waiting claim's look) and the parked claims' poll pass over work a
        queue or key keeps back: a claim would find nothing, so nothing is woken for it."""
        from board.live.reads import ready_counts

        self.new("p1", queue="held")
        self.new("k1", queue="free", concurrency_key="one-at-a-time")
        self.new("k2", queue="free", concurrency_key="one-at-a-time")
        ready = lambda queue: selectors.has_ready_task(queue, using=self.alias)  # noqa: E731
        assert (ready("held"), ready("free")) == (True, True)
        flow.change_queue("held", paused=True, actor="op", using=self.alias)
        claim = transitions.claim_next("a", TTL, queue="free", using=self.alias)  # the key is now full
        assert (ready("held"), ready("free"), ready(None)) == (False, False, False)
        # (the parked claims' keys: a queue, or None for any, and the capabilities they claim with)
        assert ready_counts({("held", ()): 5, ("free", ()): 5, (None, ()): 5}, using=self.alias) == {
            ("held", ()): 0, ("free", ()): 0, (None, ()): 0}
        flow.change_queue("held", paused=False, rate={"count": 1, "per_seconds": 3600}, actor="op", using=self.alias)
        assert ready("held") is True
        transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
        held = transitions.claim_next("a", TTL, queue="held", using=self.alias)  # the rate is now shut
        assert (ready("held"), ready("free")) == (False, True)
        transitions.complete(held.task.pk, held.lease.token, {}, using=self.alias)

    def test_check_reports_a_task_started_after_its_queue_was_paused(self):
        self.new("slipped", queue="stopped")
        claim = transitions.claim_next("a", TTL, using=self.alias)
        flow.change_queue("stopped", paused=True, actor="op", using=self.alias)
        assert selectors.problems(using=self.alias) == []  # it started before the pause
        Queue.objects.using(self.alias).filter(name="stopped").update(
            paused_at=claim.task.stage_changed_at - timedelta(seconds=1))  # as if it slipped through
        assert [(p.task, p.code) for p in selectors.problems(using=self.alias)] == [
            ("queue:stopped", "claimable_while_paused")]
        transitions.complete("slipped", claim.lease.token, {}, using=self.alias)

    # -- rate limits (board.engine.flow: a queue's rate shard's open_at, moved by each claim) ----

    def open_rate(self, queue: str) -> None:
        """Age a queue's rate window by writing its shard: the next claim may start now."""
        assert queue_shards(queue, "rate", self.alias).update(open_at=time.time() - 1) == 1

    def test_a_rate_spaces_claims_and_a_claim_by_id_waits_for_the_next_opening(self):
        flow.change_queue("rated", rate={"count": 2, "per_seconds": 3600}, actor="op", using=self.alias)
        for n in range(3):
            self.new(f"r{n}", queue="rated")
        self.new("other")
        first = transitions.claim_next("a", TTL, queue="rated", using=self.alias)
        assert first.task.pk == "r0"
        opens = flow.counts(["rated"], using=self.alias)[1]["rated"]
        assert 1799 < opens - first.task.stage_changed_at.timestamp() <= 1800.001  # 3600 s / 2 claims
        assert transitions.claim_next("a", TTL, queue="rated", using=self.alias) is None
        assert transitions.claim_next("a", TTL, using=self.alias).task.pk == "other"  # other queues go on
        with pytest.raises(errors.Blocked) as refused:
            self.claim("r1")
        assert refused.value.details["waiting"].startswith("queue rated is at its rate 2 per 3600 s: next claim in")
        self.open_rate("rated")
        assert transitions.claim_next("a", TTL, using=self.alias).task.pk == "r1"
        transitions.complete("r0", first.lease.token, {}, using=self.alias)  # a finished task frees no opening
        assert transitions.claim_next("a", TTL, using=self.alias) is None
        overview = flow.describe(flow.with_counts([Queue.objects.using(self.alias).get(name="rated")],
                                                  using=self.alias)[0])
        assert overview["rate"] == {"count": 2, "per_seconds": 3600} and overview["next_claim_at"] is not None
        flow.change_queue("rated", rate=None, actor="op", using=self.alias)  # no rate: open at once
        assert transitions.claim_next("a", TTL, using=self.alias).task.pk == "r2"

    def test_bad_rates_are_refused_and_change_nothing(self):
        flow.change_queue("kept", rate={"count": 5, "per_seconds": 60}, actor="op", using=self.alias)
        before = (db_state(self.alias), list(Queue.objects.using(self.alias).values()),
                  list(QueueChange.objects.using(self.alias).values()))
        for bad in ({"count": 0, "per_seconds": 60}, {"count": 5}, {"count": 5, "per_seconds": 0},
                    {"count": 5, "per_seconds": 86401}, {"count": "5", "per_seconds": 60},
                    {"count": 5, "per_seconds": 60, "burst": 2}, [5, 60], 5):
            with pytest.raises(errors.InvalidRequest) as refused:
                flow.change_queue("kept", rate=bad, actor="op", using=self.alias)
            assert refused.value.field == "rate"
        assert before == (db_state(self.alias), list(Queue.objects.using(self.alias).values()),
                          list(QueueChange.objects.using(self.alias).values()))

    def test_check_reports_more_claims_in_a_window_than_the_rate_allows(self):
        flow.change_queue("watched", rate={"count": 1, "per_seconds": 3600}, actor="op", using=self.alias)
        Queue.objects.using(self.alias).filter(name="watched").update(
            updated_at=timezone.now() - timedelta(hours=2))  # the rate was set before these claims
        for n in range(2):
            self.new(f"w{n}", queue="watched")
        held = [transitions.claim_next("a", TTL, using=self.alias)]
        self.open_rate("watched")  # as if an hour had passed: it had not
        held.append(transitions.claim_next("a", TTL, using=self.alias))
        assert [(p.task, p.code) for p in selectors.problems(using=self.alias)] == [("queue:watched", "over_rate")]
        TaskEvent.objects.using(self.alias).filter(task_id="w0", verb="claim").update(
            at=timezone.now() - timedelta(hours=1, seconds=1))  # the first claim, an hour ago after all
        for claim in held:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)

    def test_16_claimers_take_exactly_the_rates_one_claim_per_window_over_200_rounds(self):
        """Each round 16 claimers race for a queue whose rate allows one claim an hour: exactly
        one wins, and an observer reading all along never sees check() report over_rate nor
        more than one claim in the window. The window is opened between rounds by writing the
        row (as an hour passing would)."""
        flow.change_queue("paced", rate={"count": 1, "per_seconds": 3600}, actor="op", using=self.alias)
        transitions.create([TaskSpec(id=f"paced-{n}", title="p", queue="paced") for n in range(self.rounds + RACERS)],
                           using=self.alias)
        with FlowObserver(self.alias, read=lambda: selectors._rate_problems(self.alias)) as seen:
            for n in range(self.rounds):
                results = race([lambda i=i: transitions.claim_next(f"agent-{i}", TTL, using=self.alias)
                                for i in range(RACERS)], self.alias)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                won = [r for r in results if r is not None]
                assert len(won) == 1, f"round {n}: {len(won)} claims in one window; the rate allows 1"
                transitions.complete(won[0].task.pk, won[0].lease.token, {}, using=self.alias)
                # The round's claim is an hour old: rewrite its history row too, or the observer
                # would rightly count two claims in the window.
                TaskEvent.objects.using(self.alias).filter(task_id=won[0].task.pk, verb="claim").update(
                    at=timezone.now() - timedelta(hours=1, seconds=1))
                self.open_rate("paced")
        assert seen["problems"] == [] and seen["reads"] > 0
        assert Task.objects.using(self.alias).filter(queue="paced", stage=Stage.COMPLETED).count() == self.rounds

    # -- the claim order: priority, aging, fairness keys (board.engine.fairness) ----------------

    def claim_order(self, queue: str, count: int) -> list[str]:
        order = []
        for _ in range(count):
            claim = transitions.claim_next("agent", TTL, queue=queue, using=self.alias)
            assert claim is not None
            order.append(claim.task.pk)
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
        return order

    def created_ago(self, task_id: str, seconds: float) -> None:
        """Write the row as if the task had been created `seconds` ago (its rank with it)."""
        task = Task.objects.using(self.alias).get(pk=task_id)
        Task.objects.using(self.alias).filter(pk=task_id).update(
            created_at=task.created_at - timedelta(seconds=seconds), claim_rank=task.claim_rank - seconds)

    def test_two_plans_submitted_together_take_turns_and_a_weight_gives_more_turns(self):
        transitions.create([TaskSpec(id=f"big-{n:02}", title="b", queue="plans", fairness_key="plan:big")
                            for n in range(20)], using=self.alias)
        transitions.create([TaskSpec(id=f"small-{n}", title="s", queue="plans", fairness_key="plan:small")
                            for n in range(3)], using=self.alias)
        # Without keys the 3-task plan would start after all 20 (oldest first).
        assert self.claim_order("plans", 6) == ["big-00", "small-0", "big-01", "small-1", "big-02", "small-2"]
        # A key of weight 3 gets three turns for another key's one.
        transitions.create([TaskSpec(id=f"heavy-{n:02}", title="h", queue="weighted", fairness_key="heavy",
                                     fairness_weight=3) for n in range(12)], using=self.alias)
        transitions.create([TaskSpec(id=f"light-{n:02}", title="l", queue="weighted", fairness_key="light")
                            for n in range(12)], using=self.alias)
        assert self.claim_order("weighted", 8) == ["heavy-00", "light-00", "heavy-01", "heavy-02", "heavy-03",
                                                   "light-01", "heavy-04", "heavy-05"]
        assert FairnessKey.objects.using(self.alias).get(name="heavy").weight == 3
        assert not FairnessKey.objects.using(self.alias).filter(name="light").exists()  # weight 1: no row

    def test_a_key_that_has_nothing_waiting_starts_again_at_now(self):
        self.new("k-0", queue="again", fairness_key="k")
        self.new("k-1", queue="again", fairness_key="k")
        assert self.claim_order("again", 2) == ["k-0", "k-1"]
        self.new("other", queue="again")
        later = self.new("k-2", queue="again", fairness_key="k")
        # Not two turns after k-1: its line was empty, so its wait starts at its creation.
        assert later.claim_rank == pytest.approx(later.created_at.timestamp(), abs=0.01)
        assert self.claim_order("again", 2) == ["other", "k-2"]

    def test_priority_comes_first_until_a_minute_of_waiting_per_level_makes_up_for_it(self):
        self.new("low", queue="aging")
        self.new("high", queue="aging", priority=1)
        assert self.claim_order("aging", 2) == ["high", "low"]  # created together: priority decides
        self.new("low-59", queue="aging")
        self.created_ago("low-59", 59)
        self.new("high-b", queue="aging", priority=1)
        assert self.claim_order("aging", 2) == ["high-b", "low-59"]  # 59 s of waiting: not yet a level
        self.new("low-61", queue="aging")
        self.created_ago("low-61", 61)
        self.new("high-c", queue="aging", priority=1)
        assert self.claim_order("aging", 2) == ["low-61", "high-c"]  # 61 s: more than one level

    def test_a_task_waits_from_when_it_may_run(self):
        later = timezone.now() + timedelta(hours=1)
        scheduled = self.new("scheduled", queue="timed", run_at=later)
        assert scheduled.claim_rank == pytest.approx(later.timestamp(), abs=0.01)  # no aging before run_at
        self.new("dep", queue="timed")
        waiting = self.new("after-dep", queue="timed", deps=["dep"])
        self.created_ago("after-dep", 3600)  # an hour PENDING
        [done] = self.claim_order("timed", 1)
        assert done == "dep"
        admitted = Task.objects.using(self.alias).get(pk="after-dep")
        assert admitted.stage == Stage.QUEUED and waiting.stage == Stage.PENDING
        # Admitted now: its wait starts now, not an hour ago.
        assert admitted.claim_rank >= timezone.now().timestamp() - 60

    def test_a_snoozed_task_waits_from_the_snoozes_end_and_a_released_one_keeps_its_place(self):
        snoozed, released = self.new("snoozed", queue="back"), self.new("released", queue="back")
        for task in (snoozed, released):
            claim = self.claim(task.pk)
            if task.pk == "snoozed":
                transitions.release(task.pk, claim.lease.token, retry_after_seconds=3600, using=self.alias)
            else:
                transitions.release(task.pk, claim.lease.token, using=self.alias)
        back = {t.pk: t for t in Task.objects.using(self.alias).filter(queue="back")}
        assert back["released"].claim_rank == released.claim_rank  # back in its place
        # Waiting from the snooze's end: no priority gained for the hour it could not run.
        assert back["snoozed"].claim_rank == pytest.approx(back["snoozed"].not_before.timestamp(), abs=0.01)

    def test_16_first_creates_of_a_weighted_key_all_succeed_and_make_one_row(self):
        results = race([lambda i=i: transitions.create(TaskSpec(id=f"w-{i}", title="w", fairness_key="plan:new",
                                                                  fairness_weight=4), using=self.alias)
                        for i in range(RACERS)], self.alias)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert list(FairnessKey.objects.using(self.alias).values_list("name", "weight")) == [("plan:new", 4)]
        assert Task.objects.using(self.alias).filter(fairness_key="plan:new").count() == RACERS

    def test_bad_fairness_fields_are_refused_and_change_nothing(self):
        self.new("existing", fairness_key="plan", fairness_weight=2)
        before = (db_state(self.alias), list(FairnessKey.objects.using(self.alias).values_list("name", "weight")))
        for fields, field in ((dict(fairness_key="plan", fairness_weight=0), "fairness_weight"),
                              (dict(fairness_key="plan", fairness_weight=True), "fairness_weight"),
                              (dict(fairness_key="plan", fairness_weight=1001), "fairness_weight"),
                              (dict(fairness_weight=2), "fairness_weight"),
                              (dict(fairness_key=""), "fairness_key"),
                              (dict(fairness_key="x" * 201), "fairness_key"),
                              (dict(fairness_key="tab\there"), "fairness_key")):
            with pytest.raises(errors.InvalidRequest) as refused:
                transitions.create(TaskSpec(title="bad", **fields), using=self.alias)
            assert refused.value.field == field, fields
        assert (db_state(self.alias),
                list(FairnessKey.objects.using(self.alias).values_list("name", "weight"))) == before

    def test_16_threads_creating_and_claiming_two_plans_lose_no_task_over_200_rounds(self):
        """Each round 8 creators (4 per plan) and 8 claimers are released together: every task
        is claimed exactly once, and an observer reading check() all along never sees a task
        ranked before its creation (rank_before_creation) nor any other problem."""
        created: list[str] = []
        claimed: list[str] = []

        def create(n: int, i: int):
            task_id = f"race-{n}-{i}"
            transitions.create(TaskSpec(id=task_id, title="r", queue="fair-race",
                                        fairness_key=f"plan:{i % 2}"), using=self.alias)
            return task_id

        def claim(i: int):
            got = transitions.claim_next(f"agent-{i}", TTL, queue="fair-race", using=self.alias)
            if got is not None:
                transitions.complete(got.task.pk, got.lease.token, {}, using=self.alias)
                return got.task.pk
            return None

        def read() -> list:
            if stores.store(self.alias).speaks_sql:
                return selectors.problems(using=self.alias)  # the suspects, by indexed SQL
            # MongoDB's problems() reads every task (no SQL to find the suspects), a board that
            # grows each round: read the waiting tasks, the ones a claim order can rank wrongly.
            waiting = selectors._check_rows(Task.objects.using(self.alias).filter(stage__in=["PENDING", "QUEUED"]))
            return invariants.check(list(selectors._task_snapshots(waiting, {})), timezone.now())

        with FlowObserver(self.alias, read=read) as seen:
            for n in range(self.rounds):
                results = race([lambda i=i, n=n: create(n, i) for i in range(RACERS // 2)]
                               + [lambda i=i: claim(i) for i in range(RACERS // 2)], self.alias)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                created += results[:RACERS // 2]
                claimed += [r for r in results[RACERS // 2:] if r is not None]
        claimed += self.claim_order("fair-race", len(created) - len(claimed))
        assert sorted(claimed) == sorted(created) and len(set(claimed)) == len(created) == self.rounds * RACERS // 2
        assert transitions.claim_next("agent", TTL, queue="fair-race", using=self.alias) is None
        assert seen["problems"] == [] and seen["reads"] > 0

    def test_check_reports_a_task_ranked_before_its_creation(self):
        self.new("honest")
        jumper = self.new("jumper")
        assert selectors.problems(using=self.alias) == []
        Task.objects.using(self.alias).filter(pk="jumper").update(claim_rank=jumper.claim_rank - 3600)
        assert [(p.task, p.code) for p in selectors.problems(using=self.alias)] == [("jumper", "rank_before_creation")]
        Task.objects.using(self.alias).filter(pk="jumper").update(claim_rank=jumper.claim_rank)

    # -- rate keys (board.engine.flow: a RateKey's rate_open_at, moved by each claim of its tasks) --

    def open_rate_key(self, key: str) -> None:
        """Age a rate key's window by writing its row: the next claim of its tasks may start now."""
        assert RateKey.objects.using(self.alias).filter(name=key).update(rate_open_at=time.time() - 1) == 1

    def test_a_rate_key_spaces_the_claims_of_its_tasks_across_queues(self):
        flow.change_rate_key("provider:llm", rate={"count": 2, "per_seconds": 3600}, actor="op", using=self.alias)
        self.new("k0", queue="qa", rate_key="provider:llm")
        self.new("k1", queue="qb", rate_key="provider:llm")
        self.new("k2", queue="qa", rate_key="provider:llm")
        self.new("free", queue="qb")
        first = self.claim_next()
        assert first.task.pk == "k0" and first.task.rate_key == "provider:llm"
        opens = RateKey.objects.using(self.alias).get(name="provider:llm").rate_open_at
        assert abs(opens - first.task.stage_changed_at.timestamp() - 1800) < 0.01  # one interval past the claim
        assert self.claim_next().task.pk == "free"  # k1 (another queue) is held by the key; the pick skips it
        assert self.claim_next() is None
        assert not selectors.has_ready_task("qa", using=self.alias)  # a waiting claim does not wait on it
        with pytest.raises(errors.Blocked) as refused:
            self.claim("k1")
        assert refused.value.details["waiting"].startswith("provider:llm is at its rate 2 per 3600 s: next claim in")
        assert self.stage("k1") == Stage.QUEUED
        self.open_rate_key("provider:llm")
        assert self.claim_next().task.pk == "k1"
        transitions.complete("k0", first.lease.token, {}, using=self.alias)  # a finished task frees no opening
        assert self.claim_next() is None
        shown = flow.describe_rate_key(RateKey.objects.using(self.alias).get(name="provider:llm"))
        assert shown["rate"] == {"count": 2, "per_seconds": 3600} and shown["next_claim_at"] is not None
        flow.change_rate_key("provider:llm", rate=None, actor="op2", reason="lifted", using=self.alias)
        assert self.claim_next().task.pk == "k2"  # no rate: open at once
        history = list(RateKeyChange.objects.using(self.alias).filter(key="provider:llm").order_by("at", "pk")
                       .values_list("actor", "reason", "changes"))
        assert history == [("op", "", {"rate": [None, {"count": 2, "per_seconds": 3600}]}),
                           ("op2", "lifted", {"rate": [{"count": 2, "per_seconds": 3600}, None]})]

    def test_a_rate_key_without_a_rate_holds_nothing_back_and_its_row_is_not_written(self):
        for n in range(3):
            self.new(f"u{n}", queue=f"q{n}", rate_key="unset")
        assert [self.claim_next().task.pk for _ in range(3)] == ["u0", "u1", "u2"]
        key = RateKey.objects.using(self.alias).get(name="unset")
        assert (key.rate_count, key.rate_interval, key.rate_open_at) == (None, None, None)

    def test_a_queue_rate_and_a_rate_key_both_hold_a_task_back(self):
        flow.change_queue("slow", rate={"count": 1, "per_seconds": 3600}, actor="op", using=self.alias)
        flow.change_rate_key("shared", rate={"count": 1, "per_seconds": 3600}, actor="op", using=self.alias)
        self.new("s0", queue="slow", rate_key="shared")
        self.new("s1", queue="slow", rate_key="shared")
        assert self.claim_next().task.pk == "s0"
        self.open_rate("slow")
        assert self.claim_next() is None  # the queue is open, the key is not
        self.open_rate_key("shared")
        queue_shards("slow", "rate", self.alias).update(open_at=time.time() + 3600)
        assert self.claim_next() is None  # the key is open, the queue is not
        self.open_rate("slow")
        assert self.claim_next().task.pk == "s1"
        # Both claims are an hour apart after all (check() would rightly see two in one window).
        TaskEvent.objects.using(self.alias).filter(task_id="s0", verb="claim").update(
            at=timezone.now() - timedelta(hours=1, seconds=1))

    def test_bad_rate_keys_are_refused_and_change_nothing(self):
        flow.change_rate_key("kept", rate={"count": 5, "per_seconds": 60}, actor="op", using=self.alias)
        before = (db_state(self.alias), list(RateKey.objects.using(self.alias).values()),
                  list(RateKeyChange.objects.using(self.alias).values()))
        for bad in ({"count": 0, "per_seconds": 60}, {"count": 5}, {"count": 5, "per_seconds": 0},
                    {"count": 5, "per_seconds": 86401}, {"count": "5", "per_seconds": 60}, [5, 60], 5):
            with pytest.raises(errors.InvalidRequest) as refused:
                flow.change_rate_key("kept", rate=bad, actor="op", using=self.alias)
            assert refused.value.field == "rate"
        for name in ("", "k" * 201, "a\nb"):
            with pytest.raises(errors.InvalidRequest):
                flow.change_rate_key(name, rate={"count": 1, "per_seconds": 1}, actor="op", using=self.alias)
        for key in ("", "k" * 201, "tab\there", 7):
            with pytest.raises(errors.InvalidRequest) as refused:
                self.new("refused", rate_key=key)
            assert refused.value.field == "rate_key"
        assert before == (db_state(self.alias), list(RateKey.objects.using(self.alias).values()),
                          list(RateKeyChange.objects.using(self.alias).values()))

    def test_check_reports_claims_of_a_rate_key_closer_than_its_interval(self):
        flow.change_rate_key("watched", rate={"count": 2, "per_seconds": 3600}, actor="op", using=self.alias)
        RateKey.objects.using(self.alias).filter(name="watched").update(
            updated_at=timezone.now() - timedelta(hours=2))  # the rate was set before these claims
        self.new("w0", queue="qa", rate_key="watched")
        self.new("w1", queue="qb", rate_key="watched")
        held = [self.claim_next()]
        self.open_rate_key("watched")  # as if half an hour had passed: it had not
        held.append(self.claim_next())
        # Two claims in the window are within the count (2 an hour), but not 30 minutes apart.
        assert [(p.task, p.code) for p in selectors.problems(using=self.alias)] == [("rate_key:watched", "over_rate")]
        TaskEvent.objects.using(self.alias).filter(task_id="w0", verb="claim").update(
            at=timezone.now() - timedelta(minutes=30, seconds=1))  # the first claim, half an hour ago after all
        assert selectors.problems(using=self.alias) == []
        for claim in held:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)

    def test_16_claimers_of_two_queues_take_exactly_one_claim_of_a_rate_key_per_interval_over_200_rounds(self):
        """Tasks of two queues share a rate key allowing one claim an hour. Each round 16
        claimers race: exactly one wins, the key's next opening is exactly an hour past that
        claim, and an observer reading all along never sees check() report claims of the key
        closer than its interval. The window is opened between rounds by writing the row (as an
        hour passing would)."""
        flow.change_rate_key("provider:paced", rate={"count": 1, "per_seconds": 3600}, actor="op", using=self.alias)
        transitions.create([TaskSpec(id=f"rk-{n}", title="p", queue=f"rq{n % 2}", rate_key="provider:paced")
                            for n in range(self.rounds + RACERS)], using=self.alias)
        queues = Counter()
        with FlowObserver(self.alias, read=lambda: selectors._rate_key_problems(self.alias)) as seen:
            for n in range(self.rounds):
                results = race([lambda i=i: transitions.claim_next(f"agent-{i}", TTL, using=self.alias)
                                for i in range(RACERS)], self.alias)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                won = [r for r in results if r is not None]
                assert len(won) == 1, f"round {n}: {len(won)} claims in one interval; the rate key allows 1"
                opens = RateKey.objects.using(self.alias).get(name="provider:paced").rate_open_at
                assert abs(opens - won[0].task.stage_changed_at.timestamp() - 3600) < 0.01, f"round {n}"
                queues[won[0].task.queue] += 1
                transitions.complete(won[0].task.pk, won[0].lease.token, {}, using=self.alias)
                # The round's claim is an hour old: rewrite its history row too, or the observer
                # would rightly see two claims closer than the interval.
                TaskEvent.objects.using(self.alias).filter(task_id=won[0].task.pk, verb="claim").update(
                    at=timezone.now() - timedelta(hours=1, seconds=1))
                self.open_rate_key("provider:paced")
        assert seen["problems"] == [] and seen["reads"] > 0
        assert sum(queues.values()) == self.rounds and min(queues.values()) > self.rounds // 4, queues  # both queues
        claims = TaskEvent.objects.using(self.alias).filter(task__rate_key="provider:paced", verb="claim")
        assert claims.count() == self.rounds

    # -- dedup keys (board.engine.transitions.creation; the live tasks' unique index) ----------

    def test_a_create_with_a_live_dedup_key_returns_that_task_and_creates_nothing(self):
        first = self.new("d1", dedup_key="nightly:2026-12-04")
        assert first.deduplicated is False
        before = db_state(self.alias)
        again = transitions.create(TaskSpec(id="d2", title="other", dedup_key="nightly:2026-12-04"),
                                   using=self.alias)
        assert [(t.pk, t.deduplicated) for t in again] == [("d1", True)]
        assert db_state(self.alias) == before  # nothing written, not even a history row
        claim = self.claim("d1")
        assert transitions.create(TaskSpec(title="x", dedup_key="nightly:2026-12-04"),
                                  using=self.alias)[0].pk == "d1"  # RUNNING is live
        transitions.complete("d1", claim.lease.token, {}, using=self.alias)
        fresh = transitions.create(TaskSpec(id="d3", title="after", dedup_key="nightly:2026-12-04"),
                                   using=self.alias)
        assert [(t.pk, t.deduplicated) for t in fresh] == [("d3", False)]  # a finished task frees it

    def test_a_batch_depends_on_the_live_task_that_stands_in_for_a_deduplicated_spec(self):
        self.new("live-build", dedup_key="build:abc")
        made = transitions.create([TaskSpec(id="build", title="b", dedup_key="build:abc"),
                                   TaskSpec(id="test", title="t", deps=["build"]),
                                   TaskSpec(id="ship", title="s", deps=["build", "test"])], using=self.alias)
        assert [(t.pk, t.deduplicated) for t in made] == [("live-build", True), ("test", False), ("ship", False)]
        assert not Task.objects.using(self.alias).filter(pk="build").exists()
        assert sorted(selectors.deps_of(["test", "ship"], using=self.alias).items()) == [
            ("ship", ["live-build", "test"]), ("test", ["live-build"])]
        claim = self.claim("live-build")
        transitions.complete("live-build", claim.lease.token, {}, using=self.alias)
        assert self.stage("test") == Stage.QUEUED  # admitted by its stand-in's completion

    def test_the_store_itself_refuses_a_second_live_task_with_one_dedup_key(self):
        """The index, not the engine's look, is what makes racing creators safe: written past
        the engine, a second live row with the key is refused; a finished one is not counted."""
        now = timezone.now()
        row = dict(title="t", dedup_key="k", created_at=now, updated_at=now)
        Task.objects.using(self.alias).create(id="done", stage=Stage.COMPLETED, **row)
        Task.objects.using(self.alias).create(id="live", stage=Stage.QUEUED, **row)
        with pytest.raises(IntegrityError), transaction.atomic(using=self.alias):
            Task.objects.using(self.alias).create(id="twin", stage=Stage.PAUSED, **row)
        assert sorted(Task.objects.using(self.alias).values_list("pk", flat=True)) == ["done", "live"]
        Task.objects.using(self.alias).filter(pk="done").delete()
        Task.objects.using(self.alias).filter(pk="live").update(stage=Stage.CANCELLED)

    def test_bad_dedup_keys_are_refused_and_change_nothing(self):
        self.new("kept", dedup_key="k")
        before = db_state(self.alias)
        for key in ("", "x" * 201, "tab\there", 7):
            with pytest.raises(errors.InvalidRequest) as refused:
                self.new("bad", dedup_key=key)
            assert refused.value.field == "dedup_key"
        with pytest.raises(errors.InvalidRequest, match="appears twice"):
            transitions.create([TaskSpec(title="a", dedup_key="same"), TaskSpec(title="b", dedup_key="same")],
                               using=self.alias)
        assert db_state(self.alias) == before

    def test_a_failed_task_is_not_requeued_while_another_live_task_holds_its_key(self):
        self.new("old", dedup_key="report", max_retries=0)
        claim = self.claim("old")
        transitions.fail("old", claim.lease.token, "boom", retryable=False, using=self.alias)
        self.new("new", dedup_key="report")  # the failed task freed the key
        with pytest.raises(errors.InvalidTransition) as refused:
            transitions.requeue("old", actor="op", reset_attempts=True, using=self.alias)
        assert (refused.value.field, refused.value.details["held_by"]) == ("dedup_key", "new")
        transitions.cancel("new", actor="op", using=self.alias)
        assert transitions.requeue("old", actor="op", reset_attempts=True, using=self.alias).stage == Stage.QUEUED

    def test_16_creators_of_one_dedup_key_make_one_task_over_200_rounds(self):
        """Each round 16 creators of one key (each its own id) are released together: exactly
        one task is made, and every creator gets it back. An observer reading all along never
        sees two live tasks with one key (check()'s shared_dedup_key)."""
        with FlowObserver(self.alias, read=lambda: selectors._dedup_problems(self.alias)) as seen:
            for n in range(self.rounds):
                key = f"once-{n}"
                results = race([lambda i=i: transitions.create(
                    TaskSpec(id=f"once-{n}-{i}", title="o", dedup_key=key), using=self.alias)[0]
                    for i in range(RACERS)], self.alias)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                made = Task.objects.using(self.alias).filter(dedup_key=key)
                assert made.count() == 1, f"round {n}: {made.count()} tasks made"
                assert {r.pk for r in results} == {made.get().pk}
                assert sum(not r.deduplicated for r in results) == 1, f"round {n}"
                if n % 2:  # every other round the task finishes, so that the next key's race
                    claim = self.claim(made.get().pk)  # also meets finished tasks
                    transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
        assert seen["problems"] == [] and seen["reads"] > 0

    # -- resource leases (issue 32, item 1) ------------------------------------------------------

    def test_a_claim_takes_its_resources_and_every_way_out_gives_them_back(self):
        """A task whose resource is held elsewhere is not claimable (claim_next passes it by; a
        claim of it is Blocked, naming the holder); each way out of RUNNING frees the resource."""
        a = self.alias
        self.new("other", queue="elsewhere")
        ways_out = {
            "complete": lambda c: transitions.complete(c.task.pk, c.lease.token, {}, using=a),
            "fail": lambda c: transitions.fail(c.task.pk, c.lease.token, "boom", using=a),
            "release": lambda c: transitions.release(c.task.pk, c.lease.token, using=a),
            "pause": lambda c: transitions.pause(c.task.pk, c.lease.token, {"at": 1}, using=a),
            "cancel": lambda c: transitions.cancel(c.task.pk, actor="op", using=a),
            "force_release": lambda c: transitions.force_release(c.task.pk, actor="op", using=a),
            "expiry": lambda c: (expire_lease(c.task.pk, a), transitions.reclaim_expired(using=a)),
        }
        for n, (way, leave) in enumerate(ways_out.items()):
            self.new(f"first-{n}", queue=f"merges-{n}", resources=["merge-slot"], priority=10)
            self.new(f"second-{n}", queue=f"merges-{n}", resources=["merge-slot"])
            held = transitions.claim_next("agent-1", TTL, queue=f"merges-{n}", using=a)
            assert held.task.pk == f"first-{n}" and held.task.resources == ["merge-slot"]
            assert transitions.claim_next("agent-2", TTL, queue=f"merges-{n}", using=a) is None, way
            with pytest.raises(errors.Blocked) as refused:
                self.claim(f"second-{n}")
            assert refused.value.details["waiting"] == f"resource merge-slot held by agent-1 (task first-{n})", way
            assert resources.holder_of(a, "merge-slot", f"first-{n}", held.lease.fence)["holds"] is True
            leave(held)
            assert resources.holder_of(a, "merge-slot", f"first-{n}", held.lease.fence)["holds"] is False, way
            second = self.claim(f"second-{n}", "agent-2")  # first-n may be back in the line: named
            transitions.complete(second.task.pk, second.lease.token, {}, using=a)
        row = Resource.objects.using(a).get(name="merge-slot")
        assert (row.held, row.intents) == (0, 0)

    def test_a_takeover_moves_the_resources_to_the_new_holder_and_its_fence(self):
        a = self.alias
        self.new("t", resources=["branch:main"])
        first = self.claim("t", "agent-1")
        expire_lease("t", a)
        second = self.claim("t", "agent-2")  # a takeover: the expired lease is taken back
        assert second.lease.fence == first.lease.fence + 1
        assert resources.holder_of(a, "branch:main", "t", first.lease.fence)["holds"] is False
        assert resources.holder_of(a, "branch:main", "t", second.lease.fence)["holds"] is True
        [listed] = [r for r in resources.holders(a) if r["name"] == "branch:main"]
        assert [(h["task"], h["agent"], h["fence"], h["exclusive"]) for h in listed["holders"]] == [
            ("t", "agent-2", second.lease.fence, True)]
        assert listed["held"] == "exclusive"
        transitions.complete("t", second.lease.token, {}, using=a)
        [listed] = [r for r in resources.holders(a) if r["name"] == "branch:main"]
        assert (listed["held"], listed["holders"]) == (0, [])

    def test_shared_units_fit_the_capacity_and_an_exclusive_hold_waits_for_all(self):
        a = self.alias
        resources.change_capacity("gpu", 2, actor="op", using=a)
        for n in range(3):
            self.new(f"share-{n}", resources=[{"name": "gpu", "units": 1}], priority=5)
        self.new("whole", resources=["gpu"])
        taken = [self.claim_next(f"agent-{n}") for n in range(3)]
        assert [c.task.pk for c in taken[:2]] == ["share-0", "share-1"] and taken[2] is None
        transitions.complete("share-0", taken[0].lease.token, {}, using=a)
        third = self.claim_next()
        assert third.task.pk == "share-2"  # a unit came back: the waiting share takes it
        assert self.claim_next() is None  # the exclusive one waits for every shared holder
        for claim in (taken[1], third):
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)
        whole = self.claim_next()
        assert whole.task.pk == "whole"
        self.new("late-share", resources=[{"name": "gpu", "units": 2}])
        assert self.claim_next() is None  # nothing fits beside an exclusive hold
        self.new("too-big", resources=[{"name": "gpu", "units": 3}])
        with pytest.raises(errors.Blocked) as refused:
            self.claim("too-big")
        assert refused.value.details["waiting"] == "resource gpu needs 3 units; its capacity is 2"
        transitions.complete("whole", whole.lease.token, {}, using=a)
        assert self.claim_next().task.pk == "late-share"

    def test_patterns_conflict_when_they_could_match_a_common_path(self):
        """A pattern holds the subtree of the directory before its first wildcard; a name
        conflicts with a hold of its own node, of a directory above it, or (for a directory) of
        anything inside it."""
        a = self.alias
        cases = [  # (held, wanted, conflicts)
            ("file:src/app/**", "file:src/app/models.py", True),
            ("file:src/app/**", "file:src/**", True),
            ("file:src/app/**", "file:src/lib/x.py", False),
            ("file:src/app/models.py", "file:src/app/*.py", True),
            ("file:src/app/models.py", "file:src/app/views.py", False),
            ("file:src/*.py", "file:src/*.js", True),  # conservative: documented
            ("branch:main", "branch:feature/x", False),
            ("branch:feature/*", "branch:feature/x", True),
        ]
        for n, (held_name, wanted_name, conflicts) in enumerate(cases):
            self.new(f"h-{n}", queue=f"p{n}", resources=[held_name], priority=10)
            self.new(f"w-{n}", queue=f"p{n}", resources=[wanted_name])
            held = transitions.claim_next("agent-1", TTL, queue=f"p{n}", using=a)
            assert held.task.pk == f"h-{n}"
            wanted = transitions.claim_next("agent-2", TTL, queue=f"p{n}", using=a)
            assert (wanted is None) == conflicts, (held_name, wanted_name)
            for claim in (held, wanted):
                if claim is not None:
                    transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)

    def test_bad_resources_are_refused_and_change_nothing(self):
        a = self.alias
        self.new("kept", resources=["kept-slot"])
        before = db_state(a), list(Resource.objects.using(a).values_list())
        for bad in ("merge-slot", ["a b"], [""], ["x" * 201], [{"name": "gpu", "units": 0}],
                    [{"name": "gpu", "units": True}], [{"name": "gpu", "units": 10_001}], [{"units": 1}],
                    [{"name": "gpu", "extra": 1}], ["dup", "dup"], ["file:src/**", "file:src/a.py"],
                    ["*"], [f"r{n}" for n in range(17)], [5], ['say"hi']):
            with pytest.raises(errors.InvalidRequest) as refused:
                self.new("refused", resources=bad)
            assert refused.value.field == "resources", bad
        for capacity in (0, -1, "2", True, 10_001):
            with pytest.raises(errors.InvalidRequest):
                resources.change_capacity("kept-slot", capacity, actor="op", using=a)
        assert (db_state(a), list(Resource.objects.using(a).values_list())) == before

    def test_check_reports_an_orphaned_hold_and_a_double_holder(self):
        a = self.alias
        self.new("one", resources=["merge-slot"])
        self.new("two", resources=["merge-slot"])
        first = self.claim_next()
        rows = Resource.objects.using(a).filter(name="merge-slot")
        rows.update(held=0)  # written behind the engine's back: the hold is not counted
        assert [(p.task, p.code) for p in selectors.problems(using=a)] == [("resource:merge-slot", "resource_orphaned")]
        second = self.claim_next()  # the count let it through: two hold an exclusive resource
        assert second is not None
        assert sorted((p.task, p.code) for p in selectors.problems(using=a)) == [
            ("resource:merge-slot", "resource_double_held"), ("resource:merge-slot", "resource_orphaned")]
        transitions.complete("one", first.lease.token, {}, using=a)
        transitions.complete("two", second.lease.token, {}, using=a)
        rows.update(held=0)  # the two give-backs took one hold more than was counted
        assert selectors.problems(using=a) == []

    def test_16_claimers_never_hold_a_resource_twice_over_200_rounds(self):
        """Each round 16 claimers race for 16 tasks: 6 need the exclusive merge-slot, 6 a unit
        of gpu (capacity 3), 2 the pattern file:src/** and 2 file:src/a.py (one node inside
        the other's). Exactly 1 + 3 + 1 win each round; an observer reading all along (one
        consistent read each time) never sees a resource held beyond its rule, and check()
        finds no problem. Five claims, completions and creates a round: a class with fewer
        rounds (the ORM paths, MongoDB's test server, where 40 rounds took 34 s) runs half its
        rounds (25, 50); the statement paths run 200."""
        a = self.alias
        rounds = self.rounds if self.rounds == ROUNDS else self.rounds // 2
        resources.change_capacity("gpu", 3, actor="op", using=a)
        kinds = [["merge-slot"]] * 6 + [[{"name": "gpu", "units": 1}]] * 6 + [["file:src/**"]] * 2 + [["file:src/a.py"]] * 2
        made = Counter()

        def top_up(kind_indexes) -> None:
            specs = []
            for k in kind_indexes:
                specs.append(TaskSpec(id=f"res-{k}-{made[k]}", title="r", resources=kinds[k]))
                made[k] += 1
            transitions.create(specs, using=a)

        top_up(range(len(kinds)))
        kind_of = lambda task_id: int(task_id.split("-")[1])  # noqa: E731

        def read() -> list:
            running = Task.objects.using(a).filter(stage=Stage.RUNNING, resources__isnull=False).values_list("pk", flat=True)
            kinds_running = Counter(("merge" if k < 6 else "gpu" if k < 12 else "file") for k in map(kind_of, running))
            over = [(name, n) for name, n in kinds_running.items() if n > {"merge": 1, "gpu": 3, "file": 1}[name]]
            return selectors._resource_problems(a) + over

        with FlowObserver(a, read) as seen:
            for n in range(rounds):
                results = race([lambda i=i: transitions.claim_next(f"agent-{i}", TTL, using=a)
                                for i in range(RACERS)], a)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                won = [r for r in results if r is not None]
                groups = Counter(("merge" if k < 6 else "gpu" if k < 12 else "file") for k in
                                 (kind_of(c.task.pk) for c in won))
                assert groups == {"merge": 1, "gpu": 3, "file": 1}, f"round {n}: {groups}"
                for claim in won:
                    transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)
                top_up([kind_of(c.task.pk) for c in won])
        assert seen["problems"] == [] and seen["reads"] > 0
        assert Task.objects.using(a).filter(stage=Stage.COMPLETED).count() == 5 * rounds
        assert list(Resource.objects.using(a).filter(Q(held__gt=0) | Q(intents__gt=0))) == []

    # -- capabilities (issue 32, item 3) ----------------------------------------------------------

    def test_a_claim_takes_only_tasks_whose_requirements_it_holds(self):
        """Every way of claiming (next, a batch, after a completion, by id, resume) takes a task
        only when the claimer holds all it requires; the first in line it cannot take is passed
        by, and a claim by id of it is 403 with nothing written."""
        a = self.alias
        self.new("g", requires=["gpu"], priority=9)
        self.new("gp", requires=["python", "gpu", "gpu"], priority=8)
        self.new("p", requires=["python"], priority=7)
        self.new("free", priority=0)
        assert Task.objects.using(a).get(pk="gp").requires == ["gpu", "python"]  # sorted, each once
        before = db_state(a)
        with pytest.raises(errors.Forbidden, match="lacks gpu"):
            transitions.claim("g", "agent", TTL, capabilities=("python",), using=a)
        with pytest.raises(errors.Forbidden, match="lacks gpu, python"):
            transitions.claim("gp", "agent", TTL, using=a)
        assert db_state(a) == before
        plain = transitions.claim_next("plain", TTL, using=a)
        assert plain.task.pk == "free"
        assert transitions.claim_next("plain", TTL, using=a) is None  # the rest all require something
        python = transitions.claim_next("py", TTL, capabilities=("python",), using=a)
        assert python.task.pk == "p"
        both = transitions.claim_batch("both", TTL, 5, capabilities=("gpu", "python"), using=a)
        assert [c.task.pk for c in both] == ["g", "gp"]
        transitions.complete(plain.task.pk, plain.lease.token, {}, using=a)
        self.new("g2", requires=["gpu"])
        self.new("p2", requires=["python"], priority=1)
        done, following = transitions.complete_and_claim(
            python.task.pk, python.lease.token, {}, transitions.NextClaim(ttl_seconds=TTL), agent="py",
            capabilities=("python",), using=a)
        assert done.stage == Stage.COMPLETED and following.task.pk == "p2"
        transitions.pause(following.task.pk, following.lease.token, {"at": 1}, using=a)
        with pytest.raises(errors.Forbidden):
            transitions.resume("p2", "gpu-only", TTL, capabilities=("gpu",), using=a)
        resumed = transitions.resume("p2", "py", TTL, capabilities=("python",), using=a)
        by_id = transitions.claim("g2", "gpu-agent", TTL, capabilities=("gpu",), using=a)
        for claim in [*both, resumed, by_id]:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)

    def test_preferences_re_rank_only_the_head_of_the_line_for_a_claimer_holding_them(self):
        """A preferred label worth w counts as w priority levels for a claimer holding it, among
        the first PREFER_WINDOW tasks it could take; never for one without it, nor from further
        back in the line."""
        a = self.alias
        self.new("first", priority=1)
        self.new("liked", prefers={"model:opus": 2})
        self.new("listed", prefers=["model:opus"])
        assert Task.objects.using(a).get(pk="listed").prefers == {"model:opus": 1}
        other = transitions.claim_next("other", TTL, capabilities=("python",), using=a)
        assert other.task.pk == "first"  # holds none of the preferred labels: the line's order
        opus = transitions.claim_next("opus", TTL, capabilities=("model:opus",), using=a)
        assert opus.task.pk == "liked"
        for claim in (other, opus):
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)
        window = capabilities.PREFER_WINDOW
        transitions.create([TaskSpec(id=f"pad-{i:02d}", title="pad", priority=5) for i in range(window)], using=a)
        self.new("far", prefers={"model:opus": 10})  # worth 10 levels: 18th in line, behind "listed"
        claims = [transitions.claim_next("opus", TTL, capabilities=("model:opus",), using=a)
                  for _ in range(window + 2)]
        # pad-00 and pad-01 while "far" is past the window; then it is 16th, and its 10 levels lift
        # it over the 14 pads left (5 levels each); "listed" (1 level) stays behind them.
        assert [c.task.pk for c in claims] == ["pad-00", "pad-01", "far", *[f"pad-{i:02d}" for i in range(2, window)],
                                               "listed"]
        for claim in claims:
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)

    def test_bad_requirements_and_preferences_are_refused_and_change_nothing(self):
        a = self.alias
        self.new("t0")
        before = db_state(a)
        for fields, field in [({"requires": ["no spaces"]}, "requires"), ({"requires": "gpu"}, "requires"),
                              ({"requires": [f"l{i}" for i in range(9)]}, "requires"),
                              ({"requires": ["x" * 61]}, "requires"),
                              ({"prefers": {"gpu": 0}}, "prefers"), ({"prefers": {"gpu": 11}}, "prefers"),
                              ({"prefers": {"gpu": True}}, "prefers"), ({"prefers": "gpu"}, "prefers"),
                              ({"prefers": {"bad label": 1}}, "prefers")]:
            with pytest.raises(errors.InvalidRequest) as refused:
                self.new("t1", **fields)
            assert refused.value.field == field, fields
        assert db_state(a) == before
        with pytest.raises(errors.Forbidden, match="does not carry the capabilities gpu"):
            capabilities.narrowed(("python",), ["gpu"])
        assert capabilities.narrowed(("gpu", "python"), ["python"]) == ("python",)

    def test_check_reports_a_task_that_no_key_seen_in_the_last_hour_can_take(self):
        a = self.alias
        self.new("needs", requires=["gpu", "python"])
        unclaimable = lambda: [p.code for p in selectors.problems(using=a) if p.task == "needs"]  # noqa: E731
        assert unclaimable() == [invariants.UNCLAIMABLE_REQUIREMENTS]
        row, _ = agent_keys.create_key("gpu-box", capabilities="gpu,python,cuda", using=a)
        assert unclaimable() == [invariants.UNCLAIMABLE_REQUIREMENTS]  # never used yet
        now = timezone.now()
        AgentKey.objects.using(a).filter(pk=row.pk).update(last_used_at=now - timedelta(hours=2))
        assert unclaimable() == [invariants.UNCLAIMABLE_REQUIREMENTS]  # not seen in the last hour
        AgentKey.objects.using(a).filter(pk=row.pk).update(last_used_at=now - timedelta(minutes=5))
        assert unclaimable() == []
        agent_keys.set_capabilities(row.pk, "gpu", using=a)
        assert unclaimable() == [invariants.UNCLAIMABLE_REQUIREMENTS]
        transitions.cancel("needs", actor="op", using=a)

    def test_16_claimers_of_four_capability_sets_take_only_what_they_can_over_200_rounds(self):
        """Each round 16 claimers (4 holding nothing, 4 gpu, 4 python, 4 both) race for 16 tasks
        (4 of each requirement, in one line). No claim takes a task its claimer cannot; a claimer
        that got nothing could take none of the tasks left; an observer reading the RUNNING tasks
        all along never sees a holder without what its task requires. A class with fewer rounds
        (the ORM paths, MongoDB's test server) runs half its rounds, as the resources' race."""
        a = self.alias
        rounds = self.rounds if self.rounds == ROUNDS else self.rounds // 2
        sets = [(), ("gpu",), ("python",), ("gpu", "python")]
        holds = {f"agent-{i}": sets[i % 4] for i in range(RACERS)}
        made = Counter()

        def top_up(kinds) -> None:
            specs = []
            for k in kinds:
                specs.append(TaskSpec(id=f"cap-{k}-{made[k]}", title="c", requires=list(sets[k]) or None))
                made[k] += 1
            transitions.create(specs, using=a)

        top_up([k for k in range(4) for _ in range(4)])
        requires_of = lambda task_id: sets[int(task_id.split("-")[1])]  # noqa: E731

        def read() -> list:
            running = Task.objects.using(a).filter(stage=Stage.RUNNING).values_list("pk", "owner")
            return [(pk, owner) for pk, owner in running if not set(requires_of(pk)) <= set(holds[owner])]

        with FlowObserver(a, read) as seen:
            for n in range(rounds):
                results = race([lambda i=i: transitions.claim_next(f"agent-{i}", TTL, capabilities=holds[f"agent-{i}"],
                                                                   using=a) for i in range(RACERS)], a)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                won = [r for r in results if r is not None]
                assert all(set(requires_of(c.task.pk)) <= set(holds[c.task.owner]) for c in won), f"round {n}"
                assert len({c.task.pk for c in won}) == len(won)
                left = list(Task.objects.using(a).filter(stage=Stage.QUEUED).values_list("pk", flat=True))
                assert len(left) + len(won) == 16, f"round {n}"
                for i, result in enumerate(results):
                    if result is None:  # nothing it could take was left
                        assert not [pk for pk in left if set(requires_of(pk)) <= set(sets[i % 4])], f"round {n}"
                for claim in won:
                    transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)
                top_up([sets.index(requires_of(c.task.pk)) for c in won])
        assert seen["problems"] == [] and seen["reads"] > 0
        for pk in Task.objects.using(a).filter(stage=Stage.QUEUED).values_list("pk", flat=True):
            transitions.cancel(pk, actor="op", using=a)

    # -- budgets (issue 32, item 5) ---------------------------------------------------------------

    def report(self, claim, tokens: int, cost: float | None = None) -> None:
        """Complete the claim and report its usage, as the API does (after the move)."""
        transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
        usage.record(claim.task, claim.lease.fence, claim.task.owner or "agent",
                     usage.checked({"model": "m", "input_tokens": tokens, "output_tokens": 0,
                                    **({} if cost is None else {"cost_usd": cost})}), using=self.alias)

    def test_a_spent_budget_refuses_claims_until_an_operator_raises_it(self):
        a = self.alias
        flow.change_queue("llm", budget={"tokens": 100, "per": "total"}, actor="op", using=a)
        for n in range(4):
            self.new(f"b-{n}", queue="llm", priority=-n)
        self.new("elsewhere")
        self.report(self.claim_next(queue="llm"), 60)
        second = self.claim_next(queue="llm")
        self.report(second, 50)  # 110 of 100: spent
        queue = Queue.objects.using(a).get(name="llm")
        described = flow.describe(flow.with_counts([queue], using=a)[0])
        assert (described["budget_exhausted"], described["spent"]) == (True, {"tokens": 110, "cost_usd": 0.0})
        with pytest.raises(errors.BudgetExhausted):
            self.claim_next(queue="llm")
        with pytest.raises(errors.BudgetExhausted) as refused:
            self.claim("b-2")
        assert "queue llm has spent its budget (100 tokens in total)" in str(refused.value)
        assert self.claim_next().task.pk == "elsewhere"  # other queues go on
        assert self.claim_next() is None
        flow.change_queue("llm", budget={"tokens": 200, "per": "total"}, actor="op", reason="more", using=a)
        assert self.claim_next(queue="llm").task.pk == "b-2"
        assert QueueChange.objects.using(a).filter(queue="llm").count() == 2

    def test_a_day_budget_opens_again_with_the_next_day_and_counts_from_zero(self):
        a = self.alias
        flow.change_queue("daily", budget={"tokens": 10, "cost_usd": 1.0, "per": "day"}, actor="op", using=a)
        for n in range(3):
            self.new(f"d-{n}", queue="daily", priority=-n)
        self.report(self.claim_next(queue="daily"), 5, cost=1.5)  # the cost budget is spent
        with pytest.raises(errors.BudgetExhausted):
            self.claim_next(queue="daily")
        # The next day, as the rows say it (the window's end passed): written, not slept.
        rows = Queue.objects.using(a).filter(name="daily")
        start = rows.get().budget_window
        rows.update(budget_window=start - 86400, budget_closed_until=start - 1)
        third = self.claim_next(queue="daily")
        assert third.task.pk == "d-1"
        self.report(third, 3)
        queue = rows.get()
        assert (queue.spent_tokens, queue.spent_cost_usd, queue.budget_closed_until) == (3, 0.0, None)

    def test_bad_budgets_are_refused_and_change_nothing(self):
        a = self.alias
        flow.change_queue("kept", budget={"tokens": 5, "per": "day"}, actor="op", using=a)
        before = list(Queue.objects.using(a).values_list())
        for bad in ({"tokens": 5}, {"per": "week", "tokens": 5}, {"per": "day"}, {"per": "day", "tokens": 0},
                    {"per": "day", "tokens": True}, {"per": "day", "cost_usd": -1}, {"per": "day", "cost_usd": "1"},
                    {"per": "day", "tokens": 1, "extra": 1}, "100"):
            with pytest.raises(errors.InvalidRequest) as refused:
                flow.change_queue("kept", budget=bad, actor="op", using=a)
            assert refused.value.field == "budget", bad
        assert list(Queue.objects.using(a).values_list()) == before

    def test_check_reports_a_claim_that_started_after_the_budget_was_spent(self):
        a = self.alias
        flow.change_queue("over", budget={"tokens": 1, "per": "total"}, actor="op", using=a)
        self.new("o-1", queue="over")
        self.new("o-2", queue="over")
        self.report(self.claim_next(queue="over"), 1)
        rows = Queue.objects.using(a).filter(name="over")
        closed = rows.get().budget_closed_until
        rows.update(budget_closed_until=None)  # opened behind the engine's back: a claim gets in
        late = self.claim_next(queue="over")
        rows.update(budget_closed_until=closed)
        assert [(p.task, p.code) for p in selectors.problems(using=a)] == [("queue:over", "claimed_over_budget")]
        transitions.complete(late.task.pk, late.lease.token, {}, using=a)

    def test_16_workers_never_overshoot_a_budget_past_the_attempts_running_when_it_was_reached(self):
        """Each round a queue with a budget of 100 tokens; 16 workers released together claim
        and complete with a report of 10 tokens each, until the budget refuses them. Exactly:
        no claim starts after the report that spent it (the history says so), so the spend is
        at most the closing report's window (under 110) plus one report of each other worker
        that was running then (15 x 10). Fewer rounds than the claim races (an eighth: 25 on
        the statement paths): each round is some 10-25 racing claims, completions and reports
        (about 2 s a round on SQLite)."""
        self._race_a_budget(Queue, lambda name: flow.change_queue(
            name, budget={"tokens": 100, "per": "total"}, actor="op", using=self.alias), {"queue": None})

    def test_16_workers_never_overshoot_a_fairness_keys_budget_either(self):
        """As the queue's race, with the budget on a fairness key whose tasks are spread over two
        queues, and the workers claiming from any queue: the key's budget holds them back
        wherever its tasks are."""
        self._race_a_budget(FairnessKey, lambda name: flow.change_fairness_key(
            name, budget={"tokens": 100, "per": "total"}, actor="op", using=self.alias), {"fairness_key": None})

    def _race_a_budget(self, model, set_budget, field: dict) -> None:
        a = self.alias
        by_queue = "queue" in field
        rounds = max(self.rounds // 8, 6) if by_queue else max(self.rounds // 16, 4)
        spends = []
        with FlowObserver(a, read=lambda: selectors._budget_problems(a)) as seen:
            for n in range(rounds):
                name = f"budget-{n}"
                set_budget(name)
                transitions.create([TaskSpec(id=f"{name}-{i}", title="b", queue=name if by_queue else f"q{i % 2}",
                                             fairness_key=None if by_queue else name) for i in range(40)], using=a)

                def work(i: int) -> int:
                    done = 0
                    while True:
                        try:
                            claim = transitions.claim_next(f"agent-{i}", TTL, queue=name if by_queue else None,
                                                           using=a)
                        except errors.BudgetExhausted:
                            return done
                        if claim is None:
                            return done
                        self.report(claim, 10)
                        done += 1

                results = race([lambda i=i: work(i) for i in range(RACERS)], a)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                budgeted = model.objects.using(a).get(name=name)
                assert budgeted.budget_closed_until is not None, f"round {n}: the budget never closed"
                assert 100 <= budgeted.spent_tokens <= 109 + 15 * 10, (n, budgeted.spent_tokens, results)
                assert budgeted.spent_tokens == 10 * sum(results), (n, budgeted.spent_tokens, results)
                claims_at = [e.at.timestamp() for e in TaskEvent.objects.using(a).filter(
                    verb="claim", task_id__in=[f"{name}-{i}" for i in range(40)])]
                assert len(claims_at) == sum(results)
                assert [t for t in claims_at if t > budgeted.budget_closed_at] == [], f"round {n}: a claim after the close"
                spends.append(budgeted.spent_tokens)
        assert seen["problems"] == [] and seen["reads"] > 0
        assert len(spends) == rounds

    def test_a_fairness_keys_spent_budget_holds_back_its_tasks_in_every_queue_until_raised(self):
        a = self.alias
        key = flow.change_fairness_key("team-a", budget={"tokens": 100, "per": "total"}, actor="op", using=a)
        assert (key.weight, flow.describe_fairness_key(key)["budget_exhausted"]) == (1, False)  # made by the change
        for n in range(4):
            self.new(f"a-{n}", queue=("left", "right")[n % 2], fairness_key="team-a", priority=-n)
        self.new("b-0", queue="left", fairness_key="team-b", priority=-10)
        self.report(self.claim_next(), 60)
        self.report(self.claim_next(), 50)  # 110 of 100: spent
        described = flow.describe_fairness_key(FairnessKey.objects.using(a).get(name="team-a"))
        assert (described["budget_exhausted"], described["spent"]) == (True, {"tokens": 110, "cost_usd": 0.0})
        assert Queue.objects.using(a).get(name="left").spent_tokens == 0  # the queue has no budget: not written
        with pytest.raises(errors.BudgetExhausted) as refused:
            self.claim("a-2")
        assert "fairness key team-a has spent its budget (100 tokens in total)" in str(refused.value)
        assert self.claim_next().task.pk == "b-0"  # other keys go on
        assert self.claim_next(queue="right") is None  # a-3 waits: no task of the queue is claimable
        assert self.claim_next() is None
        assert not selectors.has_ready_task(using=a)
        before = db_state(a)
        for bad in ({"tokens": 5}, {"per": "day"}, "100"):
            with pytest.raises(errors.InvalidRequest):
                flow.change_fairness_key("team-a", budget=bad, actor="op", using=a)
        with pytest.raises(errors.InvalidRequest):
            flow.change_fairness_key("", budget=None, actor="op", using=a)
        assert db_state(a) == before
        flow.change_fairness_key("team-a", budget={"tokens": 200, "per": "total"}, actor="op", reason="more", using=a)
        assert self.claim_next().task.pk == "a-2"
        assert FairnessKeyChange.objects.using(a).filter(key="team-a").count() == 2
        flow.change_fairness_key("team-a", budget={"tokens": 200, "per": "total"}, actor="op", using=a)  # unchanged
        assert FairnessKeyChange.objects.using(a).filter(key="team-a").count() == 2

    def test_check_reports_a_claim_that_started_after_a_fairness_keys_budget_was_spent(self):
        a = self.alias
        flow.change_fairness_key("over", budget={"tokens": 1, "per": "total"}, actor="op", using=a)
        self.new("o-1", fairness_key="over")
        self.new("o-2", fairness_key="over")
        self.report(self.claim_next(), 1)
        rows = FairnessKey.objects.using(a).filter(name="over")
        closed = rows.get().budget_closed_until
        rows.update(budget_closed_until=None)  # opened behind the engine's back: a claim gets in
        late = self.claim_next()
        rows.update(budget_closed_until=closed)
        assert [(p.task, p.code) for p in selectors.problems(using=a)] == [("fairness_key:over", "claimed_over_budget")]
        transitions.complete(late.task.pk, late.lease.token, {}, using=a)

    # -- notes and hand-offs (issue 32, item 4) --------------------------------------------------

    def test_a_note_goes_with_the_task_to_its_next_holder(self):
        a = self.alias
        self.new("dep")
        done = self.claim("dep")
        transitions.complete("dep", done.lease.token, {"rows": 3}, using=a)
        self.new("t", deps=("dep",), max_retries=2)
        first = self.claim("t", "agent-1")
        note = transitions.add_note("t", "the v2 API rate-limits", author="agent-1", token=first.lease.token, using=a)
        assert (note.by_holder, note.attempt, note.fence, note.author) == (True, 1, 1, "agent-1")
        transitions.add_note("t", "use the sandbox", author="op", using=a)  # staff: no token
        assert row("t", a)["notes_count"] == 2
        transitions.fail("t", first.lease.token, "boom", using=a)
        end_backoff("t", a)
        second = transitions.claim_next("agent-2", TTL, using=a)
        assert second.task.pk == "t" and second.task.notes_count == 2  # the statement's row carries the count
        handed = handoffs.for_claim(second.task, selectors.deps_of_task(second.task, using=a), using=a)
        assert handed["inputs"] == {"dep": {"rows": 3}}
        assert [(n["text"], n["author"], n["by_holder"], n["fence"]) for n in handed["notes"]] == [
            ("the v2 API rate-limits", "agent-1", True, 1), ("use the sandbox", "op", False, 1)]
        transitions.complete("t", second.lease.token, {}, using=a)

    def test_a_stale_or_wrong_holder_writes_no_note(self):
        a = self.alias
        self.new("t")
        old = self.claim("t", "agent-1")
        expire_lease("t", a)
        new = self.claim("t", "agent-2")
        before = db_state(a)
        with pytest.raises(errors.LeaseLost):
            transitions.add_note("t", "late", author="agent-1", token=old.lease.token, using=a)
        with pytest.raises(errors.Forbidden):
            transitions.add_note("t", "not mine", author="agent-1", token=new.lease.token, using=a)
        for bad in ("", " ", "x" * 4001, "nul \x00"):
            with pytest.raises(errors.InvalidRequest):
                transitions.add_note("t", bad, author="agent-2", token=new.lease.token, using=a)
        with pytest.raises(errors.NotFound):
            transitions.add_note("nope", "hi", author="op", using=a)
        assert db_state(a) == before
        transitions.complete("t", new.lease.token, {}, using=a)
        with pytest.raises(errors.LeaseLost):  # a finished task has no holder
            transitions.add_note("t", "after", author="agent-2", token=new.lease.token, using=a)
        assert transitions.add_note("t", "post-mortem", author="op", using=a).attempt == 2

    def test_16_note_writers_at_a_tasks_last_4_notes_write_exactly_4_each_round(self):
        """Each round the task holds its cap of notes less 4; 16 writers (8 with the holder's
        token, 8 staff) are released together: exactly 4 notes are written, the 12 others
        refused with NotesFull (no other error: a database fault is never a loser), and an
        observer reading check() all along never sees a count that is not the rows
        (notes_miscounted). Between rounds the round's notes are deleted and the count written
        back (in one transaction), so the next round starts 4 short again."""
        a = self.alias
        room = 4
        rounds = self.rounds
        self.new("noted")
        held = self.claim("noted", "holder")
        with stores.store(a).write_transaction():
            TaskNote.objects.using(a).bulk_create([TaskNote(task_id="noted", text="old", author="op", at=held.task.updated_at)
                                                   for _ in range(MAX_NOTES_PER_TASK - room)])
            Task.objects.using(a).filter(pk="noted").update(notes_count=MAX_NOTES_PER_TASK - room)
        with FlowObserver(a, read=lambda: selectors._note_problems(a)) as seen:
            for n in range(rounds):
                transitions.renew("noted", held.lease.token, TTL, using=a)  # however long the rounds take
                results = race([lambda i=i: transitions.add_note(
                    "noted", f"note {n}.{i}", author="holder" if i % 2 else "op",
                    token=held.lease.token if i % 2 else None, using=a) for i in range(RACERS)], a)
                written = [r for r in results if isinstance(r, TaskNote)]
                refused = [r for r in results if isinstance(r, errors.NotesFull)]
                assert (len(written), len(refused)) == (room, RACERS - room), f"round {n}: {results}"
                notes = TaskNote.objects.using(a).filter(task_id="noted")
                assert notes.count() == row("noted", a)["notes_count"] == MAX_NOTES_PER_TASK, f"round {n}"
                assert sorted(notes.exclude(text="old").values_list("pk", flat=True)) == sorted(w.pk for w in written)
                with stores.store(a).write_transaction():
                    notes.exclude(text="old").delete()
                    Task.objects.using(a).filter(pk="noted").update(notes_count=MAX_NOTES_PER_TASK - room)
        assert seen["problems"] == [] and seen["reads"] > 0
        transitions.complete("noted", held.lease.token, {}, using=a)

    # -- approval gates (issue 32, item 2) -------------------------------------------------------

    def ask(self, task_id: str, lease, question: str = "ship it?", **fields):
        return transitions.request_approval(task_id, lease.token, question, using=self.alias, **fields)

    def test_an_approval_frees_the_lease_and_the_answer_comes_back_with_the_next_claim(self):
        a = self.alias
        flow.change_queue("gated", concurrency=1, actor="op", using=a)
        self.new("deploy", queue="gated", resources=["merge-slot"])
        self.new("other", queue="gated", resources=["merge-slot"])
        held = self.claim("deploy", "agent-1")
        form = {"type": "object", "properties": {"env": {"type": "string", "enum": ["staging", "prod"]}},
                "required": ["env"]}
        task, asked = self.ask("deploy", held.lease, "deploy to which env?", form=form, approvers=["alice", "ops"],
                               checkpoint={"step": 3})
        assert (task.stage, task.awaiting_approval, task.owner, task.lease_token_hash) == ("PAUSED", True, "", None)
        assert (asked.state, asked.asked_by, asked.fence, asked.approvers) == ("waiting", "agent-1", 1, ["alice", "ops"])
        assert row("deploy", a)["checkpoint"] == {"step": 3}
        # No slot, no resource is held while a person thinks: the other task of the full queue runs.
        other = transitions.claim_next("agent-2", TTL, using=a)
        assert other.task.pk == "other"
        transitions.complete("other", other.lease.token, {}, using=a)
        with pytest.raises(errors.LeaseLost):  # the asker's lease ended with the question
            transitions.complete("deploy", held.lease.token, {}, using=a)
        with pytest.raises(errors.InvalidTransition):
            transitions.resume("deploy", "agent-1", TTL, using=a)
        with pytest.raises(errors.InvalidTransition):
            transitions.requeue("deploy", actor="op", using=a)
        task, answered = transitions.answer("deploy", True, actor="alice", values={"env": "prod"}, comment="go", using=a)
        assert (task.stage, task.awaiting_approval) == ("QUEUED", False)
        assert (answered.state, answered.approved, answered.values, answered.answered_by) == (
            "approved", True, {"env": "prod"}, "alice")
        # Kept for the agent that asked: another agent finds nothing and may not take it by id.
        assert transitions.claim_next("agent-2", TTL, using=a) is None
        with pytest.raises(errors.Blocked, match="agent-1"):
            transitions.claim("deploy", "agent-2", TTL, using=a)
        again = transitions.claim("deploy", "agent-1", TTL, using=a)
        assert (again.lease.fence, again.task.attempts) == (2, 2)
        handed = handoffs.for_claim(again.task, [], using=a)
        assert handed["approval"]["values"] == {"env": "prod"} and handed["approval"]["comment"] == "go"
        assert handed["approval"]["question"] == "deploy to which env?" and handed["approval"]["approved"] is True
        transitions.complete("deploy", again.lease.token, {}, using=a)
        verbs = list(TaskEvent.objects.using(a).filter(task_id="deploy").order_by("id").values_list("verb", "actor"))
        assert verbs[1:4] == [("claim", "agent-1"), ("ask", "agent-1"), ("answer", "alice")]

    def test_a_bad_question_or_answer_changes_nothing(self):
        a = self.alias
        self.new("t")
        held = self.claim("t", "agent-1")
        before = db_state(a)
        for bad in ({"question": ""}, {"question": "x" * 2001}, {"form": {"type": "array"}},
                    {"form": {"properties": {"f": {"type": "object"}}}}, {"form": {"properties": {}, "required": ["x"]}},
                    {"approvers": "alice"}, {"timeout_seconds": 0}, {"on_timeout": "explode"}):
            fields = {"question": "ok?", **bad}
            with pytest.raises(errors.InvalidRequest):
                transitions.request_approval("t", held.lease.token, using=a, **fields)
        with pytest.raises(errors.Forbidden):  # another agent's token: acts as nobody
            transitions.request_approval("t", held.lease.token, "ok?", agent="agent-2", using=a)
        with pytest.raises(errors.InvalidTransition):  # nothing asked yet
            transitions.answer("t", True, actor="op", using=a)
        assert db_state(a) == before
        form = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
        self.ask("t", held.lease, form=form)
        before = db_state(a)
        for values in (None, {"n": 0}, {"n": "two"}, {"m": 1}):
            with pytest.raises(errors.InvalidRequest):
                transitions.answer("t", True, actor="op", values=values, using=a)
        with pytest.raises(errors.Forbidden):
            transitions.answer("t", True, actor="mallory", values={"n": 2}, may_answer=lambda _: False, using=a)
        with pytest.raises(errors.NotFound):  # no such approval of this task
            transitions.answer("t", True, actor="op", values={"n": 2}, approval_id=999, using=a)
        assert db_state(a) == before
        first = Approval.objects.using(a).get(task_id="t").pk
        transitions.answer("t", False, actor="op", comment="not today", using=a)  # a rejection needs no values
        with pytest.raises(errors.AlreadyAnswered, match="already answered by op"):
            transitions.answer("t", True, actor="op2", values={"n": 2}, using=a)
        # An answer meant for the first question does not answer the next one.
        again = transitions.claim("t", "agent-1", TTL, using=a)
        self.ask("t", again.lease)
        with pytest.raises(errors.AlreadyAnswered):
            transitions.answer("t", True, actor="op2", approval_id=first, using=a)
        transitions.answer("t", True, actor="op2", using=a)

    def test_an_approval_times_out_as_it_said_and_cancel_withdraws_it(self):
        a = self.alias
        for task_id, on_timeout in (("f", "fail"), ("y", "approve"), ("c", "cancel")):
            self.new(task_id)
            self.ask(task_id, self.claim(task_id).lease, timeout_seconds=60, on_timeout=on_timeout)
        self.new("w")
        self.ask("w", self.claim("w").lease)  # no timeout: waits until answered
        assert transitions.time_out_approvals(using=a) == []  # not due yet
        # Asked without a checkpoint: no paused_without_checkpoint (a task waiting for an answer
        # is never resumed: the answer queues it).
        assert row("w", a)["checkpoint"] is None and selectors.problems(using=a) == []
        later = Approval.objects.using(a).get(task_id="f").due_at + timedelta(seconds=1)
        moved = dict(transitions.time_out_approvals(now=later, using=a))
        assert moved == {"f": "FAILED", "y": "QUEUED", "c": "CANCELLED"}
        states = dict(Approval.objects.using(a).values_list("task_id", "state"))
        assert states == {"f": "timed_out", "y": "approved", "c": "cancelled", "w": "waiting"}
        assert Approval.objects.using(a).get(task_id="y").answered_by == approvals.TIMEOUT_ANSWERER
        assert "not answered within 60 s" in row("f", a)["last_error"]
        assert transitions.time_out_approvals(now=later, using=a) == []  # each applied once
        transitions.cancel("w", actor="op", reason="no longer needed", using=a)
        assert Approval.objects.using(a).get(task_id="w").state == "cancelled"
        with pytest.raises(errors.AlreadyAnswered, match="cancelled"):
            transitions.answer("w", True, actor="op", using=a)

    def test_check_reports_an_unpaired_approval_and_a_miscounted_one(self):
        """Rows written behind the engine's back: a waiting approval whose task awaits none is
        approval_unpaired, a task's approvals_count that is not its approvals' rows is
        approvals_miscounted; the board put back as the engine left it, check() is quiet."""
        a = self.alias
        self.new("asks")
        self.ask("asks", self.claim("asks").lease)
        codes = lambda: sorted(p.code for p in selectors.problems(using=a) if p.task == "asks")  # noqa: E731
        assert codes() == []
        Task.objects.using(a).filter(pk="asks").update(awaiting_approval=False)
        # (a PAUSED task not awaiting an answer needs its checkpoint, which this one never had)
        assert codes() == [invariants.APPROVAL_UNPAIRED, invariants.PAUSED_WITHOUT_CHECKPOINT]
        Task.objects.using(a).filter(pk="asks").update(awaiting_approval=True, approvals_count=3)
        assert codes() == [invariants.APPROVALS_MISCOUNTED]
        Task.objects.using(a).filter(pk="asks").update(approvals_count=1)
        assert codes() == []
        transitions.cancel("asks", actor="op", using=a)

    def test_16_people_answering_one_approval_make_exactly_one_answer(self):
        """Each round a task asks; 16 answerers (8 approve, 8 reject) are released together:
        exactly one answer is written (its approval's state is that answer's), the 15 others
        are refused with AlreadyAnswered (no other error: a database fault is never a loser),
        and an observer reading check() all along never sees an approval without its task
        (approval_unpaired)."""
        a = self.alias
        rounds = self.rounds
        with FlowObserver(a, read=lambda: selectors._approval_problems(a)) as seen:
            for n in range(rounds):
                task_id = f"gate-{n}"
                self.new(task_id)
                self.ask(task_id, self.claim(task_id).lease)
                results = race([lambda i=i: transitions.answer(task_id, i % 2 == 0, actor=f"person-{i}", using=a)
                                for i in range(RACERS)], a)
                won = [r for r in results if isinstance(r, tuple)]
                refused = [r for r in results if isinstance(r, errors.AlreadyAnswered)]
                assert (len(won), len(refused)) == (1, RACERS - 1), f"round {n}: {results}"
                approval = Approval.objects.using(a).get(task_id=task_id)
                task, answered = won[0]
                assert (approval.state, approval.answered_by) == (answered.state, answered.answered_by), f"round {n}"
                assert approval.approved is (answered.answered_by in {f"person-{i}" for i in range(0, RACERS, 2)})
                assert row(task_id, a)["stage"] == "QUEUED"
                assert TaskEvent.objects.using(a).filter(task_id=task_id, verb="answer").count() == 1
        assert seen["problems"] == [] and seen["reads"] > 0

    def test_usage_reports_add_up_by_attempt_and_a_missing_cost_stays_missing(self):
        a = self.alias
        self.new("u", queue="llm", max_retries=2)
        first = self.claim("u", "agent-1")
        report = usage.checked({"model": "opus", "input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.05})
        usage.record(first.task, first.lease.fence, "agent-1", report, using=a)
        usage.record(first.task, first.lease.fence, "agent-1", report, using=a)
        transitions.fail("u", first.lease.token, "boom", using=a)
        end_backoff("u", a)
        second = self.claim("u", "agent-2")
        usage.record(second.task, second.lease.fence, "agent-2", usage.checked({"input_tokens": 7}), using=a)
        transitions.complete("u", second.lease.token, {}, using=a)
        got = usage.of_task("u", using=a)
        assert got["total"] == {"input_tokens": 2007, "output_tokens": 400, "cost_usd": None, "cost_missing": 1,
                                "reports": 3}
        assert [(t["fence"], t["agent"], t["models"], t["cost_usd"], t["reports"]) for t in got["attempts"]] == [
            (1, "agent-1", ["opus"], 0.1, 2), (2, "agent-2", [], None, 1)]
        overview = usage.by_agent_and_queue(first.task.created_at, using=a)
        assert [(g["agent"], g["input_tokens"]) for g in overview["agent"]] == [("agent-1", 2000), ("agent-2", 7)]
        assert [(g["queue"], g["reports"]) for g in overview["queue"]] == [("llm", 3)]

    # -- run again as new (issue 33, item 5) ----------------------------------------------------

    def test_a_finished_task_runs_again_as_a_linked_copy(self):
        a = self.alias
        self.new("dep")
        transitions.complete("dep", self.claim("dep").lease.token, {"rows": 3}, using=a)
        self.new("orig", deps=("dep",), payload={"url": "x"}, queue="crawl", priority=4, max_retries=1,
                 concurrency_key="site", rate_key="api", fairness_key="plan-1", tags=["nightly"],
                 attempt_timeout_seconds=600, dedup_key="orig-key")
        transitions.fail("orig", self.claim("orig").lease.token, "boom", retryable=False, using=a)
        before = row("orig", a)
        copy = transitions.replay("orig", actor="ops", new_id="orig-2", using=a)
        assert row("orig", a) == before  # the original is not touched
        assert (copy.pk, copy.stage, copy.replay_of, copy.attempts, copy.dedup_key) == ("orig-2", Stage.QUEUED, "orig", 0, None)
        for name in ("title", "payload", "queue", "priority", "max_retries", "concurrency_key", "rate_key",
                     "fairness_key", "tags", "attempt_timeout_seconds"):
            assert getattr(copy, name) == before[name], name
        assert selectors.deps_of_task(copy, using=a) == ["dep"]
        created = TaskEvent.objects.using(a).get(task_id="orig-2")
        assert (created.verb, created.actor, created.detail) == ("create", "ops", {"replay_of": "orig"})
        # Its claim hands over the same inputs; its replays are found by search.
        claim = self.claim("orig-2")
        assert handoffs.for_claim(claim.task, ["dep"], using=a)["inputs"] == {"dep": {"rows": 3}}
        transitions.complete("orig-2", claim.lease.token, {}, using=a)
        other = transitions.replay("orig", actor="ops", payload={"url": "y"}, using=a)
        assert (other.payload, other.replay_of) == ({"url": "y"}, "orig")
        found = Task.objects.using(a).filter(search.parse('replay_of:orig').q(a)).order_by("created_at", "pk")
        assert sorted(found.values_list("pk", flat=True)) == sorted(["orig-2", other.pk])
        transitions.cancel(other.pk, actor="ops", using=a)

    def test_an_unfinished_task_or_one_that_waits_for_a_dead_end_does_not_run_again(self):
        a = self.alias
        self.new("queued")
        self.new("running")
        held = self.claim("running")
        self.new("dead")
        transitions.cancel("dead", actor="ops", using=a)
        self.new("stuck", deps=("dead",))
        transitions.cancel("stuck", actor="ops", using=a)
        before = db_state(a)
        for task_id in ("queued", "running"):
            with pytest.raises(errors.InvalidTransition):
                transitions.replay(task_id, actor="ops", using=a)
        with pytest.raises(errors.InvalidTransition) as refused:
            transitions.replay("stuck", actor="ops", using=a)
        assert refused.value.field == "deps" and "dead" in refused.value.message
        with pytest.raises(errors.NotFound):
            transitions.replay("nope", actor="ops", using=a)
        with pytest.raises(errors.DuplicateId):
            transitions.replay("dead", actor="ops", new_id="queued", using=a)
        assert db_state(a) == before
        transitions.complete("running", held.lease.token, {}, using=a)

    # -- several moves in one call (issue 34): a finishing move and the next claim, batches ------

    def test_complete_and_claim_completes_then_claims_the_next_ready_task(self):
        a = self.alias
        self.new("first", priority=9)
        self.new("second", priority=5)
        self.new("third", priority=1)
        held = self.claim_next()
        assert held.task.pk == "first"
        done, nxt = transitions.complete_and_claim("first", held.lease.token, {"n": 1}, transitions.NextClaim(TTL),
                                                   agent="agent", using=a)
        assert (done.pk, done.stage, done.result, done.owner) == ("first", Stage.COMPLETED, {"n": 1}, "")
        assert (nxt.task.pk, nxt.task.stage, nxt.task.owner, nxt.lease.fence) == ("second", Stage.RUNNING, "agent", 1)
        assert row("second", a)["lease_token_hash"] == transitions.hash_token(nxt.lease.token)
        assert list(TaskEvent.objects.using(a).filter(task_id__in=["first", "second"]).exclude(verb="create").order_by("pk")
                    .values_list("task_id", "verb")) == [("first", "claim"), ("first", "complete"), ("second", "claim")]
        # A queue named: only its tasks; none ready there: next is None, the completion stands.
        done, nxt = transitions.complete_and_claim("second", nxt.lease.token, {}, transitions.NextClaim(TTL, "elsewhere"),
                                                   agent="agent", using=a)
        assert (done.stage, nxt) == (Stage.COMPLETED, None)
        assert self.stage("third") == Stage.QUEUED
        renewed = transitions.renew("third", self.claim("third").lease.token, TTL, using=a)
        transitions.complete("third", renewed.lease.token, {}, using=a)

    def test_a_refused_finishing_move_claims_nothing(self):
        a = self.alias
        self.new("held")
        self.new("ready")
        held = self.claim("held")
        before = db_state(a)
        for move in (
            lambda nxt: transitions.complete_and_claim("held", "stale", {}, nxt, agent="agent", using=a),
            lambda nxt: transitions.fail_and_claim("held", "stale", "boom", nxt, agent="agent", using=a),
            lambda nxt: transitions.release_and_claim("held", "stale", nxt, agent="agent", using=a),
        ):
            with pytest.raises(errors.LeaseLost):
                move(transitions.NextClaim(TTL))
        with pytest.raises(errors.Forbidden):  # another agent's lease
            transitions.complete_and_claim("held", held.lease.token, {}, transitions.NextClaim(TTL), agent="other",
                                           using=a)
        # A bad next claim is refused before the move: the task stays held.
        for bad in (transitions.NextClaim(0), transitions.NextClaim(TTL, "bad queue"),
                    transitions.NextClaim(TTL, request_id="with space")):
            with pytest.raises(errors.InvalidRequest):
                transitions.complete_and_claim("held", held.lease.token, {}, bad, agent="agent", using=a)
        assert db_state(a) == before
        transitions.complete("held", held.lease.token, {}, using=a)
        transitions.complete("ready", self.claim("ready").lease.token, {}, using=a)

    def test_fail_and_release_then_claim_the_next(self):
        a = self.alias
        self.new("f", priority=9, max_retries=0)
        self.new("r", priority=5)
        self.new("n", priority=1)
        failed, nxt = transitions.fail_and_claim("f", self.claim("f").lease.token, "boom", transitions.NextClaim(TTL),
                                                 agent="agent", using=a)
        assert (failed.stage, nxt.task.pk) == (Stage.FAILED, "r")
        # The released task is ready again and first in line: the next claim takes it back.
        released, again = transitions.release_and_claim("r", nxt.lease.token, transitions.NextClaim(TTL),
                                                        agent="agent", using=a)
        assert (released.stage, again.task.pk, again.lease.fence) == (Stage.QUEUED, "r", 2)
        snoozed, other = transitions.release_and_claim("r", again.lease.token, transitions.NextClaim(TTL),
                                                       retry_after_seconds=60, agent="agent", using=a)
        assert (snoozed.stage, other.task.pk) == (Stage.QUEUED, "n")
        transitions.complete("n", other.lease.token, {}, using=a)
        end_backoff("r", a)
        transitions.complete("r", self.claim("r").lease.token, {}, using=a)

    def test_a_claim_that_fails_after_the_completion_loses_no_lease(self, monkeypatch):
        """Where the moves share a transaction (SQL stores), a claim that raises undoes the
        completion too: the holder still holds its task and may complete it again. Where they do
        not (MongoDB), the completion has committed and stays; the failed claim rolled back, so
        no task is left RUNNING under a lease nobody was told of, and next is None."""
        from board.engine.transitions import batches

        a = self.alias
        self.new("done-first", priority=9)
        self.new("then", priority=1)
        held = self.claim_next()

        # The claim's move is made, then the store fails before the commit: on the statements
        # path inside their shared transaction, on the ORM path inside the claim's own.
        statements = stores.store(a).statements
        owner, name = (statements, "claim_next") if statements is not None else (batches, "claim_next")
        real_claim_next = getattr(owner, name)

        def claim_that_fails(*args, **kwargs):
            # (The statements run inside their caller's transaction; the ORM verb opens its own.)
            with stores.store(a).write_transaction() if statements is None else contextlib.nullcontext():
                real_claim_next(*args, **kwargs)
                raise DatabaseError("the store went away mid-claim")

        monkeypatch.setattr(owner, name, claim_that_fails)
        nxt = transitions.NextClaim(TTL)
        if stores.store(a).moves_share_a_transaction:
            with pytest.raises(DatabaseError):
                transitions.complete_and_claim("done-first", held.lease.token, {}, nxt, agent="agent", using=a)
            assert (self.stage("done-first"), self.stage("then")) == (Stage.RUNNING, Stage.QUEUED)
            monkeypatch.undo()
            done, claimed = transitions.complete_and_claim("done-first", held.lease.token, {}, nxt, agent="agent",
                                                           using=a)
            assert (done.stage, claimed.task.pk) == (Stage.COMPLETED, "then")
            transitions.complete("then", claimed.lease.token, {}, using=a)
        else:
            done, claimed = transitions.complete_and_claim("done-first", held.lease.token, {}, nxt, agent="agent",
                                                           using=a)
            assert (done.stage, claimed) == (Stage.COMPLETED, None)
            assert (self.stage("done-first"), self.stage("then")) == (Stage.COMPLETED, Stage.QUEUED)
            assert not Task.objects.using(a).filter(stage=Stage.RUNNING).exists()
            monkeypatch.undo()
            transitions.complete("then", self.claim("then").lease.token, {}, using=a)

    def test_a_batch_claim_takes_up_to_n_in_claim_order_each_its_own_lease(self):
        a = self.alias
        for n in range(5):
            self.new(f"b{n}", priority=10 - n)
        claims = transitions.claim_batch("agent", TTL, 3, using=a)
        assert [c.task.pk for c in claims] == ["b0", "b1", "b2"]
        assert len({c.lease.token for c in claims}) == 3 and all(c.lease.fence == 1 for c in claims)
        for c in claims:
            assert row(c.task.pk, a)["lease_token_hash"] == transitions.hash_token(c.lease.token)
            assert c.task.stage == Stage.RUNNING and c.lease.expires_at == c.task.lease_expires_at
        rest = transitions.claim_batch("agent", TTL, 10, using=a)
        assert [c.task.pk for c in rest] == ["b3", "b4"]
        assert transitions.claim_batch("agent", TTL, 10, using=a) == []
        before = db_state(a)
        for bad in (0, 101, True, 2.0, None):
            with pytest.raises(errors.InvalidRequest):
                transitions.claim_batch("agent", TTL, bad, using=a)
        assert db_state(a) == before
        items = [transitions.CompleteItem(c.task.pk, c.lease.token, {"i": i}) for i, c in enumerate(claims + rest)]
        assert all(t.stage == Stage.COMPLETED for t in transitions.complete_batch(items, agent="agent", using=a))

    def test_a_batch_claim_retried_with_its_request_id_returns_the_leases_still_live(self):
        a = self.alias
        for n in range(6):
            self.new(f"rb{n}", priority=10 - n)
        first = transitions.claim_batch("agent", TTL, 3, request_id="batch-1", using=a)
        state = db_state(a)
        again = transitions.claim_batch("agent", TTL, 3, request_id="batch-1", using=a)
        assert [(c.task.pk, c.lease) for c in again] == [(c.task.pk, c.lease) for c in first]
        assert db_state(a) == state
        # One completed: a retry returns the two still live, and claims nothing more.
        transitions.complete(first[0].task.pk, first[0].lease.token, {}, using=a)
        again = transitions.claim_batch("agent", TTL, 3, request_id="batch-1", using=a)
        assert [c.lease for c in again] == [c.lease for c in first[1:]]
        # Another agent with that id, or another id: new claims.
        other = transitions.claim_batch("other", TTL, 2, request_id="batch-1", using=a)
        assert [c.task.pk for c in other] == ["rb3", "rb4"]
        for c in first[1:] + other:
            transitions.complete(c.task.pk, c.lease.token, {}, using=a)
        # Every lease of it ended: the id claims anew.
        last = transitions.claim_batch("agent", TTL, 3, request_id="batch-1", using=a)
        assert [c.task.pk for c in last] == ["rb5"]
        transitions.complete("rb5", last[0].lease.token, {}, using=a)

    def test_16_batch_claimers_lease_every_task_exactly_once_over_200_rounds(self):
        a = self.alias
        # 16 racers asking for 2 each could take 32: 24 tasks a round on the statement paths. A
        # class with fewer rounds (the ORM paths, MongoDB's test server: 262 s for 100 rounds of 8
        # there) races 8 tasks a round, half its rounds.
        per_round, rounds = (24, self.rounds) if self.rounds == ROUNDS else (8, self.rounds // 2)
        ttl = 3600  # the leases are left to run (each round's claims can only take its new tasks)
        for n in range(rounds):
            transitions.create([TaskSpec(id=f"bt-{n}-{i}", title="b") for i in range(per_round)], using=a)
            results = race([lambda i=i: transitions.claim_batch(f"agent-{i}", ttl, 2, using=a)
                            for i in range(RACERS)], a)
            faults = [r for r in results if isinstance(r, BaseException)]
            assert not faults, f"round {n}: {faults[:3]}"
            leased = [c for r in results for c in r]
            ids = [c.task.pk for c in leased]
            assert len(ids) == len(set(ids)) == per_round, f"round {n}: {len(ids)} leases of {len(set(ids))} tasks"
            assert all(len(r) <= 2 for r in results)
            assert len({c.lease.token for c in leased}) == per_round
            assert Task.objects.using(a).filter(stage=Stage.RUNNING).count() == per_round * (n + 1)
            assert not Task.objects.using(a).filter(stage=Stage.QUEUED).exists()
        claims = Counter(TaskEvent.objects.using(a).filter(verb="claim").values_list("task_id", flat=True))
        assert len(claims) == rounds * per_round and set(claims.values()) == {1}

    def test_16_batch_claimers_never_run_more_than_the_queue_limit_over_200_rounds(self):
        self._race_a_limit(queue_limit=3, key=None, batch=4)

    def _race_workers_over_two_limited_queues(self, prefix: str, limit: int, work) -> None:
        """8 workers, each running `work(i, done)` (which appends the ids it completed to
        `done`), across two queues limited to `limit`: every task is completed exactly once and
        claimed once, no call fails (on PostgreSQL two transactions locking the queues' rows in
        opposite orders may deadlock: the one the database ends runs again), the queues' counts
        end at 0, and an observer reading all along never sees a queue over its limit."""
        a = self.alias
        flow.change_queue("left", concurrency=limit, actor="op", using=a)
        flow.change_queue("right", concurrency=limit, actor="op", using=a)
        total = 80 if self.rounds == ROUNDS else 40
        transitions.create([TaskSpec(id=f"{prefix}{i}", title=prefix, queue=("left", "right")[i % 2])
                            for i in range(total)], using=a)
        done: list[list[str]] = [[] for _ in range(8)]
        with FlowObserver(a) as seen:
            results = race([lambda i=i: work(i, done[i]) for i in range(8)], a)
        assert not any(isinstance(r, BaseException) for r in results), results
        assert seen["problems"] == [] and seen["reads"] > 0
        every = [t for ids in done for t in ids]
        assert len(every) == len(set(every)) == total
        assert Task.objects.using(a).filter(stage=Stage.COMPLETED).count() == total
        assert Counter(TaskEvent.objects.using(a).filter(verb="claim").values_list("task_id", flat=True)) == {
            f"{prefix}{i}": 1 for i in range(total)}
        assert flow.counts(["left", "right"], using=a)[0] == {"left": 0, "right": 0}

    def test_8_workers_completing_and_claiming_across_two_limited_queues_lose_no_task(self):
        """Workers that each make one call per task (complete, then claim the next)."""
        a = self.alias

        def work(i, done):
            held = transitions.claim_next(f"worker-{i}", TTL, using=a)
            while held is not None:
                finished, held = transitions.complete_and_claim(
                    held.task.pk, held.lease.token, {"by": i}, transitions.NextClaim(TTL), agent=f"worker-{i}",
                    using=a)
                done.append(finished.pk)

        self._race_workers_over_two_limited_queues("x", 3, work)

    def test_a_batch_complete_reports_each_item_and_one_refusal_undoes_nothing(self):
        a = self.alias
        for n in range(4):
            self.new(f"bc{n}")
        claims = transitions.claim_batch("agent", TTL, 4, using=a)
        items = [transitions.CompleteItem(c.task.pk, c.lease.token, {"i": i}) for i, c in enumerate(claims)]
        items[1] = transitions.CompleteItem(items[1].task_id, "stale", {})
        items.append(transitions.CompleteItem("absent", "x", {}))
        outcomes = transitions.complete_batch(items, agent="agent", using=a)
        assert [type(o).__name__ if isinstance(o, errors.BoardError) else o.stage for o in outcomes] == [
            Stage.COMPLETED, "LeaseLost", Stage.COMPLETED, Stage.COMPLETED, "NotFound"]
        assert self.stage(claims[1].task.pk) == Stage.RUNNING
        before = db_state(a)
        one = transitions.CompleteItem(claims[1].task.pk, claims[1].lease.token, {})
        for bad in ([], [one] * 2, [one, transitions.CompleteItem("bc0", "t", None)],
                    [transitions.CompleteItem(f"x{i}", "t", {}) for i in range(101)]):
            with pytest.raises(errors.InvalidRequest):
                transitions.complete_batch(bad, agent="agent", using=a)
        assert db_state(a) == before
        assert transitions.complete_batch([one], agent="agent", using=a)[0].stage == Stage.COMPLETED

    def test_8_workers_completing_batches_across_two_limited_queues_lose_no_task(self):
        """Workers that claim a batch and complete it in one call, each completing its items in
        the other queue's order than its neighbour, every item accepted (on SQLite a batch's
        completions share one transaction)."""
        a = self.alias

        def work(i, done):
            while held := transitions.claim_batch(f"worker-{i}", TTL, 2, using=a):
                held.sort(key=lambda c: c.task.queue, reverse=bool(i % 2))
                items = [transitions.CompleteItem(c.task.pk, c.lease.token, {"by": i}) for c in held]
                finished = transitions.complete_batch(items, agent=f"worker-{i}", using=a)
                assert [getattr(t, "stage", t) for t in finished] == [Stage.COMPLETED] * len(held), finished
                done.extend(t.pk for t in finished)

        self._race_workers_over_two_limited_queues("y", 4, work)

    def _race_a_limit(self, *, queue_limit: int | None, key: str | None, batch: int | None = None,
                      rounds: int | None = None) -> None:
        """16 claimers released together each round take exactly the limit's worth of tasks,
        and an observer reading all along never sees more RUNNING than the limit, nor a count
        that disagrees with the tasks (one consistent read each time). `batch`: each claimer
        asks for a batch of that many (claim_batch) instead of one."""
        limit = queue_limit or 1
        if queue_limit is not None:
            flow.change_queue("raced", concurrency=queue_limit, actor="op", using=self.alias)
        made = 0

        def top_up(n: int) -> None:
            nonlocal made
            transitions.create([TaskSpec(id=f"raced-{made + i}", title="r", queue=f"raced{'' if key is None else i % 2}",
                                         concurrency_key=key) for i in range(n)], using=self.alias)
            made += n

        top_up(RACERS)
        stop, seen = threading.Event(), {"max": 0, "reads": 0, "problems": []}

        def observe() -> None:
            try:
                while not stop.is_set():
                    with stores.store(self.alias).read_transaction():
                        running = Task.objects.using(self.alias).filter(stage=Stage.RUNNING).count()
                        found = selectors.limit_problems(using=self.alias)  # this race's rule
                    seen["max"], seen["reads"] = max(seen["max"], running), seen["reads"] + 1
                    seen["problems"] += found
                    stop.wait(0.002)  # paced, not to starve the claimers of the GIL; never a condition
            except BaseException as exc:  # a fault of the observer fails the test, never passes it
                seen["problems"].append(exc)
            finally:
                connections[self.alias].close()

        observer = threading.Thread(target=observe)
        observer.start()
        try:
            for n in range(rounds or self.rounds):
                if batch is None:
                    calls = [lambda i=i: transitions.claim_next(f"agent-{i}", TTL, using=self.alias)
                             for i in range(RACERS)]
                else:
                    calls = [lambda i=i: transitions.claim_batch(f"agent-{i}", TTL, batch, using=self.alias)
                             for i in range(RACERS)]
                results = race(calls, self.alias)
                faults = [r for r in results if isinstance(r, BaseException)]
                assert not faults, f"round {n}: {faults[:3]}"
                won = [r for r in results if r is not None] if batch is None else [c for r in results for c in r]
                assert len(won) == limit, f"round {n}: {len(won)} claimers won; the limit is {limit}"
                for claim in won:
                    transitions.complete(claim.task.pk, claim.lease.token, {}, using=self.alias)
                top_up(len(won))
        finally:
            stop.set()
            observer.join()
        assert seen["problems"] == [] and seen["reads"] > 0
        assert seen["max"] <= limit
        assert Task.objects.using(self.alias).filter(stage=Stage.COMPLETED).count() == (rounds or self.rounds) * limit


# -- the backends -------------------------------------------------------------------------------


class TestSQLiteBoard(BoardContract):
    """SQLite on its store's statements."""

    pytestmark = sqlite_db_mark()
    alias = "default"

    def test_the_embedded_store_is_a_real_file_in_wal_mode(self):
        with connections[self.alias].cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            assert cursor.fetchone()[0] == "wal"
            cursor.execute("PRAGMA database_list")
            path = cursor.fetchone()[2]  # "" for an in-memory database
            # pytest-xdist's workers each get their own file (pytest-django appends "_gw<n>").
            assert path and os.path.isfile(path), path


class TestSQLiteOrmBoard(BoardContract):
    """SQLite on the ORM path. Not the path the store serves (its statements are: the class above
    runs each race 200 rounds); the path MongoDB runs (tests/mongodb) and settings.TASKFLOW's
    HOT_PATH "orm" fallback. A quarter of the rounds: these races cost the most of the suite
    (the ORM path makes more queries a move), and CI's time is bounded."""

    pytestmark = sqlite_db_mark()
    alias = "default"
    hot_path = "orm"
    rounds = ROUNDS // 4


class TestPostgresBoard(BoardContract):
    """PostgreSQL on its store's statements."""

    pytestmark = postgres_db_mark()
    alias = "postgres"

    def test_two_completions_claiming_each_others_limited_queue_deadlock_and_both_succeed(self, monkeypatch):
        """A completion locks its queue's row (the slot it gives back) until it commits, and the
        next claim in the same transaction locks the next task's queue: two such calls crossing
        two limited queues deadlock. Held at a barrier between the two statements, they must:
        PostgreSQL ends one (after deadlock_timeout), which runs again (lost_a_lock_race ->
        retry_conflicts); both calls succeed and every count is exact."""
        from board.engine.transitions.leases import _StatementPath

        a = self.alias
        for queue in ("left", "right"):
            flow.change_queue(queue, concurrency=5, actor="op", using=a)
            for n in range(2):
                self.new(f"{queue}-{n}", queue=queue)
        held = {queue: transitions.claim_next("agent", TTL, queue=queue, using=a) for queue in ("left", "right")}
        barrier, crossed = threading.Barrier(2, timeout=30), threading.local()
        real_claim_row = _StatementPath._claim_row

        def claim_row(self, *args, **kwargs):
            if not getattr(crossed, "done", False):  # the first attempt of each call only
                crossed.done = True
                barrier.wait()
            return real_claim_row(self, *args, **kwargs)

        monkeypatch.setattr(_StatementPath, "_claim_row", claim_row)

        def finish(queue: str, other: str):
            return lambda: transitions.complete_and_claim(
                held[queue].task.pk, held[queue].lease.token, {}, transitions.NextClaim(TTL, other), agent="agent",
                using=a)

        results = race([finish("left", "right"), finish("right", "left")], a)
        assert not any(isinstance(r, BaseException) for r in results), results
        (done_left, next_right), (done_right, next_left) = results
        assert (done_left.pk, next_right.task.pk, done_right.pk, next_left.task.pk) == (
            "left-0", "right-1", "right-0", "left-1")
        assert self.running_in("left") == (1, 1) and self.running_in("right") == (1, 1)
        events = Counter(TaskEvent.objects.using(a).exclude(verb="create").values_list("task_id", "verb"))
        assert set(events.values()) == {1} and len(events) == 6  # nothing written twice
        for claim in (next_left, next_right):
            transitions.complete(claim.task.pk, claim.lease.token, {}, using=a)


class TestPostgresOrmBoard(BoardContract):
    """PostgreSQL on the ORM path. Not the path the store serves (its statements are: the class above
    runs each race 200 rounds); the path MongoDB runs (tests/mongodb) and settings.TASKFLOW's
    HOT_PATH "orm" fallback. A quarter of the rounds: these races cost the most of the suite
    (the ORM path makes more queries a move), and CI's time is bounded."""

    pytestmark = postgres_db_mark()
    alias = "postgres"
    hot_path = "orm"
    rounds = ROUNDS // 4
