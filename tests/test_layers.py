"""The layers of the repository, and the rules that imports only go downward and never in a circle.

    tests, examples  (the suite; the client's example worker)
    bench            (benchmarks: print figures; they may use the harness, never the tests)
    harness          (real servers the tests and the benchmarks share)
    taskflow_site, manage.py  (the project: settings, URLs, the ASGI/WSGI entry points)
    board.management (commands that run processes: serve runs the server, reap the engine)
    server           (what a serving process runs around Django: HTTP in threads, parked claims'
                      hand-over, the socket's origin check, connection caps, log, tracing)
    board.api, board.admin, board.apps  (agents' JSON API, operators' admin, the app's wiring)
    board.live       (the live board: outbox tailer, websocket, board page, parked claims)
    board.webhooks   (webhook alerts: the history read as their outbox, with board.live's cursor)
    board.bulk       (bulk actions on a filter: background jobs of operator verbs)
    board.metrics    (Prometheus metrics: /metrics, the engine's outcomes counted)
    board.public, board.access, board.agent_keys, board.health, board.fencing
    board.engine, board.models  (lifecycle, transitions, reads, invariants, stores; the tables)
    taskflow_client  (the Python client, CLI and MCP server: imports nothing of the repository)
    deploy           (a stand-alone script)

A module may import its own layer and the layers below it, never one above: the engine moves a
row without loading channels, django-ninja or the admin (the reaper and contract_check run on
it alone), and the board app never imports the project package. Every module of the
repository has a layer. This test reads every module's imports (ast, so a lazy import inside a
function counts too), fails on an upward one, and fails on any cycle between modules (a
module that reaches itself again through the imports), naming the cycle.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from board.management.commands.api_schema import parse_python

ROOT = Path(__file__).resolve().parent.parent

# Layer of a module (longest matching prefix wins).
LAYERS = {
    "deploy": 0,
    "taskflow_client": 0,
    # The tables belong to the engine: models use its lifecycle, it reads and writes them.
    "board.models": 1, "board.migrations": 1,
    "board.engine": 1,
    "board.access": 2, "board.agent_keys": 2, "board.health": 2, "board.public": 2,
    # Django's ORM only, on the caller's own model (downstream tables, not the board's).
    "board.fencing": 2,
    # Prometheus metrics: fed by the engine's outcome hook, the live board and the API's middleware.
    "board.metrics": 3,
    "board.live": 4,
    # Webhook alerts read the history with the live board's outbox cursor: beside it.
    "board.webhooks": 4,
    # Bulk jobs call the engine's operator verbs; the live board reports them (its tailer).
    "board.bulk": 4,
    # The contrib apps' configs and migrations for a MongoDB store: what the settings install,
    # kept beside the rest of MongoDB's code; the engine never imports them.
    "board.engine.stores.mongodb.apps": 5, "board.engine.stores.mongodb.migrations": 5,
    "board.api": 5, "board.admin": 5, "board.apps": 5,
    # The pages' template tags (static files only): beside the views that render the templates.
    "board.templatetags": 5,
    "server": 6,
    "board.management": 7,
    "taskflow_site": 8, "manage": 8,
    "harness": 9,
    "bench": 10,
    "tests": 11, "examples": 11,
}
# Third-party packages that belong to the delivery layers only.
DELIVERY_PACKAGES = ("channels", "ninja", "pydantic", "django.contrib.admin", "daphne", "uvicorn")
# The layers that must load none of them: the engine and the board's modules beside it.
BELOW_DELIVERY = (1, 2)
# Cycles known and accepted: none. (The check fails on any cycle, and on a listed one once it is
# gone: then delete it here.)
KNOWN_CYCLES: set[frozenset[str]] = set()


def layer_of(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, me: str) -> list[tuple[int, str]]:
    tree = parse_python(path.read_text(), str(path))
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from board import engine`: the names may be modules; check each.
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def _python_files() -> list[Path]:
    """Every module of the repository: its packages and scripts (not the virtualenv)."""
    skip = {".venv", "node_modules", "__pycache__", ".git", "static", "templates"}
    return sorted(p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts))


MODULES = _python_files()
BOARD_MODULES = [p for p in MODULES if p.relative_to(ROOT).parts[0] == "board"]
NAMES = {module_name(p): p for p in MODULES}


def test_every_module_of_the_repository_has_a_layer():
    unplaced = [module_name(p) for p in MODULES if layer_of(module_name(p)) is None]
    assert unplaced == ["board"]  # the app's own (empty) __init__
    assert (ROOT / "board" / "__init__.py").read_text().strip() == ""


def upward_imports(path: Path, me: str | None = None) -> list[str]:
    """The imports of `path` (module `me`, by default its name in the tree) that go upward."""
    me = me or module_name(path)
    mine = layer_of(me)
    upward = []
    for line, target in imports_of(path, me):
        theirs = layer_of(target)
        if theirs is not None and theirs > mine:
            upward.append(f"line {line}: {target} (layer {theirs} above {me}'s {mine})")
        if mine in BELOW_DELIVERY and target.startswith(DELIVERY_PACKAGES):
            upward.append(f"line {line}: {target} (a delivery package, below the live board)")
    return upward


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_go_downward(path):
    assert upward_imports(path) == []


def import_graph(names: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `names` it imports (lazy imports included): an import of
    `a.b.c` where only `a.b` is a module counts as `a.b` (c is a name in it)."""
    graph = {}
    for me, path in names.items():
        edges = set()
        for _, target in imports_of(path, me):
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != me:
                edges.add(target)
        graph[me] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle path (a, b, ..., a) per group of modules that import each other in a circle."""
    return [_path_through(graph, group) for group in circles(graph)]


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iterative)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
    return groups


def _path_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle of `group` through its first module (breadth first back to it)."""
    start = min(group)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_no_module_imports_itself_again_through_others():
    graph = import_graph(NAMES)
    found = circles(graph)
    unknown = [" -> ".join(_path_through(graph, group)) for group in found if frozenset(group) not in KNOWN_CYCLES]
    assert unknown == [], "import cycles:\n" + "\n".join(unknown)
    gone = KNOWN_CYCLES - {frozenset(group) for group in found}
    assert not gone, f"a known cycle is gone: delete it from KNOWN_CYCLES: {gone}"


def test_the_cycle_check_reports_a_cycle_with_its_path():
    """The check itself can fail: three modules in a circle (a lazy import closing it) are named
    in order, and a chain without a way back is no cycle."""
    graph = {"board.live.a": {"board.live.b"}, "board.live.b": {"board.live.c"},
             "board.live.c": {"board.live.a"}, "board.live.d": {"board.live.a"}}
    assert cycles(graph) == [["board.live.a", "board.live.b", "board.live.c", "board.live.a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_rule_catches_an_upward_import(tmp_path):
    """The check itself can fail: an engine module importing the live board is reported. The
    probe is written outside the tree, so that no other test (or xdist worker) collects it."""
    fake = tmp_path / "_layer_probe.py"
    fake.write_text("def f():\n    from board.live import tailer\n    import channels.layers\n")
    found = upward_imports(fake, "board.engine._layer_probe")
    assert found == ["line 2: board.live.tailer (layer 4 above board.engine._layer_probe's 1)",
                     "line 3: channels.layers (a delivery package, below the live board)"]


def test_django_startup_and_the_engine_load_no_delivery_package():
    """What the imports above cannot see: what a process that only moves rows (the reaper,
    contract_check) loads when Django starts (every installed app, board/apps.py's subscriber:
    board.live.doorbell) and it imports the engine. A fresh interpreter, so that nothing this
    test run imported counts."""
    check = ("import os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'; import django; "
             "django.setup(); import board.engine.transitions; "
             "print(sorted(m for m in sys.modules if m.startswith(('channels', 'ninja', 'pydantic'))))")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # its stderr is the failure's message
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
