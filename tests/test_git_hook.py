"""examples/git-hooks/pre-push against a real server and real git repositories (issue 32,
item 1): a push is accepted while the pushing agent's lease (task and fence) holds the branch's
resource, and refused once that lease was taken over, with the new holder named."""
from __future__ import annotations

import os
import shutil
import subprocess

from board import agent_keys
from taskflow_client import Client
from tests.live_server import ROOT, board_server  # noqa: F401  (fixture)
from tests.support import expire_lease, sqlite_db_mark

pytestmark = sqlite_db_mark()

HOOK = ROOT / "examples" / "git-hooks" / "pre-push"


def git(cwd, *args, env=None, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=check)


def test_a_push_from_a_holder_whose_lease_was_taken_over_is_refused(board_server, tmp_path):  # noqa: F811
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "a@x",
            "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "a@x", "GIT_CONFIG_NOSYSTEM": "1"}
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote), env=base)
    git(tmp_path, "clone", "-q", str(remote), str(work), env=base)
    git(work, "checkout", "-q", "-b", "main", env=base)
    shutil.copy(HOOK, work / ".git" / "hooks" / "pre-push")

    _, creator_key = agent_keys.create_key("creator")
    _, key_1 = agent_keys.create_key("agent-1")
    _, key_2 = agent_keys.create_key("agent-2")
    Client(board_server.url, creator_key).create({"id": "ship", "title": "ship it", "resources": ["branch:main"]})
    first = Client(board_server.url, key_1).claim("ship", ttl_seconds=60)
    assert first.holds("branch:main") is True

    def push(key: str, fence: int | None, message: str) -> subprocess.CompletedProcess:
        (work / "log.txt").open("a").write(message + "\n")
        git(work, "add", "log.txt", env=base)
        git(work, "commit", "-q", "-m", message, env=base)
        lease = {} if fence is None else {"TASKFLOW_TASK": "ship", "TASKFLOW_FENCE": str(fence)}
        env = {**base, "TASKFLOW_URL": board_server.url, "TASKFLOW_KEY": key, **lease}
        return git(work, "push", "-q", "origin", "main", env=env, check=False)

    def remote_head() -> str:
        return git(remote, "rev-parse", "main", env=base).stdout.strip()

    pushed = push(key_1, first.fence, "first holder's work")
    assert pushed.returncode == 0, pushed.stderr
    assert remote_head() == git(work, "rev-parse", "HEAD", env=base).stdout.strip()

    expire_lease("ship")  # the first holder stopped renewing; another agent takes the task over
    second = Client(board_server.url, key_2).claim("ship", ttl_seconds=60)
    assert second.fence == first.fence + 1
    before = remote_head()
    late = push(key_1, first.fence, "the stale holder's late work")
    assert late.returncode != 0
    assert "pre-push: refused: task ship with fence 1 does not hold branch:main; it is held by agent-2 (task ship, " \
           "fence 2)" in late.stderr
    assert remote_head() == before  # nothing reached the remote

    unleased = push(key_1, None, "no lease at all")
    assert unleased.returncode != 0 and "no lease" in unleased.stderr
    assert remote_head() == before

    git(work, "reset", "-q", "--hard", before, env=base)
    pushed = push(key_2, second.fence, "the new holder's work")
    assert pushed.returncode == 0, pushed.stderr
    assert remote_head() != before
