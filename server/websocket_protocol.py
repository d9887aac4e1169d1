"""The board's websocket connection: uvicorn's websockets-sansio protocol, plus one ASGI
extension for the live board's fan-out (`manage.py serve` runs uvicorn with this class).

A change reaches every watching socket as the same frame (board.live.tailer). Through ASGI, each
socket's copy costs a task wake-up, the channels consumer's send, uvicorn's encoding of the text
and websockets' framing of it, before the one write that must happen. With 2,500 sockets on a
process, that was most of its CPU (bench/board.py --clients 5000). So a socket's scope carries
`scope["extensions"]["taskflow.send_frame"]`: a plain function that writes a frame built once
for all sockets (board.live.frames.text_frame) straight to this connection, and answers False,
writing nothing, whenever uvicorn's own path must be used instead: the handshake not done, a
close sent or received, the connection gone, or its write buffer over the high-water mark (then
the consumer's queue waits for it, as before, with its send timeout). Server frames are not
masked, and this server negotiates no extension (no compression), so the same bytes are right
for every socket.
"""
from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State


class BoardWebSocketProtocol(WebSocketsSansIOProtocol):
    def handle_connect(self, event) -> None:
        # Here, not at the top: uvicorn loads this class before the application sets Django up.
        from board.live.frames import SEND_FRAME

        super().handle_connect(event)
        # The scope exists when the handshake was accepted; the app's task has not run yet.
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][SEND_FRAME] = self.send_frame

    def send_frame(self, frame: bytes) -> bool:
        """Write `frame` (board.live.frames.text_frame) now and answer True, or write nothing
        and answer False."""
        if (self.handshake_complete and not self.close_sent and not self.disconnected
                and self.initial_response is None and self.writable.is_set()
                and self.conn.state is State.OPEN and not self.conn.extensions
                and not self.transport.is_closing()):
            self.transport.write(frame)
            return True
        return False
