"""A real local HTTP receiver for webhook tests (http.server in a thread): it answers `fail_first`
requests with 500 (or what `answer` says), then 200; it checks each request's signature with the
webhook's secret, the documented way (docs/webhooks.md), and keeps what it received."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered

    @property
    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    fail_first: int = 0
    secret: str = ""
    redirect_to: str | None = None  # answer every request with a 302 to this address
    requests: list[Received] = field(default_factory=list)
    bad_signatures: int = 0

    def __post_init__(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.secret and not verify(receiver.secret, body, self.headers.get("X-TaskFlow-Signature", "")):
                    receiver.bad_signatures += 1
                failing = len(receiver.requests) < receiver.fail_first
                status = 302 if receiver.redirect_to else 500 if failing else 200
                receiver.requests.append(Received(self.path, dict(self.headers), body, status))
                self.send_response(status)
                if receiver.redirect_to:
                    self.send_header("Location", receiver.redirect_to)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if status >= 300 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.requests if r.status == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify(secret: str, body: bytes, signature: str) -> bool:
    """docs/webhooks.md's recipe, as a receiver writes it."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)
