"""The admin's Resources page (issue 32, item 1) through the whole HTTP stack (test Client ->
middleware -> admin -> board.engine.resources) on the real SQLite test database: the list and the
page show each resource's capacity, what is held, the holds below and its holders (task links,
agent, fence, until); the capacity changes only through resources.change_capacity; held and the
holds below are the engine's, read-only; a bad capacity and a missing permission change nothing;
the task's page shows its resources read-only."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from board.engine import resources, selectors, transitions
from board.engine.transitions import TaskSpec
from board.models import Resource
from tests.support import db_state, sqlite_db_mark
from tests.test_admin import client_for, make_user

pytestmark = sqlite_db_mark()

RESOURCES = reverse("admin:board_resource_changelist")


def page_of(name: str) -> str:
    return reverse("admin:board_resource_change", args=[quote(name)])


@pytest.fixture(autouse=True)
def _board_stays_consistent():
    yield
    assert selectors.problems() == [], "check() found problems after the test"


@pytest.fixture
def changer():
    return client_for(make_user("op", ["board.view_queue", "board.change_queue"]))


@pytest.fixture
def watcher():
    return client_for(make_user("watcher", ["board.view_queue"]))


@pytest.fixture
def held():
    """merge-a RUNNING under worker-3 holding merge-slot (merge-b waits for it); gpu shared, 2 of 4
    held by worker-4; file:src/app/ held, so file: and file:src/ have holds below."""
    transitions.create([TaskSpec(id="merge-a", title="m", resources=["merge-slot"]),
                        TaskSpec(id="merge-b", title="m", resources=["merge-slot"]),
                        TaskSpec(id="train", title="t", resources=[{"name": "gpu", "units": 2}]),
                        TaskSpec(id="edit", title="e", resources=["file:src/app/**"])], actor="test")
    resources.change_capacity("gpu", 4, actor="test")
    lease = transitions.claim("merge-a", "worker-3", 60)
    transitions.claim("train", "worker-4", 60)
    transitions.claim("edit", "worker-5", 60)
    return lease


def everything() -> tuple:
    return db_state(), list(Resource.objects.order_by("name").values())


def post_capacity(client, name: str, capacity, reason: str = "", **extra):
    return client.post(page_of(name), {"capacity": capacity, "reason": reason, **extra})


def test_the_list_shows_capacity_held_holds_below_and_the_holders(changer, held):
    response = changer.get(RESOURCES)
    assert response.status_code == 200
    rows = {r.name: r for r in response.context["cl"].result_list}
    assert sorted(rows) == ["file:", "file:src/", "file:src/app/", "gpu", "merge-slot"]
    admin_of = response.context["cl"].model_admin
    assert {name: (r.capacity, admin_of.held_now(r), admin_of.holds_below(r)) for name, r in rows.items()} == {
        "file:": (1, "—", 1), "file:src/": (1, "—", 1), "file:src/app/": (1, "exclusive", 0),
        "gpu": (4, "2 of 4", 0), "merge-slot": (1, "exclusive", 0)}
    body = response.content.decode()
    task_page = reverse("admin:board_task_change", args=["merge-a"])
    assert f'<a href="{task_page}">merge-a</a> (worker-3)' in body
    assert "worker-4" in body and "worker-5" in body
    assert held.lease.token not in body


def test_the_page_lists_the_holders_with_fence_and_until_and_held_is_read_only(changer, held):
    response = changer.get(page_of("merge-slot"))
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert set(form.fields) == {"capacity", "reason"}  # held, intents: not fields at all
    body = response.content.decode()
    assert '<table class="resource-holders">' in body
    assert reverse("admin:board_task_change", args=["merge-a"]) in body
    assert "worker-3" in body and f"<td>{held.lease.fence}</td>" in body
    assert "exclusive" in body and held.lease.token not in body
    # A forged post of the engine's counts changes none of them.
    before = Resource.objects.get(name="merge-slot")
    response = post_capacity(changer, "merge-slot", 1, held=0, intents=0)
    assert response.status_code == 302
    after = Resource.objects.get(name="merge-slot")
    assert (after.held, after.intents) == (before.held, before.intents) == (resources.EXCLUSIVE, 0)


def test_a_capacity_change_goes_through_the_engine(changer, held, monkeypatch):
    calls = []
    real = resources.change_capacity

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(resources, "change_capacity", spy)
    response = post_capacity(changer, "gpu", 8, reason="two more cards")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert calls == [(("gpu", 8), {"actor": "op", "reason": "two more cards"})]
    row = Resource.objects.get(name="gpu")
    assert (row.capacity, row.held, row.intents) == (8, 2, 0)  # held is the engine's, untouched
    assert row.updated_at is not None
    # A third train of 2 units fits now beside the first (2 + 2 <= 8).
    transitions.create([TaskSpec(id="train-2", title="t", resources=[{"name": "gpu", "units": 2}])], actor="test")
    assert transitions.claim("train-2", "worker-6", 60).task.stage == "RUNNING"


@pytest.mark.parametrize("bad", ["0", "-1", "10001", "1.5", "many", ""])
def test_a_bad_capacity_is_refused_on_the_field_and_nothing_changes(changer, held, bad):
    before = everything()
    response = post_capacity(changer, "gpu", bad)
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == ["capacity"], form.errors
    assert everything() == before


def test_a_watcher_sees_the_page_read_only_and_cannot_change_it(watcher, held):
    response = watcher.get(page_of("gpu"))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'name="capacity"' not in body and 'name="reason"' not in body  # shown, not editable
    assert "worker-4" in body  # the holders, all the same
    before = everything()
    assert post_capacity(watcher, "gpu", 9).status_code == 403
    assert everything() == before
    nobody = client_for(make_user("nobody", ["board.view_task"]))
    assert nobody.get(RESOURCES).status_code == 403
    assert nobody.get(page_of("gpu")).status_code == 403


def test_the_admin_index_links_the_resources(changer, held):
    body = changer.get(reverse("admin:index")).content.decode()
    assert f'href="{RESOURCES}"' in body


def test_the_task_page_shows_its_resources_read_only(held):
    admin = client_for(make_user("admin-op", ["board.view_task", "board.intervene", "board.change_task"]))
    waiting = admin.get(reverse("admin:board_task_change", args=["merge-b"]))
    assert waiting.status_code == 200
    body = waiting.content.decode()
    assert f'<a href="{page_of("merge-slot")}">merge-slot</a> (exclusive)' in body
    assert "waiting: resource merge-slot held by worker-3 (task merge-a)" in body
    assert "resources" not in waiting.context["adminform"].form.fields  # shown, never a field
    running = admin.get(reverse("admin:board_task_change", args=["edit"])).content.decode()
    assert f'<a href="{page_of("file:src/app/")}">file:src/app/**</a> (exclusive): held by this task' in running
    shared = admin.get(reverse("admin:board_task_change", args=["train"])).content.decode()
    assert "gpu</a> (2 units)" in shared
