"""The live board's websocket (/ws/board/): a staff user who may read the board subscribes, gets
a snapshot (board.live.snapshots), then every change as this process's tailer sends it. It never
writes: human actions go through the API.

Contract: a socket that may not watch, or stops being allowed to (re-checked every
SOCKET_RECHECK_SECONDS and on logout), is closed with NOT_ALLOWED (4403); one whose unsent frames
pass SOCKET_MAX_UNSENT_BYTES or that takes no frame for SOCKET_SEND_TIMEOUT_SECONDS, with TOO_SLOW
(4408); a failed snapshot, with INTERNAL_ERROR (1011). The tailer never waits for a socket, and
no channel layer is used. The protocol, the close codes and the backpressure bounds:
docs/live-protocol.md.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from collections import deque
from importlib import import_module
from types import SimpleNamespace

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver

from board import access, metrics
from board.engine.limits import MAX_CLIENT_MESSAGE_CHARS
from board.live import snapshots, tailer
from board.live.frames import SEND_FRAME

log = logging.getLogger("board.live.consumers")

# Close codes (4000-4999 are the application's): the page shows the reason.
NOT_ALLOWED = 4403
TOO_SLOW = 4408  # the client fell too far behind: reconnect for a fresh snapshot
INTERNAL_ERROR = 1011


def may_watch(user) -> bool:
    """The same rule as the API's GETs and the board page (board/access.py). Runs in a sync
    thread (has_perm reads the database)."""
    return access.may_read(user)


# A session's verdict (may it watch?) is shared by its sockets for this long: the tabs of one
# session re-checked every SOCKET_RECHECK_SECONDS, or reconnecting together after a restart, read
# the database once, not once each (1,000 sockets re-checked one by one took a fifth of a
# server process's CPU, bench/board.py). A socket still learns within this of its period.
VERDICT_SHARED_SECONDS = 1.0
VERDICTS_KEPT = 1000  # past this many sessions' verdicts, the stale ones go (each a few bytes)
_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> {key: (at, future)}


async def session_verdict(session_key: str | None) -> bool:
    """session_may_watch(session_key), read from the database by one of the session's sockets
    at a time and shared for VERDICT_SHARED_SECONDS (per event loop: a future is its loop's)."""
    if not session_key:
        return False
    loop = asyncio.get_running_loop()
    verdicts = _verdicts.setdefault(loop, {})
    entry = verdicts.get(session_key)
    if entry is None or loop.time() - entry[0] > VERDICT_SHARED_SECONDS:
        if len(verdicts) >= VERDICTS_KEPT:  # sessions with no socket (refused ones) do not pile up
            # (list(): one C-level copy, so a logout's pop from a request thread cannot change
            # the dict while it is read.)
            for key, (at, _) in list(verdicts.items()):
                if loop.time() - at > VERDICT_SHARED_SECONDS:
                    verdicts.pop(key, None)
        future = asyncio.ensure_future(database_sync_to_async(session_may_watch)(session_key))
        entry = verdicts[session_key] = (loop.time(), future)
    # shield: a socket that closes while it waits does not cancel the others' answer.
    return await asyncio.shield(entry[1])


def forget_verdict(session_key: str | None) -> None:
    """Read the session again at its next socket's check (a logout: its shared "allowed" must
    not let a new socket in). Called from a request thread: each loop's dict is copied first."""
    for verdicts in list(_verdicts.values()):
        verdicts.pop(session_key, None)


def session_may_watch(session_key: str | None) -> bool:
    """The session still exists and logs in a user who may watch, re-read from the database
    (django.contrib.auth.get_user: a deactivated user or a changed password logs it out)."""
    if not session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return may_watch(auth.get_user(SimpleNamespace(session=session)))


# The open sockets of this process by session key, for the logout signal (sent from a request
# thread, hence the lock).
_by_session: dict[str, set[BoardConsumer]] = {}
_by_session_lock = threading.Lock()


@receiver(user_logged_out, dispatch_uid="board.live.consumers.close_logged_out_sockets")
def close_logged_out_sockets(sender, request=None, **kwargs) -> None:
    key = getattr(getattr(request, "session", None), "session_key", None)
    with _by_session_lock:
        sockets = list(_by_session.get(key, ())) if key else []
    forget_verdict(key)
    for socket in sockets:
        socket.loop.call_soon_threadsafe(socket.drop, NOT_ALLOWED)


class BoardConsumer(AsyncWebsocketConsumer):
    # No channel layer: every frame comes from the tailer, so a Redis that hangs or refuses
    # (REDIS_URL) cannot close or stall a socket.
    channel_layer_alias = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:  # however the socket ended (closed, dropped, crashed), it leaves the tailer
            self._leave()

    async def connect(self):
        # The session cookie only (server/application.py: no session or auth middleware, whose
        # wrapper of `send` read the session for every frame sent).
        self.session_key = self.scope["cookies"].get(settings.SESSION_COOKIE_NAME)
        if not await session_verdict(self.session_key):
            # Accepted first, then closed: a close before the handshake reaches the browser as
            # 1006 (no code), and the page could not tell "log in again" from "server away".
            await self.accept()
            await self.close(code=NOT_ALLOWED)
            return
        conf = settings.TASKFLOW
        self.loop = asyncio.get_running_loop()
        self.max_unsent = conf["SOCKET_MAX_UNSENT_BYTES"]
        self.send_timeout = conf["SOCKET_SEND_TIMEOUT_SECONDS"]
        self.outbox: deque[str] = deque()
        self.unsent = 0  # characters of the frames in the outbox (= bytes: json.dumps writes ASCII)
        self.dropped = False
        self.snapshot_wanted = True
        self.busy = True  # until the sender task finds nothing left to send
        # The server's direct write of a frame built once for every socket (None under another
        # server: then every frame goes through the sender task).
        self.send_frame = self.scope.get("extensions", {}).get(SEND_FRAME)
        self.work = asyncio.Event()
        # Subscribe before the snapshot is read: a change committed in between is queued behind
        # the snapshot and applied (or ignored, by version), never lost, never overtaken by it.
        self.tailer = tailer.ensure_tailer()
        self.tailer.subscribers.add(self)
        metrics.websocket_opened()  # _leave, which runs once for this socket, says it closed
        with _by_session_lock:
            _by_session.setdefault(self.session_key, set()).add(self)
        await self.accept()
        self.tasks = [asyncio.create_task(self._send_frames()),
                      asyncio.create_task(self._recheck_access(conf["SOCKET_RECHECK_SECONDS"]))]

    async def disconnect(self, code):
        self._leave()

    async def receive(self, text_data=None, bytes_data=None):
        # The page asks for a fresh snapshot when it sees a gap in a task's versions.
        if text_data is None or len(text_data) > MAX_CLIENT_MESSAGE_CHARS:
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            return
        if isinstance(content, dict) and content.get("type") == "snapshot":
            self.snapshot_wanted = True
            self.work.set()

    async def deliver(self, frame: str, wire: bytes | None = None) -> bool | None:
        """Called by the tailer with an encoded frame (the same text for every socket) and, when
        the server offers it, that frame as websocket bytes built once for every socket (`wire`,
        server/websocket_protocol.py). Never waits for the client. True: written at once;
        False: queued for the sender task; None: not taken (this socket is closing)."""
        if self.dropped:
            return None
        # Straight out when nothing of this socket is queued or on its way (order is kept) and
        # the connection takes it now; else behind the rest, by the sender task.
        if (wire is not None and self.send_frame is not None and not self.busy
                and not self.outbox and not self.snapshot_wanted and self.send_frame(wire)):
            return True
        self.outbox.append(frame)
        self.unsent += len(frame)
        if self.unsent > self.max_unsent:
            log.warning("dropping a board socket %d characters behind (limit %d)", self.unsent, self.max_unsent)
            self.drop(TOO_SLOW)
            return None
        self.work.set()
        return False

    def drop(self, code: int) -> None:
        """Close this socket now (from its event loop): it leaves the tailer at once; the close
        frame goes out behind what the client has not read yet."""
        if self.dropped:
            return
        self._leave()
        asyncio.ensure_future(self.close(code=code))

    async def _send_frames(self) -> None:
        try:
            while not self.dropped:
                self.busy = True  # deliver() must not write past what this loop is sending
                if self.snapshot_wanted:
                    self.snapshot_wanted = False
                    # What is queued is older than the snapshot about to be read: it covers it.
                    self.outbox.clear()
                    self.unsent = 0
                    await self._send_snapshot()
                elif self.outbox:
                    frame = self.outbox.popleft()
                    self.unsent -= len(frame)
                    await self._send_in_time(frame)
                else:
                    self.busy = False
                    self.work.clear()
                    await self.work.wait()
        except asyncio.CancelledError:
            raise
        except Exception:  # this socket only: the page reconnects
            log.exception("board socket failed; closing it")
            self.drop(INTERNAL_ERROR)

    async def _send_snapshot(self) -> None:
        await self.tailer.wait_placed()  # raises if it never will: this socket closes (1011)
        # Built on the snapshots' own thread, one build shared by every socket that asked
        # meanwhile (board.live.snapshots): this socket holds the same frames as they do.
        snapshot = await snapshots.builds().get(self.tailer.recent_problems)
        for frame in snapshot:
            await self._send_in_time(frame)
        # The agents and throughput panel, as this process's tailer last computed it (one
        # computation for every socket, board.live.tailer); the first socket asks it for one.
        if self.tailer.insights_frame is not None:
            await self._send_in_time(self.tailer.insights_frame)
        else:
            self.tailer.want_insights()
        # The queues strip, as the tailer last pushed it (a later change reaches this socket as
        # it reaches every other: it subscribed before this snapshot). Before the tailer's first
        # read there is none yet, and that read is due (it pushes to every socket).
        if self.tailer.queues_frame is not None:
            await self._send_in_time(self.tailer.queues_frame)

    async def _send_in_time(self, frame: str) -> None:
        """Send one frame, or drop this socket (TOO_SLOW) when the server could not take it within
        `SOCKET_SEND_TIMEOUT_SECONDS` (its write buffer for this client stayed full: the client
        is not reading). Dropping cancels this sender and lets go of what the socket held (its
        snapshot, its queue). A timer, not wait_for: no task per frame sent."""
        timer = self.loop.call_later(self.send_timeout, self._stalled)
        try:
            await self.send(text_data=frame)
        finally:
            timer.cancel()

    def _stalled(self) -> None:
        log.warning("dropping a board socket that took no frame for %g s", self.send_timeout)
        self.drop(TOO_SLOW)

    async def _recheck_access(self, period: float) -> None:
        while not self.dropped:
            await asyncio.sleep(period)
            try:
                allowed = await session_verdict(self.session_key)
            except Exception:  # the database is away: check again next period
                log.exception("could not re-check a board socket's session")
                continue
            if not allowed:
                self.drop(NOT_ALLOWED)

    def _leave(self) -> None:
        """Stop receiving frames and doing work for this socket (idempotent)."""
        if getattr(self, "dropped", True):
            return
        self.dropped = True
        self.tailer.subscribers.discard(self)
        metrics.websocket_closed()
        with _by_session_lock:
            sockets = _by_session.get(self.session_key)
            if sockets is not None:
                sockets.discard(self)
                if not sockets:
                    del _by_session[self.session_key]
        self.outbox.clear()
        self.unsent = 0
        current = asyncio.current_task()
        for task in getattr(self, "tasks", ()):
            if task is not current:
                task.cancel()
