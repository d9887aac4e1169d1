"""The client's round trips (issue 34) against the REAL server (manage.py serve) on the test database:
hold() completes and claims the next task in one request, the batch calls (claim_batch,
complete_batch, hold_batch, work), the examples as the docs run them, and the CLI's --next.

Requests are counted on the wire: the client talks to the server through a proxy that forwards
every request whole and records its path (tests/test_client.py's ReplyDropper, dropping none).
"""
import json
import os
import subprocess
import sys
import threading
from collections import Counter

import pytest

from board import agent_keys
from board.engine import transitions
from board.models import Task, TaskEvent
from taskflow_client import Client, JobBatch, LeaseLost, Outcome
from tests.live_server import ROOT, board_server  # noqa: F401  (fixture)
from tests.support import sqlite_db_mark
from tests.test_client import ReplyDropper

pytestmark = sqlite_db_mark()


@pytest.fixture
def key(board_server):
    return agent_keys.create_key("alice")[1]


@pytest.fixture
def proxy(board_server):
    """Every request of a client of `proxy.url` reaches the server; `proxy.forwarded` lists their paths."""
    with ReplyDropper(board_server.port, (), drop=0) as counting:
        yield counting


def verbs(task_id):
    return list(TaskEvent.objects.filter(task_id=task_id).order_by("id").values_list("verb", flat=True))


def stages(queue):
    return dict(Task.objects.filter(queue=queue).values_list("id", "stage"))


def make(client, queue, count, prefix="t"):
    """`count` tasks of `queue`, created in an order the claims follow (priority falls)."""
    client.create([{"id": f"{prefix}{n:02d}", "title": f"task {n}", "queue": queue, "payload": {"n": n},
                    "priority": count - n} for n in range(count)])
    return [f"{prefix}{n:02d}" for n in range(count)]


# ---------------------------------------------------------------------------------------------
# hold(): one round trip per task


def test_the_hold_loop_makes_one_request_per_task(key, proxy):
    board_server_url = proxy.url
    with Client(board_server_url, key, timeout=10) as setup:
        ids = make(setup, "loop", 20)
    proxy.forwarded.clear()
    done = []
    with Client(board_server_url, key, timeout=10) as client:
        while True:
            with client.hold(ttl_seconds=30, queue="loop", wait_seconds=0.2) as job:
                if job is None:
                    break
                job.result = {"double": 2 * job.payload["n"]}
                done.append(job.task_id)
    # One claim to start, one complete per task (each claiming the next), one claim that found
    # the queue empty (the last complete's next was null).
    assert proxy.forwarded == (["/api/claim"] + [f"/api/tasks/{task_id}/complete" for task_id in ids]
                               + ["/api/claim"])
    assert done == ids
    assert set(stages("loop").values()) == {"COMPLETED"}
    for n, task_id in enumerate(ids):
        assert verbs(task_id) == ["create", "claim", "complete"]
        assert Task.objects.get(pk=task_id).result == {"double": 2 * n}


def test_threads_sharing_a_client_each_keep_their_own_next_lease(key, proxy):
    """8 threads run the hold() loop on ONE client, released together: every task is completed
    once, each thread claimed twice (its first task, and the empty queue at the end), and every
    other task came with a complete."""
    client = Client(proxy.url, key, timeout=30)
    ids = make(client, "shared", 240, prefix="s")
    proxy.forwarded.clear()
    start = threading.Barrier(8)
    done: list[list[str]] = [[] for _ in range(8)]
    failures = []

    def worker(mine):
        try:
            start.wait(timeout=30)
            while True:
                with client.hold(ttl_seconds=60, queue="shared") as job:
                    if job is None:
                        break
                    job.result = {"by": threading.get_ident()}
                    mine.append(job.task_id)
        except Exception as exc:  # reported below: a thread's failure fails the test
            failures.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(mine,)) for mine in done]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == [] and not any(thread.is_alive() for thread in threads)
    assert sorted(task_id for mine in done for task_id in mine) == sorted(ids)  # each task once
    sent = Counter("complete" if path.endswith("/complete") else path for path in proxy.forwarded)
    assert sent == {"/api/claim": 16, "complete": 240}
    assert set(stages("shared").values()) == {"COMPLETED"}
    claims = Counter(TaskEvent.objects.filter(task_id__in=ids, verb="claim").values_list("task_id", flat=True))
    assert set(claims.values()) == {1}


def test_a_kept_lease_is_released_by_close_and_by_a_hold_of_another_queue(key, proxy):
    with Client(proxy.url, key, timeout=10) as setup:
        make(setup, "kept", 3, prefix="k")
        setup.create({"id": "other", "title": "another queue's", "queue": "elsewhere"})
    client = Client(proxy.url, key, timeout=10)
    with client.hold(ttl_seconds=30, queue="kept") as job:
        job.result = {"first": True}
    # The complete claimed k01 for the next hold(): RUNNING, by nobody's block yet.
    assert stages("kept") == {"k00": "COMPLETED", "k01": "RUNNING", "k02": "QUEUED"}
    with client.hold(ttl_seconds=30, queue="elsewhere") as job:  # another queue: k01 goes back first
        assert job.task_id == "other"
        assert stages("kept")["k01"] == "QUEUED"
    with client.hold(ttl_seconds=30, queue="kept") as job:
        assert job.task_id == "k01"
    assert stages("kept") == {"k00": "COMPLETED", "k01": "COMPLETED", "k02": "RUNNING"}
    client.close()  # the loop stopped with work left: the kept lease goes back
    assert stages("kept")["k02"] == "QUEUED"
    assert verbs("k02") == ["create", "claim", "release"]
    task = Task.objects.get(pk="k02")
    assert (task.attempts, task.owner) == (0, "")
    assert client.release_next() is False  # nothing kept now


def test_a_kept_lease_older_than_a_third_of_its_ttl_is_renewed_before_the_next_block(key, proxy):
    with Client(proxy.url, key, timeout=10) as setup:
        make(setup, "aged", 2, prefix="a")
    with Client(proxy.url, key, timeout=10) as client:
        with client.hold(ttl_seconds=30, queue="aged") as job:
            pass
        # The worker did something else for 11 s: age the kept lease by its receipt time (the
        # client's own clock; the server's lease is as the claim made it).
        (lease, queue, received), = client._next_leases.values()
        client._next_leases[next(iter(client._next_leases))] = (lease, queue, received - 11)
        proxy.forwarded.clear()
        with client.hold(ttl_seconds=30, queue="aged") as job:
            assert job.task_id == "a01" and job.fence == 1
        assert proxy.forwarded[:2] == ["/api/tasks/a01/renew", "/api/tasks/a01/complete"]
    assert verbs("a01") == ["create", "claim", "renew", "complete"]


def test_complete_fail_and_release_and_claim(key, board_server):
    with Client(board_server.url, key, timeout=10) as client:
        make(client, "verbs", 4, prefix="v")
        first = client.claim_next(30, queue="verbs")
        done, second = client.complete_and_claim(first.task_id, first.token, {"ok": 1}, ttl_seconds=30, queue="verbs")
        assert (done["id"], done["stage"], done["result"]) == ("v00", "COMPLETED", {"ok": 1})
        assert "next" not in done and (second.task_id, second.fence, second.ttl_seconds) == ("v01", 1, 30)
        failed, third = client.fail_and_claim(second.task_id, second.token, "no luck", retryable=False,
                                              ttl_seconds=30, queue="verbs")
        assert (failed["id"], failed["stage"], third.task_id) == ("v01", "FAILED", "v02")
        released, fourth = client.release_and_claim(third.task_id, third.token, ttl_seconds=30, queue="verbs")
        # v02 went back to the queue, first in the claim order: the claim that follows takes it again.
        assert released["id"] == "v02" and fourth.task_id == "v02" and fourth.fence == 2
        done, none = fourth.complete_and_claim({"ok": 2}, queue="nothing-here")
        assert done["stage"] == "COMPLETED" and none is None
        with pytest.raises(LeaseLost):  # a refused complete claims nothing
            client.complete_and_claim("v00", first.token, {}, ttl_seconds=30, queue="verbs")
    assert stages("verbs") == {"v00": "COMPLETED", "v01": "FAILED", "v02": "COMPLETED", "v03": "QUEUED"}


# ---------------------------------------------------------------------------------------------
# Batches


def test_claim_batch_and_complete_batch_with_one_lost_lease(key, proxy):
    client = Client(proxy.url, key, timeout=10)
    ids = make(client, "batch", 15, prefix="b")
    proxy.forwarded.clear()
    leases = client.claim_batch(10, ttl_seconds=30, queue="batch")
    assert [lease.task_id for lease in leases] == ids[:10]  # in the claim order
    assert len({lease.token for lease in leases}) == 10 and {lease.fence for lease in leases} == {1}
    transitions.force_release("b03", actor="operator", reason="test")  # one lease is lost meanwhile
    outcomes = client.complete_batch([(lease, {"n": n}) for n, lease in enumerate(leases)])
    assert proxy.forwarded == ["/api/claim", "/api/complete"]
    assert all(isinstance(o, Outcome) for o in outcomes) and [o.task_id for o in outcomes] == ids[:10]
    assert [o.ok for o in outcomes] == [n != 3 for n in range(10)]
    assert isinstance(outcomes[3].error, LeaseLost) and outcomes[3].task is None
    assert outcomes[0].task["stage"] == "COMPLETED" and outcomes[0].task["result"] == {"n": 0}
    assert outcomes[0].error is None
    state = stages("batch")
    assert [state[i] for i in ids] == ["COMPLETED"] * 3 + ["QUEUED"] + ["COMPLETED"] * 6 + ["QUEUED"] * 5
    # The rest: 6 tasks, asked for 10; the (task_id, token, result) form.
    rest = client.claim_batch(10, ttl_seconds=30, queue="batch")
    assert sorted(lease.task_id for lease in rest) == sorted(["b03", *ids[10:]])
    assert all(o.ok for o in client.complete_batch([(lease.task_id, lease.token, None, {"input_tokens": 7})
                                                    for lease in rest]))
    assert all(client.usage(lease.task_id)["total"]["input_tokens"] == 7 for lease in rest)
    assert client.claim_batch(10, ttl_seconds=30, queue="batch") == []  # no work: 204
    with pytest.raises(ValueError):
        client.claim_batch(101, ttl_seconds=30)
    client.close()


def test_hold_batch_fails_the_job_that_raised_and_completes_the_rest_in_one_request(key, proxy):
    client = Client(proxy.url, key, timeout=10)
    ids = make(client, "held", 5, prefix="h")
    proxy.forwarded.clear()

    def handler(job):
        if job.payload["n"] == 2:
            raise ValueError("two is broken")
        return {"double": 2 * job.payload["n"]}

    with client.hold_batch(10, ttl_seconds=30, queue="held") as batch:
        assert isinstance(batch, JobBatch) and [job.task_id for job in batch] == ids
        batch.run(handler)
    assert [job.outcome for job in batch] == ["completed", "completed", "failed", "completed", "completed"]
    # One batch claim, the failure (alone, at once), one batch complete for the four others.
    assert proxy.forwarded == ["/api/claim", "/api/tasks/h02/fail", "/api/complete"]
    broken = client.get("h02")
    assert (broken["stage"], broken["attempts"]) == ("QUEUED", 1)
    assert broken["error"].startswith("ValueError: two is broken") and "in handler" in broken["error"]
    assert [Task.objects.get(pk=i).result for i in ("h00", "h01", "h03", "h04")] == [
        {"double": 0}, {"double": 2}, {"double": 6}, {"double": 8}]
    with client.hold_batch(10, ttl_seconds=30, queue="nothing-here") as empty:
        assert empty == []
    client.close()


def test_hold_batch_releases_on_keyboard_interrupt_and_keeps_what_was_finished(key, board_server):
    client = Client(board_server.url, key, timeout=10)
    make(client, "stop", 3, prefix="s")
    with pytest.raises(KeyboardInterrupt):
        with client.hold_batch(3, ttl_seconds=30, queue="stop") as batch:
            batch[0].complete({"early": True})
            raise KeyboardInterrupt
    assert [job.outcome for job in batch] == ["completed", "released", "released"]
    assert stages("stop") == {"s00": "COMPLETED", "s01": "QUEUED", "s02": "QUEUED"}
    assert Task.objects.get(pk="s01").attempts == 0
    client.close()


def test_work_loops_over_batches_until_the_queue_is_empty(key, proxy):
    client = Client(proxy.url, key, timeout=10)
    make(client, "work", 25, prefix="w")
    proxy.forwarded.clear()
    counts = client.work(lambda job: {"n": job.payload["n"]}, max_tasks=10, ttl_seconds=30, queue="work",
                         wait_seconds=0.2)
    assert counts == {"completed": 25}
    # 10 + 10 + 5, then a claim that finds nothing: two requests per batch, and one.
    assert proxy.forwarded == ["/api/claim", "/api/complete"] * 3 + ["/api/claim"]
    assert set(stages("work").values()) == {"COMPLETED"}
    client.close()


# ---------------------------------------------------------------------------------------------
# The examples as the docs run them, and the CLI


def run_example(script, url, key):
    env = {**os.environ, "TASKFLOW_URL": url, "TASKFLOW_KEY": key, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script, requests", [
    # one claim, one complete per task (claiming the next), the claim that waits 3 s for nothing
    ("examples/worker.py", ["/api/claim"] + ["complete"] * 12 + ["/api/claim"]),
    # batches of 10 and 2, each claimed and completed in one request; then the idle claim
    ("examples/fast_worker.py", ["/api/claim", "/api/complete"] * 2 + ["/api/claim"]),
])
def test_the_examples_run_as_documented(key, proxy, script, requests):
    with Client(proxy.url, key, timeout=10) as setup:
        ids = make(setup, "examples", 12, prefix="e")
    proxy.forwarded.clear()
    done = run_example(script, proxy.url, key)
    assert done.returncode == 0, done.stderr
    assert "12 task(s) completed" in done.stdout, done.stdout
    assert ["complete" if p.endswith("/complete") and p != "/api/complete" else p for p in proxy.forwarded] == requests
    assert [Task.objects.get(pk=i).result for i in ids] == [{"double": 2 * n} for n in range(12)]


def test_cli_complete_with_next(key, board_server):
    env = {**os.environ, "TASKFLOW_URL": board_server.url, "TASKFLOW_KEY": key, "PYTHONPATH": str(ROOT)}

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "taskflow_client", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    with Client(board_server.url, key, timeout=10) as client:
        make(client, "cli", 2, prefix="c")
    held = cli("claim", "--queue", "cli")
    answer = cli("complete", held["task"]["id"], held["lease"]["token"], '{"a": 1}', "--next", "--queue", "cli",
                 "--ttl", "30")
    assert (answer["id"], answer["stage"], answer["next"]["task"]["id"]) == ("c00", "COMPLETED", "c01")
    held = answer["next"]
    answer = cli("complete", held["task"]["id"], held["lease"]["token"], "--next", "--queue", "cli")
    assert (answer["id"], answer["stage"], answer["next"]) == ("c01", "COMPLETED", None)
    assert stages("cli") == {"c00": "COMPLETED", "c01": "COMPLETED"}


def test_a_complete_whose_answer_was_lost_gets_its_next_lease_back(key, board_server):
    """The first complete (with next) of the loop takes effect, its answer is lost: the client
    sends it again (LeaseLost naming its own completion: completed), and the next hold() claims
    with the lost claim's request id, so it gets the lease that claim made instead of a second one."""
    with Client(board_server.url, key, timeout=10) as setup:
        make(setup, "cut", 2, prefix="c")
    with ReplyDropper(board_server.port, ("/complete",), drop=1) as dropping:
        with Client(dropping.url, key, timeout=10) as client:
            jobs = []
            while True:
                with client.hold(ttl_seconds=30, queue="cut") as job:
                    if job is None:
                        break
                    jobs.append(job)
        assert dropping.dropped == ["/api/tasks/c00/complete"]
        assert dropping.forwarded == ["/api/claim", "/api/tasks/c00/complete", "/api/claim",
                                      "/api/tasks/c01/complete", "/api/claim"]
    assert [job.outcome for job in jobs] == ["completed", "completed"]
    assert verbs("c00") == ["create", "claim", "complete"]
    assert verbs("c01") == ["create", "claim", "complete"]  # claimed once: the claim made with c00's complete
    assert jobs[1].fence == 1 and set(stages("cut").values()) == {"COMPLETED"}


def test_the_interpreter_exit_releases_a_kept_lease(key, board_server):
    """A program that stops after one task with work left (no close): at its exit the lease its
    complete claimed for the next hold() goes back to the queue, without an attempt counted."""
    with Client(board_server.url, key, timeout=10) as setup:
        make(setup, "exit", 2, prefix="x")
    program = ("import os\nfrom taskflow_client import Client\n"
               "client = Client(os.environ['TASKFLOW_URL'], os.environ['TASKFLOW_KEY'])\n"
               "with client.hold(ttl_seconds=60, queue='exit') as job:\n    job.result = {'one': 1}\n"
               "print(job.outcome)\n")
    env = {**os.environ, "TASKFLOW_URL": board_server.url, "TASKFLOW_KEY": key, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "completed\n", done.stdout + done.stderr
    assert stages("exit") == {"x00": "COMPLETED", "x01": "QUEUED"}
    assert verbs("x01") == ["create", "claim", "release"] and Task.objects.get(pk="x01").attempts == 0


def test_the_client_tells_a_board_that_does_not_know_a_field(key, board_server):
    """How the client notices a board older than `next` / `max_tasks` (it then finishes alone and
    claims one task at a time): the board's own 422 for a body field it does not know."""
    from taskflow_client import ValidationFailed
    from taskflow_client.client import _refuses_field

    with Client(board_server.url, key, timeout=10) as client:
        with pytest.raises(ValidationFailed) as refused:
            client.request("POST", "/claim", {"ttl_seconds": 30, "next_year": True})
        assert _refuses_field(refused.value, "next_year")
        assert not _refuses_field(refused.value, "next")
        with pytest.raises(ValidationFailed) as refused:  # a bad value of a known field is not that
            client.request("POST", "/claim", {"ttl_seconds": 30, "max_tasks": 101})
        assert not _refuses_field(refused.value, "max_tasks")
        # On this board both are known: nothing falls back.
        client.create({"id": "f1", "title": "f1"})
        assert [lease.task_id for lease in client.claim_batch(5, ttl_seconds=30)] == ["f1"]
        assert not client._batches_refused and not client._next_refused


def test_threads_sharing_a_client_run_batches_each_task_once(key, proxy):
    """8 threads run work() on ONE client, released together: every task completed exactly once,
    each batch claim that got work followed by one batch complete, and one empty claim per thread."""
    client = Client(proxy.url, key, timeout=30)
    ids = make(client, "batches", 240, prefix="b")
    proxy.forwarded.clear()
    start = threading.Barrier(8)
    counts, failures = [], []
    seen: list[str] = []
    lock = threading.Lock()

    def handler(job):
        with lock:
            seen.append(job.task_id)
        return {"n": job.payload["n"]}

    def worker():
        try:
            start.wait(timeout=30)
            counts.append(client.work(handler, max_tasks=10, ttl_seconds=60, queue="batches", wait_seconds=0))
        except Exception as exc:  # reported below
            failures.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == [] and not any(thread.is_alive() for thread in threads)
    assert sorted(seen) == sorted(ids) and sum(c.get("completed", 0) for c in counts) == 240
    assert all(set(c) <= {"completed"} for c in counts)
    sent = Counter(proxy.forwarded)
    assert set(sent) == {"/api/claim", "/api/complete"} and sent["/api/claim"] == sent["/api/complete"] + 8
    assert 24 <= sent["/api/complete"] < 240
    assert set(stages("batches").values()) == {"COMPLETED"}
    claims = Counter(TaskEvent.objects.filter(task_id__in=ids, verb="claim").values_list("task_id", flat=True))
    assert len(claims) == 240 and set(claims.values()) == {1}
