"""Webhook alerts (issue 33, item 6; docs/webhooks.md): subscriptions, the durable outbox that
turns the history into deliveries, and the signed, retried, SSRF-guarded sending.

- `events.py`         the event names, how each is recognised, the payloads (JSON and Slack); pure
- `subscriptions.py`  create (the secret, once), validate, describe, delete a Webhook; filters
- `outbox.py`         the collecting pass: history and check() -> WebhookDelivery rows, with the
                      webhook's cursor, in one transaction
- `sending.py`        the delivering pass: due deliveries POSTed, signed, retried with backoff
- `ssrf.py`           which URLs and addresses a delivery may reach, and the pinned connection

Run by the reaper's loop (`manage.py reap --loop`, which `manage.py serve` starts) in a thread
of its own, and once by `manage.py deliver_webhooks`. Outside the engine: it only reads the
history and check(), as the live board does."""
