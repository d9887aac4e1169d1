"""The layers of the board app, and the rule that imports only go downward.

    taskflow_site  (settings, URLs, ASGI/WSGI, serving)
    board.admin    (operators' Django admin)   board.api (agents' JSON API)
    board.live     (the live board: outbox tailer, websocket, board page, parked claims)
    board.metrics  (Prometheus metrics: /metrics, the engine's outcomes counted)
    board.public   (the one public view of a task, lease and history row)
    board.access, board.agent_keys, board.health  (who may do what; agent keys; /healthz)
    board.engine   (lifecycle, transitions, reads, invariants, contract, store seam, clock)
    board.models   (the tables)

A module may import its own layer and the layers below it, never one above: the engine moves a
row without loading channels, django-ninja or the admin (the reaper and contract_check run on
it alone). This test reads every module's imports (ast, so a lazy import inside a function
counts too) and fails on an upward one.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Layer of a module (longest matching prefix wins), and what each layer may import from board.
LAYERS = {
    # The tables belong to the engine: models use its lifecycle, it reads and writes them.
    "board.models": 1, "board.migrations": 1,
    "board.engine": 1,
    "board.access": 2, "board.agent_keys": 2, "board.health": 2, "board.public": 2,
    # Django's ORM only, on the caller's own model (downstream tables, not the board's).
    "board.fencing": 2,
    "board.live": 3,
    # Prometheus metrics: fed by the engine's outcome hook, the live board and the API's middleware.
    "board.metrics": 3,
    # The contrib apps' configs and migrations for a MongoDB store: what the settings install,
    # kept beside the rest of MongoDB's code; the engine never imports them.
    "board.engine.stores.mongodb.apps": 4, "board.engine.stores.mongodb.migrations": 4,
    "board.api": 4, "board.admin": 4, "board.management": 4, "board.apps": 4,
}
# Third-party packages that belong to the delivery layers only.
DELIVERY_PACKAGES = ("channels", "ninja", "pydantic", "django.contrib.admin", "daphne", "uvicorn")


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
    tree = ast.parse(path.read_text(), filename=str(path))
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


BOARD_MODULES = sorted(p for p in (ROOT / "board").rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_of_the_board_app_has_a_layer():
    unplaced = [module_name(p) for p in BOARD_MODULES if layer_of(module_name(p)) is None]
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
        if mine <= 2 and target.startswith(DELIVERY_PACKAGES):
            upward.append(f"line {line}: {target} (a delivery package, below the live board)")
    return upward


@pytest.mark.parametrize("path", BOARD_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_go_downward(path):
    assert upward_imports(path) == []


def test_the_rule_catches_an_upward_import(tmp_path):
    """The check itself can fail: an engine module importing the live board is reported. The
    probe is written outside the tree, so that no other test (or xdist worker) collects it."""
    fake = tmp_path / "_layer_probe.py"
    fake.write_text("def f():\n    from board.live import tailer\n    import channels.layers\n")
    found = upward_imports(fake, "board.engine._layer_probe")
    assert found == ["line 2: board.live.tailer (layer 3 above board.engine._layer_probe's 1)",
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
