"""Webhooks (issue 33, item 6; board/webhooks/, docs/webhooks.md): subscriptions to the board's
alerts, delivered signed and retried from a durable outbox.

Who may: an operator key that is not limited to some queues (a webhook hears of every queue), or
staff with `board.add_webhook` (reading: also `board.view_webhook`; deleting: also
`board.delete_webhook`). The secret is in the create's answer only."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional

from ninja import Field, Router, Schema, Status

from board import access
from board.api.errors import ERRORS
from board.api.schemas import StrictIn
from board.engine import errors
from board.engine.limits import MAX_TAGS, MAX_WEBHOOK_EVENTS, MAX_WEBHOOK_URL_CHARS
from board.models import Webhook
from board.webhooks import events, subscriptions

router = Router()

EventName = Literal["task.failed", "task.deadline_missed", "check.problem", "approval.requested",
                    "queue.budget_exhausted"]
assert set(EventName.__args__) == set(events.SUBSCRIBABLE)


class WebhookFilterIn(StrictIn):
    queue: Optional[str] = Field(None, min_length=1, max_length=2100,
                                 description="queue patterns, as a key's scope: `ci-*,docs` (`*` any run, `?` one)")
    tags: Optional[list[str]] = Field(None, max_length=MAX_TAGS, description="the task carries at least one of them")


class WebhookIn(StrictIn):
    url: str = Field(..., min_length=1, max_length=MAX_WEBHOOK_URL_CHARS,
                     description="http or https; deliveries to loopback, private, link-local and metadata addresses "
                                 "are refused unless TASKFLOW_WEBHOOK_ALLOWED_HOSTS names the host")
    events: list[EventName] = Field(..., min_length=1, max_length=MAX_WEBHOOK_EVENTS,
                                    description="what to hear of (docs/webhooks.md: when each is sent)")
    filter: Optional[WebhookFilterIn] = Field(None, description="only events of matching tasks")
    format: Literal["json", "slack"] = Field("json", description="slack: `{\"text\": ...}` for a Slack incoming webhook")


class DeliveryOut(Schema):
    id: int = Field(..., description="X-TaskFlow-Delivery: the same on every retry (deduplicate on it)")
    event: str
    event_id: str = Field(..., description="the event's id, the same for every webhook")
    state: str = Field(..., description="pending, delivered, or failed (given up)")
    attempts: int
    next_attempt_at: Optional[datetime]
    last_status: Optional[int]
    last_error: str
    delivered_at: Optional[datetime]
    created_at: datetime


class WebhookOut(Schema):
    id: int
    url: str
    events: list[str]
    filter: dict[str, Any]
    format: str
    active: bool
    created_by: str
    created_at: datetime


class WebhookCreatedOut(WebhookOut):
    secret: str = Field(..., description="signs every delivery (HMAC-SHA256 of the body); shown only here, once")


class WebhookDetailOut(WebhookOut):
    deliveries: list[DeliveryOut] = Field(..., description="the 20 most recent, newest first")


class WebhookList(Schema):
    items: list[WebhookOut]


def _principal(request, *, session_may, refusal: str):
    """Operator keys not limited to some queues, or sessions `session_may` lets in; else 403."""
    principal = request.auth
    if principal.agent:
        if principal.operator and principal.scope is None:
            return principal
        raise errors.Forbidden("webhooks need an operator key that is not limited to some queues"
                               if principal.operator else refusal)
    if session_may(request.user):
        return principal
    raise errors.Forbidden(refusal)


def require_webhook_maker(request):
    return _principal(request, session_may=access.may_add_webhooks,
                      refusal="creating a webhook needs an operator key or the board.add_webhook permission")


def require_webhook_reader(request):
    return _principal(request, session_may=access.may_view_webhooks,
                      refusal="reading webhooks needs an operator key or the board.view_webhook permission")


def require_webhook_deleter(request):
    return _principal(request, session_may=access.may_delete_webhooks,
                      refusal="deleting a webhook needs an operator key or the board.delete_webhook permission")


@router.post("/webhooks", response={201: WebhookCreatedOut, **ERRORS},
             summary="Operator: subscribe a URL to the board's alerts (the signing secret is answered once)")
def create_webhook(request, body: WebhookIn):
    """From now on, each event named in `events` (of a task matching `filter`, when given) is
    POSTed to `url`, signed: `X-TaskFlow-Signature: sha256=<hex HMAC-SHA256 of the body with
    secret>`, with `X-TaskFlow-Event` and `X-TaskFlow-Delivery` (the same on every retry). A
    receiver that is down gets it later (exponential backoff, 12 attempts over about 3.4 hours).
    An invalid URL (not http/https, over 2,000 characters, an IP literal or `localhost` the SSRF
    rule refuses) is 422 `validation_error`; nothing is written."""
    principal = require_webhook_maker(request)
    webhook, secret = subscriptions.create_webhook(
        body.url, list(body.events), filter=body.filter.model_dump(exclude_none=True) if body.filter else None,
        format=body.format, actor=principal.name)
    return Status(201, {**subscriptions.describe(webhook), "secret": secret})


@router.get("/webhooks", response={200: WebhookList, **ERRORS}, summary="Every webhook (never its secret)")
def list_webhooks(request):
    require_webhook_reader(request)
    return {"items": [subscriptions.describe(w) for w in Webhook.objects.order_by("id")]}


@router.get("/webhooks/{webhook_id}", response={200: WebhookDetailOut, **ERRORS},
            summary="One webhook and its 20 most recent deliveries")
def get_webhook(request, webhook_id: int):
    require_webhook_reader(request)
    return subscriptions.describe(subscriptions.get_webhook(webhook_id), deliveries=True)


@router.delete("/webhooks/{webhook_id}", response={204: None, **ERRORS},
               summary="Operator: delete a webhook and its delivery log")
def delete_webhook(request, webhook_id: int):
    require_webhook_deleter(request)
    subscriptions.delete_webhook(webhook_id)
    return Status(204, None)


@router.post("/webhooks/{webhook_id}/test", response={202: DeliveryOut, **ERRORS},
             summary="Operator: queue a webhook.test delivery to this webhook (sent by the next pass)")
def test_webhook(request, webhook_id: int):
    """A `webhook.test` event for this webhook only, sent, signed and retried as any delivery."""
    principal = require_webhook_maker(request)
    delivery = subscriptions.queue_test(subscriptions.get_webhook(webhook_id), actor=principal.name)
    return Status(202, subscriptions.describe_delivery(delivery))
