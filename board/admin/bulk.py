"""Bulk jobs in the admin (issue 33, item 1; board/bulk/, docs/bulk.md).

- On the Tasks list, the action "Bulk job: act on every selected task in the background…": with
  "Select all N" it takes every task the list's filters and search match, not only the page. It
  asks first (an intermediate page: how many tasks each action would move, the action, its
  value, the reason), then creates one job (board.bulk.jobs.create_for_rows) and starts it; the
  message links to the job.
- Bulk jobs: every job with its summary (done / skipped with reasons / lost), read-only, and the
  action "Stop".

Who may: staff with board.intervene, as for every operator verb (board/access.py)."""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from board import access
from board.admin.actions import action_reason
from board.bulk import jobs
from board.engine import errors, search
from board.engine.limits import MAX_REASON_CHARS
from board.models import BulkJob

CHOICES = [("cancel", "Cancel (unfinished tasks)"), ("retry", "Retry (failed tasks, attempts reset)"),
           ("requeue", "Requeue (failed or paused tasks)"), ("pause", "Pause (running tasks, checkpoint kept)"),
           ("admit", "Admit (pending tasks)"), ("release-stale", "Release expired leases (running tasks)"),
           ("set-priority", "Set the priority"), ("add-tag", "Add a tag"),
           ("replay", "Run again as new (finished tasks)")]
assert {name for name, _ in CHOICES} == set(jobs.ACTIONS)


class BulkForm(forms.Form):
    bulk_action = forms.ChoiceField(choices=CHOICES, widget=forms.RadioSelect, label="Action")
    priority = forms.IntegerField(required=False, min_value=-(2**31) + 1, max_value=2**31 - 1,
                                  help_text="set-priority only")
    tag = forms.RegexField(regex=search.TAG_PATTERN, required=False, max_length=50, help_text="add-tag only")
    bulk_reason = forms.CharField(required=False, max_length=MAX_REASON_CHARS, label="Reason",
                                  help_text="kept in each task's history")


def _described(request, queryset, select_across: bool) -> str:
    if not select_across:
        return f"{queryset.count():,} selected tasks"
    query = request.GET.urlencode()
    return f"every task of the Tasks list{f' where {query}' if query else ''}"


@admin.action(permissions=["intervene"], description="Bulk job: act on every selected task in the background…")
def bulk_job(model_admin, request, queryset):
    select_across = request.POST.get("select_across") == "1"
    form = BulkForm(request.POST if request.POST.get("bulk") == "yes" else None,
                    initial={"bulk_reason": action_reason(request)})
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            job = jobs.create_for_rows(queryset, data["bulk_action"], reason=data["bulk_reason"],
                                       priority=data["priority"] if data["bulk_action"] == "set-priority" else None,
                                       tag=data["tag"] or None if data["bulk_action"] == "add-tag" else None,
                                       described=_described(request, queryset, select_across),
                                       actor=request.user.get_username())
        except errors.BoardError as exc:
            model_admin.message_user(request, f"Bulk job refused: {exc}; nothing was done.", messages.ERROR)
            return None
        jobs.start_in_thread(job.pk)
        link = reverse("admin:board_bulkjob_change", args=[job.pk])
        model_admin.message_user(request, format_html(
            'Bulk job <a href="{}">{}</a> started: {} {} tasks in the background; its page shows the progress and '
            "the summary.", link, job.pk, job.action, f"{job.total:,}"), messages.SUCCESS)
        return None
    counts = [(name, label, jobs.applicable(queryset, name).count()) for name, label in CHOICES]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Bulk job: choose the action",
        "opts": model_admin.opts,
        "form": form,
        "counts": counts,
        "matching": queryset.count(),
        "described": _described(request, queryset, select_across),
        "select_across": select_across,
        "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
        "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/board/task/bulk_job.html", context)


@admin.register(BulkJob)
class BulkJobAdmin(admin.ModelAdmin):
    list_display = ("id", "action", "actor", "state", "progress", "skipped_reasons_text", "problems", "created_at",
                    "finished_at")
    list_filter = ("state", "action")
    ordering = ("-id",)
    show_facets = admin.ShowFacets.NEVER
    actions = ("stop",)
    fields = ("id", "action", "params", "reason", "filter", "actor", "state", "progress", "skipped_reasons_text",
              "problems", "error", "created_at", "started_at", "finished_at", "runner", "heartbeat_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("items")

    def has_view_permission(self, request, obj=None) -> bool:
        return access.may_intervene(request.user)

    def has_module_permission(self, request) -> bool:
        return access.may_intervene(request.user)

    def has_add_permission(self, request) -> bool:
        return False  # from the Tasks list's action, the board, or POST /api/bulk

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a job is the record of what was done

    def has_intervene_permission(self, request) -> bool:
        return access.may_intervene(request.user)

    @admin.display(description="done / skipped / lost of total")
    def progress(self, job: BulkJob) -> str:
        return f"{job.done:,} / {job.skipped:,} / {job.lost:,} of {job.total:,}"

    @admin.display(description="skipped because")
    def skipped_reasons_text(self, job: BulkJob) -> str:
        return ", ".join(f"{why} {n:,}" for why, n in sorted((job.skipped_reasons or {}).items())) or "—"

    @admin.action(permissions=["intervene"], description="Stop the selected jobs (the tasks they moved stay moved)")
    def stop(self, request, queryset):
        asked = [jobs.stop(job.pk) for job in queryset.defer("items")]
        self.message_user(request, "; ".join(f"bulk job {job.pk}: {job.state}" for job in asked) or "nothing selected")
