"""The Python client's approval gates (issue 32, item 2) against the real server: `job.ask`
gives the lease up, waits for a person's answer without holding the task, claims it back and
holds it again; a rejection comes back to the worker; a question closed without an answer ends
the job as lost; an operator key answers, and a second answer is AlreadyAnswered."""
from __future__ import annotations

import threading

import pytest

from board import agent_keys
from board.models import Task, TaskEvent
from taskflow_client import AlreadyAnswered, ApprovalClosed, Client, Forbidden
from tests.live_server import board_server, wait_until  # noqa: F401  (fixture)
from tests.support import sqlite_db_mark

pytestmark = [*sqlite_db_mark(), pytest.mark.server]

FORM = {"type": "object", "properties": {"env": {"type": "string", "enum": ["staging", "prod"]}}, "required": ["env"]}


@pytest.fixture
def clients(board_server):
    keys = {name: agent_keys.create_key(name, is_operator=name == "op")[1] for name in ("alice", "bob", "op")}
    made = {name: Client(board_server.url, key, timeout=10) for name, key in keys.items()}
    yield made
    for client in made.values():
        client.close()


def in_thread(work) -> tuple[threading.Thread, dict]:
    got: dict = {}

    def run():
        try:
            got["value"] = work()
        except BaseException as exc:  # judged by the test
            got["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def test_job_ask_waits_without_the_lease_and_holds_the_task_again(clients):
    alice, bob, op = clients["alice"], clients["bob"], clients["op"]
    alice.create({"id": "deploy", "title": "deploy"})
    seen = {}

    def work():
        with alice.hold(30) as job:
            seen["fence_before"] = job.fence
            answer = job.ask("deploy to which env?", form=FORM, checkpoint={"built": True}, poll_seconds=0.05)
            seen["fence_after"], seen["inputs"] = job.fence, job.lease.approval
            job.result = {"deployed_to": answer["values"]["env"]}
        return job.outcome

    thread, got = in_thread(work)
    wait_until(lambda: op.approvals(), 15, "the question to wait for an answer")
    waiting = op.approvals()
    assert [(a["task"], a["question"], a["asked_by"]) for a in waiting] == [("deploy", "deploy to which env?", "alice")]
    task = op.get("deploy")
    assert (task["stage"], task["awaiting_approval"], task["owner"], task["checkpoint"]) == (
        "PAUSED", True, "", {"built": True})
    with pytest.raises(Forbidden):  # an agent's own key does not answer
        bob.answer("deploy", True, values={"env": "prod"})
    answered = op.answer("deploy", True, values={"env": "prod"}, comment="go", approval_id=waiting[0]["id"])
    assert answered["approval"]["answered_by"] == "op"
    with pytest.raises(AlreadyAnswered):
        op.answer("deploy", False)
    thread.join(20)
    assert got == {"value": "completed"}, got
    assert (seen["fence_before"], seen["fence_after"]) == (1, 2)
    assert seen["inputs"]["values"] == {"env": "prod"} and seen["inputs"]["comment"] == "go"
    assert Task.objects.get(pk="deploy").result == {"deployed_to": "prod"}
    verbs = list(TaskEvent.objects.filter(task_id="deploy").order_by("id").values_list("verb", flat=True))
    assert verbs == ["create", "claim", "ask", "answer", "claim", "complete"]


def test_a_rejection_comes_back_and_a_closed_question_ends_the_job(clients):
    alice, op = clients["alice"], clients["op"]
    alice.create([{"id": "r", "title": "rejected"}, {"id": "c", "title": "cancelled"}])

    def rejected():
        with alice.hold_task("r", 30) as job:
            answer = job.ask("drop the table?", poll_seconds=0.05)
            if not answer["approved"]:
                job.fail(f"not approved: {answer['comment']}", retryable=False)
        return job.outcome

    thread, got = in_thread(rejected)
    wait_until(lambda: op.approvals(), 15, "the question to wait for an answer")
    op.answer("r", False, comment="never in prod")
    thread.join(20)
    assert got == {"value": "failed"} and op.get("r")["error"] == "not approved: never in prod"

    def closed():
        with alice.hold_task("c", 30) as job:
            job.ask("still needed?", poll_seconds=0.05)
            job.result = {"ran": True}  # never reached: the ask ends the block
        return job.outcome

    thread, got = in_thread(closed)
    wait_until(lambda: op.approvals(), 15, "the question to wait for an answer")
    op.cancel("c", reason="not needed")
    thread.join(20)
    assert got == {"value": "lost"}, got
    assert op.get("c")["stage"] == "CANCELLED"
    assert [a["state"] for a in op.task_approvals("c")] == ["cancelled"]


def test_lease_ask_raises_approval_closed_for_a_timeout_that_fails(clients):
    alice = clients["alice"]
    alice.create({"id": "t", "title": "t"})
    lease = alice.claim("t", 30)
    approval = lease.request_approval("ok?", timeout_seconds=1, on_timeout="fail")
    from board.engine import transitions
    from board.models import Approval
    transitions.time_out_approvals(now=Approval.objects.get(pk=approval["id"]).due_at)
    with pytest.raises(ApprovalClosed) as closed:
        alice.claim_answered("t", approval["id"], 30, poll_seconds=0.05)
    assert closed.value.approval["state"] == "timed_out"
