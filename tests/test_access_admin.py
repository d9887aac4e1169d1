"""Who may do what in the operators' admin (issues 7 and 10), through the real admin with
logged-in users on the real SQLite test database.

- A query-string filter never reaches a secret-derived column (an agent key's hash, a lease
  token's, a claim request's seed and hash), on any admin, directly or through a relation: such a
  lookup is refused (400) and nothing is listed (issues 10 and 27). Every column whose name sounds
  secret is declared secret or harmless (board/admin/secret_columns.py); a walk of the models
  fails on one that is neither.
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


# ---------------------------------------------------------------------------------------------
# Issue 27, item 8: no lookup on any secret-derived column, for a staff user who may only look

SEED_LOOKUPS = ["claim_token_seed__gte", "claim_token_seed__lt", "claim_token_seed__startswith",
                "claim_token_seed__regex", "claim_token_seed__iregex", "claim_token_seed__contains",
                "claim_token_seed", "claim_token_seed__in", "claim_token_seed__isnull",
                "claim_request_hash__gte", "claim_request_hash__startswith", "claim_request_hash__regex",
                "claim_request_hash", "lease_token_hash__gte", "lease_token_hash__endswith",
                "dependencies__depends_on__claim_token_seed__gte",
                "dependents__task__claim_request_hash__startswith",
                "events__task__claim_token_seed__gte"]


def seeded_lease() -> Task:
    """Three tasks, one RUNNING under a lease made with a claim request (its seed and request
    hash stored), the attacker's target."""
    transitions.create([TaskSpec(id="x1", title="x1"), TaskSpec(id="x2", title="x2"),
                        TaskSpec(id="x3", title="x3", deps=("x1",))], actor="t")
    transitions.claim("x1", "agent", 600, request_id="a-request-id-nobody-knows")
    target = Task.objects.get(pk="x1")
    assert target.claim_token_seed and target.claim_request_hash
    return target


def probe_value(lookup: str, target: Task) -> str:
    """A value that, were the lookup applied, would narrow the list to the target (or away from it)."""
    column = next(c for c in ("claim_token_seed", "claim_request_hash", "lease_token_hash") if c in lookup)
    secret = getattr(target, column)
    suffix = lookup.split(f"{column}", 1)[1]
    if suffix in ("__regex", "__iregex"):
        return f"^{secret[:4]}"
    if suffix == "__isnull":
        return "False"
    if suffix in ("", "__in"):
        return secret
    if suffix == "__endswith":
        return secret[-4:]
    return secret[:4]


@pytest.mark.parametrize("lookup", SEED_LOOKUPS)
def test_a_viewer_cannot_filter_on_a_lease_seed_or_request_hash(lookup):
    """The review's attack: a staff user with only board.view_task bisects a live lease's seed
    with ?claim_token_seed__gte= (258 requests recovered it). Every such lookup is refused."""
    target = seeded_lease()
    viewer = client_for(make_user("viewer", ["board.view_task"]))
    assert viewer.get(TASKS).status_code == 200  # the viewer does see the list
    response = viewer.get(TASKS, {lookup: probe_value(lookup, target)})
    listed = [t.pk for t in response.context["cl"].result_list] if response.context else None
    assert response.status_code == 400, (response.status_code, listed)
    assert b"x2" not in response.content and b"x1" not in response.content


def project_models() -> list:
    """Every model of the installed apps but the test suite's own."""
    from django.apps import apps

    return [m for m in apps.get_models() if not m.__module__.startswith("tests.")]


def test_every_secret_sounding_column_is_declared_secret_or_harmless():
    """A field whose name sounds secret (token, seed, hash, key, secret, ...) on any model must be
    declared in board/admin/secret_columns.py: a new secret column cannot go unrefused."""
    from board.admin.secret_columns import HARMLESS_COLUMNS, SECRET_COLUMNS, SECRET_SOUNDING

    for word in ("token", "seed", "hash", "key", "secret"):
        assert SECRET_SOUNDING.search(f"some_{word}_column"), word
    sounding = {(model._meta.label, field.name) for model in project_models()
                for field in model._meta.get_fields(include_hidden=True) if SECRET_SOUNDING.search(field.name)}
    undeclared = sounding - set(SECRET_COLUMNS) - set(HARMLESS_COLUMNS)
    assert not undeclared, f"declare these in board/admin/secret_columns.py (secret, or harmless and why): {undeclared}"
    assert not set(SECRET_COLUMNS) & set(HARMLESS_COLUMNS)
    # And every declaration names a real column (a renamed one is not silently unguarded).
    existing = {(model._meta.label, field.name) for model in project_models() for field in model._meta.get_fields()}
    assert set(SECRET_COLUMNS) | set(HARMLESS_COLUMNS) <= existing
    assert {name for _, name in sounding} >= {"claim_token_seed", "claim_request_hash", "lease_token_hash", "key_hash"}


def test_an_undeclared_secret_sounding_step_is_refused_too():
    """Fail closed: a column added with a secret-sounding name is refused even before anyone
    declares it (the walk above then asks for the declaration)."""
    from board.admin.secret_columns import names_a_secret

    assert names_a_secret("new_api_token__gte") and names_a_secret("events__signing_secret")
    assert names_a_secret("dependencies__depends_on__claim_token_seed__startswith")
    assert not names_a_secret("prefix__startswith") and not names_a_secret("stage__exact")


LOOKUP_SUFFIXES = ["", "__exact", "__gte", "__lt", "__startswith", "__istartswith", "__regex", "__iregex",
                   "__contains", "__in", "__isnull", "__range", "__endswith"]


def secret_paths(model) -> list[str]:
    """Every secret column of `model`, and of each model one relation away (forward or reverse),
    as a lookup path from `model`."""
    from board.admin.secret_columns import SECRET_COLUMNS

    def secrets_of(m) -> list[str]:
        return [name for label, name in SECRET_COLUMNS if label == m._meta.label]

    paths = secrets_of(model)
    for field in model._meta.get_fields():
        if field.is_relation and field.related_model is not None:
            paths += [f"{field.name}__{name}" for name in secrets_of(field.related_model)]
            for far in field.related_model._meta.get_fields():  # two steps: task -> dependencies -> depends_on
                if far.is_relation and far.related_model is not None:
                    paths += [f"{field.name}__{far.name}__{name}" for name in secrets_of(far.related_model)]
    return paths


def test_every_admin_refuses_every_lookup_on_every_secret_column():
    """On every registered ModelAdmin (ours and Django's), each secret column reachable from its
    model, directly or through one or two relations, with every lookup: refused."""
    from django.contrib import admin
    from django.test import RequestFactory

    request = RequestFactory().get("/")
    request.user = make_user("root2", [], superuser=True)
    checked = 0
    for model, model_admin in admin.site._registry.items():
        for path in secret_paths(model):
            for suffix in LOOKUP_SUFFIXES:
                assert not model_admin.lookup_allowed(path + suffix, "x", request), (model._meta.label, path + suffix)
                checked += 1
    assert checked > 100  # Task's three secrets (and through its relations), AgentKey's, User's password


@pytest.fixture(scope="module")
def session_server(django_db_setup, django_db_blocker):
    from tests.live_server import server_for_sessions

    with django_db_blocker.unblock():
        server = server_for_sessions("default", args=["--workers", "1"])
    try:
        yield server
    finally:
        server.close()


def test_the_real_server_refuses_secret_lookups_to_a_viewer(session_server):
    """The same attack over HTTP against `manage.py serve`, with a browser's session of a staff
    user who has only board.view_task: every secret column, with a narrowing and a widening
    value for each lookup, answers 400 and lists no task; a harmless filter still lists."""
    import http.client
    from urllib.parse import urlencode

    from board.admin.secret_columns import SECRET_COLUMNS
    from tests.test_live_board import staff_session

    target = seeded_lease()
    _, session = staff_session("default")

    def get(query: dict) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", session_server.port, timeout=30)
        try:
            conn.request("GET", f"{TASKS}?{urlencode(query)}", headers={"Cookie": f"sessionid={session}"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    status, page = get({"stage__exact": "RUNNING"})
    assert status == 200 and b"/task/x1/change/" in page and b"/task/x2/change/" not in page  # the list, filtered
    columns = [name for label, name in SECRET_COLUMNS if label == "board.Task"]
    for column in columns:
        secret = getattr(target, column)
        for suffix, value in (("__gte", secret[:4]), ("__gte", "~"), ("__lt", secret[:4]), ("__startswith", secret[:2]),
                              ("__regex", f"^{secret[:2]}"), ("__iregex", "."), ("", secret), ("__isnull", "False"),
                              ("__in", secret)):
            status, page = get({f"{column}{suffix}": value})
            assert status == 400, (column + suffix, status)
            # (The answer under DEBUG is Django's technical page: it quotes source, not rows.)
            assert b"/task/x1/change/" not in page and b"/task/x2/change/" not in page, column + suffix
    assert sorted(columns) == ["claim_request_hash", "claim_token_seed", "lease_token_hash"]
