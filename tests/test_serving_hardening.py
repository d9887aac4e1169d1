"""The board's server (`manage.py serve`) against careless and hostile clients: header floods,
slow clients, oversize bodies that must still be answered, and waiting claims that must not pile
up. Each against a real server process on a real database, over raw sockets where a client
library would hide what the server does."""
import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.db import connections

from board import agent_keys
from board.models import Task, TaskEvent
from tests.live_server import BoardServer, wait_until
from tests.support import database_url, sqlite_db_mark

pytestmark = sqlite_db_mark()

HEAD_LIMIT = 64 * 1024  # the server's cap on a request head (server/http_protocol.py)


def start(**env) -> BoardServer:
    url = database_url(connections["default"].settings_dict)
    return BoardServer(url, env=env, args=["--workers", "1"]).start()


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """One worker process (its RSS is the serve process's own), short timeouts for the slow
    clients' tests: 2 s for a request head, 2 s of silence in a body, 1 s of keep-alive idle."""
    with django_db_blocker.unblock():
        server = start(TASKFLOW_HEADER_TIMEOUT="2", TASKFLOW_BODY_TIMEOUT="2",
                       TASKFLOW_KEEPALIVE_TIMEOUT="1")
    try:
        yield server
    finally:
        server.close()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def timed_get(server: BoardServer, path: str = "/") -> float:
    """Seconds to get an answer to a fresh GET (a redirect: no database work)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 ")
    return time.monotonic() - started


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """What the server sends until it closes (bounded by `timeout`), and when it closed
    (seconds from the call; `timeout` if it did not)."""
    started = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        return data, timeout
    return data, time.monotonic() - started


def error_of(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


# ---------------------------------------------------------------------------------------------
# Header floods


class Flood(threading.Thread):
    """Sends a request head of `count` copies of `line` in 64 KiB writes (while the server takes
    them), then reads the answer."""

    def __init__(self, server: BoardServer, line: bytes, count: int):
        super().__init__(daemon=True)
        self.server, self.line, self.count = server, line, count
        self.sent = 0
        self.answer = b""
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=120) as sock:
                head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + self.line * self.count + b"\r\n"
                try:
                    for at in range(0, len(head), 65536):
                        sock.sendall(head[at:at + 65536])
                        self.sent = at + 65536
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server stopped reading: its answer may still be in our buffer
                self.answer, _ = read_until_closed(sock, 60)
        except Exception as exc:  # reported by the test
            self.error = exc


def test_a_flood_of_headers_is_431_at_once_and_the_process_keeps_answering(server):
    # One million 6-byte headers (6 MB): the landed server froze its event loop for 26 s on it.
    flood = Flood(server, b"X: a\r\n", 1_000_000)
    flood.start()
    wait_until(lambda: flood.sent >= 1024 * 1024 or not flood.is_alive(), 30, "the flood is under way")
    assert timed_get(server) < 2.0, "a request sent during the flood waited for it"
    flood.join(90)
    assert flood.error is None, flood.error
    status, error = error_of(flood.answer)
    assert status == 431 and error["code"] == "headers_too_large", flood.answer[:300]
    assert timed_get(server) < 2.0


def test_too_many_header_fields_are_431_even_when_small(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(101))
                     + b"\r\n")
        status, error = error_of(read_until_closed(sock, 10)[0])
    assert status == 431 and "100" in error["message"]
    # 100 fields (Host included) are served.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     + b"".join(b"X-%d: a\r\n" % i for i in range(98)) + b"\r\n")
        assert read_until_closed(sock, 10)[0].startswith(b"HTTP/1.1 302")


def test_memory_does_not_grow_with_the_size_of_a_refused_header_block(server):
    before = rss_kib(server.process.pid)
    # 8 KB headers up to 100 MB: the landed server kept them all (200 MB took it 101 -> 326 MB).
    flood = Flood(server, b"X-Big: " + b"a" * 8192 + b"\r\n", 100 * 1024 * 1024 // 8200)
    flood.start()
    flood.join(120)
    assert flood.error is None, flood.error
    assert error_of(flood.answer)[0] == 431
    assert flood.sent < 32 * 1024 * 1024, f"the server read {flood.sent} bytes of a refused head"
    assert rss_kib(server.process.pid) - before < 20 * 1024


def test_one_header_value_longer_than_the_cap_is_431(server):
    flood = Flood(server, b"X-Long: " + b"a" * (HEAD_LIMIT + 1) + b"\r\n", 1)
    flood.start()
    flood.join(30)
    assert error_of(flood.answer)[0] == 431


def test_repeated_headers_reach_django_joined_in_order():
    from server.serving import HttpApp

    scope = {"type": "http", "method": "GET", "path": "/", "query_string": b"",
             "headers": [(b"x-many", b"%d" % i) for i in range(50)] + [(b"cookie", b"a=1"), (b"cookie", b"b=2")]}
    environ = HttpApp._environ(scope, b"")
    assert environ["HTTP_X_MANY"] == ",".join(str(i) for i in range(50))
    assert environ["HTTP_COOKIE"] == "a=1; b=2"  # cookies are joined as one Cookie header


# ---------------------------------------------------------------------------------------------
# Slow clients


def test_a_client_trickling_its_head_is_cut_while_others_are_served(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        closed_after = None
        for i in range(40):  # a header line every 0.2 s for up to 8 s
            assert timed_get(server) < 1.0  # everybody else is served meanwhile
            try:
                sock.sendall(b"X-%d: a\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            if select.select([sock], [], [], 0.2)[0]:  # an answer (408) or the close
                closed_after = time.monotonic() - started
                answer, _ = read_until_closed(sock, 5)
                assert answer == b"" or error_of(answer)[0] == 408
                break
        assert closed_after is not None, "a head trickled for 8 s was never cut"
    assert 1.5 < closed_after < 4.0


def test_a_connection_that_never_sends_is_closed_after_the_keep_alive_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        data, closed_after = read_until_closed(sock, 6)
    assert data == b"" and closed_after < 3.0


def test_a_body_that_stops_arriving_is_408_and_reaches_no_view(server):
    key = agent_keys.create_key("slow-body")[1]
    before = Task.objects.count(), TaskEvent.objects.count()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"title\": ")
        data, closed_after = read_until_closed(sock, 8)
    assert closed_after < 4.0, "a stalled body kept its connection"
    status, error = error_of(data)
    assert status == 408 and error["code"] == "request_timeout"
    assert (Task.objects.count(), TaskEvent.objects.count()) == before


# ---------------------------------------------------------------------------------------------
# An oversize body is answered, not reset


def test_every_client_reads_the_413_of_a_body_it_is_still_sending(server):
    """The server answers 413 from the Content-Length and would close at once; the client is
    still writing its 2 MB, and a close with unread data resets the connection (the client saw
    BrokenPipe or 'reset by peer' instead of the answer). A lingering close reads the rest."""
    from taskflow_client import Client
    from taskflow_client.errors import TooLarge

    key = agent_keys.create_key("big-sender")[1]
    payload = {"blob": "x" * (2 * 1024 * 1024)}
    outcomes = []
    with Client(server.url, key, timeout=30) as client:
        for i in range(50):
            try:
                client.create({"id": f"big-{i}", "title": "big", "payload": payload})
                outcomes.append("created")
            except TooLarge:
                outcomes.append("413")
            except Exception as exc:  # noqa: BLE001  (each outcome counted)
                outcomes.append(f"{type(exc).__name__}: {exc}")
    body = json.dumps({"title": "big", "payload": payload}).encode()
    for i in range(50):
        request = urllib.request.Request(f"{server.url}/api/tasks", data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            urllib.request.urlopen(request, timeout=30).read()
            outcomes.append("created")
        except urllib.error.HTTPError as exc:
            outcomes.append("413" if exc.code == 413 and json.loads(exc.read())["error"]["code"] == "too_large"
                            else f"HTTP {exc.code}")
        except Exception as exc:  # noqa: BLE001
            outcomes.append(f"{type(exc).__name__}: {exc}")
    assert outcomes == ["413"] * 100, [o for o in outcomes if o != "413"][:5]
    assert not Task.objects.filter(title="big").exists()


# ---------------------------------------------------------------------------------------------
# Waiting claims: small bodies, a share per agent, a cap under plain WSGI too


def post(server: BoardServer, path: str, key: str, body: bytes, timeout: float = 30) -> tuple[int, dict, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                       "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/api/claim", "/api/tasks/x/claim"])
def test_a_claim_body_over_its_cap_is_413_and_nothing_is_claimed(server, path):
    from taskflow_client import Client

    key = agent_keys.create_key("padded")[1]
    with Client(server.url, key) as client:
        client.create({"id": "x", "title": "t"})
    before = Task.objects.count(), TaskEvent.objects.count()
    # A valid claim padded with JSON whitespace to 1 MB: it used to be parked whole.
    body = b'{"ttl_seconds": 60' + b" " * (1024 * 1024 - 40) + b', "wait_seconds": 1}'
    status, _, data = post(server, path, key, body)
    assert status == 413 and json.loads(data)["error"]["code"] == "too_large"
    assert "4096" in json.loads(data)["error"]["message"]
    assert (Task.objects.count(), TaskEvent.objects.count()) == before
    Task.objects.all().delete()


class Parked(threading.Thread):
    def __init__(self, server: BoardServer, key: str, queue: str, wait: float):
        super().__init__(daemon=True)
        self.args_ = (server, key, queue, wait)
        self.answer = None

    def run(self) -> None:
        server, key, queue, wait = self.args_
        body = json.dumps({"ttl_seconds": 60, "queue": queue, "wait_seconds": wait,
                           "request_id": f"r-{id(self)}"}).encode()
        self.answer = post(server, "/api/claim", key, body + b" " * 2000)


@pytest.fixture
def per_key_server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = start(TASKFLOW_MAX_WAITERS_PER_KEY="2")
    try:
        yield server
    finally:
        server.close()


def test_one_agent_cannot_take_every_waiting_slot(per_key_server):
    from taskflow_client import Client

    server = per_key_server
    greedy, other = agent_keys.create_key("greedy")[1], agent_keys.create_key("other")[1]
    # Three waiting claims of one agent at once (the cap is 2 per agent): whatever their order,
    # exactly one is refused at once; the two others wait.
    claims = [Parked(server, greedy, "q", 20) for _ in range(3)]
    for claim in claims:
        claim.start()
    wait_until(lambda: any(c.answer is not None for c in claims), 15, "one waiting claim refused")
    [refused] = [c for c in claims if c.answer is not None]
    status, headers, data = refused.answer
    assert status == 503, (status, data)
    assert json.loads(data)["error"]["code"] == "too_many_waiters" and headers["retry-after"] == "1"
    # Another agent still waits; three tasks go to the three waiting claims, one each.
    late = Parked(server, other, "q", 20)
    late.start()
    with Client(server.url, other) as client:
        for i in range(3):
            client.create({"id": f"w{i}", "title": "w", "queue": "q"})
    waiting = [c for c in claims if c is not refused] + [late]
    for claim in waiting:
        claim.join(30)
        assert claim.answer is not None and claim.answer[0] == 200, claim.answer
    owners = sorted(json.loads(c.answer[2])["task"]["owner"] for c in waiting)
    assert owners == ["greedy", "greedy", "other"]
    Task.objects.all().delete()


def test_waiting_claims_under_plain_wsgi_are_capped_per_process(settings):
    """taskflow_site/wsgi.py under a threaded WSGI server: each waiting claim holds a thread."""
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from board.live import parked
    from taskflow_site.wsgi import application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    class Threaded(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    settings.TASKFLOW = {**settings.TASKFLOW, "WSGI_MAX_WAITERS": 2}
    settings.ALLOWED_HOSTS = ["*"]
    httpd = make_server("127.0.0.1", 0, application, server_class=Threaded, handler_class=Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    key = agent_keys.create_key("wsgi-agent")[1]
    fake = BoardServer.__new__(BoardServer)
    fake.port = httpd.server_address[1]
    try:
        held = [Parked(fake, key, "none", 3) for _ in range(2)]
        for claim in held:
            claim.start()
        wait_until(lambda: parked.thread_wait_slots.total == 2, 10, "two claims wait")
        status, headers, data = post(fake, "/api/claim", key,
                                     json.dumps({"ttl_seconds": 60, "wait_seconds": 3}).encode())
        assert status == 503 and json.loads(data)["error"]["code"] == "too_many_waiters"
        assert headers["retry-after"] == "1"
        for claim in held:
            claim.join(10)
            assert claim.answer[0] == 204
        assert (parked.thread_wait_slots.total, parked.thread_wait_slots.by_key) == (0, {})
    finally:
        httpd.shutdown()
        httpd.server_close()
