"""What a hot request goes through, made cheaper (issue 34), and shown to mean the same: the
answers' JSON (orjson, board/api/rendering.py), the hot routes tried first (board/api/main.py),
Tasks built from the hot statements' rows without Model.__init__ (stores/statements.py), the
PostgreSQL statements' placeholder conversion cached (stores/postgresql.py), SQLite's temporary
files kept in memory (taskflow_site/settings.py), and an answer's head and body in one write
(server/http_protocol.py)."""
from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from decimal import Decimal

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.db.models import signals
from django.urls import Resolver404, get_resolver, resolve

from board.api import rendering
from board.api.main import HOT_ROUTES, api
from board.engine import transitions
from board.engine.stores import statements
from board.engine.transitions import TaskSpec
from board.models import Task
from tests.support import sql_stores, sqlite_db_mark

UTC = datetime.timezone.utc


# ---------------------------------------------------------------------------------------------
# The answers' JSON


@pytest.mark.parametrize("value", [
    {"at": datetime.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), "whole": datetime.datetime(2030, 1, 2, tzinfo=UTC)},
    {"zone": datetime.datetime(2030, 1, 2, 3, 4, 5, 120000, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))},
    {"text": "é € 漢字 \u2028 \"quoted\" \\ /", "none": None, "yes": True, "list": [1, -0.5, 1e-07, 1e300, 10**18]},
    {1: "an int key", "nested": {"deep": [[{"k": [None]}]]}},
    {"day": datetime.date(2030, 1, 2), "uuid": uuid.UUID(int=7), "decimal": Decimal("1.10"),
     "duration": datetime.timedelta(seconds=90)},
    {"big": 2**70, "small": -(2**70)},  # past orjson's 64 bits: json.dumps writes them
    [],
])
def test_the_answers_json_holds_the_values_django_ninja_wrote(value):
    """Parsed back, the bytes are the very document json.dumps with django-ninja's encoder
    wrote (datetimes in milliseconds with "Z", as Django writes them); only JSON's free
    spelling (spaces, escapes) may differ."""
    from ninja.responses import NinjaJSONEncoder

    written = rendering.dumps(value)
    assert isinstance(written, bytes)
    assert json.loads(written) == json.loads(json.dumps(value, cls=NinjaJSONEncoder))


def test_datetimes_are_written_as_django_writes_them():
    at = datetime.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert rendering.dumps({"at": at}) == b'{"at":"2030-01-02T03:04:05.123Z"}'
    assert json.loads(rendering.dumps([at]))[0] == DjangoJSONEncoder().default(at)


def test_a_value_neither_encoder_knows_still_raises():
    with pytest.raises(TypeError):
        rendering.dumps({"what": object()})


# ---------------------------------------------------------------------------------------------
# The hot routes first


def _sample(route: str) -> str:
    """A path `route` matches: each <converter:name> filled with a value of its kind."""
    import re

    return "/api/" + re.sub(r"<(?:(\w+):)?\w+>", lambda m: "a/b" if m.group(1) == "path" else "x1", route)


def test_every_api_path_reaches_the_same_view_as_in_django_ninjas_own_order():
    """The hot routes are tried first (BoardAPI._get_urls); no path may resolve differently for
    that: each pattern's sample path resolves to the view it did in the routers' order."""
    from ninja import NinjaAPI

    reordered = api.urls[0]
    original = NinjaAPI._get_urls(api)
    assert [str(p.pattern) for p in reordered[:len(HOT_ROUTES)]] == list(HOT_ROUTES)
    assert sorted(map(str, (p.pattern for p in reordered))) == sorted(map(str, (p.pattern for p in original)))

    def first_match(patterns, path: str):
        for pattern in patterns:
            match = pattern.resolve(path[len("/api/"):])
            if match is not None:
                return match.url_name, match.kwargs
        return None

    for pattern in original:
        path = _sample(str(pattern.pattern))
        assert first_match(reordered, path) == first_match(original, path), path
        # ...and so does the whole URLconf, the API first in it.
        assert resolve(path).url_name == first_match(original, path)[0]


def test_the_pages_still_resolve_with_the_api_first():
    resolver = get_resolver()
    for path in ("/", "/board/", "/board/task/t1", "/board/tasks/", "/admin/", "/healthz", "/metrics"):
        resolver.resolve(path)
    with pytest.raises(Resolver404):
        resolver.resolve("/nothing-here")


# ---------------------------------------------------------------------------------------------
# Tasks built from the hot statements' rows


@pytest.mark.parametrize("alias", sql_stores())
def test_a_task_built_from_a_row_is_the_one_from_db_builds(alias):
    transitions.create(TaskSpec(id="built", title="built", payload={"k": [1, "é"]}, tags=["a"]), using=alias)
    read = Task.objects.using(alias).get(pk="built")
    values = [getattr(read, f.attname) for f in Task._meta.concrete_fields]
    built = statements.task_from_db(alias, list(values))
    expected = Task.from_db(alias, [f.attname for f in Task._meta.concrete_fields], list(values))
    assert type(built) is Task
    assert {k: v for k, v in vars(built).items() if k != "_state"} == \
        {k: v for k, v in vars(expected).items() if k != "_state"}
    assert (built._state.adding, built._state.db) == (False, alias)
    built.title = "saved"
    built.save(update_fields=["title"])  # a usable model instance: the ORM can write it
    assert Task.objects.using(alias).get(pk="built").title == "saved"


@pytest.mark.parametrize("alias", sql_stores())
def test_a_listener_on_task_init_still_hears_the_hot_verbs_tasks(alias):
    heard = []

    def listener(sender, instance, **kwargs):
        heard.append(instance.pk)

    signals.post_init.connect(listener, sender=Task)
    try:
        transitions.create(TaskSpec(id="heard", title="heard"), using=alias)
        heard.clear()
        claim = transitions.claim_next("a", 60, using=alias)
    finally:
        signals.post_init.disconnect(listener, sender=Task)
    assert claim.task.pk == "heard" and "heard" in heard


# ---------------------------------------------------------------------------------------------
# PostgreSQL: the statements' conversion is cached


@pytest.mark.parametrize("alias", [sql_stores()[1]])
def test_on_postgresql_a_claims_placeholder_conversion_is_a_cache_hit(alias):
    """psycopg converts a query's placeholders once (an LRU) only when the query is short enough;
    the claim statement is longer than its default bound, which the store raises."""
    from psycopg import _queries

    from board.engine.stores.postgresql import PG_CLAIM_NEXT

    assert max(len(s.encode()) for s in PG_CLAIM_NEXT.values()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    transitions.create([TaskSpec(id=f"c{i}", title="c") for i in range(3)], using=alias)
    transitions.claim_next("a", 60, using=alias)
    before = _queries._query2pg.cache_info()
    transitions.claim_next("a", 60, using=alias)
    after = _queries._query2pg.cache_info()
    assert after.hits > before.hits and after.misses == before.misses


# ---------------------------------------------------------------------------------------------
# SQLite: temporary files in memory


@pytest.mark.parametrize("alias", [pytest.param("default", marks=sqlite_db_mark())])
def test_sqlite_connections_keep_temporary_files_in_memory(alias):
    """Without it SQLite made, wrote and unlinked a file in /var/tmp for many of the hot
    transactions (a statement journal): strace of a server under eight agents."""
    connection = connections[alias]
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA temp_store")
        assert cursor.fetchone()[0] == 2  # MEMORY


# ---------------------------------------------------------------------------------------------
# One write per answer


def test_an_answer_leaves_in_one_write_and_reads_whole():
    """The server's protocol on a real socket: each answer (a keep-alive connection's two, a HEAD's
    head alone) is one transport write, and the client reads status, headers and body intact."""
    import uvicorn
    from uvicorn.server import ServerState

    from server.http_protocol import BoundedHttpToolsProtocol

    async def app(scope, receive, send):
        await receive()
        body = b"" if scope["method"] == "HEAD" else b'{"ok":true}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]})
        await send({"type": "http.response.body", "body": body})

    async def scenario():
        config = uvicorn.Config(app, http=BoundedHttpToolsProtocol, lifespan="off", log_level="warning",
                                access_log=False)
        config.load()
        state = ServerState()
        writes: list[bytes] = []

        def protocol():
            made = BoundedHttpToolsProtocol(config=config, server_state=state, app_state={})
            connection_made = made.connection_made

            def counted(transport):
                write = transport.write

                class Counting:
                    def __getattr__(self, name):
                        return getattr(transport, name)

                    def write(self, data):
                        writes.append(bytes(data))
                        write(data)
                connection_made(Counting())
            made.connection_made = counted
            return made

        server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for method in ("GET", "GET", "HEAD"):
            writer.write(f"{method} / HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            body = b"" if method == "HEAD" else await reader.readexactly(11)
            answers.append((head, body))
        writer.close()
        server.close()
        await server.wait_closed()
        return writes, answers

    writes, answers = asyncio.run(scenario())
    assert len(writes) == 3, writes
    for (head, body), write in zip(answers, writes):
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 11" in head
        assert write == head + body
    assert [body for _, body in answers] == [b'{"ok":true}', b'{"ok":true}', b""]
