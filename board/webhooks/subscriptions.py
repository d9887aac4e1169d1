"""Webhook subscriptions: validated, created (with the secret returned once), described, deleted.
The one module that creates or deletes a board.models.Webhook. Every refusal is
errors.InvalidRequest (422) naming its field, raised before anything is written.

A filter is small on purpose: `{"queue": "ci-*,docs", "tags": ["urgent"]}`, both optional. `queue`:
queue patterns as a key's scope takes them (board.engine.scopes: `*`, `?`, comma-separated); `tags`:
the task must carry at least one of them. An event passes when its task matches every part given;
a check() problem whose task is unknown (or not a task) passes only a webhook without a filter."""
from __future__ import annotations

import secrets
from typing import Any

from board.engine import clock, errors, scopes
from board.engine.limits import MAX_TAG_CHARS, MAX_TAGS, MAX_WEBHOOK_EVENTS, MAX_WEBHOOKS
from board.engine.search import TAG_RE
from board.engine.stores import store
from board.live import outbox
from board.models import Webhook, WebhookDelivery
from board.webhooks import events, ssrf

RECENT_DELIVERIES = 20  # what GET /api/webhooks/{id} shows of the log


def url_of(url: Any) -> str:
    try:
        ssrf.check_literal(url)
    except ssrf.Refused as exc:
        message = str(exc)
        raise errors.InvalidRequest(message if message.startswith("url ") else f"url: {message}", field="url") from None
    return url


def events_of(names: Any) -> list[str]:
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise errors.InvalidRequest("events must be a non-empty list of event names", field="events")
    if len(names) > MAX_WEBHOOK_EVENTS:
        raise errors.InvalidRequest(f"events: at most {MAX_WEBHOOK_EVENTS}", field="events")
    unknown = [n for n in names if n not in events.SUBSCRIBABLE]
    if unknown:
        raise errors.InvalidRequest(f"unknown events: {', '.join(sorted(set(unknown)))[:300]} "
                                    f"(known: {', '.join(events.SUBSCRIBABLE)})", field="events")
    return list(dict.fromkeys(names))


def filter_of(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"queue", "tags"}:
        raise errors.InvalidRequest('filter is {"queue"?: "patterns", "tags"?: [...]}', field="filter")
    out: dict[str, Any] = {}
    if value.get("queue") is not None:
        if not isinstance(value["queue"], str):
            raise errors.InvalidRequest("filter.queue must be queue patterns (e.g. \"ci-*,docs\")", field="filter")
        try:
            scope = scopes.parse(value["queue"])
        except scopes.BadScope as exc:
            raise errors.InvalidRequest(f"filter.queue: {exc}", field="filter") from None
        if scope:
            out["queue"] = scopes.stored(scope)
    if value.get("tags") is not None:
        tags = value["tags"]
        if (not isinstance(tags, list) or len(tags) > MAX_TAGS
                or not all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_CHARS and TAG_RE.match(t) for t in tags)):
            raise errors.InvalidRequest(f"filter.tags: a list of at most {MAX_TAGS} tags (1-{MAX_TAG_CHARS} letters, "
                                        "digits and ._:/-)", field="filter")
        if tags:
            out["tags"] = list(dict.fromkeys(tags))
    return out


def format_of(value: Any) -> str:
    if value not in events.FORMATS:
        raise errors.InvalidRequest(f"format must be one of {', '.join(events.FORMATS)}", field="format")
    return value


def matches_queue(webhook_filter: dict, queue: str) -> bool:
    """Whether an event about a queue (no task, so no tags) passes the webhook's filter: its
    queue patterns, if any; a filter by tags lets no queue event through."""
    if not webhook_filter:
        return True
    if "tags" in webhook_filter:
        return False
    return "queue" not in webhook_filter or scopes.allows(scopes.parse(webhook_filter["queue"]), queue)


def matches(webhook_filter: dict, task: Any | None) -> bool:
    """Whether an event about `task` (None: unknown) passes the webhook's filter."""
    if not webhook_filter:
        return True
    if task is None:
        return False
    if "queue" in webhook_filter and not scopes.allows(scopes.parse(webhook_filter["queue"]), task.queue):
        return False
    if "tags" in webhook_filter and not set(webhook_filter["tags"]) & set(task.tags or []):
        return False
    return True


def create_webhook(url: Any, events_: Any, *, filter: Any = None, format: Any = "json", actor: str = "",
                   using: str = "default") -> tuple[Webhook, str]:
    """A new webhook and its secret (to be shown once). It hears of the history from now on: its
    cursor starts after the newest event committed (with the ids below that may still commit)."""
    url, names, wanted, fmt = url_of(url), events_of(events_), filter_of(filter), format_of(format)
    if Webhook.objects.using(using).count() >= MAX_WEBHOOKS:
        raise errors.InvalidRequest(f"the board has {MAX_WEBHOOKS} webhooks, as many as it may have; delete one first",
                                    field="url")
    start = outbox.starting_cursor(using)
    secret = "whsec_" + secrets.token_urlsafe(32)
    with store(using).write_transaction():
        webhook = Webhook.objects.using(using).create(
            url=url, events=names, filter=wanted, format=fmt, secret=secret, created_by=actor,
            created_at=clock.now(using), cursor=start.last_id, holes=_stored_holes(start.holes))
    return webhook, secret


def delete_webhook(webhook_id: int, *, using: str = "default") -> None:
    """Delete a webhook and its delivery log. NotFound if there is none."""
    with store(using).write_transaction():
        if not Webhook.objects.using(using).filter(pk=webhook_id).exists():
            raise errors.NotFound(f"no webhook {webhook_id}")
        WebhookDelivery.objects.using(using).filter(webhook_id=webhook_id).delete()
        Webhook.objects.using(using).filter(pk=webhook_id).delete()


def set_active(webhook_id: int, active: bool, *, using: str = "default") -> bool:
    """Switch a webhook off (it collects and sends nothing; its pending deliveries wait) or on.
    Only that column: the cursor and the problems seen belong to the collecting pass."""
    with store(using).write_transaction():
        return bool(Webhook.objects.using(using).filter(pk=webhook_id).update(active=bool(active)))


def get_webhook(webhook_id: Any, *, using: str = "default") -> Webhook:
    webhook = Webhook.objects.using(using).filter(pk=webhook_id).first() if isinstance(webhook_id, int) else None
    if webhook is None:
        raise errors.NotFound(f"no webhook {webhook_id}")
    return webhook


def queue_test(webhook: Webhook, *, actor: str, using: str = "default") -> WebhookDelivery:
    """A `webhook.test` delivery for `webhook` alone, due now (the next pass sends it)."""
    now = clock.now(using)
    body = events.test_body(secrets.token_hex(8), now, actor)
    with store(using).write_transaction():
        return WebhookDelivery.objects.using(using).create(
            webhook_id=webhook.pk, event_id=body["id"], event=events.TEST, body=body, state=WebhookDelivery.PENDING,
            next_attempt_at=now, created_at=now)


def describe(webhook: Webhook, *, deliveries: bool = False, using: str = "default") -> dict[str, Any]:
    """A webhook as the API shows it: never its secret."""
    out: dict[str, Any] = {
        "id": webhook.id, "url": webhook.url, "events": webhook.events, "filter": webhook.filter or {},
        "format": webhook.format, "active": webhook.active, "created_by": webhook.created_by,
        "created_at": webhook.created_at}
    if deliveries:
        log = WebhookDelivery.objects.using(using).filter(webhook_id=webhook.id).order_by("-id")[:RECENT_DELIVERIES]
        out["deliveries"] = [describe_delivery(d) for d in log]
    return out


def describe_delivery(delivery: WebhookDelivery) -> dict[str, Any]:
    return {"id": delivery.id, "event": delivery.event, "event_id": delivery.event_id, "state": delivery.state,
            "attempts": delivery.attempts, "next_attempt_at": delivery.next_attempt_at,
            "last_status": delivery.last_status, "last_error": delivery.last_error,
            "delivered_at": delivery.delivered_at, "created_at": delivery.created_at}


def _stored_holes(holes: dict[int, int | None]) -> dict[str, int | None]:
    return {str(i): horizon for i, horizon in holes.items()}
