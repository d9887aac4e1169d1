"""Operators' screens (Django admin). Thin callers of the engine: nothing here writes a task's
stage, version or lease, or an agent key's hash.

- Every action calls a verb of `board.engine.transitions` for each selected task and reports in ONE
  message the counts and, row by row (collapsed), what was done, what was skipped and why, and
  what lost a race (the verb is given the version the action read, so a task that moved
  meanwhile is reported, never acted on blindly). Force release is held to the lease shown on
  its confirmation page (holder and fence) instead: a holder's renewals bump the version.
- The change form edits title, description, priority, max_retries and payload through
  `transitions.edit` under the version guard: the form carries the version (and a sealed
  snapshot) it was opened at; if the task moved since, saving is refused with what changed and
  nothing is written. Django's own `save()` never writes a task.
- The add form calls `transitions.create`. Nothing is ever deleted: tasks are history.
- Acting needs `board.intervene`; staff with `board.view_task` without it get a read-only
  admin (lists, search, task pages with their history, links to the board).
- The lease token is never stored, and its hash is never displayed.
- Agent keys are minted by `agent_keys.create_key`, shown once in the response to the add form,
  and revoked by `agent_keys.revoke`; their hashes are never displayed. Minting an operator key
  needs `board.intervene` besides `board.add_agentkey`.
- No list can be filtered on a hash column (`NoHashLookups`): a ?key_hash__startswith= is 400.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import datetime
from typing import Any, Self

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from board import agent_keys
from board.engine import clock as store_clock
from board.engine import errors, transitions
from board.engine.lifecycle import TERMINAL, Stage
from board.models import AgentKey, Task, TaskEvent

# Fields an operator may edit; the engine's list, so the two can never disagree.
EDITABLE = tuple(transitions.EDITABLE)
# Columns the change list reads: never the (possibly large) JSON fields.
LIST_COLUMNS = (
    "id", "title", "stage", "owner", "lease_expires_at", "fence", "attempts", "max_retries",
    "version", "updated_at", "queue",
)
# An action reports one line per task; past this many tasks it refuses to start.
MAX_ACTION_ROWS = 1000
# The change form shows this many most recent events of a task (renewals add up).
HISTORY_LIMIT = 200
# How many owners the owner filter offers (the search box finds any owner).
OWNER_FILTER_LIMIT = 50
REASON_MAX = 500


# ---------------------------------------------------------------------------------------------
# Wording


def span(seconds: float) -> str:
    """A short human duration: 45 s, 4 min, 2 h 5 min, 3 d 1 h."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def lease_state(expires_at: datetime | None, now: datetime) -> str:
    """'expires in 4 min', 'expired 2 min ago' or 'no lease'."""
    if expires_at is None:
        return "no lease"
    seconds = (expires_at - now).total_seconds()
    return f"expires in {span(seconds)}" if seconds > 0 else f"expired {span(seconds)} ago"


def lease_was(expires_at: datetime | None, now: datetime) -> str:
    """How a lease stood when it was taken away: 'lease had 4 min left' / 'expired 2 min ago'."""
    if expires_at is None:
        return "no lease"
    seconds = (expires_at - now).total_seconds()
    return f"lease had {span(seconds)} left" if seconds > 0 else f"expired {span(seconds)} ago"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _unix_newlines(text: str | None) -> str | None:
    """Browsers send a textarea's line breaks as CRLF; the stored text has what the agent sent."""
    return text.replace("\r\n", "\n") if isinstance(text, str) else text


def _now_is(task: Task | None) -> str:
    """What a task is now, for a lost race: 'COMPLETED v5', 'RUNNING v7, held by agent-2'."""
    if task is None:
        return "gone"
    held = f", held by {task.owner}" if task.stage == Stage.RUNNING and task.owner else ""
    return f"{task.stage} v{task.version}{held}"


def board_url(task_id: str) -> str:
    """The task's card on the live board (the board opens the card named by ?task=)."""
    return f"{reverse('board')}?{urlencode({'task': task_id})}"


def _current(exc: errors.BoardError, task_id: str) -> Task | None:
    """The task as it is now: the row the engine's error carries, else read it."""
    if isinstance(exc.task, Task):
        return exc.task
    return Task.objects.filter(pk=task_id).first()


# ---------------------------------------------------------------------------------------------
# No lookup on a stored hash

# Columns holding a secret's hash. A query-string filter on one (?key_hash__startswith=) would
# let whoever sees a list recover the hash a few digits at a time by watching it narrow.
HASH_FIELDS = frozenset({"key_hash", "lease_token_hash"})


class NoHashLookups:
    """A ModelAdmin mixin: any changelist lookup that names a hash column, on this model or
    through a relation, is refused (Django answers 400); other lookups follow Django's rules."""

    def lookup_allowed(self, lookup, value, request=None):
        if any(part in HASH_FIELDS for part in lookup.split("__")):
            return False
        return super().lookup_allowed(lookup, value, request)


# ---------------------------------------------------------------------------------------------
# Filters (each a cheap query: no scan over all tasks for its choices beyond one DISTINCT)


class LeaseStateFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("expired", "expired"), ("none", "none")]

    def queryset(self, request, queryset):
        now = store_clock.in_query()  # the store's clock, as the reaper judges leases
        value = self.value()
        if value == "live":
            return queryset.filter(stage=Stage.RUNNING, lease_expires_at__gt=now)
        if value == "expired":
            return queryset.filter(stage=Stage.RUNNING, lease_expires_at__lte=now)
        if value == "none":
            return queryset.filter(lease_expires_at__isnull=True)
        return queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        queues = Task.objects.order_by("queue").values_list("queue", flat=True).distinct()
        return [(q, q) for q in queues]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """The agents holding leases now (only RUNNING tasks have an owner)."""

    title = "owner (running tasks)"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        owners = (
            Task.objects.filter(stage=Stage.RUNNING).exclude(owner="")
            .order_by("owner").values_list("owner", flat=True).distinct()[:OWNER_FILTER_LIMIT]
        )
        return [(o, o) for o in owners]

    def queryset(self, request, queryset):
        return queryset.filter(owner=self.value()) if self.value() else queryset


# ---------------------------------------------------------------------------------------------
# Forms: validation is the engine's; the write is the engine's; Django's save() writes nothing.


def _field_for(message: str, fields) -> str | None:
    """The form field an engine message is about (its messages name the field), else None."""
    for name in fields:
        if name in message:
            return name
    return None


class _EngineForm(forms.ModelForm):
    """A ModelForm whose write is an engine call made as the last step of validation (so that a
    refusal shows as a form error), and whose save() only returns the row the engine wrote."""

    actor = ""  # the operator's username; set per request by the admin's get_form

    def clean_payload(self):
        # Python's json reads NaN and Infinity; JSON (and the database) does not.
        value = self.cleaned_data.get("payload")
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise forms.ValidationError("payload is not valid JSON: NaN and Infinity are not numbers in JSON")
        return value

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.written = None

    def _post_clean(self):
        super()._post_clean()
        if not self._errors:
            self.apply()

    def apply(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, commit=True):
        self.save_m2m = lambda: None
        return self.written


class TaskEditForm(_EngineForm):
    """Edits a task under the version guard: `opened_version` and the sealed `opened_state` say
    what the operator saw; saving calls transitions.edit(version=opened_version)."""

    SALT = "board.admin.task-edit"

    opened_version = forms.IntegerField(widget=forms.HiddenInput)
    opened_state = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = Task
        fields = EDITABLE

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("title", "description"):
            if name in self.fields:
                # Text round-trips exactly (an untouched field is not an edit); the engine says
                # what a title must be (its message is the one shown).
                self.fields[name].strip = False
                self.fields[name].required = False
        if not self.is_bound and self.instance.pk is not None:
            self.initial["opened_version"] = self.instance.version
            self.initial["opened_state"] = self.seal(self.instance)

    def clean_title(self):
        return _unix_newlines(self.cleaned_data.get("title"))

    def clean_description(self):
        return _unix_newlines(self.cleaned_data.get("description"))

    @classmethod
    def seal(cls, task: Task) -> str:
        state = {
            "version": task.version, "stage": task.stage, "owner": task.owner,
            "fields": {name: [_digest(getattr(task, name)), _short(getattr(task, name))] for name in EDITABLE},
        }
        return signing.dumps(state, salt=cls.SALT, compress=True)

    def apply(self) -> None:
        data = self.cleaned_data
        try:
            opened = signing.loads(data["opened_state"], salt=self.SALT)
        except signing.BadSignature:
            opened = None
        if not opened or opened.get("version") != data["opened_version"]:
            self.add_error(None, "This form is damaged or was not opened here; reload the page.")
            return
        task_id = self.instance.pk
        current = Task.objects.filter(pk=task_id).first()
        if current is None or current.version != opened["version"]:
            self.add_error(None, what_changed(task_id, opened, current))
            return
        changes = {
            name: data[name] for name in EDITABLE
            if name in self.fields and [_digest(data[name])] != opened["fields"].get(name, [None])[:1]
        }
        if not changes:
            self.written = current
            return
        try:
            self.written = transitions.edit(task_id, actor=self.actor, version=opened["version"], **changes)
        except errors.VersionConflict as exc:
            self.add_error(None, what_changed(task_id, opened, _current(exc, task_id)))
        except errors.BoardError as exc:
            self.add_error(_field_for(exc.message, changes), exc.message)


def what_changed(task_id: str, opened: dict, current: Task | None) -> str:
    """The refusal of a stale edit: what moved since the form was opened."""
    if current is None:
        return f"Not saved: task {task_id} no longer exists."
    diffs = []
    if current.stage != opened["stage"]:
        diffs.append(f"stage {opened['stage']} → {current.stage}")
    if current.owner != opened["owner"]:
        diffs.append(f"owner {opened['owner'] or '(none)'} → {current.owner or '(none)'}")
    for name in EDITABLE:
        value = getattr(current, name)
        was = opened["fields"].get(name)
        if was is not None and _digest(value) != was[0]:
            diffs.append(f"{name} {was[1]} → {_short(value)}")
    moves = list(
        TaskEvent.objects.filter(task_id=task_id, version__gt=opened["version"])
        .order_by("id").values_list("verb", "actor")[:10]
    )
    by = ", ".join(f"{verb} by {actor or '(unknown)'}" for verb, actor in moves)
    return (
        f"Not saved: task {task_id} changed after you opened it "
        f"(version {opened['version']} → {current.version}{': ' + by if by else ''}). "
        f"{'; '.join(diffs) + '. ' if diffs else ''}"
        "Nothing was written; reload the page to edit the current task."
    )


class TaskCreateForm(_EngineForm):
    """Creates a task through transitions.create (dependencies as ids separated by commas)."""

    deps = forms.CharField(
        required=False, label="Dependencies",
        help_text="Ids of tasks this one waits for, separated by commas or spaces.",
    )

    class Meta:
        model = Task
        fields = ("id", "title", "description", "queue", "priority", "max_retries", "hold", "payload")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["id"].required = False
        self.fields["id"].help_text = "Leave empty to have one generated."
        self.fields["title"].required = False

    def validate_unique(self):
        pass  # the engine refuses a taken id (DuplicateId), atomically

    def apply(self) -> None:
        data = self.cleaned_data
        spec = transitions.TaskSpec(
            id=data.get("id") or None, title=data.get("title") or "",
            description=data.get("description") or "", payload=data.get("payload"),
            queue=data.get("queue") or "default", priority=data.get("priority") or 0,
            max_retries=data["max_retries"] if data.get("max_retries") is not None else 3,
            hold=bool(data.get("hold")),
            deps=tuple(d for d in data.get("deps", "").replace(",", " ").split() if d),
        )
        try:
            self.written = transitions.create(spec, actor=self.actor)[0]
        except errors.BoardError as exc:
            self.add_error(self._field_of(exc), exc.message)

    # Engine messages name what they are about; the first match says which field to mark.
    FIELD_WORDS = (
        ("dependenc", "deps"), ("depends on", "deps"), ("task id", "id"), ("title", "title"),
        ("description", "description"), ("queue", "queue"), ("priority", "priority"),
        ("max_retries", "max_retries"), ("hold", "hold"), ("payload", "payload"),
    )

    def _field_of(self, exc: errors.BoardError) -> str | None:
        if isinstance(exc, errors.DuplicateId):
            return "id"
        for word, name in self.FIELD_WORDS:
            if word in exc.message:
                return name
        return None


# ---------------------------------------------------------------------------------------------
# The task admin


class TaskEventInline(admin.TabularInline):
    """The task's history, read-only, oldest first (the most recent HISTORY_LIMIT events)."""

    model = TaskEvent
    verbose_name = "event"
    verbose_name_plural = f"history (most recent {HISTORY_LIMIT} events, oldest first)"
    fields = ("id", "verb", "from_to", "version", "fence", "actor", "at", "detail")
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False
    show_change_link = False

    @admin.display(description="from → to")
    def from_to(self, event: TaskEvent) -> str:
        return f"{event.from_stage or '∅'} → {event.to_stage}"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        # Whoever may see the task may see its history.
        return request.user.has_perm("board.view_task") or request.user.has_perm("board.change_task")


class TaskChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        # The list reads only its columns: never payload, checkpoint, result or the token hash.
        return super().get_queryset(request, exclude_parameters).only(*LIST_COLUMNS)


class _Report:
    """The outcome of one action, shown as ONE message (an action over 600 tasks used to give
    600 banners): the counts first — done, skipped by reason, lost races — then each task's
    line in a collapsed <details>. Used as a context manager: the message is sent on exit.

    Each line starts with the task's id exactly as it is (ids are case-sensitive): the message
    starts with the action's name, and the board's admin templates do not capitalise messages."""

    def __init__(self, model_admin: admin.ModelAdmin, request, action: str, noun: str = "task"):
        self.model_admin, self.request, self.action, self.noun = model_admin, request, action, noun
        self.lines: list[tuple[str, str]] = []  # (outcome, line), in the order the rows were met
        self.skips: Counter[str] = Counter()  # skipped rows by reason

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self.lines:
            self.model_admin.message_user(self.request, self.message(), self.level())

    def done(self, task_id: str, text: str) -> None:
        self.lines.append(("done", f"{task_id}: {text}"))

    def skipped(self, task_id: str, why: str, kind: str | None = None) -> None:
        """`kind`: the reason without what is particular to this row, for the counts."""
        self.lines.append(("skipped", f"{task_id}: skipped: {why}"))
        self.skips[kind or why] += 1

    def lost(self, task_id: str, now: Task | None, why: str = "task changed meanwhile") -> None:
        self.lines.append(("lost", f"{task_id}: lost a race: {why} (now {_now_is(now)})"))

    def attempt(self, task_id: str, move, done) -> None:
        """Run `move()` (an engine verb held to a version or a lease) and record its outcome:
        `done(task)` on success, a lost race on VersionConflict, otherwise skipped with the
        engine's reason."""
        try:
            task = move()
        except errors.VersionConflict as exc:
            self.lost(task_id, _current(exc, task_id))
        except errors.NotFound:
            self.skipped(task_id, "no such task")
        except errors.BoardError as exc:
            self.skipped(task_id, exc.message, _kind_of(exc))
        else:
            self.done(task_id, done(task))

    def count(self, outcome: str) -> int:
        return sum(1 for kind, _ in self.lines if kind == outcome)

    def summary(self) -> str:
        """'Cancel, 600 tasks: 590 done; 8 skipped (5 is COMPLETED, 3 is QUEUED); 2 lost a race.'"""
        parts = [f"{self.count('done')} done"]
        if self.skips:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.skips.items(), key=lambda kv: (-kv[1], kv[0])))
            parts.append(f"{self.count('skipped')} skipped ({reasons})")
        if self.count("lost"):
            parts.append(f"{self.count('lost')} lost a race (changed meanwhile; left alone)")
        n = len(self.lines)
        return f"{self.action}, {n} {self.noun}{'s' if n != 1 else ''}: {'; '.join(parts)}."

    def message(self) -> str:
        rows = format_html_join("", '<li class="action-{}">{}</li>', self.lines)
        return format_html(
            '{}<details class="action-rows"><summary>Each task ({})</summary><ul>{}</ul></details>',
            self.summary(), len(self.lines), rows,
        )

    def level(self) -> int:
        if self.count("lost"):
            return messages.ERROR
        return messages.WARNING if self.skips else messages.SUCCESS


def _kind_of(exc: errors.BoardError) -> str:
    """A skip's reason for the counts: the stage that refused the move, else the engine's code."""
    if exc.details.get("kind"):
        return exc.details["kind"]
    if isinstance(exc.task, Task):
        return f"is {exc.task.stage}"
    return exc.code.replace("_", " ")


class TaskActionForm(admin.helpers.ActionForm):
    """The changelist's action bar, with the reason recorded in each event's detail."""

    reason = forms.CharField(
        required=False, max_length=REASON_MAX, label="Reason:",
        widget=forms.TextInput(attrs={"placeholder": "why (kept in the history)", "size": 30}),
    )


def action_reason(request) -> str:
    """The reason typed in the action bar whose button was pressed (there may be two bars)."""
    values = request.POST.getlist("reason")
    try:
        index = int(request.POST.get("index", 0))
    except ValueError:
        index = 0
    value = values[index] if index < len(values) else (values[0] if values else "")
    return value.strip()[:REASON_MAX]


ACTION_ROW_FIELDS = (
    "id", "title", "stage", "version", "owner", "lease_expires_at", "fence", "attempts", "max_retries",
    "has_checkpoint",
)


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
    inlines = (TaskEventInline,)
    action_form = TaskActionForm
    form = TaskEditForm
    add_form = TaskCreateForm
    actions = (
        "release_stale_leases", "force_release", "requeue", "requeue_reset_attempts", "cancel",
        "admit", "pause",
    )

    READONLY = (
        "id", "stage", "version", "queue", "hold", "owner", "fence", "lease", "lease_expires_at", "attempts_of_max",
        "not_before", "progress", "checkpoint", "result", "last_error_text", "created_at", "updated_at",
        "dependencies_list",
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
        if task.lease_expires_at is None:
            return "—"
        seconds = (task.lease_expires_at - self.clock()).total_seconds()
        return f"in {span(seconds)}" if seconds > 0 else "expired"

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
        return format_html('<pre class="last-error" style="white-space: pre-wrap; margin: 0">{}</pre>', task.last_error)

    @admin.display(description="dependencies")
    def dependencies_list(self, task: Task) -> str:
        deps = list(task.dependencies.order_by("depends_on_id").values_list("depends_on_id", "depends_on__stage"))
        return ", ".join(f"{dep} ({stage})" for dep, stage in deps) or "—"

    # -- forms ---------------------------------------------------------------------------------

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [
                (None, {"fields": ("id", "title", "description", "queue", "priority", "max_retries",
                                   "hold", "payload", "deps")}),
            ]
        editable = list(EDITABLE)
        if self.has_change_permission(request, obj):
            editable += ["opened_version", "opened_state"]
        return [
            (None, {"fields": ("id", "stage", "version", "queue", "hold", "dependencies_list")}),
            ("What the task is (editable, under the version guard)", {"fields": editable}),
            ("Lease", {"fields": ("owner", "fence", "lease", "lease_expires_at", "attempts_of_max", "not_before")}),
            ("Progress and outcome", {"fields": ("progress", "checkpoint", "result", "last_error_text",
                                                 "created_at", "updated_at")}),
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

    def get_inline_instances(self, request, obj=None):
        # The history is read-only: a POST carries none of it, so none is built or validated.
        if obj is None or request.method == "POST":
            return []
        return super().get_inline_instances(request, obj)

    def get_formset_kwargs(self, request, obj, inline, prefix):
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, TaskEventInline):
            # The ids first, not a sliced Subquery: MongoDB's backend drops a subquery's slice.
            latest = list(TaskEvent.objects.filter(task=obj).order_by("-id").values_list("id", flat=True)[:HISTORY_LIMIT])
            kwargs["queryset"] = TaskEvent.objects.filter(id__in=latest).order_by("id")
        return kwargs

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        task = Task.objects.filter(pk=unquote(object_id)).only("stage").first()
        if task is not None and task.stage in TERMINAL:
            extra_context.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False)
        return super().change_view(request, object_id, form_url, extra_context)

    def history_view(self, request, object_id, extra_context=None):
        """Django's object history (its LogEntry rows) shows internal field names and none of
        the engine's moves: the task's history is the inline on its page, so go there."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        url = reverse("admin:board_task_change", args=[quote(unquote(object_id))], current_app=self.admin_site.name)
        return HttpResponseRedirect(f"{url}#events-group")

    def save_model(self, request, obj, form, change):
        pass  # the form's engine call (transitions.edit / create) was the write

    def save_related(self, request, form, formsets, change):
        pass  # dependencies are written by transitions.create; history only by transitions

    # -- actions -------------------------------------------------------------------------------

    def _rows(self, request, queryset) -> list[dict] | None:
        """The selected tasks as read now (the versions the verbs are then held to)."""
        rows = list(
            queryset.annotate(has_checkpoint=ExpressionWrapper(Q(checkpoint__isnull=False), BooleanField()))
            .order_by("pk").values(*ACTION_ROW_FIELDS)[: MAX_ACTION_ROWS + 1]
        )
        if len(rows) > MAX_ACTION_ROWS:
            self.message_user(
                request, f"Select at most {MAX_ACTION_ROWS} tasks per action; nothing was done.", messages.ERROR
            )
            return None
        return rows

    def _each(self, request, queryset, action: str, call, done) -> None:
        """Call `call(task_id, actor=, version=[, reason=])` for every selected task, held to the
        version just read; report the outcomes in one message."""
        rows = self._rows(request, queryset)
        if rows is None:
            return
        actor = request.user.get_username()
        reason = action_reason(request)
        extra = {"reason": reason} if reason else {}
        with _Report(self, request, action) as report:
            for row in rows:
                report.attempt(row["id"],
                               lambda row=row: call(row["id"], actor=actor, version=row["version"], **extra),
                               lambda task, row=row: done(row, task))

    @admin.action(permissions=["intervene"], description="Release stale leases (expired only)")
    def release_stale_leases(self, request, queryset):
        rows = self._rows(request, queryset)
        if rows is None:
            return
        now = self.clock()
        expired = {
            r["id"]: r for r in rows
            if r["stage"] == Stage.RUNNING and r["lease_expires_at"] is not None and r["lease_expires_at"] <= now
        }
        reclaimed = {}
        if expired:
            # The store's reaper, limited to these tasks and this clock: a lease renewed
            # meanwhile is live again and is not touched (its CAS re-checks the expiry).
            reclaimed = {
                r.task_id: r.to_stage
                for r in transitions.reclaim_expired(now=now, task_ids=list(expired), limit=len(expired),
                                                     actor=request.user.get_username())
            }
        with _Report(self, request, "Release stale leases") as report:
            for row in rows:
                task_id = row["id"]
                if task_id in reclaimed:
                    was = f"was held by {row['owner']}, {lease_was(row['lease_expires_at'], now)}"
                    if reclaimed[task_id] == Stage.FAILED:
                        report.done(task_id, f"failed: lease expired on its last attempt ({was})")
                    else:
                        report.done(task_id, f"released ({was})")
                elif task_id in expired:
                    report.lost(task_id, Task.objects.filter(pk=task_id).first())
                elif row["stage"] != Stage.RUNNING:
                    report.skipped(task_id, f"not RUNNING (is {row['stage']})", f"is {row['stage']}")
                else:
                    report.skipped(
                        task_id,
                        f"lease still live (held by {row['owner']}, {lease_state(row['lease_expires_at'], now)})",
                        "lease still live",
                    )

    @admin.action(permissions=["intervene"], description="Force release (live leases too; asks first)")
    def force_release(self, request, queryset):
        if request.POST.get("post") == "yes":
            return self._force_release_confirmed(request, queryset)
        rows = self._rows(request, queryset)
        if rows is None:
            return None
        now = self.clock()
        running = [r for r in rows if r["stage"] == Stage.RUNNING]
        skipped = [r for r in rows if r["stage"] != Stage.RUNNING]
        if not running:
            with _Report(self, request, "Force release") as report:
                for row in skipped:
                    report.skipped(row["id"], f"not RUNNING (is {row['stage']})", f"is {row['stage']}")
            return None
        for row in running:
            row["lease_text"] = lease_state(row["lease_expires_at"], now)
        context = {
            **self.admin_site.each_context(request),
            "title": "Force release: are you sure?",
            "opts": self.opts,
            "reason": action_reason(request),
            "running": running,
            "skipped": skipped,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/board/task/force_release_confirmation.html", context)

    def _force_release_confirmed(self, request, queryset) -> None:
        rows = self._rows(request, queryset)
        if rows is None:
            return
        actor = request.user.get_username()
        reason = action_reason(request)
        now = self.clock()
        with _Report(self, request, "Force release") as report:
            for row in rows:
                task_id = row["id"]
                holder, fence = request.POST.get(f"holder_{task_id}"), request.POST.get(f"fence_{task_id}", "")
                if holder is None or not fence.isdigit():  # it was not RUNNING on the confirmation page
                    if row["stage"] != Stage.RUNNING:
                        report.skipped(task_id, f"not RUNNING (is {row['stage']})", f"is {row['stage']}")
                    else:
                        report.skipped(task_id, f"was not RUNNING when you confirmed (now held by {row['owner']}); "
                                                "select it again to release it", "was not RUNNING when you confirmed")
                    continue
                self._release_lease_seen(report, row, (holder, int(fence)), actor=actor, reason=reason, now=now)

    def _release_lease_seen(self, report: _Report, row: dict, seen: tuple[str, int], *, actor: str, reason: str,
                            now: datetime) -> None:
        """Force release held to the lease shown on the confirmation page (its holder and fence),
        not to its version: the holder's renewals while the operator read the page do not undo
        the decision, but a lease that changed hands (or a task that left RUNNING) is left alone
        and the row says why."""
        task_id = row["id"]
        try:
            transitions.force_release(task_id, actor=actor, held_by=seen, reason=reason)
        except errors.VersionConflict as exc:
            current = _current(exc, task_id)
            if current is not None and current.stage == Stage.RUNNING:
                why = (f"the lease changed hands since the confirmation page (you saw {seen[0]}'s lease, "
                       f"fence {seen[1]}; now held by {current.owner}, fence {current.fence}); nothing was done")
            else:
                why = "the task left RUNNING since the confirmation page; nothing was done"
            report.lost(task_id, current, why)
        except errors.NotFound:
            report.skipped(task_id, "no such task")
        except errors.BoardError as exc:
            report.skipped(task_id, exc.message, _kind_of(exc))
        else:
            report.done(task_id, f"released (was held by {seen[0]}, {lease_was(row['lease_expires_at'], now)})")

    @admin.action(permissions=["intervene"], description="Requeue (FAILED or PAUSED → QUEUED)")
    def requeue(self, request, queryset):
        self._requeue(request, queryset, reset_attempts=False)

    @admin.action(permissions=["intervene"], description="Requeue and reset attempts")
    def requeue_reset_attempts(self, request, queryset):
        self._requeue(request, queryset, reset_attempts=True)

    def _requeue(self, request, queryset, *, reset_attempts: bool) -> None:
        def call(task_id, *, actor, version, reason=""):
            try:
                return transitions.requeue(task_id, actor=actor, version=version, reset_attempts=reset_attempts,
                                           reason=reason)
            except errors.InvalidTransition as exc:
                task = exc.task
                if task is not None and task.stage in (Stage.FAILED, Stage.PAUSED):
                    raise errors.InvalidTransition(
                        f"no attempt left ({task.attempts} / {task.max_retries + 1}); "
                        "use “Requeue and reset attempts”", task=task, kind="no attempt left",
                    ) from None
                raise

        def done(row, task):
            attempts = f", attempts {row['attempts']} → 0" if reset_attempts else ""
            return f"requeued (was {row['stage']}{attempts})"

        label = "Requeue and reset attempts" if reset_attempts else "Requeue"
        self._each(request, queryset, label, call, done)

    @admin.action(permissions=["intervene"], description="Cancel")
    def cancel(self, request, queryset):
        def done(row, task):
            held = f", held by {row['owner']}" if row["stage"] == Stage.RUNNING else ""
            return f"cancelled (was {row['stage']}{held})"

        self._each(request, queryset, "Cancel", transitions.cancel, done)

    @admin.action(permissions=["intervene"], description="Admit held PENDING tasks")
    def admit(self, request, queryset):
        self._each(request, queryset, "Admit", transitions.admit, lambda row, task: "admitted (PENDING → QUEUED)")

    @admin.action(permissions=["intervene"], description="Pause running tasks (keep last checkpoint)")
    def pause(self, request, queryset):
        def done(row, task):
            # The verb was held to the version read with `has_checkpoint`, so this is exact.
            kept = "checkpoint kept" if row["has_checkpoint"] else "no checkpoint saved: a resume starts over"
            return f"paused (was held by {row['owner']}; {kept})"

        self._each(request, queryset, "Pause", transitions.force_pause, done)


# ---------------------------------------------------------------------------------------------
# Agent keys


class AgentKeyCreateForm(_EngineForm):
    """Mints a key. An operator key acts as an operator through the API, so making one is itself
    an intervention: without board.intervene the field is not offered, and a request that sends
    it anyway is refused (never silently turned into a plain key)."""

    may_mint_operator = False  # set per request by the admin's get_form

    class Meta:
        model = AgentKey
        fields = ("name", "is_operator")

    def clean(self):
        cleaned = super().clean()
        if not self.may_mint_operator and self.data.get("is_operator") not in (None, "", "off", "false", "0"):
            raise forms.ValidationError(
                "Only a user with the board.intervene permission may create an operator key.")
        return cleaned

    def apply(self) -> None:
        try:
            row, key = agent_keys.create_key(self.cleaned_data["name"],
                                             is_operator=bool(self.cleaned_data.get("is_operator")))
        except errors.BoardError as exc:
            self.add_error("name", exc.message)
            return
        row.minted_key = key  # in memory only, for the one response that shows it
        self.written = row


class KeyStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("revoked", "revoked")]

    def queryset(self, request, queryset):
        if self.value() == "live":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(AgentKey)
class AgentKeyAdmin(NoHashLookups, admin.ModelAdmin):
    list_display = ("name", "prefix", "is_operator", "created_at", "last_used_at", "revoked_at")
    list_filter = ("is_operator", KeyStateFilter)
    search_fields = ("name", "prefix")
    ordering = ("name", "created_at")
    exclude = ("key_hash",)
    readonly_fields = ("name", "prefix", "is_operator", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = AgentKeyCreateForm
            form = super().get_form(request, obj, change=change, **kwargs)
            return type(form.__name__, (form,), {"may_mint_operator": self.may_mint_operator(request)})
        return super().get_form(request, obj, change=change, **kwargs)

    @staticmethod
    def may_mint_operator(request) -> bool:
        return request.user.has_perm("board.intervene")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("name", "is_operator") if self.may_mint_operator(request) else ("name",)
        return self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.readonly_fields

    def has_change_permission(self, request, obj=None):
        # A key is never edited: its page is read-only; revoking is the action (which checks
        # the model's change permission, asked without an object).
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row says when the key was last used

    def save_model(self, request, obj, form, change):
        pass  # agent_keys.create_key wrote it

    def response_add(self, request, obj, post_url_continue=None):
        """Show the key once, in this response, never in a message (messages may be stored in
        the session) and never again."""
        context = {
            **self.admin_site.each_context(request),
            "title": "Agent key created",
            "opts": self.opts,
            "key_row": obj,
            "key": getattr(obj, "minted_key", ""),
        }
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, "admin/board/agentkey/key_created.html", context)
        add_never_cache_headers(response)
        return response

    @admin.action(permissions=["change"], description="Revoke selected keys")
    def revoke(self, request, queryset):
        with _Report(self, request, "Revoke", "key") as report:
            for key in queryset.order_by("name", "pk").only("pk", "name", "prefix"):
                label = f"{key.name} ({key.prefix}…)"
                if agent_keys.revoke(key.pk):
                    report.done(label, "revoked")
                else:
                    report.skipped(label, "already revoked")
