"""The queue admin (issue 29): each queue's limit, pause and running count, its waiting tasks and
its history; the concurrency keys, read-only; the rate keys, their rate editable (through
`flow.change_rate_key`, with the queues' permissions: a rate key is a queue's rate shared by many);
and the fairness keys, their weight and their budget (through `flow.change_fairness_key`).

A queue's settings change only through `flow.change_queue` (the change form, QueueChangeForm,
and the pause / resume actions), which writes the row and its audit row in one transaction: the
admin never saves those fields itself, and `running` is the engine's count. Rows are made by the
engine (a queue's first task, or a change through the API), so nothing is added or deleted here.
Seeing the page needs `board.view_queue`; changing it and the actions `board.change_queue`.
The list and the page show each queue's wait and run times over the last hour, p50 / p95
(board.engine.timing, read once for the page).
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_value, quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from board import access
from board.admin import reads
from board.admin.actions import Report, action_reason
from board.admin.forms import (
    BUDGET_SETTINGS, FairnessKeyChangeForm, QueueActionForm, QueueChangeForm, RateKeyChangeForm,
)
from board.engine import budgets, errors, flow, timing
from board.engine.lifecycle import Stage
from board.engine.limits import HISTORY_LIMIT, MAX_ACTION_ROWS
from board.models import ConcurrencyKey, FairnessKey, Queue, QueueChange, RateKey, RateKeyChange


def running_of_limit(running: int, limit: int | None) -> str:
    return f"{running} / {limit if limit is not None else 'no limit'}"


def with_counts(queues) -> None:
    """Keep on each queue its QUEUED and RUNNING tasks (`tasks_now`), read in one grouped query,
    and its waits and runs of the last hour (`timing_now`: board.engine.timing, one read)."""
    counts = reads.waiting_and_running([queue.name for queue in queues])
    flow.with_counts(list(queues))  # the engine's count of each limited queue (its shards)
    timings = timing.queue_timings()
    for queue in queues:
        queue.tasks_now = counts[queue.name]
        queue.timing_now = timings.get(queue.name)


def duration_text(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{round(seconds)} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {rest:02}s"
    return f"{minutes // 60}h {minutes % 60:02}m"


def timing_text(figures: dict | None, kind: str) -> str:
    """"p50 / p95 (count)" of a queue's waits or runs that ended in the last hour; "—": none."""
    summary = (figures or {}).get(kind)
    if not summary or not summary["count"]:
        return "—"
    return f"{duration_text(summary['p50'])} / {duration_text(summary['p95'])} ({summary['count']})"


def history_table(rows) -> str:
    """A queue's or rate key's settings history (QueueChange / RateKeyChange rows, newest first)."""
    if not rows:
        return "No change yet."
    body = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        ((display_for_value(row.at, "—"), row.actor, describe_changes(row), row.reason or "—") for row in rows),
    )
    return format_html('<table class="queue-history"><thead><tr><th>at</th><th>by</th><th>changed</th>'
                       '<th>reason</th></tr></thead><tbody>{}</tbody></table>', body)


class _EngineSavesAdmin(admin.ModelAdmin):
    """A page whose form saves through the engine (flow.change_queue, flow.change_rate_key: the
    form's save, with the user as its actor), so the admin's own save does nothing; and whose
    history is on the object's page (Django's LogEntry rows miss the API's changes)."""

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"actor": request.user.get_username()})

    def save_model(self, request, obj, form, change):
        pass  # the form's engine call was the write

    def save_related(self, request, form, formsets, change):
        pass

    def history_view(self, request, object_id, extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        opts = self.model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(unquote(object_id))],
                      current_app=self.admin_site.name)
        return HttpResponseRedirect(url)


class _QueuesPermissionsAdmin(_EngineSavesAdmin):
    """A setting that spans queues (a rate key's rate, a resource's capacity): seen with the
    queues' view or change permission, changed with `board.change_queue`; its rows are the
    engine's, so never added or deleted here."""

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("board.view_queue") or request.user.has_perm("board.change_queue")

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("board.change_queue")

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class QueueChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        with_counts(self.result_list)


@admin.register(Queue)
class QueueAdmin(_EngineSavesAdmin):
    list_display = ("name", "running_of_limit", "rate", "budget_spent", "queued", "wait_times", "run_times", "paused",
                    "paused_by", "paused_reason", "paused_at")
    list_filter = ("paused",)
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    form = QueueChangeForm
    action_form = QueueActionForm
    actions = ("pause_queues", "resume_queues")
    readonly_fields = ("name", "running_of_limit", "queued", "wait_times", "run_times", "paused_by", "paused_reason",
                       "paused_at", "updated_at", "history", "budget_spent")

    # -- permissions: Django's own board.view_queue / board.change_queue; rows are the engine's --

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    # -- list ------------------------------------------------------------------------------------

    def get_changelist(self, request, **kwargs):
        return QueueChangeList

    @staticmethod
    def tasks_now(queue: Queue) -> dict[str, int]:
        if not hasattr(queue, "tasks_now"):  # the change page's one queue
            with_counts([queue])
        return queue.tasks_now

    @admin.display(description="running / limit")
    def running_of_limit(self, queue: Queue) -> str:
        # A limited queue shows the engine's count, the one its claims are held to; the row of a
        # queue without a limit counts nothing (board.engine.flow), so its tasks are counted.
        tasks_now = self.tasks_now(queue)  # reads the counts too (with_counts)
        if queue.concurrency is not None:
            return running_of_limit(queue.running, queue.concurrency)
        return running_of_limit(tasks_now[Stage.RUNNING], None)

    @admin.display(description="rate")
    def rate(self, queue: Queue) -> str:
        if queue.rate_count is None:
            return "—"
        return f"{queue.rate_count} per {queue.rate_per_seconds} s"

    @admin.display(description="budget: spent")
    def budget_spent(self, queue: Queue) -> str:
        """The window's spend against the budget ("120 / 100 tokens this day, spent"); "—": none."""
        described = budgets.describe(queue, timezone.now())
        if described["budget"] is None:
            return "—"
        return budget_text(described["budget"], described["spent"]) + (
            ": spent, no claim starts" if described["budget_exhausted"] else "")

    @admin.display(description="queued")
    def queued(self, queue: Queue) -> int:
        return self.tasks_now(queue)[Stage.QUEUED]

    @admin.display(description="wait p50 / p95, last hour")
    def wait_times(self, queue: Queue) -> str:
        self.tasks_now(queue)  # reads timing_now too
        return timing_text(queue.timing_now, timing.WAIT)

    @admin.display(description="run p50 / p95, last hour")
    def run_times(self, queue: Queue) -> str:
        self.tasks_now(queue)
        return timing_text(queue.timing_now, timing.RUN)

    # -- the change page -------------------------------------------------------------------------

    def get_fieldsets(self, request, obj=None):
        settings = ("concurrency", "rate_count", "rate_per_seconds", "paused", "budget_tokens", "budget_cost_usd",
                    "budget_per")
        if self.has_change_permission(request, obj):
            settings += ("reason", "opened")
        return [
            (None, {"fields": ("name", "running_of_limit", "queued", "wait_times", "run_times")}),
            ("Settings (saved by the engine, each change kept in the history)", {"fields": settings}),
            ("Paused", {"fields": ("paused_by", "paused_reason", "paused_at", "updated_at")}),
            ("Budget's window", {"fields": ("budget_spent",)}),
            (f"History (newest first, the last {HISTORY_LIMIT} changes)", {"fields": ("history",)}),
        ]

    @admin.display(description="changes")
    def history(self, queue: Queue) -> str:
        return history_table(reads.queue_history(queue.name, HISTORY_LIMIT))

    # -- actions: flow.change_queue per selected queue, each reported in one message -------------

    def _names(self, request, queryset) -> list[str] | None:
        names = list(queryset.order_by("name").values_list("name", flat=True)[:MAX_ACTION_ROWS + 1])
        if len(names) > MAX_ACTION_ROWS:
            self.message_user(request, f"Select at most {MAX_ACTION_ROWS} queues per action; nothing was done.",
                              messages.ERROR)
            return None
        return names

    @admin.action(permissions=["change"], description="Pause selected queues (asks a reason)")
    def pause_queues(self, request, queryset):
        reason = action_reason(request)
        if not reason:
            self.message_user(request, "Pausing needs a reason: type it in the Reason box beside the action. "
                                       "Nothing was done.", messages.ERROR)
            return
        self._change_each(request, queryset, "Pause", paused=True, reason=reason)

    @admin.action(permissions=["change"], description="Resume selected queues")
    def resume_queues(self, request, queryset):
        self._change_each(request, queryset, "Resume", paused=False, reason=action_reason(request))

    def _change_each(self, request, queryset, action: str, *, paused: bool, reason: str) -> None:
        names = self._names(request, queryset)
        if names is None:
            return
        actor = request.user.get_username()
        with Report(self, request, action, "queue") as report:
            for queue in Queue.objects.filter(name__in=names).order_by("name"):
                if queue.paused == paused:
                    why = f"already paused by {queue.paused_by or '(unknown)'}" if paused else "not paused"
                    report.skipped(queue.name, why, "already paused" if paused else "not paused")
                    continue
                try:
                    now = flow.change_queue(queue.name, actor=actor, reason=reason, paused=paused)
                except errors.BoardError as exc:
                    report.skipped(queue.name, exc.message, exc.code.replace("_", " "))
                    continue
                if paused and (now.paused_by, now.paused_reason) != (actor, reason):
                    # Paused by someone else between this read and the change: theirs stands.
                    report.skipped(queue.name, f"paused meanwhile by {now.paused_by or '(unknown)'}",
                                   "paused meanwhile")
                elif paused:
                    report.done(queue.name, "paused")
                else:
                    report.done(queue.name, f"resumed (was paused by {queue.paused_by or '(unknown)'}"
                                            f"{': ' + queue.paused_reason if queue.paused_reason else ''})")


def budget_text(budget: dict, spent: dict | None = None) -> str:
    """A budget, and the window's spend against it when given: "120 / 100 tokens, $0.40 / $2.50
    this day"; "100 tokens a day"."""
    parts = []
    if budget["tokens"] is not None:
        parts.append(f"{spent['tokens']:,} / {budget['tokens']:,} tokens" if spent else f"{budget['tokens']:,} tokens")
    if budget["cost_usd"] is not None:
        parts.append(f"${spent['cost_usd']:,.2f} / ${budget['cost_usd']:,.2f}" if spent else f"${budget['cost_usd']:,.2f}")
    per = "in total" if budget["per"] == "total" else (f"this {budget['per']}" if spent else f"a {budget['per']}")
    return f"{', '.join(parts)} {per}"


def describe_changes(change: QueueChange | RateKeyChange) -> str:
    """'concurrency: no limit → 5; paused: no → yes'."""
    def word(setting: str, value) -> str:
        if setting == "paused":
            return "yes" if value else "no"
        if setting == "rate":
            return "no rate" if value is None else f"{value['count']} per {value['per_seconds']} s"
        if setting == "budget":
            return "no budget" if value is None else budget_text(value)
        return "no limit" if value is None else str(value)

    return "; ".join(f"{setting}: {word(setting, before)} → {word(setting, after)}"
                     for setting, (before, after) in sorted(change.changes.items()))


@admin.register(ConcurrencyKey)
class ConcurrencyKeyAdmin(admin.ModelAdmin):
    """Read-only: a key's row and limit come with the tasks that name it (their creates set the
    limit); its count is the engine's."""

    list_display = ("name", "running_of_limit", "updated_at")
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    fields = readonly_fields = ("name", "running_of_limit", "updated_at")

    @admin.display(description="running / limit", ordering="running")
    def running_of_limit(self, key: ConcurrencyKey) -> str:
        return running_of_limit(key.running, key.concurrency)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(RateKey)
class RateKeyAdmin(_QueuesPermissionsAdmin):
    """A rate key's rate, set on its page (RateKeyChangeForm: flow.change_rate_key) with its history
    beside it. Rows come with the tasks naming the key (or a change through the API); seeing them
    needs `board.view_queue`, changing a rate `board.change_queue`, as for a queue's rate."""

    list_display = ("name", "rate", "next_claim_at", "updated_at")
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    form = RateKeyChangeForm
    readonly_fields = ("name", "next_claim_at", "updated_at", "history")


    @admin.display(description="rate")
    def rate(self, key: RateKey) -> str:
        return "—" if key.rate_count is None else f"{key.rate_count} per {key.rate_per_seconds} s"

    @admin.display(description="next claim at")
    def next_claim_at(self, key: RateKey):
        return display_for_value(flow.describe_rate_key(key)["next_claim_at"], "—")

    def get_fieldsets(self, request, obj=None):
        settings = ("rate_count", "rate_per_seconds")
        if self.has_change_permission(request, obj):
            settings += ("reason", "opened")
        return [
            (None, {"fields": ("name", "next_claim_at", "updated_at")}),
            ("Rate (saved by the engine, each change kept in the history)", {"fields": settings}),
            (f"History (newest first, the last {HISTORY_LIMIT} changes)", {"fields": ("history",)}),
        ]

    @admin.display(description="changes")
    def history(self, key: RateKey) -> str:
        return history_table(reads.rate_key_history(key.name, HISTORY_LIMIT))


@admin.register(FairnessKey)
class FairnessKeyAdmin(admin.ModelAdmin):
    """A fairness key's weight (board.engine.fairness): its turns in the claim order for another
    key's one, set by the creates that give one and editable here (it applies to the key's tasks
    created from then on: a waiting task keeps its place); and its budget (issue 32, item 5), the
    usage the tasks naming it may report per window whatever their queues, with what the window
    spent and whether it is exhausted (its tasks held back in every queue).

    The budget changes only through `flow.change_fairness_key` (FairnessKeyChangeForm), which
    writes the budget's columns and the key's history in one transaction, and only for a user who
    may change queues (`board.change_queue`, as the API's PUT /api/fairness-keys/{name} asks);
    the weight is saved alone (one column: never a save of the whole row, whose spend the usage
    reports move). Seeing the page needs `board.view_fairnesskey` or the queues' view or change
    permission; changing it `board.change_fairnesskey` or `board.change_queue`. A row holds its
    budget and spend, so none is deleted here (removing a budget is a change on its page)."""

    list_display = ("name", "weight", "budget_spent", "budget_exhausted", "updated_at")
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    form = FairnessKeyChangeForm

    # -- permissions -------------------------------------------------------------------------------

    def has_view_permission(self, request, obj=None) -> bool:
        return (super().has_view_permission(request, obj) or request.user.has_perm("board.view_queue")
                or access.may_change_queues(request.user))

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) or access.may_change_queues(request.user)

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    # -- list and page -----------------------------------------------------------------------------

    @admin.display(description="budget: spent")
    def budget_spent(self, key: FairnessKey) -> str:
        """The window's spend against the budget ("110 / 100 tokens in total"); "—": none."""
        described = budgets.describe(key, timezone.now())
        if described["budget"] is None:
            return "—"
        return budget_text(described["budget"], described["spent"])

    @admin.display(description="budget exhausted", boolean=True)
    def budget_exhausted(self, key: FairnessKey) -> bool | None:
        """Spent: no claim of the key's tasks starts, in any queue (None: no budget)."""
        described = budgets.describe(key, timezone.now())
        return None if described["budget"] is None else described["budget_exhausted"]

    @admin.display(description="claims start again at")
    def budget_exhausted_until(self, key: FairnessKey) -> str:
        described = budgets.describe(key, timezone.now())
        if not described["budget_exhausted"]:
            return "—"
        if described["budget_exhausted_until"] is None:
            return "when the budget is raised or removed (a total budget)"
        return display_for_value(described["budget_exhausted_until"], "—")

    @admin.display(description="changes")
    def history(self, key: FairnessKey) -> str:
        return history_table(reads.fairness_key_history(key.name, HISTORY_LIMIT))

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        window = ("budget_spent", "budget_exhausted", "budget_exhausted_until", "updated_at", "history")
        if not access.may_change_queues(request.user):
            window += BUDGET_SETTINGS
        return ("name", *window)

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [(None, {"fields": ("name", "weight")})]
        settings = BUDGET_SETTINGS
        if access.may_change_queues(request.user) and self.has_change_permission(request, obj):
            settings += ("reason", "opened")
        return [
            (None, {"fields": ("name", "weight")}),
            ("Budget (saved by the engine, each change kept in the history)", {"fields": settings}),
            ("Budget's window", {"fields": ("budget_spent", "budget_exhausted", "budget_exhausted_until",
                                            "updated_at")}),
            (f"History of its budget (newest first, the last {HISTORY_LIMIT} changes)", {"fields": ("history",)}),
        ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"actor": request.user.get_username(),
                                             "may_budget": access.may_change_queues(request.user)})

    def save_model(self, request, obj, form, change):
        """The budget was the form's engine call; here the weight alone (a new key: its row)."""
        if not change:
            obj.save(force_insert=True)
        elif "weight" in form.changed_data:  # `obj` is the row the engine's change returned
            FairnessKey.objects.filter(name=obj.pk).update(weight=form.cleaned_data["weight"])
