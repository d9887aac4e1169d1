"""The kanban page. Data comes over the websocket (board/live/consumers.py) and the API.

Who may open it: an active staff user allowed to read tasks (board/access.py); the page offers
the operators' actions only to a user with board.intervene, and those actions are the only
writes it makes (through the API, with the session and its CSRF token)."""
from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render, resolve_url
from django.views.decorators.csrf import ensure_csrf_cookie

from board import access
from board.engine.lifecycle import TRANSITIONS, Stage

# What an empty column says: where its tasks come from, so that a new board tells its user
# what to do next.
EMPTY_COLUMN_HINTS = {
    Stage.PENDING: "New tasks wait here for their dependencies or an operator's admit.",
    Stage.QUEUED: "Ready tasks wait here for an agent to claim them.",
    Stage.RUNNING: "Tasks an agent holds a lease on.",
    Stage.PAUSED: "Tasks paused with a checkpoint, to be resumed.",
    Stage.COMPLETED: "Finished tasks.",
    Stage.FAILED: "Tasks out of retries; Retry puts them back.",
    Stage.CANCELLED: "Tasks cancelled by an operator.",
}


@staff_member_required
@ensure_csrf_cookie  # the page's actions call the API with the session and this token
def board_page(request):
    if not access.may_read(request.user):
        raise PermissionDenied("viewing the board needs the board.view_task permission")
    moves = sorted({(s.value, verb.value, to.value) for (s, verb), to in TRANSITIONS.items()})
    return render(request, "board/board.html", {
        "stages": [s.value for s in Stage],
        "columns": [(s.value, EMPTY_COLUMN_HINTS[s]) for s in Stage],
        "moves": moves,
        "can_intervene": access.may_intervene(request.user),
        "login_url": resolve_url(settings.LOGIN_URL),  # where the page sends a person whose session ended
    })
