"""Client-chosen queue names do not inflate the admin or /metrics (issue 27, item 7).

The review's attack, against the real server (`manage.py serve`, SQLite): five 1,000-task creates
through the API, every task in a queue of its own, took the admin's task list from 30 KB to
384 KB (its queue filter offered every queue) and /metrics to 2.1 MB in 35,021 series (seven
stages per queue). Here: the same 5,000 queues, plus 25 queues of distinct sizes so that which
queues the metrics name is known; then the admin's list, as a staff user with only
board.view_task, and one scrape, parsed with prometheus_client's parser.
"""
from __future__ import annotations

import http.client
import re
import secrets
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from board import agent_keys
from board.engine import transitions
from board.models import Task
from tests.live_server import api_call, server_for_sessions
from tests.support import sqlite_db_mark
from tests.test_live_board import staff_session

pytestmark = sqlite_db_mark()

TOKEN = "scraper-" + secrets.token_urlsafe(24)
SINGLE_QUEUES = 5000
# big-01 holds 31 tasks, big-02 32, ... big-25 55: all busier than any single-task queue.
BIG_QUEUES = {f"big-{n:02d}": 30 + n for n in range(1, 26)}
WAIT = 120


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = server_for_sessions("default", env={"TASKFLOW_METRICS_TOKEN": TOKEN}, args=["--workers", "1"])
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def flooded(server):
    """The board flooded with queues through the server's API (committed; each test's end
    empties the database)."""
    _, key = agent_keys.create_key("flooder")
    specs = [{"id": f"s{i}", "title": "t", "queue": f"q-{i:05d}"} for i in range(SINGLE_QUEUES)]
    specs += [{"id": f"{queue}-{i}", "title": "t", "queue": queue}
              for queue, size in BIG_QUEUES.items() for i in range(size)]
    for start in range(0, len(specs), 1000):  # the API's cap per create
        status, answer = api_call(server, "POST", "/api/tasks", key, specs[start:start + 1000], timeout=WAIT)
        assert status == 201, answer
    # Some stages besides QUEUED, in the named queues and in the rest.
    for queue in ("big-25", "big-03", "q-00007"):
        status, answer = api_call(server, "POST", "/api/claim", key, {"ttl_seconds": 600, "queue": queue})
        assert status == 200, answer
    transitions.cancel("s11", actor="t")
    transitions.cancel("big-01-0", actor="t")
    return server


def get(server, path: str, headers: dict) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def scrape(server) -> tuple[bytes, list]:
    status, body = get(server, "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body[:500]
    return body, [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]


def test_the_admin_list_offers_a_bounded_queue_filter(flooded):
    _, session = staff_session("default")  # board.view_task only
    cookie = {"Cookie": f"sessionid={session}"}
    status, page = get(flooded, "/admin/board/task/", cookie)
    assert status == 200, page[:500]
    offered = len(set(re.findall(rb'href="\?queue=([^"&]+)"', page)))
    # The same list with the 5,000 queues made one (rows written here: the list shows no queue
    # column and orders by updated_at, which the update leaves alone): the same rows, 26 queues.
    Task.objects.filter(queue__startswith="q-").update(queue="q-all")
    status, calm = get(flooded, "/admin/board/task/", cookie)
    assert status == 200
    # What the 5,000 queues add is a bounded filter: under 256 bytes per queue it may offer.
    assert len(page) - len(calm) <= 50 * 256, (len(page), len(calm), offered)
    from board.admin.filters import QUEUE_FILTER_LIMIT

    assert offered == QUEUE_FILTER_LIMIT == 50
    assert len(set(re.findall(rb'href="\?queue=([^"&]+)"', calm))) == 26
    # Any queue is still one click away: a queue the filter does not offer still filters (and
    # is shown as the chosen one), and the search box finds it by its exact name.
    Task.objects.filter(pk="s4999").update(queue="q-04999")
    status, page = get(flooded, "/admin/board/task/?queue=q-04999", cookie)
    assert status == 200
    assert re.search(rb'<li class="selected">\s*<a href="\?queue=q-04999"', page), page[:200]
    assert b"s4999" in page and b"s4998" not in page
    status, page = get(flooded, "/admin/board/task/?q=q-04999", cookie)
    assert status == 200 and b"s4999" in page and b"s4998" not in page


def test_metrics_name_the_busiest_queues_and_sum_the_rest_exactly(flooded):
    Task.objects.filter(pk="s42").update(stage_changed_at=timezone.now() - timedelta(hours=1))
    before = timezone.now()
    body, samples = scrape(flooded)
    after = timezone.now()
    assert len(samples) <= 1000, (len(samples), len(body))
    assert len(body) <= 128 * 1024, len(body)
    from board.metrics import OTHER_QUEUES, QUEUE_LABEL_LIMIT

    tasks = [s for s in samples if s.name == "taskflow_tasks"]
    queues = {s.labels["queue"] for s in tasks}
    named = queues - {OTHER_QUEUES}
    # The busiest: most tasks held (every stage), ties by name; here the 20 largest big-NN.
    busiest = sorted(BIG_QUEUES, key=lambda q: (-BIG_QUEUES[q], q))[:QUEUE_LABEL_LIMIT]
    assert named == set(busiest) and OTHER_QUEUES in queues
    assert len(tasks) == (QUEUE_LABEL_LIMIT + 1) * 7

    # Totals stay exact: by stage, summed over every label value, as the database counts them.
    truth = dict(Task.objects.values_list("stage").annotate(n=Count("id")).order_by())
    by_stage = Counter()
    for s in tasks:
        by_stage[s.labels["stage"]] += s.value
    assert {stage: n for stage, n in by_stage.items() if n} == truth
    assert sum(by_stage.values()) == SINGLE_QUEUES + sum(BIG_QUEUES.values())
    # Per named queue exact; `other` is the rest.
    per_queue = dict(Task.objects.filter(queue__in=named).values_list("queue").annotate(n=Count("id")).order_by())
    got = Counter()
    for s in tasks:
        got[s.labels["queue"]] += s.value
    assert {q: got[q] for q in named} == per_queue
    assert got[OTHER_QUEUES] == Task.objects.exclude(queue__in=named).count()

    # The oldest QUEUED age: per named queue, and `other`'s is the oldest of the rest (one of
    # them made an hour older by writing its row).
    ages = {s.labels["queue"]: s.value for s in samples if s.name == "taskflow_oldest_queued_age_seconds"}
    assert set(ages) <= queues and OTHER_QUEUES in ages
    oldest = Task.objects.get(pk="s42").stage_changed_at
    assert (before - oldest).total_seconds() - 1 <= ages[OTHER_QUEUES] <= (after - oldest).total_seconds() + 1
    for queue in named:
        since = Task.objects.filter(queue=queue, stage="QUEUED").order_by("stage_changed_at").first().stage_changed_at
        assert (before - since).total_seconds() - 1 <= ages[queue] <= (after - since).total_seconds() + 1


def test_few_queues_are_all_named_and_no_other_appears():
    """Below the limit every queue is named, as before, and no `other` series is made."""
    from board import metrics

    transitions.create([transitions.TaskSpec(id=f"f{i}", title="t", queue=f"few-{i}") for i in range(3)])
    families = {f.name: f for f in text_string_to_metric_families(metrics.scrape().decode())}
    queues = {s.labels["queue"] for s in families["taskflow_tasks"].samples}
    assert queues == {"few-0", "few-1", "few-2"}
    assert {s.labels["queue"] for s in families["taskflow_oldest_queued_age_seconds"].samples} == queues


def test_the_named_queues_are_the_busiest_ties_broken_by_name():
    from board.metrics import OTHER_QUEUES, named_queues

    held = {"b": 5, "a": 5, "c": 5, "big": 9, OTHER_QUEUES: 100}
    # `_other` cannot be a queue the engine made; a row written outside it is summed, not named.
    assert named_queues(held, limit=3) == {"big", "a", "b"}
    assert named_queues(held, limit=10) == {"big", "a", "b", "c"}
