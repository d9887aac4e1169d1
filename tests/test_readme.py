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
# ... and the block after it that shares the key: two workers and a merge slot.
RESOURCES_HEADING = "### 6. Two workers and a merge slot"


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


def readme_agent_block(heading: str = AGENT_HEADING) -> str:
    """The README's shell block under `heading`, as written (docs/client.md points there)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
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
        # Then step 6 in the same terminal (it uses step 3's key): each line as written, its exit
        # status printed after it.
        step_6 = [line for line in readme_agent_block(RESOURCES_HEADING).splitlines() if line.strip()]
        script += "python3 -m taskflow_client get t1\n" + "".join(f'{line}\necho "[exit $?]"\n' for line in step_6)
        done = subprocess.run(["bash", "-c", script], check=False,
                              cwd=checkout, env=nothing_exported(), capture_output=True, text=True, timeout=120)
        # stderr: only create_agent_key's note that the key is shown once (the key is on stdout)
        noted = [line for line in done.stderr.splitlines() if not re.fullmatch(r"key tfk_\S+ for agent 'py-worker'.*", line)
                 and line != "no work: no task is ready"]  # step 6's second claim says so
        assert done.returncode == 0 and noted == [], f"{script}\n{done.stdout}\n{done.stderr}"
        out = done.stdout.splitlines()
        assert json.loads(out[0])["id"] == "t1"  # created
        assert out[1] == "worker: 1 task(s) completed"
        task = json.loads(out[2])
        assert (task["stage"], task["queue"], task["result"]) == ("COMPLETED", "examples", {"double": 42})

        # Step 6: the create, worker 1's claim, worker 2's (no work: exit 3), the resources.
        # (curl's answer ends without a newline: its status follows on the same line.)
        out = "\n".join(out[3:]).replace("[exit", "\n[exit").split("\n")
        out = [line for line in out if line]
        assert [line for line in out if line.startswith("[exit")] == ["[exit 0]", "[exit 0]", "[exit 3]", "[exit 0]"], (
            script, done.stdout, done.stderr)
        created, claimed, listed = [json.loads(out[0]), json.loads(out[1])], json.loads(out[3]), json.loads(out[6])
        assert [(t["id"], t["resources"]) for t in created] == [("m1", ["merge-slot"]), ("m2", ["merge-slot"])]
        assert (claimed["task"]["id"], claimed["task"]["owner"]) == ("m1", "py-worker")
        [slot] = [r for r in listed["items"] if r["name"] == "merge-slot"]
        assert [(h["task"], h["agent"]) for h in slot["holders"]] == [("m1", "py-worker")]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        finally:
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
