"""Capabilities (issue 32, item 3) through the real server (`manage.py serve`) on the real SQLite
database: keys minted with capabilities, tasks created with `requires` and `prefers`, every claim
endpoint taking only what the key (or the claim's narrower `capabilities`) can do, a waiting claim
woken by a task it can take, the Python client's and the command line's `capabilities`, and the
refusals (422 for a bad label, 403 for a claim naming a capability its key lacks), each of which
leaves the database as it was. The claim's own query is tested on every store by the contract
suite (tests/test_contract.py, "capabilities")."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import threading

import pytest
from django.core.management import CommandError, call_command

from board import agent_keys
from board.engine import selectors
from board.models import AgentKey, Task
from taskflow_client import Client, Forbidden
from tests.live_server import ROOT, api_call, board_server  # noqa: F401  (fixture)
from tests.support import db_state, sqlite_db_mark

pytestmark = sqlite_db_mark()


@pytest.fixture
def keys(board_server):  # noqa: F811
    """(server, a key holding nothing, a gpu key, a gpu+python key)."""
    _, plain = agent_keys.create_key("plain")
    _, gpu = agent_keys.create_key("gpu-box", capabilities="gpu")
    _, both = agent_keys.create_key("big-box", capabilities="python, gpu,gpu")
    return board_server, plain, gpu, both


def create(server, key, *tasks):
    status, body = api_call(server, "POST", "/api/tasks", key, list(tasks))
    assert status == 201, body
    return body["items"]


def test_tasks_say_what_they_require_and_prefer_and_bad_labels_are_422_with_nothing_written(keys):
    server, plain, _, _ = keys
    [task] = create(server, plain, {"id": "t", "title": "t", "requires": ["python", "gpu", "gpu"],
                                    "prefers": {"model:opus": 3}})
    assert (task["requires"], task["prefers"]) == (["gpu", "python"], {"model:opus": 3})
    assert api_call(server, "GET", "/api/tasks/t", plain)[1]["requires"] == ["gpu", "python"]
    [listed] = create(server, plain, {"id": "l", "title": "l", "prefers": ["repo:acme/web"]})
    assert (listed["requires"], listed["prefers"]) == (None, {"repo:acme/web": 1})
    before = db_state()
    for bad in ({"requires": ["two words"]}, {"requires": ["x" * 61]}, {"requires": [f"l{i}" for i in range(9)]},
                {"prefers": {"gpu": 0}}, {"prefers": {"gpu": 11}}, {"prefers": "gpu"}, {"requires": "gpu"}):
        status, body = api_call(server, "POST", "/api/tasks", plain, {"id": "bad", "title": "b", **bad})
        assert status == 422 and body["error"]["code"] == "validation_error", (bad, status, body)
    assert db_state() == before


def test_every_claim_takes_only_what_its_key_can_do(keys):
    server, plain, gpu, both = keys
    create(server, plain, {"id": "g", "title": "g", "requires": ["gpu"], "priority": 9},
           {"id": "gp", "title": "gp", "requires": ["gpu", "python"], "priority": 8},
           {"id": "free", "title": "free"})
    status, claimed = api_call(server, "POST", "/api/claim", plain, {"ttl_seconds": 60})
    assert (status, claimed["task"]["id"]) == (200, "free")
    assert api_call(server, "POST", "/api/claim", plain, {"ttl_seconds": 60})[0] == 204
    status, refused = api_call(server, "POST", "/api/tasks/gp/claim", gpu, {"ttl_seconds": 60})
    assert status == 403 and refused["error"]["code"] == "forbidden", refused
    assert "lacks python" in refused["error"]["message"]
    status, batch = api_call(server, "POST", "/api/claim", both, {"ttl_seconds": 60, "max_tasks": 5})
    assert (status, [lease["task"]["id"] for lease in batch["leases"]]) == (200, ["g", "gp"])
    # A finishing move's next claim: the key's capabilities again.
    create(server, plain, {"id": "g2", "title": "g2", "requires": ["gpu"]})
    token = batch["leases"][0]["lease"]["token"]
    status, done = api_call(server, "POST", "/api/tasks/g/complete", both,
                            {"token": token, "result": {}, "next": {"ttl_seconds": 60}})
    assert (status, done["next"]["task"]["id"]) == (200, "g2")


def test_a_claim_narrows_its_keys_capabilities_and_may_not_widen_them(keys):
    server, _, gpu, both = keys
    create(server, both, {"id": "g", "title": "g", "requires": ["gpu"]})
    before = db_state()
    for path, body in (("/api/claim", {"ttl_seconds": 60, "capabilities": ["python"]}),
                       ("/api/tasks/g/claim", {"ttl_seconds": 60, "capabilities": ["gpu", "python"]})):
        status, refused = api_call(server, "POST", path, gpu, body)
        assert status == 403 and "does not carry the capabilities python" in refused["error"]["message"], refused
    status, refused = api_call(server, "POST", "/api/claim", gpu, {"ttl_seconds": 60, "capabilities": ["bad label"]})
    assert status == 422, refused
    assert db_state() == before
    assert api_call(server, "POST", "/api/claim", both, {"ttl_seconds": 60, "capabilities": ["python"]})[0] == 204
    status, claimed = api_call(server, "POST", "/api/claim", both, {"ttl_seconds": 60, "capabilities": ["gpu"]})
    assert (status, claimed["task"]["id"]) == (200, "g")


def test_a_waiting_claim_is_woken_by_a_task_it_can_take_and_not_by_one_it_cannot(keys):
    server, plain, gpu, _ = keys
    answers = {}
    waiting = threading.Thread(target=lambda: answers.update(
        gpu=api_call(server, "POST", "/api/claim", gpu, {"ttl_seconds": 60, "wait_seconds": 20}, timeout=40)))
    waiting.start()
    try:
        create(server, plain, {"id": "py", "title": "py", "requires": ["python"]})
        create(server, plain, {"id": "g", "title": "g", "requires": ["gpu"]})
    finally:
        waiting.join(40)
    status, claimed = answers["gpu"]
    assert (status, claimed["task"]["id"]) == (200, "g")
    assert Task.objects.get(pk="py").stage == "QUEUED"


def test_the_python_client_and_the_command_line_narrow_their_claims(keys):
    server, _, _, both = keys
    url = f"http://127.0.0.1:{server.port}"
    with Client(url, both) as client:
        client.create([{"id": "g", "title": "g", "requires": ["gpu"]}, {"id": "p", "title": "p", "requires": ["python"]}])
    with Client(url, both, capabilities=["python"]) as narrowed:
        lease = narrowed.claim_next(60)
        assert lease.task["id"] == "p"
        assert narrowed.claim_next(60) is None
        with pytest.raises(Forbidden):
            narrowed.claim("g", 60)
        lease.complete({})
    with Client(url, both, capabilities=["cuda"]) as widening, pytest.raises(Forbidden):
        widening.claim_next(60)
    run = subprocess.run([sys.executable, "-m", "taskflow_client", "--url", url, "--key", both,
                          "--capabilities", "gpu", "claim"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["task"]["id"] == "g"


def test_create_agent_key_sets_capabilities_and_refuses_bad_labels():
    out, err = io.StringIO(), io.StringIO()
    call_command("create_agent_key", "gpu-1", "--capabilities", "python,gpu", stdout=out, stderr=err)
    assert "capabilities gpu,python" in err.getvalue()
    assert AgentKey.objects.get(name="gpu-1").capabilities == "gpu,python"
    keys_before = list(AgentKey.objects.values_list("name", flat=True))
    with pytest.raises(CommandError, match="capability 'no way'"):
        call_command("create_agent_key", "gpu-2", "--capabilities", "gpu,no way",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert list(AgentKey.objects.values_list("name", flat=True)) == keys_before


def test_a_changed_capability_reaches_the_next_claim_and_check_says_who_can_take_nothing(keys):
    server, plain, gpu, _ = keys
    create(server, plain, {"id": "cuda", "title": "cuda", "requires": ["cuda"]})
    assert [p.code for p in selectors.problems() if p.task == "cuda"] == ["unclaimable_requirements"]
    assert api_call(server, "POST", "/api/claim", gpu, {"ttl_seconds": 60})[0] == 204
    row = AgentKey.objects.get(name="gpu-box")
    agent_keys.set_capabilities(row.pk, "gpu,cuda")
    # The server's processes may trust the key they verified for up to a minute: a claim by id
    # looks the key up (not a hot verb), so it sees the new capabilities at once.
    status, claimed = api_call(server, "POST", "/api/tasks/cuda/claim", gpu, {"ttl_seconds": 60})
    assert (status, claimed["task"]["id"]) == (200, "cuda"), claimed
    assert [p for p in selectors.problems() if p.task == "cuda"] == []
