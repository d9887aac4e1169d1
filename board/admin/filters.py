"""The change lists' filters (each a cheap query: no scan over all tasks for its choices beyond
one DISTINCT), and the rule that no list is filtered on a secret-derived column
(board/admin/secret_columns.py says which they are)."""
from __future__ import annotations

from django.contrib import admin

from board.admin.secret_columns import names_a_secret
from board import agent_keys
from board.admin import reads
from board.engine import clock as store_clock
from board.engine.limits import OWNER_FILTER_LIMIT, QUEUE_FILTER_LIMIT


class NoHashLookups:
    """A ModelAdmin mixin: any changelist lookup that names a secret-derived column (a hash, a
    seed), on this model or through a relation, is refused (Django answers 400, and lists
    nothing); other lookups follow Django's rules."""

    def lookup_allowed(self, lookup, value, request=None):
        if names_a_secret(lookup):
            return False
        return super().lookup_allowed(lookup, value, request)


class LeaseStateFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("expired", "expired"), ("none", "none")]

    def queryset(self, request, queryset):
        # The store's clock, as the reaper judges leases.
        wanted = reads.lease_filter(self.value(), store_clock.in_query())
        return queryset if wanted is None else queryset.filter(wanted)


class QueueFilter(admin.SimpleListFilter):
    """The first QUEUE_FILTER_LIMIT queues by name, and the queue chosen (wherever it sorts)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        names = reads.queue_names(QUEUE_FILTER_LIMIT + 1)
        if len(names) > QUEUE_FILTER_LIMIT:
            names = names[:QUEUE_FILTER_LIMIT]
            self.title = f"queue (the first {QUEUE_FILTER_LIMIT} by name; search finds any)"
        if self.value() and self.value() not in names:
            names.append(self.value())
        return [(q, q) for q in names]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """The agents holding leases now (only RUNNING tasks have an owner)."""

    title = "owner (running tasks)"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        return [(o, o) for o in reads.running_owners(OWNER_FILTER_LIMIT)]

    def queryset(self, request, queryset):
        return queryset.filter(owner=self.value()) if self.value() else queryset


class KeyStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("revoked", "revoked")]

    def queryset(self, request, queryset):
        # A rotated key is live until its end (revoked_at, set ahead of time): board.agent_keys.
        if self.value() == "live":
            return queryset.filter(agent_keys.live(queryset.db))
        if self.value() == "revoked":
            return queryset.exclude(agent_keys.live(queryset.db))
        return queryset
