"""Deadlines beside the lease (issue 29, item 7), as a contract every store passes: a task's
`queue_timeout_seconds` (QUEUED too long: FAILED, "not started in time"), `attempt_timeout_seconds`
(one attempt's wall-clock limit, renewals or not) and `progress_timeout_seconds` (a renew keeps
the lease only if its progress or checkpoint changed within that time), applied by the reaper's
pass (`transitions.enforce_deadlines`) through the CAS.

Written once, run on SQLite and PostgreSQL, each on its store's statements and on the ORM path
(as tests/test_contract.py), and on MongoDB (tests/mongodb/test_deadlines_mongodb.py). Time is
passed as `now=` or aged by writing the row, never slept. Races: real threads released by a
barrier, every round's outcome asserted exactly."""
from __future__ import annotations

import io
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.utils import timezone

from board.engine import errors, selectors, stores, transitions
from board.engine.limits import MAX_DEADLINE_SECONDS
from board.engine.transitions import TaskSpec
from board.models import Task, TaskEvent
from tests.support import db_state, postgres_db_mark, race, sqlite_db_mark
from tests.test_api import assert_error, create, http, post, used_key  # noqa: F401
from tests.test_consumers import login_cookie, open_socket, receive_until, run, task_frames

TTL = 600  # leases that stay live through every test: only the deadlines take them back
ROUNDS = 100


def later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


class DeadlineContract:
    """Subclasses set `alias` and `hot_path` ("auto": the store's statements; "orm")."""

    alias: str
    hot_path: str = "auto"
    rounds: int = ROUNDS

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

    def new(self, task_id: str, **fields) -> Task:
        return transitions.create(TaskSpec(id=task_id, title=task_id, **fields), using=self.alias)[0]

    def task(self, task_id: str) -> Task:
        return Task.objects.using(self.alias).get(pk=task_id)

    def enforce(self, now, task_ids=None):
        return transitions.enforce_deadlines(now=now, task_ids=task_ids, using=self.alias)

    def last_event(self, task_id: str) -> TaskEvent:
        return TaskEvent.objects.using(self.alias).filter(task_id=task_id).order_by("-id").first()

    def age(self, task_id: str, seconds: float, *fields: str) -> None:
        """Move the task's clocks `seconds` into the past (time passing, written to the row)."""
        task = self.task(task_id)
        changes = {name: getattr(task, name) - timedelta(seconds=seconds) for name in fields}
        assert Task.objects.using(self.alias).filter(pk=task_id, version=task.version).update(**changes) == 1

    # -- the queue timeout ---------------------------------------------------------------------

    def test_a_task_queued_past_its_queue_timeout_fails_not_started_in_time(self):
        self.new("q", queue_timeout_seconds=60)
        self.new("plain")
        start = self.task("q").stage_changed_at
        assert self.enforce(start + timedelta(seconds=59)) == []
        moved = self.enforce(start + timedelta(seconds=61))
        assert moved == [transitions.Enforced("q", "FAILED", "not started in time")]
        task = self.task("q")
        assert (task.stage, task.attempts, task.owner) == ("FAILED", 0, "")
        assert task.last_error.startswith("not started in time")
        event = self.last_event("q")
        assert (event.verb, event.from_stage, event.to_stage, event.actor) == ("expire", "QUEUED", "FAILED",
                                                                               "system:reaper")
        assert event.version == task.version
        assert event.detail["reason"] == "not started in time"
        assert event.detail["queue_timeout_seconds"] == 60
        assert self.task("plain").stage == "QUEUED"  # no timeout, no deadline
        with pytest.raises(errors.InvalidTransition):
            transitions.claim("q", "agent", TTL, using=self.alias)
        # An operator may requeue it, as any FAILED task; its clock then starts again.
        transitions.requeue("q", actor="op", using=self.alias)
        assert self.enforce(self.task("q").stage_changed_at + timedelta(seconds=59)) == []

    def test_the_queue_clock_starts_when_the_task_may_start(self):
        """A run_at (or a snooze, or a retry's backoff) is waiting someone asked for: the queue
        timeout counts from not_before when it is later than the entry into QUEUED."""
        run_at = later(3600)
        self.new("later", queue_timeout_seconds=60, run_at=run_at)
        assert self.enforce(run_at - timedelta(seconds=1)) == []
        assert self.enforce(run_at + timedelta(seconds=59)) == []
        assert [m.task_id for m in self.enforce(run_at + timedelta(seconds=61))] == ["later"]

    def test_a_claimed_task_is_not_failed_by_its_queue_timeout(self):
        self.new("claimed", queue_timeout_seconds=60)
        held = transitions.claim("claimed", "agent", TTL, using=self.alias)
        assert self.enforce(later(3600)) == []
        transitions.complete("claimed", held.lease.token, {}, using=self.alias)
        assert self.task("claimed").stage == "COMPLETED"

    # -- the attempt timeout ---------------------------------------------------------------------

    def test_an_attempt_over_its_time_loses_its_lease_though_renewed_and_the_holder_is_refused(self):
        self.new("a", attempt_timeout_seconds=30, max_retries=1)
        held = transitions.claim("a", "agent", TTL, using=self.alias)
        start = self.task("a").stage_changed_at
        renewed = transitions.renew("a", held.lease.token, TTL, progress=0.5, using=self.alias)
        assert renewed.task.stage_changed_at == start  # a renew keeps the attempt's clock
        assert self.enforce(start + timedelta(seconds=29)) == []
        moved = self.enforce(start + timedelta(seconds=31))
        assert moved == [transitions.Enforced("a", "QUEUED", "attempt took too long")]
        task = self.task("a")
        assert (task.stage, task.owner, task.lease_token_hash, task.attempts) == ("QUEUED", "", None, 1)
        event = self.last_event("a")
        assert (event.verb, event.from_stage, event.to_stage) == ("reclaim", "RUNNING", "QUEUED")
        assert event.detail == {"previous_owner": "agent", "reason": "attempt took too long",
                                "attempt_timeout_seconds": 30, "due_at": event.detail["due_at"]}
        before = db_state(self.alias)
        for late_write in (lambda: transitions.renew("a", held.lease.token, TTL, using=self.alias),
                           lambda: transitions.complete("a", held.lease.token, {}, using=self.alias),
                           lambda: transitions.fail("a", held.lease.token, "x", using=self.alias),
                           lambda: transitions.pause("a", held.lease.token, {"c": 1}, using=self.alias),
                           lambda: transitions.release("a", held.lease.token, using=self.alias)):
            with pytest.raises(errors.LeaseLost):
                late_write()
        assert db_state(self.alias) == before
        # The last attempt over its time fails the task, as a lease lost on it does.
        second = transitions.claim("a", "agent-2", TTL, using=self.alias)
        start = self.task("a").stage_changed_at
        assert second.lease.fence == 2
        moved = self.enforce(start + timedelta(seconds=31))
        assert moved == [transitions.Enforced("a", "FAILED", "attempt took too long")]
        task = self.task("a")
        assert (task.stage, task.last_error) == ("FAILED", "attempt took too long on the last attempt")
        assert self.last_event("a").verb == "fail"

    def test_a_takeover_or_resume_starts_a_new_attempt_clock(self):
        self.new("t", attempt_timeout_seconds=30)
        held = transitions.claim("t", "agent", TTL, using=self.alias)
        transitions.pause("t", held.lease.token, {"step": 1}, using=self.alias)
        self.age("t", 3600, "stage_changed_at")  # paused an hour ago
        transitions.resume("t", "agent", TTL, using=self.alias)
        assert self.enforce(later(25)) == []
        assert [m.reason for m in self.enforce(later(35))] == ["attempt took too long"]

    # -- the progress timeout --------------------------------------------------------------------

    def test_a_renew_that_makes_progress_keeps_the_lease_and_a_heartbeat_alone_loses_it(self):
        for task_id in ("moving", "stuck", "saving"):
            self.new(task_id, progress_timeout_seconds=30)
        leases = {t: transitions.claim(t, "agent", TTL, using=self.alias).lease.token
                  for t in ("moving", "stuck", "saving")}
        for task_id, token in leases.items():
            transitions.renew(task_id, token, TTL, progress=0.1, using=self.alias)
            self.age(task_id, 25, "stage_changed_at", "progress_changed_at")  # 25 s ago
        before = {t: self.task(t).progress_changed_at for t in leases}
        transitions.renew("moving", leases["moving"], TTL, progress=0.2, using=self.alias)
        transitions.renew("stuck", leases["stuck"], TTL, progress=0.1, using=self.alias)  # the same: no progress
        transitions.renew("saving", leases["saving"], TTL, checkpoint={"page": 7}, using=self.alias)
        assert self.task("stuck").progress_changed_at == before["stuck"]
        assert self.task("moving").progress_changed_at > before["moving"]
        assert self.task("saving").progress_changed_at > before["saving"]
        moved = self.enforce(later(10))  # 35 s after the stuck one's last progress
        assert moved == [transitions.Enforced("stuck", "QUEUED", "no progress in 30 s")]
        assert self.last_event("stuck").detail["reason"] == "no progress in 30 s"
        with pytest.raises(errors.LeaseLost):
            transitions.renew("stuck", leases["stuck"], TTL, progress=0.9, using=self.alias)
        assert self.enforce(later(25)) == []  # the others progressed 25 s before
        assert {m.task_id for m in self.enforce(later(31))} == {"moving", "saving"}

    def test_a_renew_without_progress_or_checkpoint_is_a_heartbeat(self):
        self.new("beat", progress_timeout_seconds=30)
        token = transitions.claim("beat", "agent", TTL, using=self.alias).lease.token
        start = self.task("beat").stage_changed_at
        transitions.renew("beat", token, TTL, using=self.alias)
        assert self.task("beat").progress_changed_at is None  # counts from the claim
        assert [m.reason for m in self.enforce(start + timedelta(seconds=31))] == ["no progress in 30 s"]

    def test_a_pause_saves_progress(self):
        self.new("p", progress_timeout_seconds=30)
        token = transitions.claim("p", "agent", TTL, using=self.alias).lease.token
        paused = transitions.pause("p", token, {"step": 2}, using=self.alias)
        assert paused.progress_changed_at == paused.updated_at

    # -- races -----------------------------------------------------------------------------------

    def test_the_deadline_pass_racing_the_holders_complete_has_exactly_one_winner(self):
        """Each round: the pass, past the attempt's deadline, and the holder's complete, released
        together. Exactly one moves the task; the other is refused (LeaseLost) or finds nothing."""
        wins = {"complete": 0, "deadline": 0}
        for n in range(self.rounds):
            task_id = f"race-{n}"
            self.new(task_id, attempt_timeout_seconds=1)
            token = transitions.claim(task_id, "agent", TTL, using=self.alias).lease.token
            past = self.task(task_id).stage_changed_at + timedelta(seconds=5)
            completed, enforced = race([
                lambda: transitions.complete(task_id, token, {"n": n}, using=self.alias),
                lambda: transitions.enforce_deadlines(now=past, task_ids=[task_id], using=self.alias),
            ], self.alias)
            task = self.task(task_id)
            verbs = list(TaskEvent.objects.using(self.alias).filter(task_id=task_id)
                         .order_by("id").values_list("verb", flat=True))
            if isinstance(completed, Task):
                assert enforced == [], f"round {n}: both won"
                assert task.stage == "COMPLETED" and verbs == ["create", "claim", "complete"], (n, verbs)
                wins["complete"] += 1
            else:
                assert isinstance(completed, errors.LeaseLost), f"round {n}: {completed!r}"
                assert enforced == [transitions.Enforced(task_id, "QUEUED", "attempt took too long")], (n, enforced)
                assert task.stage == "QUEUED" and verbs == ["create", "claim", "reclaim"], (n, verbs)
                assert task.result is None
                wins["deadline"] += 1
        assert wins["complete"] + wins["deadline"] == self.rounds

    def test_a_heartbeat_racing_the_progress_deadline_never_saves_the_lease(self):
        """The pass is held to the progress clock, not to the version: a renew that only repeats
        its progress, committed first or not, cannot keep a lease past its progress deadline.
        Each round the lease is taken back exactly once, and the heartbeat either landed before
        (and changed nothing the deadline reads) or is refused."""
        for n in range(self.rounds):
            task_id = f"beat-{n}"
            self.new(task_id, progress_timeout_seconds=1)
            token = transitions.claim(task_id, "agent", TTL, using=self.alias).lease.token
            past = self.task(task_id).stage_changed_at + timedelta(seconds=5)
            renewed, enforced = race([
                lambda: transitions.renew(task_id, token, TTL, using=self.alias),
                lambda: transitions.enforce_deadlines(now=past, task_ids=[task_id], using=self.alias),
            ], self.alias)
            assert enforced == [transitions.Enforced(task_id, "QUEUED", "no progress in 1 s")], (n, enforced)
            verbs = list(TaskEvent.objects.using(self.alias).filter(task_id=task_id)
                         .order_by("id").values_list("verb", flat=True))
            if isinstance(renewed, errors.LeaseLost):
                assert verbs == ["create", "claim", "reclaim"], (n, verbs)
            else:
                assert isinstance(renewed, transitions.Claim), f"round {n}: {renewed!r}"
                assert verbs == ["create", "claim", "renew", "reclaim"], (n, verbs)
            assert self.task(task_id).stage == "QUEUED"

    # -- bad input -------------------------------------------------------------------------------

    @pytest.mark.parametrize("field", ["queue_timeout_seconds", "attempt_timeout_seconds",
                                       "progress_timeout_seconds"])
    @pytest.mark.parametrize("value", [0, -1, MAX_DEADLINE_SECONDS + 1, 1.5, True, "60"])
    def test_a_bad_deadline_is_refused_and_creates_nothing(self, field, value):
        before = db_state(self.alias)
        with pytest.raises(errors.InvalidRequest) as refused:
            self.new("bad", **{field: value})
        assert refused.value.field == field
        assert db_state(self.alias) == before


class TestSQLiteDeadlines(DeadlineContract):
    pytestmark = sqlite_db_mark()
    alias = "default"


class TestSQLiteOrmDeadlines(DeadlineContract):
    pytestmark = sqlite_db_mark()
    alias = "default"
    hot_path = "orm"


class TestPostgresDeadlines(DeadlineContract):
    pytestmark = postgres_db_mark()
    alias = "postgres"


class TestPostgresOrmDeadlines(DeadlineContract):
    pytestmark = postgres_db_mark()
    alias = "postgres"
    hot_path = "orm"


# ---------------------------------------------------------------------------------------------
# Over the API, and in the reaper's pass (SQLite: the API and the command are the same on every store)


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_deadlines_over_the_api_are_stored_shown_and_applied(http):
    agent = used_key("deadline-agent")
    task = create(http, agent, id="api-d", queue_timeout_seconds=60, attempt_timeout_seconds=1800,
                  progress_timeout_seconds=300)
    assert (task["queue_timeout_seconds"], task["attempt_timeout_seconds"], task["progress_timeout_seconds"],
            task["progress_changed_at"]) == (60, 1800, 300, None)
    claimed = post(http, "/tasks/api-d/claim", {"ttl_seconds": 60}, agent).json()
    renewed = post(http, "/tasks/api-d/renew", {"token": claimed["lease"]["token"], "ttl_seconds": 60,
                                                 "progress": 0.25}, agent).json()
    assert renewed["task"]["progress_changed_at"] is not None
    # The same create again is an idempotent retry; with other deadlines it is another task.
    again = post(http, "/tasks", {"title": "a task", "id": "api-d", "queue_timeout_seconds": 60,
                                  "attempt_timeout_seconds": 1800, "progress_timeout_seconds": 300}, agent)
    assert again.status_code == 200
    other = post(http, "/tasks", {"title": "a task", "id": "api-d", "queue_timeout_seconds": 61,
                                  "attempt_timeout_seconds": 1800, "progress_timeout_seconds": 300}, agent)
    assert_error(other, 409, "duplicate_id")


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("field", ["queue_timeout_seconds", "attempt_timeout_seconds", "progress_timeout_seconds"])
@pytest.mark.parametrize("value", [0, -5, MAX_DEADLINE_SECONDS + 1, 1.5, "60", True, [60]])
def test_a_bad_deadline_over_the_api_is_422_and_creates_nothing(http, field, value):
    agent = used_key("deadline-agent-2")
    before = db_state()
    error = assert_error(post(http, "/tasks", {"title": "t", field: value}, agent), 422, "validation_error")
    assert field in str(error)
    # In a batch too: all or nothing.
    assert_error(post(http, "/tasks", [{"title": "ok"}, {"title": "t", field: value}], agent), 422,
                 "validation_error")
    assert db_state() == before


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_reaper_pass_applies_the_deadlines_and_says_why():
    transitions.create([TaskSpec(id="r-queued", title="q", queue_timeout_seconds=1),
                        TaskSpec(id="r-running", title="r", attempt_timeout_seconds=1)])
    transitions.claim("r-running", "agent", TTL)
    for task_id in ("r-queued", "r-running"):  # both clocks started a minute ago
        Task.objects.filter(pk=task_id).update(stage_changed_at=timezone.now() - timedelta(minutes=1))
    out = io.StringIO()
    call_command("reap", stdout=out)
    assert sorted(out.getvalue().splitlines()) == ["attempt took too long: r-running -> QUEUED",
                                                   "not started in time: r-queued -> FAILED"]
    assert selectors.problems() == []


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_deadline_move_is_pushed_live_with_its_reason():
    """The live board reads the history: the pass's moves reach an open socket as any move does,
    the card in its new stage and the event with its reason."""
    transitions.create([TaskSpec(id="live-q", title="q", queue_timeout_seconds=60),
                        TaskSpec(id="live-r", title="r", progress_timeout_seconds=60)])
    transitions.claim("live-r", "agent", TTL)
    cookie = login_cookie()

    async def scenario():
        socket, connected, _ = await open_socket(cookie)
        assert connected
        frames: list = []
        await receive_until(socket, lambda m: m["type"] == "snapshot", frames)
        await sync_to_async(transitions.enforce_deadlines)(now=later(120))
        await receive_until(socket, lambda m: m["type"] == "task" and m["event"]["task"] == "live-r", frames)
        await socket.disconnect()
        return task_frames(frames)

    pushed = {m["event"]["task"]: m for m in run(scenario())}
    assert set(pushed) == {"live-q", "live-r"}
    assert (pushed["live-q"]["task"]["stage"], pushed["live-q"]["event"]["verb"],
            pushed["live-q"]["event"]["detail"]["reason"]) == ("FAILED", "expire", "not started in time")
    assert (pushed["live-r"]["task"]["stage"], pushed["live-r"]["event"]["verb"],
            pushed["live-r"]["event"]["detail"]["reason"]) == ("QUEUED", "reclaim", "no progress in 60 s")
    assert pushed["live-r"]["task"]["progress_timeout_seconds"] == 60
