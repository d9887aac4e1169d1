"""Schedules (issue 29, item 6: periodic tasks), board.engine.schedules: ticks in a time zone
across DST, the operators' verbs and their refusals, firing each tick exactly once (a race of
firers released by a barrier, many rounds), the missed-ticks rule and check()'s schedule_missed.

`ScheduleContract` runs on each store, the contract suite's way (tests/test_contract.py): SQLite
and PostgreSQL here, MongoDB in tests/mongodb/test_schedules_mongodb.py. Time is passed (`now=`),
never slept."""
from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.forms.models import model_to_dict

from board.engine import errors, schedules, selectors, stores
from board.engine.inputs import is_valid_task_id
from board.engine.limits import MAX_SCHEDULE_NAME_CHARS, SCHEDULE_MISSED_GRACE
from board.models import FairnessKey, Queue, Schedule, Task, TaskEvent
from tests.support import db_state, postgres_db_mark, race, sqlite_db_mark

BERLIN = "Europe/Berlin"
TEMPLATE = {"title": "nightly report", "payload": {"report": "daily"}, "queue": "reports", "priority": 5}


def utc(*parts) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def local(moment: datetime, zone: str = BERLIN) -> str:
    return moment.astimezone(ZoneInfo(zone)).isoformat()


# -- ticks: pure, no database ------------------------------------------------------------------


def test_a_daily_time_skipped_by_spring_forward_fires_once_at_the_end_of_the_gap():
    # Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    ticks = itertools.islice(schedules.ticks_after("30 2 * * *", BERLIN, utc(2026, 3, 27, 12)), 3)
    assert [local(t) for t in ticks] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_a_daily_time_repeated_by_fall_back_fires_once():
    # Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice, fires once.
    ticks = itertools.islice(schedules.ticks_after("30 2 * * *", BERLIN, utc(2026, 10, 23, 12)), 3)
    assert [local(t) for t in ticks] == [
        "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]


def test_an_interval_fires_at_every_real_instant_across_both_changes():
    autumn = list(itertools.islice(schedules.ticks_after("*/30 * * * *", BERLIN, utc(2026, 10, 24, 23)), 6))
    assert [t.isoformat() for t in autumn] == [  # every 30 minutes of real time, the repeated hour too
        f"2026-10-{d}T{h}:00+00:00" for d, h in (("24", "23:30"), ("25", "00:00"), ("25", "00:30"),
                                                 ("25", "01:00"), ("25", "01:30"), ("25", "02:00"))]
    spring = list(itertools.islice(schedules.ticks_after("0 * * * *", BERLIN, utc(2026, 3, 28, 23)), 3))
    assert [local(t) for t in spring] == [  # 02:00 does not exist: no tick is invented for it
        "2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00"]


def test_a_cron_is_read_in_its_time_zone():
    after = utc(2026, 12, 4, 12)
    assert schedules.first_tick_after("0 9 * * *", "UTC", after) == utc(2026, 12, 5, 9)
    assert schedules.first_tick_after("0 9 * * *", "America/New_York", after) == utc(2026, 12, 4, 14)
    assert schedules.first_tick_after("0 9 * * *", "Asia/Kolkata", after) == utc(2026, 12, 5, 3, 30)


@pytest.mark.parametrize("cron", ["*/30 * * * *", "0 * * * *", "30 2 * * *", "15 1-3 * * 0", "*/7 2 * * *",
                                  "0 0 L * *", "30 2 * * 5#2", "0 12 LW * *", "0 3 * * 0L"])
@pytest.mark.parametrize("zone", [BERLIN, "America/New_York", "Australia/Lord_Howe", "UTC"])
def test_the_latest_due_tick_is_the_last_of_the_forward_ticks_at_or_before_now(cron, zone):
    """The missed-ticks rule fires the latest tick at or before now (cronsim's reverse walk);
    it must agree with the forward ticks, DST changes included, at and between ticks."""
    windows = [(utc(2026, 3, 1), utc(2026, 4, 30)), (utc(2026, 10, 1), utc(2026, 11, 30))]  # both DST changes
    for start, end in windows:
        forward = list(itertools.takewhile(lambda t: t < end, schedules.ticks_after(cron, zone, start)))
        assert forward
        _agree_backwards(cron, zone, forward)


def _agree_backwards(cron: str, zone: str, forward: list[datetime]) -> None:
    for tick, following in itertools.pairwise(forward):
        assert schedules.latest_tick_at_or_before(cron, zone, tick) == tick
        between = tick + (following - tick) / 2
        assert schedules.latest_tick_at_or_before(cron, zone, between) == tick, (tick, following)


def test_a_tick_task_id_is_a_task_id_for_the_longest_name():
    name = "n" * MAX_SCHEDULE_NAME_CHARS
    task_id = schedules.tick_task_id(name, utc(2026, 12, 4, 14, 5))
    assert task_id == f"{name}:20261204T1405Z" and len(task_id) == 100 and is_valid_task_id(task_id)
    assert schedules.tick_dedup_key("nightly", utc(2026, 12, 4, 14, 5)) == "schedule:nightly@2026-12-04T14:05Z"


# -- the engine, on each store ----------------------------------------------------------------


def everything(using: str) -> tuple:
    """The board and its schedules, to compare before and after a refused call."""
    rows = [model_to_dict(s) for s in Schedule.objects.using(using).order_by("pk")]
    return db_state(using), rows, sorted(Queue.objects.using(using).values_list("name", flat=True))


class ScheduleContract:
    alias: str
    rounds = 120
    racers = 8

    def make(self, name: str = "nightly", cron: str = "* * * * *", **settings) -> Schedule:
        settings.setdefault("task", TEMPLATE)
        schedule, created = schedules.create_schedule(name, cron=cron, actor="ops", using=self.alias, **settings)
        assert created
        return schedule

    def row(self, name: str = "nightly") -> Schedule:
        return Schedule.objects.using(self.alias).get(pk=name)

    def tasks(self) -> list[str]:
        return sorted(Task.objects.using(self.alias).values_list("id", flat=True))

    # -- create, change, delete -------------------------------------------------------------------

    def test_a_schedule_starts_at_its_first_tick_after_now_with_its_template_filled_in(self):
        schedule = self.make(cron="0 9 * * MON-FRI", timezone=BERLIN)
        assert schedule.next_tick_at > schedule.created_at
        assert schedule.next_tick_at == schedules.first_tick_after("0 9 * * MON-FRI", BERLIN, schedule.created_at)
        stored = self.row()
        assert stored.task == {**schedules.TEMPLATE_DEFAULTS, **TEMPLATE}
        assert (stored.cron, stored.timezone, stored.paused, stored.created_by) == ("0 9 * * MON-FRI", BERLIN, False, "ops")
        assert Queue.objects.using(self.alias).filter(name="reports").exists()  # listed before its first task
        assert self.tasks() == []

    def test_the_same_create_again_returns_the_schedule_and_another_is_a_duplicate_name(self):
        first = self.make(cron="*/5 * * * *")
        again, created = schedules.create_schedule("nightly", cron="*/5  *  * * *", task=TEMPLATE, using=self.alias)
        assert not created and again.next_tick_at == first.next_tick_at and again.version == first.version
        before = everything(self.alias)
        with pytest.raises(errors.DuplicateName) as refused:
            schedules.create_schedule("nightly", cron="*/10 * * * *", task=TEMPLATE, using=self.alias)
        assert (refused.value.code, refused.value.http_status, refused.value.field) == ("duplicate_name", 409, "name")
        assert everything(self.alias) == before

    @pytest.mark.parametrize("bad, field", [
        ({"cron": "* * * *"}, "cron"), ({"cron": "* * * * * *"}, "cron"), ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "@daily"}, "cron"), ({"cron": "0 0 30 2 *"}, "cron"), ({"cron": ""}, "cron"),
        ({"cron": "bonjour"}, "cron"), ({"cron": 5}, "cron"), ({"cron": "0 0 * * *\x00"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"), ({"timezone": "../../etc/passwd"}, "timezone"),
        ({"timezone": ""}, "timezone"), ({"timezone": None}, "timezone"),
        ({"task": {}}, "task"), ({"task": "do it"}, "task"), ({"task": {"title": "t", "id": "x"}}, "task"),
        ({"task": {"title": "t", "deps": ["a"]}}, "task"), ({"task": {"title": ""}}, "title"),
        ({"task": {"title": "t", "queue": "no spaces"}}, "queue"), ({"task": {"title": "t", "priority": "1"}}, "priority"),
        ({"task": {"title": "t", "concurrency_limit": 2}}, "concurrency_limit"),
        ({"task": {"title": "t", "payload": float("nan")}}, "payload"), ({"name": "has space"}, "name"),
        ({"name": "n" * (MAX_SCHEDULE_NAME_CHARS + 1)}, "name"), ({"paused": "yes"}, "paused"),
    ])
    def test_bad_input_is_refused_and_writes_nothing(self, bad, field):
        self.make("existing")
        before = everything(self.alias)
        given = {"name": "new", "cron": "*/5 * * * *", "task": {"title": "t", "queue": "fresh"}, **bad}
        with pytest.raises(errors.InvalidRequest) as refused:
            schedules.create_schedule(given.pop("name"), using=self.alias, **given)
        assert (refused.value.http_status, refused.value.field) == (422, field)
        assert everything(self.alias) == before
        change = {k: v for k, v in bad.items() if k != "name"}
        if change:
            with pytest.raises(errors.InvalidRequest):
                schedules.change_schedule("existing", using=self.alias, **change)
            assert everything(self.alias) == before

    def test_a_change_of_cron_or_zone_or_a_resume_starts_from_the_first_tick_after_now(self):
        made = self.make(cron="0 0 1 1 *")
        same = schedules.change_schedule("nightly", cron="0 0 1 1 *", using=self.alias)
        assert same.version == made.version  # nothing changed: nothing written
        changed = schedules.change_schedule("nightly", cron="0 9 * * *", timezone="Asia/Tokyo", using=self.alias)
        assert changed.version == made.version + 1
        assert changed.next_tick_at == schedules.first_tick_after("0 9 * * *", "Asia/Tokyo", changed.updated_at)
        templated = schedules.change_schedule("nightly", task={"title": "other"}, using=self.alias)
        assert templated.next_tick_at == changed.next_tick_at  # a template applies from the next tick
        assert templated.task == {**schedules.TEMPLATE_DEFAULTS, "title": "other"}
        paused = schedules.change_schedule("nightly", paused=True, using=self.alias)
        assert paused.paused and schedules.describe(paused)["next_ticks"] == []
        resumed = schedules.change_schedule("nightly", paused=False, using=self.alias)
        assert resumed.next_tick_at == schedules.first_tick_after("0 9 * * *", "Asia/Tokyo", resumed.updated_at)
        assert schedules.describe(resumed)["next_ticks"] == list(itertools.islice(
            itertools.chain([resumed.next_tick_at], schedules.ticks_after("0 9 * * *", "Asia/Tokyo",
                                                                          resumed.next_tick_at)), 5))

    def test_delete_removes_the_schedule_and_keeps_its_tasks(self):
        schedule = self.make()
        schedules.fire_due(now=schedule.next_tick_at, using=self.alias)
        schedules.delete_schedule("nightly", using=self.alias)
        assert not Schedule.objects.using(self.alias).exists()
        assert self.tasks() == [schedules.tick_task_id("nightly", schedule.next_tick_at)]
        with pytest.raises(errors.NotFound):
            schedules.delete_schedule("nightly", using=self.alias)
        with pytest.raises(errors.NotFound):
            schedules.change_schedule("nightly", paused=True, using=self.alias)

    # -- firing -----------------------------------------------------------------------------------

    def test_a_due_tick_creates_its_task_once_and_moves_to_the_next_tick(self):
        schedule = self.make(cron="*/15 * * * *")
        tick = schedule.next_tick_at
        assert schedules.fire_due(now=tick - timedelta(seconds=1), using=self.alias) == []
        (fired,) = schedules.fire_due(now=tick + timedelta(seconds=3), using=self.alias)
        task_id = schedules.tick_task_id("nightly", tick)
        assert (fired.schedule, fired.tick, fired.task_id, fired.created, fired.skipped) == (
            "nightly", tick, task_id, True, 0)
        task = Task.objects.using(self.alias).get(pk=task_id)
        assert (task.title, task.payload, task.queue, task.priority, task.stage) == (
            "nightly report", {"report": "daily"}, "reports", 5, "QUEUED")
        event = TaskEvent.objects.using(self.alias).get(task_id=task_id)
        assert (event.verb, event.actor) == ("create", "schedule:nightly")
        row = self.row()
        assert (row.next_tick_at, row.last_tick_at, row.last_task_id, row.skipped_ticks) == (
            tick + timedelta(minutes=15), tick, task_id, 0)
        assert schedules.fire_due(now=tick + timedelta(seconds=3), using=self.alias) == []  # fired already
        assert self.tasks() == [task_id]

    def test_a_tick_task_takes_the_templates_fairness_key_and_deadlines(self):
        schedule = self.make(task={**TEMPLATE, "fairness_key": "plan:nightly", "fairness_weight": 2,
                                   "queue_timeout_seconds": 600, "attempt_timeout_seconds": 60,
                                   "progress_timeout_seconds": 30}, cron="*/15 * * * *")
        (fired,) = schedules.fire_due(now=schedule.next_tick_at + timedelta(seconds=1), using=self.alias)
        task = Task.objects.using(self.alias).get(pk=fired.task_id)
        assert (task.fairness_key, task.queue_timeout_seconds, task.attempt_timeout_seconds,
                task.progress_timeout_seconds) == ("plan:nightly", 600, 60, 30)
        assert FairnessKey.objects.using(self.alias).get(name="plan:nightly").weight == 2

    def test_after_downtime_only_the_latest_missed_tick_fires_and_the_others_are_counted(self):
        schedule = self.make(cron="*/10 * * * *")
        first = schedule.next_tick_at
        now = first + timedelta(hours=5, minutes=7)  # ticks at first, first+10m, ... first+5h: 31
        (fired,) = schedules.fire_due(now=now, using=self.alias)
        assert (fired.tick, fired.skipped, fired.created) == (first + timedelta(hours=5), 30, True)
        assert self.tasks() == [schedules.tick_task_id("nightly", first + timedelta(hours=5))]
        row = self.row()
        assert (row.skipped_ticks, row.next_tick_at) == (30, first + timedelta(hours=5, minutes=10))
        assert row.next_tick_at > now

    def test_a_tick_whose_task_exists_counts_as_fired(self):
        schedule = self.make()
        tick = schedule.next_tick_at
        from board.engine.transitions import TaskSpec, create

        create(TaskSpec(id=schedules.tick_task_id("nightly", tick), title="made by hand"), using=self.alias)
        (fired,) = schedules.fire_due(now=tick, using=self.alias)
        assert (fired.created, fired.task_id) == (False, schedules.tick_task_id("nightly", tick))
        assert Task.objects.using(self.alias).get(pk=fired.task_id).title == "made by hand"
        assert self.row().next_tick_at == tick + timedelta(minutes=1)

    def test_a_schedule_that_cannot_fire_is_reported_and_the_others_still_fire(self):
        made = {name: self.make(name) for name in ("bad-cron", "bad-task", "good")}
        # Rows written behind the engine's back (no call of the engine accepts these).
        Schedule.objects.using(self.alias).filter(pk="bad-cron").update(cron="not a cron")
        Schedule.objects.using(self.alias).filter(pk="bad-task").update(task={**made["good"].task, "title": ""})
        before = {name: model_to_dict(self.row(name)) for name in ("bad-cron", "bad-task")}
        now = max(schedule.next_tick_at for schedule in made.values())
        fired = {f.schedule: f for f in schedules.fire_due(now=now, using=self.alias)}
        assert fired["good"].created and fired["good"].error is None
        assert fired["bad-cron"].error.startswith("CronSimError")
        assert fired["bad-task"].error.startswith("title must be non-empty")
        assert {name: model_to_dict(self.row(name)) for name in before} == before  # still due: check() says so
        assert self.tasks() == [fired["good"].task_id]
        assert {p.task for p in selectors.problems(now=now + SCHEDULE_MISSED_GRACE + timedelta(seconds=1),
                                                   using=self.alias)} == {"schedule:bad-cron", "schedule:bad-task"}
        Schedule.objects.using(self.alias).filter(pk__in=["bad-cron", "bad-task"]).delete()

    def test_a_paused_schedule_fires_nothing_and_a_resumed_one_skips_the_pause(self):
        schedule = self.make()
        schedules.change_schedule("nightly", paused=True, using=self.alias)
        assert schedules.fire_due(now=schedule.next_tick_at + timedelta(hours=1), using=self.alias) == []
        assert self.tasks() == []
        assert selectors.problems(now=schedule.next_tick_at + timedelta(hours=1), using=self.alias) == []

    def test_check_reports_a_schedule_whose_tick_is_past_the_grace(self):
        schedule = self.make(cron="*/5 * * * *")
        tick = schedule.next_tick_at
        assert selectors.problems(now=tick + SCHEDULE_MISSED_GRACE, using=self.alias) == []
        (problem,) = selectors.problems(now=tick + SCHEDULE_MISSED_GRACE + timedelta(seconds=1), using=self.alias)
        assert (problem.task, problem.code) == ("schedule:nightly", "schedule_missed")
        schedules.fire_due(now=tick + SCHEDULE_MISSED_GRACE + timedelta(seconds=1), using=self.alias)
        assert selectors.problems(now=tick + SCHEDULE_MISSED_GRACE + timedelta(seconds=1), using=self.alias) == []

    def test_racing_firers_create_exactly_one_task_per_tick(self):
        self.race_one_tick()

    def test_firers_that_disagree_on_the_time_never_fire_a_tick_twice(self):
        self.race_disagreeing_clocks()

    def race_one_tick(self) -> None:
        """`racers` threads, released together, each fire the same due tick (the same `now`),
        `rounds` times: exactly one task per tick, one fire reported as its creator, and the
        schedule on the next tick; no racer fails."""
        schedule = self.make()
        tick = schedule.next_tick_at
        for n in range(self.rounds):
            now = tick + timedelta(seconds=n % 60)  # somewhere in the tick's minute
            results = race([lambda: schedules.fire_due(now=now, using=self.alias)] * self.racers, self.alias)
            faults = [r for r in results if isinstance(r, BaseException)]
            assert not faults, f"round {n}: {faults[:3]}"
            fired = [f for result in results for f in result]
            assert [f.error for f in fired] == [None] * len(fired), f"round {n}: {fired}"
            created = [f for f in fired if f.created]
            assert len(created) == 1 and created[0].tick == tick, f"round {n}: {fired}"
            assert Task.objects.using(self.alias).count() == n + 1, f"round {n}"
            assert self.row().next_tick_at == tick + timedelta(minutes=1), f"round {n}"
            tick += timedelta(minutes=1)
        assert self.tasks() == sorted(schedules.tick_task_id("nightly", schedule.next_tick_at + timedelta(minutes=n))
                                      for n in range(self.rounds))
        assert self.row().skipped_ticks == 0

    def race_disagreeing_clocks(self) -> None:
        """Half the racers see the tick due, the other half already the next one (clocks a
        minute apart), so they try different ticks' tasks: each tick's task is made at most
        once, and every tick is either made or counted as skipped."""
        schedule = self.make()
        tick = schedule.next_tick_at
        for n in range(self.rounds // 2):
            nows = [tick + timedelta(seconds=30), tick + timedelta(minutes=1, seconds=30)]
            results = race([lambda i=i: schedules.fire_due(now=nows[i % 2], using=self.alias)
                            for i in range(self.racers)], self.alias)
            faults = [r for r in results if isinstance(r, BaseException)]
            assert not faults, f"round {n}: {faults[:3]}"
            # Someone always fires (a loser lost to a commit); how far the row moved depends on
            # who went first: one tick (a late racer's tick lost to an early commit), or two.
            assert self.row().next_tick_at in (tick + timedelta(minutes=1), tick + timedelta(minutes=2)), f"round {n}"
            tick = self.row().next_tick_at
        made = Task.objects.using(self.alias).count()
        ticks = (tick - schedule.next_tick_at) // timedelta(minutes=1)
        assert made + self.row().skipped_ticks == ticks
        assert len(set(self.tasks())) == made >= self.rounds // 2


class TestSQLiteSchedules(ScheduleContract):
    pytestmark = sqlite_db_mark()
    alias = "default"


class TestPostgresSchedules(ScheduleContract):
    pytestmark = postgres_db_mark()
    alias = "postgres"

    # A fire locks the schedule's row where the store has row locks (PostgreSQL only), so that
    # a second firer waits and then finds nothing due. Without it the racers meet where the rule
    # is decided, the tick's task id and the compare-and-swap: these run the races that way.

    @pytest.fixture
    def without_row_locks(self, monkeypatch):
        monkeypatch.setattr(type(stores.store(self.alias)), "lock_rows", lambda self, rows: rows)

    def test_without_row_locks_racing_firers_still_create_one_task_per_tick(self, without_row_locks):
        self.race_one_tick()

    def test_without_row_locks_firers_that_disagree_on_the_time_still_fire_each_tick_once(self, without_row_locks):
        self.race_disagreeing_clocks()
