"""The webhooks admin (issue 33, item 6; board/webhooks/): each subscription with its delivery
log, and the deliveries' own list (what was sent, how often, the receiver's last answer).
Subscriptions are created here (the add page, whose answer shows the signing secret once, as
`POST /api/webhooks`'s does) or over the API; they are read, switched off and on, and deleted.
The secret is shown only on that one answer (board/admin/secret_columns.py): it is not a field
of any other page here.

Who may (board/access.py): see them with board.view_webhook (or board.add_webhook); switch one
off or on, or send deliveries again, with board.add_webhook; delete with board.delete_webhook."""
from __future__ import annotations

from django import forms
from django.contrib import admin
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from board import access
from board.admin.actions import Report
from board.admin.filters import NoHashLookups
from board.engine.limits import MAX_ACTION_ROWS
from board.models import Webhook, WebhookDelivery
from board.engine import errors
from board.webhooks import events, sending, subscriptions

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
        return False  # the deliveries' rows are made by the outbox; WebhookAdmin overrides it

    def has_change_permission(self, request, obj=None) -> bool:
        return access.may_add_webhooks(request.user)

    def has_delete_permission(self, request, obj=None) -> bool:
        return access.may_delete_webhooks(request.user)


class WebhookCreateForm(forms.ModelForm):
    """A new subscription, made by subscriptions.create_webhook as the form's last step (its
    refusal shows on the field it names); the secret it mints is kept in memory for the one
    answer that shows it."""

    FIELDS = ("url", "event_list", "filter_queue", "filter_tags", "format")
    actor = ""  # the operator's username; set per request by the admin's get_form

    event_list = forms.MultipleChoiceField(
        label="Events", choices=[(name, name) for name in events.SUBSCRIBABLE],
        widget=forms.CheckboxSelectMultiple,
        help_text="What to hear of (docs/webhooks.md says when each is sent).")
    filter_queue = forms.CharField(required=False, label="Only queues", max_length=2100,
                                   help_text="Queue patterns, as a key's scope: ci-*,docs (empty: every queue).")
    filter_tags = forms.CharField(required=False, label="Only tasks tagged",
                                  help_text="Tags, comma separated: a task carrying one of them (empty: any).")
    format = forms.ChoiceField(choices=[(f, f) for f in events.FORMATS], initial="json",
                               help_text="slack: {\"text\": ...} for a Slack incoming webhook.")

    class Meta:
        model = Webhook
        fields = ("url",)

    class Media:
        css = {"all": ("board/admin.css",)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.written = None

    def _post_clean(self):
        if self._errors:
            return
        wanted = {"queue": self.cleaned_data.get("filter_queue") or None,
                  "tags": [t.strip() for t in (self.cleaned_data.get("filter_tags") or "").split(",") if t.strip()]
                  or None}
        try:
            webhook, secret = subscriptions.create_webhook(
                self.cleaned_data["url"], self.cleaned_data["event_list"],
                filter={k: v for k, v in wanted.items() if v is not None} or None,
                format=self.cleaned_data["format"], actor=self.actor)
        except errors.BoardError as exc:
            field = {"url": "url", "events": "event_list", "filter": "filter_queue", "format": "format"}.get(exc.field)
            self.add_error(field, exc.message)
            return
        webhook.minted_secret = secret  # in memory only, for the one response that shows it
        self.written = webhook

    def save(self, commit=True):
        self.save_m2m = lambda: None
        return self.written


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

    def has_add_permission(self, request, obj=None) -> bool:
        return access.may_add_webhooks(request.user)

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = WebhookCreateForm
            form = super().get_form(request, obj, change=change, **kwargs)
            return type(form.__name__, (form,), {"actor": request.user.get_username()})
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        return WebhookCreateForm.FIELDS if obj is None else self.fields

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.readonly_fields

    def response_add(self, request, obj, post_url_continue=None):
        """Show the signing secret once, in this response, never in a message (messages may be
        stored in the session) and never again (as the agent keys' page does)."""
        context = {**self.admin_site.each_context(request), "title": "Webhook created", "opts": self.opts,
                   "webhook": obj, "secret": getattr(obj, "minted_secret", "")}
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, "admin/board/webhook/webhook_created.html", context)
        add_never_cache_headers(response)
        return response

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
        if not change:
            return  # an add: subscriptions.create_webhook wrote it, as the form's last step
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
