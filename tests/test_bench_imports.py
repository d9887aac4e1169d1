"""The benchmarks run on the runtime install alone (requirements.txt, what `make run` installs):
nothing under bench/ or harness/ imports the test suite (`tests`) or pytest, and docs/benchmarks.md's
benchmarks start, and one of them runs a real server, with every test-only package out of reach.

How "runtime install only" is checked: building a venv from requirements.txt inside a test
would take a full pip install of the runtime pins on every run, from the local index, on a
machine the suite shares. Instead each child Python here gets a `sitecustomize` (on PYTHONPATH,
so the server and agent processes the benchmark starts get it too) that makes every package of
requirements-test.txt that is not in requirements.txt (pytest, playwright, SecantusDB...) and the
`tests` package fail to import exactly as when they are not installed. Which import names those
are is read from the two files and the installed distributions, not typed here. (The same runs
in a real runtime-only venv are shown in the report of the change that added this file.)
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from board.management.commands.api_schema import parse_python

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("tests", "pytest", "_pytest")
# a module path given as a string, e.g. to `python -m` or importlib.import_module
MODULE_STRING = re.compile(r"(tests|_?pytest)(\.[A-Za-z_]\w*)*")


def forbidden_imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of every import of the test suite or pytest in `source`: `import x`,
    `from x import y` at any depth (in functions too), and string constants that are such a
    module path (`[sys.executable, "-m", "tests.secantus_server"]`)."""
    found = []
    for node in ast.walk(parse_python(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            names = [node.value]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in FORBIDDEN]
    return found


def shared_modules() -> list[Path]:
    return sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "harness").rglob("*.py")])


def readme_benchmarks() -> list[str]:
    """The scripts docs/benchmarks.md tells users to run, e.g. "bench/claims.py"."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    return sorted(set(re.findall(r"\.venv/bin/python (bench/\w+\.py)", text)))


def test_the_checker_sees_every_form_of_import():
    """A control for the test below: each way of reaching the suite is reported, with its line,
    and look-alikes are not."""
    source = '''"""Uses tests/live_server.py and pytest-like words in prose."""
import pytest
import testsuite, os
from tests import mongodb_server


def main():
    from tests.live_server import BoardServer
    import _pytest.config
    command = [sys.executable, "-m", "tests.secantus_server"]
    note = "tests.live_server is where it was"
'''
    assert forbidden_imports(source) == [
        (2, "pytest"), (4, "tests"), (8, "tests.live_server"), (9, "_pytest.config"), (10, "tests.secantus_server"),
    ]


def test_nothing_in_bench_or_harness_imports_the_tests_or_pytest():
    modules = shared_modules()
    names = {path.relative_to(ROOT).as_posix() for path in modules}
    # the files that used to import tests.live_server / tests.browser_support / tests.mongodb_server
    assert {"bench/http_claims.py", "bench/board.py", "bench/claims.py", "harness/board_server.py"} <= names
    found = {path.relative_to(ROOT).as_posix(): forbidden_imports(path.read_text(), str(path)) for path in modules}
    assert {name: hits for name, hits in found.items() if hits} == {}


def _requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def blocked_modules() -> set[str]:
    """Top-level import names of the distributions requirements-test.txt adds to requirements.txt,
    and the `tests` package."""
    extra = _requirement_names(ROOT / "requirements-test.txt") - _requirement_names(ROOT / "requirements.txt")
    blocked = {"tests"}
    for module, dists in packages_distributions().items():
        if {d.lower().replace("_", "-") for d in dists} <= extra:
            blocked.add(module)
    return blocked


@pytest.fixture(scope="module")
def runtime_only_env(tmp_path_factory) -> dict:
    """The environment of a shell after `make run` (nothing exported), in which every Python
    process finds the test-only packages missing."""
    blocked = blocked_modules()
    # Spot checks that the list is the one meant: the suite's runner, the browser, the MongoDB
    # test server; and that no runtime package is in it.
    assert {"pytest", "playwright", "secantus", "tests"} <= blocked
    assert not {"django", "channels", "websockets", "psycopg", "pymongo", "uvicorn", "daphne"} & blocked
    where = tmp_path_factory.mktemp("runtime-only")
    (where / "sitecustomize.py").write_text(f'''"""Test-only packages are not installed here (tests/test_bench_imports.py)."""
import sys

BLOCKED = {sorted(blocked)!r}


class _NotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled)
''')
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": os.environ["PATH"], "PYTHONPATH": str(where)}


def run_bench(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_blocker_works(runtime_only_env):
    """Without this, the runs below would prove nothing: pytest and the suite do not import in
    them, the runtime packages do."""
    done = run_bench(runtime_only_env, "-c", "import django, channels, psycopg, pymongo, uvicorn\n"
                     "for name in ('pytest', 'tests.live_server', 'playwright.sync_api'):\n"
                     "    try:\n        __import__(name)\n    except ModuleNotFoundError as exc:\n"
                     "        print('missing', exc.name)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["missing pytest", "missing tests", "missing playwright", ""]


@pytest.mark.parametrize("script", readme_benchmarks())
def test_every_readme_benchmark_starts_without_the_test_install(runtime_only_env, script):
    done = run_bench(runtime_only_env, script, "--help", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout
    assert done.stderr == ""


def test_the_readme_names_the_benchmarks():
    assert readme_benchmarks() == ["bench/api_cost.py", "bench/big_board.py", "bench/board.py", "bench/board_at.py", "bench/bulk.py",
                                   "bench/claims.py", "bench/fairness.py", "bench/http_claims.py", "bench/idle_agents.py", "bench/insights.py",
                                   "bench/pg_jit.py", "bench/py_spy_summary.py", "bench/search.py"]


def test_http_claims_runs_a_real_server_without_the_test_install(runtime_only_env, tmp_path):
    """The command the issue found failing (`No module named 'pytest'`), at its smallest: the
    board's server (harness.board_server.BoardServer) on SQLite, one agent process for 1 s, one
    round of each mode ((a) claim then complete, (b) complete-and-claim-next, (c) batches) and
    the bare view beside it, with (b)'s and (c)'s moves as plain SQL on the bare view's server
    (bench/bare_urls.py). The benchmark exits 1 on a double claim, a fault or a database that
    does not hold what the agents counted, and prints its rows."""
    done = run_bench(runtime_only_env, "bench/http_claims.py", "--backends", "sqlite", "--agents", "1",
                     "--seconds", "1", "--rounds", "1", "--bare-seconds", "1", "--no-daphne", "--no-ceiling",
                     "--no-inprocess", "--dir", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    # its table's row: backend, server worker processes, agents, cycles/s, ...
    row = re.search(r"^sqlite +\d+ +1 +([\d,]+) ", done.stdout, flags=re.MULTILINE)
    assert row, done.stdout
    assert int(row.group(1).replace(",", "")) > 0  # cycles/s: claims were completed through the server
    # issue 34's table: each mode's tasks/s and server CPU ms per completed task (from /proc)
    for run in ("(a) claim, then complete", "(b) complete-and-claim-next", "(c) batches of 10",
                "bare view (GET /api/bare)", "plain SQL (b), bare server", "plain SQL (c), bare server"):
        row = re.search(rf"^sqlite +\d+ +1  {re.escape(run)} +1 +([\d,]+) \[[\d,]+-[\d,]+\] +[\d.]+ +([\d.]+) \[",
                        done.stdout, flags=re.MULTILINE)
        assert row, (run, done.stdout)
        assert int(row.group(1).replace(",", "")) > 0 and float(row.group(2)) > 0, row.group(0)


def test_api_cost_splits_a_request_without_the_test_install(runtime_only_env, tmp_path):
    """bench/api_cost.py at its smallest, on SQLite: it drives real claim and complete requests
    through Django's WSGI handler (it exits non-zero if one is not answered 200) and prints the
    split of their CPU."""
    done = run_bench(runtime_only_env, "bench/api_cost.py", "--backends", "sqlite", "--cycles", "30",
                     "--dir", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for label in ("bare view, whole middleware stack", "raw driver", "raw driver, \\(b\\)'s two moves in one",
                  "engine verb", "key check",
                  "input parsing", "rendering", "the rest"):
        assert re.search(rf"^ +{label}.* (\d+\.\d+) ms", done.stdout, flags=re.MULTILINE), (label, done.stdout)
    ratio = re.search(r"^ +bare / ours +(\d+\.\d+)", done.stdout, flags=re.MULTILINE)
    assert ratio and float(ratio.group(1)) > 0, done.stdout


def test_the_board_benchmark_names_the_test_install_when_playwright_is_missing(runtime_only_env):
    """bench/board.py's page load needs Playwright (requirements-test.txt): it says so, and
    where it comes from, instead of a ModuleNotFoundError."""
    done = run_bench(runtime_only_env, "bench/board.py", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("NOT RUN: the page load (playwright does not import"), done.stdout
    assert "requirements-test.txt" in done.stdout and "make test" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr


def test_the_mongodb_rows_name_the_test_install_when_secantus_is_missing(runtime_only_env):
    """bench/claims.py --backends mongodb without a replica set needs SecantusDB
    (requirements-test.txt): it skips the rows saying so."""
    assert "TEST_MONGO_URL" not in runtime_only_env
    done = run_bench(runtime_only_env, "bench/claims.py", "--backends", "mongodb", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("NOT RUN: the MongoDB rows were skipped (TEST_MONGO_URL is not set and "
                                  "SecantusDB is not installed; it comes with requirements-test.txt"), done.stdout
    assert "Traceback" not in done.stderr, done.stderr
