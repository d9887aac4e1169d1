"""The Python client (`taskflow_client`) against the REAL server (manage.py serve) on the test database.

Every client method, the error classes, the `hold()` context manager (complete, fail, renew in
the background, lost lease, pause/resume) and the command line. Conditions in the server are
awaited by polling with deadlines, never by sleeping a fixed time.
"""
import contextlib
import http.client
import http.server
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from datetime import datetime

import pytest
from django.utils import timezone

from board import agent_keys
from board.engine import selectors, transitions
from board.engine.limits import MAX_NOTES_PER_TASK
from board.models import Task, TaskEvent, TaskNote
from taskflow_client import (
    Blocked,
    Client,
    DuplicateId,
    Forbidden,
    InvalidTransition,
    Lease,
    LeaseLost,
    NotFound,
    NotesFull,
    Taken,
    TaskflowError,
    Terminal,
    TooLarge,
    TransportError,
    Unauthorized,
    ValidationFailed,
    VersionConflict,
)
from tests.live_server import ROOT, board_server, wait_until  # noqa: F401  (fixture)
from tests.support import end_backoff, expire_lease, sqlite_db_mark

pytestmark = sqlite_db_mark()

WAIT = 15.0  # deadline for conditions that take a heartbeat or two


@pytest.fixture
def keys(board_server):
    """Fresh agent keys (the database is emptied after each test)."""
    return {name: agent_keys.create_key(name, is_operator=name == "op")[1] for name in ("alice", "bob", "op")}


@pytest.fixture
def alice(board_server, keys):
    with Client(board_server.url, keys["alice"], timeout=10) as client:
        yield client


@pytest.fixture
def bob(board_server, keys):
    with Client(board_server.url, keys["bob"], timeout=10) as client:
        yield client


@pytest.fixture
def op(board_server, keys):
    with Client(board_server.url, keys["op"], timeout=10) as client:
        yield client


def verbs(task_id):
    return list(TaskEvent.objects.filter(task_id=task_id).order_by("id").values_list("verb", flat=True))


def heartbeat_threads():
    return [t for t in threading.enumerate() if t.name.startswith("taskflow-heartbeat-")]


# ---------------------------------------------------------------------------------------------
# The package itself


def test_the_client_runs_on_a_bare_python_without_django():
    """-S: no site-packages at all, so Django, ninja and pydantic cannot be imported."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import taskflow_client, taskflow_client.cli;"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'ninja', 'pydantic', 'board'));"
        "assert not heavy, heavy;"
        "assert taskflow_client.Client.__doc__ and taskflow_client.Job.__doc__;"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True,
                          timeout=30, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------
# Tasks: create, get, list, events


def test_create_get_list_and_events(alice):
    one = alice.create({"id": "solo", "title": "one task", "payload": {"n": 1}, "priority": 5})
    assert (one["id"], one["stage"], one["payload"], one["priority"]) == ("solo", "QUEUED", {"n": 1}, 5)
    assert alice.create({"id": "solo", "title": "one task", "payload": {"n": 1}, "priority": 5}) == one

    batch = alice.create([
        {"id": "fetch", "title": "fetch", "queue": "etl"},
        {"id": "parse", "title": "parse", "queue": "etl", "deps": ["fetch"]},
        {"id": "store", "title": "store", "queue": "etl", "deps": ["parse"]},
        {"id": "held", "title": "held", "on_hold": True},
    ])
    assert [(t["id"], t["stage"]) for t in batch] == [
        ("fetch", "QUEUED"), ("parse", "PENDING"), ("store", "PENDING"), ("held", "PENDING")]
    generated = alice.create({"title": "no id given"})
    assert generated["id"]

    assert alice.get("parse")["deps"] == ["fetch"]
    everything = alice.list(page_size=2)  # 6 tasks over 3 pages through the next cursor
    assert [t["id"] for t in everything] == [t.id for t in Task.objects.order_by("created_at", "id")]
    assert len(everything) == 6
    assert [t["id"] for t in alice.list(queue="etl", page_size=1)] == ["fetch", "parse", "store"]
    assert {t["id"] for t in alice.list(stage="PENDING")} == {"parse", "store", "held"}
    assert {t["id"] for t in alice.list(stage=["QUEUED", "PENDING"], text="s")} == {"solo", "parse", "store"}
    assert [t["id"] for t in alice.iter_tasks(text="fetch")] == ["fetch"]

    lease = alice.claim("fetch", 30)
    lease.complete({"ok": True})
    events = alice.events("fetch")
    assert [e["verb"] for e in events] == ["create", "claim", "complete"]
    assert events[1]["actor"] == "alice" and events[1]["fence"] == 1
    assert [e["verb"] for e in alice.iter_events("parse", page_size=1)] == ["create", "admit"]


def test_list_in_claim_order_with_a_limit_and_the_last_events(alice):
    alice.create([{"id": f"t{i}", "title": f"t{i}", "priority": i % 3} for i in range(7)])
    by_claim = alice.list(stage="QUEUED", order="claim")
    assert [t["id"] for t in by_claim] == ["t2", "t5", "t1", "t4", "t0", "t3", "t6"]
    assert alice.list(stage="QUEUED", order="claim", limit=3) == by_claim[:3]
    assert alice.list(stage="QUEUED", order="claim", limit=5, page_size=2) == by_claim[:5]
    assert [t["id"] for t in alice.list(limit=2)] == ["t0", "t1"]  # the default order: oldest first
    lease = alice.claim_next(30)
    assert lease.task_id == "t2"
    for i in range(3):
        lease.renew(checkpoint={"step": i})
    lease.complete({"ok": True})
    assert [e["verb"] for e in alice.events("t2", last=2)] == ["renew", "complete"]
    assert alice.events("t2", last=500) == alice.events("t2")


def test_tags_at_create_and_a_search_line(alice):
    alice.create([{"id": "a", "title": "deploy", "tags": ["urgent"], "payload": {"repo": "acme/web"}},
                  {"id": "b", "title": "deploy", "tags": ["later"]}])
    assert alice.get("a")["tags"] == ["urgent"]
    assert [t["id"] for t in alice.list(search="tag:urgent")] == ["a"]
    assert [t["id"] for t in alice.list(search="deploy payload.repo:acme/web")] == ["a"]
    assert [t["id"] for t in alice.list(search="deploy", order="newest")] == ["b", "a"]


# ---------------------------------------------------------------------------------------------
# Claiming and the holder's verbs


def test_claim_next_renew_complete(alice):
    assert alice.claim_next(10) is None  # 204: nothing ready
    alice.create([{"id": "low", "title": "low"}, {"id": "high", "title": "high", "priority": 9},
                  {"id": "other", "title": "other queue", "queue": "q2"}])

    lease = alice.claim_next(10)
    assert isinstance(lease, Lease)
    assert (lease.task_id, lease.fence, lease.task["stage"], lease.task["owner"]) == ("high", 1, "RUNNING", "alice")
    assert lease.token and lease.token not in repr(lease)
    assert lease.expires_at > timezone.now()

    first_expiry, token = lease.expires_at, lease.token
    renewed = alice.renew("high", token, 60, checkpoint={"step": 1}, progress=0.5)
    assert (renewed.token, renewed.fence) == (token, 1)
    assert renewed.expires_at > first_expiry
    assert (renewed.task["checkpoint"], renewed.task["progress"]) == ({"step": 1}, 0.5)
    lease.renew(progress=0.75)  # Lease.renew keeps its TTL and updates itself
    assert lease.task["progress"] == 0.75 and lease.ttl_seconds == 10

    done = alice.complete("high", token, {"answer": 42})
    assert (done["stage"], done["result"], done["owner"]) == ("COMPLETED", {"answer": 42}, "")

    in_q2 = alice.claim_next(10, queue="q2")
    assert in_q2.task_id == "other"
    assert in_q2.complete()["result"] == {}  # None is sent as {}
    assert alice.claim_next(10).task_id == "low"
    assert alice.claim_next(10, wait_seconds=0.3) is None  # waited, then 204


def test_claim_next_waits_for_work_created_meanwhile(alice, bob):
    found = {}
    waiter = threading.Thread(target=lambda: found.update(lease=bob.claim_next(10, wait_seconds=10)))
    waiter.start()
    wait_until(lambda: waiter.is_alive(), 5, "the waiting claim started")
    alice.create({"id": "late", "title": "arrives while bob waits"})
    waiter.join(15)
    assert not waiter.is_alive()
    assert found["lease"].task_id == "late" and found["lease"].task["owner"] == "bob"


def test_release_fail_pause_resume(alice):
    alice.create([{"id": f"t{i}", "title": f"t{i}", "max_retries": 1} for i in range(4)])

    released = alice.claim("t0", 30).release()
    assert (released["stage"], released["attempts"], released["owner"]) == ("QUEUED", 0, "")

    lease = alice.claim("t1", 30)
    retried = alice.fail("t1", lease.token, "flaky network")
    assert (retried["stage"], retried["error"], retried["attempts"]) == ("QUEUED", "flaky network", 1)
    assert retried["not_before"] is not None
    end_backoff("t1")
    lease = alice.claim("t1", 30)
    assert lease.fence == 2
    assert lease.fail("again")["stage"] == "FAILED"  # attempts spent

    permanent = alice.claim("t2", 30).fail("bad input", retryable=False)
    assert (permanent["stage"], permanent["attempts"]) == ("FAILED", 1)

    paused = alice.claim("t3", 30).pause({"page": 7})
    assert (paused["stage"], paused["checkpoint"], paused["owner"]) == ("PAUSED", {"page": 7}, "")
    resumed = alice.resume("t3", 30)
    assert (resumed.task["stage"], resumed.task["checkpoint"], resumed.fence) == ("RUNNING", {"page": 7}, 2)
    assert resumed.complete({"pages": 7})["stage"] == "COMPLETED"


def test_operator_verbs(alice, op):
    alice.create([{"id": "held", "title": "held", "on_hold": True}, {"id": "doomed", "title": "doomed"},
                  {"id": "broken", "title": "broken", "max_retries": 0}])
    admitted = op.admit("held", reason="looks fine")
    assert (admitted["stage"], admitted["on_hold"]) == ("QUEUED", False)

    alice.claim("broken", 30).fail("no")
    assert op.requeue("broken", reset_attempts=True)["stage"] == "QUEUED"

    version = alice.get("doomed")["version"]
    with pytest.raises(VersionConflict):
        op.cancel("doomed", version=version + 1)
    cancelled = op.cancel("doomed", version=version, reason="not needed")
    assert cancelled["stage"] == "CANCELLED"
    assert alice.events("doomed")[-1]["detail"] == {"reason": "not needed"}

    with pytest.raises(Forbidden) as refused:
        alice.cancel("held")
    assert refused.value.status == 403 and "operator" in refused.value.message


def test_check(alice):
    alice.create({"id": "fine", "title": "fine"})
    assert alice.check() == []
    alice.claim("fine", 30)
    expire_lease("fine")  # RUNNING past its expiry and not yet reclaimed: a problem
    assert [(p["task"], p["code"]) for p in alice.check()] == [("fine", "lease_expired")]


# ---------------------------------------------------------------------------------------------
# Errors: one class per API code, never confused with a transport error


def test_every_error_code_maps_to_its_class(board_server, alice, bob, keys):
    alice.create([{"id": "dep", "title": "dep"}, {"id": "child", "title": "child", "deps": ["dep"]},
                  {"id": "done", "title": "done"}, {"id": "paused", "title": "paused"}])
    alice.claim("done", 30).complete({})
    alice.claim("paused", 30).pause({"at": 1})
    lease = alice.claim("dep", 30)

    def refused(cls, call):
        with pytest.raises(cls) as caught:
            call()
        exc = caught.value
        assert type(exc) is cls and isinstance(exc, TaskflowError) and not isinstance(exc, TransportError)
        assert exc.code == cls.code and exc.message and str(exc).startswith(f"{cls.code}: ")
        return exc

    exc = refused(NotFound, lambda: alice.get("nope"))
    assert exc.status == 404
    exc = refused(Taken, lambda: bob.claim("dep", 30))
    assert (exc.status, exc.task["id"], exc.task["owner"]) == (409, "dep", "alice")
    assert "token" not in json.dumps(exc.task)
    exc = refused(Blocked, lambda: alice.claim("child", 30))
    assert "dep" in exc.message and exc.task["stage"] == "PENDING"
    exc = refused(Terminal, lambda: alice.claim("done", 30))
    assert exc.task["stage"] == "COMPLETED"
    exc = refused(LeaseLost, lambda: alice.renew("dep", "not-the-token", 30))
    assert exc.task["stage"] == "RUNNING"
    refused(VersionConflict, lambda: Client(board_server.url, keys["op"]).cancel("child", version=99))
    exc = refused(InvalidTransition, lambda: alice.claim("paused", 30))
    assert "resume" in exc.message
    exc = refused(DuplicateId, lambda: alice.create({"id": "dep", "title": "another title"}))
    assert exc.task["title"] == "dep"
    exc = refused(ValidationFailed, lambda: alice.claim_next(0))
    assert exc.status == 422 and exc.details and exc.details[0]["loc"] == ["ttl_seconds"]
    refused(ValidationFailed, lambda: alice.create({"title": "x", "bogus": 1}))
    exc = refused(Unauthorized, lambda: Client(board_server.url, "tfk_wrong").get("dep"))
    assert exc.status == 401
    refused(Unauthorized, lambda: Client(board_server.url, None).check())
    exc = refused(Forbidden, lambda: bob.complete("dep", lease.token, {}))  # alice's lease
    assert exc.status == 403
    exc = refused(TooLarge, lambda: alice.create({"title": "big", "payload": "x" * 300_000}))
    assert exc.status == 413
    assert lease.complete({"still": "mine"})["stage"] == "COMPLETED"  # none of that changed anything


def test_an_operator_edits_tags_and_runs_a_finished_task_again(alice, op):
    alice.create({"id": "t", "title": "t", "tags": ["a"], "max_retries": 0})
    edited = op.edit("t", version=0, tags=["urgent", "ci"], priority=2)
    assert (edited["tags"], edited["priority"], edited["version"]) == (["urgent", "ci"], 2, 1)
    with pytest.raises(VersionConflict):
        op.edit("t", version=0, title="stale")
    with pytest.raises(Forbidden):
        alice.edit("t", version=1, title="not an operator")
    with pytest.raises(InvalidTransition):  # not finished yet
        op.replay("t")
    alice.claim("t", 30).fail("boom", retryable=False)
    copy = op.replay("t", payload={"again": True}, new_id="t-2")
    assert (copy["id"], copy["replay_of"], copy["payload"], copy["tags"], copy["stage"]) == (
        "t-2", "t", {"again": True}, ["urgent", "ci"], "QUEUED")
    assert [t["id"] for t in alice.list(search="replay_of:t")] == ["t-2"]


def test_a_claim_hands_over_inputs_and_notes(alice, bob, op):
    alice.create([{"id": "fetch", "title": "fetch"}, {"id": "parse", "title": "parse", "deps": ["fetch"],
                                                       "max_retries": 2}])
    alice.claim("fetch", 30).complete({"pages": 3})
    with alice.hold(30) as job:
        assert (job.task_id, job.inputs, job.notes) == ("parse", {"fetch": {"pages": 3}}, [])
        mine = job.note("tables break the parser")
        assert (mine["author"], mine["by_holder"], mine["attempt"], mine["fence"]) == ("alice", True, 1, 1)
        job.fail("the parser crashed")
    staff = op.add_note("parse", "try the html5 parser")
    assert (staff["author"], staff["by_holder"]) == ("op", False)
    with pytest.raises(Forbidden):  # an agent without the token is not staff
        bob.add_note("parse", "hi")
    end_backoff("parse")
    lease = bob.claim_next(30)
    assert lease.task_id == "parse" and lease.inputs == {"fetch": {"pages": 3}} and lease.inputs_omitted == []
    assert [(n["text"], n["author"]) for n in lease.notes] == [
        ("tables break the parser", "alice"), ("try the html5 parser", "op")]
    lease.renew()
    assert len(lease.notes) == 2  # a renew keeps what the claim handed over
    assert bob.notes("parse") == lease.notes
    TaskNote.objects.bulk_create([TaskNote(task_id="parse", text="n", author="op", at=timezone.now())
                                  for _ in range(MAX_NOTES_PER_TASK - 2)])
    Task.objects.filter(pk="parse").update(notes_count=MAX_NOTES_PER_TASK)
    with pytest.raises(NotesFull) as full:
        lease.note("one more")
    assert (full.value.status, full.value.code) == (409, "notes_full")
    lease.complete({})


@contextlib.contextmanager
def not_the_api():
    """A local HTTP server that answers like a broken proxy: 502 HTML to POST, non-JSON 200 to GET."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, status, body):
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.answer(502, b"<html><h1>502 Bad Gateway</h1></html>")

        def do_GET(self):
            self.answer(200, b"<html>a login page</html>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_transport_errors_are_not_board_errors(board_server, keys):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(TransportError) as caught:  # nothing listens there
        Client(f"http://127.0.0.1:{port}", keys["alice"], timeout=2).claim_next(10)
    assert not isinstance(caught.value, TaskflowError) and caught.value.status is None

    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        with pytest.raises(TransportError, match="no answer within 0.5 s"):
            Client(f"http://127.0.0.1:{silent.getsockname()[1]}", keys["alice"], timeout=0.5).check()

    # Answers that are not the API's: a proxy's 502 page, a 200 that is not JSON.
    with not_the_api() as url:
        with pytest.raises(TransportError) as caught:
            Client(url, keys["alice"], timeout=5).claim_next(10)
        assert caught.value.status == 502 and "Bad Gateway" in caught.value.body
        assert not isinstance(caught.value, TaskflowError)
        with pytest.raises(TransportError) as caught:
            Client(url, keys["alice"], timeout=5).get("x")
        assert caught.value.status == 200

    with pytest.raises(ValueError):
        Client("ftp://example.com", "k")


def test_base_url_may_name_the_api_prefix_and_connections_are_reused(board_server, keys):
    client = Client(board_server.url + "/api/", keys["alice"])
    client.wait_ready(timeout=5)
    client.create({"id": "x", "title": "x"})
    conn = client._http._local.conn
    assert client.get("x")["id"] == "x" and client.check() == []
    assert client._http._local.conn is conn  # one keep-alive connection for the three requests
    conn.sock.shutdown(socket.SHUT_RDWR)  # as if the server had dropped the idle connection
    assert client.get("x")["id"] == "x"  # sent again on a fresh connection


# ---------------------------------------------------------------------------------------------
# A claim whose answer is lost after the server committed it


class ReplyDropper:
    """A proxy in front of the server. It forwards each request whole and reads the server's
    whole answer, then, for the first `drop` requests whose path ends with one of `paths`,
    closes the client's connection instead of passing the answer on: the request took effect,
    the client never learns it. Everything else it passes on unchanged."""

    def __init__(self, upstream_port: int, paths: tuple[str, ...], drop: int = 1):
        self.upstream_port = upstream_port
        self.paths = paths
        self.drop = drop
        self.dropped: list[str] = []
        self.forwarded: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while True:
                request_line = reader.readline()
                if not request_line:
                    return
                method, path, _ = request_line.decode("latin-1").split(" ", 2)
                headers = {}
                while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, value = line.decode("latin-1").split(":", 1)
                    headers[name.strip()] = value.strip()
                body = reader.read(int(headers.get("Content-Length", 0)))
                upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
                upstream.request(method, path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                upstream.close()
                with self._lock:
                    drop = len(self.dropped) < self.drop and path.endswith(self.paths)
                    (self.dropped if drop else self.forwarded).append(path)
                if drop:
                    return  # the server answered; the client gets a closed connection
                head = [f"HTTP/1.1 {answer.status} {answer.reason}"]
                head += [f"{k}: {v}" for k, v in answer.getheaders()
                         if k.lower() not in ("content-length", "transfer-encoding", "connection")]
                head += [f"Content-Length: {len(data)}", "Connection: keep-alive"]
                client.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        finally:
            reader.close()
            client.close()

    def __enter__(self) -> "ReplyDropper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        # close() alone does not wake a thread blocked in accept() on Linux (the join would
        # wait its whole timeout); shutdown() does, and accept() then raises. (Elsewhere a
        # listening socket may refuse shutdown: the join's timeout then ends the wait.)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(10)
        if exc[0] is None:
            assert not self._thread.is_alive(), "the proxy's accept loop did not end"


@pytest.mark.parametrize("how", ["claim_next", "claim"])
def test_a_claim_whose_answer_was_lost_is_sent_again_and_gets_its_lease(board_server, keys, alice, bob, how):
    alice.create({"id": "cut", "title": "cut"})
    with ReplyDropper(board_server.port, ("/api/claim", "/api/tasks/cut/claim")) as proxy:
        with Client(proxy.url, keys["alice"], timeout=10) as client:
            lease = client.claim_next(30) if how == "claim_next" else client.claim("cut", 30)
        assert len(proxy.dropped) == 1 and len(proxy.forwarded) == 1  # the first answer was lost
    assert lease is not None and lease.task_id == "cut" and lease.fence == 1
    assert verbs("cut") == ["create", "claim"]
    task = Task.objects.get(pk="cut")
    assert (task.stage, task.owner, task.fence) == ("RUNNING", "alice", 1)
    with pytest.raises(Taken):
        bob.claim("cut", 30)
    assert alice.complete("cut", lease.token, {"done": True})["stage"] == "COMPLETED"


def test_each_claim_of_the_client_is_a_new_request(alice):
    """The request id is per call, not per client: two claims are two leases."""
    alice.create([{"id": "a1", "title": "a1"}, {"id": "a2", "title": "a2"}])
    first, second = alice.claim_next(30), alice.claim_next(30)
    assert {first.task_id, second.task_id} == {"a1", "a2"} and first.token != second.token
    assert verbs("a1") == verbs("a2") == ["create", "claim"]


# ---------------------------------------------------------------------------------------------
# hold(): the lease as a with block


def test_hold_completes_with_the_result_and_gives_none_without_work(alice):
    with alice.hold(ttl_seconds=30) as job:
        assert job is None  # nothing ready
    alice.create({"id": "work", "title": "double it", "payload": {"n": 21}})
    with alice.hold(ttl_seconds=30) as job:
        assert (job.task_id, job.payload, job.fence) == ("work", {"n": 21}, 1)
        assert job.task["stage"] == "RUNNING" and not job.lost
        job.result = {"double": job.payload["n"] * 2}
    assert job.outcome == "completed"
    task = alice.get("work")
    assert (task["stage"], task["result"]) == ("COMPLETED", {"double": 42})
    assert verbs("work") == ["create", "claim", "complete"]
    assert heartbeat_threads() == []


def test_hold_renews_in_the_background_past_the_ttl(alice):
    alice.create({"id": "slow", "title": "outlives its TTL"})
    ttl = 2
    with alice.hold(ttl_seconds=ttl) as job:
        first_expiry = job.lease.expires_at
        job.checkpoint({"at": "heartbeat"}, progress=0.5, wait=False)  # goes with the next renewal

        def renewed_twice_past_first_expiry():
            renewals = [e for e in alice.events("slow") if e["verb"] == "renew"]
            return len(renewals) >= 2 and timezone.now() > first_expiry

        # The job "works" until the API shows two renewals and its first lease would have ended.
        wait_until(lambda: job.lost or renewed_twice_past_first_expiry(), WAIT,
                   "two renewals past the first expiry")
        assert not job.lost
        live = alice.get("slow")
        assert (live["checkpoint"], live["progress"]) == ({"at": "heartbeat"}, 0.5)
        assert (live["stage"], live["owner"]) == ("RUNNING", "alice")
        assert datetime.fromisoformat(live["lease_expires_at"].replace("Z", "+00:00")) > timezone.now()
        assert job.renewals >= 2 and job.interval == pytest.approx(ttl / 3)
        assert [t.name for t in heartbeat_threads()] == ["taskflow-heartbeat-slow"]
    assert job.outcome == "completed" and alice.get("slow")["stage"] == "COMPLETED"
    history = verbs("slow")
    assert history[:2] == ["create", "claim"] and history[-1] == "complete"
    assert set(history[2:-1]) == {"renew"} and len(history[2:-1]) >= 2
    assert heartbeat_threads() == []  # stopped and joined before the complete


def test_hold_fails_on_an_exception_then_fails_for_good_when_attempts_are_spent(alice):
    alice.create({"id": "bad", "title": "raises", "max_retries": 1})

    def broken(job):
        raise ValueError(f"boom on attempt {job.task['attempts']}")

    with pytest.raises(ValueError, match="boom on attempt 1"):
        with alice.hold(ttl_seconds=30) as job:
            broken(job)
    assert job.outcome == "failed"
    task = alice.get("bad")
    assert (task["stage"], task["attempts"]) == ("QUEUED", 1)  # retried after a backoff
    assert task["error"].startswith("ValueError: boom on attempt 1")
    assert "Traceback" in task["error"] and "in broken" in task["error"]

    end_backoff("bad")
    with pytest.raises(ValueError, match="boom on attempt 2"):
        with alice.hold_task("bad", ttl_seconds=30) as job:
            broken(job)
    task = alice.get("bad")
    assert (task["stage"], task["attempts"]) == ("FAILED", 2)
    assert verbs("bad") == ["create", "claim", "fail", "retry", "claim", "fail"]
    assert heartbeat_threads() == []


def test_hold_releases_on_keyboard_interrupt(alice):
    alice.create({"id": "interrupted", "title": "ctrl-c"})
    with pytest.raises(KeyboardInterrupt):
        with alice.hold(ttl_seconds=30) as job:
            raise KeyboardInterrupt
    assert job.outcome == "released"
    task = alice.get("interrupted")
    assert (task["stage"], task["attempts"]) == ("QUEUED", 0)


def test_the_readme_pattern_if_job_lost_works_as_written(alice):
    """`if job.lost:` is the obvious test; `job.lost` used to be a threading.Event, always true."""
    alice.create([{"id": "kept", "title": "works to the end"}, {"id": "gone", "title": "taken away"}])
    done = []
    with alice.hold_task("kept", ttl_seconds=30) as job:
        for step in range(3):
            if job.lost:
                break
            done.append(step)
        job.result = {"steps": done}
    assert done == [0, 1, 2] and job.outcome == "completed" and job.lost is False
    with alice.hold_task("gone", ttl_seconds=2) as job:
        transitions.force_release("gone", actor="operator", reason="test")
        assert job.lost_event.wait(WAIT), "the heartbeat did not notice the lost lease"
        if not job.lost:
            job.result = {"would": "be wrong"}
    assert job.lost is True and job.outcome == "lost"
    assert alice.get("gone")["result"] is None and "complete" not in verbs("gone")


def test_a_lost_lease_sets_lost_and_is_not_completed(alice, caplog):
    alice.create({"id": "taken-away", "title": "an operator takes it back"})
    caplog.set_level(logging.WARNING, logger="taskflow_client")
    with alice.hold(ttl_seconds=2) as job:
        transitions.force_release("taken-away", actor="operator", reason="test")
        assert job.lost_event.wait(WAIT), "the heartbeat did not notice the lost lease"
        job.result = {"would": "be wrong"}
    assert job.outcome == "lost"
    task = alice.get("taken-away")
    assert (task["stage"], task["result"]) == ("QUEUED", None)
    assert "complete" not in verbs("taken-away")
    assert any("lease lost" in r.getMessage() and "nothing was committed" in r.getMessage()
               for r in caplog.records)
    assert heartbeat_threads() == []


def test_a_lease_lost_to_the_reaper_ends_the_block_at_the_next_checkpoint(alice, bob):
    alice.create({"id": "expired", "title": "its lease runs out"})
    reached = []
    with alice.hold(ttl_seconds=2) as job:
        job.checkpoint({"step": 1})
        expire_lease("expired")
        assert [r.task_id for r in transitions.reclaim_expired()] == ["expired"]
        takeover = bob.claim("expired", 30)  # someone else works on it now
        job.checkpoint({"step": 2})  # LeaseLost: the with statement ends the block quietly
        reached.append("after the lost checkpoint")
    assert reached == [] and job.outcome == "lost" and job.lost
    with pytest.raises(LeaseLost):
        job.raise_if_lost()
    task = alice.get("expired")
    assert (task["stage"], task["owner"], task["fence"], task["checkpoint"]) == ("RUNNING", "bob", 2, {"step": 1})
    assert takeover.complete({"by": "bob"})["result"] == {"by": "bob"}


def test_pause_then_resume_with_hold_task(alice, bob):
    alice.create({"id": "long", "title": "paused half way", "payload": {"pages": 4}})
    with alice.hold(ttl_seconds=30) as job:
        job.checkpoint({"page": 1}, progress=0.25)
        assert alice.get("long")["checkpoint"] == {"page": 1}
        job.checkpoint({"page": 2}, progress=0.5, wait=False)  # saved by the next heartbeat
        job.pause({"page": 2})
    assert job.outcome == "paused"
    paused = alice.get("long")
    assert (paused["stage"], paused["checkpoint"], paused["progress"]) == ("PAUSED", {"page": 2}, 0.25)

    with pytest.raises(InvalidTransition):
        with bob.hold_task("long", ttl_seconds=30):
            pass  # a PAUSED task is resumed, not claimed
    with bob.hold_task("long", ttl_seconds=30, resume=True) as job:
        assert (job.task["checkpoint"], job.fence, job.task["owner"]) == ({"page": 2}, 2, "bob")
        job.result = {"pages": list(range(job.task["checkpoint"]["page"] + 1, 5))}
    assert alice.get("long")["result"] == {"pages": [3, 4]}
    assert verbs("long") == ["create", "claim", "renew", "pause", "resume", "complete"]


def test_hold_task_raises_the_claims_refusal_and_lease_hold_wraps_a_lease(alice, bob):
    alice.create({"id": "mine", "title": "mine"})
    lease = alice.claim("mine", 30)
    with pytest.raises(Taken):
        with bob.hold_task("mine"):
            pass
    with lease.hold() as job:
        assert job.lease is lease
        job.result = [1, 2, 3]
    assert alice.get("mine")["result"] == [1, 2, 3]


def test_explicit_fail_inside_the_block_is_final(alice):
    alice.create({"id": "hopeless", "title": "hopeless"})
    with alice.hold(ttl_seconds=30) as job:
        job.fail("cannot parse the input", retryable=False)
    assert job.outcome == "failed"
    task = alice.get("hopeless")
    assert (task["stage"], task["error"]) == ("FAILED", "cannot parse the input")


def test_a_result_the_server_refuses_fails_the_task(alice):
    alice.create({"id": "huge", "title": "too big a result", "max_retries": 0})
    with pytest.raises(TooLarge):
        with alice.hold(ttl_seconds=30) as job:
            job.result = {"blob": "x" * 300_000}
    task = alice.get("huge")
    assert task["stage"] == "FAILED" and "too_large" in task["error"]
    assert selectors.problems() == []


# ---------------------------------------------------------------------------------------------
# The command line


def cli(board_server, key, *args, stdin=None):
    env = {**os.environ, "TASKFLOW_URL": board_server.url, "TASKFLOW_KEY": key}
    return subprocess.run([sys.executable, "-m", "taskflow_client", *args], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60)


def test_cli(board_server, keys):
    key = keys["alice"]
    made = cli(board_server, key, "create", '{"id": "c1", "title": "from an argument", "payload": {"n": 3}}')
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["id"] == "c1"
    made = cli(board_server, key, "create", stdin=json.dumps([{"id": "c2", "title": "from stdin"},
                                                              {"id": "c3", "title": "too", "priority": -1}]))
    assert [json.loads(line)["id"] for line in made.stdout.splitlines()] == ["c2", "c3"]

    listed = cli(board_server, key, "list", "--stage", "QUEUED")
    assert listed.returncode == 0
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == ["c1", "c2", "c3"]

    claimed = cli(board_server, key, "claim", "--ttl", "30")
    assert claimed.returncode == 0, claimed.stderr
    claim = json.loads(claimed.stdout)
    task_id, token = claim["task"]["id"], claim["lease"]["token"]
    assert (task_id, claim["lease"]["fence"], claim["task"]["owner"]) == ("c1", 1, "alice")

    renewed = cli(board_server, key, "renew", task_id, token, "--ttl", "60", "--checkpoint", '{"at": 1}',
                  "--progress", "0.5")
    assert renewed.returncode == 0, renewed.stderr
    assert json.loads(renewed.stdout)["task"]["checkpoint"] == {"at": 1}

    done = cli(board_server, key, "complete", task_id, token, '{"n": 6}')
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == {"n": 6}
    again = cli(board_server, key, "complete", task_id, token, "{}")
    assert again.returncode == 4 and again.stdout == ""
    assert again.stderr.startswith("lease_lost: ")

    second = json.loads(cli(board_server, key, "claim", "--task", "c3").stdout)
    failed = cli(board_server, key, "fail", "c3", second["lease"]["token"], "it broke", "--permanent")
    assert failed.returncode == 0 and json.loads(failed.stdout)["stage"] == "FAILED"

    third = json.loads(cli(board_server, key, "claim").stdout)
    assert third["task"]["id"] == "c2"
    none_left = cli(board_server, key, "claim", "--wait", "0.2")
    assert none_left.returncode == 3 and none_left.stdout == "" and "no work" in none_left.stderr

    assert [json.loads(e)["verb"] for e in cli(board_server, key, "events", "c1").stdout.splitlines()] == [
        "create", "claim", "renew", "complete"]
    assert json.loads(cli(board_server, key, "get", "c3").stdout)["error"] == "it broke"

    healthy = cli(board_server, key, "check")
    assert (healthy.returncode, healthy.stdout) == (0, "")
    expire_lease("c2")
    sick = cli(board_server, key, "check")
    assert sick.returncode == 1
    assert [(p["task"], p["code"]) for p in map(json.loads, sick.stdout.splitlines())] == [("c2", "lease_expired")]

    missing = cli(board_server, key, "get", "nope")
    assert missing.returncode == 4 and missing.stderr.startswith("not_found: ")
    unauthorized = cli(board_server, "tfk_bad", "list")
    assert unauthorized.returncode == 4 and unauthorized.stderr.startswith("unauthorized: ")
    bad_json = cli(board_server, key, "create", "{not json")
    assert bad_json.returncode == 2
    unreachable = subprocess.run(
        [sys.executable, "-m", "taskflow_client", "--url", "http://127.0.0.1:9", "--key", key, "check"],
        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert unreachable.returncode == 5 and unreachable.stderr.startswith("transport_error: ")


def test_cli_operator_verbs(board_server, keys):
    cli(board_server, keys["alice"], "create", '{"id": "h", "title": "held", "on_hold": true}')
    refused = cli(board_server, keys["alice"], "admit", "h")
    assert refused.returncode == 4 and refused.stderr.startswith("forbidden: ")
    admitted = cli(board_server, keys["op"], "admit", "h", "--reason", "ok")
    assert admitted.returncode == 0 and json.loads(admitted.stdout)["stage"] == "QUEUED"
    cancelled = cli(board_server, keys["op"], "cancel", "h", "--version", "1")
    assert json.loads(cancelled.stdout)["stage"] == "CANCELLED"
