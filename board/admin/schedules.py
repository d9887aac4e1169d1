"""The schedules admin (issue 29, periodic tasks): each schedule's cron, time zone, template and
its next ticks; created, changed, paused, resumed and deleted through board.engine.schedules
(the change form, ScheduleForm, and the pause / resume actions), never saved by the admin
itself. The engine's fields (the next tick, the last fire, the skipped ticks) are read-only.

Who may: the queue changers, as over the API (`board.change_queue`, board/access.py); seeing the
page also takes Django's own `board.view_schedule`."""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_value
from django.utils.html import format_html, format_html_join

from board import access
from board.admin.actions import Report
from board.admin.forms import ScheduleForm
from board.engine import errors, schedules
from board.engine.limits import MAX_ACTION_ROWS
from board.models import Schedule

ENGINE_FIELDS = ("next_tick_at", "upcoming", "last_tick_at", "last_task_id", "skipped_ticks", "created_by",
                 "created_at", "updated_at")


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = ("name", "cron", "timezone", "queue", "paused", "next_tick_at", "last_tick_at", "last_task_id",
                    "skipped_ticks")
    list_filter = ("paused",)
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    form = ScheduleForm
    actions = ("pause_schedules", "resume_schedules")
    readonly_fields = ENGINE_FIELDS

    # -- permissions: the queue changers (board.change_queue), as the API's ------------------------

    def has_view_permission(self, request, obj=None) -> bool:
        return super().has_view_permission(request, obj) or access.may_change_queues(request.user)

    def has_add_permission(self, request) -> bool:
        return access.may_change_queues(request.user)

    def has_change_permission(self, request, obj=None) -> bool:
        return access.may_change_queues(request.user)

    def has_delete_permission(self, request, obj=None) -> bool:
        return access.may_change_queues(request.user)

    # -- pages -------------------------------------------------------------------------------------

    def get_readonly_fields(self, request, obj=None):
        return ("name", *ENGINE_FIELDS) if obj is not None else ENGINE_FIELDS

    def get_fieldsets(self, request, obj=None):
        settings = ("name", "cron", "timezone", "task", "paused")
        engine = [(f"Fired by the reaper (the engine's; next ticks in {obj.timezone if obj else 'its time zone'})",
                   {"fields": ENGINE_FIELDS})] if obj is not None else []
        return [(None, {"fields": settings}), *engine]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"actor": request.user.get_username()})

    @admin.display(description="queue")
    def queue(self, schedule: Schedule) -> str:
        return schedule.task.get("queue", "default")

    @admin.display(description="next ticks")
    def upcoming(self, schedule: Schedule) -> str:
        # As stored: a refused form's instance holds the posted values (a cron cronsim refuses).
        schedule = Schedule.objects.filter(pk=schedule.pk).first() or schedule
        ticks = schedules.next_ticks(schedule)
        if not ticks:
            return "None: paused."
        zone = schedules.time_zone(schedule.timezone)
        return format_html("<ul>{}</ul>", format_html_join(
            "", "<li>{} ({})</li>", ((display_for_value(t, "—"), t.astimezone(zone).strftime("%a %Y-%m-%d %H:%M %Z"))
                                     for t in ticks)))

    def save_model(self, request, obj, form, change):
        pass  # the form's schedules.create_schedule / change_schedule was the write

    def save_related(self, request, form, formsets, change):
        pass

    def delete_model(self, request, obj):
        try:
            schedules.delete_schedule(obj.pk)
        except errors.NotFound:
            pass  # deleted meanwhile: what the operator asked for

    def delete_queryset(self, request, queryset):
        for name in list(queryset.values_list("name", flat=True)):
            self.delete_model(request, Schedule(name=name))

    # -- actions: schedules.change_schedule per selected schedule, reported in one message ---------

    @admin.action(permissions=["change"], description="Pause selected schedules")
    def pause_schedules(self, request, queryset):
        self._change_each(request, queryset, "Pause", paused=True)

    @admin.action(permissions=["change"], description="Resume selected schedules (from their next tick after now)")
    def resume_schedules(self, request, queryset):
        self._change_each(request, queryset, "Resume", paused=False)

    def _change_each(self, request, queryset, action: str, *, paused: bool) -> None:
        names = list(queryset.order_by("name").values_list("name", flat=True)[:MAX_ACTION_ROWS + 1])
        if len(names) > MAX_ACTION_ROWS:
            self.message_user(request, f"Select at most {MAX_ACTION_ROWS} schedules per action; nothing was done.",
                              messages.ERROR)
            return
        with Report(self, request, action, "schedule") as report:
            for schedule in Schedule.objects.filter(name__in=names).order_by("name"):
                if schedule.paused == paused:
                    report.skipped(schedule.name, "already paused" if paused else "not paused")
                    continue
                try:
                    now = schedules.change_schedule(schedule.name, paused=paused)
                except errors.BoardError as exc:
                    report.skipped(schedule.name, exc.message, exc.code.replace("_", " "))
                    continue
                report.done(schedule.name, "paused" if paused else
                            f"resumed; next tick {display_for_value(now.next_tick_at, '—')}")
