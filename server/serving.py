"""How HTTP is served: Django's WSGI handler, called from the ASGI server's event loop.

Why not Django's ASGI handler: it hands every sync middleware and the sync view to a thread
(`sync_to_async`) one after the other, which cost ~20 ms of CPU per API request here; the same
view through the WSGI handler is 5-6 times cheaper (README, "Serving"). Websockets still need
ASGI, so one ASGI server (uvicorn, one worker process per core, sharing the port) serves
both: `/ws/` goes to Channels (server/application.py) and every HTTP request comes here, where
it is handed ONCE to a small pool of threads that run the whole Django request as WSGI.

The connection itself (head size, slow clients, the lingering close after an early answer) is
server/http_protocol.py's. Five things happen here, before Django sees the request:

- **Oversize bodies are refused unread.** A Content-Length over `DATA_UPLOAD_MAX_MEMORY_SIZE`
  (`MAX_CLAIM_BODY_BYTES` for the claim endpoints) is answered 413 at once, before
  authentication and without reading a byte of the body; a chunked body is counted as it
  arrives and refused as soon as it passes the limit. Memory does not grow with the size of a
  refused body. A client that leaves (or is cut) before its body is whole runs nothing.
- **Waiting claims wait here, holding nothing.** `POST /api/claim` with `wait_seconds` tries
  once in Django. When there is no work the view hands the claim to the request's Parking
  (board/live/parked.py, put in the environ here) and answers 204; the request is then parked on
  the process's list of parked claims — no thread, no database connection — and replayed when
  this process's tailer wakes it, until the wait is over. A client that disconnects while parked
  is forgotten: its claim is never replayed. Past `TASKFLOW_MAX_WAITERS` waiting requests per
  process, or `TASKFLOW_MAX_WAITERS_PER_KEY` of one agent, a new wait is refused with 503 and
  `Retry-After`, so idle agents (or one agent) can never starve the others.
- **Threads are bounded** (`TASKFLOW_HTTP_THREADS` per process): the database pool per process
  is sized from it, so no request ever waits for a connection.
- **Static files (DEBUG only) never enter the pool**: server/static_files.py answers them on
  the event loop (in production nginx serves them).
- **Dropped database connections are replaced together.** When PostgreSQL drops the server's
  connections (a restart, `pg_terminate_backend`), the pool's check (CONN_HEALTH_CHECKS) finds
  them dead one at a time as they are handed out, pausing longer after each (psycopg_pool's
  backoff: 0, 1, 2, 4 s), so a request that met four of them would fail. A watcher per process
  sees the pool's count of lost connections rise and checks every idle connection at once
  (`ConnectionPool.check()`): the next request gets a fresh one.
"""
from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connections

from board.live import parked
from server.static_files import StaticFiles
# The claim endpoints, whose bodies have a smaller cap (spelt here: this module is imported
# before Django is set up, and the API's URLs are the API's).
CLAIM_PATH = "/api/claim"
TASKS_PATH = "/api/tasks/"


def _json_error(status: int, code: str, message: str, extra_headers=()) -> tuple[int, list, bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *extra_headers]
    return status, headers, body


class BodyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


def _is_claim(scope) -> bool:
    """POST /api/claim or /api/tasks/{id}/claim: a few small fields."""
    path = scope["path"]
    return scope["method"] == "POST" and (path == CLAIM_PATH or (path.startswith(TASKS_PATH) and path.endswith("/claim")))


class HttpApp:
    """ASGI app for the `http` scope: Django's WSGI handler run in a bounded thread pool."""

    def __init__(self, wsgi_app, *, threads: int, max_body: int, max_claim_body: int, max_waiters: int,
                 max_waiters_per_key: int, static_files: StaticFiles | None = None):
        self.wsgi_app = wsgi_app
        self.static_files = static_files  # DEBUG: answered on the event loop (server/static_files.py)
        self.max_body = max_body
        self.max_claim_body = max_claim_body
        self.max_waiters = max_waiters
        self.max_waiters_per_key = max_waiters_per_key
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"HttpApp serves http, not {scope['type']}")
        try:
            body = await self._read_body(scope, receive)
        except BodyTooLarge as refused:
            status, headers, data = _json_error(413, "too_large", f"request body over {refused.limit} bytes")
            # The body is not read; the server drains what the client still sends, bounded, then
            # closes (server/http_protocol.py: the client reads this answer, not a reset).
            headers.append((b"connection", b"close"))
            await self._send(send, status, headers, data)
            return
        if body is None:
            return  # the client left (or was cut) before its body was whole: nothing runs
        if self.static_files is not None:
            answer = self.static_files.answer(scope)
            if answer is not None:
                await self._send(send, *answer)
                return
        loop = asyncio.get_running_loop()
        # The environ is built in the pool thread too: nothing per request on the event loop
        # beyond reading the body.
        environ, (status, headers, data) = await loop.run_in_executor(self.executor, self._first_call, scope, body)
        claim = self._parked_claim(environ, status)
        if claim is not None:
            answer = await self._wait_and_replay(environ, claim, headers, receive)
            if answer is None:
                return  # the client left while its claim waited
            status, headers, data = answer
        await self._send(send, status, headers, data)

    @staticmethod
    def _parked_claim(environ: dict, status: int) -> parked.ParkedClaim | None:
        """What the view asked to park (board.live.parked), if its answer is still its 204."""
        parking = environ.pop(parked.ENVIRON_KEY, None)
        return parking.claim if parking is not None and status == 204 else None

    async def _read_body(self, scope, receive) -> bytes | None:
        """The whole body; None if the client left before it was whole. BodyTooLarge past the
        limit, which is smaller for the claim endpoints (their answer may be parked, and a parked
        claim keeps what it needs to be replayed)."""
        limit = self.max_claim_body if _is_claim(scope) else self.max_body
        length = _header(scope["headers"], "content-length")
        if length is not None:
            try:
                if int(length) > limit:
                    raise BodyTooLarge(limit)
            except ValueError:
                pass  # Django answers a malformed length itself
        chunks, size = [], 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # chunked (or lying) body: stop at the limit
                raise BodyTooLarge(limit)
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _first_call(self, scope, body: bytes) -> tuple[dict, tuple[int, list, bytes]]:
        environ = self._environ(scope, body)
        return environ, self._call_wsgi(environ)

    @staticmethod
    def _environ(scope, body: bytes) -> dict:
        """The WSGI environ of an ASGI http scope (as asgiref.wsgi builds it)."""
        script_name = scope.get("root_path", "").encode("utf8").decode("latin1")
        path_info = scope["path"].encode("utf8").decode("latin1")
        if script_name and path_info.startswith(script_name):
            path_info = path_info[len(script_name):]
        server = scope.get("server") or ("localhost", 80)
        environ = {
            "REQUEST_METHOD": scope["method"],
            "SCRIPT_NAME": script_name,
            "PATH_INFO": path_info,
            "QUERY_STRING": scope.get("query_string", b"").decode("ascii"),
            "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
            "SERVER_NAME": server[0],
            "SERVER_PORT": str(server[1] if server[1] is not None else 0),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": scope.get("scheme", "http"),
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            parked.ENVIRON_KEY: parked.Parking(),  # a claim that finds no work is parked
        }
        if scope.get("client"):
            environ["REMOTE_ADDR"] = scope["client"][0]
        repeated: dict[str, list[str]] = {}
        for name, value in scope.get("headers", ()):
            key = name.decode("latin1").upper().replace("-", "_")
            if key not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
                key = "HTTP_" + key
            value = value.decode("latin1")
            if key in environ:  # joined once at the end: linear in the number of repeats
                repeated.setdefault(key, [environ[key]]).append(value)
            environ[key] = value
        for key, values in repeated.items():
            environ[key] = ("; " if key == "HTTP_COOKIE" else ",").join(values)
        return environ

    def _call_wsgi(self, environ: dict) -> tuple[int, list, bytes]:
        """One whole Django request, in a pool thread (its database connection is this
        thread's; Django closes or returns it to the pool when the response is closed)."""
        started: dict = {}

        def start_response(status, headers, exc_info=None):
            started["status"] = int(status.split(" ", 1)[0])
            started["headers"] = [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers]

        result = self.wsgi_app(environ, start_response)
        try:
            data = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return started["status"], started["headers"], data

    async def _wait_and_replay(self, environ, claim: parked.ParkedClaim, headers, receive):
        """The claim found no work: park it (no thread, no connection), replay it when this
        process's tailer wakes it, answer 204 when the wait is over. Returns None when the client
        went away meanwhile: nothing is replayed then, so a task is never claimed for an agent
        that is no longer there to take it.

        A parked claim keeps its request head (at most the head cap) and the claim as the view
        parsed it (a few hundred bytes), not the body the client sent."""
        from board.live.tailer import ensure_tailer  # (imports channels: after Django is set up)

        waiters = parked.waiters()
        # Counted here, in the same step as the caps' check (no await between): see KeyTally.
        if not waiters.claims.take(claim.agent, self.max_waiters, self.max_waiters_per_key):
            whose = (f"this agent already has {self.max_waiters_per_key}" if waiters.claims.total < self.max_waiters
                     else f"this server already holds {self.max_waiters}")
            return _json_error(503, "too_many_waiters", f"{whose} waiting claims; retry shortly or claim "
                               "without wait_seconds", [(b"retry-after", b"1")])
        environ = dict(environ, CONTENT_LENGTH=str(len(claim.claim)))
        environ.pop("wsgi.input", None)
        deadline = time.monotonic() + claim.seconds
        loop = asyncio.get_running_loop()
        # The body has been read: the next message can only be the client's disconnect.
        gone = asyncio.ensure_future(receive())
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return 204, [h for h in headers if h[0] != b"content-length"], b""
                ensure_tailer()  # this process's tailer wakes parked claims (started once, restarted if it ended)
                waiting = asyncio.ensure_future(waiters.wait(claim.queue, remaining, claim.capabilities))
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    waiting.cancel()
                    return None
                if deadline - time.monotonic() <= 0:
                    continue
                replay = dict(environ, **{"wsgi.input": io.BytesIO(claim.claim),
                                          parked.ENVIRON_KEY: parked.Parking()})
                status, headers, data = await loop.run_in_executor(self.executor, self._call_wsgi, replay)
                if self._parked_claim(replay, status) is None:
                    return status, headers, data
        finally:
            gone.cancel()
            waiters.claims.give_back(claim.agent)

    @staticmethod
    async def _send(send, status: int, headers: list, data: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _header(headers, name: str) -> str | None:
    wanted = name.lower().encode()
    for key, value in headers:
        if key.lower() == wanted:
            return value.decode("latin1")
    return None


log = logging.getLogger("board.serving")
POOL_WATCH_SECONDS = 0.2  # reading the pool's counters is a dict copy: cheap at this rate


def watch_connection_pool(alias: str = "default") -> threading.Thread | None:
    """Start this process's watcher of the PostgreSQL connection pool (none without a pool)."""
    pool = getattr(connections[alias], "pool", None)
    if pool is None:
        return None

    def lost() -> int:
        stats = pool.get_stats()
        return stats.get("connections_lost", 0) + stats.get("returns_bad", 0)

    def watch() -> None:
        seen = 0
        while True:
            time.sleep(POOL_WATCH_SECONDS)
            if lost() > seen:
                try:
                    pool.check()  # every idle connection: the dead ones are replaced
                except Exception:  # the database is away: the next rise tries again
                    log.exception("could not check the database connection pool")
                seen = lost()

    thread = threading.Thread(target=watch, name="pool-watch", daemon=True)
    thread.start()
    return thread


def warm_up() -> None:
    """Import every view and build the pages' templates as the process starts. Django does it in
    the first request that needs them: the URLconf alone (the API's django-ninja routers and
    their pydantic schemas) took ~1 s, so the first page or API call to each server process
    after a start waited that long (bench/board.py: the board's HTML in 819–848 ms, then 27–82)."""
    from django.template.loader import get_template
    from django.urls import get_resolver

    get_resolver().url_patterns
    for name in WARM_TEMPLATES:
        get_template(name)


# The pages a person opens first after a start (templates/board/).
WARM_TEMPLATES = ("board/board.html", "board/task.html", "board/tasks.html")


def wsgi_application():
    """Django's WSGI handler with an agent's hot requests in front of it (server/hot_requests.py)."""
    from django.core.wsgi import get_wsgi_application

    from server.hot_requests import HotRequests

    return HotRequests(get_wsgi_application())


def http_app() -> HttpApp:
    """The HTTP side of the server's application (server/application.py), from the settings."""
    wsgi = wsgi_application()
    warm_up()
    static_files = None
    if settings.DEBUG:  # production puts static files behind the proxy (collectstatic)
        from django.contrib.staticfiles.handlers import StaticFilesHandler

        wsgi = StaticFilesHandler(wsgi)  # what StaticFiles leaves (a file over its size bound)
        static_files = StaticFiles(settings.STATIC_URL)
    conf = settings.TASKFLOW
    watch_connection_pool()
    return HttpApp(wsgi, threads=conf["HTTP_THREADS"], max_body=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
                   max_claim_body=conf["MAX_CLAIM_BODY_BYTES"], max_waiters=conf["MAX_WAITERS"],
                   max_waiters_per_key=conf["MAX_WAITERS_PER_KEY"], static_files=static_files)
