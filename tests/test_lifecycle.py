"""Pure unit tests of `board.engine.lifecycle`: the transition table against DESIGN.md section 1, task
ids, retry backoff and the attempts budget. No Django, no database."""
from __future__ import annotations

import itertools

import pytest

from board.engine import inputs, lifecycle
from board.engine.inputs import is_valid_task_id
from board.engine.lifecycle import (
    DEAD_ENDS,
    LEASED,
    TERMINAL,
    TRANSITIONS,
    Stage,
    Verb,
    attempts_left,
    retry_backoff_seconds,
    target,
)

P, Q, R, Z, C, F, X = (Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED, Stage.COMPLETED,
                       Stage.FAILED, Stage.CANCELLED)  # fmt: skip


def allowed_verbs(stage: Stage | str) -> list[Verb]:
    """The verbs the table allows from `stage` (a view for these tests; the engine asks `target`)."""
    return [verb for (s, verb) in TRANSITIONS if s == stage]

# DESIGN.md section 1, column "leaves to", copied by hand (not derived from the code).
DESIGN_LEAVES_TO: set[tuple[Stage, Stage]] = {
    (P, Q), (P, X),
    (Q, R), (Q, X),
    (Q, F),  # issue 29, item 7: a queue timeout (DESIGN.md's table predates it)
    (R, C), (R, F), (R, Z), (R, Q), (R, X),
    (Z, R), (Z, Q), (Z, X),
    (Z, F),  # issue 32, item 2: an approval unanswered in time, whose on_timeout says fail
    (F, Q), (F, X),
}  # fmt: skip

# The same lifecycle verb by verb, written from DESIGN.md and the verbs' docstrings: what each
# verb does from each stage. Every (stage, verb) pair not listed here must be illegal.
EXPECTED_MOVES: dict[tuple[Stage, Verb], Stage] = {
    (P, Verb.ADMIT): Q,
    (P, Verb.CANCEL): X,
    (Q, Verb.CLAIM): R,
    (Q, Verb.CANCEL): X,
    (Q, Verb.EXPIRE): F,  # the reaper: not started within its queue timeout
    (R, Verb.RENEW): R,  # extends the lease: stays RUNNING
    (R, Verb.COMPLETE): C,
    (R, Verb.FAIL): F,
    (R, Verb.PAUSE): Z,
    (R, Verb.RELEASE): Q,
    (R, Verb.FORCE_RELEASE): Q,
    (R, Verb.RECLAIM): Q,  # lost lease
    (R, Verb.CANCEL): X,  # operator
    (Z, Verb.RESUME): R,
    (Z, Verb.REQUEUE): Q,
    (R, Verb.ASK): Z,  # the holder asks a person and gives its lease up (an approval gate)
    (Z, Verb.ANSWER): Q,  # the person's answer (or an approving timeout)
    (Z, Verb.EXPIRE): F,  # the approval's timeout, when its on_timeout says fail
    (Z, Verb.CANCEL): X,
    (F, Verb.RETRY): Q,  # attempts remain, after backoff
    (F, Verb.REQUEUE): Q,  # operator
    (F, Verb.CANCEL): X,
    (R, Verb.FORCE_PAUSE): Z,  # operator, keeping the last checkpoint
    # an operator's edit keeps the stage; finished tasks are not edited
    (P, Verb.EDIT): P,
    (Q, Verb.EDIT): Q,
    (R, Verb.EDIT): R,
    (Z, Verb.EDIT): Z,
    (F, Verb.EDIT): F,
}


def test_stages_are_the_seven_of_the_design():
    assert [s.value for s in Stage] == ["PENDING", "QUEUED", "RUNNING", "PAUSED", "COMPLETED", "FAILED", "CANCELLED"]


def test_stage_changes_match_the_design_table_exactly():
    derived = {(frm, to) for (frm, _verb), to in TRANSITIONS.items() if frm != to}
    assert derived == DESIGN_LEAVES_TO


def test_the_only_moves_that_stay_put_are_renew_and_edit():
    # DESIGN.md's "leaves to" lists stage changes only; renewing a lease keeps the task RUNNING
    # and an operator's edit keeps any unfinished stage.
    assert {key for key, to in TRANSITIONS.items() if key[0] == to} == {(R, Verb.RENEW)} | {
        (s, Verb.EDIT) for s in (P, Q, R, Z, F)
    }


def test_transition_table_matches_the_expected_moves():
    assert TRANSITIONS == EXPECTED_MOVES


def test_table_uses_only_stages_and_verbs():
    for (frm, verb), to in TRANSITIONS.items():
        assert type(frm) is Stage and type(verb) is Verb and type(to) is Stage


def test_create_is_not_a_move_between_stages():
    assert all(verb != Verb.CREATE for _, verb in TRANSITIONS)


@pytest.mark.parametrize(
    "stage, verb", list(itertools.product(Stage, Verb)), ids=lambda v: str(v)
)
def test_target_of_every_stage_and_verb(stage, verb):
    expected = EXPECTED_MOVES.get((stage, verb))
    assert target(stage, verb) == expected
    assert target(stage.value, verb) == expected  # a stage read from the database is a str
    assert (verb in allowed_verbs(stage)) is (expected is not None)


@pytest.mark.parametrize("stage", [C, X])
def test_terminal_stages_have_no_outgoing_verb(stage):
    assert allowed_verbs(stage) == []
    assert allowed_verbs(stage.value) == []
    assert all(target(stage, verb) is None for verb in Verb)
    assert stage in TERMINAL


def test_terminal_is_exactly_the_stages_nothing_leaves():
    assert TERMINAL == {s for s in Stage if not allowed_verbs(s)} == {C, X}


def test_failed_is_a_dead_end_but_not_terminal():
    assert F not in TERMINAL
    assert DEAD_ENDS == {X, F}
    assert set(allowed_verbs(F)) == {Verb.RETRY, Verb.REQUEUE, Verb.CANCEL, Verb.EDIT}


def test_only_running_is_leased():
    assert LEASED == {R}


def test_every_stage_is_reachable_from_pending_and_every_live_stage_can_end():
    reachable, frontier = {P}, [P]
    while frontier:
        stage = frontier.pop()
        for verb in allowed_verbs(stage):
            to = target(stage, verb)
            if to not in reachable:
                reachable.add(to)
                frontier.append(to)
    assert reachable == set(Stage)
    # every stage can reach a terminal stage
    for stage in Stage:
        assert stage in TERMINAL or target(stage, Verb.CANCEL) == X


@pytest.mark.parametrize("stage", ["", "queued", "Pending", "DONE", "RUNNING ", None, 3])
@pytest.mark.parametrize("verb", list(Verb))
def test_unknown_stage_allows_nothing(stage, verb):
    assert target(stage, verb) is None


@pytest.mark.parametrize("stage", ["", "queued", "DONE"])
def test_unknown_stage_has_no_allowed_verbs(stage):
    assert allowed_verbs(stage) == []


@pytest.mark.parametrize("stage", list(Stage))
def test_allowed_verbs_lists_each_verb_once(stage):
    verbs = allowed_verbs(stage)
    assert len(verbs) == len(set(verbs))
    assert set(verbs) == {v for (s, v) in EXPECTED_MOVES if s == stage}


# ---------------------------------------------------------------------------------------------
# Task ids: ^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$


@pytest.mark.parametrize("task_id", [
    "a", "Z", "0", "9",
    "task-1", "Task_1", "a.b.c", "ns:task:42", "0-starts-with-digit", "a-", "a.", "a:", "a_",
    "a" * 100,
    "1" + "._:-" * 24 + "xyz",  # exactly 100
    "550e8400-e29b-41d4-a716-446655440000",
])  # fmt: skip
def test_valid_task_ids(task_id):
    assert len(task_id) <= 100
    assert is_valid_task_id(task_id) is True


@pytest.mark.parametrize("task_id", [
    "",
    "a" * 101,
    "b" * 1000,
    "-a", ".a", ":a", "_a",
    "-", ".", "..",
    "a b", " a", "a ", "a/b", "a\\b", "a#b", "a?b", "a@b", "a,b", "a+b", "a*b", "a'b", 'a"b',
    "a\n", "a\nb", "\na", "a\t", "a\r", "a\x00",
    "é", "café", "Ärger", "задача", "任务", "٣", "ｆｕｌｌ", "\u212a",  # KELVIN SIGN: not an ASCII K
])  # fmt: skip
def test_invalid_task_ids(task_id):
    assert is_valid_task_id(task_id) is False


@pytest.mark.parametrize("value", [None, 1, 1.0, True, b"abc", bytearray(b"abc"), ["a"], ("a",), {"a": 1}, object()])
def test_non_string_task_ids_are_refused(value):
    assert is_valid_task_id(value) is False


def test_task_id_length_boundary():
    assert is_valid_task_id("x" * 99)
    assert is_valid_task_id("x" * 100)
    assert not is_valid_task_id("x" * 101)


def test_task_id_regex_is_the_documented_one():
    assert inputs.TASK_ID_RE.pattern == r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$"


# ---------------------------------------------------------------------------------------------
# Retry backoff: base, 2*base, 4*base, ... capped


@pytest.mark.parametrize("attempt, expected", [
    (1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 32.0), (6, 60.0), (7, 60.0), (50, 60.0),
])  # fmt: skip
def test_backoff_doubles_then_caps(attempt, expected):
    assert retry_backoff_seconds(attempt, 2.0, 60.0) == expected


def test_backoff_doubles_each_attempt_until_the_cap():
    delays = [retry_backoff_seconds(n, 0.5, 1000.0) for n in range(1, 20)]
    for before, after in zip(delays, delays[1:]):
        assert after == min(1000.0, before * 2)
    assert delays[-1] == 1000.0
    assert max(delays) == 1000.0


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_backoff_before_any_failure_is_the_base(attempt):
    assert retry_backoff_seconds(attempt, 3.0, 60.0) == 3.0


def test_backoff_base_above_cap_is_capped():
    assert retry_backoff_seconds(1, 90.0, 60.0) == 60.0


def test_backoff_at_the_exact_cap():
    assert retry_backoff_seconds(4, 1.0, 8.0) == 8.0
    assert retry_backoff_seconds(5, 1.0, 8.0) == 8.0


def test_backoff_with_integer_settings_and_huge_attempts():
    assert retry_backoff_seconds(10_000, 1, 300) == 300


def test_backoff_is_capped_for_the_largest_reachable_attempt():
    # attempts never exceed max_retries + 1 and max_retries is at most 100
    assert retry_backoff_seconds(101, 0.5, 300.0) == 300.0


def test_backoff_with_float_base_and_huge_attempts_is_capped():
    assert retry_backoff_seconds(2000, 1.0, 60.0) == 60.0


# ---------------------------------------------------------------------------------------------
# Attempts: a task may run 1 + max_retries times


@pytest.mark.parametrize("max_retries", [0, 1, 3, 100])
def test_attempts_left_boundary(max_retries):
    assert attempts_left(0, max_retries) is True
    assert attempts_left(max_retries, max_retries) is True
    assert attempts_left(max_retries + 1, max_retries) is False
    assert attempts_left(max_retries + 2, max_retries) is False


def test_no_retries_means_exactly_one_run():
    assert [attempts_left(n, 0) for n in range(3)] == [True, False, False]
