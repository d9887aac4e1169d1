"""The Python client's flow control (issue 29) against the REAL server (manage.py serve) on the
test database: `client.queues()`, `client.queue(name)` and its `get`/`pause`/`resume`/
`set_concurrency`/`history`, and `create(..., concurrency_key=, concurrency_limit=)`. Refusals
raise their error class and leave the database as it was."""
import time

import pytest

from board.models import ConcurrencyKey, FairnessKey, FairnessKeyChange, Queue, QueueChange, RateKey, Task
from taskflow_client import Blocked, BudgetExhausted, Forbidden, NotFound, ValidationFailed
from taskflow_client import FairnessKey as FairnessKeyHandle
from taskflow_client import Queue as QueueHandle
from taskflow_client import RateKey as RateKeyHandle
from tests.live_server import board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark
from tests.test_client import alice, bob, keys, op  # noqa: F401  (fixtures)

pytestmark = sqlite_db_mark()


def everything() -> tuple:
    return (db_state(), list(Queue.objects.order_by("name").values()), list(QueueChange.objects.values()),
            list(ConcurrencyKey.objects.values()))


def test_queues_are_listed_paused_resumed_and_limited_with_their_history(alice, op):
    alice.create([{"id": f"ci-{n}", "title": "build", "queue": "ci"} for n in range(3)]
                 + [{"id": "doc", "title": "docs", "queue": "docs"}])
    ci = op.queue("ci")
    assert isinstance(ci, QueueHandle) and ci.name == "ci" and repr(ci) == "<Queue 'ci'>"

    listed = {item["name"]: item for item in alice.queues()}
    assert sorted(listed) == ["ci", "docs"]
    assert (listed["ci"]["concurrency"], listed["ci"]["paused"], listed["ci"]["depth"]["QUEUED"]) == (None, False, 3)

    paused = ci.pause(reason="provider outage")
    assert (paused["paused"], paused["paused_by"], paused["paused_reason"]) == (True, "op", "provider outage")
    assert alice.claim_next(30, queue="ci") is None  # claim-next passes over a paused queue
    with pytest.raises(Blocked) as refused:
        alice.claim("ci-0", 30)
    assert refused.value.details["waiting"] == "queue ci is paused"
    assert alice.claim_next(30).task_id == "doc"  # another queue's task is still taken

    limited = ci.set_concurrency(1, reason="one runner")
    assert (limited["concurrency"], limited["paused"]) == (1, True)
    assert ci.resume()["paused"] is False
    first = alice.claim_next(30, queue="ci")
    assert first.task_id == "ci-0"
    assert alice.claim_next(30, queue="ci") is None  # at its limit 1/1
    with pytest.raises(Blocked) as full:
        alice.claim("ci-1", 30)
    assert full.value.details["waiting"] == "queue ci is at its limit 1/1"
    assert alice.queue("ci").get()["running"] == 1  # any key reads a queue

    first.complete({"ok": True})  # the slot comes back
    assert alice.claim_next(30, queue="ci").task_id == "ci-1"
    assert ci.set_concurrency(None)["concurrency"] is None
    assert alice.claim_next(30, queue="ci").task_id == "ci-2"
    assert alice.queue("ci").get()["running"] == 2  # read from its tasks: a queue without a limit is not counted

    history = ci.history()
    assert history == op.queue_history("ci")
    assert [(h["actor"], h["reason"], h["changes"]) for h in history] == [
        ("op", "", {"concurrency": [1, None]}),
        ("op", "", {"paused": [True, False]}),
        ("op", "one runner", {"concurrency": [None, 1]}),
        ("op", "provider outage", {"paused": [False, True]}),
    ]
    assert ci.pause() and ci.pause(reason="again")["paused"] is True
    assert len(ci.history()) == 5  # pausing a paused queue changes nothing and is not recorded


def test_create_takes_a_concurrency_key_and_limit_for_every_task_of_the_call(alice):
    made = alice.create([{"id": "w1", "title": "deploy"}, {"id": "w2", "title": "deploy"}],
                        concurrency_key="repo:acme/web", concurrency_limit=1)
    assert [t["concurrency_key"] for t in made] == ["repo:acme/web", "repo:acme/web"]
    single = alice.create({"id": "w3", "title": "deploy", "concurrency_key": "repo:acme/web"})
    assert single["concurrency_key"] == "repo:acme/web"
    again = {"id": "w4", "title": "deploy"}
    alice.create(again, concurrency_key="repo:acme/web")
    assert again == {"id": "w4", "title": "deploy"}  # the caller's dict is left as it was

    lease = alice.claim_next(30)
    assert lease.task_id == "w1"
    assert alice.claim_next(30) is None  # the key is at its limit 1
    with pytest.raises(Blocked) as refused:
        alice.claim("w2", 30)
    assert refused.value.details["waiting"] == "repo:acme/web is at its limit 1/1"
    lease.release()
    assert alice.claim_next(30).task_id == "w1"
    assert ConcurrencyKey.objects.get(name="repo:acme/web").running == 1


def test_refusals_raise_their_class_and_change_nothing(alice, op):
    alice.create({"id": "kept", "title": "kept", "queue": "kept"})
    op.queue("kept").set_concurrency(4, reason="start")
    before = everything()

    with pytest.raises(Forbidden):
        alice.queue("kept").pause(reason="not mine")  # an agent key without operator rights
    with pytest.raises(Forbidden):
        alice.queue("kept").set_concurrency(1)
    for bad in (0, -1, 10_001):
        with pytest.raises(ValidationFailed):
            op.queue("kept").set_concurrency(bad)
    with pytest.raises(ValidationFailed):
        op.queue("kept").pause(reason="x" * 501)
    with pytest.raises(NotFound):
        op.queue("no spaces allowed").get()
    with pytest.raises(ValidationFailed):
        alice.create({"title": "limit without a key"}, concurrency_limit=2)
    for key in ("", "k" * 201, "a\nb"):
        with pytest.raises(ValidationFailed):
            alice.create({"title": "bad key"}, concurrency_key=key)
    with pytest.raises(ValidationFailed):
        alice.create({"title": "t"}, concurrency_key="k", concurrency_limit=0)
    with pytest.raises(ValueError, match="names concurrency_key"):  # refused before anything is sent
        alice.create({"title": "t", "concurrency_key": "a"}, concurrency_key="b")
    assert everything() == before
    assert Task.objects.count() == 1


def test_a_held_job_snoozes_its_task_back_to_the_queue(alice):
    """`job.snooze(seconds)`: back to QUEUED, not claimable until then, the attempt not counted."""
    alice.create({"id": "later", "title": "upstream not ready"})
    with alice.hold(30) as job:
        task = job.snooze(90)
    assert (job.outcome, task["stage"], task["attempts"], task["not_before"] is not None) == (
        "released", "QUEUED", 0, True)
    assert alice.claim_next(30) is None
    before = everything()
    with pytest.raises(Blocked) as refused:
        alice.claim("later", 30)
    waiting = refused.value.details["waiting"]  # the stored time, to the microsecond; the API's, to the ms
    assert waiting.startswith(f"not before {task['not_before'].replace('Z', '')}"), waiting
    assert everything() == before


def test_a_rate_set_by_an_operator_paces_claims_and_a_waiting_claim_sleeps_until_it_opens(alice, op):
    alice.create([{"id": f"call-{n}", "title": "call the model", "queue": "llm"} for n in range(2)])
    shown = op.queue("llm").set_rate(1, per_seconds=2, reason="provider limit")
    assert shown["rate"] == {"count": 1, "per_seconds": 2}
    first = alice.claim_next(30)
    assert first.task_id == "call-0"
    assert alice.claim_next(30) is None  # no wait: the rate holds call-1 back
    started = time.monotonic()
    second = alice.claim_next(30, wait_seconds=10)  # the server says when (Retry-After); it comes back then
    assert second is not None and second.task_id == "call-1"
    assert time.monotonic() - started < 8
    claims = [e for e in alice.events("call-1") if e["verb"] == "claim"]
    assert len(claims) == 1
    with pytest.raises(ValidationFailed):
        op.queue("llm").set_rate(0, per_seconds=60)
    assert op.queue("llm").set_rate(None)["rate"] is None


def test_a_rate_key_shared_by_two_queues_paces_their_claims_and_a_waiting_claim_sleeps_until_it_opens(alice, op):
    alice.create([{"id": "chat-0", "title": "chat", "queue": "chat"},
                  {"id": "embed-0", "title": "embed", "queue": "embed"}], rate_key="provider:llm")
    handle = op.rate_key("provider:llm")
    assert isinstance(handle, RateKeyHandle) and repr(handle) == "<RateKey 'provider:llm'>"
    assert alice.rate_keys() == [{"name": "provider:llm", "rate": None, "next_claim_at": None}]
    shown = handle.set_rate(1, per_seconds=2, reason="provider RPM")
    assert shown["rate"] == {"count": 1, "per_seconds": 2}
    first = alice.claim_next(30)
    assert first.task_id == "chat-0" and first.task["rate_key"] == "provider:llm"
    assert alice.claim_next(30) is None  # embed-0, of another queue, waits for the key
    started = time.monotonic()
    second = alice.claim_next(30, wait_seconds=10)  # Retry-After: it sleeps and comes back then
    assert second is not None and second.task_id == "embed-0"
    assert time.monotonic() - started < 8
    before = everything(), list(RateKey.objects.values())
    with pytest.raises(ValidationFailed):
        handle.set_rate(0, per_seconds=60)
    with pytest.raises(Forbidden):
        alice.rate_key("provider:llm").set_rate(None)
    assert (everything(), list(RateKey.objects.values())) == before
    assert handle.set_rate(None)["rate"] is None


def test_a_budget_set_by_an_operator_refuses_claims_once_reports_spend_it(alice, op):
    alice.create([{"id": f"b{n}", "title": "ask the model", "queue": "llm", "priority": -n} for n in range(3)])
    budget = op.queue("llm").set_budget(tokens=100, per="total", reason="trial")
    assert (budget["budget"], budget["budget_exhausted"]) == ({"tokens": 100, "cost_usd": None, "per": "total"}, False)
    lease = alice.claim_next(30, queue="llm")
    lease.complete({"ok": True}, usage={"model": "m", "input_tokens": 70, "output_tokens": 40})
    assert alice.get_queue("llm")["spent"] == {"tokens": 110, "cost_usd": 0.0}
    with pytest.raises(BudgetExhausted):
        alice.claim_next(30, queue="llm")
    with pytest.raises(BudgetExhausted):
        alice.claim("b1", 30)
    assert op.queue("llm").set_budget(per=None)["budget"] is None  # removed: claims start again
    assert alice.claim_next(30, queue="llm").task_id == "b1"


def test_a_fairness_key_s_budget_holds_its_tasks_back_in_every_queue_once_reports_spend_it(alice, op):
    alice.create([{"id": "f0", "title": "plan step", "queue": "chat", "priority": 3},
                  {"id": "f1", "title": "plan step", "queue": "embed", "priority": 2},
                  {"id": "f2", "title": "plan step", "queue": "chat", "priority": 1}], fairness_key="plan:7")
    alice.create({"id": "other", "title": "someone else's", "queue": "chat", "priority": -5})
    plan = op.fairness_key("plan:7")
    assert isinstance(plan, FairnessKeyHandle) and repr(plan) == "<FairnessKey 'plan:7'>"
    with pytest.raises(NotFound):
        plan.get()  # no create gave it a weight and no budget is set yet: no row
    budget = plan.set_budget(tokens=100, per="total", reason="the plan's allowance")
    assert (budget["name"], budget["weight"], budget["budget"], budget["budget_exhausted"]) == (
        "plan:7", 1, {"tokens": 100, "cost_usd": None, "per": "total"}, False)
    alice.claim_next(30).complete({"ok": True}, usage={"model": "m", "input_tokens": 70, "output_tokens": 0})
    lease = alice.claim_next(30, queue="embed")
    assert lease.task_id == "f1"
    lease.complete({"ok": True}, usage={"model": "m", "input_tokens": 30, "output_tokens": 10})
    spent = alice.get_fairness_key("plan:7")
    assert (spent["spent"], spent["budget_exhausted"]) == ({"tokens": 110, "cost_usd": 0.0}, True)
    assert alice.fairness_keys() == [spent]
    assert alice.claim_next(30, queue="chat").task_id == "other"  # f2 is passed by
    assert alice.claim_next(30) is None
    before = everything(), list(FairnessKey.objects.values()), list(FairnessKeyChange.objects.values())
    with pytest.raises(BudgetExhausted) as refused:
        alice.claim("f2", 30)
    assert refused.value.message.startswith("fairness key plan:7 has spent its budget (100 tokens in total)")
    with pytest.raises(Forbidden):
        alice.fairness_key("plan:7").set_budget(tokens=1000, per="total")
    with pytest.raises(ValidationFailed):
        plan.set_budget(tokens=0, per="total")
    with pytest.raises(ValidationFailed):
        op.change_fairness_key("plan:7", budget={"tokens": 10, "per": "week"})
    assert (everything(), list(FairnessKey.objects.values()), list(FairnessKeyChange.objects.values())) == before
    assert plan.set_budget(tokens=1000, per="total")["budget_exhausted"] is False  # raised: claims start again
    assert alice.claim_next(30).task_id == "f2"
    assert op.change_fairness_key("plan:7", budget=None, reason="done")["budget"] is None
    assert list(FairnessKeyChange.objects.order_by("pk").values_list("actor", "reason")) == [
        ("op", "the plan's allowance"), ("op", ""), ("op", "done")]
