"""The kanban page. Data comes over the websocket (board/live/consumers.py) and the API.

Who may open it: an active staff user allowed to read tasks (board/access.py); the page offers
the operators' actions only to a user with board.intervene, and a queue's Pause/Resume only to a
user with board.change_queue; those are the only writes it makes (through the API, with the
session and its CSRF token)."""
from pathlib import Path

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.shortcuts import render, resolve_url
from django.utils.http import urlencode
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET

from board import access
from board.engine import moments, resources, selectors
from board.engine.lifecycle import TRANSITIONS, Stage
from board.models import TaskEvent

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
        return missing_permission(request)
    moves = sorted({(s.value, verb.value, to.value) for (s, verb), to in TRANSITIONS.items()})
    return render(request, "board/board.html", {
        "stages": [s.value for s in Stage],
        "columns": [(s.value, EMPTY_COLUMN_HINTS[s]) for s in Stage],
        "moves": moves,
        "can_intervene": access.may_intervene(request.user),
        "can_change_queues": access.may_change_queues(request.user),  # the same rule as PUT /api/queues/{name}
        "login_url": resolve_url(settings.LOGIN_URL),  # where the page sends a person whose session ended
        "approver": access.approver(request.user),  # the answer buttons: board.access.approver
        # The time control's oldest moment: the history's horizon, or its first row (two index reads).
        "history_from": _history_from(),
        "off_window_max": settings.TASKFLOW["BOARD_OFF_WINDOW_MAX"],
    })


def _history_from() -> str | None:
    found = moments.horizon()
    if found is None:
        found = TaskEvent.objects.order_by("pk").values_list("at", flat=True).first()
    return found.isoformat() if found is not None else None


ASK_AT_MOST = 5  # administrators a refused user is told to ask


def missing_permission(request):
    """403 for a staff user who may not read tasks: which permission is missing and who can grant
    it (Django's bare "403 Forbidden" said neither; the reason was only in the server's log)."""
    administrators = list(get_user_model().objects.filter(is_superuser=True, is_active=True)
                          .order_by("username").values_list("username", flat=True)[:ASK_AT_MOST])
    return render(request, "board/forbidden.html", {
        "user": request.user,
        "permission": access.READ[0],
        "administrators": administrators,
    }, status=403)


FAVICON = (Path(__file__).resolve().parents[2] / "static" / "board" / "favicon.ico").read_bytes()


@require_GET
@cache_control(public=True, max_age=86400)
def favicon(request):
    """/favicon.ico, which every browser asks for on every page, the admin's included: served,
    not a 404 in the log under `make run`'s banner."""
    return HttpResponse(FAVICON, content_type="image/x-icon")


# ---------------------------------------------------------------------------------------------
# A task's own page, /board/task/<id> (issue 30, item 16). Same rules as the board: a staff user
# who may read tasks; the actions only with board.intervene. The server renders what only it
# can say cheaply, the dependencies both ways (the API has no "who waits for it"); the task, its
# attempts and its history are drawn by the board's own modules from the API
# (static/board/taskpage.js), as the details panel draws them. No lease token is read here.

STRANDED_AT_MOST = 200  # tasks down the chain a cancel would strand, listed in its dialog


def _neighbours(ids: list[str]) -> list[dict]:
    found = selectors.tasks_by_id(ids)
    return [{"id": i, "title": found[i].title if i in found else "", "stage": found[i].stage if i in found else "gone"}
            for i in sorted(ids)]


def _stranded_by(task_id: str) -> tuple[list[dict], bool]:
    """The unfinished tasks that wait for `task_id`, down the chain (what a cancel strands, as
    check()'s dead_dep), at most STRANDED_AT_MOST; and whether that is all of them."""
    found: dict[str, dict] = {}
    todo = [task_id]
    while todo:
        waiting = _neighbours(selectors.dependents_of(todo.pop()))
        for row in waiting:
            if row["id"] in found or row["stage"] not in STRANDABLE:
                continue
            if len(found) >= STRANDED_AT_MOST:
                return sorted(found.values(), key=lambda r: r["id"]), False
            found[row["id"]] = row
            todo.append(row["id"])
    return sorted(found.values(), key=lambda r: r["id"]), True


STRANDABLE = {Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED}


HOLDERS_AT_MOST = 20  # holders listed per resource (a shared one may have many)


def _resources_of(task) -> tuple[list[dict], str | None]:
    """The task's declared resources (issue 32), each with its node and who holds that node now
    (tasks and agents: no lease token), and, when it is QUEUED, what keeps it waiting
    (resources.why_waiting: "resource merge-slot held by worker-3 (task t1)")."""
    if not task.resources:
        return [], None
    declared = [(r, None) if isinstance(r, str) else (r["name"], r["units"]) for r in task.resources]
    nodes = {name: resources.node_of(name) for name, _ in declared}
    held = {row["name"]: row for row in resources.holders(names=sorted(set(nodes.values())))}
    rows = []
    for name, units in declared:
        row = held.get(nodes[name])
        holders = row["holders"] if row else []
        rows.append({"name": name, "node": nodes[name], "units": units,
                     "holders": [{"task": h["task"], "agent": h["agent"]} for h in holders[:HOLDERS_AT_MOST]],
                     "more_holders": max(0, len(holders) - HOLDERS_AT_MOST)})
    waiting = resources.why_waiting("default", task) if task.stage == Stage.QUEUED else None
    return rows, waiting


@staff_member_required
@ensure_csrf_cookie  # its actions call the API with the session and this token
def task_page(request, task_id: str):
    if not access.may_read(request.user):
        return missing_permission(request)
    task = selectors.get_task(task_id)
    context = {"task_id": task_id, "task": None, "can_intervene": access.may_intervene(request.user),
               "approver": access.approver(request.user),
               "moves": sorted({(s.value, verb.value, to.value) for (s, verb), to in TRANSITIONS.items()})}
    if task is None:
        return render(request, "board/task.html", context, status=404)
    stranded, complete = _stranded_by(task.pk)
    declared, waiting = _resources_of(task)
    context.update({
        "task": {"id": task.pk, "title": task.title, "stage": task.stage, "approvals_count": task.approvals_count},
        "waits_on": _neighbours(selectors.deps_of_task(task)),
        "waited_by": _neighbours(selectors.dependents_of(task.pk)),
        "stranded": {"tasks": stranded, "complete": complete},
        "resources": declared,
        "resource_wait": waiting,
        # check()'s words when no live agent key used lately holds what it requires (issue 32,
        # item 3): the page's fields say so beside its requires (taskfields.js), as its card does.
        "unclaimable": selectors.unclaimable_why(task),
        "board_link": f"{resolve_url('board')}?{urlencode({'task': task.pk})}",
    })
    return render(request, "board/task.html", context)
