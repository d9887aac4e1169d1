"""Who may do what in the operators' admin (issues 7 and 10), through the real admin with
logged-in users on the real SQLite test database.

- A query-string filter never reaches a stored hash (an agent key's, a lease token's), on any
  admin, directly or through a relation: such a lookup is refused (400) and nothing is listed.
- Minting an operator key needs board.intervene; agent names that the history could confuse
  with the system or a person (`system`, `admin`, existing usernames) are refused.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from board import agent_keys
from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import AgentKey, Task
from tests.support import sqlite_db_mark

pytestmark = sqlite_db_mark()

TASKS = reverse("admin:board_task_changelist")
KEYS = reverse("admin:board_agentkey_changelist")
KEY_ADD = reverse("admin:board_agentkey_add")


class HttpsClient(Client):
    def generic(self, method, path, data="", content_type="application/octet-stream", secure=False, **extra):
        return super().generic(method, path, data, content_type, True, **extra)


def make_user(username: str, perms: list[str], *, superuser: bool = False) -> User:
    user = User.objects.create_user(username, password="x", is_staff=True, is_superuser=superuser)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return User.objects.get(pk=user.pk)


def client_for(user: User) -> HttpsClient:
    client = HttpsClient()
    client.force_login(user)
    return client


@pytest.fixture
def root() -> HttpsClient:
    return client_for(make_user("root", [], superuser=True))


def listed_keys(response) -> list[str]:
    return sorted(str(key) for key in response.context["cl"].result_list)


# ---------------------------------------------------------------------------------------------
# Issue 10: no filter on a hash


@pytest.mark.parametrize("lookup", ["key_hash__startswith", "key_hash", "key_hash__regex", "key_hash__gt"])
def test_a_filter_on_a_key_hash_is_refused(root, lookup):
    target, _ = agent_keys.create_key("target")
    agent_keys.create_key("other")
    prefix = target.key_hash[:8] if lookup != "key_hash" else target.key_hash
    value = f"^{prefix}" if lookup.endswith("regex") else prefix
    response = root.get(KEYS, {lookup: value})
    assert response.status_code == 400, (response.status_code, listed_keys(response))


@pytest.mark.parametrize("lookup", ["lease_token_hash__startswith", "lease_token_hash__isnull",
                                    "dependencies__depends_on__lease_token_hash__startswith",
                                    "dependents__task__lease_token_hash__startswith",
                                    "events__task__lease_token_hash__startswith"])
def test_a_filter_on_a_lease_token_hash_is_refused(root, lookup):
    transitions.create([TaskSpec(id="a", title="a"), TaskSpec(id="b", title="b", deps=("a",))], actor="t")
    transitions.create([TaskSpec(id="c", title="c")], actor="t")
    claim = transitions.claim("a", "agent", 60)
    hash_prefix = Task.objects.get(pk="a").lease_token_hash[:8]
    assert claim.task.pk == "a"
    value = "False" if lookup.endswith("isnull") else hash_prefix
    response = root.get(TASKS, {lookup: value})
    assert response.status_code == 400, (response.status_code, [t.pk for t in response.context["cl"].result_list])


def test_the_unfiltered_lists_still_work(root):
    agent_keys.create_key("k1")
    assert root.get(KEYS).status_code == 200
    assert root.get(KEYS, {"is_operator__exact": "0", "state": "live"}).status_code == 200
    transitions.create([TaskSpec(id="t", title="t")], actor="x")
    assert root.get(TASKS, {"stage__exact": "QUEUED"}).status_code == 200
    assert AgentKey.objects.count() == 1


# ---------------------------------------------------------------------------------------------
# Issue 7: operator keys need board.intervene; reserved agent names

KEY_CLERK = ["board.view_agentkey", "board.add_agentkey"]


def test_add_agentkey_alone_cannot_mint_an_operator_key():
    clerk = client_for(make_user("clerk", KEY_CLERK))
    form = clerk.get(KEY_ADD)
    assert form.status_code == 200
    assert 'name="is_operator"' not in form.content.decode()
    refused = clerk.post(KEY_ADD, {"name": "sneaky", "is_operator": "on"})
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors == {
        "__all__": ["Only a user with the board.intervene permission may create an operator key."]}
    assert not AgentKey.objects.exists()
    plain = clerk.post(KEY_ADD, {"name": "worker-1"})
    assert plain.status_code == 200 and plain.context["key"].startswith(agent_keys.KEY_PREFIX)
    assert list(AgentKey.objects.values_list("name", "is_operator")) == [("worker-1", False)]


def test_intervene_mints_an_operator_key():
    boss = client_for(make_user("boss", [*KEY_CLERK, "board.intervene"]))
    assert 'name="is_operator"' in boss.get(KEY_ADD).content.decode()
    made = boss.post(KEY_ADD, {"name": "op-agent", "is_operator": "on"})
    assert made.status_code == 200 and "key" in made.context
    assert list(AgentKey.objects.values_list("name", "is_operator")) == [("op-agent", True)]


@pytest.mark.parametrize("name", ["system", "System", "admin", "ADMIN", "system:reaper", "root", "Root"])
def test_reserved_and_user_names_are_refused_by_the_admin(root, name):
    response = root.post(KEY_ADD, {"name": name})
    assert response.status_code == 200
    [message] = response.context["adminform"].form.errors["name"]
    assert message.startswith(f"agent name {name!r} is reserved"), message
    assert not AgentKey.objects.exists()


@pytest.mark.parametrize("name", ["system", "admin", "system:retry", "alice", "ALICE"])
def test_reserved_and_user_names_are_refused_by_create_agent_key(name):
    from django.core.management import CommandError, call_command

    User.objects.create_user("alice", password="x")
    with pytest.raises(CommandError, match=f"agent name {name!r} is reserved"):
        call_command("create_agent_key", name)
    assert not AgentKey.objects.exists()
