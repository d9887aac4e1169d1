"""The plan as a graph (issue 33, item 3): `/board/graph/?root=<id>` (or `?tag=<tag>`) draws a
plan's dependency graph (static/board/graph.js); `/board/graph/data` answers what it draws:

  nodes     the tasks: id, title, stage, owner, queue, attempts, max_retries, updated_at;
  edges     [task, dependency] pairs among them (the task waits for the dependency);
  complete  false when the plan has more than MAX_GRAPH_NODES tasks (the first found are drawn).

`root`: the tasks connected to it through dependencies, both ways, step by step (its
dependencies and theirs, the tasks waiting for it and for those, and their other dependencies:
the whole weakly connected plan); `tag`: the tasks carrying the tag (board.engine.search), with
the dependencies among them. One read per step of the walk, each bounded (selectors' chunks).
Who may ask is who may see the board (board.access.may_read); no lease token is read.
"""
from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from board import access
from board.engine import errors, listing, search, selectors
from board.engine.inputs import is_valid_task_id
from board.engine.lifecycle import TRANSITIONS
from board.live.views import missing_permission

MAX_GRAPH_NODES = 1000  # tasks drawn (a 500-task plan is drawn whole)
NODE_FIELDS = ("id", "title", "stage", "owner", "queue", "attempts", "max_retries", "updated_at")


def plan_around(root: str, *, limit: int = MAX_GRAPH_NODES, using: str = "default") -> tuple[list[str], bool]:
    """The ids of the plan `root` is in (connected through dependencies either way), `root`
    first, at most `limit`; and whether that is all of it."""
    found = [root]
    seen = {root}
    frontier = [root]
    while frontier:
        upstream = selectors.deps_of(frontier, using=using)
        downstream = selectors.dependents_of_all(frontier, using=using)
        nxt = []
        for task_id in [dep for deps in upstream.values() for dep in deps] + downstream:
            if task_id in seen:
                continue
            if len(found) >= limit:
                return found, False
            seen.add(task_id)
            found.append(task_id)
            nxt.append(task_id)
        frontier = nxt
    return found, True


def tagged(tag: str, *, limit: int = MAX_GRAPH_NODES, using: str = "default") -> tuple[list[str], bool]:
    """The ids of the tasks carrying `tag` (oldest first), at most `limit`; and whether that is all."""
    rows = listing.task_list(search=f"tag:{tag}", order="created", count=limit + 1, columns=("id",), using=using)
    return [task.pk for task in rows[:limit]], len(rows) <= limit


def graph_of(ids: list[str], *, using: str = "default") -> dict:
    """The nodes and the edges among them."""
    tasks = selectors.tasks_by_id(ids, using=using)
    present = [task_id for task_id in ids if task_id in tasks]
    deps = selectors.deps_of(present, using=using)
    return {
        "nodes": [{name: getattr(tasks[task_id], "pk" if name == "id" else name) for name in NODE_FIELDS}
                  for task_id in present],
        "edges": [[task_id, dep] for task_id in present for dep in deps[task_id] if dep in tasks],
    }


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _asked(get) -> tuple[str | None, str | None]:
    """(root, tag) of a request: exactly one, valid; InvalidRequest else."""
    unknown = sorted(set(get) - {"root", "tag"})
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter {unknown[0]!r}; known: root, tag")
    root, tag = get.get("root") or None, get.get("tag") or None
    if (root is None) == (tag is None):
        raise errors.InvalidRequest("give one of root (a task id) or tag")
    if root is not None and not is_valid_task_id(root):
        raise errors.InvalidRequest(f"root {root!r} is not a task id")
    if tag is not None and not search.TAG_RE.fullmatch(tag):
        raise errors.InvalidRequest(f"tag {tag!r} is not a tag")
    return root, tag


@staff_member_required
@require_GET
def graph_data(request):
    if not access.may_read(request.user):
        return _error(403, "forbidden", "this user may not read tasks (the board.view_task permission)")
    try:
        root, tag = _asked(request.GET)
    except errors.InvalidRequest as exc:
        return _error(exc.http_status, exc.code, str(exc))
    if root is not None:
        if selectors.stage_of(root) is None:
            return _error(404, "not_found", f"no task with id {root!r}")
        ids, complete = plan_around(root)
    else:
        ids, complete = tagged(tag)
    return JsonResponse({**graph_of(ids), "root": root, "tag": tag, "complete": complete})


@staff_member_required
@require_GET
def graph_page(request):
    if not access.may_read(request.user):
        return missing_permission(request)
    root, tag = request.GET.get("root", ""), request.GET.get("tag", "")
    return render(request, "board/graph.html", {
        "root": root, "tag": tag, "max_nodes": MAX_GRAPH_NODES,
        # The board's modules the page imports (page.js) read the lifecycle's moves from the page.
        "moves": sorted({(s.value, verb.value, to.value) for (s, verb), to in TRANSITIONS.items()}),
    })
