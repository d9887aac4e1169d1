"""The admin's Queues page (issue 29) through the whole HTTP stack (test Client -> middleware ->
admin -> board.engine.flow) on the real SQLite test database: the list, the change form (saved by
flow.change_queue, with its audit row), the pause / resume actions, the history on the page, the
read-only concurrency keys, and refusals — bad input and missing permissions change nothing."""
from __future__ import annotations

import html
import re

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from board.engine import flow, selectors, transitions, usage
from board.engine.transitions import TaskSpec
from board.models import ConcurrencyKey, FairnessKey, FairnessKeyChange, Queue, QueueChange, RateKey, RateKeyChange, Task
from tests.support import db_state, queue_shards, sqlite_db_mark
from tests.test_admin import client_for, make_user, messages_of, summaries_of

pytestmark = sqlite_db_mark()

QUEUES = reverse("admin:board_queue_changelist")
KEYS = reverse("admin:board_concurrencykey_changelist")
QUEUE_PERMS = ["board.view_queue", "board.change_queue"]


def page_of(name: str) -> str:
    return reverse("admin:board_queue_change", args=[name])


@pytest.fixture(autouse=True)
def _board_stays_consistent():
    yield
    assert selectors.problems() == [], "check() found problems after the test"


@pytest.fixture
def changer():
    return client_for(make_user("op", QUEUE_PERMS))


@pytest.fixture
def watcher():
    return client_for(make_user("watcher", ["board.view_queue", "board.view_concurrencykey"]))


def everything() -> tuple:
    return (db_state(), list(Queue.objects.order_by("name").values()),
            list(QueueChange.objects.order_by("pk").values()), list(ConcurrencyKey.objects.order_by("name").values()))


def tasks_in(queue: str, n: int, prefix: str | None = None, **fields) -> None:
    transitions.create([TaskSpec(id=f"{prefix or queue}-{i}", title="t", queue=queue, **fields) for i in range(n)],
                       actor="test")


def form_data(client, name: str, **values) -> dict:
    """What the change form posts: the page's own values (its sealed `opened` too), then `values`."""
    response = client.get(page_of(name))
    assert response.status_code == 200
    form = response.context["adminform"].form
    data = {name: "" if form.initial[name] is None else form.initial[name]
            for name in ("concurrency", "rate_count", "rate_per_seconds")}
    data.update(opened=form.initial["opened"], reason="")
    if form.initial["paused"]:
        data["paused"] = "on"
    for key, value in values.items():
        if key == "paused":
            data.pop("paused", None)
            if value:
                data["paused"] = "on"
        else:
            data[key] = value
    return data


def errors_of(response) -> dict:
    form = response.context["adminform"].form
    return {field: list(errs) for field, errs in form.errors.items()}


def act(client, action: str, names, reason: str = "") -> tuple[object, list[str]]:
    data = {"action": action, "_selected_action": list(names), "index": "0", "reason": reason}
    response = client.post(QUEUES, data, follow=True)
    assert response.status_code == 200
    return response, messages_of(response)


# ---------------------------------------------------------------------------------------------
# The list


def test_the_list_shows_running_of_limit_queued_and_who_paused(changer):
    tasks_in("ci", 3)
    tasks_in("docs", 1)
    tasks_in("web", 2)
    flow.change_queue("ci", actor="alice", reason="two runners", concurrency=2)
    transitions.claim("ci-0", "agent-1", 60)
    transitions.claim("web-0", "agent-2", 60)  # a queue without a limit: its tasks are counted
    flow.change_queue("docs", actor="bob", reason="repo frozen", paused=True)

    response = changer.get(QUEUES)
    assert response.status_code == 200
    rows = {q.name: q for q in response.context["cl"].result_list}
    assert sorted(rows) == ["ci", "docs", "web"]
    admin_of = response.context["cl"].model_admin
    assert {name: admin_of.running_of_limit(q) for name, q in rows.items()} == {
        "ci": "1 / 2", "docs": "0 / no limit", "web": "1 / no limit"}
    assert {name: admin_of.queued(q) for name, q in rows.items()} == {"ci": 2, "docs": 1, "web": 1}
    body = response.content.decode()
    assert "1 / 2" in body and "1 / no limit" in body
    assert "bob" in body and "repo frozen" in body
    page = changer.get(page_of("web")).content.decode()
    assert "1 / no limit" in page


def test_the_list_and_the_page_show_the_last_hours_wait_and_run_times(changer):
    """p50 / p95 (count) of the waits and runs that ended in the last hour (board.engine.timing),
    from history rows stamped at chosen times."""
    from datetime import timedelta

    from django.utils import timezone

    from tests.test_insights import Script

    now = timezone.now()
    s = Script("default")
    s.at(now - timedelta(minutes=30), lambda: tasks_in("ci", 3))
    s.at(now - timedelta(minutes=30), lambda: tasks_in("docs", 1))
    leases = [s.at(now - timedelta(minutes=30 - 2 * (i + 1)), lambda i=i: transitions.claim(f"ci-{i}", "a", 600).lease)
              for i in range(3)]  # waits 2, 4 and 6 min
    for i, lease in enumerate(leases):  # runs 10 s, 20 s, 30 s
        s.at(now - timedelta(minutes=30 - 2 * (i + 1), seconds=-10 * (i + 1)),
             lambda i=i, lease=lease: transitions.complete(f"ci-{i}", lease.token, {}))
    response = changer.get(QUEUES)
    admin_of = response.context["cl"].model_admin
    rows = {q.name: q for q in response.context["cl"].result_list}
    assert {name: (admin_of.wait_times(q), admin_of.run_times(q)) for name, q in rows.items()} == {
        "ci": ("4m 00s / 6m 00s (3)", "20 s / 30 s (3)"), "docs": ("—", "—")}
    body = response.content.decode()
    assert "Wait p50 / p95, last hour" in body and "4m 00s / 6m 00s (3)" in body
    assert "20 s / 30 s (3)" in changer.get(page_of("ci")).content.decode()


def test_the_queued_column_is_one_grouped_query_for_the_page(changer):
    for n in range(6):
        tasks_in(f"q{n}", n + 1)
    with CaptureQueriesContext(connection) as queries:
        response = changer.get(QUEUES)
    assert response.status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "board_task" in q["sql"] and "COUNT" in q["sql"].upper()]
    assert len(counts) == 1, counts
    assert {q.name: q.tasks_now["QUEUED"] for q in response.context["cl"].result_list} == {
        f"q{n}": n + 1 for n in range(6)}


# ---------------------------------------------------------------------------------------------
# The change form: saved by flow.change_queue, kept in the history


def test_setting_and_clearing_a_limit_goes_through_the_engine_and_its_history(changer):
    tasks_in("ci", 1)
    response = changer.post(page_of("ci"), form_data(changer, "ci", concurrency="3", reason="three runners"))
    assert response.status_code == 302, errors_of(response)
    assert Queue.objects.get(name="ci").concurrency == 3
    response = changer.post(page_of("ci"), form_data(changer, "ci", concurrency=""))
    assert response.status_code == 302, errors_of(response)
    queue = Queue.objects.get(name="ci")
    assert (queue.concurrency, queue.paused) == (None, False)
    assert [(c.actor, c.reason, c.changes) for c in QueueChange.objects.order_by("pk")] == [
        ("op", "three runners", {"concurrency": [None, 3]}),
        ("op", "", {"concurrency": [3, None]}),
    ]


def test_setting_and_clearing_a_rate_goes_through_the_engine_and_its_history(changer):
    tasks_in("llm", 1)
    response = changer.post(page_of("llm"), form_data(changer, "llm", rate_count="60", rate_per_seconds="60",
                                                       reason="provider RPM"))
    assert response.status_code == 302, errors_of(response)
    queue = Queue.objects.get(name="llm")
    assert (queue.rate_count, queue.rate_per_seconds) == (60, 60)
    assert list(queue_shards("llm", "rate").values_list("capacity", "spacing")) == [(60, 1.0)]
    assert "60 per 60 s" in changer.get(reverse("admin:board_queue_changelist")).content.decode()
    response = changer.post(page_of("llm"), form_data(changer, "llm", rate_count="", rate_per_seconds=""))
    assert response.status_code == 302, errors_of(response)
    assert Queue.objects.get(name="llm").rate_count is None
    assert [c.changes for c in QueueChange.objects.order_by("pk")] == [
        {"rate": [None, {"count": 60, "per_seconds": 60}]}, {"rate": [{"count": 60, "per_seconds": 60}, None]}]
    assert "60 per 60 s → no rate" in changer.get(page_of("llm")).content.decode()


def test_setting_and_removing_a_budget_goes_through_the_engine_and_its_history(changer):
    tasks_in("llm", 1)
    response = changer.post(page_of("llm"), form_data(changer, "llm", budget_tokens="1000", budget_cost_usd="2.5",
                                                       budget_per="month", reason="the month's allowance"))
    assert response.status_code == 302, errors_of(response)
    queue = Queue.objects.get(name="llm")
    assert (queue.budget_tokens, queue.budget_cost_usd, queue.budget_per) == (1000, 2.5, "month")
    assert "0 / 1,000 tokens, $0.00 / $2.50 this month" in changer.get(reverse("admin:board_queue_changelist")).content.decode()
    before = everything()
    response = changer.post(page_of("llm"), form_data(changer, "llm", budget_tokens="0"))
    assert response.status_code == 200 and "budget.tokens must be a whole number" in response.content.decode()
    assert everything() == before
    response = changer.post(page_of("llm"), form_data(changer, "llm", budget_tokens="", budget_cost_usd=""))
    assert response.status_code == 302, errors_of(response)
    assert Queue.objects.get(name="llm").budget_per is None
    assert "budget: no budget → 1,000 tokens, $2.50 a month" in changer.get(page_of("llm")).content.decode()
    assert [c.changes for c in QueueChange.objects.order_by("pk")] == [
        {"budget": [None, {"tokens": 1000, "cost_usd": 2.5, "per": "month"}]},
        {"budget": [{"tokens": 1000, "cost_usd": 2.5, "per": "month"}, None]}]


@pytest.mark.parametrize("count, per_seconds", [("60", ""), ("", "60"), ("0", "60"), ("5", "86401")])
def test_a_bad_rate_shows_the_form_error_and_changes_nothing(changer, count, per_seconds):
    tasks_in("llm", 1)
    before = everything()
    response = changer.post(page_of("llm"), form_data(changer, "llm", rate_count=count, rate_per_seconds=per_seconds))
    assert response.status_code == 200
    assert "rate_count" in errors_of(response)
    assert everything() == before


def test_pausing_needs_a_reason_and_records_who_and_why(changer):
    tasks_in("ci", 1)
    before = everything()
    response = changer.post(page_of("ci"), form_data(changer, "ci", paused=True))
    assert response.status_code == 200
    assert "reason" in errors_of(response)
    assert everything() == before

    response = changer.post(page_of("ci"), form_data(changer, "ci", paused=True, reason="deploy freeze"))
    assert response.status_code == 302, errors_of(response)
    queue = Queue.objects.get(name="ci")
    assert (queue.paused, queue.paused_by, queue.paused_reason) == (True, "op", "deploy freeze")
    assert queue.paused_at is not None
    change = QueueChange.objects.get()
    assert (change.actor, change.reason, change.changes) == ("op", "deploy freeze", {"paused": [False, True]})

    response = changer.post(page_of("ci"), form_data(changer, "ci", paused=False))  # resuming needs none
    assert response.status_code == 302, errors_of(response)
    queue = Queue.objects.get(name="ci")
    assert (queue.paused, queue.paused_by, queue.paused_reason, queue.paused_at) == (False, "", "", None)


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "2.5", "10001", "99999999999999999999"])
def test_a_bad_limit_shows_the_form_error_and_changes_nothing(changer, bad):
    tasks_in("ci", 2)
    flow.change_queue("ci", actor="alice", reason="two", concurrency=2)
    before = everything()
    response = changer.post(page_of("ci"), form_data(changer, "ci", concurrency=bad, paused=True, reason="x"))
    assert response.status_code == 200
    assert list(errors_of(response)) == ["concurrency"]
    assert everything() == before


def test_running_is_not_taken_from_the_form(changer):
    tasks_in("ci", 2)
    transitions.claim("ci-0", "agent-1", 60)
    response = changer.post(page_of("ci"), form_data(changer, "ci", concurrency="5", running="99"))
    assert response.status_code == 302, errors_of(response)
    assert Queue.objects.get(name="ci").concurrency == 5
    assert flow.counts(["ci"])[0] == {"ci": 1}  # the engine's count, from the RUNNING tasks


def test_a_damaged_form_changes_nothing(changer):
    tasks_in("ci", 1)
    before = everything()
    response = changer.post(page_of("ci"), form_data(changer, "ci", concurrency="4", opened="forged"))
    assert response.status_code == 200
    assert "damaged" in str(errors_of(response)["__all__"])
    assert everything() == before


def test_a_page_opened_before_a_pause_does_not_resume_the_queue(changer):
    """Saving a new limit sends only the limit: the pause made meanwhile stays."""
    tasks_in("ci", 1)
    data = form_data(changer, "ci", concurrency="4")  # opened: not paused
    flow.change_queue("ci", actor="bob", reason="incident", paused=True)
    response = changer.post(page_of("ci"), data)
    assert response.status_code == 302, errors_of(response)
    queue = Queue.objects.get(name="ci")
    assert (queue.concurrency, queue.paused, queue.paused_by) == (4, True, "bob")


def test_a_setting_changed_meanwhile_is_refused_with_who_changed_it(changer):
    tasks_in("ci", 1)
    data = form_data(changer, "ci", concurrency="4")  # opened: no limit
    flow.change_queue("ci", actor="bob", reason="one at a time", concurrency=1)
    before = everything()
    response = changer.post(page_of("ci"), data)
    assert response.status_code == 200
    (error,) = errors_of(response)["__all__"]
    assert "changed after you opened it (last changed by bob)" in error and "concurrency null → 1" in error
    assert everything() == before


def test_the_history_is_on_the_page_newest_first_read_only(changer):
    tasks_in("ci", 1)
    flow.change_queue("ci", actor="alice", reason="first", concurrency=2)
    flow.change_queue("ci", actor="bob", reason="second", paused=True)
    response = changer.get(page_of("ci"))
    body = response.content.decode()
    table = body[body.index('class="queue-history"'):]
    rows = re.findall(r"<tr><td>.*?</tr>", table, re.DOTALL)
    assert len(rows) == 2
    assert "bob" in rows[0] and "paused: no → yes" in html.unescape(rows[0]) and "second" in rows[0]
    assert "alice" in rows[1] and "concurrency: no limit → 2" in html.unescape(rows[1])
    assert 'name="history"' not in body and 'name="running"' not in body


# ---------------------------------------------------------------------------------------------
# The actions


def test_pause_action_needs_a_reason_then_pauses_each_queue_once(changer):
    tasks_in("ci", 1)
    tasks_in("docs", 1)
    tasks_in("web", 1)
    flow.change_queue("web", actor="bob", reason="earlier", paused=True)
    before = everything()
    _, shown = act(changer, "pause_queues", ["ci", "docs"])
    assert shown == ["Pausing needs a reason: type it in the Reason box beside the action. Nothing was done."]
    assert everything() == before

    response, shown = act(changer, "pause_queues", ["ci", "docs", "web"], reason="release freeze")
    assert summaries_of(response) == ["Pause, 3 queues: 2 done; 1 skipped (1 already paused)."]
    assert shown == ["ci: paused", "docs: paused", "web: skipped: already paused by bob"]
    assert [(q.name, q.paused, q.paused_by, q.paused_reason) for q in Queue.objects.order_by("name")] == [
        ("ci", True, "op", "release freeze"), ("docs", True, "op", "release freeze"), ("web", True, "bob", "earlier")]
    assert QueueChange.objects.filter(actor="op", reason="release freeze").count() == 2


def test_a_queue_paused_by_someone_else_meanwhile_keeps_their_pause(changer, monkeypatch):
    """Between the action's read and its change, bob pauses the queue: the engine records
    nothing more, and the report says whose pause it is."""
    tasks_in("ci", 1)
    real = flow.change_queue

    def bob_first(name, **kwargs):
        real(name, actor="bob", reason="incident", paused=True)
        return real(name, **kwargs)

    monkeypatch.setattr(flow, "change_queue", bob_first)
    response, shown = act(changer, "pause_queues", ["ci"], reason="release freeze")
    assert shown == ["ci: skipped: paused meanwhile by bob"]
    assert Queue.objects.values_list("paused_by", "paused_reason").get(name="ci") == ("bob", "incident")
    assert list(QueueChange.objects.values_list("actor", flat=True)) == ["bob"]


def test_resume_action_resumes_paused_queues(changer):
    tasks_in("ci", 1)
    tasks_in("docs", 1)
    flow.change_queue("ci", actor="bob", reason="incident", paused=True)
    response, shown = act(changer, "resume_queues", ["ci", "docs"], reason="all clear")
    assert shown == ["ci: resumed (was paused by bob: incident)", "docs: skipped: not paused"]
    assert not Queue.objects.filter(paused=True).exists()
    latest = QueueChange.objects.order_by("-pk").first()
    assert (latest.actor, latest.reason, latest.changes) == ("op", "all clear", {"paused": [True, False]})


# ---------------------------------------------------------------------------------------------
# Permissions: board.view_queue to see, board.change_queue to change; nothing added or deleted


def test_a_viewer_sees_the_page_read_only_and_cannot_change_or_act(watcher):
    tasks_in("ci", 1)
    flow.change_queue("ci", actor="alice", reason="two", concurrency=2)
    assert watcher.get(QUEUES).status_code == 200
    response = watcher.get(page_of("ci"))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'name="concurrency"' not in body and 'name="reason"' not in body and "queue-history" in body
    assert "pause_queues" not in body
    before = everything()
    assert watcher.post(page_of("ci"), {"concurrency": "3", "opened": "x"}).status_code == 403
    _, shown = act(watcher, "pause_queues", ["ci"], reason="nope")
    assert shown == []  # a viewer's list has no actions: the post lists the queues again
    assert everything() == before


def test_staff_without_view_queue_see_no_queues():
    client = client_for(make_user("tasks-only", ["board.view_task"]))
    tasks_in("ci", 1)
    assert client.get(QUEUES).status_code == 403
    assert client.get(page_of("ci")).status_code == 403
    assert client.get(KEYS).status_code == 403


def test_change_queue_alone_may_change_but_nobody_adds_or_deletes(changer):
    tasks_in("ci", 1)
    before = everything()
    assert changer.get(reverse("admin:board_queue_add")).status_code == 403
    assert changer.post(reverse("admin:board_queue_add"), {"name": "new"}).status_code == 403
    assert changer.post(reverse("admin:board_queue_delete", args=["ci"]), {"post": "yes"}).status_code == 403
    response, shown = act(changer, "delete_selected", ["ci"])
    assert shown == ["No action selected."]
    assert everything() == before


# ---------------------------------------------------------------------------------------------
# Concurrency keys, read-only; a task's key on its page


def test_concurrency_keys_are_listed_read_only(watcher):
    transitions.create([TaskSpec(id="r1", title="t", concurrency_key="repo:acme/web", concurrency_limit=1)],
                       actor="test")
    transitions.claim("r1", "agent-1", 60)
    response = watcher.get(KEYS)
    assert response.status_code == 200
    assert "repo:acme/web" in response.content.decode() and "1 / 1" in response.content.decode()
    page = reverse("admin:board_concurrencykey_change", args=["repo:acme/web"])
    response = watcher.get(page)
    assert response.status_code == 200 and 'name="concurrency"' not in response.content.decode()
    before = everything()
    assert watcher.post(page, {"concurrency": "5"}).status_code == 403
    assert everything() == before


def test_a_superuser_cannot_edit_a_concurrency_key_either():
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", password="x")
    client = client_for(User.objects.get(username="root"))
    transitions.create([TaskSpec(id="r1", title="t", concurrency_key="gpu", concurrency_limit=2)], actor="test")
    before = everything()
    page = reverse("admin:board_concurrencykey_change", args=["gpu"])
    assert 'name="concurrency"' not in client.get(page).content.decode()
    assert client.post(page, {"concurrency": "9"}).status_code == 403
    assert client.get(reverse("admin:board_concurrencykey_add")).status_code == 403
    assert everything() == before


def test_a_tasks_page_shows_its_concurrency_key_read_only():
    client = client_for(make_user("task-viewer", ["board.view_task"]))
    transitions.create([TaskSpec(id="r1", title="t", concurrency_key="repo:acme/web")], actor="test")
    response = client.get(reverse("admin:board_task_change", args=["r1"]))
    assert response.status_code == 200
    body = response.content.decode()
    assert "repo:acme/web" in body and 'name="concurrency_key"' not in body


# ---------------------------------------------------------------------------------------------
# Rate keys: the list, the rate set on the key's page through flow.change_rate_key, its history

RATE_KEYS = reverse("admin:board_ratekey_changelist")


def rate_key_page(name: str) -> str:
    return reverse("admin:board_ratekey_change", args=[name])


def rate_key_form(client, name: str, **values) -> dict:
    form = client.get(rate_key_page(name)).context["adminform"].form
    data = {field: "" if form.initial[field] is None else form.initial[field]
            for field in ("rate_count", "rate_per_seconds")}
    return {**data, "opened": form.initial["opened"], "reason": "", **values}


def rate_keys_now() -> tuple:
    return db_state(), list(RateKey.objects.values()), list(RateKeyChange.objects.order_by("pk").values())


def test_a_rate_key_is_listed_and_its_rate_set_and_cleared_on_its_page_with_its_history(changer):
    tasks_in("chat", 1, rate_key="provider:llm")
    tasks_in("embed", 1, rate_key="provider:llm")
    assert "provider:llm" in changer.get(RATE_KEYS).content.decode()
    response = changer.post(rate_key_page("provider:llm"), rate_key_form(
        changer, "provider:llm", rate_count="500", rate_per_seconds="60", reason="provider RPM"))
    assert response.status_code == 302, errors_of(response)
    key = RateKey.objects.get(name="provider:llm")
    assert (key.rate_count, key.rate_per_seconds, key.rate_interval) == (500, 60, 0.12)
    assert "500 per 60 s" in changer.get(RATE_KEYS).content.decode()
    response = changer.post(rate_key_page("provider:llm"), rate_key_form(
        changer, "provider:llm", rate_count="", rate_per_seconds=""))
    assert response.status_code == 302, errors_of(response)
    assert RateKey.objects.get(name="provider:llm").rate_count is None
    assert [(c.actor, c.reason, c.changes) for c in RateKeyChange.objects.order_by("pk")] == [
        ("op", "provider RPM", {"rate": [None, {"count": 500, "per_seconds": 60}]}),
        ("op", "", {"rate": [{"count": 500, "per_seconds": 60}, None]})]
    assert "500 per 60 s → no rate" in changer.get(rate_key_page("provider:llm")).content.decode()


@pytest.mark.parametrize("count, per_seconds", [("60", ""), ("", "60"), ("0", "60"), ("5", "86401")])
def test_a_bad_rate_key_rate_shows_the_form_error_and_changes_nothing(changer, count, per_seconds):
    tasks_in("chat", 1, rate_key="provider:llm")
    before = rate_keys_now()
    response = changer.post(rate_key_page("provider:llm"), rate_key_form(
        changer, "provider:llm", rate_count=count, rate_per_seconds=per_seconds))
    assert response.status_code == 200
    assert "rate_count" in errors_of(response)
    assert rate_keys_now() == before


def test_a_rate_key_changed_after_the_page_opened_is_refused_and_a_viewer_cannot_change_it(changer, watcher):
    tasks_in("chat", 1, rate_key="provider:llm")
    stale = rate_key_form(changer, "provider:llm", rate_count="10", rate_per_seconds="60")
    flow.change_rate_key("provider:llm", actor="alice", rate={"count": 1, "per_seconds": 1})
    before = rate_keys_now()
    response = changer.post(rate_key_page("provider:llm"), stale)
    assert response.status_code == 200 and "changed after you opened it (last changed by alice)" in str(errors_of(response))
    assert watcher.get(RATE_KEYS).status_code == 200
    assert watcher.post(rate_key_page("provider:llm"), rate_key_form(
        changer, "provider:llm", rate_count="10", rate_per_seconds="60")).status_code == 403
    assert rate_keys_now() == before


def test_django_s_object_history_of_a_queue_or_a_rate_key_leads_to_its_page(changer):
    """Django's own history view (LogEntry rows) misses the changes made over the API: the
    admin sends it to the object's page, whose history has every change; a user who may not
    view the object gets a 403 there, as on the page."""
    tasks_in("q-hist", 1, rate_key="provider:hist")
    for model, name in (("queue", "q-hist"), ("ratekey", "provider:hist")):
        history = reverse(f"admin:board_{model}_history", args=[quote(name)])
        response = changer.get(history)
        assert (response.status_code, response["Location"]) == (
            302, reverse(f"admin:board_{model}_change", args=[quote(name)]))
    nobody = client_for(make_user("nobody", []))
    assert nobody.get(reverse("admin:board_queue_history", args=["q-hist"])).status_code == 403


# ---------------------------------------------------------------------------------------------
# Fairness keys: their weight and their budget (issue 32, item 5)


FAIRNESS_KEYS = reverse("admin:board_fairnesskey_changelist")


def fairness_key_page(name: str) -> str:
    return reverse("admin:board_fairnesskey_change", args=[quote(name)])


def fairness_key_form(client, name: str, **values) -> dict:
    """What the key's page posts: its own values (its sealed `opened` too), then `values`."""
    form = client.get(fairness_key_page(name)).context["adminform"].form
    data = {field: "" if form.initial.get(field) is None else form.initial[field]
            for field in ("weight", "budget_tokens", "budget_cost_usd", "budget_per")}
    return {**data, "name": name, "opened": form.initial["opened"], "reason": "", **values}


def fairness_keys_now() -> tuple:
    return db_state(), list(FairnessKey.objects.values()), list(FairnessKeyChange.objects.order_by("pk").values())


def spend_on(task_id: str, tokens: int) -> None:
    """Claim `task_id`, complete it and report `tokens` of usage, as the API's complete does."""
    claim = transitions.claim(task_id, "agent-1", 60)
    transitions.complete(task_id, claim.lease.token, {})
    usage.record(claim.task, claim.lease.fence, "agent-1", usage.checked({"model": "m", "input_tokens": tokens}))


def test_a_spent_fairness_key_s_budget_is_raised_from_its_page_and_its_tasks_are_claimable_again(changer):
    transitions.create([TaskSpec(id="p-chat", title="t", queue="chat", fairness_key="plan:7/a", priority=2),
                        TaskSpec(id="p-embed", title="t", queue="embed", fairness_key="plan:7/a", priority=1),
                        TaskSpec(id="p-last", title="t", queue="chat", fairness_key="plan:7/a")], actor="test")
    flow.change_fairness_key("plan:7/a", actor="alice", budget={"tokens": 100, "per": "total"}, reason="trial")
    spend_on("p-chat", 60)
    spend_on("p-embed", 50)  # 110 of 100: spent
    assert transitions.claim_next("agent-1", 60) is None  # p-last is held back, in every queue
    listed = changer.get(FAIRNESS_KEYS).content.decode()
    assert "plan:7/a" in listed and "110 / 100 tokens in total" in listed and 'alt="True"' in listed
    page = changer.get(fairness_key_page("plan:7/a")).content.decode()
    assert "110 / 100 tokens in total" in page and "when the budget is raised or removed" in page

    response = changer.post(fairness_key_page("plan:7/a"), fairness_key_form(
        changer, "plan:7/a", budget_tokens="500", budget_per="total", reason="the plan needs more"))
    assert response.status_code == 302, errors_of(response)
    key = FairnessKey.objects.get(name="plan:7/a")
    assert (key.budget_tokens, key.budget_per, key.spent_tokens, key.budget_closed_until) == (500, "total", 110, None)
    assert [(c.key, c.actor, c.reason, c.changes) for c in FairnessKeyChange.objects.order_by("pk")] == [
        ("plan:7/a", "alice", "trial", {"budget": [None, {"tokens": 100, "cost_usd": None, "per": "total"}]}),
        ("plan:7/a", "op", "the plan needs more", {"budget": [{"tokens": 100, "cost_usd": None, "per": "total"},
                                                              {"tokens": 500, "cost_usd": None, "per": "total"}]})]
    assert transitions.claim_next("agent-1", 60).task.pk == "p-last"
    assert "110 / 500 tokens in total" in changer.get(FAIRNESS_KEYS).content.decode()
    assert "100 tokens in total → 500 tokens in total" in changer.get(fairness_key_page("plan:7/a")).content.decode()


def test_a_fairness_key_s_budget_is_set_and_removed_on_its_page_and_its_weight_saved_alone(changer):
    transitions.create([TaskSpec(id="w", title="t", fairness_key="heavy", fairness_weight=2)], actor="test")
    response = changer.post(fairness_key_page("heavy"), fairness_key_form(
        changer, "heavy", weight="3", budget_cost_usd="2.5", budget_per="month", reason="a month's allowance"))
    assert response.status_code == 302, errors_of(response)
    key = FairnessKey.objects.get(name="heavy")
    assert (key.weight, key.budget_tokens, key.budget_cost_usd, key.budget_per) == (3, None, 2.5, "month")
    # The weight alone: no history row, the budget and its spend as they were.
    usage.record(Task.objects.get(pk="w"), 0, "agent-1", usage.checked({"model": "m", "cost_usd": 0.5}))
    stale = fairness_key_form(changer, "heavy", weight="4")
    FairnessKey.objects.filter(name="heavy").update(spent_cost_usd=1.25)  # a report while the page was open
    assert changer.post(fairness_key_page("heavy"), stale).status_code == 302
    key = FairnessKey.objects.get(name="heavy")
    assert (key.weight, key.spent_cost_usd, FairnessKeyChange.objects.count()) == (4, 1.25, 1)
    response = changer.post(fairness_key_page("heavy"), fairness_key_form(
        changer, "heavy", budget_tokens="", budget_cost_usd="", reason="no more limit"))
    assert response.status_code == 302, errors_of(response)
    assert FairnessKey.objects.get(name="heavy").budget_per is None
    assert [c.changes for c in FairnessKeyChange.objects.order_by("pk")] == [
        {"budget": [None, {"tokens": None, "cost_usd": 2.5, "per": "month"}]},
        {"budget": [{"tokens": None, "cost_usd": 2.5, "per": "month"}, None]}]


@pytest.mark.parametrize("values", [{"budget_tokens": "0"}, {"budget_tokens": "-5"}, {"budget_cost_usd": "0"},
                                    {"budget_tokens": str(10**15 + 1)}, {"budget_per": "week", "budget_tokens": "5"},
                                    {"weight": "0"}, {"weight": "1001"}, {"weight": ""}, {"opened": "forged"},
                                    {"budget_tokens": "5", "reason": "x" * 501}])
def test_a_bad_fairness_key_change_shows_the_form_error_and_changes_nothing(changer, values):
    transitions.create([TaskSpec(id="k", title="t", fairness_key="kept")], actor="test")
    flow.change_fairness_key("kept", actor="alice", budget={"tokens": 100, "per": "day"})
    before = fairness_keys_now()
    response = changer.post(fairness_key_page("kept"), fairness_key_form(changer, "kept", **values))
    assert response.status_code == 200 and errors_of(response)
    assert fairness_keys_now() == before


def test_a_fairness_key_budget_changed_after_the_page_opened_is_refused_and_others_cannot_change_it(changer):
    transitions.create([TaskSpec(id="k", title="t", fairness_key="kept")], actor="test")
    flow.change_fairness_key("kept", actor="setup", budget={"tokens": 100, "per": "day"})
    stale = fairness_key_form(changer, "kept", budget_tokens="1000")
    flow.change_fairness_key("kept", actor="alice", budget={"tokens": 5, "per": "day"})
    before = fairness_keys_now()
    response = changer.post(fairness_key_page("kept"), stale)
    assert response.status_code == 200
    assert "budget changed after you opened it (last changed by alice)" in str(errors_of(response))
    # Django's own fairness key permissions change the weight only; viewers change nothing.
    weigher = client_for(make_user("weigher", ["board.view_fairnesskey", "board.change_fairnesskey"]))
    form = weigher.get(fairness_key_page("kept")).context["adminform"].form
    assert set(form.fields) == {"weight"}
    assert "5 tokens a day" in weigher.get(fairness_key_page("kept")).content.decode()
    watcher = client_for(make_user("watcher", ["board.view_queue"]))
    assert watcher.get(FAIRNESS_KEYS).status_code == 200
    assert watcher.post(fairness_key_page("kept"), {"weight": "9", "budget_tokens": ""}).status_code == 403
    assert changer.post(reverse("admin:board_fairnesskey_delete", args=["kept"]), {"post": "yes"}).status_code == 403
    assert fairness_keys_now() == before
    # Budget fields posted by a user who may not change them are not read: the weight alone changes.
    assert weigher.post(fairness_key_page("kept"), {"weight": "2", "budget_tokens": "", "budget_cost_usd": "",
                                                    "name": "kept"}).status_code == 302
    key = FairnessKey.objects.get(name="kept")
    assert (key.weight, key.budget_tokens, key.budget_per, FairnessKeyChange.objects.count()) == (2, 5, "day", 2)


def test_a_fairness_key_is_added_with_its_weight_and_no_budget_on_the_add_page():
    boss = client_for(make_user("boss", ["board.add_fairnesskey", "board.view_fairnesskey", "board.change_queue"]))
    add = reverse("admin:board_fairnesskey_add")
    assert set(boss.get(add).context["adminform"].form.fields) == {"name", "weight"}
    assert boss.post(add, {"name": "plan:new", "weight": "5", "budget_tokens": "7"}).status_code == 302
    key = FairnessKey.objects.get(name="plan:new")
    assert (key.weight, key.budget_per, FairnessKeyChange.objects.count()) == (5, None, 0)
    before = fairness_keys_now()
    response = boss.post(add, {"name": "plan:new", "weight": "2"})
    assert response.status_code == 200 and "name" in errors_of(response)  # taken: nothing written
    assert boss.post(add, {"name": "tab\there", "weight": "2"}).status_code == 200
    assert fairness_keys_now() == before
