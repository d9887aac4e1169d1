"""The change lists' filters (each a cheap query: no scan over all tasks for its choices beyond
one DISTINCT), and the rule that no list is filtered on a stored hash."""
from __future__ import annotations

from django.contrib import admin

from board import agent_keys
from board.engine import clock as store_clock
from board.engine import selectors

# How many owners the owner filter offers (the search box finds any owner).
OWNER_FILTER_LIMIT = 50

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


class LeaseStateFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("expired", "expired"), ("none", "none")]

    def queryset(self, request, queryset):
        # The store's clock, as the reaper judges leases.
        wanted = selectors.lease_filter(self.value(), store_clock.in_query())
        return queryset if wanted is None else queryset.filter(wanted)


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [(q, q) for q in selectors.queue_names()]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """The agents holding leases now (only RUNNING tasks have an owner)."""

    title = "owner (running tasks)"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        return [(o, o) for o in selectors.running_owners(OWNER_FILTER_LIMIT)]

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
