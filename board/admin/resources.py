"""The resources admin (issue 32, item 1; board.engine.resources): each resource tasks have named
(and each directory node a pattern holds, `file:src/app/`), its capacity, what is held of it now
("exclusive" or the units), the holds below it, and its current holders: the RUNNING tasks whose
claims took it (links to their pages), their agents, fences and lease expiries (a hold ends with
its lease). No lease token is read.

The capacity changes only through `resources.change_capacity` (ResourceChangeForm: the engine
checks it; a refused one shows on the field and nothing is written); `held` and `intents` are the
engine's counts, changed only by claims and the moves out of RUNNING, so they are read-only here.
Rows are made by the engine (the first create naming a resource, or a change through the API):
nothing is added or deleted here. As a rate key's rate, a capacity is a queue-wide setting: seeing
the page needs `board.view_queue` (or `board.change_queue`), changing one `board.change_queue`,
the right PUT /api/resources/{name} asks for.
"""
from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import display_for_value, quote
from django.contrib.admin.views.main import ChangeList
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from board.admin.forms import _EngineForm
from board.admin.queues import _QueuesPermissionsAdmin
from board.engine import errors, resources
from board.engine.limits import MAX_REASON_CHARS, MAX_RESOURCE_CAPACITY
from board.models import Resource

HOLDERS_LISTED = 3  # holders a row of the list names (the page lists up to HOLDERS_SHOWN)
HOLDERS_SHOWN = 100


def with_holders(rows) -> None:
    """Keep on each row its holders now (`holders_now`: resources.holders, one read for them all)."""
    found = {r["name"]: r["holders"] for r in resources.holders(names=[row.name for row in rows])}
    for row in rows:
        row.holders_now = found.get(row.name, [])


def held_text(row: Resource) -> str:
    if row.held >= resources.EXCLUSIVE:
        return "exclusive"
    return f"{row.held} of {row.capacity}" if row.held else "—"


def task_link(task_id: str) -> str:
    return format_html('<a href="{}">{}</a>', reverse("admin:board_task_change", args=[quote(task_id)]), task_id)


class ResourceChangeForm(_EngineForm):
    """Sets a resource's capacity through resources.change_capacity (the engine's rule: a whole
    number from 1 to MAX_RESOURCE_CAPACITY); its refusal shows on the field, nothing written."""

    capacity = forms.IntegerField(
        label="Capacity",
        help_text=f"Units its shared holders ({{\"name\", \"units\"}}) may hold together, 1 to "
                  f"{MAX_RESOURCE_CAPACITY:,}; an exclusive hold takes it whole whatever it is. A lowered "
                  "capacity applies to the next claims: the holds already taken stay until they end.")
    reason = forms.CharField(required=False, max_length=MAX_REASON_CHARS, strip=True,
                             help_text="Why (checked as a queue change's; a resource keeps no history of its "
                                       "changes yet: \"updated at\" says when it last changed).")

    class Meta:
        model = Resource
        fields = ("capacity",)

    def _post_clean(self):
        # Only the engine's rule decides (the model field's own bounds would speak first, in
        # other words), and only the engine writes.
        if not self._errors:
            self.apply()

    def apply(self) -> None:
        try:
            self.written = resources.change_capacity(self.instance.pk, self.cleaned_data["capacity"],
                                                     actor=self.actor, reason=self.cleaned_data.get("reason") or "")
        except errors.BoardError as exc:
            self.refused(exc)


class ResourceChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        with_holders(self.result_list)


@admin.register(Resource)
class ResourceAdmin(_QueuesPermissionsAdmin):
    list_display = ("name", "capacity", "held_now", "holds_below", "holders")
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    form = ResourceChangeForm
    readonly_fields = ("name", "held_now", "holds_below", "holders", "updated_at")

    # (permissions: the queues', from _QueuesPermissionsAdmin: a capacity spans queues)

    def get_changelist(self, request, **kwargs):
        return ResourceChangeList

    # -- columns ----------------------------------------------------------------------------------

    @staticmethod
    def holders_of(row: Resource) -> list[dict]:
        if not hasattr(row, "holders_now"):  # the change page's one row
            with_holders([row])
        return row.holders_now

    @admin.display(description="held")
    def held_now(self, row: Resource) -> str:
        # Not `held`: the model's field of that name (the engine's count, EXCLUSIVE for an
        # exclusive hold) would be shown instead of this.
        return held_text(row)

    @admin.display(description="holds below")
    def holds_below(self, row: Resource) -> int:
        return row.intents

    @admin.display(description="holders")
    def holders(self, row: Resource) -> str:
        found = self.holders_of(row)
        if not found:
            return "—"
        listed = format_html_join(", ", "{} ({})", ((task_link(h["task"]), h["agent"]) for h in found[:HOLDERS_LISTED]))
        more = len(found) - HOLDERS_LISTED
        return format_html("{}{}", listed, f" and {more} more" if more > 0 else "")

    @admin.display(description="holders now")
    def holders_table(self, row: Resource) -> str:
        found = self.holders_of(row)
        if not found:
            return "Nobody holds it now."
        body = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((task_link(h["task"]), h["agent"], h["fence"], "exclusive" if h["exclusive"] else h["units"],
              display_for_value(h["expires_at"], "—")) for h in found[:HOLDERS_SHOWN]))
        more = len(found) - HOLDERS_SHOWN
        return format_html('<table class="resource-holders"><thead><tr><th>task</th><th>agent</th><th>fence</th>'
                           '<th>holds</th><th>until (its lease)</th></tr></thead><tbody>{}</tbody></table>{}',
                           body, f"and {more} more" if more > 0 else "")

    # -- the change page ---------------------------------------------------------------------------

    def get_readonly_fields(self, request, obj=None):
        return (*self.readonly_fields, "holders_table")

    def get_fieldsets(self, request, obj=None):
        settings = ("capacity", "reason") if self.has_change_permission(request, obj) else ("capacity",)
        return [
            (None, {"fields": ("name", "held_now", "holds_below", "updated_at")}),
            ("Capacity (saved by the engine)", {"fields": settings}),
            ("Holders (RUNNING tasks; a hold ends with its lease)", {"fields": ("holders_table",)}),
        ]
