"""The task admin: the change list (filters, search, the lease column), the task page (its
fields read-only but for the few an operator may edit, and its history), the add form, and the
actions of board/admin/actions.py. Nothing is ever deleted: tasks are history.

Acting (the actions, editing, adding) needs `board.intervene`; staff with `board.view_task`
without it get a read-only admin (lists, search, task pages with their history, links to the
board). The lease token is never stored, and its hash is never displayed.
"""
from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from board.admin import actions, history, reads
from board.admin.actions import page_verbs
from board.admin.bulk import bulk_job
from board.admin.display import LeaseState, board_url
from board.admin.filters import (
    LeaseStateFilter,
    NoHashLookups,
    OwnerFilter,
    QueueFilter,
)
from board.admin.forms import EDITABLE, TaskActionForm, TaskCreateForm, TaskEditForm
from board.engine import clock as store_clock
from board.engine import deadlines, handoffs, resources, selectors
from board.engine.lifecycle import TERMINAL, Stage
from board.models import Task

# Columns the change list reads: never the (possibly large) JSON fields.
LIST_COLUMNS = (
    "id", "title", "stage", "owner", "lease_expires_at", "fence", "attempts", "max_retries",
    "version", "updated_at", "queue",
)


class TaskChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        # The list reads only its columns: never payload, checkpoint, result or the token hash.
        return super().get_queryset(request, exclude_parameters).only(*LIST_COLUMNS)


@admin.register(Task)
class TaskAdmin(NoHashLookups, admin.ModelAdmin):
    list_display = (
        "id", "title", "stage", "owner", "lease", "fence", "attempts_of_max", "version", "updated_at", "on_board",
    )
    list_display_links = ("id", "title")
    list_filter = ("stage", QueueFilter, OwnerFilter, LeaseStateFilter)
    # What each word of the search matches, and the index that serves it on each store, are
    # said in board/migrations/0006_admin_search_indexes.py (and the README).
    search_fields = ("id__startswith", "title", "owner__exact", "queue__exact")
    search_help_text = "Each word: the start of a task id (ids are case-sensitive), an exact owner or queue, or a word of the title."
    ordering = ("-updated_at",)
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    exclude = ("lease_token_hash",)
    action_form = TaskActionForm
    form = TaskEditForm
    add_form = TaskCreateForm
    actions = (
        actions.release_stale_leases, actions.force_release, actions.requeue, actions.requeue_reset_attempts,
        actions.cancel, actions.admit, actions.pause, actions.replay, bulk_job,
    )

    READONLY = (
        "id", "stage", "version", "queue", "concurrency_key", "rate_key", "dedup_key", "on_hold", "owner", "fence", "lease",
        "lease_expires_at",
        "attempts_of_max", "not_before", "progress", "checkpoint", "result", "last_error_text", "created_at",
        "updated_at", "dependencies_list", *deadlines.TIMEOUTS, "progress_changed_at", "notes_list",
        "resources_list", "requires_list", "prefers_list",
    )

    # -- time: a parameter (tests move it; the reaper's rule is "expired by this clock") ------

    def clock(self) -> datetime:
        return store_clock.now()  # the store's clock, as the reaper's: not this host's

    # -- permissions ---------------------------------------------------------------------------

    def has_intervene_permission(self, request) -> bool:
        return request.user.has_perm("board.intervene")

    def has_change_permission(self, request, obj=None) -> bool:
        # Editing goes through the engine's version-guarded edit: an intervention.
        return super().has_change_permission(request, obj) and self.has_intervene_permission(request)

    def has_add_permission(self, request) -> bool:
        return super().has_add_permission(request) and self.has_intervene_permission(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # tasks are history

    # -- list ----------------------------------------------------------------------------------

    def get_changelist(self, request, **kwargs):
        return TaskChangeList

    @admin.display(description="lease expires", ordering="lease_expires_at")
    def lease(self, task: Task) -> str:
        return LeaseState(task.lease_expires_at, self.clock()).column()

    @admin.display(description="attempts / max", ordering="attempts")
    def attempts_of_max(self, task: Task) -> str:
        return f"{task.attempts} / {task.max_retries + 1}"

    @admin.display(description="board")
    def on_board(self, task: Task) -> str:
        return format_html('<a href="{}" title="Open this task\'s card on the live board">board</a>', board_url(task.pk))

    @admin.display(description="last error")
    def last_error_text(self, task: Task) -> str:
        # In <pre>: a traceback keeps its indentation (Django's read-only text collapses it).
        if not task.last_error:
            return "—"
        if task.stage == Stage.COMPLETED:
            # Not its state: an earlier attempt's failure, which the history below keeps.
            return "— (an earlier attempt failed; its error is in the history)"
        return format_html('<pre class="last-error" style="white-space: pre-wrap; margin: 0">{}</pre>', task.last_error)

    @admin.display(description="dependencies")
    def dependencies_list(self, task: Task) -> str:
        deps = reads.dependencies_with_stages(task.pk)
        return ", ".join(f"{dep} ({stage})" for dep, stage in deps) or "—"

    @admin.display(description="resources")
    def resources_list(self, task: Task) -> str:
        """What a claim of the task takes (issue 32), each a link to its resource's page (the
        node it holds), read-only: fixed at creation. RUNNING: held; QUEUED: what it waits for."""
        if not task.resources:
            return "—"
        items = format_html_join(", ", '<a href="{}">{}</a> ({})', (
            (reverse("admin:board_resource_change", args=[quote(resources.node_of(name))]), name, mode)
            for name, mode in ((r, "exclusive") if isinstance(r, str) else (r["name"], f"{r['units']} units")
                               for r in task.resources)))
        if task.stage == Stage.RUNNING:
            return format_html("{}: held by this task's lease", items)
        waiting = resources.why_waiting("default", task) if task.stage == Stage.QUEUED else None
        return format_html("{}<br>waiting: {}", items, waiting) if waiting else items

    @admin.display(description="requires")
    def requires_list(self, task: Task) -> str:
        """The capabilities a claimer must all hold (issue 32, item 3), read-only: fixed at
        creation. QUEUED with none of the agents seen lately holding them: check()'s words."""
        if not task.requires:
            return "— (any agent may claim it)"
        labels = ", ".join(task.requires)
        unclaimable = selectors.unclaimable_why(task)
        return format_html("{}<br>{}", labels, unclaimable) if unclaimable else labels

    @admin.display(description="prefers")
    def prefers_list(self, task: Task) -> str:
        """The capabilities a claimer holding them is preferred for, each with its weight (priority
        levels for that claimer), read-only: fixed at creation."""
        if not task.prefers:
            return "—"
        return ", ".join(f"{label} (weight {weight})" for label, weight in task.prefers.items())

    @admin.display(description="notes")
    def notes_list(self, task: Task) -> str:
        """The task's notes (its holders' and staff's, board.engine.transitions.notes), oldest first."""
        if not task.notes_count:
            return "—"
        return format_html_join(
            "", '<p class="task-note" style="margin: 0 0 6px; white-space: pre-wrap">'
                '<strong>{}</strong> (attempt {}, {}, {}):<br>{}</p>',
            ((n["author"], n["attempt"], "holder" if n["by_holder"] else "staff",
              n["at"].strftime("%Y-%m-%d %H:%M:%S"), n["text"])
             for n in map(handoffs.public_note, handoffs.notes_of(task.pk))))

    # -- forms ---------------------------------------------------------------------------------

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [
                (None, {"fields": ("id", "title", "description", "queue", "priority", "max_retries",
                                   "on_hold", "payload", "deps")}),
                ("Deadlines (seconds; empty: none)", {"fields": deadlines.TIMEOUTS}),
            ]
        editable = list(EDITABLE)
        if self.has_change_permission(request, obj):
            editable += ["opened_version", "opened_state"]
        return [
            (None, {"fields": ("id", "stage", "version", "queue", "concurrency_key", "rate_key", "dedup_key", "on_hold",
                               "dependencies_list", "resources_list", "requires_list", "prefers_list")}),
            ("What the task is (editable, under the version guard)", {"fields": editable}),
            ("Lease", {"fields": ("owner", "fence", "lease", "lease_expires_at", "attempts_of_max", "not_before")}),
            ("Progress and outcome", {"fields": ("progress", "checkpoint", "result", "last_error_text",
                                                 "notes_list", "created_at", "updated_at")}),
            # Set at creation; progress_changed_at is the engine's (board.engine.deadlines).
            ("Deadlines", {"fields": (*deadlines.TIMEOUTS, "progress_changed_at")}),
        ]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        if obj.stage in TERMINAL and request.method != "POST":
            # Finished tasks are not edited. (On POST the form stays whole so that a task that
            # finished after the form was opened is reported as a change, not dropped silently.)
            return self.READONLY + EDITABLE
        return self.READONLY

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = self.add_form
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"actor": request.user.get_username()})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        task_id = unquote(object_id)
        stage = selectors.stage_of(task_id)
        if stage in TERMINAL:
            extra_context.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False)
        if request.method == "GET" and stage is not None:
            # The whole history, paged, heartbeats collapsed (board/admin/history.py); and the
            # operator's buttons for this stage (Retry, Cancel) to whoever may intervene.
            number = request.GET.get("history", "")
            extra_context["task_history"] = history.history_page(task_id, int(number) if number.isdigit() else None)
            if self.has_intervene_permission(request):
                extra_context["task_verbs"] = page_verbs(stage)
        return super().change_view(request, object_id, form_url, extra_context)

    # -- the task page's own buttons: Retry (a FAILED task), Cancel --------------------------

    def get_urls(self):
        mine = [path("<path:object_id>/act/<str:verb>/", self.admin_site.admin_view(self.act_view),
                     name="board_task_act")]
        return mine + super().get_urls()

    def act_view(self, request, object_id: str, verb: str):
        """POST: one engine verb (actions.page_action) on this task, held to the version the
        page showed, with the reason typed beside the button; one message, back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_intervene_permission(request):
            raise PermissionDenied
        task_id = unquote(object_id)
        if verb not in actions.PAGE_VERBS:
            raise Http404(f"no such action: {verb}")
        actions.page_action(self, request, task_id, verb)
        url = reverse("admin:board_task_change", args=[quote(task_id)], current_app=self.admin_site.name)
        return HttpResponseRedirect(url)

    def history_view(self, request, object_id, extra_context=None):
        """Django's object history (its LogEntry rows) shows internal field names and none of
        the engine's moves: the task's history is the inline on its page, so go there."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        url = reverse("admin:board_task_change", args=[quote(unquote(object_id))], current_app=self.admin_site.name)
        return HttpResponseRedirect(f"{url}#events-group")  # the history section (board/admin/history.py)

    def save_model(self, request, obj, form, change):
        pass  # the form's engine call (transitions.edit / create) was the write

    def save_related(self, request, form, formsets, change):
        pass  # dependencies are written by transitions.create; history only by transitions
