"""The webhooks admin (issue 33, item 6; board/webhooks/): each subscription with its delivery
log, and the deliveries' own list (what was sent, how often, the receiver's last answer).
Subscriptions are created over the API (`POST /api/webhooks`, whose answer carries the signing
secret once); here they are read, switched off and on, and deleted. The secret is never shown
(board/admin/secret_columns.py): it is not a field of any page here.

Who may (board/access.py): see them with board.view_webhook (or board.add_webhook); switch one
off or on, or send deliveries again, with board.add_webhook; delete with board.delete_webhook."""
from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from board import access
from board.admin.actions import Report
from board.admin.filters import NoHashLookups
from board.engine.limits import MAX_ACTION_ROWS
from board.models import Webhook, WebhookDelivery
from board.webhooks import sending, subscriptions

LOG_ROWS = 50  # deliveries shown on a webhook's page (the Deliveries list has them all)
STATE_MARKS = {WebhookDelivery.DELIVERED: "✓ delivered", WebhookDelivery.PENDING: "… pending",
               WebhookDelivery.FAILED: "✗ gave up"}


class _WebhookRights(NoHashLookups):
    """Who may (board/access.py); and no lookup on the secret (`?webhook__secret__startswith=`)."""

    def has_view_permission(self, request, obj=None) -> bool:
        return access.may_view_webhooks(request.user)

    def has_module_permission(self, request) -> bool:
        return access.may_view_webhooks(request.user)

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # POST /api/webhooks: its answer is the one place the secret is shown

    def has_change_permission(self, request, obj=None) -> bool:
        return access.may_add_webhooks(request.user)

    def has_delete_permission(self, request, obj=None) -> bool:
        return access.may_delete_webhooks(request.user)


def _deliveries_of(webhook_id: int, state: str | None = None) -> str:
    query = {"webhook__id__exact": webhook_id, **({"state__exact": state} if state else {})}
    return f"{reverse('admin:board_webhookdelivery_changelist')}?{urlencode(query)}"


@admin.register(Webhook)
class WebhookAdmin(_WebhookRights, admin.ModelAdmin):
    list_display = ("id", "url", "event_names", "format", "active", "deliveries_summary", "created_by", "created_at")
    list_display_links = ("id", "url")
    list_filter = ("active", "format")
    search_fields = ("url",)
    ordering = ("id",)
    show_facets = admin.ShowFacets.NEVER
    fields = ("url", "event_names", "filter_text", "format", "active", "created_by", "created_at", "cursor",
              "deliveries_summary", "delivery_log")
    readonly_fields = ("url", "event_names", "filter_text", "format", "created_by", "created_at", "cursor",
                       "deliveries_summary", "delivery_log")

    @admin.display(description="events")
    def event_names(self, webhook: Webhook) -> str:
        return ", ".join(webhook.events)

    @admin.display(description="filter")
    def filter_text(self, webhook: Webhook) -> str:
        wanted = webhook.filter or {}
        parts = ([f"queue {wanted['queue']}"] if wanted.get("queue") else []) + (
            [f"tags (any) {', '.join(wanted['tags'])}"] if wanted.get("tags") else [])
        return "; ".join(parts) or "none: events of every task"

    @admin.display(description="deliveries")
    def deliveries_summary(self, webhook: Webhook) -> str:
        rows = WebhookDelivery.objects.filter(webhook_id=webhook.pk)
        counts = [(state, rows.filter(state=state).count()) for state in
                  (WebhookDelivery.DELIVERED, WebhookDelivery.PENDING, WebhookDelivery.FAILED)]
        return format_html_join(" · ", '<a href="{}">{} {}</a>',
                                ((_deliveries_of(webhook.pk, state), n, state) for state, n in counts))

    @admin.display(description=f"delivery log (newest {LOG_ROWS})")
    def delivery_log(self, webhook: Webhook) -> str:
        log = list(WebhookDelivery.objects.filter(webhook_id=webhook.pk).order_by("-id")[:LOG_ROWS])
        if not log:
            return "No deliveries yet: the events it wants have not happened since it was created."
        head = format_html("<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
                           "delivery", "event", "state", "attempts", "last answer", "next attempt / delivered",
                           "created")
        body = format_html_join("", "<tr class=\"delivery-{}\"><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td>"
                                    "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (d.state, reverse("admin:board_webhookdelivery_change", args=[d.pk]), d.pk, d.event,
             STATE_MARKS.get(d.state, d.state), d.attempts, _answer(d),
             _when(d.delivered_at if d.state == WebhookDelivery.DELIVERED else d.next_attempt_at), _when(d.created_at))
            for d in log))
        return format_html('<table id="delivery-log">{}{}</table><p><a href="{}">every delivery</a></p>',
                           head, body, _deliveries_of(webhook.pk))

    def save_model(self, request, obj, form, change):
        # Never the whole row: the form read the cursor when the page opened, and a collecting
        # pass has moved it since. `active` is the one field this page changes.
        subscriptions.set_active(obj.pk, obj.active)

    def delete_model(self, request, obj):
        try:
            subscriptions.delete_webhook(obj.pk)
        except Exception:  # deleted meanwhile
            pass

    def delete_queryset(self, request, queryset):
        for pk in list(queryset.values_list("pk", flat=True)):
            self.delete_model(request, Webhook(pk=pk))


def _answer(d: WebhookDelivery) -> str:
    if d.last_error:
        return d.last_error[:160]
    return f"HTTP {d.last_status}" if d.last_status is not None else "—"


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_WebhookRights, admin.ModelAdmin):
    list_display = ("id", "webhook", "event", "state", "attempts", "last_status", "short_error", "next_attempt_at",
                    "delivered_at", "created_at")
    list_filter = ("state", "event", "webhook")
    search_fields = ("event_id",)
    ordering = ("-id",)
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    actions = ("send_again",)
    readonly_fields = ("webhook", "event", "event_id", "state", "attempts", "next_attempt_at", "last_status",
                       "last_error", "delivered_at", "created_at", "body")

    def has_change_permission(self, request, obj=None) -> bool:
        # Read-only pages; the action (which asks without an object) sends again.
        return obj is None and access.may_add_webhooks(request.user)

    @admin.display(description="last error")
    def short_error(self, d: WebhookDelivery) -> str:
        return d.last_error[:80]

    @admin.action(permissions=["change"], description="Send selected deliveries again now")
    def send_again(self, request, queryset):
        ids = list(queryset.order_by("-id").values_list("pk", flat=True)[:MAX_ACTION_ROWS + 1])
        if len(ids) > MAX_ACTION_ROWS:
            self.message_user(request, f"Select at most {MAX_ACTION_ROWS} deliveries per action; nothing was done.",
                              "error")
            return
        with Report(self, request, "Send again", "delivery") as report:
            for pk in ids:
                if sending.send_again(pk):
                    report.done(str(pk), "due now (the next pass sends it)")
                else:
                    report.skipped(str(pk), "already delivered")
