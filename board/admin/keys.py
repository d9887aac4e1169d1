"""The agent key admin. Keys are minted by `agent_keys.create_key`, shown once in the response
to the add form, and revoked by `agent_keys.revoke`; their hashes are never displayed. Minting
an operator key needs `board.intervene` besides `board.add_agentkey`. A key is never renamed or
deleted: its row says when it was last used.

One live key per agent name: the add form refuses a name that has one, unless the user rotates
it, which needs `board.change_agentkey` (the old key then ends after the grace chosen; its end
shows as "Revoked at", ahead of time until then). A key may be limited to some queues (glob
patterns, board.engine.scopes), set at minting and shown in the list.

What the agent can do (its capabilities, board.engine.capabilities: `gpu,python`) is set at
minting and is the one thing of a live key that changes: on its page, with
`board.change_agentkey`, through `agent_keys.set_capabilities` (which checks the labels: a bad one
is the field's error and nothing is written). An ended key's page is read-only."""
from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from board import agent_keys
from board.admin.actions import Report
from board.admin.filters import KeyStateFilter, NoHashLookups
from board.admin.forms import AgentKeyCapabilitiesForm, AgentKeyCreateForm
from board.engine import clock
from board.models import AgentKey


@admin.register(AgentKey)
class AgentKeyAdmin(NoHashLookups, admin.ModelAdmin):
    list_display = ("name", "prefix", "is_operator", "scope", "capability_list", "created_at", "last_used_at",
                    "revoked_at")
    list_filter = ("is_operator", KeyStateFilter)
    search_fields = ("name", "prefix")
    ordering = ("name", "created_at")
    exclude = ("key_hash",)
    readonly_fields = ("name", "prefix", "is_operator", "queues", "created_at", "last_used_at", "revoked_at")
    # A key's page: every field read-only but its capabilities (get_readonly_fields).
    PAGE_FIELDS = ("name", "prefix", "is_operator", "queues", "capabilities", "created_at", "last_used_at",
                   "revoked_at")
    actions = ("revoke",)

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = AgentKeyCreateForm
            form = super().get_form(request, obj, change=change, **kwargs)
            return type(form.__name__, (form,), {"may_mint_operator": self.may_mint_operator(request),
                                                 "may_rotate": self.may_rotate(request)})
        kwargs["form"] = AgentKeyCapabilitiesForm
        return super().get_form(request, obj, change=change, **kwargs)

    @staticmethod
    def may_mint_operator(request) -> bool:
        return request.user.has_perm("board.intervene")

    @admin.display(description="queues", ordering="queues")
    def scope(self, key: AgentKey) -> str:
        """The queues the key is limited to (board.engine.scopes), or that it has none."""
        return key.queues.replace(",", ", ") if key.queues else "every queue"

    @admin.display(description="capabilities", ordering="capabilities")
    def capability_list(self, key: AgentKey) -> str:
        """What the agent can do (board.engine.capabilities), or that it has none: it then takes
        only tasks that require nothing."""
        return key.capabilities.replace(",", ", ") if key.capabilities else "none"

    @staticmethod
    def may_rotate(request) -> bool:
        return request.user.has_perm("board.change_agentkey")

    def get_fields(self, request, obj=None):
        if obj is None:
            fields = ("name", "is_operator", "queues") if self.may_mint_operator(request) else ("name", "queues")
            fields = (*fields, "capabilities")
            return (*fields, "rotate", "grace_seconds") if self.may_rotate(request) else fields
        return self.PAGE_FIELDS

    def get_readonly_fields(self, request, obj=None):
        # (Without the change permission, or for an ended key, Django shows every field read-only.)
        return () if obj is None else self.readonly_fields

    def has_change_permission(self, request, obj=None):
        # A live key's capabilities change on its page; nothing else of a key does, and an ended
        # key's page is read-only. Revoking is the action (which checks the model's change
        # permission, asked without an object).
        return super().has_change_permission(request, obj) and (obj is None or self.is_live(obj))

    @staticmethod
    def is_live(key: AgentKey) -> bool:
        """Whether the key is still accepted: no end set, or its end still ahead (a rotation's
        grace), by the store's clock as agent_keys.live."""
        return key.revoked_at is None or key.revoked_at > clock.now()

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
        with Report(self, request, "Revoke", "key") as report:
            for key in queryset.order_by("name", "pk").only("pk", "name", "prefix"):
                label = f"{key.name} ({key.prefix}…)"
                if agent_keys.revoke(key.pk):
                    report.done(label, "revoked")
                else:
                    report.skipped(label, "already revoked")
