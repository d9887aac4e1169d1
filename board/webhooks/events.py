"""The events a webhook may subscribe to, how each is recognised in the history, and the
payloads (the board's JSON, and the Slack-compatible form). Pure: no database, no I/O.

| event | emitted when |
|---|---|
| task.failed | a task moved to FAILED and stays there (a retryable failure with attempts left, which the same transaction sends back to QUEUED, is not one) |
| task.deadline_missed | the reaper applied a task's queue, attempt or progress deadline (board.engine.deadlines) |
| check.problem | a (code, task) pair appears among check()'s problems (once, until it is gone again) |
| approval.requested | a task's holder asked a person (board.engine.approvals): the history's `ask` row, with the question |
| queue.budget_exhausted | a queue's budget was reached (board.engine.budgets): once per closing, named by when it closed |
| webhook.test | only by POST /api/webhooks/{id}/test, to the webhook tested |
"""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from board.engine import deadlines

TASK_FAILED = "task.failed"
DEADLINE_MISSED = "task.deadline_missed"
CHECK_PROBLEM = "check.problem"
APPROVAL_REQUESTED = "approval.requested"
BUDGET_EXHAUSTED = "queue.budget_exhausted"
TEST = "webhook.test"

EMITTED = (TASK_FAILED, DEADLINE_MISSED, CHECK_PROBLEM, APPROVAL_REQUESTED, BUDGET_EXHAUSTED)
SUBSCRIBABLE = EMITTED
# The events read from the history (the others come from check() or the test endpoint).
FROM_HISTORY = (TASK_FAILED, DEADLINE_MISSED, APPROVAL_REQUESTED)

FORMATS = ("json", "slack")


def is_deadline(detail: Any) -> bool:
    """Whether a history row's detail records a deadline the reaper applied (its reason, the
    timeout, and when it fell due: transitions.enforce_deadlines)."""
    return isinstance(detail, dict) and "due_at" in detail and any(f in detail for f in deadlines.TIMEOUTS)


def history_events(event: Any, retried: bool) -> list[str]:
    """The webhook events one history row is (a TaskEvent; `retried`: the same transaction sent
    the task back to QUEUED right after, a RETRY row at the next version)."""
    found = []
    if is_deadline(event.detail):
        found.append(DEADLINE_MISSED)
    if event.to_stage == "FAILED" and not retried:
        found.append(TASK_FAILED)
    if event.verb == "ask":
        found.append(APPROVAL_REQUESTED)
    return found


def event_id(name: str, key: Any) -> str:
    """The event's id, the same for every webhook: `task.failed:812` (a history row's id),
    `check.problem:stale_lease:t1:1733390000123` (a problem's code and task, and when it appeared)."""
    return f"{name}:{key}"


def task_summary(task: Any | None, task_id: str) -> dict[str, Any]:
    """What a payload says of a task (None: pruned meanwhile, only its id is known)."""
    if task is None:
        return {"id": task_id, "link": f"/board/task/{task_id}"}
    return {"id": task.pk, "title": task.title, "queue": task.queue, "stage": task.stage, "attempts": task.attempts,
            "max_retries": task.max_retries, "last_error": (task.last_error or "")[:2000], "tags": task.tags or [],
            "link": f"/board/task/{task.pk}"}


def change_summary(event: Any) -> dict[str, Any]:
    """The history row: the move, who made it and why (a failure's traceback is left out)."""
    detail = event.detail if isinstance(event.detail, dict) else {}
    detail = {k: v for k, v in detail.items() if k != "traceback"}
    return {"event_id": event.id, "verb": event.verb, "from_stage": event.from_stage, "to_stage": event.to_stage,
            "actor": event.actor, "version": event.version, "fence": event.fence, "at": _iso(event.at),
            "detail": detail}


def history_body(name: str, event: Any, task: Any | None) -> dict[str, Any]:
    return {"id": event_id(name, event.id), "event": name, "at": _iso(event.at),
            "task": task_summary(task, event.task_id), "change": change_summary(event)}


def problem_body(name: str, key: str, problem: Any, task: Any | None, at: datetime) -> dict[str, Any]:
    return {"id": event_id(name, key), "event": name, "at": _iso(at),
            "problem": {"code": problem.code, "task": problem.task, "text": problem.text},
            "task": task_summary(task, problem.task) if task is not None else None}


def budget_body(queue: Any, now: datetime) -> dict[str, Any]:
    """A queue whose budget is spent: its budget, what it spent, when it closed and until when."""
    from board.engine import budgets

    described = budgets.describe(queue, now)
    closed_at = datetime.fromtimestamp(queue.budget_closed_at, UTC)
    until = described["budget_exhausted_until"]
    return {"id": event_id(BUDGET_EXHAUSTED, f"{queue.name}:{int(queue.budget_closed_at * 1000)}"),
            "event": BUDGET_EXHAUSTED, "at": _iso(closed_at),
            "queue": {"name": queue.name, "budget": described["budget"], "spent": described["spent"],
                      "closed_at": _iso(closed_at), "until": _iso(until) if until else None,
                      "link": f"/board/?queue={queue.name}"}}


def test_body(key: str, at: datetime, actor: str) -> dict[str, Any]:
    return {"id": event_id(TEST, key), "event": TEST, "at": _iso(at),
            "message": f"a test delivery, asked for by {actor}"}


def slack_text(body: dict[str, Any]) -> str:
    """One line for a Slack channel (an incoming webhook takes `{"text": ...}`)."""
    name, task = body.get("event", ""), body.get("task") or {}
    label = f"`{task.get('id')}`" + (f" “{task['title']}”" if task.get("title") else "")
    queue = f" in queue `{task['queue']}`" if task.get("queue") else ""
    if name == TASK_FAILED:
        error = task.get("last_error") or (body.get("change") or {}).get("detail", {}).get("error", "")
        return f":x: TaskFlow: task {label}{queue} failed" + (f": {error[:300]}" if error else "")
    if name == DEADLINE_MISSED:
        reason = (body.get("change") or {}).get("detail", {}).get("reason", "a deadline passed")
        return f":alarm_clock: TaskFlow: task {label}{queue} missed a deadline: {reason}"
    if name == APPROVAL_REQUESTED:
        detail = (body.get("change") or {}).get("detail", {})
        return f":raising_hand: TaskFlow: task {label}{queue} asks: {detail.get('question', '')[:300]}"
    if name == BUDGET_EXHAUSTED:
        queue = body.get("queue") or {}
        until = f"; claims start again at {queue['until']}" if queue.get("until") else ""
        return f":money_with_wings: TaskFlow: queue `{queue.get('name')}` has spent its budget{until}"
    if name == CHECK_PROBLEM:
        problem = body.get("problem") or {}
        return f":warning: TaskFlow check: {problem.get('code')} on `{problem.get('task')}`: {problem.get('text', '')}"
    if name == TEST:
        return f":wave: TaskFlow: {body.get('message', 'a test delivery')}"
    return f"TaskFlow: {name} {label}{queue}"


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
