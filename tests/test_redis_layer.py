"""With REDIS_URL set (several server processes), a commit in one process rings every other
process's tailer through Redis, so the change reaches their sockets at once instead of at their
next poll. Real Redis, real processes."""
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from channels.layers import channel_layers, get_channel_layer
from django.conf import settings
from django.db import connections
from django.test import override_settings

from board.live import tailer
from tests.support import database_url, sqlite_db_mark

pytestmark = [pytest.mark.redis, *sqlite_db_mark()]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def redis_layer(monkeypatch):
    layers = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                          "CONFIG": {"hosts": [settings.REDIS_TEST_URL], "capacity": 1000, "expiry": 30}}}
    with override_settings(REDIS_URL=settings.REDIS_TEST_URL, CHANNEL_LAYERS=layers):
        channel_layers.backends.clear()
        # A poll far longer than the test's patience: only the doorbell can wake the tailer in time.
        monkeypatch.setattr(tailer, "POLL_SECONDS", 30)
        yield
    channel_layers.backends.clear()


def test_a_commit_in_another_process_wakes_this_processs_tailer_through_redis(redis_layer):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "taskflow_site.settings", "DEBUG": "1",
           "SECRET_KEY": settings.SECRET_KEY, "REDIS_URL": settings.REDIS_TEST_URL,
           "DATABASE_URL": database_url(connections["default"].settings_dict)}
    script = "from board.engine import transitions as t; t.create(t.TaskSpec(id='from-afar', title='x'))"

    class Socket:
        """Stands in for a websocket: the thing under test is the doorbell, not the socket."""

        def __init__(self):
            self.frames = asyncio.Queue()

        async def deliver(self, frame, wire=None):
            await self.frames.put(json.loads(frame))

    async def scenario():
        layer = get_channel_layer()
        running = tailer.ensure_tailer()
        socket = Socket()
        running.subscribers.add(socket)
        await asyncio.wait_for(running.ready.wait(), timeout=10)
        writer = await asyncio.create_subprocess_exec(sys.executable, "manage.py", "shell", "-c", script,
                                                      cwd=ROOT, env=env)
        assert await writer.wait() == 0
        committed_at = time.monotonic()
        message = await asyncio.wait_for(socket.frames.get(), timeout=10)
        waited = time.monotonic() - committed_at
        running.task.cancel()
        await layer.flush()
        return message, waited

    message, waited = asyncio.run(scenario())
    assert message["type"] == "tasks" and message["items"][0]["task"]["id"] == "from-afar"
    assert waited < 5, f"took {waited:.1f} s: the doorbell did not ring (the poll is 30 s)"
