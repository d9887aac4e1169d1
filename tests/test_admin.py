"""The operators' admin through the whole HTTP stack (test Client -> middleware -> admin -> engine)
on the real SQLite test database.

Every action is run on eligible, ineligible and mixed selections and its per-row messages are
asserted exactly; races use real threads released by a barrier over many rounds and assert
exact counts; check() must find nothing after every test. Leases are aged by writing the row.
"""
from __future__ import annotations

import html
import json
import re
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.models import Session
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from board import agent_keys
from board.admin import TaskAdmin, TaskEditForm
from board.engine import errors, selectors, transitions
from board.engine.lifecycle import Stage
from board.engine.limits import MAX_DESCRIPTION_CHARS, MAX_JSON_FIELD_BYTES
from board.engine.transitions import TaskSpec, hash_token
from board.models import AgentKey, Task, TaskEvent
from tests.support import db_state, expire_lease, race, row, sqlite_db_mark

pytestmark = sqlite_db_mark()

CHANGELIST = reverse("admin:board_task_changelist")
ADD = reverse("admin:board_task_add")
KEYS = reverse("admin:board_agentkey_changelist")
KEY_ADD = reverse("admin:board_agentkey_add")
ROUNDS = 50
OPERATOR_PERMS = [
    "board.view_task", "board.change_task", "board.add_task", "board.intervene",
    "board.view_agentkey", "board.add_agentkey", "board.change_agentkey",
]
# Whether the engine records the operator as the actor of an admin "release stale leases"
# (reclaim_expired has no actor parameter today: its events say "system:reaper").
RECLAIM_ACTOR = "op"  # the operator who released the stale lease


# ---------------------------------------------------------------------------------------------
# Helpers


class HttpsClient(Client):
    """Every request over https, as in production (secure cookies, HSTS)."""

    def generic(self, method, path, data="", content_type="application/octet-stream", secure=False, **extra):
        return super().generic(method, path, data, content_type, True, **extra)


@pytest.fixture(autouse=True)
def _board_stays_consistent():
    yield
    assert selectors.problems() == [], "check() found problems after the test"


def make_user(username: str, perms: list[str], *, staff: bool = True) -> User:
    user = User.objects.create_user(username, password="x", is_staff=staff)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return User.objects.get(pk=user.pk)  # fresh: no cached permissions


def client_for(user: User, **kwargs) -> HttpsClient:
    client = HttpsClient(**kwargs)
    client.force_login(user)
    return client


@pytest.fixture
def op() -> HttpsClient:
    return client_for(make_user("op", OPERATOR_PERMS))


@pytest.fixture
def viewer() -> HttpsClient:
    return client_for(make_user("viewer", ["board.view_task", "board.view_agentkey"]))


def new(task_id: str, **fields) -> Task:
    fields.setdefault("title", f"title of {task_id}")
    return transitions.create(TaskSpec(id=task_id, **fields), actor="test")[0]


def running(task_id: str, agent: str = "agent-1", ttl: float = 600, **fields) -> transitions.Claim:
    new(task_id, **fields)
    return transitions.claim(task_id, agent, ttl)


def failed(task_id: str, max_retries: int = 0) -> None:
    c = running(task_id, max_retries=max_retries)
    transitions.fail(task_id, c.lease.token, "boom", retryable=False)


def paused(task_id: str) -> transitions.Claim:
    c = running(task_id)
    transitions.pause(task_id, c.lease.token, {"step": 3})
    return c


def completed(task_id: str) -> None:
    c = running(task_id)
    transitions.complete(task_id, c.lease.token, {"ok": True})


def cancelled(task_id: str) -> None:
    new(task_id)
    transitions.cancel(task_id, actor="test")


def messages_of(response) -> list[str]:
    """What the messages say: an action's one message gives its per-task lines (from its
    collapsed <details>); any other message is itself."""
    lines: list[str] = []
    for message in response.context["messages"]:
        text = str(message.message)
        rows = re.findall(r'<li class="action-(?:done|skipped|lost)">(.*?)</li>', text, re.DOTALL)
        lines.extend([html.unescape(r) for r in rows] if rows else [text])
    return lines


def summaries_of(response) -> list[str]:
    """Each message's first line: an action's summary (the counts), unescaped."""
    return [html.unescape(str(m.message).split("<details", 1)[0]) for m in response.context["messages"]]


def act(client: Client, action: str, ids, **extra) -> tuple[object, list[str]]:
    """Run an admin action on `ids` the way the changelist's form posts it; follow the redirect
    and return the response and the messages shown."""
    data = {"action": action, "_selected_action": list(ids), "index": "0", **extra}
    response = client.post(CHANGELIST, data, follow=True)
    assert response.status_code == 200
    return response, messages_of(response)


def events(task_id: str) -> list[tuple[str, str, str, int, str]]:
    return list(
        TaskEvent.objects.filter(task_id=task_id).order_by("id")
        .values_list("verb", "from_stage", "to_stage", "version", "actor")
    )


def history_rows(response) -> list:
    """The history rows a task's page shows (board/admin/history.py; renews collapsed)."""
    return response.context["task_history"].rows


def change_url(task_id: str) -> str:
    return reverse("admin:board_task_change", args=[quote(task_id)])


def open_form(client: Client, task_id: str) -> dict:
    """GET the change form; return the POST data it would send unchanged."""
    response = client.get(change_url(task_id))
    assert response.status_code == 200
    form = response.context["adminform"].form
    data = {}
    for name in ("title", "description", "priority", "max_retries", "payload", "opened_version", "opened_state"):
        value = form[name].value()
        data[name] = "" if value is None else value
    data["_save"] = "Save"
    return data


def latency(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Release stale leases


def test_release_stale_leases_on_a_mixed_selection(op):
    stale = running("stale", "agent-1")
    expire_lease("stale", ago=timedelta(minutes=2, seconds=30))
    running("last", "agent-2", max_retries=0)  # its only attempt: reclaiming it fails it
    expire_lease("last", ago=timedelta(minutes=2, seconds=30))
    running("live", "agent-3")
    new("queued")
    live_before = row("live")

    _, shown = act(op, "release_stale_leases", ["stale", "last", "live", "queued"])

    assert shown == [
        "last: failed: lease expired on its last attempt (was held by agent-2, expired 2 min ago)",
        "live: skipped: lease still live (held by agent-3, expires in 9 min)",
        "queued: skipped: not RUNNING (is QUEUED)",
        "stale: released (was held by agent-1, expired 2 min ago)",
    ]
    assert row("stale")["stage"] == Stage.QUEUED and row("stale")["owner"] == ""
    assert row("stale")["lease_token_hash"] is None and row("stale")["lease_expires_at"] is None
    assert row("last")["stage"] == Stage.FAILED
    assert row("live") == live_before  # a live lease is never touched
    assert row("queued")["version"] == 0
    assert events("stale")[-1] == ("reclaim", "RUNNING", "QUEUED", 2, RECLAIM_ACTOR)
    assert events("last")[-1] == ("fail", "RUNNING", "FAILED", 2, RECLAIM_ACTOR)
    # The old holder is out; the next claim gets a higher fence.
    with pytest.raises(errors.LeaseLost):
        transitions.complete("stale", stale.lease.token, {})
    assert transitions.claim("stale", "agent-9", 60).lease.fence == stale.lease.fence + 1


def test_release_stale_leases_eligible_only(op):
    for n in range(3):
        running(f"s{n}", f"agent-{n}")
        expire_lease(f"s{n}", ago=timedelta(minutes=5, seconds=1))
    _, shown = act(op, "release_stale_leases", ["s0", "s1", "s2"])
    assert shown == [f"s{n}: released (was held by agent-{n}, expired 5 min ago)" for n in range(3)]
    assert {row(f"s{n}")["stage"] for n in range(3)} == {Stage.QUEUED}


def test_release_stale_leases_ineligible_only_changes_nothing(op):
    running("live")
    new("queued")
    completed("done")
    before = db_state()
    _, shown = act(op, "release_stale_leases", ["live", "queued", "done"])
    assert shown == [
        "done: skipped: not RUNNING (is COMPLETED)",
        "live: skipped: lease still live (held by agent-1, expires in 9 min)",
        "queued: skipped: not RUNNING (is QUEUED)",
    ]
    assert db_state() == before


def test_release_stale_lease_renewed_after_the_read_is_a_lost_race(op, monkeypatch):
    """The lease is expired by the admin's clock when the action reads it; the holder renews
    before the reclaim: the renewal wins and the action says so."""
    c = running("r")
    soon = timezone.now() + timedelta(seconds=30)
    Task.objects.filter(pk="r").update(lease_expires_at=soon)
    monkeypatch.setattr(TaskAdmin, "clock", lambda self: soon + timedelta(seconds=1))
    real = transitions.reclaim_expired

    def renew_first(**kwargs):
        transitions.renew("r", c.lease.token, 600)
        return real(**kwargs)

    monkeypatch.setattr(transitions, "reclaim_expired", renew_first)
    _, shown = act(op, "release_stale_leases", ["r"])
    assert shown == ["r: lost a race: task changed meanwhile (now RUNNING v2, held by agent-1)"]
    assert row("r")["stage"] == Stage.RUNNING
    transitions.complete("r", c.lease.token, {})


def test_release_stale_races_a_renew(op, monkeypatch):
    """Release-stale (the admin, whose clock says the lease expired) against the holder's renew
    (whose clock says it is live), over many rounds: exactly one side wins each round."""
    clock = {}
    monkeypatch.setattr(TaskAdmin, "clock", lambda self: clock["now"])
    # Calibrate the jitter to the admin request's own latency, so both orders happen.
    running("warm-up")
    clock["now"] = timezone.now()
    spread = latency(lambda: op.post(CHANGELIST, {"action": "release_stale_leases", "index": "0",
                                                  "_selected_action": ["warm-up"]}))
    op.get(CHANGELIST)  # consume the warm-up's message
    outcomes = Counter()
    for n in range(ROUNDS):
        task_id = f"rr-{n}"
        c = running(task_id)
        soon = timezone.now() + timedelta(seconds=30)
        Task.objects.filter(pk=task_id).update(lease_expires_at=soon)  # live for the holder...
        clock["now"] = soon + timedelta(seconds=1)  # ...expired for the admin's clock
        before = row(task_id)
        posted, renewed = race([
            lambda: op.post(CHANGELIST, {"action": "release_stale_leases", "index": "0",
                                         "_selected_action": [task_id]}),
            lambda: transitions.renew(task_id, c.lease.token, 600),
        ], jitter=[0, spread * 1.5])
        assert not isinstance(posted, BaseException), posted
        assert posted.status_code == 302
        shown = messages_of(op.get(CHANGELIST))
        reclaims = [e for e in events(task_id) if e[0] == "reclaim"]
        if isinstance(renewed, transitions.Claim):
            assert reclaims == [], f"round {n}: both won"
            assert row(task_id)["stage"] == Stage.RUNNING
            assert row(task_id)["fence"] == before["fence"]
            assert len(shown) == 1 and (
                re.fullmatch(rf"{task_id}: skipped: lease still live \(held by agent-1, expires in \d+ min\)", shown[0])
                or shown[0] == f"{task_id}: lost a race: task changed meanwhile (now RUNNING v2, held by agent-1)"
            ), shown
            outcomes["renew"] += 1
            transitions.complete(task_id, c.lease.token, {})
        else:
            assert isinstance(renewed, errors.LeaseLost), renewed
            assert len(reclaims) == 1, f"round {n}: neither or both won"
            assert row(task_id)["stage"] == Stage.QUEUED
            assert shown == [f"{task_id}: released (was held by agent-1, expired 1 s ago)"]
            outcomes["release"] += 1
        assert selectors.problems(now=timezone.now()) == []
    assert outcomes["renew"] + outcomes["release"] == ROUNDS
    print(f"release-stale vs renew over {ROUNDS} rounds: {dict(outcomes)}")


# ---------------------------------------------------------------------------------------------
# Force release


def test_force_release_asks_first_listing_each_holder_and_expiry(op):
    running("a", "agent-1")
    running("b", "agent-2", ttl=7200)
    new("q")
    before = db_state()
    response = op.post(CHANGELIST, {"action": "force_release", "index": "0", "_selected_action": ["a", "b", "q"]})
    assert response.status_code == 200
    assert [t.name for t in response.templates][0] == "admin/board/task/force_release_confirmation.html"
    html = response.content.decode()
    start = html.index('id="force-release-tasks"')
    table = html[start:html.index("</table>", start)]
    assert "agent-1" in table and "expires in 9 min" in table
    assert "agent-2" in table and "expires in 1 h 59 min" in table
    # The form carries the lease shown (holder and fence), not the version.
    assert 'name="holder_a" value="agent-1"' in html and 'name="fence_a" value="1"' in html
    assert 'name="holder_b" value="agent-2"' in html and 'name="fence_b" value="1"' in html
    assert 'name="version_a"' not in html
    assert "q: QUEUED" in html and 'name="fence_q"' not in html
    assert "the lease shown here" in html and "same holder and fence" in html
    assert db_state() == before  # asking changes nothing


def test_force_release_confirmed_on_a_mixed_selection(op):
    a = running("a", "agent-1")
    new("q")
    completed("done")
    confirm = {"post": "yes", "holder_a": "agent-1", "fence_a": "1"}  # what the confirmation page carries
    _, shown = act(op, "force_release", ["a", "q", "done"], **confirm)
    assert shown == [
        "a: released (was held by agent-1, lease had 9 min left)",
        "done: skipped: not RUNNING (is COMPLETED)",
        "q: skipped: not RUNNING (is QUEUED)",
    ]
    assert row("a")["stage"] == Stage.QUEUED and row("a")["owner"] == "" and row("a")["attempts"] == 0
    assert events("a")[-1] == ("force_release", "RUNNING", "QUEUED", 2, "op")
    assert TaskEvent.objects.filter(task_id="a").last().detail == {"previous_owner": "agent-1"}
    # The old holder's later calls are refused; the next claim gets a higher fence.
    with pytest.raises(errors.LeaseLost):
        transitions.renew("a", a.lease.token, 60)
    with pytest.raises(errors.LeaseLost):
        transitions.complete("a", a.lease.token, {})
    with pytest.raises(errors.LeaseLost):
        transitions.fail("a", a.lease.token, "late")
    again = transitions.claim("a", "agent-2", 60)
    assert again.lease.fence == a.lease.fence + 1


def confirmation_of(page) -> dict:
    """The confirmation page's form, as the browser would post it (its hidden inputs)."""
    page_html = page.content.decode()
    form = page_html[page_html.index('<form method="post">'):]
    data: dict = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        if name == "csrfmiddlewaretoken":
            continue
        data.setdefault(html.unescape(name), []).append(html.unescape(value))
    return data


def confirm(client: Client, page) -> list[str]:
    """Press the confirmation page's button: post its form; the messages shown after."""
    response = client.post(CHANGELIST, confirmation_of(page), follow=True)
    assert response.status_code == 200
    return messages_of(response)


class RenewingAgent:
    """A holder that renews its lease every `every` seconds through the engine, in its own
    thread (and connection), until stopped or until its lease is lost. `renewals` counts the
    renewals made; `wait_for(n)` blocks until n of them have been made (bounded)."""

    def __init__(self, task_id: str, token: str, every: float = 0.05, using: str = "default"):
        self.task_id, self.token, self.every, self.using = task_id, token, every, using
        self.renewals = 0
        self.lost: errors.LeaseLost | None = None
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._renewed = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    transitions.renew(self.task_id, self.token, 600, using=self.using)
                except errors.LeaseLost as exc:
                    self.lost = exc
                    return
                with self._renewed:
                    self.renewals += 1
                    self._renewed.notify_all()
                self._stop.wait(self.every)  # the agent's heartbeat cadence, not a synchronisation
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
            self.failure = exc
        finally:
            with self._renewed:
                self._renewed.notify_all()
            connections[self.using].close()

    def __enter__(self):
        self._thread.start()
        return self

    def wait_for(self, n: int) -> None:
        with self._renewed:
            assert self._renewed.wait_for(lambda: self.renewals >= n or not self._thread.is_alive(), timeout=30)
        assert self.failure is None, self.failure

    def wait_for_loss(self) -> None:
        """Until the agent's renew is refused (it stops then), bounded."""
        self._thread.join(timeout=30)
        assert not self._thread.is_alive() and self.failure is None, self.failure

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()
        assert self.failure is None, self.failure


def test_force_release_holds_to_the_lease_seen_not_to_the_version(op):
    """The holder renews every 50 ms (each renew bumps the version) while the operator reads
    the confirmation page: the release confirmed afterwards still applies, because the lease
    shown (holder and fence) is the one still held."""
    a = running("ops-live-1")
    with RenewingAgent("ops-live-1", a.lease.token) as agent:
        agent.wait_for(1)
        page = op.post(CHANGELIST, {"action": "force_release", "index": "0", "_selected_action": ["ops-live-1"]})
        assert page.status_code == 200
        # Counted before the row is read: the row may already hold one renew the agent's thread
        # has not counted yet (it counts after renew returns), never two.
        counted = agent.renewals
        seen_version = row("ops-live-1")["version"]
        agent.wait_for(counted + 4)  # the operator reads; the agent keeps renewing
        assert row("ops-live-1")["version"] >= seen_version + 3
        shown = confirm(op, page)
        assert shown == ["ops-live-1: released (was held by agent-1, lease had 9 min left)"]
        agent.wait_for_loss()
    assert isinstance(agent.lost, errors.LeaseLost)  # the holder's next renew was refused
    assert row("ops-live-1")["stage"] == Stage.QUEUED and row("ops-live-1")["owner"] == ""
    assert events("ops-live-1")[-1][:3] == ("force_release", "RUNNING", "QUEUED")
    assert transitions.claim("ops-live-1", "agent-2", 60).lease.fence == a.lease.fence + 1


@pytest.mark.parametrize("next_holder", ["agent-2", "agent-1"])
def test_force_release_of_a_lease_that_changed_hands_is_refused(op, next_holder):
    """The lease shown was taken back and claimed again (a new fence; even by an agent of the
    same name) before the operator confirmed: the new holder is left alone, and the row says
    why."""
    first = running("ops-live-2")
    page = op.post(CHANGELIST, {"action": "force_release", "index": "0", "_selected_action": ["ops-live-2"]})
    transitions.force_release("ops-live-2", actor="other-op")
    second = transitions.claim("ops-live-2", next_holder, 600)
    assert second.lease.fence == first.lease.fence + 1
    with RenewingAgent("ops-live-2", second.lease.token) as agent:
        agent.wait_for(2)
        shown = confirm(op, page)
    version = row("ops-live-2")["version"]
    assert len(shown) == 1 and re.fullmatch(
        rf"ops-live-2: lost a race: the lease changed hands since the confirmation page "
        rf"\(you saw agent-1's lease, fence 1; now held by {next_holder}, fence 2\); "
        rf"nothing was done \(now RUNNING v\d+, held by {next_holder}\)", shown[0]), shown
    assert version > 0 and agent.lost is None
    assert row("ops-live-2")["stage"] == Stage.RUNNING and row("ops-live-2")["fence"] == 2
    assert [e[0] for e in events("ops-live-2")].count("force_release") == 1  # only the other operator's
    transitions.complete("ops-live-2", second.lease.token, {"kept": True})


def test_force_release_with_nothing_running_skips_without_asking(op):
    new("q")
    failed("f", max_retries=0)
    before = db_state()
    response, shown = act(op, "force_release", ["q", "f"])
    assert "force_release_confirmation" not in [t.name for t in response.templates][0]
    assert shown == ["f: skipped: not RUNNING (is FAILED)", "q: skipped: not RUNNING (is QUEUED)"]
    assert db_state() == before


def test_force_release_confirmed_for_a_task_that_was_not_running_is_refused(op):
    """A forged confirmation (a lease for a QUEUED task) is refused by the engine."""
    new("q")
    before = db_state()
    _, shown = act(op, "force_release", ["q"], post="yes", holder_q="agent-1", fence_q="0")
    assert shown == [("q: lost a race: the task left RUNNING since the confirmation page; nothing was done "
                      "(now QUEUED v0)")]
    assert db_state() == before


def test_force_release_races_a_complete(op):
    """Force release (held to the version on the confirmation page) against the holder's
    complete, over many rounds: exactly one wins, the loser is told precisely."""
    running("warm-up")
    spread = latency(lambda: op.post(CHANGELIST, {"action": "force_release", "index": "0", "post": "yes",
                                                  "_selected_action": ["warm-up"], "holder_warm-up": "agent-1",
                                                  "fence_warm-up": "1"}))
    op.get(CHANGELIST)
    outcomes = Counter()
    for n in range(ROUNDS):
        task_id = f"fc-{n}"
        c = running(task_id)
        page = op.post(CHANGELIST, {"action": "force_release", "index": "0", "_selected_action": [task_id]})
        posted, done = race([
            lambda page=page: op.post(CHANGELIST, confirmation_of(page)),
            lambda: transitions.complete(task_id, c.lease.token, {"n": n}),
        ], jitter=[0, spread * 1.5])
        assert not isinstance(posted, BaseException), posted
        shown = messages_of(op.get(CHANGELIST))
        stage = row(task_id)["stage"]
        if isinstance(done, Task):
            assert stage == Stage.COMPLETED and row(task_id)["result"] == {"n": n}
            assert "force_release" not in [e[0] for e in events(task_id)], f"round {n}: both won"
            assert shown == [(f"{task_id}: lost a race: the task left RUNNING since the confirmation page; "
                              "nothing was done (now COMPLETED v2)")]
            outcomes["complete"] += 1
        else:
            assert isinstance(done, errors.LeaseLost), done
            assert stage == Stage.QUEUED
            assert [e[0] for e in events(task_id)] == ["create", "claim", "force_release"]
            assert re.fullmatch(rf"{task_id}: released \(was held by agent-1, lease had \d+ min left\)", shown[0])
            outcomes["force_release"] += 1
        assert selectors.problems() == []
    assert outcomes["complete"] + outcomes["force_release"] == ROUNDS
    print(f"force-release vs complete over {ROUNDS} rounds: {dict(outcomes)}")


# ---------------------------------------------------------------------------------------------
# Requeue, cancel, admit, pause


def test_requeue_on_a_mixed_selection(op):
    failed("f-left", max_retries=2)  # 1 of 3 attempts used
    failed("f-spent", max_retries=0)  # 1 of 1 used
    paused("p")
    running("r")
    completed("done")
    _, shown = act(op, "requeue", ["f-left", "f-spent", "p", "r", "done"])
    assert shown == [
        "done: skipped: task done is COMPLETED",
        "f-left: requeued (was FAILED)",
        "f-spent: skipped: no attempt left (1 / 1); use “Requeue and reset attempts”",
        "p: requeued (was PAUSED)",
        "r: skipped: cannot requeue task r: it is RUNNING; only FAILED or PAUSED tasks are requeued",
    ]
    assert row("f-left")["stage"] == Stage.QUEUED and row("f-left")["attempts"] == 1
    assert row("p")["stage"] == Stage.QUEUED and row("p")["checkpoint"] == {"step": 3}
    assert row("f-spent")["stage"] == Stage.FAILED
    assert events("f-left")[-1] == ("requeue", "FAILED", "QUEUED", 3, "op")


def test_requeue_and_reset_attempts(op):
    failed("f-spent", max_retries=0)
    paused("p")
    new("q")
    _, shown = act(op, "requeue_reset_attempts", ["f-spent", "p", "q"])
    assert shown == [
        "f-spent: requeued (was FAILED, attempts 1 → 0)",
        "p: requeued (was PAUSED, attempts 1 → 0)",
        "q: skipped: cannot requeue task q: it is QUEUED; only FAILED or PAUSED tasks are requeued",
    ]
    assert row("f-spent")["stage"] == Stage.QUEUED and row("f-spent")["attempts"] == 0
    assert TaskEvent.objects.filter(task_id="f-spent").last().detail == {"reset_attempts": True}
    transitions.claim("f-spent", "agent-2", 60)  # runnable again


def test_cancel_on_a_mixed_selection(op):
    new("q")
    held = running("r", "agent-4")
    paused("p")
    completed("done")
    cancelled("gone")
    _, shown = act(op, "cancel", ["q", "r", "p", "done", "gone"])
    assert shown == [
        "done: skipped: task done is COMPLETED",
        "gone: skipped: task gone is CANCELLED",
        "p: cancelled (was PAUSED)",
        "q: cancelled (was QUEUED)",
        "r: cancelled (was RUNNING, held by agent-4)",
    ]
    assert {row(t)["stage"] for t in ("q", "r", "p")} == {Stage.CANCELLED}
    assert row("r")["lease_token_hash"] is None
    with pytest.raises(errors.LeaseLost):
        transitions.complete("r", held.lease.token, {})
    assert events("r")[-1] == ("cancel", "RUNNING", "CANCELLED", 2, "op")


def test_admit_on_a_mixed_selection(op):
    new("held", on_hold=True)
    new("dep")
    new("waiting", deps=["dep"])
    new("q")
    _, shown = act(op, "admit", ["held", "waiting", "q"])
    assert shown == [
        "held: admitted (PENDING → QUEUED)",
        "q: skipped: cannot admit task q: it is QUEUED",
        "waiting: skipped: waiting for dep",
    ]
    assert row("held")["stage"] == Stage.QUEUED and row("held")["on_hold"] is False
    assert row("waiting")["stage"] == Stage.PENDING
    assert events("held")[-1] == ("admit", "PENDING", "QUEUED", 1, "op")


def test_pause_on_a_mixed_selection(op):
    with_checkpoint = running("cp", "agent-1")
    transitions.renew("cp", with_checkpoint.lease.token, 600, checkpoint={"page": 7})
    bare = running("bare", "agent-2")
    new("q")
    _, shown = act(op, "pause", ["cp", "bare", "q"])
    assert shown == [
        "bare: paused (was held by agent-2; no checkpoint saved: a resume starts over)",
        "cp: paused (was held by agent-1; checkpoint kept)",
        "q: skipped: cannot force_pause task q: it is QUEUED; only a RUNNING task can be paused",
    ]
    assert row("cp")["stage"] == Stage.PAUSED and row("cp")["checkpoint"] == {"page": 7}
    assert row("bare")["checkpoint"] == {}
    with pytest.raises(errors.LeaseLost):
        transitions.complete("cp", with_checkpoint.lease.token, {})
    with pytest.raises(errors.LeaseLost):
        transitions.renew("bare", bare.lease.token, 60)
    resumed = transitions.resume("cp", "agent-3", 60)
    assert resumed.task.checkpoint == {"page": 7} and resumed.lease.fence == with_checkpoint.lease.fence + 1
    assert events("cp")[-2] == ("force_pause", "RUNNING", "PAUSED", 3, "op")


@pytest.mark.parametrize("action, setup", [
    ("requeue", lambda: (new("q"), running("r"), completed("done"))),
    ("requeue_reset_attempts", lambda: (new("q"), running("r"), completed("done"))),
    ("cancel", lambda: (completed("q"), cancelled("r"), completed("done"))),
    ("admit", lambda: (new("q"), running("r"), completed("done"))),
    ("pause", lambda: (new("q"), paused("r"), completed("done"))),
    ("force_release", lambda: (new("q"), paused("r"), completed("done"))),
    ("release_stale_leases", lambda: (new("q"), running("r"), completed("done"))),
])
def test_an_action_on_ineligible_tasks_only_changes_nothing(op, action, setup):
    setup()
    before = db_state()
    _, shown = act(op, action, ["q", "r", "done"])
    assert len(shown) == 3 and all(": skipped: " in line for line in shown), shown
    assert db_state() == before


def lose_a_race(client, monkeypatch, action: str, verb: str, other_writer) -> list[str]:
    """Run `action` on task t while `other_writer` moves t between the action's read and its
    verb (the verb is held to the version read, so it must refuse)."""
    real = getattr(transitions, verb)

    def moved_first(task_id, **kwargs):
        other_writer()
        return real(task_id, **kwargs)

    monkeypatch.setattr(transitions, verb, moved_first)
    before = events("t")
    _, shown = act(client, action, ["t"])
    assert [e[0] for e in events("t")[len(before):]] != [] and verb not in [e[0] for e in events("t")[len(before):]]
    return shown


def test_requeue_that_loses_a_race_to_a_resume(op, monkeypatch):
    paused("t")
    resumed = {}
    shown = lose_a_race(op, monkeypatch, "requeue", "requeue",
                        lambda: resumed.setdefault("c", transitions.resume("t", "agent-2", 60)))
    assert shown == ["t: lost a race: task changed meanwhile (now RUNNING v3, held by agent-2)"]
    transitions.complete("t", resumed["c"].lease.token, {})


def test_cancel_that_loses_a_race_to_a_complete(op, monkeypatch):
    c = running("t")
    shown = lose_a_race(op, monkeypatch, "cancel", "cancel", lambda: transitions.complete("t", c.lease.token, {}))
    assert shown == ["t: lost a race: task changed meanwhile (now COMPLETED v2)"]
    assert row("t")["stage"] == Stage.COMPLETED


def test_admit_that_loses_a_race_to_another_operator(op, monkeypatch):
    new("t", on_hold=True)
    shown = lose_a_race(op, monkeypatch, "admit", "admit", lambda: transitions.cancel("t", actor="other-op"))
    assert shown == ["t: lost a race: task changed meanwhile (now CANCELLED v1)"]


def test_pause_that_loses_a_race_to_a_renew(op, monkeypatch):
    c = running("t")
    shown = lose_a_race(op, monkeypatch, "pause", "force_pause", lambda: transitions.renew("t", c.lease.token, 600))
    assert shown == ["t: lost a race: task changed meanwhile (now RUNNING v2, held by agent-1)"]
    transitions.complete("t", c.lease.token, {})


def test_the_reason_typed_in_the_action_bar_is_kept_in_the_history(op):
    new("q")
    a = running("a", "agent-1")
    _, shown = act(op, "cancel", ["q"], reason="duplicate of q2")
    assert shown == ["q: cancelled (was QUEUED)"]
    assert TaskEvent.objects.filter(task_id="q").last().detail == {"reason": "duplicate of q2"}
    page = op.post(CHANGELIST, {"action": "force_release", "index": "0", "_selected_action": ["a"],
                                "reason": "agent-1 is wedged"})
    assert 'name="reason" value="agent-1 is wedged"' in page.content.decode()
    _, shown = act(op, "force_release", ["a"], post="yes", holder_a="agent-1", fence_a="1", reason="agent-1 is wedged")
    assert TaskEvent.objects.filter(task_id="a").last().detail == {
        "previous_owner": "agent-1", "reason": "agent-1 is wedged"}
    with pytest.raises(errors.LeaseLost):
        transitions.complete("a", a.lease.token, {})


def test_an_action_over_too_many_tasks_refuses_to_start(op, monkeypatch):
    monkeypatch.setattr("board.admin.actions.MAX_ACTION_ROWS", 2)
    for n in range(3):
        new(f"t{n}", on_hold=True)
    before = db_state()
    _, shown = act(op, "admit", ["t0", "t1", "t2"])
    assert shown == ["Select at most 2 tasks per action; nothing was done."]
    assert db_state() == before


# ---------------------------------------------------------------------------------------------
# The change form: edits under the version guard


def test_the_change_form_edits_through_the_engine(op):
    new("e", payload={"a": 1}, priority=1)
    data = open_form(op, "e")
    assert data["opened_version"] == 0
    data.update(title="new title", priority="5", payload='{"a": 2}')
    response = op.post(change_url("e"), data)
    assert response.status_code == 302
    saved = row("e")
    assert (saved["title"], saved["priority"], saved["payload"], saved["version"]) == ("new title", 5, {"a": 2}, 1)
    event = TaskEvent.objects.filter(task_id="e").last()
    assert (event.verb, event.actor, event.version, event.detail) == ("edit", "op", 1, {"changed": ["payload", "priority", "title"]})


def test_the_change_form_edits_tags_and_refuses_a_bad_one(op):
    new("e", tags=["old"])
    data = open_form(op, "e")
    before = db_state()
    refused = op.post(change_url("e"), {**data, "tags": '["not a tag"]'})
    assert refused.status_code == 200 and "not a tag" in refused.content.decode()
    assert db_state() == before
    assert op.post(change_url("e"), {**data, "tags": '["urgent", "ci"]'}).status_code == 302
    assert (row("e")["tags"], TaskEvent.objects.filter(task_id="e").last().detail) == (["urgent", "ci"], {"changed": ["tags"]})


def test_saving_an_unchanged_form_writes_nothing(op):
    new("e")
    data = open_form(op, "e")
    before = db_state()
    assert op.post(change_url("e"), data).status_code == 302
    assert db_state() == before


def test_untouched_text_round_trips_without_an_edit(op):
    new("e", title="  spaced title ", description="line one\nline two")
    data = open_form(op, "e")
    data["description"] = data["description"].replace("\n", "\r\n")  # as a browser sends it
    before = db_state()
    assert op.post(change_url("e"), data).status_code == 302
    assert db_state() == before


def test_the_admin_never_saves_a_task_itself(op, monkeypatch):
    """Edits and creations are the engine's conditional writes: Model.save() is never called."""
    def refuse(*args, **kwargs):
        raise AssertionError("Task.save() called by the admin")

    monkeypatch.setattr(Task, "save", refuse)
    new("e")
    assert op.post(change_url("e"), {**open_form(op, "e"), "title": "edited"}).status_code == 302
    assert op.post(ADD, {"id": "made", "title": "t", "queue": "default", "priority": "0", "max_retries": "3",
                         "payload": "", "deps": ""}).status_code == 302
    assert row("e")["title"] == "edited" and row("made")["version"] == 0


def test_an_edit_saved_after_an_agents_claim_is_refused_with_what_changed(op):
    new("e")
    data = open_form(op, "e")
    claim = transitions.claim("e", "agent-1", 600)  # between the GET and the POST
    data["title"] = "operator's title"
    before = db_state()
    response = op.post(change_url("e"), data)
    assert response.status_code == 200
    errors_shown = response.context["adminform"].form.non_field_errors()
    assert errors_shown == [
        "Not saved: task e changed after you opened it (version 0 → 1: claim by agent-1). "
        "stage QUEUED → RUNNING; owner (none) → agent-1. "
        "Nothing was written; reload the page to edit the current task."
    ]
    assert errors_shown[0] in response.content.decode().replace("&gt;", ">").replace("&#x27;", "'")
    assert db_state() == before
    transitions.complete("e", claim.lease.token, {})


def test_an_edit_saved_after_another_operators_edit_shows_the_fields_that_changed(op):
    new("e", description="old words")
    data = open_form(op, "e")
    transitions.edit("e", actor="other-op", version=0, description="their words", priority=3)
    data["title"] = "mine"
    before = db_state()
    response = op.post(change_url("e"), data)
    assert response.context["adminform"].form.non_field_errors() == [
        "Not saved: task e changed after you opened it (version 0 → 1: edit by other-op). "
        'description "old words" → "their words"; priority 0 → 3. '
        "Nothing was written; reload the page to edit the current task."
    ]
    assert db_state() == before


def test_invalid_input_shows_the_engines_message(op):
    c = running("e", max_retries=3)
    transitions.fail("e", c.lease.token, "x")  # attempt 1 -> retry
    Task.objects.filter(pk="e").update(not_before=None)
    c = transitions.claim("e", "agent-1", 600)  # attempt 2
    data = open_form(op, "e")
    before = db_state()
    response = op.post(change_url("e"), {**data, "title": "   "})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["title"] == [
        "title must be non-empty text of at most 300 characters"
    ]
    response = op.post(change_url("e"), {**data, "max_retries": "0"})
    assert response.context["adminform"].form.errors["max_retries"] == [
        "task e has run 2 times; max_retries cannot go below 1"
    ]
    response = op.post(change_url("e"), {**data, "payload": '{"x": NaN}'})
    assert response.context["adminform"].form.errors["payload"] == [
        "payload is not valid JSON: NaN and Infinity are not numbers in JSON"
    ]
    response = op.post(change_url("e"), {**data, "max_retries": "101"})
    assert response.context["adminform"].form.errors["max_retries"] == ["max_retries must be an integer from 0 to 100"]
    assert db_state() == before
    transitions.complete("e", c.lease.token, {})


def test_the_admin_cannot_store_what_the_api_refuses(op):
    """The caps on a task's own fields are the engine's, so the change and add forms meet them
    too (they do not go through the API's schemas): 256 KiB of JSON for a payload, the
    description's characters. Each refusal marks its field; nothing is written."""
    new("e")
    big = json.dumps({"blob": "x" * MAX_JSON_FIELD_BYTES})
    size = len(json.dumps(json.loads(big), separators=(",", ":")))
    too_large = [f"payload is {size} bytes of JSON; the limit is {MAX_JSON_FIELD_BYTES}"]
    data = open_form(op, "e")
    before = db_state()
    response = op.post(change_url("e"), {**data, "payload": big})
    assert response.status_code == 200 and response.context["adminform"].form.errors["payload"] == too_large
    response = op.post(change_url("e"), {**data, "description": "d" * (MAX_DESCRIPTION_CHARS + 1)})
    assert response.context["adminform"].form.errors["description"] == [
        f"description must be text of at most {MAX_DESCRIPTION_CHARS} characters"]
    response = op.post(ADD, {"id": "big", "title": "t", "description": "", "queue": "default", "priority": "0",
                             "max_retries": "3", "payload": big, "deps": ""})
    assert response.status_code == 200 and response.context["adminform"].form.errors["payload"] == too_large
    assert db_state() == before


def test_an_engine_refusal_marks_the_field_it_names_whatever_its_wording(op, monkeypatch):
    """The form field comes from the error's `field`, not from words of its message: a message
    that names no field (or the wrong one) still marks the right field."""
    new("e")
    data = open_form(op, "e")

    def refuse(task_id, **changes):
        raise errors.InvalidRequest("too much of something (see the title)", field="description")

    monkeypatch.setattr(transitions, "edit", refuse)
    before = db_state()
    response = op.post(change_url("e"), {**data, "description": "new text"})
    form = response.context["adminform"].form
    assert form.errors == {"description": ["too much of something (see the title)"]}
    assert db_state() == before


def test_a_damaged_form_is_refused(op):
    new("e")
    data = open_form(op, "e")
    before = db_state()
    for damage in ({"opened_state": data["opened_state"] + "x"}, {"opened_version": "7"}):
        response = op.post(change_url("e"), {**data, "title": "t", **damage})
        assert response.context["adminform"].form.non_field_errors() == [
            "This form is damaged or was not opened here; reload the page."
        ]
    assert db_state() == before


def test_a_finished_task_is_shown_read_only_and_an_edit_of_it_is_refused(op):
    new("e")
    data = open_form(op, "e")
    completed_claim = transitions.claim("e", "agent-1", 60)
    transitions.complete("e", completed_claim.lease.token, {"r": 1})
    page = op.get(change_url("e")).content.decode()
    assert 'name="title"' not in page and 'name="_save"' not in page
    before = db_state()
    response = op.post(change_url("e"), {**data, "title": "late"})
    assert response.status_code == 200
    [message] = response.context["adminform"].form.non_field_errors()
    assert message.startswith("Not saved: task e changed after you opened it (version 0 → 2: claim by agent-1, "
                              "complete by agent-1). stage QUEUED → COMPLETED.")
    assert db_state() == before


def test_the_history_inline_is_read_only_ordered_and_names_the_operator(op):
    c = running("h", "agent-1")
    transitions.renew("h", c.lease.token, 600)
    act(op, "pause", ["h"])
    act(op, "requeue", ["h"])
    response = op.get(change_url("h"))
    assert response.context["inline_admin_formsets"] == []  # the history is no inline: nothing to post
    shown = [(r.verb, r.actor, r.renewals) for r in history_rows(response)]
    assert shown == [("create", "test", 0), ("claim", "agent-1", 0), ("renew", "agent-1", 1),
                     ("force_pause", "op", 0), ("requeue", "op", 0)]
    html = response.content.decode()
    assert "RUNNING → PAUSED" in html and "PAUSED → QUEUED" in html
    assert 'name="events-0-verb"' not in html  # no editable inputs


def test_an_edit_racing_a_claim(op):
    """An edit (opened at version v) and an agent's claim, released together, over many rounds:
    the claim always succeeds (agents are not version-guarded); the edit is written only when
    it reached the task before the claim, and refused with what changed otherwise. Nothing
    is ever written over a version the operator did not see."""
    new("warm-up")
    warm = {**open_form(op, "warm-up"), "title": "w"}
    spread = latency(lambda: op.post(change_url("warm-up"), warm))
    outcomes = Counter()
    for n in range(ROUNDS):
        task_id = f"ec-{n}"
        new(task_id)
        data = {**open_form(op, task_id), "title": f"edited {n}"}
        posted, claimed = race([
            lambda: op.post(change_url(task_id), data),
            lambda: transitions.claim(task_id, "agent-1", 600),
        ], jitter=[spread, spread])
        assert isinstance(claimed, transitions.Claim), claimed
        assert not isinstance(posted, BaseException), posted
        history = events(task_id)
        saved = row(task_id)
        assert saved["stage"] == Stage.RUNNING and saved["owner"] == "agent-1"
        if posted.status_code == 302:
            assert [e[0] for e in history] == ["create", "edit", "claim"]
            assert history[1][3] == 1  # written over version 0, the one the form showed
            assert saved["title"] == f"edited {n}"
            outcomes["edit then claim"] += 1
        else:
            assert posted.status_code == 200
            assert "changed after you opened it (version 0 → 1: claim by agent-1)" in posted.content.decode()
            assert [e[0] for e in history] == ["create", "claim"]
            assert saved["title"] == f"title of {task_id}"
            outcomes["claim, edit refused"] += 1
        transitions.complete(task_id, claimed.lease.token, {})
    assert sum(outcomes.values()) == ROUNDS
    print(f"edit vs claim over {ROUNDS} rounds: {dict(outcomes)}")


def test_two_operators_saving_the_same_version_exactly_one_wins():
    users = [make_user(f"op{i}", OPERATOR_PERMS) for i in range(2)]
    clients = [client_for(u) for u in users]
    outcomes = Counter()
    for n in range(ROUNDS):
        task_id = f"ee-{n}"
        new(task_id)
        forms = [{**open_form(c, task_id), "title": f"by op{i}"} for i, c in enumerate(clients)]
        results = race([lambda i=i: clients[i].post(change_url(task_id), forms[i]) for i in range(2)])
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 302], f"round {n}: {codes}"
        winner = [i for i, r in enumerate(results) if r.status_code == 302][0]
        loser = results[1 - winner]
        assert row(task_id)["title"] == f"by op{winner}" and row(task_id)["version"] == 1
        assert f"edit by op{winner}" in loser.content.decode()
        outcomes[winner] += 1
    assert sum(outcomes.values()) == ROUNDS


# ---------------------------------------------------------------------------------------------
# Adding a task goes through transitions.create


def test_adding_a_task_calls_the_engine(op):
    new("dep")
    response = op.post(ADD, {"id": "made", "title": "made here", "description": "", "queue": "default",
                             "priority": "2", "max_retries": "1", "payload": '{"x": 1}', "deps": "dep"})
    assert response.status_code == 302
    made = row("made")
    assert (made["stage"], made["priority"], made["payload"], made["version"]) == (Stage.PENDING, 2, {"x": 1}, 0)
    assert events("made") == [("create", "", "PENDING", 0, "op")]
    assert selectors.deps_of(["made"]) == {"made": ["dep"]}


def test_a_task_added_with_deadlines_shows_them_on_its_page(op):
    response = op.post(ADD, {"id": "timed", "title": "t", "description": "", "queue": "default", "priority": "0",
                             "max_retries": "3", "payload": "", "deps": "", "queue_timeout_seconds": "600",
                             "attempt_timeout_seconds": "", "progress_timeout_seconds": "120"})
    assert response.status_code == 302
    made = row("timed")
    assert (made["queue_timeout_seconds"], made["attempt_timeout_seconds"], made["progress_timeout_seconds"]) == (
        600, None, 120)
    page = op.get(change_url("timed")).content.decode()
    assert "Deadlines" in page and "600" in page and "120" in page


@pytest.mark.parametrize("fields, field, message", [
    ({"id": "taken"}, "id", "a task with id 'taken' already exists"),
    ({"id": "bad id"}, "id", None),
    ({"deps": "nope"}, "deps", "unknown dependencies: nope"),
    ({"title": "  "}, "title", "title must be non-empty text of at most 300 characters"),
    ({"queue": "a b"}, "queue", "invalid queue name 'a b'"),
    ({"attempt_timeout_seconds": "0"}, "attempt_timeout_seconds",
     "attempt_timeout_seconds must be a whole number of seconds from 1 to 2592000"),
])
def test_adding_an_invalid_task_shows_the_engines_message(op, fields, field, message):
    new("taken")
    before = db_state()
    data = {"id": "", "title": "t", "description": "", "queue": "default", "priority": "0",
            "max_retries": "3", "payload": "", "deps": "", **fields}
    response = op.post(ADD, data)
    assert response.status_code == 200
    shown = response.context["adminform"].form.errors[field]
    assert shown and (message is None or shown == [message])
    assert db_state() == before


def test_tasks_are_never_deleted_through_the_admin(op):
    new("t")
    assert op.get(reverse("admin:board_task_delete", args=["t"])).status_code == 403
    response = op.post(CHANGELIST, {"action": "delete_selected", "index": "0", "_selected_action": ["t"],
                                    "post": "yes"}, follow=True)
    assert messages_of(response) == ["No action selected."]
    assert Task.objects.filter(pk="t").exists()


# ---------------------------------------------------------------------------------------------
# Permissions and CSRF


def test_staff_without_intervene_get_a_read_only_admin(viewer):
    c = running("r")
    expire_lease("r")
    new("h", on_hold=True)
    response = viewer.get(CHANGELIST)
    assert response.status_code == 200
    assert response.context["action_form"] is None
    assert "Release stale leases" not in response.content.decode()
    assert 'name="_selected_action"' not in response.content.decode()
    page = viewer.get(change_url("h"))
    assert page.status_code == 200 and page.context["title"] == "View task"
    assert 'name="title"' not in page.content.decode()
    assert [r.verb for r in history_rows(page)] == ["create"]  # the history is visible to viewers
    assert viewer.get(ADD).status_code == 403
    before = db_state()
    # Forged POSTs: every action, and the change form.
    for action in ("release_stale_leases", "force_release", "cancel", "admit", "requeue", "pause", "replay"):
        forged = viewer.post(CHANGELIST, {"action": action, "index": "0", "_selected_action": ["r", "h"],
                                          "post": "yes", "holder_r": "agent-1", "fence_r": "1"}, follow=True)
        assert forged.status_code == 200
    data = {"title": "x", "description": "", "priority": "0", "max_retries": "3", "payload": "",
            "opened_version": "0", "opened_state": TaskEditForm.seal(Task.objects.get(pk="h")), "_save": "Save"}
    assert viewer.post(change_url("h"), data).status_code == 403
    assert viewer.post(ADD, {"id": "new", "title": "x", "queue": "default", "priority": "0",
                             "max_retries": "3"}).status_code == 403
    assert db_state() == before
    transitions.reclaim_expired()  # leave the board consistent
    with pytest.raises(errors.LeaseLost):
        transitions.complete("r", c.lease.token, {})


def test_change_permission_without_intervene_is_still_read_only():
    client = client_for(make_user("changer", ["board.view_task", "board.change_task"]))
    new("t")
    assert client.get(CHANGELIST).context["action_form"] is None
    data = {"title": "x", "description": "", "priority": "0", "max_retries": "3", "payload": "",
            "opened_version": "0", "opened_state": TaskEditForm.seal(Task.objects.get(pk="t")), "_save": "Save"}
    before = db_state()
    assert client.post(change_url("t"), data).status_code == 403
    forged = client.post(CHANGELIST, {"action": "cancel", "index": "0", "_selected_action": ["t"]}, follow=True)
    assert forged.status_code == 200
    assert db_state() == before


def test_intervene_lets_an_operator_act():
    client = client_for(make_user("intervener", ["board.view_task", "board.intervene"]))
    new("t", on_hold=True)
    _, shown = act(client, "admit", ["t"])
    assert shown == ["t: admitted (PENDING → QUEUED)"]


def test_non_staff_and_anonymous_are_sent_to_the_login_page():
    new("t")
    anonymous = HttpsClient()
    assert anonymous.get(CHANGELIST).status_code == 302
    user = make_user("someone", ["board.view_task", "board.intervene"], staff=False)
    client = client_for(user)
    before = db_state()
    response = client.post(CHANGELIST, {"action": "cancel", "index": "0", "_selected_action": ["t"]})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert db_state() == before


def test_csrf_is_enforced():
    user = make_user("op", OPERATOR_PERMS)
    client = client_for(user, enforce_csrf_checks=True)
    new("t", on_hold=True)
    before = db_state()
    no_token = client.post(CHANGELIST, {"action": "admit", "index": "0", "_selected_action": ["t"]})
    assert no_token.status_code == 403
    data = open_form(client, "t")
    assert client.post(change_url("t"), {**data, "title": "x"}).status_code == 403
    assert db_state() == before
    # The same POST with the token (and the Referer an https form sends) is accepted.
    token = client.cookies["csrftoken"].value
    ok = client.post(CHANGELIST, {"action": "admit", "index": "0", "_selected_action": ["t"],
                                  "csrfmiddlewaretoken": token}, HTTP_REFERER="https://testserver" + CHANGELIST)
    assert ok.status_code == 302 and row("t")["stage"] == Stage.QUEUED


# ---------------------------------------------------------------------------------------------
# Speed and secrecy


def _changelist_queries(client, query: str = "") -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(CHANGELIST + query)
    assert response.status_code == 200
    return len(ctx.captured_queries)


def _fill(start: int, stop: int) -> None:
    for n in range(start, stop):
        if n % 3 == 0:
            running(f"t{n:03}", f"agent-{n % 4}", queue=f"q{n % 2}")
            if n % 2:
                expire_lease(f"t{n:03}")
        else:
            new(f"t{n:03}", queue=f"q{n % 2}", on_hold=n % 3 == 1)


@pytest.mark.parametrize("query", ["", "?lease=expired", "?lease=live&stage__exact=RUNNING", "?owner=agent-1",
                                   "?queue=q1&o=5", "?q=t001"])
def test_the_changelist_query_count_does_not_grow_with_tasks(op, query):
    _fill(0, 5)
    few = _changelist_queries(op, query)
    _fill(5, 50)
    many = _changelist_queries(op, query)
    assert few == many, f"{few} queries for 5 tasks, {many} for 50"
    assert many <= 12
    transitions.reclaim_expired()


def test_the_changelist_shows_the_columns_operators_need(op):
    running("live", "agent-1")
    running("stale", "agent-2", max_retries=2)
    expire_lease("stale")
    new("q")
    response = op.get(CHANGELIST + "?o=1")  # by id
    rows = [[str(cell) for cell in r] for r in response.context["cl"].result_list.values_list(
        "id", "owner", "fence", "version")]
    assert rows == [["live", "agent-1", "1", "1"], ["q", "", "0", "0"], ["stale", "agent-2", "1", "1"]]
    html = response.content.decode()
    assert "in 9 min" in html and "expired" in html and "1 / 3" in html and "1 / 4" in html
    expired_only = op.get(CHANGELIST + "?lease=expired")
    assert [t.pk for t in expired_only.context["cl"].result_list] == ["stale"]
    none = op.get(CHANGELIST + "?lease=none")
    assert [t.pk for t in none.context["cl"].result_list] == ["q"]
    by_owner = op.get(CHANGELIST + "?owner=agent-1")
    assert [t.pk for t in by_owner.context["cl"].result_list] == ["live"]
    searched = op.get(CHANGELIST + "?q=agent-2")
    assert [t.pk for t in searched.context["cl"].result_list] == ["stale"]
    transitions.reclaim_expired()


def test_the_queue_filter_offers_the_first_queues_by_name_and_the_chosen_one(viewer):
    """Queue names are the clients' choice: the filter offers QUEUE_FILTER_LIMIT of them, the
    first by name (one DISTINCT with a limit), plus the one chosen; any other is found by
    ?queue= or the search box (issue 27)."""
    from board.admin.filters import QUEUE_FILTER_LIMIT

    transitions.create([TaskSpec(id=f"t{n:03}", title="t", queue=f"q{n:03}") for n in range(QUEUE_FILTER_LIMIT + 10)],
                       actor="test")

    def offered(response) -> list[str]:
        return [html.unescape(q) for q in re.findall(r'href="\?queue=([^"&]+)"', response.content.decode())]

    page = viewer.get(CHANGELIST)
    assert offered(page) == [f"q{n:03}" for n in range(QUEUE_FILTER_LIMIT)]
    assert f"queue (the first {QUEUE_FILTER_LIMIT} by name; search finds any)" in page.content.decode()
    last = f"q{QUEUE_FILTER_LIMIT + 9:03}"
    chosen = viewer.get(CHANGELIST, {"queue": last})
    # (The other filters' "All" links keep the chosen queue: count distinct names.)
    assert set(offered(chosen)) == {f"q{n:03}" for n in range(QUEUE_FILTER_LIMIT)} | {last}
    assert re.search(rf'<li class="selected">\s*<a href="\?queue={last}"', chosen.content.decode())
    assert [t.pk for t in chosen.context["cl"].result_list] == [f"t{QUEUE_FILTER_LIMIT + 9:03}"]
    transitions.create([TaskSpec(id="few", title="t", queue="q000")], actor="test")
    Task.objects.filter(queue__gt="q001").delete()
    assert offered(viewer.get(CHANGELIST)) == ["q000", "q001"]  # under the cap: all, as before
    assert "queue (the first" not in viewer.get(CHANGELIST).content.decode()


def test_no_admin_page_shows_a_lease_token_or_its_hash(op):
    claims = [running("a", "agent-1"), running("b", "agent-2")]
    expire_lease("b")
    secrets = []
    for c in claims:
        secrets += [c.lease.token, hash_token(c.lease.token)]
    # A lease made by a claim request keeps its seed and the request's hash (issue 27).
    new("c")
    claims.append(transitions.claim("c", "agent-3", 600, request_id="a-request-id"))
    seeded = Task.objects.get(pk="c")
    secrets += [claims[-1].lease.token, seeded.lease_token_hash, seeded.claim_token_seed, seeded.claim_request_hash]
    key_row, key = agent_keys.create_key("agent-1")
    pages = [
        op.get(CHANGELIST), op.get(CHANGELIST + "?lease=live"), op.get(CHANGELIST + "?q=a"),
        op.get(change_url("a")), op.get(change_url("b")), op.get(change_url("c")),
        op.get(reverse("admin:board_task_history", args=["a"]), follow=True),
        op.post(CHANGELIST, {"action": "force_release", "index": "0", "_selected_action": ["a", "b", "c"]}),
        op.get(KEYS), op.get(reverse("admin:board_agentkey_change", args=[key_row.pk])),
        op.get(reverse("admin:index")), op.get(reverse("admin:app_list", args=["board"])),
    ]
    secrets += [key, key_row.key_hash]
    for page in pages:
        assert page.status_code == 200
        body = page.content
        for secret in secrets:
            assert secret.encode() not in body
        assert b"lease_token_hash" not in body and b"key_hash" not in body
        assert b"claim_token_seed" not in body and b"claim_request_hash" not in body
    transitions.reclaim_expired()


# ---------------------------------------------------------------------------------------------
# Agent keys


def test_a_key_is_created_through_the_engine_and_shown_once(op):
    response = op.post(KEY_ADD, {"name": "agent-7", "is_operator": "on"})
    assert response.status_code == 200
    key = response.context["key"]
    assert key.startswith(agent_keys.KEY_PREFIX) and key in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    stored = AgentKey.objects.get(name="agent-7")
    assert stored.is_operator and stored.key_hash == hash_token(key) and key.startswith(stored.prefix)
    assert agent_keys.authenticate(key).pk == stored.pk
    # Never again: not in the list, not on its page, not in a message, not in the session.
    for page in (op.get(KEYS), op.get(reverse("admin:board_agentkey_change", args=[stored.pk])),
                 op.get(reverse("admin:index"))):
        assert key.encode() not in page.content and stored.key_hash.encode() not in page.content
    assert all(key not in str(s.get_decoded()) for s in Session.objects.all())


def test_a_key_with_an_invalid_name_is_refused_with_the_engines_message(op):
    response = op.post(KEY_ADD, {"name": "no spaces"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["name"] == [
        "agent name: 1-100 letters, digits and ._:- starting with a letter or digit"
    ]
    assert not AgentKey.objects.exists()


def test_keys_list_shows_last_use_and_revoke_reports_row_by_row(op):
    live, key = agent_keys.create_key("alpha")
    gone, _ = agent_keys.create_key("beta")
    agent_keys.revoke(gone.pk)
    agent_keys.authenticate(key)
    response = op.get(KEYS)
    cl = response.context["cl"]
    assert [(k.name, k.last_used_at is not None, k.revoked_at is not None) for k in cl.result_list] == [
        ("alpha", True, False), ("beta", False, True)]
    response = op.post(KEYS, {"action": "revoke", "index": "0", "_selected_action": [live.pk, gone.pk]}, follow=True)
    assert messages_of(response) == [f"alpha ({live.prefix}…): revoked", f"beta ({gone.prefix}…): skipped: already revoked"]
    assert agent_keys.authenticate(key) is None


def test_a_key_is_never_renamed_or_deleted(op):
    """Its page edits its capabilities only: a name, a kind or queues sent with them are not read."""
    stored, _ = agent_keys.create_key("alpha")
    url = reverse("admin:board_agentkey_change", args=[stored.pk])
    page = op.get(url)
    assert page.status_code == 200 and 'name="name"' not in page.content.decode()
    before = key_row(stored.pk)
    assert op.post(url, {"name": "renamed", "is_operator": "on", "queues": "x", "capabilities": ""}).status_code == 302
    assert op.get(reverse("admin:board_agentkey_delete", args=[stored.pk])).status_code == 403
    assert key_row(stored.pk) == before


def key_row(pk: int) -> dict:
    """Every column of a key, as stored."""
    return AgentKey.objects.filter(pk=pk).values().get()


def key_page(pk: int) -> str:
    return reverse("admin:board_agentkey_change", args=[pk])


def test_a_key_is_added_with_capabilities_and_its_page_changes_them(op):
    """Capabilities (issue 32, item 3): the add form passes them to create_key (sorted, each once);
    the list shows them; the key's page changes them through agent_keys.set_capabilities, and a
    claim with the key sees the change at once (this process forgets what it verified)."""
    made = op.post(KEY_ADD, {"name": "gpu-1", "capabilities": "python, gpu, python"})
    assert made.status_code == 200, made.context["adminform"].form.errors if made.context else made
    key = made.context["key"]
    assert "with the capabilities <code>gpu,python</code>" in made.content.decode()
    stored = AgentKey.objects.get(name="gpu-1")
    assert stored.capabilities == "gpu,python"
    assert agent_keys.capabilities_of(agent_keys.authenticate_deferred(key)) == ("gpu", "python")
    agent_keys.create_key("plain")
    listed = op.get(KEYS)
    assert [(k.name, op_column(listed, k)) for k in listed.context["cl"].result_list] == [
        ("gpu-1", "gpu, python"), ("plain", "none")]

    page = op.get(key_page(stored.pk))
    assert 'name="capabilities" value="gpu,python"' in page.content.decode()
    changed = op.post(key_page(stored.pk), {"capabilities": "model:opus, gpu,python "}, follow=True)
    assert changed.status_code == 200 and changed.redirect_chain[-1][0] == KEYS
    assert key_row(stored.pk)["capabilities"] == "gpu,model:opus,python"
    assert agent_keys.capabilities_of(agent_keys.authenticate_deferred(key)) == ("gpu", "model:opus", "python")
    # Emptied: the agent takes only tasks that require nothing.
    op.post(key_page(stored.pk), {"capabilities": ""})
    assert key_row(stored.pk)["capabilities"] == ""


def op_column(response, key: AgentKey) -> str:
    """The Capabilities column of `key`'s row, as the changelist renders it."""
    return response.context["cl"].model_admin.capability_list(key)


def test_a_bad_capability_is_the_fields_error_and_changes_nothing(op):
    stored, _ = agent_keys.create_key("gpu-1", capabilities="gpu")
    before = key_row(stored.pk)
    for bad, message in (("gpu, bad label", "capability 'bad label': "), ("-gpu", "capability '-gpu': "),
                         (",".join(f"c{n}" for n in range(40)), "a key has at most 32 capabilities")):
        refused = op.post(key_page(stored.pk), {"capabilities": bad})
        assert refused.status_code == 200
        [error] = refused.context["adminform"].form.errors["capabilities"]
        assert error.startswith(message), error
        assert key_row(stored.pk) == before
    # Nor is a key minted with one.
    refused = op.post(KEY_ADD, {"name": "gpu-2", "capabilities": "gpu, a b"})
    assert refused.context["adminform"].form.errors["capabilities"][0].startswith("capability 'a b': ")
    assert list(AgentKey.objects.values_list("name", flat=True)) == ["gpu-1"]


def test_capabilities_need_the_change_permission_and_a_live_key(viewer, op):
    stored, _ = agent_keys.create_key("gpu-1", capabilities="gpu")
    clerk = client_for(make_user("clerk", ["board.view_agentkey", "board.add_agentkey"]))
    for client in (viewer, clerk):
        page = client.get(key_page(stored.pk)).content.decode()
        assert 'name="capabilities"' not in page and "gpu" in page  # shown, read-only
        assert client.post(key_page(stored.pk), {"capabilities": "gpu,python"}).status_code == 403
    assert key_row(stored.pk)["capabilities"] == "gpu"
    # An ended key's page is read-only for everyone: its capabilities no longer matter.
    agent_keys.revoke(stored.pk)
    assert 'name="capabilities"' not in op.get(key_page(stored.pk)).content.decode()
    assert op.post(key_page(stored.pk), {"capabilities": "gpu,python"}).status_code == 403
    assert key_row(stored.pk)["capabilities"] == "gpu"
    # A rotated key keeps working through its grace: its capabilities still change.
    agent_keys.create_key("gpu-2")
    old, _ = agent_keys.create_key("gpu-3")
    agent_keys.create_key("gpu-3", rotate=timedelta(minutes=5))
    assert op.post(key_page(old.pk), {"capabilities": "python"}).status_code == 302
    assert key_row(old.pk)["capabilities"] == "python"


def test_the_task_page_shows_what_a_task_requires_and_prefers_read_only(op):
    new("train", requires=["python", "gpu"], prefers={"model:opus": 3, "fast": 1})
    new("plain")
    page = op.get(change_url("train")).content.decode()
    assert re.search(r'<div class="readonly">gpu, python<br>task train requires gpu, python: no agent key used in the '
                     r'last hour holds all of them', page), "requires, and that nobody seen can take it"
    assert '<div class="readonly">fast (weight 1), model:opus (weight 3)</div>' in page
    assert 'name="requires"' not in page and 'name="prefers"' not in page
    plain = op.get(change_url("plain")).content.decode()
    assert '<div class="readonly">— (any agent may claim it)</div>' in plain
    # An agent holding both was seen: the page only lists them (and check() is clean again).
    _, key = agent_keys.create_key("gpu-agent", capabilities="gpu,python")
    agent_keys.authenticate(key)
    assert '<div class="readonly">gpu, python</div>' in op.get(change_url("train")).content.decode()


def test_viewer_cannot_create_or_revoke_keys(viewer):
    stored, key = agent_keys.create_key("alpha")
    assert viewer.get(KEYS).status_code == 200
    assert viewer.post(KEY_ADD, {"name": "mine"}).status_code == 403
    viewer.post(KEYS, {"action": "revoke", "index": "0", "_selected_action": [stored.pk]})
    assert agent_keys.authenticate(key) is not None
    assert AgentKey.objects.count() == 1


# ---------------------------------------------------------------------------------------------
# Issue 11: one summary per action, ids as they are, links to the board, the task's history,
# tracebacks, search, the read-only admin


def messagelist_items(response) -> list[str]:
    """The page's message banners, as rendered (an action's per-task lines are not banners)."""
    return re.findall(r'<li class="(?:debug|info|success|warning|error)">', response.content.decode())


def test_a_bulk_cancel_of_hundreds_of_tasks_gives_one_summary_with_exact_counts(op, monkeypatch):
    transitions.create([TaskSpec(id=f"bulk-{n:03}", title=f"bulk {n}") for n in range(300)], actor="test")
    for n in range(7):
        completed(f"done-{n}")
    for n in range(5):
        cancelled(f"gone-{n}")
    losers = {"bulk-010", "bulk-150", "bulk-299"}
    real_cancel = transitions.cancel

    def an_agent_claims_first(task_id, **kwargs):
        if task_id in losers:  # an agent claims it between the action's read and its verb
            transitions.claim(task_id, "agent-9", 600)
        return real_cancel(task_id, **kwargs)

    monkeypatch.setattr(transitions, "cancel", an_agent_claims_first)
    selected = [f"bulk-{n:03}" for n in range(300)] + [f"done-{n}" for n in range(7)] + [f"gone-{n}" for n in range(5)]
    response, lines = act(op, "cancel", selected)
    assert len(response.context["messages"]) == 1
    assert len(messagelist_items(response)) == 1  # one banner on the page
    assert summaries_of(response) == [(
        "Cancel, 312 tasks: 297 done; 12 skipped (7 is COMPLETED, 5 is CANCELLED); "
        "3 lost a race (changed meanwhile; left alone)."
    )]
    assert len(lines) == 312
    outcomes = Counter(line.split(": ", 1)[1].split(" (")[0].split(":")[0] for line in lines)
    assert outcomes == {"cancelled": 297, "skipped": 12, "lost a race": 3}
    assert "bulk-010: lost a race: task changed meanwhile (now RUNNING v1, held by agent-9)" in lines
    assert "done-0: skipped: task done-0 is COMPLETED" in lines
    page = response.content.decode()
    assert '<details class="action-rows"><summary>Each task (312)</summary>' in page  # collapsed
    assert Task.objects.filter(stage=Stage.CANCELLED).count() == 297 + 5
    assert Task.objects.filter(stage=Stage.RUNNING, owner="agent-9").count() == 3


def test_an_action_that_does_everything_it_was_asked_says_so_in_one_success_message(op):
    for n in range(3):
        new(f"h{n}", on_hold=True)
    response, lines = act(op, "admit", ["h0", "h1", "h2"])
    [message] = list(response.context["messages"])
    assert message.level_tag == "success"
    assert summaries_of(response) == ["Admit, 3 tasks: 3 done."]
    assert lines == [f"h{n}: admitted (PENDING → QUEUED)" for n in range(3)]


def test_ids_are_shown_as_they_are_not_capitalised(op):
    """Django's admin capitalises each message's first letter; ids are case-sensitive."""
    new("ops-live-1")
    new("Ops-live-1")  # another task: only the case differs
    response, lines = act(op, "cancel", ["ops-live-1"])
    assert lines == ["ops-live-1: cancelled (was QUEUED)"]
    page = response.content.decode()
    assert "ops-live-1: cancelled" in page and "Ops-live-1: cancelled" not in page
    assert row("Ops-live-1")["stage"] == Stage.QUEUED
    key, _ = agent_keys.create_key("worker-a")
    revoked = op.post(KEYS, {"action": "revoke", "index": "0", "_selected_action": [key.pk]}, follow=True)
    assert f"worker-a ({key.prefix}…): revoked" in revoked.content.decode()
    assert summaries_of(revoked) == ["Revoke, 1 key: 1 done."]


def test_the_change_page_and_the_list_link_to_the_tasks_card_on_the_board(op):
    new("ops:live-1")  # an id that needs quoting in a URL
    board_link = "/board/?task=ops%3Alive-1"
    page = op.get(change_url("ops:live-1"))
    assert page.status_code == 200
    assert f'href="{board_link}"' in page.content.decode()
    listed = op.get(CHANGELIST)
    assert f'href="{board_link}"' in listed.content.decode()
    assert op.get(board_link).status_code == 200  # the board page answers it


def test_the_history_button_shows_the_tasks_history_not_djangos(op):
    c = running("h")
    transitions.renew("h", c.lease.token, 600)
    page = op.get(change_url("h"))
    html_page = page.content.decode()
    assert 'href="#events-group"' in html_page  # the button points at the history inline
    assert reverse("admin:board_task_history", args=["h"]) not in html_page
    assert 'id="events-group"' in html_page
    redirected = op.get(reverse("admin:board_task_history", args=["h"]))
    assert redirected.status_code == 302 and redirected["Location"] == change_url("h") + "#events-group"
    followed = op.get(reverse("admin:board_task_history", args=["h"]), follow=True)
    assert [r.verb for r in history_rows(followed)] == ["create", "claim", "renew"]


def test_a_traceback_keeps_its_indentation_on_the_change_page(op):
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "worker.py", line 12, in run\n'
        "    handle(payload)\n"
        "KeyError: 'url' <b>not markup</b>"
    )
    c = running("tb", max_retries=0)
    transitions.fail("tb", c.lease.token, traceback, retryable=False)
    page = op.get(change_url("tb")).content.decode()
    shown = re.search(r'<pre class="last-error"[^>]*>(.*?)</pre>', page, re.DOTALL)
    assert shown is not None
    assert html.unescape(shown.group(1)) == traceback
    assert "<b>not markup</b>" not in page


def test_staff_with_view_task_see_tasks_read_only(viewer):
    """What docs/admin.md promises: board.view_task (without board.intervene) gives a read-only
    admin — the task list, each task's page and history, the board links; no action, no edit."""
    c = running("r", title="Resize images")
    new("q", title="Send mail")
    index = viewer.get(reverse("admin:index")).content.decode()
    assert 'href="/admin/board/task/"' in index and "View" in index
    listed = viewer.get(CHANGELIST)
    assert sorted(t.pk for t in listed.context["cl"].result_list) == ["q", "r"]
    assert listed.context["action_form"] is None and 'name="_selected_action"' not in listed.content.decode()
    assert 'href="/board/?task=r"' in listed.content.decode()
    assert [t.pk for t in viewer.get(CHANGELIST, {"q": "Resize"}).context["cl"].result_list] == ["r"]
    page = viewer.get(change_url("r"))
    assert page.status_code == 200 and page.context["title"] == "View task"
    body = page.content.decode()
    assert 'name="_save"' not in body and 'href="/board/?task=r"' in body and 'href="#events-group"' in body
    assert [r.verb for r in history_rows(page)] == ["create", "claim"]
    assert viewer.get(reverse("admin:board_task_history", args=["r"]), follow=True).status_code == 200
    transitions.complete("r", c.lease.token, {})


def test_staff_without_board_permissions_see_no_tasks():
    """Being staff alone shows nothing: docs/admin.md says which permission to grant."""
    client = client_for(make_user("staffer", []))
    new("t")
    assert "You don’t have permission to view or edit anything" in client.get(reverse("admin:index")).content.decode()
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(change_url("t")).status_code == 403
    assert client.get(reverse("admin:board_task_history", args=["t"])).status_code == 403


def listed(client, query: str) -> list[str]:
    response = client.get(CHANGELIST, {"q": query})
    assert response.status_code == 200
    return sorted(t.pk for t in response.context["cl"].result_list)


def test_search_finds_ids_by_prefix_titles_by_word_owners_and_queues(op):
    running("ops-live-1", "agent-7", title="Resize the thumbnails", queue="images")
    new("ops-live-2", title="Send the weekly digest", queue="mail")
    new("OPS-LIVE-3", title="resize avatars", queue="images")
    new("backup-1", title="Nightly backup", queue="ops")
    assert listed(op, "ops-live-1") == ["ops-live-1"]  # an exact id
    # An id prefix keeps its case, except on SQLite, whose LIKE ignores ASCII case.
    ignores_case = ["OPS-LIVE-3"] if connection.vendor == "sqlite" else []
    assert listed(op, "ops-live") == [*ignores_case, "ops-live-1", "ops-live-2"]
    assert listed(op, "RESIZE") == ["OPS-LIVE-3", "ops-live-1"]  # a word of the title, any case
    assert listed(op, "weekly") == ["ops-live-2"]
    assert listed(op, "agent-7") == ["ops-live-1"]  # an owner
    assert listed(op, "images") == ["OPS-LIVE-3", "ops-live-1"]  # a queue
    assert listed(op, "ops") == sorted(["backup-1", *listed(op, "ops-live")])  # queue "ops" + id prefixes
    assert listed(op, "resize images") == ["OPS-LIVE-3", "ops-live-1"]  # every word must match
    assert listed(op, "resize mail") == []
    assert listed(op, "agent") == []  # owners are matched whole


def test_run_again_as_new_copies_each_finished_task_and_skips_the_others(op):
    new("done")
    claim = transitions.claim("done", "agent-1", 60)
    transitions.complete("done", claim.lease.token, {"ok": 1})
    new("waiting")
    response = op.post(CHANGELIST, {"action": "replay", "index": "0", "_selected_action": ["done", "waiting"]},
                       follow=True)
    (summary,) = [str(m.message) for m in response.context["messages"]]
    assert summary.startswith("Run again as new, 2 tasks: 1 done; 1 skipped (1 is QUEUED)."), summary
    (copy,) = Task.objects.filter(replay_of="done")
    assert (copy.stage, copy.title) == ("QUEUED", "title of done")
    assert messages_of(response) == [f"done: run again as {copy.pk} (QUEUED)",
                                     "waiting: skipped: only a finished task runs again as new; waiting is QUEUED"]
    assert Task.objects.filter(replay_of="waiting").count() == 0
