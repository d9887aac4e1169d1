"""The live board in a real browser: Debian's Chromium, driven by Playwright, against a real
board server (manage.py serve) on the test database.

Changes are made through the engine (board.engine.transitions) in a worker thread, committed, as an
agent or the reaper would make them; what the page shows must come from the server. Waits are
Playwright's auto-waiting `expect(...)` with a bound, never a sleep.

Without /usr/bin/chromium or the playwright package these tests fail in CI (CI=true) and are
skipped elsewhere with a line starting "NOT RUN: browser tests"."""
from __future__ import annotations

import hashlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connections
from django.test import Client

from board.engine import retention, transitions
from board.engine.transitions import TaskSpec
from board.live.reads import COLUMN_PAGE
from board.models import Dependency, Task, TaskEvent
from harness.browser import launch_chromium
from tests.live_server import BoardServer
from tests.support import database_url, sqlite_db_mark
from tests.test_prune import LONG_AGO, age_tasks

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = sync_playwright = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

ARRIVAL = 2000  # ms: a committed change is on the page within this
SLOW = 10_000  # ms: bound for slower things (page load, reconnect with backoff: 20 s)


# ---------------------------------------------------------------------------------------------
# Fixtures: the browser and the server (per module), a worker thread for the ORM, pages


@pytest.fixture(scope="module")
def server(django_db_setup):
    """The board's server on the test database, with the test run's SECRET_KEY so that a session made
    here (force_login) is valid there."""
    url = database_url(connections["default"].settings_dict)
    daphne = BoardServer(url, secret_key=settings.SECRET_KEY).start()
    yield daphne
    daphne.close()


@pytest.fixture
def browser(transactional_db):
    """Per test: while Playwright's sync API is running, its event loop sits in this thread,
    and pytest-django's flush after a transactional test (in this thread) would be refused."""
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def orm(transactional_db):
    """Run ORM code in a worker thread: Playwright's sync API keeps an event loop in this
    thread, where Django refuses synchronous database calls."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orm")

    def call(fn, *args, **kwargs):
        return pool.submit(fn, *args, **kwargs).result(timeout=60)

    yield call
    pool.submit(connections.close_all).result(timeout=60)
    pool.shutdown()


def _user(superuser: bool = True, staff: bool = True):
    name = f"user-{time.monotonic_ns()}"
    if superuser:
        return get_user_model().objects.create_superuser(name, f"{name}@example.com", "x")
    user = get_user_model().objects.create_user(name, password="x", is_staff=staff)
    # Watching the board needs board.view_task (board/access.py); acting is what it lacks.
    user.user_permissions.add(Permission.objects.get(content_type__app_label="board", codename="view_task"))
    return user


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.fixture
def open_page(server, browser, orm):
    """open_page(path, width=1600, height=1000, color_scheme="light", superuser=True, expected=None) -> a page
    of the board's site, logged in as a new user (its name: page.username); any page error or
    console error fails the test (the board itself: open_board)."""
    contexts, problems = [], []

    def open_(path: str, width: int = 1600, height: int = 1000, color_scheme: str = "light",
              superuser: bool = True, expected: str | None = None):
        """`expected`: the one console error the test provokes (a refused address's 4xx)."""
        user = orm(lambda: _user(superuser=superuser))
        cookie = orm(_session_cookie, user)
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme,
                                      accept_downloads=True)
        contexts.append(context)
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": server.url}])
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("console", lambda message: message.type == "error" and message.text != expected
                and problems.append(f"console: {message.text}"))
        page.username = user.username
        page.goto(f"{server.url}{path}")
        if path.split("?")[0] == "/board/":  # the live board: once its socket is live
            expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
        return page

    yield open_
    for context in contexts:
        context.close()
    assert problems == [], f"errors on the page: {problems}\n{server.log_tail()}"


@pytest.fixture
def open_board(server, browser, orm):
    """open_board(superuser=True, before_load=None, width=1800, height=1000, color_scheme="light")
    -> a page showing the live board, in a window of that size and colour scheme."""
    contexts, page_errors = [], []

    def open_(superuser: bool = True, before_load=None, width: int = 1800, height: int = 1000,
              color_scheme: str = "light"):
        cookie = orm(lambda: _session_cookie(_user(superuser=superuser)))
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme)
        contexts.append(context)
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": server.url}])
        page = context.new_page()
        page.on("pageerror", lambda error: page_errors.append(str(error)))
        if before_load:
            before_load(page)
        page.goto(f"{server.url}/board/")
        expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=SLOW)
        return page

    yield open_
    for context in contexts:
        context.close()
    assert page_errors == [], f"JavaScript errors on the page: {page_errors}\n{server.log_tail()}"


def settled(page, task_id: str, stage: str):
    """The card is in `stage`'s column because the server said so (an action in flight shows
    the card in its target column before the answer; data-stage comes from the state)."""
    return card(page, task_id, stage).and_(page.locator(f'[data-stage="{stage}"]'))


def card(page, task_id: str, stage: str | None = None):
    scope = f'.column[data-stage="{stage}"] ' if stage else ""
    return page.locator(f'{scope}.card[data-id="{task_id}"]')


def count(page, stage: str):
    return page.locator(f'.column[data-stage="{stage}"] h2 .count')


def scroll_to_end(page, stage: str) -> None:
    """Scroll the column's cards to their end, as a person does, until it has loaded them all
    (a column holds its first page, board.live.reads.COLUMN_PAGE, and loads on as scrolled)."""
    page.wait_for_function("""stage => {
        const column = document.querySelector(`.column[data-stage="${stage}"]`);
        const list = column.querySelector('.cards');
        list.scrollTop = list.scrollHeight;
        return column.querySelector('.show-more').hidden;
    }""", arg=stage, timeout=SLOW, polling=200)
    expect(page.locator(f'.column[data-stage="{stage}"] .show-more')).to_be_hidden()


def press_show_more(column) -> bool:
    """Press the column's "show more" once it is free and say whether it was there to press.
    The page may load a page by itself (its column's end came into view): the button is
    disabled while that load runs, and hidden once the last page came. Checked and pressed in
    one step in the page, so the button cannot hide between the look and the press."""
    return column.locator(".show-more").evaluate("""(button, timeout) => new Promise((resolve, reject) => {
        const deadline = Date.now() + timeout;
        const press = () => {
            if (button.hidden) return resolve(false);
            if (!button.disabled) { button.click(); return resolve(true); }
            if (Date.now() > deadline) return reject(new Error('"show more" stayed disabled'));
            setTimeout(press, 50);
        };
        press();
    })""", SLOW)


def csrf(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


# ---------------------------------------------------------------------------------------------
# Live updates


def test_a_created_task_appears_and_a_claim_moves_it_to_running_with_its_owner(open_board, orm):
    page = open_board()
    expect(count(page, "QUEUED")).to_have_text("0")

    # Created through the API with the page's own session (as a person's script would).
    response = page.request.post(f"{page.url.split('/board/')[0]}/api/tasks",
                                 data=json.dumps({"id": "t1", "title": "first task", "queue": "ci",
                                                  "priority": 4, "max_retries": 2}),
                                 headers={"Content-Type": "application/json", "X-CSRFToken": csrf(page)})
    assert response.status == 201, response.text()
    expect(card(page, "t1", "QUEUED")).to_be_visible(timeout=ARRIVAL)
    expect(card(page, "t1")).to_contain_text("first task")
    expect(card(page, "t1")).to_contain_text("attempts 0/3")
    expect(count(page, "QUEUED")).to_have_text("1")

    orm(transitions.claim, "t1", "agent-7", 120)
    running = card(page, "t1", "RUNNING")
    expect(running).to_be_visible(timeout=ARRIVAL)
    expect(running.locator(".owner")).to_have_text("agent-7")
    expect(running.locator(".in-stage")).to_have_text(re.compile(r"^\d+s in RUNNING$"))  # fence: in the details
    expect(running).to_contain_text("attempts 1/3")
    expect(count(page, "RUNNING")).to_have_text("1")
    expect(count(page, "QUEUED")).to_have_text("0")
    # The countdown ticks on the client's clock.
    lease = running.locator(".lease")
    expect(lease).to_have_text(re.compile(r"^lease (1m \d\ds|\d+s)$"))
    first = lease.text_content()
    expect(lease).not_to_have_text(first, timeout=3000)


def test_expired_lease_failed_attempt_and_dependencies_are_visible(open_board, orm):
    orm(transitions.create, [TaskSpec(id="base", title="base"), TaskSpec(id="child", title="child", deps=["base"]),
                             TaskSpec(id="flaky", title="flaky")])
    page = open_board()
    expect(card(page, "child", "PENDING").locator('.dep[data-dep="base"]')).to_have_class(re.compile(r"\btodo\b"))

    orm(transitions.claim, "base", "agent-1", 1)  # the shortest lease: it runs out on screen
    expect(card(page, "base", "RUNNING").locator(".lease.bad")).to_have_text(re.compile("lease expired"), timeout=5000)
    expect(card(page, "base")).to_have_class(re.compile(r"\blease-expired\b"))

    claim = orm(transitions.claim, "flaky", "agent-2", 60)
    orm(transitions.fail, "flaky", claim.lease.token, "boom", retryable=True)
    expect(card(page, "flaky", "QUEUED").locator(".badge.bad.failed")).to_be_visible(timeout=ARRIVAL)

    claim = orm(transitions.claim, "base", "agent-3", 60)  # a takeover of the expired lease
    orm(transitions.complete, "base", claim.lease.token, {"ok": True})
    expect(card(page, "child", "QUEUED").locator('.dep[data-dep="base"]')).to_have_class(re.compile(r"\bdone\b"),
                                                                                          timeout=ARRIVAL)
    expect(card(page, "base", "COMPLETED")).to_be_visible()


def test_details_show_the_task_and_its_history(open_board, orm):
    orm(transitions.create, TaskSpec(id="d1", title="detailed", description="what it does",
                                     payload={"input": [1, 2]}))
    claim = orm(transitions.claim, "d1", "agent-9", 60)
    orm(transitions.renew, "d1", claim.lease.token, 60, checkpoint={"step": 3}, progress=0.25)
    page = open_board()
    card(page, "d1").click()
    details = page.locator("#details")
    expect(details).to_be_visible()
    expect(details.locator(".details-title")).to_have_text("d1: detailed")
    for text in ("what it does", '"input"', '"step": 3', "25%", "agent-9"):
        expect(details).to_contain_text(text)
    history = details.locator(".history li")
    expect(history).to_have_count(3)
    expect(history.nth(1)).to_contain_text("claim")
    assert sorted(details.locator("button.action").all_inner_texts()) == ["Cancel", "Pause", "Release"]

    # The details follow the task: complete it and the result and the new history show up.
    orm(transitions.complete, "d1", claim.lease.token, {"answer": 42})
    expect(details).to_contain_text('"answer": 42', timeout=ARRIVAL)
    expect(history).to_have_count(4)
    expect(details.locator("button.action")).to_have_count(0)  # nothing to do with a finished task


def test_filters_by_text_owner_and_queue(open_board, orm):
    orm(transitions.create, [TaskSpec(id="alpha", title="Alpha report", queue="reports"),
                             TaskSpec(id="beta", title="Beta build", queue="ci"),
                             TaskSpec(id="gamma", title="Gamma build", queue="ci")])
    orm(transitions.claim, "gamma", "carol", 60)
    page = open_board()
    visible = page.locator(".card:visible")
    expect(visible).to_have_count(3)
    page.fill("#filter-text", "build")
    expect(visible).to_have_count(2)
    page.select_option("#filter-queue", "ci")
    expect(visible).to_have_count(2)
    page.fill("#filter-owner", "car")
    expect(visible).to_have_count(1)
    expect(card(page, "gamma")).to_be_visible()
    page.fill("#filter-text", "")
    page.fill("#filter-owner", "")
    page.select_option("#filter-queue", "reports")
    expect(visible).to_have_count(1)
    expect(card(page, "alpha")).to_be_visible()


# A column's cards sit in chunks; a chunk far from the column's view keeps its cards' ids in
# their place (`hollowIds`, static/board/render.js, virtualized columns) and draws them from the
# page's model when scrolled near. What a column holds, in order:
COLUMN_HOLDS = "list => [...list.children].flatMap(chunk => chunk.hollowIds || [...chunk.children].map(c => c.dataset.id))"

def wait_for_holds(column, ready: str) -> list[str]:
    """Wait until `ready` (a JavaScript expression of `ids`) holds for what the column (a
    locator) holds, COLUMN_HOLDS; then return that."""
    list_ = column.locator(".cards").element_handle()
    column.page.wait_for_function(f"list => (ids => {ready})(({COLUMN_HOLDS})(list))", arg=list_, timeout=SLOW)
    return list_.evaluate(COLUMN_HOLDS)


# The board as the page holds it is the database's: every id in its column, and each drawn card
# at the database's version (a kept id is drawn from the model when it is scrolled to).
SAME_AS = """truth => {
    const shown = {};
    for (const c of document.querySelectorAll('.card')) {
        shown[c.dataset.id] = [c.closest('.column').dataset.stage, Number(c.dataset.version)];
    }
    for (const chunk of document.querySelectorAll('.chunk')) {
        for (const id of chunk.hollowIds || []) {
            shown[id] = [chunk.closest('.column').dataset.stage, (truth.shown[id] || [])[1]];
        }
    }
    const counts = {};
    for (const col of document.querySelectorAll('.column')) {
        counts[col.dataset.stage] = Number(col.querySelector('h2 .count').textContent);
    }
    return JSON.stringify({shown: Object.keys(shown).sort().map(k => [k, shown[k]]), counts})
        === JSON.stringify({shown: Object.keys(truth.shown).sort().map(k => [k, truth.shown[k]]),
                            counts: truth.counts});
}"""


def db_board(stages) -> dict:
    tasks = {t.id: [t.stage, t.version] for t in Task.objects.all()}
    counts = {stage: 0 for stage in stages}
    for stage, _ in tasks.values():
        counts[stage] += 1
    return {"shown": tasks, "counts": counts}


def test_a_burst_of_changes_ends_with_the_page_equal_to_the_database(open_board, orm):
    """Hundreds of transitions in a few hundred milliseconds, several per task between two
    reads of the server's tailer: the page, applying by version, must end where the database is
    (cards, columns, versions and the counts in the headers)."""
    import random

    rng = random.Random(7)
    orm(transitions.create, [TaskSpec(id=f"b{i:02d}", title=f"burst {i}", max_retries=5) for i in range(30)])
    page = open_board()
    stages = page.locator(".column").evaluate_all("cols => cols.map(c => c.dataset.stage)")

    def burst():
        tokens: dict[str, str] = {}
        for step in range(400):
            tid = f"b{rng.randrange(30):02d}"
            task = Task.objects.get(pk=tid)
            try:
                if task.stage == "QUEUED":
                    tokens[tid] = transitions.claim(tid, f"agent-{step % 5}", 60).lease.token
                elif task.stage == "RUNNING":
                    roll = rng.random()
                    if roll < 0.4:
                        transitions.renew(tid, tokens[tid], 60, progress=roll)
                    elif roll < 0.6:
                        transitions.release(tid, tokens[tid])
                    elif roll < 0.7:
                        transitions.fail(tid, tokens[tid], "flaky", retryable=True)
                    elif roll < 0.8:
                        transitions.pause(tid, tokens[tid], {"step": step})
                    elif roll < 0.9:
                        transitions.complete(tid, tokens[tid], {"step": step})
                    else:
                        transitions.cancel(tid, actor="op")
                elif task.stage == "PAUSED":
                    transitions.requeue(tid, actor="op")
                elif task.stage == "FAILED":
                    transitions.requeue(tid, actor="op", reset_attempts=True)
            except Exception as exc:  # a retry's backoff (Blocked) is fine; anything else is not
                from board.engine import errors
                assert isinstance(exc, errors.Blocked), exc
            if step % 40 == 0:
                transitions.create(TaskSpec(id=f"n{step}", title="new in the burst"))

    orm(burst)
    truth = orm(db_board, stages)
    page.wait_for_function(SAME_AS, arg=truth, timeout=SLOW)

    assert shown_order(page) == orm(expected_order, stages)


def test_a_big_column_keeps_the_server_order_as_cards_come_and_go(open_board, orm):
    """Cards sit in chunks of 100 (so that the browser can skip the ones out of view): a
    column of 250 that receives 150 cards at its top, and loses and regains others, keeps the
    server's order, and no chunk grows past 200."""
    import random

    rng = random.Random(11)
    orm(transitions.create, [TaskSpec(id=f"c{i:03d}", title="column", priority=rng.randrange(5)) for i in range(250)])
    page = open_board()
    stages = page.locator(".column").evaluate_all("cols => cols.map(c => c.dataset.stage)")
    scroll_to_end(page, "QUEUED")  # past its first page: the whole column on the page
    assert len(shown_order(page)["QUEUED"]) == 250

    def churn():
        orm_tokens = {}
        for i in rng.sample(range(250), 60):
            orm_tokens[f"c{i:03d}"] = transitions.claim(f"c{i:03d}", "agent", 60).lease.token
        transitions.create([TaskSpec(id=f"top{i:03d}", title="on top", priority=10) for i in range(150)])
        for tid, token in list(orm_tokens.items())[:30]:
            transitions.release(tid, token)

    orm(churn)
    page.wait_for_function(SAME_AS, arg=orm(db_board, stages), timeout=SLOW)
    assert shown_order(page) == orm(expected_order, stages)
    sizes = page.locator('.column[data-stage="QUEUED"] .chunk').evaluate_all(
        "cs => cs.map(c => c.hollowIds ? c.hollowIds.length : c.children.length)")
    assert sum(sizes) == 370 and max(sizes) < 200 and min(sizes) > 0, sizes


def _ms(when) -> int:
    return int(when.timestamp() * 1000)


def expected_order(stages) -> dict:
    """Each column as the server orders it (times in milliseconds, as the page compares them):
    in the claim order (claim_rank, then id); finished ones most recent first."""
    columns = {stage: [] for stage in stages}
    for t in Task.objects.all():
        columns[t.stage].append(t)
    for stage, rows in columns.items():
        if stage in ("COMPLETED", "CANCELLED"):
            rows.sort(key=lambda t: (_ms(t.updated_at), t.id), reverse=True)
        else:
            rows.sort(key=lambda t: (t.claim_rank, t.id))
        columns[stage] = [t.id for t in rows]
    return columns


def shown_order(page) -> dict:
    return page.evaluate(f"""() => Object.fromEntries([...document.querySelectorAll('.column')].map(
        col => [col.dataset.stage, ({COLUMN_HOLDS})(col.querySelector('.cards'))]))""")


def test_a_lost_message_is_noticed_and_repaired_by_a_fresh_snapshot(open_board, orm):
    """Frames dropped on the way (as a full channel layer drops them): a version gap on a task
    the page shows, or an event id that never arrives, makes the page ask for a snapshot."""
    orm(transitions.create, [TaskSpec(id="g1", title="gap by version"), TaskSpec(id="g2", title="gap by id"),
                             TaskSpec(id="g3", title="bystander")])
    drop = {"task": None}
    asked = []

    def lossy(page):
        def route(ws):
            server_side = ws.connect_to_server()

            def from_server(message):
                frame = json.loads(message)
                if frame.get("type") == "tasks" and drop["task"] is not None:
                    items = frame["items"]
                    lost = next((i for i, item in enumerate(items) if item["task"]["id"] == drop["task"]), None)
                    if lost is not None:
                        drop["task"] = None  # lose exactly one change, keep the rest of the batch
                        del items[lost]
                        if not items:
                            return
                        message = json.dumps(frame)
                ws.send(message)

            server_side.on_message(from_server)

            def from_page(message):
                asked.append(json.loads(message))
                server_side.send(message)

            ws.on_message(from_page)

        page.route_web_socket(re.compile(r"/ws/board/$"), route)

    page = open_board(before_load=lossy)
    expect(card(page, "g1", "QUEUED")).to_be_visible()

    # 1. The claim of g1 is lost; its renew (version 2, the page shows 0) reveals the gap.
    drop["task"] = "g1"
    claim = orm(transitions.claim, "g1", "agent-1", 60)
    orm(transitions.renew, "g1", claim.lease.token, 60)
    expect(card(page, "g1", "RUNNING")).to_have_attribute("data-version", "2", timeout=ARRIVAL)
    assert {"type": "snapshot"} in asked
    # The answer is in: the page has applied its second snapshot (#connection's documented state).
    expect(page.locator("#connection")).to_have_attribute("data-snapshots", "2", timeout=SLOW)

    # 2. The only event of g2 is lost; later events of another task show its id was skipped,
    # and once it is missing for a few seconds the page takes a snapshot.
    asked.clear()
    drop["task"] = "g2"
    orm(transitions.claim, "g2", "agent-2", 60)
    orm(transitions.claim, "g3", "agent-3", 60)
    expect(card(page, "g3", "RUNNING")).to_be_visible(timeout=ARRIVAL)
    expect(card(page, "g2", "RUNNING")).to_have_attribute("data-version", "1", timeout=SLOW)
    assert {"type": "snapshot"} in asked
    assert page.locator("#connection").get_attribute("data-snapshots") == "3"


def finish_in_turn(task_ids: list[str]) -> None:
    """Claim and complete each task, one after the other (each finishes after the one before)."""
    for task_id in task_ids:
        claim = transitions.claim(task_id, "agent-busy", 60)
        transitions.complete(task_id, claim.lease.token, {})


def finish_in_turn_created(task_id: str) -> None:
    transitions.create(TaskSpec(id=task_id, title=task_id))
    finish_in_turn([task_id])


def through_the_test(on_frame=None) -> tuple[dict, object]:
    """(sides, before_load) for open_board: the page's board socket routed through the test.
    Once the page connects, sides["page"].send(text) reaches the page as if from the server and
    sides["server"].send(text) the server as if from the page; `on_frame(text)` sees each frame
    from the server first and returns the text to pass on (None: drop it)."""
    sides: dict = {}

    def before_load(page):
        def route(ws):
            sides["page"], sides["server"] = ws, ws.connect_to_server()

            def from_server(message):
                message = on_frame(message) if on_frame else message
                if message is not None:
                    ws.send(message)

            sides["server"].on_message(from_server)

        page.route_web_socket(re.compile(r"/ws/board/$"), route)

    return sides, before_load


def ask_for_snapshot(page, sides: dict, number: int) -> None:
    """As the page asks when it sees a gap; waits until it has applied its `number`th snapshot."""
    sides["server"].send(json.dumps({"type": "snapshot"}))
    expect(page.locator("#connection")).to_have_attribute("data-snapshots", str(number), timeout=SLOW)


def test_a_change_the_snapshot_already_holds_leaves_no_ghost_card(open_board, orm):
    """A frame the server built before a snapshot can reach the page after it (the tailer hands
    a frame to the socket's queue when its read returns, which can be after the socket's fresh
    snapshot was read). Here: the frame that showed "ghost" RUNNING, delivered after a snapshot
    read once "ghost" had finished and 200 later finishes had pushed it out of the finished
    column's first page, which a snapshot sends. The snapshot already holds that change: the page must show no card
    for it (before the fix: a RUNNING card that stayed, and a RUNNING count one too high).
    Had that event committed after the snapshot's read (PostgreSQL hands ids out before the
    commit), the snapshot would name its id as unseen, and the page applies it."""
    busy = [f"zz-{i:03d}" for i in range(200)]
    orm(transitions.create, [TaskSpec(id="ghost", title="finishes unseen")] + [TaskSpec(id=t, title="busy") for t in busy])
    stale: list[str] = []
    unseen: list[int] = []  # ids to add to the next snapshot's unseen_event_ids

    def on_frame(message):
        frame = json.loads(message)
        if frame.get("type") == "tasks" and any(
                item["task"]["id"] == "ghost" and item["task"]["stage"] == "RUNNING" for item in frame["items"]):
            stale.append(message)
        if frame.get("type") == "snapshot" and unseen:
            frame["unseen_event_ids"] += unseen
            unseen.clear()
            return json.dumps(frame)
        return message

    sides, before_load = through_the_test(on_frame)
    page = open_board(before_load=before_load)
    claim = orm(transitions.claim, "ghost", "agent-1", 60)
    expect(card(page, "ghost", "RUNNING")).to_be_visible(timeout=ARRIVAL)
    assert len(stale) == 1  # recorded before the page drew it
    orm(transitions.complete, "ghost", claim.lease.token, {})
    orm(finish_in_turn, busy)
    expect(count(page, "COMPLETED")).to_have_text("201", timeout=SLOW)

    ask_for_snapshot(page, sides, 2)
    expect(card(page, "ghost")).to_have_count(0)  # 200 finished after it: the snapshot left it out
    sides["page"].send(stale[0])  # the frame built before that snapshot, arriving after it
    orm(transitions.create, TaskSpec(id="after", title="a change after the stale frame"))
    expect(card(page, "after", "QUEUED")).to_be_visible(timeout=ARRIVAL)  # so the stale frame was read
    expect(card(page, "ghost")).to_have_count(0)
    expect(count(page, "RUNNING")).to_have_text("0")
    expect(count(page, "COMPLETED")).to_have_text("201")

    unseen.append(json.loads(stale[0])["items"][0]["event"]["id"])
    ask_for_snapshot(page, sides, 3)
    sides["page"].send(stale[0])  # a change the snapshot does not hold: applied
    expect(card(page, "ghost", "RUNNING")).to_be_visible(timeout=ARRIVAL)

    # A task the page never loaded, deleted by the prune, leaves the count of the column the
    # record names.
    ask_for_snapshot(page, sides, 4)
    expect(card(page, "ghost")).to_have_count(0)
    orm(age_tasks, ["ghost"], LONG_AGO, "default")
    assert orm(retention.prune).tasks_deleted == {"COMPLETED": 1}
    expect(count(page, "COMPLETED")).to_have_text("200", timeout=SLOW)
    expect(page.locator('.column[data-stage="COMPLETED"] .card')).to_have_count(COLUMN_PAGE)


def test_tasks_the_prune_deletes_leave_the_open_board(open_board, orm):
    """The prune deletes old finished tasks; an open page drops their cards and counts them out
    of their column ("removed" frames). One that arrives again after a snapshot that already
    accounts for it changes nothing."""
    for task_id in ("old-1", "old-2", "recent"):
        orm(finish_in_turn_created, task_id)
    orm(age_tasks, ["old-1", "old-2"], LONG_AGO, "default")
    removals: list[str] = []

    def on_frame(message):
        if json.loads(message).get("type") == "removed":
            removals.append(message)
        return message

    sides, before_load = through_the_test(on_frame)
    page = open_board(before_load=before_load)
    expect(card(page, "old-1", "COMPLETED")).to_be_visible()
    expect(count(page, "COMPLETED")).to_have_text("3")
    card(page, "old-1").click()  # its details are open when it goes

    report = orm(retention.prune)
    assert sum(report.tasks_deleted.values()) == 2
    expect(card(page, "old-1")).to_have_count(0, timeout=SLOW)
    expect(card(page, "old-2")).to_have_count(0)
    expect(card(page, "recent", "COMPLETED")).to_be_visible()
    expect(count(page, "COMPLETED")).to_have_text("1")
    expect(page.locator("#details")).to_be_hidden()

    ask_for_snapshot(page, sides, 2)
    for frame in removals:  # already accounted for by that snapshot
        sides["page"].send(frame)
    orm(transitions.create, TaskSpec(id="after", title="a change after the repeated removals"))
    expect(card(page, "after", "QUEUED")).to_be_visible(timeout=ARRIVAL)  # so they were read
    expect(count(page, "COMPLETED")).to_have_text("1")
    expect(card(page, "recent", "COMPLETED")).to_be_visible()


# ---------------------------------------------------------------------------------------------
# Human actions


def test_dragging_a_queued_card_to_cancelled_persists(open_board, orm):
    orm(transitions.create, TaskSpec(id="q1", title="to cancel"))
    page = open_board()
    expect(card(page, "q1", "QUEUED")).to_be_visible()
    with page.expect_response(lambda r: r.url.endswith("/api/tasks/q1/cancel")) as answer:
        card(page, "q1").drag_to(page.locator('.column[data-stage="CANCELLED"]'))
        page.locator("#cancel-dialog").get_by_role("button", name="Cancel the task").click()  # it asks first
    assert answer.value.status == 200, answer.value.text()
    expect(settled(page, "q1", "CANCELLED")).to_be_visible()
    expect(card(page, "q1")).to_have_attribute("data-version", "1")
    expect(page.locator("#message")).to_contain_text("CANCELLED")
    task = orm(Task.objects.get, pk="q1")
    assert (task.stage, task.version) == ("CANCELLED", 1)
    history = orm(lambda: list(task.events.values_list("verb", "actor")))
    assert history[-1][0] == "cancel" and history[-1][1].startswith("user-")


def test_an_illegal_move_is_not_offered(open_board, orm):
    orm(transitions.create, TaskSpec(id="q2", title="stays queued"))
    page = open_board()
    source = card(page, "q2", "QUEUED")
    paused = page.locator('.column[data-stage="PAUSED"]')
    source.hover()
    page.mouse.down()
    box = paused.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=8)
    # While dragging: CANCELLED (legal from QUEUED) is offered, PAUSED and COMPLETED are not.
    expect(page.locator('.column[data-stage="CANCELLED"]')).to_have_class(re.compile(r"\bdrop-ok\b"))
    expect(paused).to_have_class(re.compile(r"\bdrop-no\b"))
    expect(page.locator('.column[data-stage="COMPLETED"]')).to_have_class(re.compile(r"\bdrop-no\b"))
    page.mouse.up()
    expect(paused).not_to_have_class(re.compile(r"drop-"))
    expect(card(page, "q2", "QUEUED")).to_be_visible()
    assert orm(lambda: Task.objects.get(pk="q2").version) == 0  # nothing was asked of the server


def test_buttons_in_the_details_admit_pause_and_retry(open_board, orm):
    orm(transitions.create, [TaskSpec(id="held", title="held", on_hold=True), TaskSpec(id="run", title="run"),
                             TaskSpec(id="bad", title="bad", max_retries=0)])
    orm(transitions.claim, "run", "agent-1", 60)
    claim = orm(transitions.claim, "bad", "agent-2", 60)
    orm(transitions.fail, "bad", claim.lease.token, "no luck")
    page = open_board()

    card(page, "held").click()
    page.click('#details button[data-verb="admit"]')
    expect(settled(page, "held", "QUEUED")).to_be_visible()

    card(page, "run").click()
    page.click('#details button[data-verb="force_pause"]')
    dialog = page.locator("#reason-dialog")  # it takes agent-1's lease away: it asks first
    expect(dialog.locator("h2")).to_have_text("Pause run?")
    dialog.locator("textarea").fill("the GPU host goes down for maintenance")
    dialog.get_by_role("button", name="Pause the task").click()
    expect(settled(page, "run", "PAUSED")).to_be_visible()
    paused = orm(lambda: TaskEvent.objects.filter(task_id="run").last())
    assert (paused.verb, paused.detail["reason"]) == ("force_pause", "the GPU host goes down for maintenance")

    card(page, "bad").click()
    retry = page.locator('#details button[data-verb="requeue"]')
    expect(retry).to_have_text("Retry")
    retry.click()
    expect(settled(page, "bad", "QUEUED")).to_be_visible()
    stages = orm(lambda: dict(Task.objects.values_list("id", "stage")))
    assert stages == {"held": "QUEUED", "run": "PAUSED", "bad": "QUEUED"}
    assert orm(lambda: Task.objects.get(pk="bad").attempts) == 0  # retry gave its attempts back


def test_release_of_a_running_task_asks_first_and_dismissing_changes_nothing(open_board, orm):
    """Release takes the holder's lease away: one click opens the reason dialog, and "Keep it
    running" sends nothing (issue 30, item 10); confirmed, the reason is in the history."""
    orm(transitions.create, TaskSpec(id="busy", title="busy"))
    orm(transitions.claim, "busy", "agent-1", 60)
    page = open_board()
    card(page, "busy").click()
    page.click('#details button[data-verb="force_release"]')
    dialog = page.locator("#reason-dialog")
    expect(dialog.locator("h2")).to_have_text("Release busy?")
    dialog.get_by_role("button", name="Keep it running").click()
    expect(dialog).to_be_hidden()
    task = orm(Task.objects.get, pk="busy")
    assert (task.stage, task.version, task.owner) == ("RUNNING", 1, "agent-1")  # nothing was sent
    page.click('#details button[data-verb="force_release"]')
    dialog.locator("textarea").fill("agent-1 is stuck")
    dialog.get_by_role("button", name="Release the task").click()
    expect(settled(page, "busy", "QUEUED")).to_be_visible()
    released = orm(lambda: TaskEvent.objects.filter(task_id="busy").last())
    assert (released.verb, released.detail["reason"]) == ("force_release", "agent-1 is stuck")


def test_a_move_that_lost_a_race_snaps_back_with_a_message(open_board, orm):
    """The page shows q3 QUEUED at version 0; behind its back (its socket's frames are held)
    an agent claims it. Dropping the card on CANCELLED sends version 0: the server refuses with
    409 and the card goes where the server says the task is (RUNNING), with a message."""
    orm(transitions.create, TaskSpec(id="q3", title="contested"))
    held = {"on": False, "frames": [], "page_side": None}

    def hold_frames(page):
        def route(ws):
            held["page_side"] = ws
            server_side = ws.connect_to_server()

            def from_server(message):
                if held["on"]:
                    held["frames"].append(message)
                else:
                    ws.send(message)

            server_side.on_message(from_server)

        page.route_web_socket(re.compile(r"/ws/board/$"), route)

    page = open_board(before_load=hold_frames)
    expect(card(page, "q3", "QUEUED")).to_have_attribute("data-version", "0")
    held["on"] = True
    orm(transitions.claim, "q3", "agent-fast", 60)

    with page.expect_response(lambda r: r.url.endswith("/api/tasks/q3/cancel")) as answer:
        card(page, "q3").drag_to(page.locator('.column[data-stage="CANCELLED"]'))
        page.locator("#cancel-dialog").get_by_role("button", name="Cancel the task").click()  # it asks first
    assert answer.value.status == 409
    assert answer.value.json()["error"]["code"] == "version_conflict"
    expect(card(page, "q3", "RUNNING")).to_have_attribute("data-version", "1")
    expect(card(page, "q3").locator(".owner")).to_have_text("agent-fast")
    message = page.locator("#message")
    expect(message).to_be_visible()
    expect(message).to_have_attribute("data-kind", "error")
    # What happened, not the versions (issue 30, item 9): the move that came first, its actor.
    expect(message).to_contain_text("Cancel q3: not done; it was claimed by agent-fast at ")
    expect(message).to_contain_text("(now RUNNING)")
    task = orm(Task.objects.get, pk="q3")
    assert (task.stage, task.version) == ("RUNNING", 1)

    # The held frames (the claim's event) arrive late and change nothing.
    held["on"] = False
    for frame in held["frames"]:
        held["page_side"].send(frame)
    expect(card(page, "q3", "RUNNING")).to_have_attribute("data-version", "1")


def test_without_the_intervene_permission_there_are_no_actions(open_board, orm):
    orm(transitions.create, TaskSpec(id="q4", title="look only"))
    page = open_board(superuser=False)
    expect(page.locator("body")).to_have_attribute("data-can-intervene", "false")
    expect(card(page, "q4")).not_to_have_attribute("draggable", "true")
    card(page, "q4").click()
    expect(page.locator("#details")).to_be_visible()
    expect(page.locator("#details button.action")).to_have_count(0)
    card(page, "q4").drag_to(page.locator('.column[data-stage="CANCELLED"]'))
    expect(card(page, "q4", "QUEUED")).to_be_visible()
    assert orm(lambda: Task.objects.get(pk="q4").stage) == "QUEUED"


# ---------------------------------------------------------------------------------------------
# Problems, finished tasks, secrets, reconnection


def test_a_dependency_cycle_written_into_the_database_shows_in_the_problems_panel(open_board, orm):
    orm(transitions.create, [TaskSpec(id="a", title="a"), TaskSpec(id="b", title="b", deps=["a"])])
    page = open_board()
    expect(page.locator("#problems h2 .count")).to_have_text("0")
    orm(Dependency.objects.create, task_id="a", depends_on_id="b")  # behind the engine's back
    problem = page.locator('#problems li[data-code="dep_cycle"][data-task="a"]')
    expect(problem).to_be_visible(timeout=SLOW)  # the server re-checks on a timer too
    expect(problem).to_contain_text("dep_cycle")
    problem.click()
    expect(card(page, "a")).to_have_class(re.compile(r"\bhighlight\b"))
    expect(card(page, "a")).to_be_in_viewport()
    orm(lambda: Dependency.objects.filter(task_id="a", depends_on_id="b").delete())


def test_terminal_columns_show_the_most_recent_then_more_on_demand(open_board, orm):
    def make():
        transitions.create([TaskSpec(id=f"old{i:03d}", title=f"old {i}") for i in range(205)])
        for i in range(205):
            transitions.cancel(f"old{i:03d}", actor="op")

    orm(make)
    page = open_board()
    cancelled = page.locator('.column[data-stage="CANCELLED"]')
    expect(count(page, "CANCELLED")).to_have_text("205")
    expect(cancelled.locator(".card")).to_have_count(COLUMN_PAGE)  # a column's first page (100)
    expect(cancelled.locator(".card").first).to_have_attribute("data-id", "old204")  # most recent first
    more = cancelled.locator(".show-more")
    expect(more).to_have_text("show more (105 older)")
    more.click()
    wait_for_holds(cancelled, f"ids.length === {2 * COLUMN_PAGE}")
    more.click()
    expect(more).to_be_hidden()
    assert wait_for_holds(cancelled, "ids.length === 205") == [f"old{i:03d}" for i in reversed(range(205))]


def test_no_lease_token_in_the_page_or_any_websocket_frame(open_board, orm):
    frames: list[str] = []

    def record(page):
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(
            payload if isinstance(payload, str) else payload.decode(errors="replace"))))

    orm(transitions.create, [TaskSpec(id=f"s{i}", title=f"secret {i}") for i in range(4)])
    early = orm(transitions.claim, "s0", "agent-a", 60)  # in the snapshot
    page = open_board(before_load=record)
    claims = [orm(transitions.claim, f"s{i}", f"agent-{i}", 60) for i in (1, 2, 3)]
    orm(transitions.renew, "s1", claims[0].lease.token, 60, progress=0.5)
    orm(transitions.pause, "s2", claims[1].lease.token, {"at": 1})
    for i in (1, 3):
        expect(card(page, f"s{i}", "RUNNING")).to_be_visible(timeout=ARRIVAL)
    expect(card(page, "s2", "PAUSED")).to_be_visible(timeout=ARRIVAL)
    card(page, "s1").click()
    expect(page.locator("#details .history li")).to_have_count(3)

    tokens = [early.lease.token] + [c.lease.token for c in claims]
    secrets_ = tokens + [hashlib.sha256(t.encode()).hexdigest() for t in tokens]
    everything = page.content() + "".join(frames)
    assert frames and any('"type": "snapshot"' in f or '"type":"snapshot"' in f for f in frames)
    changes = [item for f in frames if json.loads(f)["type"] == "tasks" for item in json.loads(f)["items"]]
    assert len(changes) >= 5
    for secret in secrets_:
        assert secret not in everything
    assert "token" not in "".join(frames).lower()


def test_a_lost_connection_shows_reconnecting_and_recovers_to_the_database_state(open_board, orm, server):
    orm(transitions.create, [TaskSpec(id=f"r{i}", title=f"r {i}") for i in range(5)])
    page = open_board()
    expect(page.locator(".card")).to_have_count(5)
    server.stop()
    try:
        connection = page.locator("#connection")
        expect(connection).to_have_attribute("data-state", "reconnecting", timeout=SLOW)
        expect(connection).to_contain_text("reconnecting")

        # While the page is cut off the board changes; nobody tells the page.
        orm(transitions.claim, "r1", "agent-x", 60)
        orm(transitions.cancel, "r2", actor="op")
        orm(transitions.create, TaskSpec(id="r9", title="made while offline"))
    finally:
        server.start()  # on the same port, for the page and for the tests after this one
    expect(connection).to_have_attribute("data-state", "live", timeout=20_000)

    stages = page.locator(".column").evaluate_all("cols => cols.map(c => c.dataset.stage)")
    page.wait_for_function(SAME_AS, arg=orm(db_board, stages), timeout=SLOW)
    expect(count(page, "QUEUED")).to_have_text("4")
    expect(count(page, "CANCELLED")).to_have_text("1")
