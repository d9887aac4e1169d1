"""Is this board working? The reaper records each pass here, and `/healthz` (what a load balancer
or a supervisor polls) reads it beside a database round trip and, when REDIS_URL is set, a Redis
PING.

/healthz answers 200 `{"status": "ok", "checks": {...}}` when every check passes, 503 with
`"status": "fail"` otherwise; each check is `{"ok": bool, "error"?: str}` plus its figures. It
needs no credentials, so it names what failed but never how (no host, port or driver message:
those go to the server's log).
"""
from __future__ import annotations

import logging
import os
import socket
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, connections
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from board.engine import clock, db
from board.models import ReaperPass

log = logging.getLogger("board.health")

HOST = socket.gethostname()
REDIS_TIMEOUT_SECONDS = 0.5


# ---------------------------------------------------------------------------------------------
# The reaper's side


def record_reaper_pass(*, started_at: datetime, passes: int, reclaimed: int, admitted: int,
                       using: str = "default") -> None:
    """After each pass: one row per host, its finish time taken from the database's clock."""
    ReaperPass.objects.using(using).update_or_create(
        host=HOST,
        defaults={"pid": os.getpid(), "started_at": started_at, "finished_at": clock.in_query(using),
                  "passes": passes, "reclaimed": reclaimed, "admitted": admitted},
    )


# ---------------------------------------------------------------------------------------------
# The checks


def check_database(using: str = "default") -> dict:
    try:
        db.ping(using)
        return {"ok": True}
    except Exception as exc:  # any failure to answer is the finding, whatever the driver raises
        log.warning("health: the database did not answer: %s", exc)
        connections[using].close()
        return {"ok": False, "error": f"the database did not answer ({type(exc).__name__})"}


def check_reaper(using: str = "default") -> dict:
    """The most recent pass of any host's reaper, and its age on the database's clock."""
    try:
        now = clock.now(using)
        last = (ReaperPass.objects.using(using).order_by("-finished_at")
                .values("host", "pid", "finished_at", "passes", "reclaimed", "admitted").first())
    except DatabaseError as exc:
        log.warning("health: could not read the reaper's last pass: %s", exc)
        return {"ok": False, "error": "unknown: its last pass could not be read"}
    if last is None:
        return {"ok": False, "error": "no reaper has ever finished a pass on this database"}
    age = max(0.0, (now - last.pop("finished_at")).total_seconds())
    stale_after = settings.TASKFLOW["REAPER_STALE_SECONDS"]
    report = {"ok": age < stale_after, "last_pass_age_seconds": round(age, 3), **last}
    if not report["ok"]:
        report["error"] = f"the last pass finished {age:.0f} s ago (more than {stale_after:g} s)"
    return report


def check_redis(url: str) -> dict:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                  socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
    try:
        client.ping()
        return {"ok": True}
    except Exception as exc:  # refused, timed out, or answered with an error
        log.warning("health: Redis did not answer: %s", exc)
        return {"ok": False, "error": f"Redis did not answer within {REDIS_TIMEOUT_SECONDS:g} s ({type(exc).__name__})"}
    finally:
        client.close()


def report() -> dict:
    checks = {"database": check_database()}
    if checks["database"]["ok"]:
        checks["reaper"] = check_reaper()
    else:
        checks["reaper"] = {"ok": False, "error": "unknown: the database did not answer"}
    if settings.REDIS_URL:
        checks["redis"] = check_redis(settings.REDIS_URL)
    ok = all(check["ok"] for check in checks.values())
    return {"status": "ok" if ok else "fail", "checks": checks}


@require_GET
@never_cache
def healthz(request):
    body = report()
    return JsonResponse(body, status=200 if body["status"] == "ok" else 503)
