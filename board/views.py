"""The kanban page. Data comes over the websocket (board/consumers.py) and the API."""
from django.contrib.admin.views.decorators import staff_member_required
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from .lifecycle import TRANSITIONS, Stage


@staff_member_required
@ensure_csrf_cookie  # the page's actions call the API with the session and this token
def board_page(request):
    moves = sorted({(s.value, verb.value, to.value) for (s, verb), to in TRANSITIONS.items()})
    return render(request, "board/board.html", {
        "stages": [s.value for s in Stage],
        "moves": moves,
        "can_intervene": request.user.has_perm("board.intervene"),
    })
