"""The delivering pass: send each due delivery, sign it, and keep what happened.

A delivery is taken for an attempt by a compare-and-swap on its `attempts` (the attempt count
rises and `next_attempt_at` moves to the retry time BEFORE anything is sent): two reapers never
send the same attempt, and a reaper that dies while sending leaves the delivery due again at
that retry time. The receiver's 2xx marks it delivered; anything else (another status, a
timeout, a refused connection, an address the SSRF rule refuses, a redirect) is a failed attempt,
retried after WEBHOOK_BACKOFF_BASE_SECONDS * 2**(n-1), capped at WEBHOOK_BACKOFF_MAX_SECONDS, until
WEBHOOK_MAX_ATTEMPTS attempts: then it is given up (`failed`) and stays in the log.

Each request: `POST` of the JSON body (or `{"text": ...}` for a Slack-format webhook) with
`X-TaskFlow-Signature: sha256=<hex HMAC-SHA256 of the body with the webhook's secret>`,
`X-TaskFlow-Event` (the event's name) and `X-TaskFlow-Delivery` (the delivery's id, the same on
every retry: the receiver's deduplication key). docs/webhooks.md has the verification recipe."""
from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from board.engine import clock
from board.engine.limits import (
    WEBHOOK_BACKOFF_BASE_SECONDS,
    WEBHOOK_BACKOFF_MAX_SECONDS,
    WEBHOOK_DELIVERIES_PER_PASS,
    WEBHOOK_KEEP_DAYS,
    WEBHOOK_MAX_ATTEMPTS,
    WEBHOOK_TIMEOUT_SECONDS,
)
from board.engine.stores import store
from board.models import Webhook, WebhookDelivery
from board.webhooks import events, ssrf

log = logging.getLogger("board.webhooks")

USER_AGENT = "TaskFlow-Webhooks/1"


@dataclass(frozen=True)
class Sent:
    delivery: int
    attempt: int
    state: str  # delivered, pending (will retry) or failed (gave up)
    status: int | None
    error: str


def backoff(attempt: int) -> timedelta:
    """The wait after failed attempt `attempt` (1, 2, ...)."""
    return timedelta(seconds=min(WEBHOOK_BACKOFF_BASE_SECONDS * 2 ** (attempt - 1), WEBHOOK_BACKOFF_MAX_SECONDS))


def sign(secret: str, body: bytes) -> str:
    """The X-TaskFlow-Signature value of `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def encoded(webhook: Webhook, body: dict) -> bytes:
    """The bytes sent (and signed) for `body` in the webhook's format."""
    payload = {"text": events.slack_text(body)} if webhook.format == "slack" else body
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str).encode()


def send_due(*, now: datetime | None = None, limit: int = WEBHOOK_DELIVERIES_PER_PASS,
             using: str = "default") -> list[Sent]:
    """Send the deliveries due at `now` (the store's clock unless given), oldest due first, and
    delete the finished ones older than WEBHOOK_KEEP_DAYS. Returns what each attempt did."""
    now = now or clock.now(using)
    due = list(WebhookDelivery.objects.using(using)
               .filter(state=WebhookDelivery.PENDING, next_attempt_at__lte=now)
               .order_by("next_attempt_at", "id")[:limit])
    # An inactive webhook's deliveries wait (sent once it is active again).
    hooks = Webhook.objects.using(using).filter(active=True).in_bulk({d.webhook_id for d in due})
    sent = [s for d in due if d.webhook_id in hooks and (s := send_one(d, hooks[d.webhook_id], now, using)) is not None]
    old = (WebhookDelivery.objects.using(using).filter(
        state__in=[WebhookDelivery.DELIVERED, WebhookDelivery.FAILED], created_at__lt=now - timedelta(days=WEBHOOK_KEEP_DAYS)))
    if old.exists():
        with store(using).write_transaction():
            old.delete()
    return sent


def send_one(delivery: WebhookDelivery, webhook: Webhook, now: datetime, using: str = "default") -> Sent | None:
    """One attempt of `delivery` (None: another sender took this attempt first)."""
    attempt = delivery.attempts + 1
    retry_at = now + backoff(attempt)
    # Taken before sending: a crash from here on leaves it due again at retry_at.
    with store(using).write_transaction():
        taken = WebhookDelivery.objects.using(using).filter(
            pk=delivery.pk, state=WebhookDelivery.PENDING, attempts=delivery.attempts).update(
            attempts=attempt, next_attempt_at=retry_at)
    if not taken:
        return None
    body = encoded(webhook, delivery.body)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               "X-TaskFlow-Event": delivery.event, "X-TaskFlow-Delivery": str(delivery.pk),
               "X-TaskFlow-Attempt": str(attempt), "X-TaskFlow-Signature": sign(webhook.secret, body)}
    status, error = None, ""
    try:
        status, text = ssrf.post(webhook.url, body, headers, WEBHOOK_TIMEOUT_SECONDS)
        if not 200 <= status < 300:
            error = f"HTTP {status}" + (f": {text}" if text else "")
    except ssrf.Refused as exc:
        error = f"refused: {exc}"
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    mine = WebhookDelivery.objects.using(using).filter(pk=delivery.pk, attempts=attempt)  # still this attempt's
    if not error:
        with store(using).write_transaction():
            mine.update(state=WebhookDelivery.DELIVERED, delivered_at=now, last_status=status, last_error="",
                        next_attempt_at=None)
        return Sent(delivery.pk, attempt, WebhookDelivery.DELIVERED, status, "")
    gave_up = attempt >= WEBHOOK_MAX_ATTEMPTS
    state = WebhookDelivery.FAILED if gave_up else WebhookDelivery.PENDING
    with store(using).write_transaction():
        mine.update(state=state, last_status=status, last_error=error[:1000],
                    next_attempt_at=None if gave_up else retry_at)
    log.info("webhook %s delivery %s attempt %s failed: %s", webhook.pk, delivery.pk, attempt, error)
    return Sent(delivery.pk, attempt, state, status, error)


def deliver(*, now: datetime | None = None, problems: bool = True, using: str = "default") -> list[Sent]:
    """One whole pass: collect (board.webhooks.outbox), then send what is due."""
    from board.webhooks import outbox

    outbox.collect(now=now, problems=problems, using=using)
    return send_due(now=now, using=using)


def send_again(delivery_id: int, *, using: str = "default") -> bool:
    """Make a pending or given-up delivery due now, with its attempts counted afresh (the admin's
    "Send again"). False for a delivered one (nothing changed)."""
    now = clock.now(using)
    with store(using).write_transaction():
        return bool(WebhookDelivery.objects.using(using).filter(pk=delivery_id).exclude(
            state=WebhookDelivery.DELIVERED).update(state=WebhookDelivery.PENDING, attempts=0, next_attempt_at=now))
