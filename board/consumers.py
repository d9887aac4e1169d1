"""The live board's websocket: a logged-in staff user subscribes, gets a snapshot, then every
change as it commits (batches from this process's tailer, board/events.py). It never writes:
human actions go through the API (board/api.py)."""
from __future__ import annotations

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from . import events

# Close codes (4000-4999 are the application's): the page shows the reason.
NOT_ALLOWED = 4403


class BoardConsumer(AsyncWebsocketConsumer):
    # No channel layer: every frame comes from the tailer, so a Redis that hangs or refuses
    # (REDIS_URL) cannot close or stall a socket.
    channel_layer_alias = None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close(code=NOT_ALLOWED)
            return
        self.tailer = events.ensure_tailer()
        # Subscribe before reading the snapshot, holding what the tailer delivers meanwhile:
        # a change committed in between arrives after the snapshot and is applied (or ignored,
        # by version), never lost, and never overtaken by the snapshot.
        self.held: list[str] | None = []
        self.tailer.subscribers.add(self)
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code):
        tailer = getattr(self, "tailer", None)
        if tailer is not None:
            tailer.subscribers.discard(self)

    async def receive(self, text_data=None, bytes_data=None):
        # The page asks for a fresh snapshot when it sees a gap in a task's versions.
        try:
            content = json.loads(text_data or "null")
        except ValueError:
            return
        if isinstance(content, dict) and content.get("type") == "snapshot":
            self.held = []
            await self.send_snapshot()

    async def send_snapshot(self) -> None:
        frames = await database_sync_to_async(events.snapshot_frames)(problems=self.tailer.recent_problems())
        for frame in frames:
            await self.send(text_data=frame)
        while self.held:  # what arrived while the snapshot was read and sent, in order
            await self.send(text_data=self.held.pop(0))
        self.held = None

    async def deliver(self, frame: str) -> None:
        """Called by the tailer with an encoded frame (the same text for every socket)."""
        if self.held is not None:
            self.held.append(frame)
        else:
            await self.send(text_data=frame)
