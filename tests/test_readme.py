"""The `manage.py` commands of README.md and docs/*.md work exactly as written, in a shell with
nothing exported, in a checkout `make run` has prepared (a copy of this one, so that the test touches neither
this checkout's database nor its files)."""
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.live_server import LineReader, free_port

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "__pycache__", ".pytest_cache", ".secret_key", ".taskflow-dev", ".staticfiles"}


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The README's walk: the block an agent's first task runs in (key, create, worker).
AGENT_HEADING = "### 3. Create a key, and let an agent claim and complete a task"


def readme_manage_lines() -> list[str]:
    """Every command line of the shell blocks of README.md and docs/*.md that runs `manage.py`,
    comment removed (a command shown on two pages runs once)."""
    lines = []
    for page in PAGES:
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.DOTALL):
            for line in block.splitlines():
                command = line.split("  #", 1)[0].strip()
                if command.startswith(".venv/bin/python manage.py") and command not in lines:
                    lines.append(command)
    return lines


def copy_project(where: Path) -> Path:
    """A fresh clone's files at `where` (no database, no secret, no development mark), with
    this checkout's .venv linked in (mtimes kept, so `make run` finds its requirements installed)."""
    shutil.copytree(ROOT, where, ignore=lambda _, names: [n for n in names if n in SKIP or n.startswith("db.sqlite3")])
    (where / ".venv").symlink_to(ROOT / ".venv")
    return where


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the project, prepared as `make run` prepares it (venv, development mark,
    migrated database), without starting the server."""
    where = copy_project(tmp_path_factory.mktemp("readme") / "p")
    make_run = subprocess.run(["make", "-n", "run"], check=False, cwd=where, capture_output=True, text=True, timeout=60)
    assert "touch .taskflow-dev" in make_run.stdout  # what `make run` does, done here by hand:
    (where / ".taskflow-dev").touch()
    migrated = run(where, ".venv/bin/python manage.py migrate --noinput")
    assert migrated.returncode == 0, migrated.stderr
    return where


def nothing_exported() -> dict:
    """The environment of a new terminal: no DEBUG, DATABASE_URL, SECRET_KEY... of this run."""
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": os.environ["PATH"]}


def run(where: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], check=False, cwd=where, env=nothing_exported(),
                          capture_output=True, text=True, timeout=300)


def test_the_readme_shows_its_manage_commands():
    assert {line.split()[2] for line in readme_manage_lines()} >= {
        "create_agent_key", "check_board", "contract_check", "reap", "demo", "prune", "api_schema"}


@pytest.mark.parametrize("command", readme_manage_lines())
def test_each_readme_manage_command_runs_as_written(checkout, command):
    done = run(checkout, command)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"


def test_the_readme_key_line_gives_the_key_itself(checkout):
    done = run(checkout, "TASKFLOW_KEY=$(.venv/bin/python manage.py create_agent_key worker-2); echo \"[$TASKFLOW_KEY]\"")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\[tfk_[A-Za-z0-9_-]{20,}\]\n", done.stdout), done.stdout


def test_outside_a_marked_checkout_debug_stays_off(checkout):
    (checkout / ".taskflow-dev").rename(checkout / "unmarked")
    try:
        done = run(checkout, ".venv/bin/python manage.py check_board")
        assert done.returncode != 0 and "SECRET_KEY is not set" in done.stderr
    finally:
        (checkout / "unmarked").rename(checkout / ".taskflow-dev")


def readme_agent_block() -> str:
    """The README's shell block under AGENT_HEADING, as written (docs/client.md points there)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n{AGENT_HEADING}\n", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL).group(1)


def test_the_readme_agent_block_runs_as_written_against_the_server(checkout):
    """The three lines of the README's walk, in one bash with nothing exported, against the
    server `make run` starts (its `manage.py serve` line, taken from `make -n run`) on the
    prepared copy: the task they create ends COMPLETED by the example worker."""
    block = readme_agent_block()
    assert "TASKFLOW_URL=http://127.0.0.1:8000 " in block and "examples/worker.py" in block
    port = free_port()
    recipe = subprocess.run(["make", "-n", "run", f"PORT={port}"], check=False, cwd=checkout,
                            capture_output=True, text=True, timeout=60).stdout
    [serve] = [line.strip().removeprefix("exec ") for line in recipe.splitlines() if "manage.py serve" in line]
    assert serve.startswith(".venv/bin/python manage.py serve ") and f"--port {port}" in serve, serve
    server = subprocess.Popen(["bash", "-c", f"exec {serve}"], cwd=checkout, env=nothing_exported(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True, start_new_session=True)
    try:
        lines = LineReader(server.stdout)
        while True:
            line = lines.next(timeout=120)
            assert line is not None, "the server printed no banner within 120 s"
            if line.startswith("TaskFlow board is ready"):
                break
        # The only change to the block: the free port this test's server listens on, not 8000.
        script = block.replace("http://127.0.0.1:8000 ", f"http://127.0.0.1:{port} ")
        done = subprocess.run(["bash", "-c", script + "python3 -m taskflow_client get t1\n"], check=False,
                              cwd=checkout, env=nothing_exported(), capture_output=True, text=True, timeout=120)
        # stderr: only create_agent_key's note that the key is shown once (the key is on stdout)
        noted = [line for line in done.stderr.splitlines() if not re.fullmatch(r"key tfk_\S+ for agent 'py-worker'.*", line)]
        assert done.returncode == 0 and noted == [], f"{script}\n{done.stdout}\n{done.stderr}"
        out = done.stdout.splitlines()
        assert json.loads(out[0])["id"] == "t1"  # created
        assert out[1] == "worker: 1 task(s) completed"
        task = json.loads(out[2])
        assert (task["stage"], task["queue"], task["result"]) == ("COMPLETED", "examples", {"double": 42})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        finally:
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
