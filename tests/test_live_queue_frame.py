"""The "queues" frame's concurrency keys and rate times (issue 29, the board's cards say why a task
waits) on each SQL store: the keys RUNNING tasks name (read from the keys' own counts, never the
tasks), full ones first and bounded; a slow
rate's next claim time and no time for a fast one (a frame per claim otherwise); and the frame's
text changes only when what it shows does."""
from __future__ import annotations

import pytest
from django.db.models import F

from board.engine import flow, resources, selectors, transitions
from board.engine.transitions import TaskSpec
from board.live import frames
from board.models import RateKey
from tests.support import queue_shards, sql_stores

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
    # A claim moves the rate's opening (as a claim does: written on its shard): a fast queue's frame
    # text stays as it was (the tailer pushes nothing), a slow one's changes.
    before = frames.queues_frame(frames.queues_message(using))
    queue_shards("fast", "rate", using).update(open_at=F("open_at") + 1)
    assert frames.queues_frame(frames.queues_message(using)) == before
    queue_shards("slow", "rate", using).update(open_at=F("open_at") + 10)
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


@pytest.mark.parametrize("using", STORES)
def test_the_frame_carries_the_held_resources_and_their_holders_never_a_token(using):
    """Issue 32: a QUEUED card says which resource it waits for and who holds it, from this frame."""
    transitions.create([TaskSpec(id="merge-1", title="m", resources=["merge-slot"]),
                        TaskSpec(id="merge-2", title="m", resources=["merge-slot"]),
                        TaskSpec(id="edit-app", title="e", resources=["file:src/app/**"]),
                        TaskSpec(id="gpu-1", title="g", resources=[{"name": "gpu", "units": 1}]),
                        TaskSpec(id="idle", title="i", resources=["branch:idle"])], using=using)
    resources.change_capacity("gpu", 4, actor="op", using=using)
    assert frames.queues_message(using)["resources"] == []  # nothing held: nothing shown
    held = transitions.claim("merge-1", "worker-3", 60, using=using)
    edit = transitions.claim("edit-app", "worker-4", 60, using=using)
    gpu = transitions.claim("gpu-1", "worker-5", 60, using=using)
    message = frames.queues_message(using)
    # Full first (held exclusively), then partly held (gpu 1 of 4), then the nodes with holds
    # below only (file: and file:src/, above file:src/app/); branch:idle holds nothing back.
    assert message["resources"] == [
        {"name": "file:src/app/", "capacity": 1, "held": "exclusive", "holds_below": 0,
         "holders": [{"task": "edit-app", "agent": "worker-4"}], "more_holders": 0},
        {"name": "merge-slot", "capacity": 1, "held": "exclusive", "holds_below": 0,
         "holders": [{"task": "merge-1", "agent": "worker-3"}], "more_holders": 0},
        {"name": "gpu", "capacity": 4, "held": 1, "holds_below": 0,
         "holders": [{"task": "gpu-1", "agent": "worker-5"}], "more_holders": 0},
        {"name": "file:", "capacity": 1, "held": 0, "holds_below": 1, "holders": [], "more_holders": 0},
        {"name": "file:src/", "capacity": 1, "held": 0, "holds_below": 1, "holders": [], "more_holders": 0}]
    assert message["more_resources"] == 0
    text = frames.queues_frame(message)
    for lease in (held, edit, gpu):
        assert lease.lease.token not in text
    assert "token" not in text and "fence" not in text and "expires" not in text
    # A renew shows nothing new; the holder's complete frees it (the other waiter's card redraws).
    transitions.renew("merge-1", held.lease.token, 60, using=using)
    assert frames.queues_frame(frames.queues_message(using)) == text
    transitions.complete("merge-1", held.lease.token, {}, using=using)
    assert "merge-slot" not in [r["name"] for r in frames.queues_message(using)["resources"]]


@pytest.mark.parametrize("using", STORES)
def test_the_resources_and_their_holders_are_bounded_full_ones_kept(using):
    transitions.create([TaskSpec(id=f"s-{n}", title="s", resources=[{"name": "pool", "units": 1}]) for n in range(4)]
                       + [TaskSpec(id=f"a-{n}", title="a", resources=[f"a-{n:02d}"]) for n in range(3)]
                       + [TaskSpec(id="z", title="z", resources=["zz-slot"])], using=using)
    resources.change_capacity("pool", 100, actor="op", using=using)
    for n in range(4):
        transitions.claim(f"s-{n}", f"w-{n}", 60, using=using)
    for task in ("a-0", "a-1", "a-2", "z"):
        transitions.claim(task, "w", 60, using=using)
    shown, more = resources.overview(3, 2, using=using)
    # The pool (4 of 100) sorts before zz-slot yet comes after every full one.
    assert [r["name"] for r in shown] == ["a-00", "a-01", "a-02"] and more == 2
    shown, _ = resources.overview(10, 2, using=using)
    pool = next(r for r in shown if r["name"] == "pool")
    assert (pool["holders"], pool["more_holders"]) == ([{"task": "s-0", "agent": "w-0"},
                                                         {"task": "s-1", "agent": "w-1"}], 2)


@pytest.mark.parametrize("using", STORES)
def test_the_frame_carries_the_fairness_keys_with_a_budget_spent_ones_first_and_bounded(using):
    from board.engine import usage

    for n in range(4):
        flow.change_fairness_key(f"team-{n}", budget={"tokens": 10, "per": "day"}, actor="op", using=using)
    flow.change_fairness_key("zz-spent", budget={"tokens": 10, "per": "total"}, actor="op", using=using)
    transitions.create([TaskSpec(id="s-1", title="t", fairness_key="zz-spent"),
                        TaskSpec(id="plain", title="t", fairness_key="no-budget")], using=using)
    held = transitions.claim("s-1", "agent-1", 60, using=using)
    transitions.complete("s-1", held.lease.token, {}, using=using)
    usage.record(held.task, held.lease.fence, "agent-1",
                 usage.checked({"model": "m", "input_tokens": 12, "output_tokens": 0}), using=using)
    keys, more = selectors.fairness_key_overview(3, using=using)
    # The spent key sorts last by name, yet is shown first: the cards that wait for it need it.
    assert [(k["name"], k["budget_exhausted"]) for k in keys] == [
        ("zz-spent", True), ("team-0", False), ("team-1", False)]
    assert keys[0]["spent"] == {"tokens": 12, "cost_usd": 0.0} and keys[0]["weight"] == 1
    assert more == 5 - 3
    message = frames.queues_message(using)
    assert [k["name"] for k in message["fairness_keys"]][:2] == ["zz-spent", "team-0"]  # a key without one: not news
    assert message["more_fairness_keys"] == 0
