"""The agents' JSON API (django-ninja), under /api/: the NinjaAPI and its Routers. Handlers are
thin: they check the caller (board/api/auth.py), call one verb of `board.engine.transitions` or a
query of `board.engine.selectors`, and render `board.api.schemas`.

Every error has one shape, `{"error": {"code", "message", "task"?, "details"?}}` (board/api/errors.py),
and an error never changes the database (the engine raises before or instead of writing).

Who may call: an agent with `Authorization: Bearer <key>` (its name comes from the key), or a
logged-in staff user's browser session with the CSRF token. Each endpoint's first line checks
what the caller may do (board/access.py): a session reads with board.view_task and creates
with board.add_task; claiming and the holder's verbs take an agent key only; operators' verbs
(admit, requeue, cancel, force-release, force-pause) need a key created with --operator or the
board.intervene permission.
"""
from __future__ import annotations

from ninja import NinjaAPI

from board.api import errors
from board.api.auth import AUTH
from board.api.docs import LocalSwagger
from board.api.json_body import BodyParser
from board.api.routers import (
    approvals, board_at, bulk, check, fairness_keys, leases, notes, operators, queues, rate_keys, resources, schedules,
    tasks, webhooks,
)


# The areas of the API, in the order /api/docs shows their groups, each with its group's line.
AREAS = (
    (tasks, "tasks"), (leases, "leases"), (notes, "notes"), (approvals, "approvals"), (operators, "operators"),
    (queues, "queues"), (rate_keys, "rate keys"), (fairness_keys, "fairness keys"),
    (resources, "resources"), (schedules, "schedules"),
    (check, "check"), (webhooks, "webhooks"), (bulk, "bulk"), (board_at, "board at"),
)
TAG_DESCRIPTIONS = {
    "tasks": "Create tasks (with dependencies), list them a page at a time, read one and its history.",
    "leases": "An agent's side: claim ready work with a lease, renew it, then complete, fail, pause, "
              "release or resume (an agent key only).",
    "notes": "Notes that stay with a task across attempts: its holder's or staff's; the next claim carries them.",
    "approvals": "Approval gates: a holder asks a person and gives its lease up; an approver answers "
                 "(one answer per approval); the next claim carries the answer.",
    "operators": "An operator's moves on any task: admit, requeue, cancel, force-release, force-pause "
                 "(an --operator key or board.intervene).",
    "queues": "Flow control per queue: pause and resume, a concurrency limit, a rate; and each "
              "queue's history of changes.",
    "rate keys": "Rates shared by the tasks naming a rate key, across queues.",
    "fairness keys": "A fairness key's weight and budget: the usage the tasks naming it may report per window, "
                     "across queues.",
    "resources": "Resource leases: who holds what until when, a resource's capacity, whether a lease still "
                 "holds one (a downstream system's fence check).",
    "schedules": "Periodic tasks: a task created on each tick of a schedule.",
    "check": "The board's invariant check: every contradiction, by machine code.",
    "webhooks": "Alerts POSTed to your URL (task.failed, task.deadline_missed, check.problem, ...): signed, "
                "retried with backoff from a durable outbox (an --operator key or board.add_webhook).",
    "bulk": "One operator action on every task a filter matches, as a background job: count first, then "
            "each task one compare-and-swap held to the version read; progress, stop, and one summary "
            "(an --operator key or board.intervene).",
    "board at": "The board as it was at any moment, rebuilt from the history: every task's stage, version and "
                "owner then, the counts, check()'s problems; exact from the history's horizon on.",
}


# The routes a working agent calls for every task, in the order Django tries them: first.
HOT_ROUTES = {route: rank for rank, route in enumerate((
    "tasks/<task_id>/complete", "claim", "complete", "tasks/<task_id>/renew", "tasks/<task_id>/fail",
    "tasks/<task_id>/release",
))}


class BoardAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        # The committed contract's ids (board/api/openapi.json): made from the module every
        # endpoint once lived in, board/api/endpoints.py; generated clients are named after them.
        return f"board_api_endpoints_{operation.view_func.__name__}"

    def _get_urls(self):
        # An agent's hot paths first: Django tries a path's patterns in order, and these came
        # after ~25 others (bench/api_cost.py's "URL routing" of a complete-and-claim-next,
        # SQLite: 0.038 ms before, 0.023 after, with the API first in the URLconf too).
        # Safe because none of them matches a path another pattern matches
        # (tests/test_request_path.py resolves a path of every pattern in both orders).
        patterns = super()._get_urls()
        return sorted(patterns, key=lambda pattern: HOT_ROUTES.get(str(pattern.pattern), len(HOT_ROUTES)))

    def get_openapi_schema(self, *args, **kwargs):
        from board.api.routers.leases import document_batch_claim

        schema = super().get_openapi_schema(*args, **kwargs)
        document_batch_claim(schema)
        return schema


api = BoardAPI(
    title="TaskFlow board",
    version="1",
    description=(
        "Coordinate work between agents: create tasks (with dependencies), claim ready work "
        "with a lease, renew it while working, then complete, fail, pause or release it. "
        "Every error is `{\"error\": {\"code\", \"message\", \"task\"?}}`.\n\n"
        "**Queue scopes.** An agent key may be limited to some queues (glob patterns such as "
        "`ci-*,docs`: `create_agent_key --queues`, or the Keys admin). Such a key lists, reads, "
        "claims and acts only on tasks of those queues: any other task is absent to it (404 "
        "`not_found`, the answer an unknown id gets; left out of lists and of `/api/check`; a "
        "dependency on it is unknown), and a claim without `queue` takes from any of its queues, "
        "with a `queue` outside them answers 204. Creating a task in another queue is 403 `forbidden`."
    ),
    auth=AUTH,
    renderer=errors.RENDERER,  # the one board/api/errors.py answers with too
    urls_namespace="api",
    docs=LocalSwagger(),  # from this server's own files (board/api/docs.py)
    parser=BodyParser(),
    openapi_extra={"tags": [{"name": tag, "description": TAG_DESCRIPTIONS[tag]} for _, tag in AREAS]},  # reads a body of any depth, for the schemas to judge (board/api/json_body.py)
)

errors.install(api)

# Mounted without a prefix: the paths are those of the committed contract (board/api/openapi.json).
# A path's methods must share one Router (GET and POST /tasks): Django routes a path to the first
# router that declares it. Each router's tag groups its operations in /api/docs (one group per
# area instead of Swagger's single "default"); tags are metadata, no path or field changes.
for area, tag in AREAS:
    api.add_router("", area.router, tags=[tag])
