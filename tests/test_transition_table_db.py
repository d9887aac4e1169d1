"""Every illegal move of the lifecycle, tried for real against the database.

For every stage, a real task is put there through the engine's own verbs; then every verb
function of `board.engine.transitions` that `lifecycle.TRANSITIONS` does not allow from that stage is
called, and must raise its precise typed error and leave the whole database unchanged.

Which error (from the verbs' docstrings and `board.engine.errors`):
- holder verbs (renew, release, complete, fail, pause) check the token against the task's current
  lease first: on any task that is not RUNNING there is no current lease, so LeaseLost, even
  for the holder's own stale token and even on a terminal task;
- any other verb on COMPLETED or CANCELLED: Terminal;
- claim or resume of a RUNNING task with a live lease: Taken;
- claim of a PENDING task that is held or waits for a dependency: Blocked;
- anything else the stage does not allow: InvalidTransition.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from board.engine import errors, transitions
from board.engine.lifecycle import TERMINAL, TRANSITIONS, Stage, Verb, target
from board.engine.transitions import TaskSpec
from tests.support import db_state, row, sqlite_db_mark

pytestmark = sqlite_db_mark()

TASK = "t"
TTL = 300
NEVER_ISSUED = "a-token-the-store-never-minted"


# ---------------------------------------------------------------------------------------------
# Putting a task in each stage, through the engine's verbs only


@dataclass(frozen=True)
class Placed:
    stage: Stage
    token: str  # the live lease for RUNNING; the holder's stale token, or one never issued


def _create(**spec) -> None:
    transitions.create(TaskSpec(id=TASK, title="the task", **spec), actor="test")


def _claimed() -> str:
    _create(max_retries=2)
    return transitions.claim(TASK, "agent-a", TTL).lease.token


def pending_held() -> Placed:
    _create(on_hold=True)
    return Placed(Stage.PENDING, NEVER_ISSUED)


def pending_waiting() -> Placed:
    transitions.create(TaskSpec(id="dep", title="dependency", queue="deps"), actor="test")
    _create(deps=("dep",))
    return Placed(Stage.PENDING, NEVER_ISSUED)


def queued() -> Placed:
    _create()
    return Placed(Stage.QUEUED, NEVER_ISSUED)


def queued_after_release() -> Placed:
    token = _claimed()
    transitions.release(TASK, token)
    return Placed(Stage.QUEUED, token)


def running() -> Placed:
    return Placed(Stage.RUNNING, _claimed())


def paused() -> Placed:
    token = _claimed()
    transitions.pause(TASK, token, {"step": 3})
    return Placed(Stage.PAUSED, token)


def completed() -> Placed:
    token = _claimed()
    transitions.complete(TASK, token, {"answer": 42})
    return Placed(Stage.COMPLETED, token)


def failed() -> Placed:
    token = _claimed()
    transitions.fail(TASK, token, "boom", retryable=False)
    return Placed(Stage.FAILED, token)


def cancelled() -> Placed:
    _create()
    transitions.cancel(TASK, actor="operator")
    return Placed(Stage.CANCELLED, NEVER_ISSUED)


def cancelled_while_running() -> Placed:
    token = _claimed()
    transitions.cancel(TASK, actor="operator")
    return Placed(Stage.CANCELLED, token)


SETUPS = {
    "PENDING-held": pending_held,
    "PENDING-waiting": pending_waiting,
    "QUEUED": queued,
    "QUEUED-released": queued_after_release,
    "RUNNING": running,
    "PAUSED": paused,
    "COMPLETED": completed,
    "FAILED": failed,
    "CANCELLED": cancelled,
    "CANCELLED-while-running": cancelled_while_running,
}
SETUP_STAGE = {
    "PENDING-held": Stage.PENDING, "PENDING-waiting": Stage.PENDING,
    "QUEUED": Stage.QUEUED, "QUEUED-released": Stage.QUEUED,
    "RUNNING": Stage.RUNNING, "PAUSED": Stage.PAUSED, "COMPLETED": Stage.COMPLETED,
    "FAILED": Stage.FAILED, "CANCELLED": Stage.CANCELLED, "CANCELLED-while-running": Stage.CANCELLED,
}  # fmt: skip


def test_every_stage_has_a_setup():
    assert set(SETUP_STAGE.values()) == set(Stage)
    assert set(SETUP_STAGE) == set(SETUPS)


def place(name: str) -> Placed:
    placed = SETUPS[name]()
    assert placed.stage == SETUP_STAGE[name]
    assert row(TASK)["stage"] == placed.stage, f"setup {name} did not reach {placed.stage}"
    if placed.stage == Stage.RUNNING:
        assert row(TASK)["lease_expires_at"] > timezone.now() + timedelta(seconds=TTL / 2)
    return placed


@pytest.mark.parametrize("name", list(SETUPS))
def test_setups_reach_their_stage_with_the_expected_lease(name):
    placed = place(name)
    task = row(TASK)
    if placed.stage == Stage.RUNNING:
        assert task["owner"] == "agent-a" and task["lease_token_hash"] == transitions.hash_token(placed.token)
    else:
        assert (task["owner"], task["lease_token_hash"], task["lease_expires_at"]) == ("", None, None)


# ---------------------------------------------------------------------------------------------
# The verb functions, called with valid arguments


def _call(verb: Verb, token: str):
    t = transitions
    calls = {
        Verb.ADMIT: lambda: t.admit(TASK, actor="operator"),
        Verb.CLAIM: lambda: t.claim(TASK, "agent-b", TTL),
        Verb.RESUME: lambda: t.resume(TASK, "agent-b", TTL),
        Verb.RENEW: lambda: t.renew(TASK, token, TTL, checkpoint={"step": 9}, progress=0.5),
        Verb.RELEASE: lambda: t.release(TASK, token),
        Verb.COMPLETE: lambda: t.complete(TASK, token, {"answer": 0}),
        Verb.FAIL: lambda: t.fail(TASK, token, "late failure", retryable=False),
        Verb.PAUSE: lambda: t.pause(TASK, token, {"step": 9}),
        Verb.REQUEUE: lambda: t.requeue(TASK, actor="operator", reset_attempts=True),
        Verb.CANCEL: lambda: t.cancel(TASK, actor="operator"),
        Verb.FORCE_RELEASE: lambda: t.force_release(TASK, actor="operator"),
        Verb.FORCE_PAUSE: lambda: t.force_pause(TASK, actor="operator"),
        Verb.EDIT: lambda: t.edit(TASK, actor="operator", version=row(TASK)["version"], title="edited"),
        Verb.ASK: lambda: t.request_approval(TASK, token, "may I?"),
        Verb.ANSWER: lambda: t.answer(TASK, True, actor="operator"),
    }
    return calls[verb]()


TASK_VERBS = [Verb.ADMIT, Verb.CLAIM, Verb.RESUME, Verb.RENEW, Verb.RELEASE, Verb.COMPLETE, Verb.FAIL,
              Verb.PAUSE, Verb.REQUEUE, Verb.CANCEL, Verb.FORCE_RELEASE, Verb.FORCE_PAUSE,
              Verb.EDIT, Verb.ASK, Verb.ANSWER]  # fmt: skip
HOLDER_VERBS = {Verb.RENEW, Verb.RELEASE, Verb.COMPLETE, Verb.FAIL, Verb.PAUSE, Verb.ASK}
OPERATOR_VERBS = {Verb.ADMIT, Verb.REQUEUE, Verb.CANCEL, Verb.FORCE_RELEASE, Verb.FORCE_PAUSE, Verb.EDIT}
# Verbs with no per-task function that raises: CREATE (tested below: DuplicateId), RETRY (only
# ever taken inside fail(), in the same transaction), RECLAIM (the reaper's sweep, below) and
# EXPIRE (the reaper's deadline pass: tests/test_deadlines.py).
NOT_PER_TASK = {Verb.CREATE, Verb.RETRY, Verb.RECLAIM, Verb.EXPIRE}


def test_every_verb_is_covered():
    assert set(TASK_VERBS) | NOT_PER_TASK == set(Verb)
    assert not set(TASK_VERBS) & NOT_PER_TASK


def expected_error(stage: Stage, verb: Verb) -> type[errors.BoardError]:
    if verb in HOLDER_VERBS:
        return errors.LeaseLost
    if stage in TERMINAL:
        return errors.Terminal
    if stage == Stage.RUNNING and verb in (Verb.CLAIM, Verb.RESUME):
        return errors.Taken
    if stage == Stage.PENDING and verb == Verb.CLAIM:
        return errors.Blocked
    return errors.InvalidTransition


ILLEGAL = [
    pytest.param(name, verb, id=f"{name}-{verb.value}")
    for name, stage in SETUP_STAGE.items()
    for verb in TASK_VERBS
    if target(stage, verb) is None
]


def test_the_illegal_cases_are_exactly_the_pairs_missing_from_the_table():
    stages_tried = {(SETUP_STAGE[p.values[0]], p.values[1]) for p in ILLEGAL}
    expected = {(s, v) for s in Stage for v in TASK_VERBS if (s, v) not in TRANSITIONS}
    assert stages_tried == expected


def _assert_refused(name: str, verb: Verb, call) -> errors.BoardError:
    placed = place(name)
    before = db_state()
    error = expected_error(placed.stage, verb)
    with pytest.raises(errors.BoardError) as caught:
        call(placed)
    exc = caught.value
    assert type(exc) is error, f"{verb} from {name} raised {type(exc).__name__}: {exc}, expected {error.__name__}"
    assert exc.code == error.code
    assert exc.message
    assert exc.task is not None and exc.task.pk == TASK
    assert exc.task is not None and exc.task.stage == placed.stage  # the row as it is now
    assert db_state() == before
    return exc


@pytest.mark.parametrize("name, verb", ILLEGAL)
def test_illegal_verb_raises_its_precise_error_and_changes_nothing(name, verb):
    _assert_refused(name, verb, lambda placed: _call(verb, placed.token))


OPERATOR_ILLEGAL = [p for p in ILLEGAL if p.values[1] in OPERATOR_VERBS]


@pytest.mark.parametrize("name, verb", OPERATOR_ILLEGAL)
def test_illegal_operator_verb_at_the_current_version_raises_the_same_error(name, verb):
    def call(placed):
        version = row(TASK)["version"]
        kwargs = {"actor": "operator", "version": version}
        fn = {Verb.ADMIT: transitions.admit, Verb.REQUEUE: transitions.requeue,
              Verb.CANCEL: transitions.cancel, Verb.FORCE_RELEASE: transitions.force_release,
              Verb.FORCE_PAUSE: transitions.force_pause,
              Verb.EDIT: lambda task_id, **kw: transitions.edit(task_id, title="edited", **kw)}[verb]
        return fn(TASK, **kwargs)

    _assert_refused(name, verb, call)


HOLDER_ON_UNLEASED = [
    pytest.param(name, verb, id=f"{name}-{verb.value}")
    for name, stage in SETUP_STAGE.items()
    if stage != Stage.RUNNING
    for verb in sorted(HOLDER_VERBS)
]


def test_holder_verbs_are_illegal_from_every_stage_but_running():
    assert {(SETUP_STAGE[p.values[0]], p.values[1]) for p in HOLDER_ON_UNLEASED} == {
        (s, v) for s in Stage for v in HOLDER_VERBS if target(s, v) is None
    }


@pytest.mark.parametrize("name, verb", HOLDER_ON_UNLEASED)
def test_holder_verb_on_a_task_without_a_lease_is_lease_lost_even_with_a_fresh_token(name, verb):
    # Not only the holder's stale token: no token at all matches a task that holds no lease.
    _assert_refused(name, verb, lambda placed: _call(verb, "some-other-token"))


@pytest.mark.parametrize("name", [n for n, s in SETUP_STAGE.items()])
def test_creating_a_task_with_an_existing_id_is_duplicate_id(name):
    placed = place(name)
    before = db_state()
    with pytest.raises(errors.DuplicateId) as caught:
        transitions.create(TaskSpec(id=TASK, title="again"), actor="test")
    assert caught.value.task.pk == TASK and caught.value.task.stage == placed.stage
    assert db_state() == before


@pytest.mark.parametrize("name", [n for n, s in SETUP_STAGE.items() if target(s, Verb.RECLAIM) is None])
def test_the_reaper_takes_nothing_from_a_task_that_holds_no_lease(name):
    place(name)
    before = db_state()
    far_future = timezone.now() + timedelta(days=365)
    assert transitions.reclaim_expired(now=far_future, task_ids=[TASK]) == []
    assert transitions.reclaim_expired(now=far_future) == []
    assert db_state() == before


@pytest.mark.parametrize("name", [n for n, s in SETUP_STAGE.items() if target(s, Verb.CLAIM) is None])
def test_claim_next_finds_nothing_when_the_only_task_cannot_be_claimed(name):
    place(name)
    before = db_state()
    assert transitions.claim_next("agent-b", TTL, queue="default") is None
    assert db_state() == before
