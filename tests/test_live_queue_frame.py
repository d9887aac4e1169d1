"""The "queues" frame's concurrency keys and rate times (issue 29, the board's cards say why a task
waits) on each SQL store: the keys RUNNING tasks name (read from the keys' own counts, never the
tasks), full ones first and bounded; a slow
rate's next claim time and no time for a fast one (a frame per claim otherwise); and the frame's
text changes only when what it shows does."""
from __future__ import annotations

import pytest
from django.db.models import F

from board.engine import flow, selectors, transitions
from board.engine.transitions import TaskSpec
from board.live import frames
from board.models import Queue, RateKey
from tests.support import sql_stores

STORES = sql_stores()


def keyed(n: int, key: str, limit: int | None = None, queue: str = "default") -> TaskSpec:
    return TaskSpec(id=f"{key.replace(':', '-').replace('/', '-')}-{n}", title="keyed", queue=queue,
                    concurrency_key=key, concurrency_limit=limit)


@pytest.mark.parametrize("using", STORES)
def test_the_frame_carries_the_keys_running_tasks_name_full_ones_first(using):
    transitions.create([keyed(1, "repo:web", 1), keyed(2, "repo:web"), keyed(1, "repo:api", 2),
                        keyed(2, "repo:api"), keyed(1, "repo:old"), keyed(1, "repo:idle")], using=using)
    held = transitions.claim("repo-web-1", "agent-1", 60, using=using)
    transitions.claim("repo-api-1", "agent-3", 60, using=using)
    old = transitions.claim("repo-old-1", "agent-2", 60, using=using)
    transitions.complete("repo-old-1", old.lease.token, {}, using=using)  # nothing runs under it now
    message = frames.queues_message(using)
    # repo:idle has only a QUEUED task: nothing it holds back, not shown.
    assert message["keys"] == [{"name": "repo:web", "concurrency": 1, "running": 1},  # full: first
                               {"name": "repo:api", "concurrency": 2, "running": 1}]
    assert message["more_keys"] == 0
    # The slot frees: the key is no longer listed (nothing runs under it).
    transitions.complete("repo-web-1", held.lease.token, {}, using=using)
    assert frames.queues_message(using)["keys"] == [{"name": "repo:api", "concurrency": 2, "running": 1}]


@pytest.mark.parametrize("using", STORES)
def test_the_keys_are_bounded_with_the_full_ones_kept(using):
    transitions.create([keyed(0, f"k{n:03d}", 2) for n in range(12)] + [keyed(1, "zz-full")], using=using)
    for n in range(12):
        transitions.claim(f"k{n:03d}-0", f"agent-{n}", 60, using=using)  # 1 of 2 running: not full
    transitions.claim("zz-full-1", "agent-1", 60, using=using)
    keys, more = selectors.key_overview(5, using=using)
    # The full key sorts last by name, yet is shown first: the cards that wait for it need it.
    assert [k["name"] for k in keys] == ["zz-full", "k000", "k001", "k002", "k003"]
    assert more == 13 - 5


@pytest.mark.parametrize("using", STORES)
def test_a_rate_time_is_sent_only_for_claims_at_least_ten_seconds_apart(using):
    transitions.create([TaskSpec(id=f"{q}-{n}", title="t", queue=q) for q in ("slow", "fast") for n in range(3)],
                       using=using)
    flow.change_queue("slow", actor="op", rate={"count": 6, "per_seconds": 60}, using=using)  # one per 10 s
    flow.change_queue("fast", actor="op", rate={"count": 60, "per_seconds": 60}, using=using)  # one a second
    for queue in ("slow", "fast"):
        transitions.claim(f"{queue}-0", "agent-1", 60, using=using)
    by_name = {q["name"]: q for q in frames.queues_message(using)["queues"]}
    api = {q["name"]: q for q in selectors.queue_overview(["slow", "fast"], using=using)}
    assert by_name["slow"]["next_claim_at"] == api["slow"]["next_claim_at"] is not None
    assert by_name["fast"]["next_claim_at"] is None and api["fast"]["next_claim_at"] is not None
    # A claim moves the rate's opening (as a claim does: written on the row): a fast queue's frame
    # text stays as it was (the tailer pushes nothing), a slow one's changes.
    before = frames.queues_frame(frames.queues_message(using))
    Queue.objects.using(using).filter(name="fast").update(rate_open_at=F("rate_open_at") + 1)
    assert frames.queues_frame(frames.queues_message(using)) == before
    Queue.objects.using(using).filter(name="slow").update(rate_open_at=F("rate_open_at") + 10)
    assert frames.queues_frame(frames.queues_message(using)) != before


@pytest.mark.parametrize("using", STORES)
def test_the_frame_text_changes_only_with_what_it_shows(using):
    transitions.create([keyed(1, "repo:web", 1), keyed(2, "repo:web"), TaskSpec(id="plain", title="p")],
                       using=using)
    first = frames.queues_frame(frames.queues_message(using))
    assert frames.queues_frame(frames.queues_message(using)) == first
    held = transitions.claim("repo-web-1", "agent-1", 60, using=using)
    full = frames.queues_frame(frames.queues_message(using))
    assert full != first and '"running": 1' in full
    transitions.renew("repo-web-1", held.lease.token, 60, using=using)  # a renew shows nothing new
    assert frames.queues_frame(frames.queues_message(using)) == full


@pytest.mark.parametrize("using", STORES)
def test_the_frame_carries_the_rated_rate_keys_with_a_slow_ones_next_claim_time(using):
    transitions.create([TaskSpec(id=f"{key}-{n}", title="t", queue=f"q{n}", rate_key=key)
                        for key in ("slow", "fast", "unset") for n in range(2)], using=using)
    flow.change_rate_key("slow", actor="op", rate={"count": 6, "per_seconds": 60}, using=using)  # one per 10 s
    flow.change_rate_key("fast", actor="op", rate={"count": 60, "per_seconds": 60}, using=using)  # one a second
    for key in ("slow", "fast"):
        transitions.claim(f"{key}-0", "agent-1", 60, using=using)
    message = frames.queues_message(using)
    # A key without a rate holds nothing back: not sent.
    assert [(k["name"], k["rate"]) for k in message["rate_keys"]] == [
        ("fast", {"count": 60, "per_seconds": 60}), ("slow", {"count": 6, "per_seconds": 60})]
    assert message["more_rate_keys"] == 0
    by_name = {k["name"]: k for k in message["rate_keys"]}
    opens = RateKey.objects.using(using).get(name="slow").rate_open_at
    assert by_name["slow"]["next_claim_at"].timestamp() == pytest.approx(opens)
    assert by_name["fast"]["next_claim_at"] is None  # a time per claim would be a frame a second
    before = frames.queues_frame(message)
    RateKey.objects.using(using).filter(name="fast").update(rate_open_at=F("rate_open_at") + 1)
    assert frames.queues_frame(frames.queues_message(using)) == before
    RateKey.objects.using(using).filter(name="slow").update(rate_open_at=F("rate_open_at") + 10)
    assert frames.queues_frame(frames.queues_message(using)) != before
