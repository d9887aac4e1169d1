"""Webhook alerts (issue 33, item 6; board/webhooks/, docs/webhooks.md) against real databases
(SQLite and PostgreSQL) and a real local HTTP receiver (tests/webhook_receiver.py) that fails its
first N deliveries: the durable outbox (events derived from the history in the transaction that
moves each webhook's cursor), the signed deliveries retried with backoff until the receiver is
back, a delivery made by a fresh process (a restart), check() problems announced once, the SSRF
rule, and the API (who may, the answers, bad input refused with nothing written).

Time is a parameter: the passes are called with `now`, never slept for."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections

from board.engine import clock, flow, transitions, usage
from board.engine.limits import WEBHOOK_BACKOFF_BASE_SECONDS, WEBHOOK_MAX_ATTEMPTS
from board.engine.stores import store
from board.engine.transitions import TaskSpec
from board.models import Queue, Task, TaskEvent, Webhook, WebhookDelivery
from board.webhooks import outbox, sending, subscriptions
from harness.board_server import server_env, stop_process, wait_until
from tests.support import database_url, expire_lease, race, sql_stores, sqlite_db_mark
from tests.webhook_receiver import Receiver, verify

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def receivers():
    made = []

    def make(**kwargs) -> Receiver:
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


@pytest.fixture
def loopback_allowed(settings):
    settings.TASKFLOW_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    return settings


def subscribe(receiver: Receiver, events=("task.failed",), using: str = "default", **kwargs) -> Webhook:
    webhook, secret = subscriptions.create_webhook(receiver.url(), list(events), actor="test", using=using, **kwargs)
    receiver.secret = secret
    return webhook


def fail_task(task_id: str, *, retryable: bool = False, using: str = "default", **spec) -> None:
    transitions.create(TaskSpec(id=task_id, title=f"task {task_id}", **spec), actor="test", using=using)
    token = transitions.claim(task_id, "worker-1", 60, using=using).lease.token
    transitions.fail(task_id, token, "disk full", retryable=retryable, using=using)


def deliveries(using: str = "default") -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.using(using).order_by("id"))


# ---------------------------------------------------------------------------------------------
# The outbox and the retries, on SQLite and PostgreSQL


@pytest.mark.parametrize("using", sql_stores())
def test_a_failure_is_delivered_signed_after_the_receiver_comes_back(using, receivers, loopback_allowed):
    receiver = receivers(fail_first=2)
    webhook = subscribe(receiver, using=using)
    fail_task("t1", using=using)
    now = clock.now(using)

    sent = sending.deliver(now=now, using=using)
    assert [(s.attempt, s.state, s.status) for s in sent] == [(1, "pending", 500)]
    [row] = deliveries(using)
    assert (row.event, row.state, row.attempts, row.last_status) == ("task.failed", "pending", 1, 500)
    assert row.next_attempt_at == now + timedelta(seconds=WEBHOOK_BACKOFF_BASE_SECONDS)
    assert sending.send_due(now=now + timedelta(seconds=WEBHOOK_BACKOFF_BASE_SECONDS - 1), using=using) == []
    # The board keeps working while the receiver is down.
    transitions.create(TaskSpec(id="t2", title="still works"), actor="test", using=using)

    second = now + timedelta(seconds=WEBHOOK_BACKOFF_BASE_SECONDS)
    assert [s.status for s in sending.send_due(now=second, using=using)] == [500]
    third = second + timedelta(seconds=2 * WEBHOOK_BACKOFF_BASE_SECONDS)
    assert [(s.state, s.status) for s in sending.send_due(now=third, using=using)] == [("delivered", 200)]
    assert sending.deliver(now=third + timedelta(hours=1), using=using) == []  # delivered once

    row = WebhookDelivery.objects.using(using).get()
    assert (row.state, row.attempts, row.last_status, row.delivered_at) == ("delivered", 3, 200, third)
    assert len(receiver.requests) == 3 and receiver.bad_signatures == 0
    # Every attempt is the same delivery: the same id to deduplicate on, the same signed body.
    assert {r.headers["X-TaskFlow-Delivery"] for r in receiver.requests} == {str(row.id)}
    assert {r.body for r in receiver.requests} == {receiver.requests[0].body}
    assert [r.headers["X-TaskFlow-Attempt"] for r in receiver.requests] == ["1", "2", "3"]
    request = receiver.accepted[0]
    assert request.headers["X-TaskFlow-Event"] == "task.failed" and request.path == "/hook"
    fail_event = TaskEvent.objects.using(using).get(task_id="t1", verb="fail")
    body = request.json
    assert body["id"] == f"task.failed:{fail_event.id}" and body["event"] == "task.failed"
    assert body["task"] == {"id": "t1", "title": "task t1", "queue": "default", "stage": "FAILED", "attempts": 1,
                            "max_retries": 3, "last_error": "disk full", "tags": [], "link": "/board/task/t1"}
    assert (body["change"]["verb"], body["change"]["to_stage"], body["change"]["detail"]["error"]) == (
        "fail", "FAILED", "disk full")
    assert Webhook.objects.using(using).get().cursor >= fail_event.id
    assert webhook.pk == row.webhook_id


@pytest.mark.parametrize("using", sql_stores())
def test_only_failures_that_stay_failed_and_missed_deadlines_are_events(using, receivers, loopback_allowed):
    receiver = receivers()
    subscribe(receiver, events=["task.failed", "task.deadline_missed"], using=using)
    fail_task("retried", retryable=True, using=using)  # attempts left: back to QUEUED, no alert
    fail_task("final", retryable=True, max_retries=0, using=using)  # attempts spent: stays FAILED
    transitions.create(TaskSpec(id="late", title="never started", queue_timeout_seconds=60), actor="test",
                       using=using)
    now = clock.now(using)
    transitions.enforce_deadlines(now=now + timedelta(seconds=61), using=using)
    assert Task.objects.using(using).get(pk="late").stage == "FAILED"

    outbox.collect(now=now, using=using)
    got = sorted((d.event, d.body["task"]["id"]) for d in deliveries(using))
    assert got == [("task.deadline_missed", "late"), ("task.failed", "final"), ("task.failed", "late")]
    missed = WebhookDelivery.objects.using(using).get(event="task.deadline_missed").body
    assert missed["change"]["detail"]["reason"] == "not started in time"
    assert outbox.collect(now=now, using=using).deliveries == 0  # each event once
    sending.send_due(now=now, using=using)
    assert len(receiver.accepted) == 3 and receiver.bad_signatures == 0


@pytest.mark.parametrize("using", sql_stores()[1:])
def test_a_failure_that_commits_after_a_later_one_is_still_delivered(using, receivers, loopback_allowed):
    """On PostgreSQL a history id can commit after a higher one: the webhook's cursor keeps the
    missing id as a hole and collects its event once it commits (board.live.outbox.Cursor)."""
    subscribe(receivers(), using=using)
    for task_id, queue in (("late", "qa"), ("early", "qb")):  # two queues: no shared row to wait on
        transitions.create(TaskSpec(id=task_id, title=task_id, queue=queue), actor="test", using=using)
    tokens = {t: transitions.claim(t, "worker-1", 60, using=using).lease.token for t in ("late", "early")}
    written, release = threading.Event(), threading.Event()

    def late_failure():
        try:
            with store(using).write_transaction():
                transitions.fail("late", tokens["late"], "slow disk", retryable=False, using=using)
                written.set()
                assert release.wait(30)
        finally:
            connections[using].close()

    holder = threading.Thread(target=late_failure)
    holder.start()
    try:
        assert written.wait(30)
        transitions.fail("early", tokens["early"], "fast disk", retryable=False, using=using)
        outbox.collect(using=using)
        assert [d.body["task"]["id"] for d in deliveries(using)] == ["early"]
        assert Webhook.objects.using(using).get().holes  # the late id, still expected
    finally:
        release.set()
        holder.join(30)
    outbox.collect(using=using)
    assert [d.body["task"]["id"] for d in deliveries(using)] == ["early", "late"]
    assert outbox.collect(using=using).deliveries == 0


def test_a_new_webhook_hears_only_of_what_happens_after_it_and_its_filter(receivers, loopback_allowed):
    fail_task("before")
    receiver = receivers()
    subscribe(receiver, filter={"queue": "ci-*", "tags": ["urgent", "nightly"]})
    fail_task("ci-other-tag", queue="ci-build", tags=["slow"])
    fail_task("docs-urgent", queue="docs", tags=["urgent"])
    fail_task("ci-urgent", queue="ci-build", tags=["urgent"])
    outbox.collect()
    assert [d.body["task"]["id"] for d in deliveries()] == ["ci-urgent"]


def test_a_delivery_survives_a_restart_and_a_fresh_process_delivers_it(receivers, loopback_allowed):
    """The board's process ends with the delivery pending (receiver down); another process, started
    afresh on the same database, sends it: the outbox is rows, not memory."""
    receiver = receivers(fail_first=1)
    subscribe(receiver)
    fail_task("t1")
    now = clock.now()
    sending.deliver(now=now)
    assert [(d.state, d.attempts) for d in deliveries()] == [("pending", 1)]
    # Due now (the backoff passed), as the row says; then a new process runs one pass.
    WebhookDelivery.objects.update(next_attempt_at=now - timedelta(seconds=1))
    connections["default"].close()
    env = {**os.environ, "DATABASE_URL": database_url(connections["default"].settings_dict), "DEBUG": "1",
           "TASKFLOW_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "DJANGO_SETTINGS_MODULE": "taskflow_site.settings"}
    done = subprocess.run([sys.executable, "manage.py", "deliver_webhooks"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "attempt 2: delivered (HTTP 200)" in done.stdout, done.stdout
    [row] = deliveries()
    assert (row.state, row.attempts) == ("delivered", 2)
    assert len(receiver.accepted) == 1 and receiver.bad_signatures == 0


def test_the_reapers_loop_delivers_by_itself(receivers, loopback_allowed):
    """`manage.py reap --loop` (what `manage.py serve` starts) runs the webhook passes in a thread:
    a real reaper process delivers, bounded by a deadline (polling the row, never a bare sleep)."""
    receiver = receivers()
    subscribe(receiver)
    fail_task("t1")
    connections["default"].close()
    env = server_env(database_url(connections["default"].settings_dict), "test-secret",
                     TASKFLOW_WEBHOOK_ALLOWED_HOSTS="127.0.0.1")
    reaper = subprocess.Popen([sys.executable, "manage.py", "reap", "--loop", "--interval", "0.2"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: WebhookDelivery.objects.filter(state="delivered").exists(), 30, "the reaper's delivery")
    finally:
        stop_process(reaper)
    assert len(receiver.accepted) == 1 and receiver.bad_signatures == 0


def test_after_the_last_attempt_a_delivery_is_given_up_and_can_be_sent_again(receivers, loopback_allowed):
    receiver = receivers(fail_first=WEBHOOK_MAX_ATTEMPTS)
    subscribe(receiver)
    fail_task("t1")
    now = clock.now()
    outbox.collect(now=now)
    for _ in range(WEBHOOK_MAX_ATTEMPTS):
        now += timedelta(hours=2)  # past the longest backoff (an hour)
        sending.send_due(now=now)
    [row] = deliveries()
    assert (row.state, row.attempts, row.next_attempt_at, row.last_status) == ("failed", WEBHOOK_MAX_ATTEMPTS, None, 500)
    assert sending.send_due(now=now + timedelta(hours=2)) == []
    assert sending.send_again(row.pk)
    assert [s.state for s in sending.send_due(now=clock.now() + timedelta(seconds=1))] == ["delivered"]


@pytest.mark.parametrize("using", sql_stores())
def test_two_collectors_at_once_make_each_delivery_once(using, receivers, loopback_allowed):
    receiver = receivers()
    subscribe(receiver, using=using)
    for i in range(5):
        fail_task(f"t{i}", using=using)
    results = race([lambda: outbox.collect(using=using) for _ in range(4)], alias=using)
    assert all(isinstance(r, outbox.Collected) for r in results), results
    assert sum(r.deliveries for r in results) == 5
    assert sorted(d.body["task"]["id"] for d in deliveries(using)) == [f"t{i}" for i in range(5)]


@pytest.mark.parametrize("using", sql_stores())
def test_a_question_to_a_person_is_an_approval_requested_event(using, receivers, loopback_allowed):
    json_hook, slack_hook = receivers(), receivers()
    subscribe(json_hook, events=["approval.requested"], using=using)
    subscribe(slack_hook, events=["approval.requested"], format="slack", using=using)
    transitions.create(TaskSpec(id="deploy", title="deploy web", queue="releases"), actor="test", using=using)
    held = transitions.claim("deploy", "worker-1", 60, using=using)
    transitions.request_approval("deploy", held.lease.token, "ship build 812 to prod?", using=using)
    transitions.answer("deploy", True, actor="alice", using=using)  # an answer is not a question
    sending.deliver(using=using)
    [request] = json_hook.accepted
    ask = TaskEvent.objects.using(using).get(task_id="deploy", verb="ask")
    assert request.json["id"] == f"approval.requested:{ask.id}" and request.json["event"] == "approval.requested"
    assert request.json["change"]["detail"]["question"] == "ship build 812 to prod?"
    assert request.json["task"]["id"] == "deploy"
    [line] = slack_hook.accepted
    assert line.json == {"text": ":raising_hand: TaskFlow: task `deploy` “deploy web” in queue `releases` asks: "
                                 "ship build 812 to prod?"}


@pytest.mark.parametrize("using", sql_stores())
def test_a_spent_budget_is_announced_once_per_closing(using, receivers, loopback_allowed):
    hook, other_queue, by_tag = receivers(), receivers(), receivers()
    subscribe(hook, events=["queue.budget_exhausted"], using=using)
    subscribe(other_queue, events=["queue.budget_exhausted"], filter={"queue": "docs-*"}, using=using)
    subscribe(by_tag, events=["queue.budget_exhausted"], filter={"tags": ["urgent"]}, using=using)
    flow.change_queue("llm", budget={"tokens": 100, "per": "total"}, actor="op", using=using)

    def spend(task_id: str, tokens: int) -> None:
        transitions.create(TaskSpec(id=task_id, title=task_id, queue="llm"), actor="test", using=using)
        held = transitions.claim(task_id, "worker-1", 60, using=using)
        usage.record(held.task, held.lease.fence, "worker-1", usage.checked({"input_tokens": tokens}), using=using)
        transitions.complete(task_id, held.lease.token, {}, using=using)

    spend("a", 60)
    now = clock.now(using)
    assert outbox.collect(now=now, using=using).deliveries == 0  # 60 of 100: open
    spend("b", 50)
    sending.deliver(now=clock.now(using), using=using)
    sending.deliver(now=clock.now(using), using=using)  # a later pass: the same closing, no second delivery
    [request] = hook.accepted
    closed_at = Queue.objects.using(using).get(name="llm").budget_closed_at
    assert request.json["id"] == f"queue.budget_exhausted:llm:{int(closed_at * 1000)}"
    assert request.json["queue"]["spent"] == {"tokens": 110, "cost_usd": 0.0}
    assert request.json["queue"]["budget"] == {"tokens": 100, "cost_usd": None, "per": "total"}
    assert request.json["queue"]["until"] is None  # a total budget: until an operator raises it
    assert other_queue.accepted == [] and by_tag.accepted == []
    # Raised, then spent again: a new closing, a new event.
    flow.change_queue("llm", budget={"tokens": 150, "per": "total"}, actor="op", reason="more", using=using)
    spend("c", 50)
    sending.deliver(now=clock.now(using), using=using)
    assert len(hook.accepted) == 2 and hook.accepted[1].json["id"] != request.json["id"]


def test_slack_format_sends_a_text_line(receivers, loopback_allowed):
    receiver = receivers()
    subscribe(receiver, format="slack")
    fail_task("t1")
    sending.deliver()
    [request] = receiver.accepted
    assert request.json == {"text": ":x: TaskFlow: task `t1` “task t1” in queue `default` failed: disk full"}
    assert verify(receiver.secret, request.body, request.headers["X-TaskFlow-Signature"])


# ---------------------------------------------------------------------------------------------
# check.problem: once per (code, task) appearance


def test_a_check_problem_is_announced_once_while_it_lasts_and_again_when_it_returns(receivers, loopback_allowed):
    receiver = receivers()
    subscribe(receiver, events=["check.problem"])
    transitions.create(TaskSpec(id="t1", title="held"), actor="test")
    transitions.claim("t1", "worker-1", 60)
    expire_lease("t1")
    outbox.collect()
    outbox.collect()
    [row] = deliveries()
    assert (row.body["problem"]["code"], row.body["problem"]["task"], row.body["task"]["id"]) == (
        "lease_expired", "t1", "t1")
    assert outbox.collect(problems=False).deliveries == 0
    transitions.reclaim_expired()  # the problem is gone...
    outbox.collect()
    transitions.claim("t1", "worker-2", 60)
    expire_lease("t1")  # ...and back
    outbox.collect()
    assert [d.body["problem"]["code"] for d in deliveries()] == ["lease_expired", "lease_expired"]
    sending.send_due(now=clock.now())
    assert len(receiver.accepted) == 2
    assert len({r.json["id"] for r in receiver.accepted}) == 2


# ---------------------------------------------------------------------------------------------
# SSRF


def test_loopback_is_refused_at_delivery_unless_the_allow_list_names_it(receivers, settings):
    receiver = receivers()
    settings.TASKFLOW_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    subscribe(receiver)
    settings.TASKFLOW_WEBHOOK_ALLOWED_HOSTS = []
    fail_task("t1")
    [sent] = sending.deliver()
    assert sent.state == "pending" and sent.status is None
    assert sent.error.startswith("refused: 127.0.0.1 resolves to 127.0.0.1, a loopback address")
    assert receiver.requests == []  # nothing was sent
    settings.TASKFLOW_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    assert [s.state for s in sending.send_due(now=clock.now() + timedelta(hours=1))] == ["delivered"]
    assert len(receiver.accepted) == 1


def test_a_name_that_resolves_to_loopback_is_refused_although_its_address_is_allowed(receivers, loopback_allowed):
    receiver = receivers()
    webhook = subscribe(receiver)
    Webhook.objects.filter(pk=webhook.pk).update(url=receiver.url(host="localhost"))  # judged at delivery
    fail_task("t1")
    [sent] = sending.deliver()
    assert "localhost resolves to" in sent.error and "loopback" in sent.error
    assert receiver.requests == []


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/",
                                 "http://10.1.2.3:8080/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/"])
def test_metadata_and_private_addresses_are_refused_at_delivery(url, loopback_allowed, receivers):
    webhook = subscribe(receivers())
    Webhook.objects.filter(pk=webhook.pk).update(url=url)  # as if written before a rule, or by hand
    fail_task("t1")
    [sent] = sending.deliver()
    assert sent.error.startswith("refused: ") and sent.status is None, sent.error


def test_a_redirect_is_not_followed(receivers, loopback_allowed):
    inside = receivers()
    receiver = receivers(redirect_to=inside.url(path="/internal"))
    subscribe(receiver)
    fail_task("t1")
    [sent] = sending.deliver()
    assert sent.status == 302 and sent.state == "pending"
    assert f"redirect to {inside.url(path='/internal')} not followed" in sent.error
    assert len(receiver.requests) == 1 and inside.requests == []


pytestmark = sqlite_db_mark()


def test_a_cursor_set_back_collects_nothing_twice_and_moves_on(receivers, loopback_allowed):
    webhook = subscribe(receivers())
    fail_task("t1")
    outbox.collect()
    Webhook.objects.filter(pk=webhook.pk).update(cursor=0, holes={})  # as a restored backup would
    fail_task("t2")
    outbox.collect()
    assert [d.body["task"]["id"] for d in deliveries()] == ["t1", "t2"]
    assert Webhook.objects.get().cursor == TaskEvent.objects.order_by("-id").first().id


def test_finished_deliveries_are_deleted_after_a_week_and_pending_ones_kept(receivers, loopback_allowed):
    receiver = receivers(fail_first=1)
    subscribe(receiver)
    fail_task("t1")
    fail_task("t2")
    now = clock.now()
    assert [s.state for s in sending.deliver(now=now)] == ["pending", "delivered"]
    WebhookDelivery.objects.update(next_attempt_at=now + timedelta(days=30))  # t1 keeps failing meanwhile
    sending.send_due(now=now + timedelta(days=6, hours=23))
    assert len(deliveries()) == 2
    sending.send_due(now=now + timedelta(days=7, seconds=1))
    assert [(d.body["task"]["id"], d.state) for d in deliveries()] == [("t1", "pending")]


def test_an_inactive_webhook_collects_and_sends_nothing_until_switched_on(receivers, loopback_allowed):
    receiver = receivers()
    webhook = subscribe(receiver)
    fail_task("t1")
    outbox.collect()
    assert subscriptions.set_active(webhook.pk, False)
    fail_task("t2")
    assert sending.deliver() == [] and receiver.requests == []
    assert subscriptions.set_active(webhook.pk, True)
    assert [s.state for s in sending.deliver()] == ["delivered", "delivered"]  # it catches up
    assert sorted(r.json["task"]["id"] for r in receiver.accepted) == ["t1", "t2"]
