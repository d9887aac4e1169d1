"""Periodic tasks (issue 29, item 6): a schedule creates a task from its template at each tick of
its five-field cron, read in its time zone, exactly once per tick across server processes and
restarts. The one module that writes board.models.Schedule.

**Exactly once, decided by the database.** A tick's task has an id made of the schedule's name
and the tick (`nightly:20261204T1405Z`, `tick_task_id`), and one write transaction both creates
it and advances the schedule's `next_tick_at` with a compare-and-swap on what was read
(`next_tick_at`, `version`, not paused). Two firers of one tick: the second's create meets the
first's id (`errors.DuplicateId`: it fired already) or its compare-and-swap matches no row, and
its whole transaction rolls back. Firers that disagree on the time (one sees the 14:05 tick due,
the other already 14:06) make one task per tick at most: only one of them advances the row, the
other's task is rolled back with its transaction. A tick whose task already exists (made by
hand, or before a crash in an older version) counts as fired. No check-then-act anywhere: a
read only chooses what to try (../shared/DESIGN.md section 7).

**Missed ticks** (the reaper did not run: downtime): only the most recent due tick fires, one
task; the ticks before it are skipped and counted on the schedule (`skipped_ticks`, up to
MAX_SKIPPED_TICKS_COUNTED per fire). The next tick is then the first one after now. A paused
schedule fires nothing; resuming it, or changing its cron or time zone, starts from the first
tick after that moment (the ticks of the pause are not missed ones).

**Time zones and DST** are cronsim's (Debian cron's rules): a time that a spring-forward skips
fires once at the first minute after the gap (a daily 02:30 runs at 03:00 that day), and a time
an autumn fall-back repeats fires once, for jobs with a fixed hour and minute; jobs with a `*`
or a step in those fields run at every real instant they match. Ticks are kept in UTC.

Fired by the reaper's pass (`manage.py reap`, which `manage.py serve` runs every second): it
calls `fire_due`. check() reports a schedule whose next tick is more than
SCHEDULE_MISSED_GRACE behind the store's clock (`schedule_missed`: no reaper is firing).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError
from django.db import DatabaseError, IntegrityError
from django.db.models import F

from board.engine import clock, errors, flow
from board.engine.inputs import is_valid_task_id, unstorable_text
from board.engine.limits import MAX_CRON_CHARS, MAX_SCHEDULE_NAME_CHARS, MAX_SKIPPED_TICKS_COUNTED
from board.engine.stores import TransactionConflict, retry_conflicts, store
from board.engine.transitions import TaskSpec, create
from board.engine.transitions.creation import _validate_spec
from board.models import Schedule

log = logging.getLogger("board.engine.schedules")

# The template's fields: what each tick's task is made from (its id is the name and the tick;
# no dependencies, no hold). Their defaults are TaskSpec's own.
TEMPLATE_FIELDS = ("title", "description", "payload", "queue", "priority", "max_retries", "concurrency_key",
                   "concurrency_limit", "rate_key", "fairness_key", "fairness_weight", "queue_timeout_seconds",
                   "attempt_timeout_seconds", "progress_timeout_seconds")
TEMPLATE_DEFAULTS: dict[str, Any] = {spec_field.name: spec_field.default for spec_field in dataclasses.fields(TaskSpec)
                                     if spec_field.name in TEMPLATE_FIELDS[1:]}
NEXT_TICKS_SHOWN = 5

UNSET: Any = object()


# ---------------------------------------------------------------------------------------------
# Inputs: each raises errors.InvalidRequest (422) naming its field, before anything is written.


def schedule_name(name: Any) -> str:
    """A task id's characters, short enough that `name:YYYYMMDDTHHMMZ` is one too."""
    if not is_valid_task_id(name) or len(name) > MAX_SCHEDULE_NAME_CHARS:
        raise errors.InvalidRequest(
            f"invalid schedule name {name!r}: 1-{MAX_SCHEDULE_NAME_CHARS} letters, digits and ._:- starting "
            "with a letter or digit (its tasks' ids are the name and the tick)", field="name")
    return name


def cron_expression(cron: Any) -> str:
    """Five fields (minute hour day-of-month month day-of-week), as cronsim reads them."""
    if not isinstance(cron, str) or not cron.strip() or len(cron) > MAX_CRON_CHARS or unstorable_text(cron):
        raise errors.InvalidRequest(f"cron must be a five-field cron expression of at most {MAX_CRON_CHARS} "
                                    "characters, e.g. '*/15 * * * *'", field="cron")
    cron = " ".join(cron.split())
    try:
        CronSim(cron, datetime(2026, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise errors.InvalidRequest(f"invalid cron {cron!r}: {exc} (five fields: minute hour day-of-month "
                                    "month day-of-week)", field="cron") from None
    return cron


@functools.cache
def _known_zones() -> frozenset[str]:
    # The IANA names of the system's database (/usr/share/zoneinfo) or the tzdata package:
    # a name is looked up in this set, never opened as a path.
    return frozenset(zoneinfo.available_timezones())


def time_zone(name: Any) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str) or name not in _known_zones():
        raise errors.InvalidRequest(f"unknown time zone {name!r}: an IANA name such as 'UTC' or 'Europe/Berlin'",
                                    field="timezone")
    return zoneinfo.ZoneInfo(name)


def template(task: Any) -> dict[str, Any]:
    """The task template with every field (defaults filled in), checked by the engine's own rules
    for a create (`transitions.create`'s validation, on the task the longest tick id would make)."""
    if not isinstance(task, dict):
        raise errors.InvalidRequest("task must be an object: the template of each tick's task "
                                    f"({', '.join(TEMPLATE_FIELDS)})", field="task")
    unknown = sorted(set(task) - set(TEMPLATE_FIELDS))
    if unknown:
        raise errors.InvalidRequest(f"task: unknown field {unknown[0]!r}; a template has {', '.join(TEMPLATE_FIELDS)}",
                                    field="task")
    if "title" not in task:
        raise errors.InvalidRequest("task needs a title", field="task")
    full = {"title": task["title"], **{name: task.get(name, default) for name, default in TEMPLATE_DEFAULTS.items()}}
    _validate_spec(TaskSpec(id="x" * MAX_SCHEDULE_NAME_CHARS + ":20261204T1405Z", **full))
    return full


# ---------------------------------------------------------------------------------------------
# Ticks


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


def ticks_after(cron: str, zone: str, moment: datetime) -> Any:
    """The ticks strictly after `moment` (aware), in UTC, in order (an endless iterator)."""
    local = moment.astimezone(zoneinfo.ZoneInfo(zone))
    return (_utc(tick) for tick in CronSim(cron, local))


def first_tick_after(cron: str, zone: str, moment: datetime) -> datetime:
    return next(ticks_after(cron, zone, moment))


def latest_tick_at_or_before(cron: str, zone: str, moment: datetime) -> datetime | None:
    """The last tick at or before `moment`. cronsim's reverse walk yields ticks strictly before
    its start (taken to the minute), and ticks fall on whole minutes: start a minute later. The
    minute is added in UTC: local arithmetic is wall-clock and would drop the fold of a repeated
    hour (02:00 CET + 1 min = 02:01 CEST, an hour early)."""
    start = (_utc(moment).replace(second=0, microsecond=0) + timedelta(minutes=1)).astimezone(zoneinfo.ZoneInfo(zone))
    return next((_utc(tick) for tick in CronSim(cron, start, reverse=True)), None)


def next_ticks(schedule: Schedule, count: int = NEXT_TICKS_SHOWN) -> list[datetime]:
    """The next `count` ticks it will fire, from `next_tick_at` on; none while paused."""
    if schedule.paused:
        return []
    later = ticks_after(schedule.cron, schedule.timezone, schedule.next_tick_at)
    return [schedule.next_tick_at, *itertools.islice(later, count - 1)]


def tick_task_id(name: str, tick: datetime) -> str:
    """The id of the task of `name`'s tick: a task id (letters, digits, ._:-; at most 100)."""
    return f"{name}:{_utc(tick):%Y%m%dT%H%MZ}"


def tick_dedup_key(name: str, tick: datetime) -> str:
    """The tick's dedup key (issue 29: the tick's time is in it)."""
    return f"schedule:{name}@{_utc(tick):%Y-%m-%dT%H:%MZ}"


# ---------------------------------------------------------------------------------------------
# Operators' verbs


def stored_template(schedule: Schedule) -> dict[str, Any]:
    """The schedule's template with every field: one stored before a field existed has its default."""
    return {**TEMPLATE_DEFAULTS, **schedule.task}


def _same(schedule: Schedule, cron: str, zone: str, task: dict, paused: bool) -> bool:
    return (schedule.cron, schedule.timezone, stored_template(schedule), schedule.paused) == (cron, zone, task, paused)


def _get(name: str, using: str) -> Schedule:
    schedule = Schedule.objects.using(using).filter(pk=name).first()
    if schedule is None:
        raise errors.NotFound(f"no schedule named {name!r}")
    return schedule


def _ensure_rows(using: str, task: dict) -> None:
    """The template's queue and key rows, made as a create of its task makes them (outside the
    transaction that needs them: flow.ensure_rows says why)."""
    # (A template stored before rate keys has no rate_key: none.)
    flow.ensure_rows(using, [task["queue"]], [task["concurrency_key"]] if task["concurrency_key"] else [],
                     [task["rate_key"]] if task.get("rate_key") else [])


@retry_conflicts
def create_schedule(name: str, *, cron: str, task: dict, timezone: str = "UTC", paused: bool = False,
                    actor: str = "", using: str = "default") -> tuple[Schedule, bool]:
    """Create a schedule; its first tick is the first one after now. Returns (schedule, created):
    the same name with the same settings (cron, time zone, template, paused) returns the
    existing schedule and False, so that a create may be retried; other settings under that
    name are DuplicateName. Bad input: InvalidRequest, nothing written."""
    name, cron = schedule_name(name), cron_expression(cron)
    time_zone(timezone)
    task = template(task)
    if not isinstance(paused, bool):
        raise errors.InvalidRequest("paused must be true or false", field="paused")
    _ensure_rows(using, task)
    s = store(using)
    with s.write_transaction():
        existing = Schedule.objects.using(using).filter(pk=name).first()
        if existing is None:
            now = clock.now(using)
            schedule = Schedule(name=name, cron=cron, timezone=timezone, task=task, paused=paused,
                                next_tick_at=first_tick_after(cron, timezone, now), created_by=actor,
                                created_at=now, updated_at=now)
            try:
                with s.savepoint():  # a creator of the same name that committed after the read
                    Schedule.objects.using(using).bulk_create([schedule])
                return schedule, True
            except IntegrityError:
                existing = Schedule.objects.using(using).filter(pk=name).first()
                if existing is None:  # not the name: let the real error surface
                    raise
        if _same(existing, cron, timezone, task, paused):
            return existing, False
        raise errors.DuplicateName(f"a schedule named {name!r} already exists with other settings "
                                   f"(cron {existing.cron!r}, timezone {existing.timezone!r})", field="name")


@retry_conflicts
def change_schedule(name: str, *, cron: Any = UNSET, timezone: Any = UNSET, task: Any = UNSET,
                    paused: Any = UNSET, using: str = "default") -> Schedule:
    """Change what is given (a `task` replaces the whole template). A new cron or time zone, or a
    resume, starts from the first tick after now (a pause's ticks are not missed ones); a new
    template applies from the next tick. Nothing changed: nothing written."""
    if cron is not UNSET:
        cron = cron_expression(cron)
    if timezone is not UNSET:
        time_zone(timezone)
    if task is not UNSET:
        task = template(task)
        _ensure_rows(using, task)
    if paused is not UNSET and not isinstance(paused, bool):
        raise errors.InvalidRequest("paused must be true or false", field="paused")
    with store(using).write_transaction():
        schedule = _get(name, using)
        wanted = {field: value for field, value in (("cron", cron), ("timezone", timezone), ("task", task),
                                                    ("paused", paused)) if value is not UNSET}
        values = {field: value for field, value in wanted.items() if getattr(schedule, field) != value}
        if not values:
            return schedule
        now = clock.now(using)
        restarts = "cron" in values or "timezone" in values or values.get("paused") is False
        if restarts:
            values["next_tick_at"] = first_tick_after(values.get("cron", schedule.cron),
                                                      values.get("timezone", schedule.timezone), now)
        values["updated_at"] = now
        # Held to the version read: a concurrent change makes this run again on the new row, and
        # a fire that read the old settings commits nothing (its compare-and-swap names the version).
        if not Schedule.objects.using(using).filter(pk=name, version=schedule.version).update(
                version=F("version") + 1, **values):
            raise TransactionConflict(f"schedule {name} changed meanwhile")
        return _get(name, using)


@retry_conflicts
def delete_schedule(name: str, *, using: str = "default") -> Schedule:
    """Delete a schedule (the tasks it made stay). NotFound if there is none."""
    with store(using).write_transaction():
        schedule = _get(name, using)
        Schedule.objects.using(using).filter(pk=name).delete()
    return schedule


def describe(schedule: Schedule) -> dict[str, Any]:
    """A schedule as the API and the client show it."""
    return {
        "name": schedule.name, "cron": schedule.cron, "timezone": schedule.timezone, "task": stored_template(schedule),
        "paused": schedule.paused, "next_tick_at": None if schedule.paused else schedule.next_tick_at,
        "next_ticks": next_ticks(schedule), "last_tick_at": schedule.last_tick_at,
        "last_task_id": schedule.last_task_id or None, "skipped_ticks": schedule.skipped_ticks,
        "created_by": schedule.created_by, "created_at": schedule.created_at, "updated_at": schedule.updated_at,
    }


# ---------------------------------------------------------------------------------------------
# Firing: the reaper's pass calls fire_due


@dataclasses.dataclass(frozen=True)
class Fired:
    """What one due schedule's fire did: the tick fired, its task's id, whether this fire created
    it (False: the task already existed, so the tick had fired), how many missed ticks before it
    were skipped; or `error`, the refusal that kept it from firing (the schedule stays due)."""

    schedule: str
    tick: datetime | None = None
    task_id: str | None = None
    created: bool = False
    skipped: int = 0
    error: str | None = None


class _Overtaken(Exception):
    """The schedule's row moved after it was read (fired, changed, paused or deleted by someone
    else): this fire's transaction rolls back, its task with it."""


def fire_due(*, now: datetime | None = None, using: str = "default") -> list[Fired]:
    """Fire every schedule due at `now` (the store's clock unless given): the ones not paused
    whose next tick is at or before it, each in a transaction of its own. A schedule another
    process fired meanwhile is left out of the answer."""
    now = now or clock.now(using)
    due = list(Schedule.objects.using(using).filter(paused=False, next_tick_at__lte=now)
               .order_by("next_tick_at", "name").values_list("name", "task"))
    fired = []
    for name, task in due:
        try:
            _ensure_rows(using, {**TEMPLATE_DEFAULTS, **task})
            done = _fire(name, now, using=using)
        except errors.BoardError as exc:
            # The template was valid when saved; a refusal now (a rule tightened since) leaves the
            # schedule due, so check() reports it missed until an operator changes it.
            log.warning("schedule %s: not fired: %s", name, exc.message)
            fired.append(Fired(name, error=exc.message))
            continue
        except DatabaseError:
            raise  # the store is away: the reaper's loop reports it and tries again
        except Exception as exc:  # one schedule's fault must not stop the reaper's other work
            log.exception("schedule %s: not fired", name)
            fired.append(Fired(name, error=f"{type(exc).__name__}: {exc}"))
            continue
        if done is not None:
            fired.append(done)
    return fired


@retry_conflicts
def _fire(name: str, now: datetime, *, using: str) -> Fired | None:
    try:
        with store(using).write_transaction():
            # Locked where the store has row locks (PostgreSQL), only so that a second firer waits
            # for the first one's commit and then finds nothing due, instead of trying the tick's
            # create into DuplicateId. Not the mechanism: the id and the swap below decide.
            schedule = store(using).lock_rows(Schedule.objects.using(using).filter(
                pk=name, paused=False, next_tick_at__lte=now)).first()
            if schedule is None:
                return None  # fired, paused, changed or deleted since the list was read
            expected = schedule.next_tick_at
            # The missed-ticks rule: the latest due tick fires; those before it are skipped.
            tick = max(latest_tick_at_or_before(schedule.cron, schedule.timezone, now) or expected, expected)
            skipped = 0
            for missed in itertools.chain([expected], ticks_after(schedule.cron, schedule.timezone, expected)):
                if missed >= tick or skipped >= MAX_SKIPPED_TICKS_COUNTED:
                    break
                skipped += 1
            # The tick is in the task's id and its dedup key: while the tick's task is live, a
            # create with either returns or refuses it.
            spec = TaskSpec(id=tick_task_id(name, tick), dedup_key=tick_dedup_key(name, tick), **schedule.task)
            try:
                created = not create(spec, actor=f"schedule:{name}", using=using)[0].deduplicated
            except errors.DuplicateId:
                created = False  # this tick's task exists: the tick has fired
            if not Schedule.objects.using(using).filter(
                    pk=name, version=schedule.version, next_tick_at=expected, paused=False).update(
                    next_tick_at=first_tick_after(schedule.cron, schedule.timezone, now), last_tick_at=tick,
                    last_task_id=spec.id, skipped_ticks=F("skipped_ticks") + skipped):
                raise _Overtaken
    except _Overtaken:
        return None
    return Fired(name, tick, spec.id, created, skipped)
