"""The proxy example (deploy/nginx.conf) end to end: Debian's nginx, filled in by
deploy/render_nginx.py and run as a sandboxed instance in a temporary folder, terminates TLS
(a self-signed certificate made here, which every client verifies) in front of TWO board servers
(`manage.py serve`, production settings: DEBUG off, SECURE_PROXY_SSL_HEADER=1) on the test
database. Through it: an agent's whole task, a waiting claim, a staff login with the admin's
form and CSRF, the live board's websocket, a body over 1 MiB, a static file from a collectstatic
folder, the HTTP redirect, and one board server stopping while requests keep succeeding.

Conditions in other processes are polled with deadlines (wait_until), never slept on."""
from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from board import agent_keys
from board.models import Task
from harness.browser import NGINX
from taskflow_client import Client, TransportError
from tests.live_server import ROOT, BoardServer, free_port, wait_until
from tests.support import database_url, sqlite_db_mark

HOST = "localhost"  # the public name: in the certificate, ALLOWED_HOSTS and server_name
WAIT = 15.0  # deadline for conditions that take a poll or two
MIB = 1024 * 1024


def proxy_test(test):
    """A test through nginx and the board servers: the `proxy` marker (Debian's nginx is
    needed), on the committed test database (the servers are other processes)."""
    for mark in [pytest.mark.proxy, *sqlite_db_mark()]:
        test = mark(test)
    return test


# ---------------------------------------------------------------------------------------------
# The proxy: certificate, static files, two board servers, nginx


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for `localhost` (and 127.0.0.1), valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName(HOST), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)  # read by nginx's master process only
    return cert_path, key_path


def collect_static(static_root: Path) -> None:
    """`manage.py collectstatic --noinput` into `static_root` (STATIC_ROOT overridden here:
    the settings fix it to the project's .staticfiles/, which a test must not write)."""
    with override_settings(STATIC_ROOT=str(static_root)):
        call_command("collectstatic", "--noinput", verbosity=0)


def readable_by_all(directory: Path) -> None:
    """nginx started as root runs its workers as `nobody`: they must reach the static files
    and the temporary folders inside our (otherwise private) directory."""
    for path in [directory, *directory.rglob("*")]:
        if path.name != "key.pem":
            path.chmod(0o755 if path.is_dir() else 0o644)


class Nginx:
    """Debian's nginx on deploy/nginx.conf (rendered into a sandbox folder), in front of the
    given board servers."""

    def __init__(self, directory: Path, servers: list[BoardServer], cert: Path, key: Path, static_root: Path):
        self.directory, self.servers = directory, servers
        self.cert, self.key, self.static_root = cert, key, static_root
        self.process: subprocess.Popen | None = None
        self.port = self.http_port = 0
        self.tls = ssl.create_default_context(cafile=str(cert))  # verifies: no CERT_NONE anywhere

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    def render(self) -> None:
        done = subprocess.run(
            [sys.executable, "deploy/render_nginx.py", "--public-url", self.url,
             "--listen-https", f"127.0.0.1:{self.port}", "--listen-http", f"127.0.0.1:{self.http_port}",
             *[arg for s in self.servers for arg in ("--upstream", f"127.0.0.1:{s.port}")],
             "--cert", str(self.cert), "--key", str(self.key), "--static-root", str(self.static_root),
             "--sandbox", str(self.directory)],
            cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        readable_by_all(self.directory)
        tested = subprocess.run([NGINX, "-t", "-q", "-c", str(self.directory / "nginx.conf")],
                                capture_output=True, text=True, timeout=30)
        assert tested.returncode == 0, f"nginx -t refused the rendered example:\n{tested.stderr}"

    def start(self) -> "Nginx":
        """Render on free ports and start; another port pair if one was taken meanwhile."""
        for _ in range(3):
            self.port, self.http_port = free_port(), free_port()
            self.render()
            self.process = subprocess.Popen(
                [NGINX, "-c", str(self.directory / "nginx.conf"), "-g", "daemon off;"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            try:
                wait_until(lambda: self.process.poll() is not None or self._answers(), 15, "nginx listening")
            except AssertionError:
                self.stop()
                raise AssertionError(f"nginx did not start:\n{self.error_log()}") from None
            if self.process.poll() is None:
                return self
            if "Address already in use" not in self.error_log():
                break
        raise AssertionError(f"nginx did not start:\n{self.error_log()}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def error_log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no error log)"

    def access_log(self) -> list[str]:
        path = self.directory / "access.log"
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # fast shutdown: the master stops its workers
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:  # workers that outlived the master
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)
        self.process = None

    # -- clients ------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 20) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One HTTPS request through the proxy (a new connection; the certificate verified)."""
        conn = http.client.HTTPSConnection(HOST, self.port, context=self.tls, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.headers, response.read()
        finally:
            conn.close()

    def api(self, method: str, path: str, key: str, payload=None) -> tuple[int, object]:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        status, _, data = self.request(method, path, body, headers)
        return status, (json.loads(data) if data else None)


@pytest.fixture(scope="module")
def proxy(django_db_setup, django_db_blocker):
    directory = Path(tempfile.mkdtemp(prefix="taskflow-proxy-"))
    servers: list[BoardServer] = []
    nginx = None
    try:
        cert, key = make_certificate(directory)
        collect_static(directory / "static")
        with django_db_blocker.unblock():
            url = database_url(connections["default"].settings_dict)
        secret = BoardServer(url).secret_key  # one key for both: a session is valid on either
        # deploy/README.md's environment (nginx is on 127.0.0.1 here).
        production = {"DEBUG": "0", "ALLOWED_HOSTS": HOST, "SECURE_PROXY_SSL_HEADER": "1",
                      "SECURE_SSL_REDIRECT": "0", "FORWARDED_ALLOW_IPS": "127.0.0.1"}
        for _ in range(2):
            servers.append(BoardServer(url, secret_key=secret, env=production,
                                       args=["--workers", "1", "--access-log"]).start())
        nginx = Nginx(directory, servers, cert, key, directory / "static").start()
        yield nginx
    finally:
        if nginx is not None:
            nginx.stop()
        for server in servers:
            server.close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def agent_key(proxy):
    return agent_keys.create_key("tls-agent")[1]


def server_saw(server: BoardServer, needle: str) -> bool:
    return needle in server.log_tail(200_000)


def upstream(log_line: str) -> str:
    """Which board server(s) nginx passed a request to ("-": none), from the sandbox's
    access log: `127.0.0.1 "GET / HTTP/1.1" 200 upstream=127.0.0.1:8001 upstream_status=200 ...`."""
    return re.search(r" upstream=(.*) upstream_status=", log_line).group(1)


def logged_status(log_line: str) -> int:
    return int(re.search(r'" (\d{3}) upstream=', log_line).group(1))


def diagnostics(proxy: Nginx) -> str:
    return (f"\n--- nginx error log ---\n{proxy.error_log()}\n--- nginx access log ---\n"
            + "\n".join(proxy.access_log()[-20:])
            + "".join(f"\n--- board server {i} ---\n{s.log_tail(2000)}" for i, s in enumerate(proxy.servers)))


# ---------------------------------------------------------------------------------------------
# The example itself


def test_the_example_waits_longer_than_a_waiting_claim_and_documents_every_placeholder():
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    code = "\n".join(line.partition("#")[0] for line in text.splitlines())
    units = {"s": 1, "m": 60, "h": 3600}
    timeouts = [int(n) * units[u] for n, u in re.findall(r"proxy_read_timeout\s+(\d+)([smh]);", code)]
    assert timeouts and min(timeouts) > 30, "a waiting claim answers after up to 30 s"
    assert re.search(r"client_max_body_size\s+1m;", code)
    used = set(re.findall(r"@([A-Z_]+)@", code))
    assert used == {"SERVER_NAME", "PUBLIC_URL", "LISTEN_HTTP", "LISTEN_HTTPS", "UPSTREAMS", "CERT", "KEY",
                    "STATIC_ROOT"}
    header = text.split("\nupstream ")[0]
    assert all(f"@{name}@" in header for name in used), "the header explains how to fill each one"


# ---------------------------------------------------------------------------------------------
# Through the proxy


@proxy_test
def test_an_agent_creates_claims_and_completes_a_task_over_verified_https(proxy, agent_key, monkeypatch):
    # The client verifies the certificate: untrusted, nothing is sent...
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        Client(proxy.url, agent_key, timeout=10).get("nothing")
    # ... trusted the way an agent trusts a private CA (SSL_CERT_FILE), everything works.
    monkeypatch.setenv("SSL_CERT_FILE", str(proxy.cert))
    with Client(proxy.url, agent_key, timeout=20) as client:
        created = client.create({"id": "tls-1", "title": "through nginx", "payload": {"n": 21}})
        assert created["stage"] == "QUEUED"
        lease = client.claim("tls-1", 30)
        assert lease.task["stage"] == "RUNNING" and lease.fence == 1
        lease.renew(30, progress=0.5)
        done = lease.complete({"double": 42})
        assert (done["stage"], done["result"]) == ("COMPLETED", {"double": 42})
        assert client.get("tls-1")["stage"] == "COMPLETED"
        assert [(e["verb"], e["actor"]) for e in client.events("tls-1")] == [
            ("create", "tls-agent"), ("claim", "tls-agent"), ("renew", "tls-agent"), ("complete", "tls-agent")]

        # A waiting claim is held open by the server and passes through the proxy: nothing ready
        # in its queue, so 204 (None) after the wait...
        started = time.monotonic()
        assert client.claim_next(30, queue="tls-empty", wait_seconds=1) is None
        assert time.monotonic() - started >= 1
        # ... and a claim waiting through the proxy gets a task created meanwhile (had the
        # create won the race, the claim would simply have found the task at once).
        got: dict = {}

        def wait_for_work():
            try:
                with Client(proxy.url, agent_key, timeout=20) as waiting:
                    got["lease"] = waiting.claim_next(30, queue="tls-late", wait_seconds=20)
            except Exception as exc:  # reported below
                got["error"] = exc

        waiter = threading.Thread(target=wait_for_work)
        waiter.start()
        client.create({"id": "tls-late", "title": "arrives while an agent waits", "queue": "tls-late"})
        waiter.join(timeout=25)
        assert not waiter.is_alive() and "error" not in got, f"{got}{diagnostics(proxy)}"
        assert got["lease"] is not None and got["lease"].task["id"] == "tls-late"
    assert Task.objects.get(pk="tls-1").stage == "COMPLETED"


@proxy_test
def test_a_staff_user_logs_in_and_the_board_socket_streams_through_the_proxy(proxy):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import PBKDF2PasswordHasher
    from django.contrib.auth.models import Permission
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    # A password hash the servers' (production) hashers verify.
    hasher = PBKDF2PasswordHasher()
    watcher = get_user_model().objects.create(username="watcher", is_staff=True,
                                              password=hasher.encode("correct horse", hasher.salt()))
    # Watching the board needs board.view_task; creating through the session board.add_task.
    watcher.user_permissions.add(*Permission.objects.filter(content_type__app_label="board",
                                                            codename__in=["view_task", "add_task"]))
    jar = SimpleCookie()

    def remember(headers):
        for value in headers.get_all("Set-Cookie") or []:
            jar.load(value)

    def cookie_header():
        return "; ".join(f"{name}={morsel.value}" for name, morsel in jar.items())

    # The admin's login form over HTTPS: a CSRF cookie (Secure) and the form's token.
    status, headers, page = proxy.request("GET", "/admin/login/?next=/board/")
    assert status == 200, diagnostics(proxy)
    remember(headers)
    assert jar["csrftoken"]["secure"], "DEBUG off behind TLS: the CSRF cookie is Secure"
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
    form = urlencode({"username": "watcher", "password": "correct horse", "csrfmiddlewaretoken": token,
                      "next": "/board/"}).encode()
    status, headers, _ = proxy.request("POST", "/admin/login/?next=/board/", form, {
        "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie_header(),
        "Origin": proxy.url, "Referer": f"{proxy.url}/admin/login/?next=/board/"})
    assert (status, headers["Location"]) == (302, "/board/"), diagnostics(proxy)
    remember(headers)
    assert jar["sessionid"]["secure"] and jar["sessionid"]["httponly"]
    status, _, page = proxy.request("GET", "/board/", headers={"Cookie": cookie_header()})
    assert status == 200 and b'<script type="module" src="/static/board/main.js">' in page  # served by nginx

    socket_url = f"wss://{HOST}:{proxy.port}/ws/board/"
    # The Origin is checked (against ALLOWED_HOSTS) behind the proxy too.
    with pytest.raises(InvalidStatus) as refused:
        connect(socket_url, ssl=proxy.tls, origin="https://elsewhere.example", proxy=None,
                additional_headers={"Cookie": cookie_header()}, open_timeout=WAIT)
    assert refused.value.response.status_code == 403

    with connect(socket_url, ssl=proxy.tls, origin=proxy.url, proxy=None,
                 additional_headers={"Cookie": cookie_header()}, open_timeout=WAIT) as board:
        snapshot = json.loads(board.recv(timeout=WAIT))
        assert snapshot["type"] == "snapshot" and snapshot["tasks"] == []

        # A change through the HTTP API (the staff session, as the board page makes it) ...
        change = json.dumps({"id": "live-1", "title": "seen live"}).encode()
        status, _, data = proxy.request("POST", "/api/tasks", change, {
            "Content-Type": "application/json", "Cookie": cookie_header(),
            "X-CSRFToken": jar["csrftoken"].value, "Origin": proxy.url, "Referer": f"{proxy.url}/board/"})
        assert status == 201, data
        # ... arrives on the socket. nginx sent it to the OTHER board server (least_conn: the
        # socket keeps a connection to its own), so it came through the database's outbox.
        deadline = time.monotonic() + WAIT
        arrived = []
        while not arrived:  # recv raises TimeoutError past the deadline
            frame = json.loads(board.recv(timeout=max(0.1, deadline - time.monotonic())))
            if frame["type"] == "tasks":
                arrived = [item for item in frame["items"] if item["task"]["id"] == "live-1"]
        (item,) = arrived
        assert (item["event"]["verb"], item["task"]["stage"], item["task"]["title"]) == (
            "create", "QUEUED", "seen live")
        assert "token" not in json.dumps(frame)
    # (nginx logs the socket when it closes.)
    socket_line = wait_until(lambda: [line for line in proxy.access_log() if '"GET /ws/board/ HTTP/1.1" 101' in line],
                             WAIT, "nginx logged the websocket")[-1]
    create_line = [line for line in proxy.access_log() if '"POST /api/tasks HTTP/1.1" 201' in line][-1]
    assert upstream(socket_line) != upstream(create_line), diagnostics(proxy)


@proxy_test
def test_a_body_over_one_mebibyte_is_refused_by_the_proxy_with_the_apis_error(proxy, agent_key):
    headers = {"Authorization": f"Bearer {agent_key}", "Content-Type": "application/json"}
    # Exactly 1 MiB passes both the proxy and the server (valid JSON: trailing whitespace) ...
    edge = json.dumps({"id": "edge", "title": "exactly one MiB"}).encode()
    status, _, data = proxy.request("POST", "/api/tasks", edge.ljust(MIB, b" "), headers)
    assert status == 201, data
    # ... one byte more is refused by nginx before any board server sees it.
    status, answer, data = proxy.request("POST", "/api/tasks", edge.ljust(MIB + 1, b" "), headers)
    assert status == 413
    assert answer["Content-Type"] == "application/json"
    assert json.loads(data) == {"error": {"code": "too_large", "message": "request body over 1048576 bytes"}}
    # nginx logs a request when it is done with the connection (after draining the body).
    refused = wait_until(lambda: [line for line in proxy.access_log() if '"POST /api/tasks HTTP/1.1" 413' in line],
                         WAIT, "nginx logged the refused request")
    assert upstream(refused[-1]) == "-", refused
    assert not Task.objects.exclude(pk="edge").exists()


@proxy_test
def test_static_files_are_served_by_the_proxy_from_the_collectstatic_folder(proxy):
    status, headers, data = proxy.request("GET", "/static/board/main.js")
    assert status == 200, diagnostics(proxy)
    assert data == (ROOT / "static" / "board" / "main.js").read_bytes()
    assert "javascript" in headers["Content-Type"]  # a module script of any other type is refused
    assert headers["Cache-Control"] == "max-age=3600"
    status, _, _ = proxy.request("GET", "/static/board/no-such-file.js")
    assert status == 404
    # Answered by nginx itself (the board servers serve no static files with DEBUG off).
    assert not any("/static/" in line for s in proxy.servers for line in s.log_tail(200_000).splitlines())


@proxy_test
def test_plain_http_is_redirected_to_https(proxy):
    conn = http.client.HTTPConnection(HOST, proxy.http_port, timeout=10)
    try:
        conn.request("GET", "/board/?x=1")
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    assert (response.status, response.getheader("Location")) == (301, f"{proxy.url}/board/?x=1")
    # And the HTTPS answers carry HSTS (from the application, behind the proxy).
    _, headers, _ = proxy.request("GET", "/admin/login/")
    assert headers["Strict-Transport-Security"].startswith("max-age=")


# Last: it stops (and restarts) a board server, which nginx then avoids for a few seconds.
@proxy_test
def test_both_board_servers_serve_and_requests_survive_one_stopping(proxy, agent_key):
    first, second = proxy.servers
    for i in range(8):
        status, body = proxy.api("GET", f"/api/tasks?text=probe-{i}", agent_key)
        assert (status, body) == (200, {"items": [], "next": None}), diagnostics(proxy)
    # Each board server logged some of the probes itself.
    wait_until(lambda: server_saw(first, "text=probe-") and server_saw(second, "text=probe-"), WAIT,
               "both board servers answered probes through the proxy")

    first.stop()
    try:
        for i in range(6):  # whole tasks, every request through the proxy, on the server left
            status, _ = proxy.api("POST", "/api/tasks", agent_key, {"id": f"after-{i}", "title": "one server left"})
            assert status == 201, diagnostics(proxy)
            status, claimed = proxy.api("POST", f"/api/tasks/after-{i}/claim", agent_key, {"ttl_seconds": 30})
            assert status == 200, diagnostics(proxy)
            status, completed = proxy.api("POST", f"/api/tasks/after-{i}/complete", agent_key,
                                          {"token": claimed["lease"]["token"], "result": {"i": i}})
            assert (status, completed["stage"]) == (200, "COMPLETED"), diagnostics(proxy)
        assert Task.objects.filter(pk__startswith="after-", stage="COMPLETED").count() == 6
        wait_until(lambda: server_saw(second, "/api/tasks/after-5/complete"), WAIT, "the second server completed")
        # nginx tried the stopped server, was refused, and passed the request on (the access
        # log names both upstreams of such a request): a refused connection costs no request.
        retried = [line for line in proxy.access_log()
                   if f"upstream=127.0.0.1:{first.port}, 127.0.0.1:{second.port}" in line]
        assert retried, diagnostics(proxy)
        assert {logged_status(line) for line in retried} <= {200, 201}, retried
    finally:
        first.start()  # same port: the other tests have two servers again
