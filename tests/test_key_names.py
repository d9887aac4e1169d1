"""One live key per agent name (issue 27, item 14), against the real server (`manage.py serve`)
on the real SQLite database, the real `create_agent_key` command, and races on SQLite and
PostgreSQL.

The history records an agent by its key's name, and the holder's verbs check that a lease's
owner is the caller's name: a second live key for `worker-1` would act as `worker-1` in every
respect. So minting a key for a name that has a live key is refused (the admin's form, the
command), unless the key is rotated: rotation, which needs board.change_agentkey besides
board.add_agentkey, makes the new key and ends the old one at now + a grace the operator
chooses. The database holds the rule (AgentKey.live_name is unique), so concurrent mints
cannot both win; an ended key is refused by every server process, the hot verbs' one-minute
memory of verified keys included.
"""
from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connections
from django.utils import timezone

from board import agent_keys
from board.engine import errors
from board.models import AgentKey
from harness.board_server import ROOT, server_env
from tests.live_server import BoardServer, api_call, board_server, one_process_server  # noqa: F401  (fixtures)
from tests.support import database_url, race, sql_stores
from tests.test_access_api import Browser, person

KEY_ADD = "/admin/board/agentkey/add/"
CLERK = ["board.view_agentkey", "board.add_agentkey"]
ROTATOR = [*CLERK, "board.change_agentkey"]


def live_keys(name: str, using: str = "default") -> list[str]:
    """The prefixes of the keys named `name` that the board still takes."""
    now = timezone.now()
    return sorted(k.prefix for k in AgentKey.objects.using(using).filter(name=name)
                  if k.revoked_at is None or k.revoked_at > now)


def post_add_form(browser: Browser, fields: dict) -> tuple[int, str]:
    """The Keys admin's add form, filled in and sent as a browser does: (status, page)."""
    status, _, page = browser.request("GET", KEY_ADD)
    assert status == 200, status
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
    status, _, page = browser.request("POST", KEY_ADD, urlencode({**fields, "csrfmiddlewaretoken": token}),
                                      {"Content-Type": "application/x-www-form-urlencoded"})
    return status, page.decode()


def minted_key(page: str) -> str | None:
    found = re.search(rf"({re.escape(agent_keys.KEY_PREFIX)}[A-Za-z0-9_-]{{20,}})", page)
    return found.group(1) if found else None


@pytest.fixture
def admin_server(django_db_setup):
    """A server of this test's own: the admin's add view writes a LogEntry naming the key's
    content type, which a module's server would keep cached from a previous test across the
    test database's flush (which renumbers the content types)."""
    server = BoardServer(database_url(connections["default"].settings_dict)).start()
    try:
        yield server
    finally:
        server.close()


def run_command(server, *args: str) -> subprocess.CompletedProcess:
    """`manage.py create_agent_key ...` as its own process, on the server's database."""
    return subprocess.run([sys.executable, "manage.py", "create_agent_key", *args], cwd=ROOT,
                          env=server_env(server.database_url, "x" * 50), capture_output=True, text=True,
                          timeout=60)


# ---------------------------------------------------------------------------------------------
# Minting a second key for a live name


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_clerk_cannot_mint_a_second_key_for_a_live_agent_name(admin_server):
    board_server = admin_server
    first, first_key = agent_keys.create_key("worker-1")
    clerk = Browser(board_server).login(person("clerk", CLERK))
    status, page = post_add_form(clerk, {"name": "worker-1"})
    assert status == 200
    assert minted_key(page) is None, "a second live key for worker-1 was minted"
    assert "worker-1" in page and "already has a live key" in page, page[-3000:]
    assert live_keys("worker-1") == [first.prefix]
    # The name is free again once its key is revoked.
    assert agent_keys.revoke(first.pk)
    status, page = post_add_form(clerk, {"name": "worker-1"})
    new_key = minted_key(page)
    assert status == 200 and new_key is not None
    assert api_call(board_server, "GET", "/api/tasks", new_key)[0] == 200
    assert api_call(board_server, "GET", "/api/tasks", first_key)[0] == 401


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_rotating_in_the_admin_needs_change_agentkey(admin_server):
    board_server = admin_server
    old, old_key = agent_keys.create_key("worker-2")
    clerk = Browser(board_server).login(person("clerk2", CLERK))
    status, _, page = clerk.request("GET", KEY_ADD)
    assert status == 200 and b'name="rotate"' not in page
    status, page = post_add_form(clerk, {"name": "worker-2", "rotate": "on", "grace_seconds": "0"})
    assert minted_key(page) is None
    assert "board.change_agentkey" in page
    assert live_keys("worker-2") == [old.prefix]

    rotator = Browser(board_server).login(person("rotator", ROTATOR))
    assert 'name="rotate"' in rotator.request("GET", KEY_ADD)[2].decode()
    status, page = post_add_form(rotator, {"name": "worker-2", "rotate": "on", "grace_seconds": "0"})
    new_key = minted_key(page)
    assert status == 200 and new_key is not None, re.findall(r"exception_value\">([^<]*)", page)
    assert api_call(board_server, "GET", "/api/tasks", new_key)[0] == 200
    assert api_call(board_server, "GET", "/api/tasks", old_key)[0] == 401
    assert len(live_keys("worker-2")) == 1


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_create_agent_key_refuses_a_live_name_unless_rotating(board_server):
    _, old_key = agent_keys.create_key("worker-3")
    refused = run_command(board_server, "worker-3")
    assert refused.returncode != 0
    assert "agent 'worker-3' already has a live key" in refused.stderr and "--rotate" in refused.stderr
    assert refused.stdout == ""
    assert AgentKey.objects.filter(name="worker-3").count() == 1

    rotated = run_command(board_server, "worker-3", "--rotate=3600")
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    assert new_key.startswith(agent_keys.KEY_PREFIX)
    old = AgentKey.objects.get(name="worker-3", live_name__isnull=True)
    ends_in = old.revoked_at - timezone.now()
    assert timedelta(minutes=59) < ends_in <= timedelta(hours=1), ends_in
    # Both work during the grace; the new one is the name's live key.
    assert api_call(board_server, "GET", "/api/tasks", old_key)[0] == 200
    assert api_call(board_server, "GET", "/api/tasks", new_key)[0] == 200
    assert AgentKey.objects.get(live_name="worker-3").prefix == new_key[:10]


# ---------------------------------------------------------------------------------------------
# A rotated key's end is honoured by every path, the hot verbs' memory included


def end_now(name: str) -> None:
    """Age a scheduled end into the past by writing the row (no waiting)."""
    assert AgentKey.objects.filter(name=name, live_name__isnull=True, revoked_at__isnull=False).update(
        revoked_at=timezone.now() - timedelta(seconds=1)) == 1


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_old_key_is_refused_once_its_grace_ends_even_by_the_hot_verbs_memory(one_process_server):
    server = one_process_server
    _, old_key = agent_keys.create_key("rotor")
    assert api_call(server, "POST", "/api/tasks", old_key, {"id": "r1", "title": "one"})[0] == 201
    assert api_call(server, "POST", "/api/tasks", old_key, {"id": "r2", "title": "two"})[0] == 201
    status, claim = api_call(server, "POST", "/api/claim", old_key, {"ttl_seconds": 600})
    assert status == 200, claim  # the server process now remembers the old key as verified
    _, new_key = agent_keys.create_key("rotor", rotate=timedelta(hours=1))
    # During the grace: the old key still renews its lease (from memory and in the statement).
    token = claim["lease"]["token"]
    status, _ = api_call(server, "POST", f"/api/tasks/{claim['task']['id']}/renew", old_key,
                         {"token": token, "ttl_seconds": 600})
    assert status == 200
    end_now("rotor")
    before = list(AgentKey.objects.values_list("pk", "last_used_at"))
    task_id = claim["task"]["id"]
    for method, path, body in [
        ("POST", "/api/claim", {"ttl_seconds": 60}),
        ("POST", f"/api/tasks/{task_id}/renew", {"token": token, "ttl_seconds": 60}),
        ("POST", f"/api/tasks/{task_id}/complete", {"token": token, "result": 1}),
        ("POST", f"/api/tasks/{task_id}/release", {"token": token}),
        ("GET", "/api/tasks", None),
    ]:
        status, answer = api_call(server, method, path, old_key, body)
        assert (status, answer["error"]["code"]) == (401, "unauthorized"), (path, status, answer)
    assert list(AgentKey.objects.values_list("pk", "last_used_at")) == before
    # The new key acts as the same agent: it may complete the lease the old key took.
    status, done = api_call(server, "POST", f"/api/tasks/{task_id}/complete", new_key, {"token": token, "result": 1})
    assert (status, done["stage"]) == (200, "COMPLETED"), done


# ---------------------------------------------------------------------------------------------
# The database decides: concurrent mints for one name


MINT_ROUNDS = 30


@pytest.mark.parametrize("alias", sql_stores())
def test_concurrent_mints_for_one_name_make_exactly_one_key(alias):
    threads = 8
    for round_ in range(MINT_ROUNDS):
        name = f"racer-{round_}"
        results = race([lambda: agent_keys.create_key(name, using=alias)] * threads, alias)
        won = [r for r in results if isinstance(r, tuple)]
        refused = [r for r in results if isinstance(r, errors.InvalidRequest)]
        others = [r for r in results if not isinstance(r, tuple | errors.InvalidRequest)]
        assert others == [], others  # an infrastructure fault is never a loser
        assert len(won) == 1, f"{len(won)} keys minted for {name}"
        assert len(refused) == threads - 1
        assert all("already has a live key" in r.message for r in refused)
        assert AgentKey.objects.using(alias).filter(name=name).count() == 1


@pytest.mark.parametrize("alias", sql_stores())
def test_concurrent_rotations_leave_one_key_without_an_end(alias):
    threads = 6
    agent_keys.create_key("spinner", using=alias)
    results = race([lambda: agent_keys.create_key("spinner", rotate=timedelta(0), using=alias)] * threads, alias)
    won = [r for r in results if isinstance(r, tuple)]
    others = [r for r in results if not isinstance(r, tuple | errors.InvalidRequest)]
    assert others == [], others
    assert len(won) >= 1
    rows = AgentKey.objects.using(alias).filter(name="spinner")
    assert rows.count() == 1 + len(won)
    assert rows.filter(live_name="spinner", revoked_at__isnull=True).count() == 1
    assert rows.filter(revoked_at__isnull=True).count() == 1


@pytest.mark.parametrize("alias", sql_stores())
def test_revoking_frees_the_name_and_a_scheduled_end_can_be_brought_forward(alias):
    row, key = agent_keys.create_key("freed", using=alias)
    new_row, _ = agent_keys.create_key("freed", rotate=timedelta(hours=2), using=alias)
    assert agent_keys.authenticate(key, using=alias) is not None  # within its grace
    assert agent_keys.revoke(row.pk, using=alias)  # ends it now
    assert agent_keys.authenticate(key, using=alias) is None
    assert not agent_keys.revoke(row.pk, using=alias)
    assert agent_keys.revoke(new_row.pk, using=alias)
    agent_keys.create_key("freed", using=alias)
    assert AgentKey.objects.using(alias).filter(live_name="freed").count() == 1



# The hot verbs' own statements (the store's statements, "auto") and the ORM path ("orm") on each
# SQL store: a key whose end has passed is refused by the move, which writes nothing.

PATHS = [pytest.param(alias, path, marks=store.marks, id=f"{store.id}-{path}")
         for store in sql_stores() for alias in [store.values[0]] for path in ("auto", "orm")]


@pytest.mark.parametrize(("alias", "path"), PATHS)
def test_the_moves_refuse_a_key_whose_scheduled_end_has_passed(alias, path, settings):
    from board.engine import transitions
    from board.engine.tokens import hash_token
    from board.engine.transitions import TaskSpec
    from board.models import Task

    settings.TASKFLOW = {**settings.TASKFLOW, "HOT_PATH": path}
    transitions.create([TaskSpec(id="a", title="a"), TaskSpec(id="b", title="b")], actor="t", using=alias)
    _, old_key = agent_keys.create_key("mover", using=alias)
    old_hash = hash_token(old_key)
    claim = transitions.claim_next("mover", 60, key_hash=old_hash, using=alias)
    assert claim is not None
    agent_keys.create_key("mover", rotate=timedelta(hours=1), using=alias)
    # Within the grace the old key still moves.
    transitions.renew(claim.task.pk, claim.lease.token, 60, agent="mover", key_hash=old_hash, using=alias)
    assert AgentKey.objects.using(alias).filter(key_hash=old_hash).update(
        revoked_at=timezone.now() - timedelta(seconds=1)) == 1
    before = list(Task.objects.using(alias).order_by("pk").values_list("pk", "version", "stage"))
    with pytest.raises(errors.KeyRevoked):
        transitions.claim_next("mover", 60, key_hash=old_hash, using=alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.renew(claim.task.pk, claim.lease.token, 60, agent="mover", key_hash=old_hash, using=alias)
    with pytest.raises(errors.KeyRevoked):
        transitions.complete(claim.task.pk, claim.lease.token, 1, agent="mover", key_hash=old_hash, using=alias)
    assert list(Task.objects.using(alias).order_by("pk").values_list("pk", "version", "stage")) == before


@pytest.mark.parametrize("alias", sql_stores())
def test_the_migration_keeps_the_oldest_live_key_of_a_shared_name_and_ends_the_others_in_a_day(alias):
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[alias]
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("board")
    before = ("board", "0008_removed_task")
    now = timezone.now()
    try:
        executor.migrate([before])
        OldKey = executor.loader.project_state([before]).apps.get_model("board", "AgentKey")
        for n, (name, revoked) in enumerate([("dup", None), ("dup", None), ("dup", None), ("solo", None),
                                             ("gone", now), ("gone", None)]):
            OldKey.objects.using(alias).create(name=name, prefix=f"tfk_{n}", key_hash=f"h{n}", revoked_at=revoked,
                                               created_at=now + timedelta(seconds=n))
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    keys = {k.key_hash: k for k in AgentKey.objects.using(alias).all()}
    assert {h: k.live_name for h, k in keys.items()} == {
        "h0": "dup", "h1": None, "h2": None, "h3": "solo", "h4": None, "h5": "gone"}
    for ended in ("h1", "h2"):
        assert timedelta(hours=23) < keys[ended].revoked_at - now <= timedelta(days=1, minutes=5)
    assert keys["h4"].revoked_at == now and keys["h0"].revoked_at is None
