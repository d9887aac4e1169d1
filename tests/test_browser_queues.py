"""The queues strip of the live board (issue 29) in a real browser (Debian's Chromium, Playwright)
against a real board server on the test database: a person with board.change_queue pauses a
queue from the board with a reason, every other open board shows it live, an agent's claim is
refused (204), the waiting cards say why, and one click resumes it.

The server, browser, ORM-thread and page fixtures are tests/test_browser.py's. Waits are
Playwright's `expect(...)` with a bound, never a sleep."""
# The fixtures imported from tests/test_browser.py are test parameters by the same names.
# ruff: noqa: F811
from __future__ import annotations

import json
import re

import pytest

from board import agent_keys
from board.engine import flow, transitions
from board.engine.transitions import TaskSpec
from board.models import Queue, QueueChange, RateKey
from tests.support import queue_shards, sqlite_db_mark
from tests.test_browser import (  # noqa: F401  (fixtures, found by pytest by name)
    browser,
    card,
    open_board,
    orm,
    server,
)
from tests.test_browser_cards import CONTRAST_JS

try:
    from playwright.sync_api import expect
except ImportError:  # reported before each test (the `browser` marker, tests/conftest.py)
    expect = None

pytestmark = [pytest.mark.browser, *sqlite_db_mark()]

SCREENSHOT = "/tmp/boardq.png"
# ms: a queue's change is on the page within this. The strip is read at most twice a second after
# a commit (board.live.tailer), so it may come a pass after the cards (ARRIVAL is theirs); the
# bound leaves room for a loaded machine.
STRIP = 5000


def strip_item(page, name: str):
    return page.locator(f'#queues li.queue[data-queue="{name}"]')


def claim(page, key: str):
    """POST /api/claim as an agent (its key, no session), from the page's browser context."""
    return page.request.post(f"{page.url.split('/board/')[0]}/api/claim", data=json.dumps({"ttl_seconds": 60}),
                             headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})


def test_pausing_a_queue_from_the_board_shows_live_everywhere_refuses_claims_and_one_click_resumes(
        open_board, orm):
    orm(transitions.create, [TaskSpec(id="build-1", title="build one", queue="ci"),
                             TaskSpec(id="build-2", title="build two", queue="ci"),
                             TaskSpec(id="doc-1", title="docs", queue="docs")])
    key = orm(lambda: agent_keys.create_key("agent-ci")[1])
    operator = open_board()  # a superuser: board.change_queue
    watcher = open_board(superuser=False)  # board.view_task only

    ci = strip_item(operator, "ci")
    expect(ci).to_have_attribute("data-paused", "false", timeout=STRIP)
    expect(ci).to_contain_text("ci 0 running · 2 queued")
    expect(strip_item(watcher, "ci")).to_contain_text("ci 0 running · 2 queued", timeout=STRIP)
    expect(watcher.locator("body")).to_have_attribute("data-can-change-queues", "false")
    expect(watcher.locator("#queues button.queue-toggle")).to_have_count(0)  # no right, no button

    # Pause: the button asks for a reason first; dismissing the dialog changes nothing.
    ci.locator("button.queue-toggle").click()
    dialog = operator.locator("#queue-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".queue-name")).to_have_text("ci")
    dialog.get_by_role("button", name="Keep it running").click()
    expect(dialog).to_be_hidden()
    assert orm(lambda: Queue.objects.get(name="ci").paused) is False
    expect(ci.locator("button.queue-toggle")).to_have_text("Pause")
    ci.locator("button.queue-toggle").click()
    dialog.locator("textarea").fill("deploy freeze until 16:00")
    dialog.get_by_role("button", name="Pause the queue").click()

    # Both pages show it, without a reload, with who and why.
    for page in (operator, watcher):
        shown = strip_item(page, "ci")
        expect(shown).to_have_attribute("data-paused", "true", timeout=STRIP)
        expect(shown.locator(".queue-paused")).to_have_text(re.compile(r"^paused by user-\d+: deploy freeze until 16:00$"))
        # The waiting cards say why nobody takes them; another queue's card does not.
        expect(card(page, "build-1", "QUEUED").locator(".badge.waiting")).to_have_text("waiting: queue ci paused")
        expect(card(page, "build-2", "QUEUED").locator(".badge.waiting")).to_have_text("waiting: queue ci paused")
        expect(card(page, "doc-1", "QUEUED").locator(".badge.waiting")).to_have_count(0)
    expect(strip_item(operator, "docs")).to_have_attribute("data-paused", "false")
    expect(ci.locator("button.queue-toggle")).to_have_text("Resume")
    changes = orm(lambda: list(QueueChange.objects.filter(queue="ci").values_list("reason", "changes")))
    assert changes == [("deploy freeze until 16:00", {"paused": [False, True]})]

    # An agent's claim is refused while ci is paused: docs is the only ready queue, then nothing.
    first = claim(operator, key)
    assert first.status == 200 and first.json()["task"]["id"] == "doc-1", first.text()
    refused = claim(operator, key)
    assert refused.status == 204, refused.text()
    expect(card(watcher, "build-1", "QUEUED")).to_be_visible()
    for page in (operator, watcher):  # the claim's counts reach the strip too
        expect(strip_item(page, "docs")).to_contain_text("docs 1 running · 0 queued", timeout=STRIP)

    # The strip's and the badge's colours are readable (WCAG AA), then the picture.
    measured = operator.evaluate(CONTRAST_JS, ['#queues li.queue[data-paused="true"] .queue-paused',
                                               "#queues li.queue .queue-running", ".card .badge.waiting"])
    low = {sel: m for sel, m in measured.items() if m is None or m["ratio"] < 4.5}
    assert low == {}, json.dumps(low, indent=1)
    operator.screenshot(path=SCREENSHOT)

    # Resume: one click, no dialog.
    ci.locator("button.queue-toggle").click()
    expect(dialog).to_be_hidden()
    for page in (operator, watcher):
        shown = strip_item(page, "ci")
        expect(shown).to_have_attribute("data-paused", "false", timeout=STRIP)
        expect(shown.locator(".queue-paused")).to_have_count(0)
        expect(card(page, "build-1", "QUEUED").locator(".badge.waiting")).to_have_count(0)
    expect(ci.locator("button.queue-toggle")).to_have_text("Pause")
    taken = claim(operator, key)
    assert taken.status == 200 and taken.json()["task"]["id"] == "build-1", taken.text()
    expect(strip_item(watcher, "ci")).to_contain_text("ci 1 running · 1 queued", timeout=STRIP)
    assert orm(lambda: Queue.objects.get(name="ci").paused) is False


def test_a_staff_user_with_board_change_queue_gets_the_buttons_and_a_refusal_is_shown(open_board, orm):
    # The page offers the buttons by the same rule as PUT /api/queues/{name}; and should the right
    # go while the page is open, the refusal is shown and nothing changes.
    from django.contrib.auth.models import Permission, User

    orm(transitions.create, TaskSpec(id="n1", title="nightly", queue="nightly"))
    granted = []

    def grant(page):
        user = User.objects.filter(is_superuser=False).order_by("-id").first()
        user.user_permissions.add(Permission.objects.get(content_type__app_label="board", codename="change_queue"))
        granted.append(user.pk)

    page = open_board(superuser=False, before_load=lambda page: orm(grant, page))
    expect(page.locator("body")).to_have_attribute("data-can-change-queues", "true")
    item = strip_item(page, "nightly")
    expect(item.locator("button.queue-toggle")).to_have_text("Pause", timeout=STRIP)

    def revoke():
        user = User.objects.get(pk=granted[0])
        user.user_permissions.remove(Permission.objects.get(content_type__app_label="board", codename="change_queue"))

    orm(revoke)
    item.locator("button.queue-toggle").click()
    page.locator("#queue-dialog").get_by_role("button", name="Pause the queue").click()
    expect(page.locator("#message")).to_contain_text("could not pause queue nightly", timeout=STRIP)
    expect(item.locator("button.queue-toggle")).to_be_enabled()
    expect(item).to_have_attribute("data-paused", "false")
    assert orm(lambda: (Queue.objects.get(name="nightly").paused, QueueChange.objects.count())) == (False, 0)


def test_the_strip_and_the_waiting_badge_are_readable_in_the_dark_scheme_and_on_a_phone(open_board, orm):
    from board.engine import flow

    orm(transitions.create, [TaskSpec(id=f"w{n}", title="waiting", queue=f"queue-{n}") for n in range(6)])
    orm(flow.change_queue, "queue-0", actor="op-1", reason="a long reason " * 10, paused=True)
    orm(flow.change_queue, "queue-1", actor="op-1", concurrency=2)
    page = open_board(width=390, height=844, color_scheme="dark")
    expect(strip_item(page, "queue-0")).to_have_attribute("data-paused", "true", timeout=STRIP)
    expect(card(page, "w0").locator(".badge.waiting")).to_have_text("waiting: queue queue-0 paused")
    expect(page.locator('.column[data-stage="QUEUED"] .queue-summary')).to_have_text("held: queue-0 paused")
    expect(page.locator('.column[data-stage="RUNNING"] .queue-summary')).to_have_text("limits: queue-1 0/2")
    measured = page.evaluate(CONTRAST_JS, ['#queues li.queue[data-paused="true"] .queue-paused',
                                           '#queues li.queue[data-paused="false"] .queue-running',
                                           "#queues button.queue-toggle", "#queues button.queue-limits",
                                           ".card .badge.waiting", '.column[data-stage="QUEUED"] .queue-summary',
                                           '.column[data-stage="RUNNING"] .queue-summary'])
    low = {sel: m for sel, m in measured.items() if m is None or m["ratio"] < 4.5}
    assert low == {}, json.dumps(low, indent=1)
    # Nothing of the strip runs off a phone's screen: it wraps.
    overflow = page.evaluate("""() => [...document.querySelectorAll('#queues li')]
        .filter((li) => li.getBoundingClientRect().right > document.documentElement.clientWidth + 1).length""")
    assert overflow == 0
    page.screenshot(path="/tmp/boardq-phone-dark.png")


def test_a_queued_card_of_a_queue_at_its_limit_says_so_until_a_slot_frees(open_board, orm):
    """A queue at its concurrency limit: its QUEUED cards say why they wait, live, and stop
    saying it when a running task of the queue finishes."""
    orm(flow.change_queue, "capped", concurrency=1, actor="op")
    orm(transitions.create, [TaskSpec(id="first", title="runs", queue="capped"),
                             TaskSpec(id="second", title="waits", queue="capped")])
    page = open_board()
    second = page.locator('.card[data-id="second"]')
    expect(second).to_be_visible(timeout=STRIP)
    expect(second.locator(".badge.waiting")).to_have_count(0)
    held = orm(transitions.claim, "first", "agent-1", 60)
    expect(second.locator(".badge.waiting")).to_have_text("waiting: queue capped at its limit 1/1", timeout=STRIP)
    orm(transitions.complete, "first", held.lease.token, {})
    expect(second.locator(".badge.waiting")).to_have_count(0, timeout=STRIP)


def test_a_queued_card_whose_concurrency_key_is_full_says_so_until_a_slot_frees(open_board, orm):
    """A concurrency key at its limit: the QUEUED cards naming it say so, live, on every board,
    and stop when the running task that holds the key finishes; a card of another key does not."""
    orm(transitions.create, [TaskSpec(id="web-1", title="deploy web", concurrency_key="repo:acme/web",
                                      concurrency_limit=1),
                             TaskSpec(id="web-2", title="migrate web", concurrency_key="repo:acme/web"),
                             TaskSpec(id="api-1", title="deploy api", concurrency_key="repo:acme/api")])
    page = open_board(superuser=False)
    waiting = card(page, "web-2", "QUEUED")
    expect(waiting).to_be_visible(timeout=STRIP)
    expect(waiting.locator(".badge.waiting")).to_have_count(0)
    held = orm(transitions.claim, "web-1", "agent-1", 60)
    expect(waiting.locator(".badge.waiting")).to_have_text("waiting: repo:acme/web at its limit 1/1", timeout=STRIP)
    expect(card(page, "api-1", "QUEUED").locator(".badge.waiting")).to_have_count(0)
    page.screenshot(path="/tmp/boardq-key-full.png")
    orm(transitions.complete, "web-1", held.lease.token, {})
    expect(waiting.locator(".badge.waiting")).to_have_count(0, timeout=STRIP)


def test_a_queued_card_of_a_rated_queue_says_when_the_next_claim_may_start(open_board, orm):
    """A queue whose rate spaces claims 10 s apart (6/min): after a claim its QUEUED cards say
    when the next one may start, and stop saying it when that time passes (with no frame: the
    page's timer). The time is the API's next_claim_at."""
    import time

    from datetime import UTC, datetime

    orm(flow.change_queue, "slow", rate={"count": 6, "per_seconds": 60}, actor="op")
    orm(transitions.create, [TaskSpec(id="call-1", title="call", queue="slow"),
                             TaskSpec(id="call-2", title="call", queue="slow")])
    page = open_board()
    waiting = card(page, "call-2", "QUEUED")
    expect(waiting).to_be_visible(timeout=STRIP)
    expect(strip_item(page, "slow")).to_contain_text("rate 6/min", timeout=STRIP)
    expect(waiting.locator(".badge.waiting")).to_have_count(0)
    orm(transitions.claim, "call-1", "agent-1", 60)
    opens = orm(lambda: flow.counts(["slow"])[1]["slow"])
    shown = page.evaluate("(s) => new Date(s * 1000).toLocaleTimeString()", opens)
    expect(waiting.locator(".badge.waiting")).to_have_text(f"waiting: rate 6/min, next at {shown}", timeout=STRIP)
    page.screenshot(path="/tmp/boardq-rate.png")
    # The window opens 4 s from now (its shard written, as a claim writes it; a change that rang no
    # doorbell is read within 2 s): the badge goes when that time passes, without another frame.
    soon = time.time() + 4
    orm(lambda: queue_shards("slow", "rate").update(open_at=soon))
    shown = page.evaluate("(s) => new Date(s * 1000).toLocaleTimeString()", soon)
    expect(waiting.locator(".badge.waiting")).to_have_text(f"waiting: rate 6/min, next at {shown}", timeout=STRIP)
    updates = page.locator("#queues").get_attribute("data-updates")
    expect(waiting.locator(".badge.waiting")).to_have_count(0, timeout=STRIP)
    assert datetime.now(UTC).timestamp() >= soon
    assert page.locator("#queues").get_attribute("data-updates") == updates  # no frame did it


def test_a_queued_card_names_the_rate_key_that_holds_it_back_until_its_next_claim_may_start(open_board, orm):
    """Tasks of two queues share a rate key whose rate spaces claims 10 s apart (6/min): after a
    claim the other queue's QUEUED card names the key and when its next claim may start, and the
    badge goes when that time passes (the page's timer, no frame)."""
    import time

    orm(flow.change_rate_key, "provider:llm", rate={"count": 6, "per_seconds": 60}, actor="op")
    orm(transitions.create, [TaskSpec(id="chat-1", title="chat", queue="chat", rate_key="provider:llm"),
                             TaskSpec(id="embed-1", title="embed", queue="embed", rate_key="provider:llm")])
    page = open_board()
    waiting = card(page, "embed-1", "QUEUED")
    expect(waiting).to_be_visible(timeout=STRIP)
    expect(waiting.locator(".badge.waiting")).to_have_count(0)
    orm(transitions.claim, "chat-1", "agent-1", 60)
    opens = orm(lambda: RateKey.objects.get(name="provider:llm").rate_open_at)
    shown = page.evaluate("(s) => new Date(s * 1000).toLocaleTimeString()", opens)
    badge = waiting.locator(".badge.waiting.rate-key")
    expect(badge).to_have_text(f"waiting: provider:llm rate 6/min, next at {shown}", timeout=STRIP)
    page.screenshot(path="/tmp/boardq-rate-key.png")
    soon = time.time() + 4
    orm(lambda: RateKey.objects.filter(name="provider:llm").update(rate_open_at=soon))
    shown = page.evaluate("(s) => new Date(s * 1000).toLocaleTimeString()", soon)
    expect(badge).to_have_text(f"waiting: provider:llm rate 6/min, next at {shown}", timeout=STRIP)
    expect(badge).to_have_count(0, timeout=STRIP)


def test_an_operator_sets_a_queues_limit_and_rate_from_the_strip_and_a_refusal_is_shown(open_board, orm):
    """The Limits dialog: set a limit and a rate with a reason (kept in the history), every board
    shows them from the next frame; the dialog opens with the current settings; emptied, they are
    removed; a value the server refuses is shown and changes nothing; without board.change_queue
    there is no such button."""
    orm(transitions.create, [TaskSpec(id="ci-1", title="build", queue="ci")])
    operator = open_board()
    watcher = open_board(superuser=False)
    ci = strip_item(operator, "ci")
    expect(ci).to_contain_text("ci 0 running · 1 queued", timeout=STRIP)
    expect(strip_item(watcher, "ci")).to_contain_text("ci 0 running", timeout=STRIP)
    expect(watcher.locator("#queues button.queue-limits")).to_have_count(0)

    dialog = operator.locator("#limits-dialog")
    ci.locator("button.queue-limits").click()
    expect(dialog).to_be_visible()
    expect(dialog.locator(".queue-name")).to_have_text("ci")
    expect(dialog.locator('input[name="limit"]')).to_have_value("")
    expect(dialog.locator('input[name="rate-count"]')).to_have_value("")
    # The browser's own check: a limit of 0 is not sent (the dialog stays open).
    dialog.locator('input[name="limit"]').fill("0")
    dialog.get_by_role("button", name="Save limits").click()
    expect(dialog).to_be_visible()
    dialog.locator('input[name="limit"]').fill("2")
    dialog.locator('input[name="rate-count"]').fill("30")
    dialog.locator('select[name="rate-unit"]').select_option(label="minute")
    dialog.locator("textarea").fill("provider quota")
    operator.screenshot(path="/tmp/boardq-limits-dialog.png")
    dialog.get_by_role("button", name="Save limits").click()
    expect(dialog).to_be_hidden()
    for page in (operator, watcher):
        shown = strip_item(page, "ci")
        expect(shown).to_have_attribute("data-limit", "2", timeout=STRIP)
        expect(shown).to_contain_text("ci 0/2 running · 1 queued · rate 30/min")
    assert orm(lambda: (Queue.objects.get(name="ci").concurrency, Queue.objects.get(name="ci").rate_count,
                        Queue.objects.get(name="ci").rate_per_seconds)) == (2, 30, 60)
    assert orm(lambda: list(QueueChange.objects.filter(queue="ci").values_list("reason", "changes"))) == [
        ("provider quota", {"concurrency": [None, 2], "rate": [None, {"count": 30, "per_seconds": 60}]})]

    # A refusal (a limit past the most the server takes) is shown; nothing changes.
    ci.locator("button.queue-limits").click()
    expect(dialog.locator('input[name="limit"]')).to_have_value("2")
    expect(dialog.locator('input[name="rate-count"]')).to_have_value("30")
    expect(dialog.locator('select[name="rate-unit"]')).to_have_value("60")
    dialog.locator('input[name="limit"]').fill(str(flow.MAX_CONCURRENCY + 1))
    dialog.get_by_role("button", name="Save limits").click()
    expect(operator.locator("#message")).to_contain_text("could not change the limits of queue ci", timeout=STRIP)
    expect(operator.locator("#message")).to_have_attribute("data-kind", "error")
    expect(ci.locator("button.queue-limits")).to_be_enabled()
    assert orm(lambda: (Queue.objects.get(name="ci").concurrency, QueueChange.objects.count())) == (2, 1)

    # Emptied: no limit, no rate.
    ci.locator("button.queue-limits").click()
    dialog.locator('input[name="limit"]').fill("")
    dialog.locator('input[name="rate-count"]').fill("")
    dialog.get_by_role("button", name="Save limits").click()
    for page in (operator, watcher):
        shown = strip_item(page, "ci")
        expect(shown).to_have_attribute("data-limit", "", timeout=STRIP)
        expect(shown.locator(".queue-rate")).to_have_count(0)
    assert orm(lambda: (Queue.objects.get(name="ci").concurrency, Queue.objects.get(name="ci").rate_count)) == (
        None, None)


def test_the_column_headers_sum_up_the_queues_held_back_and_the_limits_on_a_board_of_30_queues(open_board, orm):
    """Under QUEUED: the queues that take no claim now (paused first), at most three named, the rest
    counted; under RUNNING: the limited queues, fullest first. Live, and readable."""
    orm(transitions.create, [TaskSpec(id=f"t-{n:02d}", title="work", queue=f"q{n:02d}") for n in range(26)]
        + [TaskSpec(id=f"{q}-{n}", title="work", queue=q) for q in ("ci", "web", "slow", "docs") for n in (1, 2)])
    orm(flow.change_queue, "docs", actor="op", reason="freeze", paused=True)
    orm(flow.change_queue, "q05", actor="op", reason="freeze", paused=True)
    orm(flow.change_queue, "ci", actor="op", concurrency=1)
    orm(flow.change_queue, "web", actor="op", concurrency=3)
    orm(flow.change_queue, "slow", actor="op", rate={"count": 6, "per_seconds": 60})
    leases = {task: orm(transitions.claim, task, "agent-1", 60).lease for task in ("ci-1", "web-1", "slow-1")}
    page = open_board(superuser=False)
    held = page.locator('.column[data-stage="QUEUED"] .queue-summary')
    limits = page.locator('.column[data-stage="RUNNING"] .queue-summary')
    expect(held).to_have_attribute("data-queues", "docs,q05,ci,slow", timeout=STRIP)
    expect(held).to_have_text("held: docs paused · q05 paused · ci 1/1 · +1 more")
    assert page.evaluate("(e) => e.title", held.element_handle()).split("\n") == [
        "queue docs paused", "queue q05 paused", "queue ci at its limit 1/1",
        page.locator('.card[data-id="slow-2"] .badge.waiting').inner_text().removeprefix("waiting: ")]
    expect(limits).to_have_text("limits: ci 1/1 · web 1/3")
    measured = page.evaluate(CONTRAST_JS, ['.column[data-stage="QUEUED"] .queue-summary',
                                           '.column[data-stage="RUNNING"] .queue-summary'])
    low = {sel: m for sel, m in measured.items() if m is None or m["ratio"] < 4.5}
    assert low == {}, json.dumps(low, indent=1)
    page.screenshot(path="/tmp/boardq-headers.png")
    # Live: docs resumed, a slot of ci freed.
    orm(flow.change_queue, "docs", actor="op", paused=False)
    orm(transitions.complete, "ci-1", leases["ci-1"].token, {})
    expect(held).to_have_attribute("data-queues", "q05,slow", timeout=STRIP)
    expect(held).to_have_text("held: q05 paused · slow rate")
    expect(limits).to_have_text("limits: web 1/3 · ci 0/1")


def test_a_spent_budget_shows_on_the_strip_and_the_cards_until_an_operator_raises_it_from_the_board(
        open_board, orm):
    """Issue 32, item 5: a queue whose budget its tasks' reports have spent says so on the
    strip (red, "budget spent") and on its QUEUED cards; an operator raises the budget from the
    Limits dialog and both go back to normal, live."""
    from board.engine import usage

    orm(flow.change_queue, "llm", budget={"tokens": 100, "per": "day"}, actor="op")
    orm(transitions.create, [TaskSpec(id="ask-1", title="ask", queue="llm", priority=1),
                             TaskSpec(id="ask-2", title="ask again", queue="llm")])
    page = open_board()
    llm = strip_item(page, "llm")
    expect(llm.locator(".queue-budget")).to_have_text("0/100 tokens this day", timeout=STRIP)

    def spend():
        held = transitions.claim("ask-1", "agent-1", 60)
        transitions.complete("ask-1", held.lease.token, {})
        usage.record(held.task, held.lease.fence, "agent-1",
                     usage.checked({"model": "m", "input_tokens": 90, "output_tokens": 30}))

    orm(spend)
    expect(llm.locator(".queue-budget")).to_have_text("120/100 tokens this day: budget spent", timeout=STRIP)
    expect(llm).to_have_attribute("data-budget-spent", "true")
    waiting = page.locator('.card[data-id="ask-2"] .badge.waiting')
    expect(waiting).to_have_text("waiting: queue llm's budget is spent", timeout=STRIP)
    expect(page.locator('.column[data-stage="QUEUED"] p.queue-summary')).to_have_text("held: llm budget")
    page.screenshot(path="/tmp/boardq-budget-spent.png")

    llm.locator("button.queue-limits").click()
    dialog = page.locator("#limits-dialog")
    expect(dialog.locator('input[name="budget-tokens"]')).to_have_value("100")
    expect(dialog.locator('select[name="budget-per"]')).to_have_value("day")
    dialog.locator('input[name="budget-tokens"]').fill("500")
    dialog.locator("textarea").fill("the day's allowance")
    dialog.get_by_role("button", name="Save limits").click()
    expect(llm.locator(".queue-budget")).to_have_text("120/500 tokens this day", timeout=STRIP)
    expect(waiting).to_have_count(0, timeout=STRIP)
    # A queue whose tasks all finished stays on the strip while it has a budget (a setting): its
    # spend is still news, and the Limits button is where it is raised.
    orm(transitions.cancel, "ask-2", actor="op")
    expect(llm.locator(".queue-budget")).to_have_text("120/500 tokens this day", timeout=STRIP)
    expect(llm).to_contain_text("0 queued")
    assert orm(lambda: list(QueueChange.objects.filter(queue="llm").order_by("at", "pk").values_list("reason", flat=True))) == [
        "", "the day's allowance"]


def test_a_fairness_keys_spent_budget_holds_its_cards_in_every_queue_until_raised_from_the_board(open_board, orm):
    """Issue 32, item 5: a fairness key with a budget is on the strip; once its tasks' reports
    spend it, its QUEUED cards in any queue say so, and an operator raises it from the strip's
    Budget button (the limits dialog with the budget alone), live."""
    from board.engine import usage
    from board.models import FairnessKeyChange

    orm(flow.change_fairness_key, "team-a", budget={"tokens": 100, "per": "total"}, actor="op")
    orm(transitions.create, [TaskSpec(id="fa-1", title="first", queue="docs", fairness_key="team-a", priority=1),
                             TaskSpec(id="fa-2", title="second", queue="web", fairness_key="team-a"),
                             TaskSpec(id="fb-1", title="other team", queue="web", fairness_key="team-b")])
    page = open_board()
    key = page.locator('#queues li.fairness-key[data-fairness-key="team-a"]')
    expect(key.locator(".queue-budget")).to_have_text("0/100 tokens in total", timeout=STRIP)

    def spend():
        held = transitions.claim("fa-1", "agent-1", 60)
        transitions.complete("fa-1", held.lease.token, {})
        usage.record(held.task, held.lease.fence, "agent-1",
                     usage.checked({"model": "m", "input_tokens": 90, "output_tokens": 30}))

    orm(spend)
    expect(key.locator(".queue-budget")).to_have_text("120/100 tokens in total: budget spent", timeout=STRIP)
    expect(key).to_have_attribute("data-budget-spent", "true")
    waiting = page.locator('.card[data-id="fa-2"] .badge.budget-spent')
    expect(waiting).to_have_text("waiting: fairness key team-a's budget is spent", timeout=STRIP)
    expect(page.locator('.card[data-id="fb-1"] .badge.budget-spent')).to_have_count(0)
    page.screenshot(path="/tmp/boardq-fairness-budget-spent.png")

    key.locator("button.fairness-budget").click()
    dialog = page.locator("#limits-dialog")
    expect(dialog.locator("h2")).to_have_text("Budget of fairness key team-a")
    expect(dialog.locator('input[name="limit"]')).to_be_hidden()
    expect(dialog.locator('input[name="budget-tokens"]')).to_have_value("100")
    dialog.locator('input[name="budget-tokens"]').fill("500")
    dialog.locator("textarea").fill("team a's allowance")
    dialog.get_by_role("button", name="Save limits").click()
    expect(key.locator(".queue-budget")).to_have_text("120/500 tokens in total", timeout=STRIP)
    expect(waiting).to_have_count(0, timeout=STRIP)
    assert orm(lambda: list(FairnessKeyChange.objects.filter(key="team-a").order_by("at", "pk").values_list(
        "reason", flat=True))) == ["", "team a's allowance"]
    # The queue dialog still shows every limit after the key's.
    strip_item(page, "web").locator("button.queue-limits").click()
    expect(dialog.locator("h2")).to_have_text("Limits of queue web")
    expect(dialog.locator('input[name="limit"]')).to_be_visible()
