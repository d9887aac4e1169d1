"""The HTTP/1.1 connection of the board's server: uvicorn's httptools protocol with the limits a
server facing the network needs, enforced on the event loop as the bytes arrive, before a request
costs any other work (`manage.py serve` runs uvicorn with this class).

- **The request head is capped**: the request line and headers together at most `head_bytes`
  (64 KiB) and `head_fields` header fields (100), else 431 `headers_too_large` and the connection
  is closed. The bytes of an unfinished head are counted as they arrive, so memory never grows
  past the cap plus one read, whatever the client sends (uvicorn itself keeps every header).
- **Slow clients are cut.** A request head must arrive whole within `head_timeout` seconds of its
  first byte (408); a body may pause at most `body_timeout` seconds between two reads (408); a
  connection with no request under way is closed after `keep_alive` seconds, including a new one
  that never sends a byte (uvicorn starts that clock only after a first answer).
- **An answer given before the request was read is still read by the client** (a lingering
  close, as nginx does): a 413 from the Content-Length, a 431, or a 408 goes out, the sending
  side is shut, and what the client is still sending is read and discarded (at most
  `linger_bytes`, for at most `linger_seconds`) before the socket is closed. Closing at once,
  with unread data, resets the connection, and the client sees a broken pipe instead of the
  answer.

- **An answer goes out in one write.** uvicorn writes an answer's head when the application
  sends `http.response.start` and its body at `http.response.body`: two send() calls and two TCP
  segments for every answer (bench/py_spy_summary.py of a server under eight agents, issue 34:
  10.9 % of the samples in uvicorn's send, the innermost Python frame of those writes). The
  head is held until the body's first part and written with it.

The figures come from the TASKFLOW settings (README, "Limits" and "Deploying").
"""
from __future__ import annotations

from dataclasses import dataclass

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from server.serving import _json_error


@dataclass(frozen=True)
class Limits:
    head_bytes: int = 64 * 1024
    head_fields: int = 100
    head_timeout: float = 10.0
    body_timeout: float = 10.0
    keep_alive: float = 5.0
    linger_seconds: float = 5.0
    linger_bytes: int = 16 * 1024 * 1024

    @classmethod
    def from_settings(cls) -> Limits:
        from django.conf import settings

        conf = settings.TASKFLOW
        return cls(head_bytes=conf["MAX_HEAD_BYTES"], head_fields=conf["MAX_HEAD_FIELDS"],
                   head_timeout=conf["HEADER_TIMEOUT_SECONDS"], body_timeout=conf["BODY_TIMEOUT_SECONDS"],
                   keep_alive=conf["KEEPALIVE_TIMEOUT_SECONDS"])


class _HeadTooLarge(Exception):
    """Raised from a parser callback: httptools stops parsing there (HttpParserCallbackError)."""


def error_answer(status: int, code: str, message: str) -> bytes:
    """A whole HTTP answer with the API's error shape (serving's), closing the connection."""
    status, headers, body = _json_error(status, code, message, [(b"connection", b"close")])
    return b"".join([STATUS_LINE[status], *(name + b": " + value + b"\r\n" for name, value in headers), b"\r\n", body])


class _CycleTransport:
    """The transport as a request's cycle sees it: the cycle closes the connection after an
    answer with `Connection: close`; that close becomes the protocol's lingering close. The
    methods an answer calls are the transport's own (bound once per connection: no cost)."""

    def __init__(self, transport, protocol: BoundedHttpToolsProtocol):
        self._transport = transport
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.close = protocol.close_lingering

    def __getattr__(self, name):
        return getattr(self._transport, name)


class _Delegating:
    """A transport whose write is this class's; everything else is the transport's."""

    def __init__(self, transport):
        self._transport = transport

    def __getattr__(self, name):
        return getattr(self._transport, name)


class _HeadHeld(_Delegating):
    """Keeps the one write uvicorn makes of an answer's head instead of sending it."""

    head: bytes | None = None

    def write(self, data: bytes) -> None:
        self.head = data


class _HeadFirst(_Delegating):
    """Sends `head` in front of the first write (the body's first part), in one write."""

    def __init__(self, transport, head: bytes):
        super().__init__(transport)
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, None
        self._transport.write(data if head is None else head + data)


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request cycle, writing an answer's head together with its body's first part."""

    _head: bytes | None = None

    async def send(self, message) -> None:
        transport = self.transport
        if not self.response_started:
            # Whatever uvicorn checks and decides about the head, it still does; only its write is held.
            self.transport = held = _HeadHeld(transport)
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._head = held.head
            return
        head, self._head = self._head, None
        if head is None:
            await super().send(message)
            return
        self.transport = first = _HeadFirst(transport, head)
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if first.head is not None and not transport.is_closing():
                transport.write(first.head)  # a body uvicorn refused before writing: the head still goes


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    limits: Limits | None = None  # read from the settings by the first connection

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # loads the app, and so Django's settings
        if BoundedHttpToolsProtocol.limits is None:
            BoundedHttpToolsProtocol.limits = Limits.from_settings()
        self.timeout_keep_alive = self.limits.keep_alive
        self._in_head = False  # a request head has begun and is not complete
        self._in_body = False  # the head is complete and the body is not
        self._head_size = 0  # the head's bytes as parsed (request target and headers)
        self._head_fields = 0
        self._head_read = 0  # bytes read while a head was unfinished (one header may be huge)
        self._head_refused = False
        self._deadline_timer = None
        self._last_read = 0.0
        self._lingering = False
        self._lingered = 0
        self._cycle_transport = None

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._cycle_transport = _CycleTransport(transport, self)
        # A connection that never sends a byte is idle like a kept-alive one.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._lingered += len(data)
            if self._lingered > self.limits.linger_bytes:
                self.transport.close()
            return
        self._last_read = self.loop.time()
        head_under_way = self._in_head
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self._head_refused:
                self._refuse_head()
                return
            raise
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self._cancel_deadline()
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head:
            if head_under_way:
                # Counted from the second read of a head (the first may hold the end of the
                # previous request): httptools keeps an unfinished header whole until it ends.
                self._head_read += len(data)
                if self._head_read > self.limits.head_bytes:
                    self._refuse_head()
                    return
            if self._deadline_timer is None:  # the head's clock runs from its first byte
                self._deadline_timer = self.loop.call_at(self._last_read + self.limits.head_timeout,
                                                         self._deadline, self.limits.head_timeout)
        elif self._in_body and self._deadline_timer is None:
            self._arm_deadline(self.limits.body_timeout)

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_size = self._head_fields = self._head_read = 0
        # The clocks are armed after the read, only for a head or body that is still arriving:
        # a request that came whole in one read costs no timer.

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size > self.limits.head_bytes:
            self._head_refused = True
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        self._head_size += len(name) + len(value) + 4
        if self._head_fields > self.limits.head_fields or self._head_size > self.limits.head_bytes:
            self._head_refused = True
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True
        self._cancel_deadline()
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.__class__ = OneWriteCycle  # uvicorn builds its own class; ours only adds to send
            self.cycle.transport = self._cycle_transport

    def on_message_complete(self) -> None:
        self._in_body = False
        self._cancel_deadline()
        super().on_message_complete()

    # -- refusals --------------------------------------------------------------------------

    def _refuse_head(self) -> None:
        limits = self.limits
        self.logger.debug("request head over the cap from %s", self.client)
        self._answer_and_linger(431, "headers_too_large",
                                f"request head over {limits.head_bytes} bytes or {limits.head_fields} header fields")

    def _answer_and_linger(self, status: int, code: str, message: str) -> None:
        self._in_head = self._in_body = False
        if self.cycle is not None and not self.cycle.response_complete:
            if self.cycle.response_started:
                self.transport.close()  # half an answer out: nothing sensible can follow it
                return
            self.cycle.response_started = self.cycle.response_complete = True  # the app's answer is dropped
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(error_answer(status, code, message))
        self._linger()

    def close_lingering(self) -> None:
        """Close after an answer; first drain what the client still sends of its request."""
        if self.transport.is_closing():
            return
        if not (self._in_head or self._in_body):
            self.transport.close()
            return
        self._in_head = self._in_body = False
        self._linger()

    def _linger(self) -> None:
        self._cancel_deadline()
        self._unset_keepalive_if_required()
        self._lingering = True
        self.pipeline.clear()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer ends here; the client may still be writing
        self.transport.resume_reading()
        self._deadline_timer = self.loop.call_later(self.limits.linger_seconds, self.transport.close)

    def eof_received(self):
        if self._lingering:
            self.transport.close()
        return None

    # -- the clocks: one timer per connection, checked against the last read ------------------

    def _arm_deadline(self, seconds: float) -> None:
        self._cancel_deadline()
        self._deadline_timer = self.loop.call_later(seconds, self._deadline, seconds)

    def _cancel_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    def _deadline(self, seconds: float) -> None:
        self._deadline_timer = None
        if self.transport.is_closing() or self._lingering:
            return
        if self._in_head:  # the whole head within its time, however it trickles
            self._answer_and_linger(408, "request_timeout", f"request head not received within {seconds:g} s")
        elif self._in_body:  # a body may take long, but not pause long
            idle = self.loop.time() - self._last_read
            if idle < seconds:
                self._deadline_timer = self.loop.call_later(seconds - idle, self._deadline, seconds)
            else:
                self._answer_and_linger(408, "request_timeout", f"no byte of the request body for {seconds:g} s")
