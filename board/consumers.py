"""The live board's websocket: a logged-in staff user subscribes, gets a snapshot, then every
change as it commits. It never writes: human actions go through the API (board/api.py)."""
from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import events

# Close codes (4000-4999 are the application's): the page shows the reason.
NOT_ALLOWED = 4403


class BoardConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close(code=NOT_ALLOWED)
            return
        events.ensure_tailer()
        # Join before reading the snapshot: a change committed in between arrives after the
        # snapshot and is applied (or ignored, by version), never lost.
        await self.channel_layer.group_add(events.PROCESS_GROUP, self.channel_name)
        await self.accept()
        await self.send_json(await database_sync_to_async(events.board_snapshot)())

    async def disconnect(self, code):
        await self.channel_layer.group_discard(events.PROCESS_GROUP, self.channel_name)

    async def receive_json(self, content, **kwargs):
        # The page asks for a fresh snapshot when it sees a gap in a task's versions.
        if isinstance(content, dict) and content.get("type") == "snapshot":
            await self.send_json(await database_sync_to_async(events.board_snapshot)())

    async def task_changed(self, message):
        await self.send_json({"type": "task", "event": message["event"], "task": message["task"]})

    async def problems_changed(self, message):
        await self.send_json({"type": "problems", "problems": message["problems"]})
