"""End to end, through the REAL server (manage.py serve): agent PROCESSES using the Python client race for
1,000 tasks; a killed agent's task comes back through the real reaper process and is finished by
another agent, while the dead agent's late complete is refused; the example worker runs.

The agents run as `python -S` (no site-packages): the client needs nothing but the standard
library. Every wait on another process polls a real condition up to a deadline.
"""
import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.db.models import Count
from django.utils import timezone

from board import agent_keys
from board.engine import selectors
from board.models import Task, TaskEvent
from taskflow_client import Client, LeaseLost
from tests.live_server import (  # noqa: F401
    ROOT,
    LineReader,
    board_server,
    manage,
    stop_process,
    wait_until,
)
from tests.support import sqlite_db_mark

pytestmark = sqlite_db_mark()

AGENTS = 8
TASKS = 1000

# An agent process: only the client, on a bare interpreter. argv: root url key name mode [queue]
#   race:   print "ready", wait for "go" on stdin, then hold tasks until none is ready; print a
#           JSON summary of the task ids it completed.
#   doomed: hold one task with a 2 s lease, print its id and token, then block until killed.
AGENT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from taskflow_client import Client

url, key, name, mode = sys.argv[2:6]
client = Client(url, key, timeout=60)
if mode == "race":
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    done = []
    while True:
        with client.hold(ttl_seconds=30) as job:
            if job is None:
                break
            job.result = {"agent": name, "double": 2 * job.payload["n"]}
            done.append(job.task_id)
    print(json.dumps({"agent": name, "completed": done}), flush=True)
elif mode == "doomed":
    with client.hold(ttl_seconds=2, queue=sys.argv[6]) as job:
        print(json.dumps({"task": job.task_id, "token": job.lease.token, "fence": job.fence}), flush=True)
        sys.stdin.read()  # works "forever": the test kills this process with SIGKILL
"""


def agent(server, name, mode, *extra):
    _, key = agent_keys.create_key(name)
    process = subprocess.Popen(
        [sys.executable, "-S", "-c", AGENT, str(ROOT), server.url, key, name, mode, *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
    )
    return process, LineReader(process.stdout), key


def verb_counts(verbs):
    rows = (TaskEvent.objects.filter(verb__in=verbs).values("task_id", "verb").annotate(n=Count("id")))
    counts = {}
    for row in rows:
        counts.setdefault(row["task_id"], {})[row["verb"]] = row["n"]
    return counts


def test_eight_agent_processes_complete_a_thousand_tasks_exactly_once(board_server):
    started = time.monotonic()
    _, creator_key = agent_keys.create_key("creator")
    creator = Client(board_server.url, creator_key, timeout=60)
    created = creator.create([{"id": f"job-{i:04d}", "title": f"job {i}", "payload": {"n": i}}
                              for i in range(TASKS)])
    assert len(created) == TASKS and {t["stage"] for t in created} == {"QUEUED"}

    agents = [agent(board_server, f"agent-{i}", "race") for i in range(AGENTS)]
    try:
        for _, lines, _ in agents:  # every interpreter is up and waiting...
            assert lines.next(timeout=60) == "ready"
        race_started = time.monotonic()
        for process, _, _ in agents:  # ...then all start together
            process.stdin.write("go\n")
            process.stdin.flush()
        summaries = [json.loads(lines.next(timeout=300) or "null") for _, lines, _ in agents]
        for process, _, _ in agents:
            assert process.wait(timeout=30) == 0
        race_seconds = time.monotonic() - race_started
    finally:
        for process, _, _ in agents:
            stop_process(process)

    # What the agents say: every task once, no task twice, and a real race (several winners).
    completed = [task_id for summary in summaries for task_id in summary["completed"]]
    assert len(completed) == TASKS, f"{len(completed)} completions reported for {TASKS} tasks"
    assert set(completed) == {f"job-{i:04d}" for i in range(TASKS)}
    per_agent = {s["agent"]: len(s["completed"]) for s in summaries}
    assert sum(1 for n in per_agent.values() if n) >= 2, per_agent

    # What the database says.
    counts = verb_counts(["claim", "complete"])
    assert len(counts) == TASKS
    bad = {task_id: c for task_id, c in counts.items() if c != {"claim": 1, "complete": 1}}
    assert not bad, f"tasks not claimed and completed exactly once: {dict(list(bad.items())[:5])}"
    assert Counter(Task.objects.values_list("stage", flat=True)) == {"COMPLETED": TASKS}
    claimers = dict(TaskEvent.objects.filter(verb="claim").values_list("task_id", "actor"))
    for summary in summaries:
        for task_id in summary["completed"]:
            assert claimers[task_id] == summary["agent"]
    for task in Task.objects.all():
        assert task.result == {"agent": claimers[task.pk], "double": 2 * task.payload["n"]}
    assert selectors.problems() == []
    assert creator.check() == []
    print(f"\n{TASKS} tasks, {AGENTS} agent processes over HTTP: race {race_seconds:.1f} s "
          f"({2 * TASKS / race_seconds:.0f} claim+complete requests/s), per agent {per_agent}, "
          f"test {time.monotonic() - started:.1f} s")


def test_a_killed_agents_task_is_reclaimed_by_the_reaper_and_finished_by_another(board_server):
    reaper = manage(board_server.database_url, board_server.secret_key, "reap", "--loop", "--interval", "0.2",
                    stdout=subprocess.PIPE, text=True)
    doomed = None
    try:
        _, op_key = agent_keys.create_key("creator")
        Client(board_server.url, op_key).create({"id": "victim", "title": "its agent dies", "queue": "fragile",
                                                 "payload": {"n": 50}})
        doomed, lines, doomed_key = agent(board_server, "doomed", "doomed", "fragile")
        held = json.loads(lines.next(timeout=60))
        assert (held["task"], held["fence"]) == ("victim", 1)
        # Alive and renewing (ttl 2 s, a renewal every ~0.7 s) ...
        wait_until(lambda: TaskEvent.objects.filter(task_id="victim", verb="renew").exists(), 10,
                   "the doomed agent's heartbeat renewed its lease")
        # ... until it is killed without a chance to clean up.
        doomed.send_signal(signal.SIGKILL)
        assert doomed.wait(timeout=10) == -signal.SIGKILL

        expires = Task.objects.get(pk="victim").lease_expires_at
        budget = (expires - timezone.now()).total_seconds() + 5  # docs/running.md's promise: TTL + 5 s
        wait_until(lambda: Task.objects.get(pk="victim").stage == "QUEUED", budget,
                   "the reaper returned the dead agent's task")
        reclaim = TaskEvent.objects.get(task_id="victim", verb="reclaim")
        assert reclaim.actor == "system:reaper" and reclaim.at >= expires
        assert reclaim.detail["previous_owner"] == "doomed"

        rescuer, rescuer_lines, _ = agent(board_server, "rescuer", "race")
        assert rescuer_lines.next(timeout=60) == "ready"
        rescuer.stdin.write("go\n")
        rescuer.stdin.flush()
        assert json.loads(rescuer_lines.next(timeout=60)) == {"agent": "rescuer", "completed": ["victim"]}
        assert rescuer.wait(timeout=30) == 0

        victim = Task.objects.get(pk="victim")
        assert (victim.stage, victim.fence, victim.result) == ("COMPLETED", 2, {"agent": "rescuer", "double": 100})
        history = list(TaskEvent.objects.filter(task_id="victim").order_by("id").values_list("verb", "actor"))
        assert history[:2] == [("create", "creator"), ("claim", "doomed")]
        assert history[-3:] == [("reclaim", "system:reaper"), ("claim", "rescuer"), ("complete", "rescuer")]
        assert {verb for verb, _ in history[2:-3]} == {"renew"}

        # The dead agent's token, written out before it died, no longer counts.
        late = Client(board_server.url, doomed_key)
        with pytest.raises(LeaseLost) as refused:
            late.complete("victim", held["token"], {"agent": "doomed", "late": True})
        assert refused.value.task["stage"] == "COMPLETED"
        with pytest.raises(LeaseLost):
            late.renew("victim", held["token"], 30)
        assert Task.objects.get(pk="victim").result == {"agent": "rescuer", "double": 100}
        assert selectors.problems() == []
    finally:
        if doomed is not None:
            stop_process(doomed)
        stop_process(reaper)
    assert "reclaimed victim -> QUEUED" in reaper.stdout.read()


def test_the_example_worker_completes_the_tasks_of_its_queue_only(board_server):
    _, key = agent_keys.create_key("example-worker")
    client = Client(board_server.url, key)
    client.create([{"id": f"ex-{i}", "title": f"example {i}", "queue": "examples", "payload": {"n": i}}
                   for i in range(5)])
    # Another worker's task, ready first (higher priority), with a payload this one cannot handle.
    client.create({"id": "not-mine", "title": "someone else's", "priority": 10, "payload": {"url": "x"}})
    done = subprocess.run(
        [sys.executable, "-S", "examples/worker.py"], check=False, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TASKFLOW_URL": board_server.url,
             "TASKFLOW_KEY": key},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "worker: 5 task(s) completed"
    for i in range(5):
        task = client.get(f"ex-{i}")
        assert (task["stage"], task["result"]) == ("COMPLETED", {"double": 2 * i})
        assert [(e["verb"], e["actor"]) for e in client.events(f"ex-{i}")][1:] == [
            ("claim", "example-worker"), ("complete", "example-worker")]
    other = client.get("not-mine")
    assert (other["stage"], other["attempts"], other["owner"]) == ("QUEUED", 0, "")
    assert [e["verb"] for e in client.events("not-mine")] == ["create"]
    assert client.check() == []
