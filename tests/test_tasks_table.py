"""The board's all-tasks table (/board/tasks/) and its export (/board/tasks/export) through the
whole Django stack (SQLite; the orders' keysets on PostgreSQL too: tests/test_list_orders.py): pages over more tasks than a page holds add up to the
exact count, each sort is its order (board.engine.listing, as GET /api/tasks), a filter narrows
the rows and the count, the export of a filter has exactly the filter's count of rows and never a
lease token, a bad parameter is a 4xx that writes nothing, and the permission is the board's.
The browser side (the page as a person uses it): tests/test_browser_tasks.py."""
from __future__ import annotations

import csv
import html
import io
import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from board.engine import listing, transitions
from board.engine.transitions import TaskSpec
from board.live import tasks_table
from board.models import Task
from tests.support import db_state

N = 130  # more than two pages of 50


def _board(using: str) -> dict[str, str]:
    """N tasks in two queues with priorities, distinct creation and update times; 7 RUNNING
    (their lease tokens returned, which must never appear in a page or an export)."""
    transitions.create([TaskSpec(title=f"job {i}" + (" =1+1" if i == 5 else ""), id=f"job-{i:03}", priority=i % 5,
                                 queue="ingest" if i % 3 else "render") for i in range(N)],
                       actor="test", using=using)
    base = timezone.now() - timedelta(hours=2)
    for i in range(N):
        Task.objects.using(using).filter(pk=f"job-{i:03}").update(
            created_at=base + timedelta(seconds=i), updated_at=base + timedelta(seconds=(i * 37) % N, minutes=30))
    tokens = {}
    for i in range(7):
        claim = transitions.claim(f"job-{i * 10:03}", f"agent-{i % 2}", 600, using=using)
        tokens[claim.task.pk] = claim.lease.token
    return tokens


def _client(perms=("view_task",), staff=True) -> Client:
    user = User.objects.create_user(f"u{User.objects.count()}", password="x", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="board"))
    client = Client()
    client.force_login(user)
    return client


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr data-id="([^"]+)">', html)


def _walk(client: Client, query: str) -> tuple[list[str], list[str]]:
    """Every page of the table from `query`, following "next page": the ids in order, and each
    page's "first–last of total" line."""
    ids, counts = [], []
    url = f"/board/tasks/?{query}"
    while url:
        answer = client.get(url)
        assert answer.status_code == 200
        html = answer.content.decode()
        ids += _ids(html)
        line = re.search(r'<p id="tasks-count"[^>]*>(.*?)</p>', html, re.S).group(1)
        counts.append(re.sub(r"<[^>]+>", "", line).removesuffix(" (times in UTC)"))
        found = re.search(r'<a id="next-page" href="\?([^"]+)"', html)
        url = f"/board/tasks/?{found.group(1).replace('&amp;', '&')}" if found else None
    return ids, counts


def _expected(using: str, order: str, **filters) -> list[str]:
    return [t.pk for t in listing.task_list(order=order, count=10_000, using=using, **filters)]


@pytest.mark.django_db(transaction=True)
def test_pages_add_up_to_the_exact_count_in_every_sort():
    using = "default"
    _board(using)
    client = _client()
    for order, _ in tasks_table.SORTS:
        ids, counts = _walk(client, f"order={order}")
        assert ids == _expected(using, order), order
        assert len(ids) == len(set(ids)) == N
        assert counts == [f"1–50 of {N} tasks", f"51–100 of {N} tasks", f"101–{N} of {N} tasks"], order
    # The sorts as a person reads them.
    newest, _ = _walk(client, "order=newest&limit=200")
    assert newest == [f"job-{i:03}" for i in reversed(range(N))]
    by_priority, _ = _walk(client, "order=priority&limit=200")
    assert [int(i[4:]) % 5 for i in by_priority] == sorted((i % 5 for i in range(N)), reverse=True)
    updated, _ = _walk(client, "order=updated&limit=200")
    # the claims changed their tasks last (the last claim first), then the rest as written
    unclaimed = [i for i in range(N) if i % 10 or i >= 70]
    assert updated == [f"job-{i * 10:03}" for i in reversed(range(7))] + [
        f"job-{i:03}" for i in sorted(unclaimed, key=lambda i: (i * 37) % N, reverse=True)]
    in_stage, _ = _walk(client, "order=in_stage&stage=RUNNING")
    assert in_stage == [f"job-{i * 10:03}" for i in range(7)]  # claimed first: running longest


@pytest.mark.django_db(transaction=True)
def test_a_filter_narrows_the_rows_and_the_count_and_the_export_holds_exactly_them():
    using = "default"
    tokens = _board(using)
    client = _client()
    query = "stage=QUEUED&queue=ingest&text=JOB+1&order=priority&limit=25"
    ids, counts = _walk(client, query)
    expected = _expected(using, "priority", stages=["QUEUED"], queue="ingest", text="job 1")
    # in ingest (i % 3 != 0): job 1, 7 of 10..19, 20 of 100..129; job 10 is RUNNING
    assert ids == expected and len(expected) == 27
    assert counts == ["1–25 of 27 tasks matching the filter", "26–27 of 27 tasks matching the filter"]
    owner_ids, _ = _walk(client, "owner=agent-1")
    assert sorted(owner_ids) == ["job-010", "job-030", "job-050"]

    csv_answer = client.get(f"/board/tasks/export?{query.replace('&limit=25', '')}&format=csv")
    assert csv_answer.status_code == 200 and csv_answer.streaming
    assert csv_answer["Content-Type"].startswith("text/csv")
    text = b"".join(csv_answer.streaming_content).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["id"] for row in rows] == expected
    assert list(rows[0]) == list(tasks_table.EXPORT_COLUMNS)

    everything = client.get("/board/tasks/export?format=jsonl&order=created")
    lines = b"".join(everything.streaming_content).decode().splitlines()
    assert len(lines) == N == listing.count_tasks(listing.Filters(), using=using)
    parsed = [json.loads(line) for line in lines]
    assert [row["id"] for row in parsed] == [f"job-{i:03}" for i in range(N)]
    assert {row["owner"] for row in parsed if row["stage"] == "RUNNING"} == {"agent-0", "agent-1"}
    whole = "\n".join(lines) + text
    for token in tokens.values():
        assert token not in whole
    assert "token" not in whole and "lease_token_hash" not in whole
    # A title that a spreadsheet would run as a formula is written as text.
    all_csv = b"".join(client.get("/board/tasks/export?format=csv").streaming_content).decode()
    assert next(r for r in csv.DictReader(io.StringIO(all_csv)) if r["id"] == "job-005")["title"] == "job 5 =1+1"
    assert ",job 5 =1+1," in all_csv


BAD_QUERIES = [
    ("order=fastest", "unknown order 'fastest'"),
    ("stage=DONE", "unknown stage 'DONE'"),
    ("queue=bad%20queue", "invalid queue name"),
    ("limit=7", "limit is one of 25, 50, 100, 200"),
    ("limit=-1", "limit must be a whole number"),
    ("cursor=not-a-cursor", "cursor is not one this API gave out"),
    ("stages=QUEUED", "unknown query parameter 'stages'"),
    ("text=a&text=b", "query parameter 'text' is given more than once"),
    ("text=" + "x" * 301, "text is at most 300 characters"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query,message", BAD_QUERIES)
def test_a_bad_parameter_is_refused_with_a_clear_4xx_and_writes_nothing(query, message):
    _board("default")
    client = _client()
    # A cursor of another order is refused too, not read as this one's.
    before = db_state()
    page = client.get(f"/board/tasks/?{query}")
    assert page.status_code == 422
    assert message in html.unescape(page.content.decode())
    assert 'id="tasks-error"' in page.content.decode() and "<tr data-id" not in page.content.decode()
    export = client.get(f"/board/tasks/export?{query.replace('limit', 'format') if 'limit' in query else query}")
    assert export.status_code == 422
    assert export.json()["error"]["code"] == "validation_error"
    assert db_state() == before


@pytest.mark.django_db(transaction=True)
def test_an_export_refuses_a_bad_format_a_cursor_of_another_order_and_too_many_rows(monkeypatch):
    _board("default")
    client = _client()
    before = db_state()
    answer = client.get("/board/tasks/export?format=xlsx")
    assert answer.status_code == 422 and answer.json()["error"]["message"] == "format is one of csv, jsonl"
    page = client.get("/board/tasks/?order=newest")
    cursor = re.search(r'cursor=([^&"]+)', page.content.decode()).group(1)
    assert client.get(f"/board/tasks/?order=newest&cursor={cursor}").status_code == 200
    assert client.get(f"/board/tasks/?order=priority&cursor={cursor}").status_code == 422
    monkeypatch.setattr(tasks_table, "EXPORT_MAX_ROWS", N - 1)
    refused = client.get("/board/tasks/export?format=csv")
    assert refused.status_code == 422
    assert refused.json()["error"]["message"].startswith(f"{N} tasks match; an export holds at most {N - 1}")
    assert client.get("/board/tasks/export?format=csv&queue=render").status_code == 200
    assert db_state() == before


@pytest.mark.django_db(transaction=True)
def test_the_table_and_the_export_take_the_boards_permission():
    _board("default")
    for path in ("/board/tasks/", "/board/tasks/export?format=csv"):
        anonymous = Client().get(path)
        assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
        assert _client(perms=(), staff=False).get(path).status_code == 302  # not staff: the login page
        refused = _client(perms=())
        answer = refused.get(path)
        assert answer.status_code == 403
        assert "board.view_task" in answer.content.decode()
        assert _client(perms=("change_task",)).get(path).status_code == 200
    # POST is not a way in either.
    assert _client().post("/board/tasks/").status_code in (403, 405)


@pytest.mark.django_db(transaction=True)
def test_an_empty_filter_says_so_and_offers_to_clear_it():
    _board("default")
    html = _client().get("/board/tasks/?text=nothing-like-this").content.decode()
    assert "No task matches the filter." in html
    assert 'href="/board/tasks/?order=newest">Clear the filter</a>' in html
    assert "<tr data-id" not in html and 'id="export-csv"' not in html


@pytest.mark.django_db(transaction=True)
def test_the_export_says_what_each_task_requires_of_its_claimer():
    transitions.create([TaskSpec(id="gpu-job", title="train", requires=["gpu", "python"]),
                        TaskSpec(id="any-job", title="lint")])
    client = _client()
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(b"".join(
        client.get("/board/tasks/export?format=csv").streaming_content).decode()))}
    assert (rows["gpu-job"]["requires"], rows["any-job"]["requires"]) == ("gpu python", "")
    lines = b"".join(client.get("/board/tasks/export?format=jsonl").streaming_content).decode().splitlines()
    assert {row["id"]: row["requires"] for row in map(json.loads, lines)} == {"gpu-job": ["gpu", "python"],
                                                                               "any-job": None}
