"""The board's JavaScript (static/board/*.js) flows one way: socket.js and api.js feed the model
(store.js); render, details, view and insights subscribe to it. Read from the source text (no
JavaScript runs here): no import cycle, the network only in api.js (fetch) and socket.js
(WebSocket), the model written only by those two, and no module state exported to be changed
by another (`export let`, or an exported Map, Set, array or object that any module mutates).
"""

import re
from pathlib import Path

import pytest

BOARD = Path(__file__).resolve().parent.parent / "static" / "board"
MODULES = {path.name: path.read_text() for path in sorted(BOARD.glob("*.js"))}

IMPORT = re.compile(r'^\s*import\s+(?:\{([^}]*)\}\s+from\s+|[\w*\s,]+\s+from\s+)?"\./([\w.-]+\.js)";', re.M)
# What may reach the network, and where.
NETWORK = {"fetch": ("api.js", re.compile(r"\bfetch\(")),
           "WebSocket": ("socket.js", re.compile(r"\bnew\s+WebSocket\(|\bWebSocket\("))}
# The model's writers are named apply*, set* and remove* (store.js's convention).
WRITER = re.compile(r"^(apply|set|remove)[A-Z]\w*$")
FEEDERS = {"socket.js", "api.js"}


def _code(source: str) -> str:
    """The source without its comments (a comment may name fetch or an import)."""
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    return re.sub(r"(^|\s)//.*$", "", source, flags=re.M)


def imports(name: str) -> dict[str, list[str]]:
    """module -> the names `name` imports from it (empty list for a bare or namespace import)."""
    out: dict[str, list[str]] = {}
    for names, target in IMPORT.findall(MODULES[name]):
        listed = [n.split(" as ")[0].strip() for n in names.split(",") if n.strip()]
        out.setdefault(target, []).extend(listed)
    return out


GRAPH = {name: sorted(imports(name)) for name in MODULES}


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_modules_are_read():
    # A test that reads nothing would pass forever: the board's modules and their imports are there.
    assert {"main.js", "store.js", "socket.js", "api.js", "render.js", "view.js", "details.js"} <= set(MODULES)
    assert "store.js" in GRAPH["socket.js"] and "store.js" in GRAPH["api.js"]
    for targets in GRAPH.values():
        for target in targets:
            assert target in MODULES, f"import of a missing module {target}"


def test_find_cycle_finds_one():
    assert find_cycle({"a.js": ["b.js"], "b.js": ["c.js"], "c.js": ["a.js"]}) == ["a.js", "b.js", "c.js", "a.js"]
    assert find_cycle({"a.js": ["b.js", "c.js"], "b.js": ["c.js"], "c.js": []}) is None


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "static/board imports in a circle: " + " -> ".join(cycle)


def test_the_model_imports_only_the_page():
    assert GRAPH["store.js"] == ["page.js"]
    assert GRAPH["page.js"] == []


@pytest.mark.parametrize("what", sorted(NETWORK))
def test_the_network_only_in_its_module(what):
    home, pattern = NETWORK[what]
    where = [name for name, source in MODULES.items() if pattern.search(_code(source))]
    assert where == [home], f"{what} is called in {where}; only {home} may"


def test_only_the_socket_and_the_api_write_the_model():
    for name in MODULES:
        writers = [n for n in imports(name).get("store.js", []) if WRITER.match(n)]
        if name not in FEEDERS:
            assert not writers, f"{name} imports the model's writers {writers}: only socket.js and api.js feed it"


def test_no_exported_state_is_changed():
    exported_let = [name for name, source in MODULES.items() if re.search(r"^\s*export\s+(let|var)\b", source, re.M)]
    assert not exported_let, f"`export let` in {exported_let}: export a function that reads it"
    # An exported constant that holds a container: no module may change it.
    containers = {}
    for name, source in MODULES.items():
        for const in re.findall(r"^\s*export\s+const\s+(\w+)\s*=\s*(?:new\s+(?:Map|Set)\b|\[|\{|Object\.)", source, re.M):
            containers[const] = name
    assert "COLUMN_ELS" in containers  # the pattern sees page.js's constants
    mutation = r"\b{}\s*(?:\.(?:set|add|delete|clear|push|pop|shift|unshift|splice|sort)\(|\[[^\]]*\]\s*=[^=]|\.\w+\s*=[^=])"
    for const, home in containers.items():
        changed = [name for name, source in MODULES.items() if re.search(mutation.format(const), _code(source))]
        assert not changed, f"{home}'s exported {const} is changed in {changed}: keep it private, export functions"
