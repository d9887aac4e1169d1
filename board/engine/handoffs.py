"""What a claim hands to the task's new holder besides the lease (issue 32, hand-offs), so the
agent needs no other request to start:

- `inputs`: the results of the task's dependencies, by dependency id (all COMPLETED: a task is
  claimable only then). Up to MAX_INPUTS_BYTES of JSON in all, in the dependencies' order; a
  result past that room is left out and its id listed in `inputs_omitted` (read it with
  GET /api/tasks/{id}). A task without dependencies has neither field.
- `notes`: the task's newest MAX_NOTES_IN_CLAIM notes, oldest first (board.engine.transitions.notes):
  what earlier attempts and staff wrote. A task without notes has no field.
- `approval`: the task's last answered approval (board.engine.approvals): the question, whether
  it was approved, the values and comment, who answered and when. A task that never asked has
  no field; one whose last question is still waiting cannot be claimed.

Read after the claim's commit, with one query each, and only for a task that has dependencies
(Task.has_deps), notes (Task.notes_count) or approvals (Task.approvals_count): a plain claim
costs nothing more. A renew carries
neither (the holder has them).
"""
from __future__ import annotations

import json
from typing import Any

from board.engine.limits import MAX_INPUTS_BYTES, MAX_NOTES_IN_CLAIM
from board.engine import approvals, errors
from board.models import Approval, Task, TaskNote


def for_claim(task: Task, deps: list[str], *, using: str = "default") -> dict[str, Any]:
    """The hand-off fields of a claim of `task`, whose dependencies are `deps` (in the order its
    `deps` field shows them): none for a task without dependencies or notes."""
    handed: dict[str, Any] = {}
    if deps:
        handed["inputs"], omitted = inputs_of(deps, using=using)
        if omitted:
            handed["inputs_omitted"] = omitted
    if task.notes_count:
        notes = TaskNote.objects.using(using).filter(task_id=task.pk).order_by("-id")[:MAX_NOTES_IN_CLAIM]
        handed["notes"] = [public_note(note) for note in reversed(list(notes))]
    if task.approvals_count:
        last = (Approval.objects.using(using).filter(task_id=task.pk).exclude(state=Approval.WAITING)
                .order_by("-id").first())
        if last is not None:
            handed["approval"] = approvals.public_approval(last)
    return handed


def inputs_of(deps: list[str], *, using: str = "default") -> tuple[dict[str, Any], list[str]]:
    """The results of the tasks `deps` within MAX_INPUTS_BYTES, and the ids of those left out."""
    results = dict(Task.objects.using(using).filter(pk__in=deps).values_list("pk", "result"))
    inputs: dict[str, Any] = {}
    omitted: list[str] = []
    room = MAX_INPUTS_BYTES
    for dep in deps:
        size = len(json.dumps(results.get(dep), separators=(",", ":")).encode())
        if size <= room:
            inputs[dep] = results.get(dep)
            room -= size
        else:
            omitted.append(dep)
    return inputs, omitted


def notes_of(task_id: str, *, using: str = "default") -> list[TaskNote]:
    """Every note of the task, oldest first (at most MAX_NOTES_PER_TASK); NotFound for no task."""
    if not Task.objects.using(using).filter(pk=task_id).exists():
        raise errors.NotFound(f"no task with id {task_id!r}")
    return list(TaskNote.objects.using(using).filter(task_id=task_id).order_by("id"))


def public_note(note: TaskNote) -> dict[str, Any]:
    """A note as the API and the board show it (never a token: a note holds none)."""
    return {"id": note.id, "text": note.text, "author": note.author, "by_holder": note.by_holder,
            "attempt": note.attempt, "fence": note.fence, "at": note.at}
