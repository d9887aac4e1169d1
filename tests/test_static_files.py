"""Static files answered on the server's event loop when it serves them itself (DEBUG, as `make
run` starts it): server/static_files.py. In-process against the ASGI app, and through a real
`manage.py serve`. And what a server process does before its first request (server.serving.warm_up)."""
from __future__ import annotations

import asyncio
import os
import threading
from email.utils import formatdate
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders

from server.serving import HttpApp
from server.static_files import StaticFiles
from tests.test_serving import request, server  # noqa: F401  (the module's real server, a fixture)
from tests.support import sqlite_db_mark

pytestmark = sqlite_db_mark()

MAIN_JS = Path(finders.find("board/main.js")).read_bytes()


def scope(path: str, method: str = "GET", headers=()) -> dict:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
            "headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_a_module_is_answered_whole_with_its_type_and_a_head_without_its_body():
    files = StaticFiles("static/")
    status, headers, body = files.answer(scope("/static/board/main.js"))
    headers = dict(headers)
    assert (status, body) == (200, MAIN_JS)
    assert headers[b"content-type"] == b"text/javascript"
    assert headers[b"content-length"] == str(len(MAIN_JS)).encode()
    status, head_headers, body = files.answer(scope("/static/board/main.js", "HEAD"))
    assert (status, body, dict(head_headers)) == (200, b"", headers)


def test_if_modified_since_its_time_is_304_and_an_older_time_is_the_file():
    files = StaticFiles("static/")
    modified = dict(files.answer(scope("/static/board/main.js"))[1])[b"last-modified"].decode()
    status, headers, body = files.answer(scope("/static/board/main.js", headers=[("If-Modified-Since", modified)]))
    assert (status, body) == (304, b"")
    older = formatdate(os.stat(finders.find("board/main.js")).st_mtime - 3600, usegmt=True)
    assert files.answer(scope("/static/board/main.js", headers=[("If-Modified-Since", older)]))[0] == 200
    assert files.answer(scope("/static/board/main.js", headers=[("If-Modified-Since", "nonsense")]))[0] == 200


@pytest.mark.parametrize("path, method", [
    ("/static/../manage.py", "GET"),
    ("/static/board/../../manage.py", "GET"),
    ("/static//etc/passwd", "GET"),
    ("/static/board/no-such-module.js", "GET"),
    ("/static/", "GET"),
    ("/static/board/main.js", "POST"),
    ("/board/", "GET"),
])
def test_what_it_does_not_answer_goes_to_django(path, method):
    assert StaticFiles("static/").answer(scope(path, method)) is None


def test_a_file_edited_while_the_server_runs_is_read_again(tmp_path, settings):
    settings.STATICFILES_DIRS = [tmp_path]
    finders.get_finder.cache_clear()
    try:
        module = tmp_path / "edited.js"
        module.write_text("export const a = 1;\n")
        files = StaticFiles("static/")
        assert files.answer(scope("/static/edited.js"))[2] == b"export const a = 1;\n"
        module.write_text("export const a = 22;\n")
        os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 2_000_000_000))
        assert files.answer(scope("/static/edited.js"))[2] == b"export const a = 22;\n"
    finally:
        finders.get_finder.cache_clear()


def test_a_static_file_is_answered_while_every_request_thread_is_busy():
    """The point of answering them on the event loop: with the thread pool's one thread held (a
    slow board request on SQLite's one thread), the page's modules still arrive."""
    held, release = threading.Event(), threading.Event()

    def busy_wsgi(environ, start_response):
        held.set()
        release.wait(30)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"slow"]

    app = HttpApp(busy_wsgi, threads=1, max_body=1 << 20, max_claim_body=4096, max_waiters=10,
                  max_waiters_per_key=2, static_files=StaticFiles("static/"))

    async def call(path: str) -> tuple[int, bytes]:
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        await app(scope(path), receive, send)
        return sent[0]["status"], sent[1]["body"]

    async def both():
        slow = asyncio.create_task(call("/board/"))
        await asyncio.get_running_loop().run_in_executor(None, held.wait, 30)
        answered = await asyncio.wait_for(call("/static/board/main.js"), timeout=10)
        release.set()
        return answered, await slow

    try:
        (static_status, static_body), slow = asyncio.run(both())
    finally:
        release.set()
        app.executor.shutdown()
    assert (static_status, static_body) == (200, MAIN_JS)
    assert slow == (200, b"slow")


@pytest.mark.server
@pytest.mark.parametrize("path", ["/static/board/main.js", "/static/board/board.css"])
def test_the_real_server_answers_the_pages_files(server, path):  # noqa: F811
    status, headers, body = request(server, "GET", path)
    assert status == 200 and body == Path(finders.find(path.removeprefix("/static/"))).read_bytes()
    assert headers["content-type"] in ("text/javascript", "text/css")
    status, _, body = request(server, "GET", "/static/board/no-such-module.js")
    assert status == 404



def test_a_server_process_imports_its_views_and_builds_its_pages_as_it_starts():
    """server.serving.warm_up, run when a process builds its HTTP app: the first request after a
    start no longer pays for importing the URLconf (~1 s: the API's routers and schemas)."""
    import subprocess
    import sys

    probe = (
        "import os, sys, django\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'taskflow_site.settings'\n"
        "django.setup()\n"
        "assert 'board.api.main' not in sys.modules\n"
        "from server.serving import WARM_TEMPLATES, http_app\n"
        "http_app()\n"
        "assert 'board.api.main' in sys.modules\n"
        "from django.template import engines\n"
        "loader = engines['django'].engine.template_loaders[0]\n"
        "cached = {key for key in loader.get_template_cache}\n"
        "assert set(WARM_TEMPLATES) <= cached, cached\n"
        "print('warm')\n"
    )
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": "sqlite:///:memory:"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "warm", done.stderr[-2000:]
