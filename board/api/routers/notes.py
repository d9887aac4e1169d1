"""Notes on a task (issue 32, hand-offs): `POST /api/tasks/{id}/notes` by its holder (with the
lease token) or by staff (operator rights, without one), `GET` for anyone who reads tasks. The
engine writes them (board.engine.transitions.notes); a claim hands the newest to the new holder
(board.engine.handoffs).
"""
from __future__ import annotations

from ninja import Router, Status

from board.api.auth import in_scope, require_agent, require_operator, require_reader
from board.api.errors import ERRORS
from board.api.schemas import NoteIn, NoteOut, NotePage
from board.engine import handoffs, transitions

router = Router()


@router.post("/tasks/{task_id}/notes", response={201: NoteOut, **ERRORS},
             summary="Add a note that stays with the task across attempts (holder with its token, or staff)")
def add_note(request, task_id: str, body: NoteIn):
    """With `token`: the holder (an agent key; the lease must be the task's current one, as
    complete's rule: else 409 `lease_lost`). Without: staff with operator rights. At most 100
    notes a task (409 `notes_full`). The next claim of the task carries its newest notes
    (`lease.notes`)."""
    if body.token is not None:
        require_agent(request)
    else:
        require_operator(request)
    in_scope(request, task_id)
    note = transitions.add_note(task_id, body.text, author=request.auth.name, token=body.token)
    return Status(201, handoffs.public_note(note))


@router.get("/tasks/{task_id}/notes", response={200: NotePage, **ERRORS},
            summary="Every note of a task, oldest first")
def list_notes(request, task_id: str):
    require_reader(request)
    in_scope(request, task_id)
    return {"items": [handoffs.public_note(note) for note in handoffs.notes_of(task_id)]}
