"""Webhook alerts (tests/test_webhooks.py) on MongoDB, through django-mongodb-backend: the
durable outbox's collect (numbered delivery ids from the store's counter, the webhook's version
swap in a transaction), a delivery retried until a real local receiver comes back, check()
problems announced once, and racing collectors making each delivery once."""
from datetime import timedelta

import pytest

from board.engine import clock, transitions
from board.engine.limits import WEBHOOK_BACKOFF_BASE_SECONDS
from board.engine.transitions import TaskSpec
from board.models import Webhook, WebhookDelivery
from board.webhooks import outbox, sending
from tests.support import expire_lease, race
from tests.test_webhooks import deliveries, fail_task, loopback_allowed, receivers, subscribe  # noqa: F401

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def test_a_failure_is_delivered_after_the_receiver_comes_back(receivers, loopback_allowed):
    receiver = receivers(fail_first=1)
    subscribe(receiver)
    fail_task("t1")
    fail_task("retried", retryable=True)  # attempts left: no alert
    now = clock.now()
    assert [(s.state, s.status) for s in sending.deliver(now=now)] == [("pending", 500)]
    later = now + timedelta(seconds=WEBHOOK_BACKOFF_BASE_SECONDS)
    assert [(s.state, s.status) for s in sending.send_due(now=later)] == [("delivered", 200)]
    [row] = deliveries()
    assert (row.state, row.attempts, row.body["task"]["id"]) == ("delivered", 2, "t1")
    assert {r.headers["X-TaskFlow-Delivery"] for r in receiver.requests} == {str(row.id)}
    assert receiver.bad_signatures == 0
    assert outbox.collect().deliveries == 0


def test_a_check_problem_is_announced_once(receivers, loopback_allowed):
    subscribe(receivers(), events=["check.problem"])
    transitions.create(TaskSpec(id="t1", title="held"), actor="test")
    transitions.claim("t1", "worker-1", 60)
    expire_lease("t1")
    outbox.collect()
    outbox.collect()
    assert [d.body["problem"]["code"] for d in deliveries()] == ["lease_expired"]


def test_racing_collectors_make_each_delivery_once(receivers, loopback_allowed):
    subscribe(receivers())
    for i in range(3):
        fail_task(f"t{i}")
    results = race([outbox.collect for _ in range(3)])
    assert all(isinstance(r, outbox.Collected) for r in results), results
    outbox.collect()  # whatever a lost race left
    assert sorted(d.body["task"]["id"] for d in WebhookDelivery.objects.all()) == ["t0", "t1", "t2"]
    assert Webhook.objects.get().version >= 1
