"""The approvals admin (issue 32, item 2, approval gates; board.engine.approvals): every question a
task's holder asked a person, with its answer. The list shows the task, the question (cut short),
its state, who asked and when, who answered and when, and a link to answer a waiting one; it
filters by state. Rows are the engine's record: nobody adds, changes or deletes one here.

The answer page draws the approval's form (its JSON Schema of flat fields: text, a choice for an
enum, numbers, a checkbox) with a comment and the Approve / Reject buttons, and answers through
`board.engine.transitions.answer` with the approval's id and the permission rule built from the
user (`board.access.answer_rule`: username, group names, board.intervene, superuser), judged in
the answer's transaction as the API judges it. A refusal (not an approver, answered first,
values that do not fit the form) is an admin message in the engine's words, and nothing is
written.

Who may see the list: anyone who reads tasks (board.view_task or board.change_task), as GET
/api/approvals; who may answer: the rule above."""
from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from board import access
from board.admin.filters import NoHashLookups
from board.engine import errors, transitions
from board.engine.limits import MAX_QUESTION_CHARS
from board.models import Approval

QUESTION_CHARS = 80  # of the question, in the list
TIMEOUT_WORDS = {"fail": "the task fails", "approve": "it is approved by itself", "cancel": "the task is cancelled"}


def _label(name: str, spec: dict, required: bool) -> str:
    return f"{spec.get('title') or name}{' (required to approve)' if required else ''}"


def _field(name: str, spec: dict, required: bool) -> forms.Field:
    """A form field for one of the schema's fields. None is required by Django: Reject needs no
    values, and the engine checks them against the schema on Approve (its words on a refusal)."""
    common = {"label": _label(name, spec, required), "help_text": spec.get("description", ""), "required": False}
    kind = spec.get("type")
    if kind == "boolean":
        return forms.BooleanField(initial=spec.get("default") is True, **common)
    if isinstance(spec.get("enum"), list):
        choices = [("", "—")] + [(json.dumps(v), str(v)) for v in spec["enum"]]
        initial = json.dumps(spec["default"]) if "default" in spec else ""
        return forms.TypedChoiceField(choices=choices, coerce=json.loads, empty_value=None, initial=initial, **common)
    if kind == "integer":
        return forms.IntegerField(initial=spec.get("default"), **common)
    if kind == "number":
        return forms.FloatField(initial=spec.get("default"), **common)
    return forms.CharField(initial=spec.get("default"), strip=False, **common)


class AnswerForm(forms.Form):
    """The approval's fields (prefixed `field_`) and a comment; the pressed button decides."""

    def __init__(self, approval: Approval, *args, **kwargs):
        super().__init__(*args, **kwargs)
        schema = approval.form or {}
        required = set(schema.get("required", []))
        self.names = list(schema.get("properties", {}))
        for name, spec in schema.get("properties", {}).items():
            self.fields[f"field_{name}"] = _field(name, spec, name in required)
        self.fields["comment"] = forms.CharField(
            required=False, max_length=MAX_QUESTION_CHARS, widget=forms.Textarea(attrs={"rows": 3}),
            help_text="Words for the agent (its next claim carries the answer).")
        self.has_form = approval.form is not None

    def values(self) -> dict | None:
        """The values filled in, typed as the schema says; an empty box sends nothing."""
        if not self.has_form:
            return None
        out = {}
        for name in self.names:
            value = self.cleaned_data.get(f"field_{name}")
            if isinstance(self.fields[f"field_{name}"], forms.BooleanField):
                out[name] = bool(value)
            elif value not in (None, ""):
                out[name] = value
        return out


@admin.register(Approval)
class ApprovalAdmin(NoHashLookups, admin.ModelAdmin):
    list_display = ("id", "task_link", "short_question", "state", "asked_by", "asked_at", "answered_by",
                    "answered_at", "answer_link")
    list_display_links = ("id", "short_question")
    list_filter = ("state",)
    search_fields = ("task__id", "question", "asked_by", "answered_by")
    ordering = ("-id",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    list_select_related = False
    fields = ("id", "task_link", "question", "form_text", "approvers_text", "asked_by", "asked_at", "attempt",
              "fence", "due_text", "state", "approved", "values_text", "comment", "answered_by", "answered_at",
              "answer_link")
    readonly_fields = fields

    # -- who may: read like the tasks; rows are the engine's ------------------------------------

    def has_view_permission(self, request, obj=None) -> bool:
        return access.may_read(request.user)

    def has_module_permission(self, request) -> bool:
        return access.may_read(request.user)

    def has_add_permission(self, request) -> bool:
        return False  # an agent asks (POST /api/tasks/{id}/request-approval)

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # answered on its answer page, through the engine

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the record of who decided what; it goes with its task (the prune)

    # -- columns ----------------------------------------------------------------------------------

    @admin.display(description="task", ordering="task_id")
    def task_link(self, a: Approval) -> str:
        return format_html('<a href="{}" style="white-space: nowrap">{}</a>',
                           reverse("admin:board_task_change", args=[quote(a.task_id)]), a.task_id)

    @admin.display(description="question")
    def short_question(self, a: Approval) -> str:
        return a.question if len(a.question) <= QUESTION_CHARS else a.question[:QUESTION_CHARS - 1] + "…"

    @admin.display(description="answer")
    def answer_link(self, a: Approval) -> str:
        if a.state != Approval.WAITING:
            return "—"
        return format_html('<a class="button answer-link" href="{}">Answer</a>',
                           reverse("admin:board_approval_answer", args=[a.pk]))

    @admin.display(description="form")
    def form_text(self, a: Approval) -> str:
        if not a.form:
            return "none: approve or reject, with a comment"
        required = set(a.form.get("required", []))
        rows = ((name, spec.get("title") or "", spec.get("type"), ", ".join(map(str, spec.get("enum", []))) or "—",
                 "yes" if name in required else "no") for name, spec in a.form.get("properties", {}).items())
        cells = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        return format_html('<table class="approval-form"><tr><th>field</th><th>title</th><th>type</th><th>choices</th>'
                           "<th>required</th></tr>{}</table>", cells)

    @admin.display(description="approvers")
    def approvers_text(self, a: Approval) -> str:
        return ", ".join(a.approvers) or "operators (board.intervene)"

    @admin.display(description="timeout")
    def due_text(self, a: Approval) -> str:
        if not a.due_at:
            return "none: it waits until answered"
        return f"{a.due_at:%Y-%m-%d %H:%M:%S} UTC, then {TIMEOUT_WORDS.get(a.on_timeout, a.on_timeout)}"

    @admin.display(description="values")
    def values_text(self, a: Approval) -> str:
        if not a.values:
            return "—"
        return format_html_join(", ", "{} = {}", ((k, json.dumps(v)) for k, v in a.values.items()))

    # -- the answer page --------------------------------------------------------------------------

    def get_urls(self):
        return [path("<int:approval_id>/answer/", self.admin_site.admin_view(self.answer_view),
                     name="board_approval_answer"), *super().get_urls()]

    def answer_view(self, request, approval_id: int):
        if not self.has_view_permission(request):
            raise PermissionDenied
        approval = Approval.objects.filter(pk=approval_id).first()
        if approval is None:
            self.message_user(request, f"There is no approval {approval_id}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:board_approval_changelist"))
        page = reverse("admin:board_approval_change", args=[approval.pk])
        if approval.state != Approval.WAITING:
            self.message_user(request, f"Approval {approval.pk} is not waiting: {approval.get_state_display()}"
                              f"{f' by {approval.answered_by}' if approval.answered_by else ''}.", messages.WARNING)
            return HttpResponseRedirect(page)
        form = AnswerForm(approval, request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            approve = "approve" in request.POST
            actor = request.user.get_username()
            try:
                task, answered = transitions.answer(
                    approval.task_id, approve, actor=actor, values=form.values(),
                    comment=form.cleaned_data["comment"], approval_id=approval.pk,
                    may_answer=access.answer_rule(request.user))
            except errors.BoardError as exc:
                # The engine's words; nothing was written. The page stays, with what was filled in.
                self.message_user(request, f"Not answered: {exc}", messages.ERROR)
                if isinstance(exc, errors.AlreadyAnswered):
                    return HttpResponseRedirect(page)
            else:
                self.message_user(request, f"Approval {answered.pk} {answered.state}: task {task.pk} is {task.stage} "
                                           f"again (kept a minute for {answered.asked_by}, who asked).",
                                  messages.SUCCESS)
                return HttpResponseRedirect(page)
        may = access.answer_rule(request.user)(approval)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Answer approval {approval.pk} of task {approval.task_id}",
            "opts": self.opts,
            "approval": approval,
            "form": form,
            "may_answer": may,
            "approvers": self.approvers_text(approval),
            "due": self.due_text(approval),
            "task_link": self.task_link(approval),
            "media": self.media + form.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/board/approval/answer.html", context)
