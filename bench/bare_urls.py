"""The baselines of bench/http_claims.py, served by a second server (settings bench/bare_settings.py)
behind the project's middleware stack (settings.MIDDLEWARE), under /api/ so that they meet that
stack as an API request does:

- the bare view (BARE_PATH): a JSON answer with no database work. The ceiling of the serving
  stack, whatever the engine.
- the plain (b) and (c): the requests of an agent's complete-and-claim-next loop and of its
  batches (bench/http_agent.py's ``next`` and ``batch`` modes), at the board's own paths,
  answered by bench/claims.py's RawDriver: the same moves as plain SQL (the pick, then UPDATE +
  INSERT per move; the completion and the next claim in one transaction, as the engine's
  complete-and-claim-next; a batch of claims in one transaction, a batch of completions in
  one), with no engine, no django-ninja, no key check (the server's only callers are the
  benchmark's agents), answers holding just what the agent reads. What the board's (b) and (c)
  cost beyond them is the engine's rules, its checks and its answers.

A plain lease's token is "<version>.<fence>.<token>": the RawDriver's compare-and-swap needs the
row's version and fence, which the plain views keep nowhere else; the row holds the token's hash.
"""
import json
import os
import threading
from pathlib import Path

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from bench import claims
from bench.http_agent import BARE_PATH
from board.engine.tokens import hash_token

PLAIN_AGENT = "plain-agent"


def bare(request):
    return JsonResponse({"ok": True})


class _PlainDriver(threading.local):
    """This thread's RawDriver and connection, on the server's database (settings.DATABASES's,
    from DATABASE_URL)."""

    def get(self) -> tuple[claims.RawDriver, object]:
        if not hasattr(self, "driver"):
            database = settings.DATABASES["default"]
            dialect = (claims.sqlite_dialect(Path(database["NAME"])) if database["ENGINE"].endswith("sqlite3")
                       else claims.postgres_dialect(os.environ["DATABASE_URL"]))
            self.driver = claims.RawDriver(dialect)
            self.conn = self.driver.open()
        return self.driver, self.conn


_plain = _PlainDriver()


def _held(lease: claims.RawLease | None) -> dict | None:
    if lease is None:
        return None
    return {"task": {"id": lease.task_id}, "lease": {"token": f"{lease.version}.{lease.fence}.{lease.token}"}}


def _lease(task_id: str, token: str) -> claims.RawLease:
    version, fence, secret = token.split(".", 2)
    return claims.RawLease(task_id, int(version), int(fence), hash_token(secret))


@csrf_exempt
def plain_claim(request):
    """POST /api/claim {"max_tasks"?}: the best ready task (or up to max_tasks of them, in one
    transaction), or 204."""
    most = json.loads(request.body).get("max_tasks")
    driver, conn = _plain.get()
    if most is not None:
        leases = driver.claim_batch(conn, PLAIN_AGENT, most)
        return JsonResponse({"leases": [_held(lease) for lease in leases]}) if leases else HttpResponse(status=204)
    lease = driver.claim_next(conn, PLAIN_AGENT)
    return HttpResponse(status=204) if lease is None else JsonResponse(_held(lease))


@csrf_exempt
def plain_complete_batch(request):
    """POST /api/complete {"items": [{"id", "token", "result"}, ...]}: every item completed, in
    one transaction."""
    items = json.loads(request.body)["items"]
    driver, conn = _plain.get()
    driver.complete_batch(conn, PLAIN_AGENT, [_lease(item["id"], item["token"]) for item in items])
    return JsonResponse({"items": [{"id": item["id"], "ok": True} for item in items]})


@csrf_exempt
def plain_complete(request, task_id: str):
    """POST /api/tasks/<id>/complete {"token", "result", "next"?}: the task completed, and with
    `next` the next one claimed in the same transaction."""
    body = json.loads(request.body)
    lease = _lease(task_id, body["token"])
    driver, conn = _plain.get()
    if "next" not in body:
        driver.complete(conn, PLAIN_AGENT, lease)
        return JsonResponse({"id": task_id, "stage": "COMPLETED"})
    following = driver.complete_and_claim(conn, PLAIN_AGENT, lease)
    return JsonResponse({"id": task_id, "stage": "COMPLETED", "next": _held(following)})


urlpatterns = [
    path(BARE_PATH.lstrip("/"), bare),
    path("api/claim", plain_claim),
    path("api/tasks/<str:task_id>/complete", plain_complete),
    path("api/complete", plain_complete_batch),
]
