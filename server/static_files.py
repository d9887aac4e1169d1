"""Static files answered on the event loop, when the server serves them itself (DEBUG, as
`make run` starts it; in production nginx serves them from `collectstatic`'s folder).

Through Django's StaticFilesHandler each file is a request in the server's small thread pool
(TASKFLOW_HTTP_THREADS, one on SQLite): the board page's 20 modules then queued one after the
other behind its API requests, ~120 ms on a 2-core machine before the page could run
(bench/board.py, 2026-12-06). A file is found by the same finders (STATICFILES_DIRS, the apps'
folders), read once and kept while its size and modification time stay the same (a file edited
while the server runs is read again), and answered with the headers Django's `serve` sends, plus
a 304 for a matching If-Modified-Since. Anything else — a name with `..`, a file not found, one
over MAX_FILE_BYTES, a method other than GET and HEAD — goes to Django as before."""
from __future__ import annotations

import mimetypes
import os
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime

MAX_FILE_BYTES = 1 << 20  # the board's files are a few KB; a bigger one goes through Django


@dataclass(frozen=True)
class _File:
    size: int
    mtime_ns: int
    headers: list
    body: bytes


class StaticFiles:
    def __init__(self, url_prefix: str):
        self.prefix = "/" + url_prefix.strip("/") + "/"
        self.files: dict[str, _File] = {}

    def answer(self, scope) -> tuple[int, list, bytes] | None:
        """(status, headers, body) for a static file; None when Django should answer."""
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD") or not path.startswith(self.prefix):
            return None
        name = path[len(self.prefix):]
        if not name or ".." in name.split("/") or name.startswith("/") or "\\" in name or "\0" in name:
            return None
        found = self._file(name)
        if found is None:
            return None
        since = _header(scope, b"if-modified-since")
        if since is not None and not _modified_since(since, found.mtime_ns):
            return 304, [h for h in found.headers if h[0] == b"last-modified"], b""
        return 200, found.headers, b"" if scope["method"] == "HEAD" else found.body

    def _file(self, name: str) -> _File | None:
        from django.contrib.staticfiles import finders

        kept = self.files.get(name)
        location = finders.find(name)
        if location is None:
            return None
        try:
            stat = os.stat(location)
        except OSError:
            return None
        if kept is not None and (kept.size, kept.mtime_ns) == (stat.st_size, stat.st_mtime_ns):
            return kept
        if stat.st_size > MAX_FILE_BYTES or not os.path.isfile(location):
            return None
        with open(location, "rb") as source:
            body = source.read()
        content_type, encoding = mimetypes.guess_type(location)
        headers = [(b"content-type", (content_type or "application/octet-stream").encode()),
                   (b"content-length", str(len(body)).encode()),
                   (b"last-modified", formatdate(stat.st_mtime, usegmt=True).encode())]
        if encoding:
            headers.append((b"content-encoding", encoding.encode()))
        kept = _File(stat.st_size, stat.st_mtime_ns, headers, body)
        self.files[name] = kept
        return kept


def _header(scope, wanted: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == wanted:
            return value.decode("latin1")
    return None


def _modified_since(header: str, mtime_ns: int) -> bool:
    try:
        since = parsedate_to_datetime(header).timestamp()
    except (TypeError, ValueError):
        return True
    return int(mtime_ns // 1_000_000_000) > int(since)
