"""The board's pages name every ES module they will import in <link rel="modulepreload"> tags
(board/templatetags/modules.py), so that the browser fetches them at once instead of one level of
imports at a time. Checked on the pages as served: each preloaded module's own imports are
preloaded too (the list is closed), and every name is a real static file."""
from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders

from board.engine import transitions
from board.engine.transitions import TaskSpec
from tests.support import sqlite_db_mark
from tests.test_api import session_client, staff_user

pytestmark = [pytest.mark.django_db, *sqlite_db_mark()]

PRELOAD = re.compile(r'<link rel="modulepreload" href="/static/([^"]+)">')
ENTRY = re.compile(r'<script type="module" src="/static/([^"]+)">')
IMPORT_LINE = re.compile(r'^(?:import|export)\b[^;]*?["\']\./([\w.-]+\.js)["\']', re.MULTILINE | re.DOTALL)


def imports_of(module: str) -> set[str]:
    folder = module.rsplit("/", 1)[0]
    with open(finders.find(module), encoding="utf-8") as source:
        return {f"{folder}/{name}" for name in IMPORT_LINE.findall(source.read())}


@pytest.mark.parametrize("path", ["/board/", "/board/task/t1", "/board/graph/?root=t1"])
def test_a_page_preloads_its_entry_module_and_everything_it_imports(path):
    transitions.create(TaskSpec(id="t1", title="one"))
    client, _ = session_client(staff_user("reader", perms=("view_task",)))
    html = client.get(path).content.decode()
    preloaded = PRELOAD.findall(html)
    entry = ENTRY.findall(html)
    assert len(entry) == 1 and entry[0] in preloaded
    assert len(preloaded) == len(set(preloaded)), "a module preloaded twice"
    for module in preloaded:
        assert finders.find(module), f"{module} is no static file"
        missing = imports_of(module) - set(preloaded)
        assert not missing, f"{module} imports {sorted(missing)}, not preloaded"
    assert len(preloaded) == 1 + len(imports_of_all(entry[0]))


def imports_of_all(entry: str) -> set[str]:
    found, pending = set(), [entry]
    while pending:
        for module in imports_of(pending.pop()) - found:
            found.add(module)
            pending.append(module)
    return found - {entry}


def test_the_board_page_preloads_the_modules_four_levels_down():
    """The deepest chain on the board page (main.js -> details.js -> attempts.js -> timeline.js)
    is the waterfall these links remove: its last module is among them."""
    client, _ = session_client(staff_user("reader", perms=("view_task",)))
    preloaded = PRELOAD.findall(client.get("/board/").content.decode())
    assert {"board/details.js", "board/attempts.js", "board/timeline.js"} <= set(preloaded)
