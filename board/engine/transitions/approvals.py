"""Approval gates' moves (issue 32, item 2; the rules are in board.engine.approvals):

- `request_approval`: the holder asks (RUNNING -> PAUSED by ASK, with its token): its lease ends
  in the same CAS (slots and resources given back, as a pause gives them), the task is marked
  awaiting_approval and an Approval row in state "waiting" is written in the same transaction.
- `answer`: a person (or an operator key) answers (PAUSED -> QUEUED by ANSWER). One CAS on the
  task, held to it still awaiting, and one guarded update of the Approval row (still "waiting"),
  in one transaction: of two people answering at once exactly one answer is written; the other
  gets AlreadyAnswered (409 `already_answered`). The task is kept APPROVAL_PREFER_SECONDS for the
  agent that asked (not_before; that agent's claim by id passes it), then any agent may claim it.
- `time_out_approvals`: the reaper applies a waiting approval's timeout: `fail` (EXPIRE, to
  FAILED), `approve` (ANSWER, approved by "system:timeout") or `cancel` (CANCEL).

The next claim of the task carries its last answered approval (`lease.approval`,
board.engine.handoffs).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from board.engine import approvals, clock, errors, outcomes, tracing
from board.engine.inputs import json_field
from board.engine.lifecycle import Verb
from board.engine.stores import retry_conflicts, store
from board.engine.transitions.cas import NO_LEASE, RACE_RETRIES, _get, _illegal, _swap
from board.engine.transitions.leases import _holder_move
from board.models import Approval, Task


@tracing.traced(Verb.ASK)
@outcomes.refusals(Verb.ASK)
@retry_conflicts
def request_approval(task_id: str, token: str, question: str, *, form: dict | None = None,
                     approvers: list[str] | None = None, timeout_seconds: int | None = None,
                     on_timeout: str = "fail", checkpoint: Any = None, agent: str | None = None,
                     using: str = "default") -> tuple[Task, Approval]:
    """The holder of `token` asks `question` and gives its lease up; the task waits PAUSED for
    the answer. `checkpoint`, when given, is saved as a pause saves it (else the last one stays).
    Refused as a pause is (LeaseLost, Forbidden); nothing is written on a refusal."""
    approvals.question_text(question)
    form = approvals.checked_form(form)
    approvers = approvals.checked_approvers(approvers)
    timeout_seconds, on_timeout = approvals.checked_timeout(timeout_seconds, on_timeout)
    if checkpoint is not None:
        json_field("checkpoint", checkpoint)
    asked: list[Approval] = []

    def build(task: Task, now: datetime, token_hash: str):
        asker = task.owner
        saved = {"checkpoint": checkpoint, "progress_changed_at": now} if checkpoint is not None else {}
        if not _swap(using, task, Verb.ASK, now=now, actor=asker, token_hash=token_hash,
                     detail={"question": question[:500], "approval": task.approvals_count + 1},
                     awaiting_approval=True, approvals_count=task.approvals_count + 1, **saved, **NO_LEASE):
            return None
        approval = Approval(task_id=task.pk, question=question, form=form, approvers=approvers, asked_by=asker,
                            asked_at=now, attempt=task.attempts, fence=task.fence, on_timeout=on_timeout,
                            due_at=now + timedelta(seconds=timeout_seconds) if timeout_seconds else None)
        Approval.objects.using(using).bulk_create([approval])
        asked.append(approval)
        return task

    task = _holder_move(using, task_id, token, build, live_only=False, agent=agent)
    return task, asked[-1]


def waiting_approval(task_id: str, *, using: str = "default") -> Approval | None:
    """The task's approval waiting for an answer, if any (NotFound for no task)."""
    if not Task.objects.using(using).filter(pk=task_id).exists():
        raise errors.NotFound(f"no task with id {task_id!r}")
    return Approval.objects.using(using).filter(task_id=task_id, state=Approval.WAITING).order_by("-id").first()


@tracing.traced(Verb.ANSWER)
@outcomes.refusals(Verb.ANSWER)
@retry_conflicts
def answer(task_id: str, approve: bool, *, actor: str, values: dict | None = None, comment: str = "",
           approval_id: int | None = None, may_answer=None, using: str = "default") -> tuple[Task, Approval]:
    """Answer the task's waiting approval (`approval_id`, when given, must be it): approved or
    not, with the form's `values`. `may_answer(approval) -> bool` is the caller's permission
    check, judged on the approval as read in this transaction (Forbidden when False).
    AlreadyAnswered when the approval (or the task's last one) was answered, timed out or
    cancelled first; nothing is written on any refusal."""
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            approval = _the_waiting_one(using, task, approval_id)
            if may_answer is not None and not may_answer(approval):
                raise errors.Forbidden(f"{actor} may not answer this approval: its approvers are "
                                       f"{', '.join(approval.approvers) or 'operators'}", task=task)
            approve, values, comment = approvals.checked_answer(approval.form, approve, values, comment)
            if _close(using, task, approval, now, actor=actor, approve=approve, values=values, comment=comment):
                return task, approval
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


def _the_waiting_one(using: str, task: Task, approval_id: int | None) -> Approval:
    """The approval an answer answers: the task's waiting one (the one named, when named), or the
    precise refusal: NotFound (no such approval of the task), AlreadyAnswered (it, or the task's
    last one, is closed), Terminal or InvalidTransition (the task never asked)."""
    if approval_id is not None:
        named = Approval.objects.using(using).filter(task_id=task.pk, pk=approval_id).first()
        if named is None:
            raise errors.NotFound(f"task {task.pk} has no approval {approval_id}", task=task)
        if named.state != Approval.WAITING:
            raise errors.AlreadyAnswered(_closed_words(named), task=task)
        return named
    if task.awaiting_approval:
        waiting = Approval.objects.using(using).filter(task_id=task.pk, state=Approval.WAITING).first()
        if waiting is not None:
            return waiting
    last = Approval.objects.using(using).filter(task_id=task.pk).order_by("-id").first() if task.approvals_count else None
    if last is not None:
        raise errors.AlreadyAnswered(_closed_words(last), task=task)
    raise _illegal(task, Verb.ANSWER, "it has no approval waiting for an answer")


def _closed_words(approval: Approval) -> str:
    if approval.state == Approval.CANCELLED:
        return f"approval {approval.id} was cancelled with its task"
    if approval.state == Approval.TIMED_OUT:
        return f"approval {approval.id} timed out"
    when = approval.answered_at.isoformat() if approval.answered_at else "?"
    return f"approval {approval.id} was already answered by {approval.answered_by} at {when} ({approval.state})"


def _close(using: str, task: Task, approval: Approval, now: datetime, *, actor: str, approve: bool,
           values: dict | None, comment: str) -> bool:
    """The answer's one transaction: the task's CAS (still awaiting this approval), then the
    approval's row (still waiting; under the task's CAS, it is)."""
    detail = {"approval": approval.id, "approved": approve, **({"comment": comment[:500]} if comment else {})}
    if not _swap(using, task, Verb.ANSWER, now=now, actor=actor, detail=detail, awaiting_approval=False,
                 not_before=approvals.prefer_until(now)):
        return False
    state = Approval.APPROVED if approve else Approval.REJECTED
    _settle(using, approval, state=state, approved=approve, values=values, comment=comment, answered_by=actor,
            answered_at=now)
    return True


def _settle(using: str, approval: Approval, **closed: Any) -> None:
    """Close the waiting approval row (in the transaction whose task CAS just won: it is waiting)."""
    if Approval.objects.using(using).filter(pk=approval.pk, state=Approval.WAITING).update(**closed) != 1:
        raise errors.VersionConflict(f"approval {approval.pk} changed under its task's CAS")
    for name, value in closed.items():
        setattr(approval, name, value)


def cancel_waiting(using: str, task: Task, now: datetime, actor: str) -> None:
    """Close the task's waiting approval as cancelled: its task was cancelled by the move this
    transaction just made (board.engine.transitions.operators.cancel)."""
    approval = Approval.objects.using(using).filter(task_id=task.pk, state=Approval.WAITING).first()
    if approval is not None:
        _settle(using, approval, state=Approval.CANCELLED, answered_by=actor, answered_at=now)


@retry_conflicts
def time_out_approvals(*, now: datetime | None = None, limit: int = 500, actor: str = approvals.TIMEOUT_ANSWERER,
                       using: str = "default") -> list[tuple[str, str]]:
    """Apply the timeout of every waiting approval due by `now` (default: the store's clock):
    its on_timeout, each in its own transaction. Returns (task id, the task's new stage)."""
    now = now or clock.now(using)
    moved = []
    due = list(Approval.objects.using(using).filter(state=Approval.WAITING, due_at__lte=now)
               .order_by("due_at").values_list("pk", "task_id")[:limit])
    for approval_id, task_id in due:
        with store(using).write_transaction():
            task = Task.objects.using(using).filter(pk=task_id).first()
            approval = Approval.objects.using(using).filter(pk=approval_id, state=Approval.WAITING).first()
            if task is None or approval is None or not task.awaiting_approval:
                continue  # answered or cancelled meanwhile
            if _apply_timeout(using, task, approval, now, actor):
                moved.append((task.pk, task.stage))
    return moved


def _apply_timeout(using: str, task: Task, approval: Approval, now: datetime, actor: str) -> bool:
    seconds = int((approval.due_at - approval.asked_at).total_seconds())
    if approval.on_timeout == "approve":
        return _close(using, task, approval, now, actor=actor, approve=True, values=None, comment="")
    detail = {"approval": approval.id, "reason": "approval timed out", "timeout_seconds": seconds}
    if approval.on_timeout == "cancel":
        ok = _swap(using, task, Verb.CANCEL, now=now, actor=actor, detail=detail, awaiting_approval=False)
        state = Approval.CANCELLED
    else:
        error = f"approval {approval.id} was not answered within {seconds} s"
        ok = _swap(using, task, Verb.EXPIRE, now=now, actor=actor, awaiting_approval=False, last_error=error,
                   detail={**detail, "error": error, "retryable": False})
        state = Approval.TIMED_OUT
        if ok:
            outcomes.record(using, Verb.EXPIRE, outcomes.TERMINAL, "approval")
    if ok:
        _settle(using, approval, state=state, answered_by=actor, answered_at=now)
    return ok
