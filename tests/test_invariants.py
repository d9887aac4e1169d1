"""Pure unit tests of `board.engine.invariants.check(tasks, now)`: no database, no clock.

Every test asserts the full, ordered list of (task, code) pairs `check` returns, so a missing
problem and an extra one both fail."""
from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timedelta, timezone

import pytest

from board.engine import invariants
from board.engine.invariants import ALL_CODES, Problem, TaskSnapshot, check
from board.engine.lifecycle import Stage

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
LATER = NOW + timedelta(minutes=5)
EARLIER = NOW - timedelta(minutes=5)


def snap(task_id: str, stage: Stage | str = Stage.QUEUED, **overrides) -> TaskSnapshot:
    """A snapshot that is valid on its own for `stage`, with keyword overrides.

    RUNNING gets a full live lease; PAUSED a checkpoint; COMPLETED a result; every other stage
    holds no lease. `deps` defaults to none."""
    fields: dict = {"id": task_id, "stage": str(stage)}
    if stage == Stage.RUNNING:
        fields.update(owner="agent-1", has_token=True, lease_expires_at=LATER, attempts=1)
    elif stage == Stage.PAUSED:
        fields.update(has_checkpoint=True, attempts=1)
    elif stage == Stage.COMPLETED:
        fields.update(has_result=True, attempts=1)
    elif stage == Stage.FAILED:
        fields.update(attempts=1)
    fields.update(overrides)
    return TaskSnapshot(**fields)


def pairs(tasks, now: datetime = NOW) -> list[tuple[str, str]]:
    problems = check(tasks, now)
    assert all(isinstance(p, Problem) for p in problems)
    return [(p.task, p.code) for p in problems]


def test_all_codes_are_distinct_and_named():
    assert len(set(ALL_CODES)) == len(ALL_CODES) == 17
    assert all(isinstance(code, str) and code for code in ALL_CODES)


# ---------------------------------------------------------------------------------------------
# One minimal snapshot per code producing exactly that code, and a near-identical valid one.

# code -> (snapshot producing exactly [(task, code)], expected pairs, near-identical valid snapshot)
POSITIVE_AND_NEGATIVE = {
    invariants.EMPTY_ID: (
        [snap("")],
        [("", "empty_id")],
        [snap("a")],
    ),
    invariants.DUPLICATE_ID: (
        [snap("a"), snap("a")],
        [("a", "duplicate_id")],
        [snap("a"), snap("b")],
    ),
    invariants.UNKNOWN_STATE: (
        [snap("a", stage="queued")],  # stages are case-sensitive
        [("a", "unknown_state")],
        [snap("a", stage="QUEUED")],
    ),
    invariants.UNKNOWN_DEP: (
        [snap("a", Stage.PENDING, deps=("ghost",))],
        [("a", "unknown_dep")],
        [snap("a", Stage.PENDING, deps=("b",)), snap("b", Stage.PENDING)],
    ),
    invariants.SELF_DEP: (
        [snap("a", Stage.PENDING, deps=("a",))],  # a self-dependency is self_dep, not dep_cycle
        [("a", "self_dep")],
        [snap("a", Stage.PENDING, deps=("b",)), snap("b", Stage.PENDING)],
    ),
    invariants.DEP_CYCLE: (
        [snap("a", Stage.PENDING, deps=("b",)), snap("b", Stage.PENDING, deps=("a",))],
        [("a", "dep_cycle"), ("b", "dep_cycle")],
        [snap("a", Stage.PENDING, deps=("b",)), snap("b", Stage.PENDING)],
    ),
    invariants.CLAIMED_WITHOUT_LEASE: (
        [snap("a", Stage.RUNNING, owner="")],
        [("a", "claimed_without_lease")],
        [snap("a", Stage.RUNNING)],
    ),
    invariants.LEASE_WITHOUT_CLAIM: (
        [snap("a", Stage.QUEUED, owner="agent-1")],
        [("a", "lease_without_claim")],
        [snap("a", Stage.QUEUED)],
    ),
    invariants.BLOCKED_CLAIM: (
        [snap("a", Stage.RUNNING, deps=("b",)), snap("b", Stage.QUEUED)],
        [("a", "blocked_claim")],
        [snap("a", Stage.RUNNING, deps=("b",)), snap("b", Stage.COMPLETED)],
    ),
    invariants.TERMINAL_CLAIMED: (
        [snap("a", Stage.COMPLETED, has_token=True)],
        [("a", "terminal_claimed")],
        [snap("a", Stage.COMPLETED)],
    ),
    invariants.LEASE_EXPIRED: (
        [snap("a", Stage.RUNNING, lease_expires_at=NOW)],  # expiring exactly now is expired
        [("a", "lease_expired")],
        [snap("a", Stage.RUNNING, lease_expires_at=NOW + timedelta(microseconds=1))],
    ),
    invariants.QUEUED_BLOCKED: (
        [snap("a", Stage.QUEUED, deps=("b", "c")), snap("b", Stage.COMPLETED), snap("c", Stage.PENDING)],
        [("a", "queued_blocked")],
        [snap("a", Stage.QUEUED, deps=("b", "c")), snap("b", Stage.COMPLETED), snap("c", Stage.COMPLETED)],
    ),
    invariants.PAUSED_WITHOUT_CHECKPOINT: (
        [snap("a", Stage.PAUSED, has_checkpoint=False)],
        [("a", "paused_without_checkpoint")],
        [snap("a", Stage.PAUSED, has_checkpoint=True)],
    ),
    invariants.COMPLETED_WITHOUT_RESULT: (
        [snap("a", Stage.COMPLETED, has_result=False)],
        [("a", "completed_without_result")],
        [snap("a", Stage.COMPLETED, has_result=True)],
    ),
    invariants.DEAD_DEP: (
        [snap("a", Stage.PENDING, deps=("b",)), snap("b", Stage.CANCELLED)],
        [("a", "dead_dep")],
        # the same dependency from a CANCELLED task: it is not live, so nothing waits in vain
        [snap("a", Stage.CANCELLED, deps=("b",)), snap("b", Stage.CANCELLED)],
    ),
    invariants.ATTEMPTS_EXCEEDED: (
        [snap("a", Stage.FAILED, attempts=4, max_retries=2)],  # max_retries + 2
        [("a", "attempts_exceeded")],
        [snap("a", Stage.FAILED, attempts=3, max_retries=2)],  # max_retries + 1
    ),
    invariants.RANK_BEFORE_CREATION: (
        [snap("a", Stage.QUEUED, claim_rank=100.0, earliest_rank=160.0)],  # a minute before its creation's rank
        [("a", "rank_before_creation")],
        [snap("a", Stage.QUEUED, claim_rank=160.0, earliest_rank=160.0)],  # exactly its creation's
    ),
}


def test_every_code_has_a_case():
    assert set(POSITIVE_AND_NEGATIVE) == set(ALL_CODES)


@pytest.mark.parametrize("code", ALL_CODES)
def test_minimal_snapshot_gives_exactly_its_code(code):
    tasks, expected, _ = POSITIVE_AND_NEGATIVE[code]
    assert {c for _, c in expected} == {code}
    assert pairs(tasks) == expected


@pytest.mark.parametrize("code", ALL_CODES)
def test_near_identical_valid_snapshot_gives_nothing(code):
    _, _, valid = POSITIVE_AND_NEGATIVE[code]
    assert pairs(valid) == []


@pytest.mark.parametrize("code", ALL_CODES)
def test_problem_text_is_human_and_names_the_task(code):
    tasks, expected, _ = POSITIVE_AND_NEGATIVE[code]
    for problem in check(tasks, NOW):
        assert problem.text and isinstance(problem.text, str)
        if problem.task:
            assert problem.task in problem.text


# ---------------------------------------------------------------------------------------------
# Each code in more detail


@pytest.mark.parametrize("missing", ["owner", "has_token", "lease_expires_at"])
def test_running_missing_any_lease_part_is_claimed_without_lease(missing):
    empty = {"owner": "", "has_token": False, "lease_expires_at": None}[missing]
    assert pairs([snap("a", Stage.RUNNING, **{missing: empty})]) == [("a", "claimed_without_lease")]


def test_running_with_no_lease_at_all_is_one_problem():
    bare = snap("a", Stage.RUNNING, owner="", has_token=False, lease_expires_at=None)
    assert pairs([bare]) == [("a", "claimed_without_lease")]


def test_running_with_owner_token_and_future_expiry_is_fine():
    assert pairs([snap("a", Stage.RUNNING, lease_expires_at=NOW + timedelta(seconds=1))]) == []


@pytest.mark.parametrize("expires_at, expected", [
    (NOW - timedelta(days=1), [("a", "lease_expired")]),
    (NOW - timedelta(microseconds=1), [("a", "lease_expired")]),
    (NOW, [("a", "lease_expired")]),
    (NOW + timedelta(microseconds=1), []),
])
def test_lease_expiry_boundary(expires_at, expected):
    assert pairs([snap("a", Stage.RUNNING, lease_expires_at=expires_at)]) == expected


def test_lease_expiry_compares_instants_across_time_zones():
    plus_two = timezone(timedelta(hours=2))
    same_instant = NOW.astimezone(plus_two)
    assert pairs([snap("a", Stage.RUNNING, lease_expires_at=same_instant)]) == [("a", "lease_expired")]
    assert pairs([snap("a", Stage.RUNNING, lease_expires_at=(NOW + timedelta(seconds=1)).astimezone(plus_two))]) == []


def test_a_claimed_without_lease_task_is_not_also_lease_expired():
    stale = snap("a", Stage.RUNNING, owner="", lease_expires_at=EARLIER)
    assert pairs([stale]) == [("a", "claimed_without_lease")]


NOT_LEASED_LIVE = [Stage.PENDING, Stage.QUEUED, Stage.PAUSED, Stage.FAILED]
LEASE_PARTS = {"owner": "agent-1", "has_token": True, "lease_expires_at": LATER}


@pytest.mark.parametrize("stage", NOT_LEASED_LIVE)
@pytest.mark.parametrize("part", sorted(LEASE_PARTS))
def test_any_lease_part_on_an_unleased_stage_is_lease_without_claim(stage, part):
    assert pairs([snap("a", stage, **{part: LEASE_PARTS[part]})]) == [("a", "lease_without_claim")]
    assert pairs([snap("a", stage)]) == []


@pytest.mark.parametrize("stage", [Stage.COMPLETED, Stage.CANCELLED])
@pytest.mark.parametrize("part", sorted(LEASE_PARTS))
def test_any_lease_part_on_a_terminal_stage_is_terminal_claimed(stage, part):
    assert pairs([snap("a", stage, **{part: LEASE_PARTS[part]})]) == [("a", "terminal_claimed")]
    assert pairs([snap("a", stage)]) == []


def test_expired_lease_parts_on_a_queued_task_are_lease_without_claim_not_lease_expired():
    assert pairs([snap("a", Stage.QUEUED, owner="x", has_token=True, lease_expires_at=EARLIER)]) == [
        ("a", "lease_without_claim")
    ]


def test_paused_needs_a_checkpoint_and_no_other_stage_does():
    assert pairs([snap("a", Stage.PAUSED, has_checkpoint=False)]) == [("a", "paused_without_checkpoint")]
    assert pairs([snap("a", Stage.PAUSED, has_checkpoint=True)]) == []
    for stage in Stage:
        if stage != Stage.PAUSED:
            assert pairs([snap("a", stage, has_checkpoint=False)]) == [], stage


def test_completed_needs_a_result_and_no_other_stage_does():
    assert pairs([snap("a", Stage.COMPLETED, has_result=False)]) == [("a", "completed_without_result")]
    for stage in Stage:
        if stage != Stage.COMPLETED:
            assert pairs([snap("a", stage, has_result=False)]) == [], stage


@pytest.mark.parametrize("max_retries", [0, 1, 3, 100])
@pytest.mark.parametrize("stage", list(Stage))
def test_attempts_boundary(stage, max_retries):
    assert pairs([snap("a", stage, attempts=max_retries + 1, max_retries=max_retries)]) == []
    assert pairs([snap("a", stage, attempts=max_retries + 2, max_retries=max_retries)]) == [
        ("a", "attempts_exceeded")
    ]


@pytest.mark.parametrize("dep_stage", [Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED])
def test_queued_with_an_unfinished_live_dependency_is_queued_blocked(dep_stage):
    tasks = [snap("a", Stage.QUEUED, deps=("b",)), snap("b", dep_stage)]
    assert pairs(tasks) == [("a", "queued_blocked")]


def test_queued_whose_dependencies_are_all_completed_is_fine():
    tasks = [snap("a", Stage.QUEUED, deps=("b", "c", "d"))] + [snap(x, Stage.COMPLETED) for x in "bcd"]
    assert pairs(tasks) == []


@pytest.mark.parametrize("stage", [Stage.RUNNING, Stage.PAUSED])
@pytest.mark.parametrize("dep_stage", [Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED])
def test_claimed_before_a_dependency_completed_is_blocked_claim(stage, dep_stage):
    tasks = [snap("a", stage, deps=("b",)), snap("b", dep_stage)]
    assert pairs(tasks) == [("a", "blocked_claim")]
    tasks = [snap("a", stage, deps=("b",)), snap("b", Stage.COMPLETED)]
    assert pairs(tasks) == []


@pytest.mark.parametrize("dead", [Stage.CANCELLED, Stage.FAILED])
def test_live_tasks_waiting_for_a_dead_end(dead):
    tasks = [
        snap("d", dead),
        snap("p", Stage.PENDING, deps=("d",)),
        snap("q", Stage.QUEUED, deps=("d",)),
        snap("r", Stage.RUNNING, deps=("d",)),
        snap("s", Stage.PAUSED, deps=("d",)),
    ]
    assert pairs(tasks) == [
        ("p", "dead_dep"),
        ("q", "dead_dep"), ("q", "queued_blocked"),
        ("r", "blocked_claim"), ("r", "dead_dep"),
        ("s", "blocked_claim"), ("s", "dead_dep"),
    ]  # fmt: skip


@pytest.mark.parametrize("dead", [Stage.CANCELLED, Stage.FAILED])
def test_a_cancelled_task_waits_for_nothing(dead):
    assert pairs([snap("a", Stage.CANCELLED, deps=("b",)), snap("b", dead)]) == []


@pytest.mark.parametrize("stage", [Stage.FAILED, Stage.COMPLETED])
@pytest.mark.parametrize("dead", [Stage.CANCELLED, Stage.FAILED])
def test_a_task_that_ran_before_its_dependency_completed_is_blocked_claim_not_dead_dep(stage, dead):
    # FAILED and COMPLETED are reached only through a claim, and a claim needs every dependency
    # COMPLETED (which it never leaves): an unfinished one means the task ran too early.
    assert pairs([snap("a", stage, deps=("b",)), snap("b", dead)]) == [("a", "blocked_claim")]


def test_pending_waiting_for_unfinished_live_dependencies_is_fine():
    tasks = [snap("a", Stage.PENDING, deps=("b", "c", "d", "e")),
             snap("b", Stage.PENDING), snap("c", Stage.QUEUED), snap("d", Stage.RUNNING), snap("e", Stage.PAUSED)]
    assert pairs(tasks) == []


def test_one_problem_per_task_and_code_even_with_several_causes():
    tasks = [snap("a", Stage.PENDING, deps=("ghost-1", "ghost-2", "x", "y")),
             snap("x", Stage.CANCELLED), snap("y", Stage.FAILED)]
    assert pairs(tasks) == [("a", "dead_dep"), ("a", "unknown_dep")]


def test_duplicate_id_is_reported_once_however_many_copies():
    assert pairs([snap("a"), snap("a"), snap("a"), snap("b")]) == [("a", "duplicate_id")]


def test_empty_ids_are_empty_and_duplicate():
    assert pairs([snap(""), snap("")]) == [("", "duplicate_id"), ("", "empty_id")]


@pytest.mark.parametrize("stage", ["", "queued", "Running", "DONE", "RUNNING "])
def test_unknown_stages(stage):
    assert pairs([snap("a", stage=stage)]) == [("a", "unknown_state")]


def test_unknown_stage_still_has_its_dependencies_checked_but_nothing_stage_specific():
    task = snap("a", stage="LIMBO", deps=("a", "ghost"), owner="x", has_token=True, attempts=99)
    assert pairs([task]) == [("a", "self_dep"), ("a", "unknown_dep"), ("a", "unknown_state")]


def test_every_stage_value_is_known():
    assert pairs([snap(f"t-{stage}", stage) for stage in Stage]) == []


# ---------------------------------------------------------------------------------------------
# Cycles


def test_cycle_of_three_reports_every_member_and_not_a_task_depending_on_it():
    tasks = [
        snap("a", Stage.PENDING, deps=("b",)),
        snap("b", Stage.PENDING, deps=("c",)),
        snap("c", Stage.PENDING, deps=("a",)),
        snap("outside", Stage.PENDING, deps=("a",)),  # merely depends on the cycle
        snap("fed", Stage.PENDING),
        snap("feeder", Stage.PENDING, deps=("fed",)),
    ]
    assert pairs(tasks) == [("a", "dep_cycle"), ("b", "dep_cycle"), ("c", "dep_cycle")]


def test_a_cycle_member_with_an_exit_is_still_on_the_cycle():
    tasks = [
        snap("a", Stage.PENDING, deps=("b", "z")),
        snap("b", Stage.PENDING, deps=("a",)),
        snap("z", Stage.PENDING),
    ]
    assert pairs(tasks) == [("a", "dep_cycle"), ("b", "dep_cycle")]


def test_two_separate_cycles_and_a_shared_strongly_connected_component():
    tasks = [
        snap("a", Stage.PENDING, deps=("b",)), snap("b", Stage.PENDING, deps=("a",)),
        snap("c", Stage.PENDING, deps=("d",)), snap("d", Stage.PENDING, deps=("e", "c")),
        snap("e", Stage.PENDING, deps=("c",)),
        snap("f", Stage.PENDING, deps=("a", "c")),
    ]  # fmt: skip
    assert pairs(tasks) == [(x, "dep_cycle") for x in "abcde"]


def test_diamond_is_not_a_cycle():
    tasks = [
        snap("top", Stage.PENDING, deps=("left", "right")),
        snap("left", Stage.PENDING, deps=("bottom",)),
        snap("right", Stage.PENDING, deps=("bottom",)),
        snap("bottom", Stage.QUEUED),
    ]
    assert pairs(tasks) == []


def test_self_dependency_inside_a_cycle_is_both():
    tasks = [snap("a", Stage.PENDING, deps=("a", "b")), snap("b", Stage.PENDING, deps=("a",))]
    assert pairs(tasks) == [("a", "dep_cycle"), ("a", "self_dep"), ("b", "dep_cycle")]


def test_a_cycle_through_an_unknown_dependency_is_not_a_cycle():
    tasks = [snap("a", Stage.PENDING, deps=("ghost",))]
    assert pairs(tasks) == [("a", "unknown_dep")]


CHAIN = 5000


def test_a_deep_chain_does_not_hit_the_recursion_limit():
    # t0 -> t1 -> ... -> t4999, listed so that the search starts at the deep end.
    tasks = [snap(f"t{i:05d}", Stage.PENDING, deps=(f"t{i + 1:05d}",)) for i in range(CHAIN - 1)]
    tasks.append(snap(f"t{CHAIN - 1:05d}", Stage.QUEUED))
    assert pairs(tasks) == []
    assert pairs(list(reversed(tasks))) == []


def test_a_deep_cycle_reports_every_member():
    tasks = [snap(f"t{i:05d}", Stage.PENDING, deps=(f"t{(i + 1) % CHAIN:05d}",)) for i in range(CHAIN)]
    assert pairs(tasks) == [(f"t{i:05d}", "dep_cycle") for i in range(CHAIN)]
    tasks.append(snap("outside", Stage.PENDING, deps=("t02500",)))
    assert len(pairs(tasks)) == CHAIN


# ---------------------------------------------------------------------------------------------
# The whole result


def test_empty_snapshot():
    assert check([], NOW) == []


def test_accepts_any_iterable():
    assert pairs(iter([snap("a", Stage.COMPLETED, has_result=False)])) == [("a", "completed_without_result")]


def well_formed_board() -> list[TaskSnapshot]:
    return [
        snap("done", Stage.COMPLETED),
        snap("done-2", Stage.COMPLETED, deps=("done",)),
        snap("cancelled", Stage.CANCELLED),
        snap("failed", Stage.FAILED, attempts=4, max_retries=3, deps=("done",)),
        snap("running", Stage.RUNNING, deps=("done", "done-2"), max_retries=2),
        snap("paused", Stage.PAUSED, deps=("done",)),
        snap("queued", Stage.QUEUED, deps=("done-2",)),
        snap("queued-retry", Stage.QUEUED, attempts=2, max_retries=3),
        snap("pending", Stage.PENDING, deps=("running", "queued", "paused")),
        snap("pending-held", Stage.PENDING),
        snap("cancelled-waiting", Stage.CANCELLED, deps=("pending",)),
    ]


def test_well_formed_board_of_every_stage_is_fine():
    board = well_formed_board()
    assert {t.stage for t in board} == {str(s) for s in Stage}
    assert check(board, NOW) == []


def broken_board() -> list[TaskSnapshot]:
    board = well_formed_board()
    return board + [
        snap("", Stage.QUEUED),
        snap("dup", Stage.QUEUED), snap("dup", Stage.QUEUED),
        snap("weird", stage="ZOMBIE"),
        snap("orphan", Stage.PENDING, deps=("ghost",)),
        snap("narcissus", Stage.PENDING, deps=("narcissus",)),
        snap("c1", Stage.PENDING, deps=("c2",)), snap("c2", Stage.PENDING, deps=("c1",)),
        snap("no-lease", Stage.RUNNING, has_token=False),
        snap("squatter", Stage.QUEUED, owner="agent-9"),
        snap("jumped", Stage.RUNNING, deps=("pending",)),
        snap("zombie-lease", Stage.CANCELLED, has_token=True),
        snap("expired", Stage.RUNNING, lease_expires_at=NOW),
        snap("early", Stage.QUEUED, deps=("queued",)),
        snap("amnesiac", Stage.PAUSED, has_checkpoint=False),
        snap("empty-handed", Stage.COMPLETED, has_result=False),
        snap("orphaned", Stage.PENDING, deps=("cancelled",)),
        snap("greedy", Stage.FAILED, attempts=3, max_retries=1),
        snap("jumper", Stage.PENDING, claim_rank=0.0, earliest_rank=1e9),
    ]  # fmt: skip


BROKEN_EXPECTED = [
    ("", "empty_id"),
    ("amnesiac", "paused_without_checkpoint"),
    ("c1", "dep_cycle"),
    ("c2", "dep_cycle"),
    ("dup", "duplicate_id"),
    ("early", "queued_blocked"),
    ("empty-handed", "completed_without_result"),
    ("expired", "lease_expired"),
    ("greedy", "attempts_exceeded"),
    ("jumped", "blocked_claim"),
    ("jumper", "rank_before_creation"),
    ("narcissus", "self_dep"),
    ("no-lease", "claimed_without_lease"),
    ("orphan", "unknown_dep"),
    ("orphaned", "dead_dep"),
    ("squatter", "lease_without_claim"),
    ("weird", "unknown_state"),
    ("zombie-lease", "terminal_claimed"),
]


def test_a_board_with_every_problem():
    result = pairs(broken_board())
    assert result == BROKEN_EXPECTED
    assert {code for _, code in result} == set(ALL_CODES)


@pytest.mark.parametrize("seed", range(10))
def test_results_are_sorted_and_independent_of_input_order(seed):
    board = broken_board()
    shuffled = board[:]
    random.Random(seed).shuffle(shuffled)
    assert shuffled != board
    result = check(shuffled, NOW)
    assert [(p.task, p.code) for p in result] == BROKEN_EXPECTED
    assert result == sorted(result, key=lambda p: (p.task, p.code))
    # No duplicated id in this board gives two different texts for one (task, code), so the
    # printed lines are identical too.
    assert [p.text for p in result] == [p.text for p in check(board, NOW)]
    assert [str(p) for p in result] == [str(p) for p in check(shuffled, NOW)]


def test_check_does_not_read_the_clock_or_mutate_its_input():
    board = broken_board()
    copy = [dataclasses.replace(t) for t in board]
    far_future = NOW + timedelta(days=3650)
    assert ("running", "lease_expired") in pairs(board, far_future)
    assert ("running", "lease_expired") not in pairs(board, NOW)
    assert board == copy


# ---------------------------------------------------------------------------------------------
# dead_dep down the chain: a task that waits for a stranded task is stranded too


@pytest.mark.parametrize("dead", [Stage.CANCELLED, Stage.FAILED])
def test_tasks_further_down_the_chain_of_a_dead_end_are_dead_dep(dead):
    tasks = [
        snap("root", dead),
        snap("child", Stage.PENDING, deps=("root",)),
        snap("grandchild", Stage.PENDING, deps=("child",)),
        snap("great", Stage.PENDING, deps=("grandchild", "fine")),
        snap("fine", Stage.PENDING),  # waits for nothing dead: not stranded
        snap("beside", Stage.PENDING, deps=("fine",)),
    ]
    assert pairs(tasks) == [("child", "dead_dep"), ("grandchild", "dead_dep"), ("great", "dead_dep")]
    texts = {p.task: p.text for p in check(tasks, NOW)}
    assert texts["child"] == f"task child waits for root, which is {dead}"
    assert texts["grandchild"] == f"task grandchild waits for child, which cannot run: root is {dead}"
    assert texts["great"] == f"task great waits for grandchild, which cannot run: root is {dead}"


def test_the_chain_stops_at_a_task_that_waits_for_nothing_dead_and_at_finished_tasks():
    tasks = [
        snap("root", Stage.CANCELLED),
        snap("dropped", Stage.CANCELLED, deps=("root",)),  # cancelled: waits for nothing
        snap("after-dropped", Stage.PENDING, deps=("dropped",)),  # its own dead end, directly
        snap("ran-early", Stage.FAILED, deps=("root",)),  # blocked_claim, and a dead end itself
        snap("after-failed", Stage.PENDING, deps=("ran-early",)),
    ]
    assert pairs(tasks) == [("after-dropped", "dead_dep"), ("after-failed", "dead_dep"), ("ran-early", "blocked_claim")]
    texts = {p.task: p.text for p in check(tasks, NOW)}
    assert texts["after-dropped"] == "task after-dropped waits for dropped, which is CANCELLED"


def test_a_stranded_cycle_and_two_roots_word_the_smallest_root():
    tasks = [
        snap("r1", Stage.CANCELLED), snap("r2", Stage.FAILED),
        snap("a", Stage.PENDING, deps=("r2", "b")), snap("b", Stage.PENDING, deps=("r1", "a")),
        snap("c", Stage.PENDING, deps=("a",)),
    ]
    assert pairs(tasks) == [("a", "dead_dep"), ("a", "dep_cycle"), ("b", "dead_dep"), ("b", "dep_cycle"),
                            ("c", "dead_dep")]
    texts = {p.task: p.text for p in check(tasks, NOW)}
    assert texts["c"] == "task c waits for a, which cannot run: r1 is CANCELLED"
    shuffled = tasks[::-1]
    assert [p.text for p in check(shuffled, NOW)] == [p.text for p in check(tasks, NOW)]


STORES = [pytest.param("default", marks=[pytest.mark.django_db(transaction=True, databases=["default"])], id="sqlite")]


def _stores():
    from tests.support import postgres_db_mark
    return [*STORES, pytest.param("postgres", marks=postgres_db_mark(), id="postgres")]


@pytest.mark.parametrize("alias", _stores())
def test_the_store_finds_dependents_down_the_chain_as_check_of_the_full_snapshot_does(alias):
    """selectors.problems() (indexed SQL picks the suspects, check() judges them) finds the
    whole stranded chain, exactly as check() over every task does (the MongoDB path)."""
    from board.engine import selectors, transitions
    from board.engine.transitions import TaskSpec

    transitions.create([TaskSpec(id="root", title="root"), TaskSpec(id="child", title="c", deps=["root"]),
                        TaskSpec(id="grandchild", title="g", deps=["child"]),
                        TaskSpec(id="great", title="gg", deps=["grandchild"]),
                        TaskSpec(id="other", title="o"), TaskSpec(id="other-child", title="oc", deps=["other"])],
                       using=alias)
    transitions.cancel("root", actor="op", reason="not needed", using=alias)
    now = NOW + timedelta(days=36500)  # no lease is live: none is taken
    found = selectors.problems(now=now, using=alias)
    assert found == check(selectors.snapshot(using=alias), now)
    assert [(p.task, p.code) for p in found] == [("child", "dead_dep"), ("grandchild", "dead_dep"), ("great", "dead_dep")]
