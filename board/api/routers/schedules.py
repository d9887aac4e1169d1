"""Schedules (issue 29, periodic tasks): a task created at each tick of a cron, in a time zone,
exactly once per tick (board.engine.schedules). Operators create, change and delete them (the
queue changers' rule: operator keys, or staff with board.change_queue); readers list them.

A schedule creates its tasks in its template's queue, so a key limited to some queues sees and
changes only the schedules of those queues (any other is absent to it: 404), and creates only
there (403), as with tasks."""
from __future__ import annotations

from ninja import Router, Status

from board.api.auth import require_queue_changer, require_reader
from board.api.errors import ERRORS
from board.api.schemas import ScheduleChangeIn, ScheduleIn, ScheduleList, ScheduleOut
from board.engine import errors, schedules, scopes
from board.models import Schedule

router = Router()


def _visible(request, name: str) -> Schedule:
    """The schedule `name`, if the caller's scope covers its template's queue; else 404."""
    schedule = Schedule.objects.filter(pk=name).first()
    if schedule is None or not scopes.allows(request.auth.scope, schedule.task.get("queue", "default")):
        raise errors.NotFound(f"no schedule named {name!r}")
    return schedule


@router.get("/schedules", response={200: ScheduleList, **ERRORS}, summary="Every schedule, by name")
def list_schedules(request):
    """Each schedule with its next ticks. A key limited to some queues sees the schedules of those."""
    require_reader(request)
    return {"items": [schedules.describe(s) for s in Schedule.objects.order_by("name")
                      if scopes.allows(request.auth.scope, s.task.get("queue", "default"))]}


@router.post("/schedules", response={200: ScheduleOut, 201: ScheduleOut, **ERRORS},
             summary="Operator: create a periodic task (a cron, in UTC or a given time zone)")
def create_schedule(request, body: ScheduleIn):
    """At each tick of `cron` (five fields, read in `timezone`) the board creates one task from
    `task`, with the id `NAME:YYYYMMDDTHHMMZ` (the tick in UTC), exactly once per tick however
    many server processes run. The first tick is the first one after now. After downtime only
    the most recent missed tick fires (one task); the ticks before it are counted in
    `skipped_ticks`. The same body again under an existing name answers that schedule (200);
    other settings under it are 409 `duplicate_name`. An invalid cron or an unknown time zone
    is 422 `validation_error`; nothing is written."""
    principal = require_queue_changer(request)
    if not scopes.allows(principal.scope, body.task.queue):
        raise errors.Forbidden(f"this key may create tasks only in queues matching {scopes.stored(principal.scope)}; "
                               f"not in {body.task.queue}")
    schedule, created = schedules.create_schedule(
        body.name, cron=body.cron, timezone=body.timezone, task=body.task.model_dump(), paused=body.paused,
        actor=principal.name)
    return Status(201 if created else 200, schedules.describe(schedule))


@router.get("/schedules/{name}", response={200: ScheduleOut, **ERRORS}, summary="One schedule and its next 5 ticks")
def get_schedule(request, name: str):
    require_reader(request)
    return schedules.describe(_visible(request, name))


@router.put("/schedules/{name}", response={200: ScheduleOut, **ERRORS},
            summary="Operator: change a schedule's cron, time zone or template, pause or resume it")
def change_schedule(request, name: str, body: ScheduleChangeIn):
    """Only the fields sent change; `task` replaces the whole template (from the next tick on). A
    new cron or time zone, or a resume, starts from the first tick after now: the ticks of a
    pause are not fired."""
    principal = require_queue_changer(request)
    _visible(request, name)
    sent = body.model_fields_set
    for field in sorted(sent):
        if getattr(body, field) is None:
            raise errors.InvalidRequest(f"{field} may not be null (leave it out to keep it)", field=field)
    if body.task is not None and not scopes.allows(principal.scope, body.task.queue):
        raise errors.Forbidden(f"this key may create tasks only in queues matching {scopes.stored(principal.scope)}; "
                               f"not in {body.task.queue}")
    changed = schedules.change_schedule(
        name, **{field: body.task.model_dump() if field == "task" else getattr(body, field) for field in sent})
    return schedules.describe(changed)


@router.delete("/schedules/{name}", response={204: None, **ERRORS},
               summary="Operator: delete a schedule (the tasks it created stay)")
def delete_schedule(request, name: str):
    require_queue_changer(request)
    _visible(request, name)
    schedules.delete_schedule(name)
    return Status(204, None)
