"""Notes on a task (issue 32, hand-offs): what an attempt wants the next one to know ("tried the
v2 API, it rate-limits at 10/s"), written by the task's holder with its lease token, or by staff
without one. They stay with the task across attempts and reach the next holder with its claim
(board.engine.handoffs), so attempt N+1 reads attempt N's notes without another request.

A note is not a move: it changes neither the stage, the version nor the lease. What makes it
safe is one conditional UPDATE of the task's note count, in the transaction that inserts the
note: guarded by the count being under MAX_NOTES_PER_TASK (concurrent writers never pass the
cap) and, for a holder, by the lease token's hash and the RUNNING stage (a holder whose lease
was taken over is refused with LeaseLost, as its late complete would be). check() compares the
count with the rows (`notes_miscounted`).
"""
from __future__ import annotations

from django.db.models import F

from board.engine import clock, errors
from board.engine.inputs import agent_name, unstorable_text
from board.engine.lifecycle import Stage
from board.engine.limits import MAX_NOTE_CHARS, MAX_NOTES_PER_TASK
from board.engine.stores import retry_conflicts, store
from board.engine.transitions.cas import RACE_RETRIES, _get
from board.engine.transitions.leases import _refuse_holder, _token_hash
from board.models import Task, TaskNote


def note_text(text: object) -> str:
    """The text of a note: 1 to MAX_NOTE_CHARS characters a database can store."""
    if not isinstance(text, str) or not text.strip():
        raise errors.InvalidRequest("text must be a non-empty string", field="text")
    if len(text) > MAX_NOTE_CHARS:
        raise errors.InvalidRequest(f"text is longer than {MAX_NOTE_CHARS} characters", field="text")
    if (why := unstorable_text(text)) is not None:
        raise errors.InvalidRequest(f"text {why}", field="text")
    return text


@retry_conflicts
def add_note(task_id: str, text: str, *, author: str, token: str | None = None,
             using: str = "default") -> TaskNote:
    """Add a note to the task. With `token`, as its holder `author` (the lease must be the
    task's current one, minted for `author`: else LeaseLost or Forbidden); without, as staff
    (the caller checked the right). NotesFull at MAX_NOTES_PER_TASK notes; nothing is written
    on any refusal."""
    note_text(text)
    agent_name(author)
    token_hash = None if token is None else _token_hash(token)
    for _ in range(RACE_RETRIES):
        with store(using).write_transaction():
            now = clock.now(using)
            task = _get(using, task_id)
            if token_hash is not None:
                # As complete's rule: an expired lease not yet taken over still proves that
                # nobody else holds the task.
                _refuse_holder(task, token_hash, now, live_only=False, agent=author)
            if task.notes_count >= MAX_NOTES_PER_TASK:
                raise errors.NotesFull(f"task {task_id} has {MAX_NOTES_PER_TASK} notes, the most it may have",
                                       task=task)
            if _count(using, task, token_hash):
                note = TaskNote(task_id=task.pk, text=text, author=author, by_holder=token_hash is not None,
                                attempt=task.attempts, fence=task.fence, at=now)
                TaskNote.objects.using(using).bulk_create([note])
                return note
        # The row moved between the read and the update (a claim, another note): judge it again.
    raise errors.VersionConflict(f"task {task_id} kept changing; try again")


def _count(using: str, task: Task, token_hash: str | None) -> bool:
    """The note's one guarded write: count it on the task while the count is under the cap
    (and, for a holder, while its lease is still the task's)."""
    rows = Task.objects.using(using).filter(pk=task.pk, notes_count__lt=MAX_NOTES_PER_TASK)
    if token_hash is not None:
        rows = rows.filter(stage=Stage.RUNNING, lease_token_hash=token_hash)
    return rows.update(notes_count=F("notes_count") + 1) == 1
