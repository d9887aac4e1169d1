"""Is this board working? The reaper records each pass here, and `/healthz` (what a load balancer
or a supervisor polls) reads it beside a database round trip and, when REDIS_URL is set, a Redis
PING.

/healthz answers 200 `{"status": "ok", "checks": {...}, "checked_seconds_ago": s}` when every
check passes, 503 with `"status": "fail"` otherwise; each check is `{"ok": bool, "error"?: str}`
plus its figures. It needs no credentials, so it names what failed but never how (no host, port
or driver message: those go to the server's log).

**A probe never waits for a check, and never holds a request thread.** The checks run in
threads of their own, one per process per check (the database and the reaper's record in one,
Redis in the other, with one Redis client kept for the process's life), every REFRESH_SECONDS
while probes keep coming; a probe reads their latest results from memory. So however many
clients poll /healthz and however long Redis or the database take to answer, the cost per
process is those two threads (and one database connection borrowed a few times a second), and
the threads that serve the agents are not taken. Before this, each probe opened a Redis client
and waited up to 0.5 s on a request thread: 12 clients polling while Redis hung made an agent's
GET take 1.5 s.

**An answer is never older than MAX_AGE_SECONDS.** A result is as of the moment its check
finished; one older than a second (its check is still waiting for an answer) is not served as
current: that check is reported failed, "unknown: no answer for N s". `checked_seconds_ago` is
the age of the oldest result the answer used. The checkers start on a process's first probe and
pause after IDLE_AFTER_SECONDS without one; only a probe that finds them starting waits, at most
FIRST_WAIT_SECONDS, for their first results.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from board.engine import clock
from board.engine.stores import store
from board.models import ReaperPass

log = logging.getLogger("board.health")

HOST = socket.gethostname()
REDIS_TIMEOUT_SECONDS = 0.5
MAX_AGE_SECONDS = 1.0  # a result older than this is reported "unknown", never as current
REFRESH_SECONDS = 0.25  # pause between two runs of a check: results are at most this + its run old
IDLE_AFTER_SECONDS = 60.0  # a checker pauses when no probe came for this long
FIRST_WAIT_SECONDS = 1.0  # what a probe waits at most, only while the checkers start


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

# The checks run a few times a second: a failure is logged when it begins (with the driver's
# message, which the answer never shows) and its end when the check passes again.
_failing: set[str] = set()


def warn_once(name: str, message: str, *args) -> None:
    if name not in _failing:
        _failing.add(name)
        log.warning(message, *args)


def passed(name: str) -> None:
    if name in _failing:
        _failing.discard(name)
        log.warning("health: the %s check passes again", name)


def check_database(using: str = "default") -> dict:
    try:
        store(using).ping()
        return {"ok": True}
    except Exception as exc:  # any failure to answer is the finding, whatever the driver raises
        warn_once("database", "health: the database did not answer: %s", exc)
        connections[using].close()
        return {"ok": False, "error": f"the database did not answer ({type(exc).__name__})"}


def check_reaper(using: str = "default") -> dict:
    """The most recent pass of any host's reaper, and its age on the database's clock."""
    try:
        now = clock.now(using)
        last = (ReaperPass.objects.using(using).order_by("-finished_at")
                .values("host", "pid", "finished_at", "passes", "reclaimed", "admitted").first())
    except DatabaseError as exc:
        warn_once("reaper", "health: could not read the reaper's last pass: %s", exc)
        return {"ok": False, "error": "unknown: its last pass could not be read"}
    if last is None:
        return {"ok": False, "error": "no reaper has ever finished a pass on this database"}
    age = max(0.0, (now - last.pop("finished_at")).total_seconds())
    stale_after = settings.TASKFLOW["REAPER_STALE_SECONDS"]
    report = {"ok": age < stale_after, "last_pass_age_seconds": round(age, 3), **last}
    if not report["ok"]:
        report["error"] = f"the last pass finished {age:.0f} s ago (more than {stale_after:g} s)"
    return report


class RedisCheck:
    """PING through one client kept for the process's life (its pool reuses the connection)."""

    def __init__(self, url: str):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                           socket_connect_timeout=REDIS_TIMEOUT_SECONDS)

    def __call__(self) -> dict:
        try:
            self.client.ping()
            return {"redis": {"ok": True}}
        except Exception as exc:  # refused, timed out, or answered with an error
            warn_once("redis", "health: Redis did not answer: %s", exc)
            return {"redis": {"ok": False, "error": f"Redis did not answer within {REDIS_TIMEOUT_SECONDS:g} s "
                                                    f"({type(exc).__name__})"}}


def check_database_and_reaper(using: str = "default") -> dict:
    checks = {"database": check_database(using)}
    if checks["database"]["ok"]:
        checks["reaper"] = check_reaper(using)
    else:
        checks["reaper"] = {"ok": False, "error": "unknown: the database did not answer"}
    return checks


# ---------------------------------------------------------------------------------------------
# The checkers: each check runs in a thread of its own, beside the requests


class Checker:
    """Runs `run` (which returns {check name: result}) over and over in a daemon thread while
    probes ask for it; keeps the latest results and when they were made."""

    def __init__(self, name: str, run: Callable[[], dict], names: tuple[str, ...]):
        self.name, self.run, self.names = name, run, names
        self.latest: tuple[dict, float] | None = None  # (results, time.monotonic() at the end)
        self.asked_at = 0.0
        self.started_at = 0.0  # when the thread last (re)started: probes until its first result wait
        self.done = threading.Condition()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def ask(self, now: float) -> None:
        with self.done:
            self.asked_at = now
            if self.thread is None:
                self.started_at = now
                self.thread = threading.Thread(target=self._loop, name=f"health-{self.name}", daemon=True)
                self.thread.start()
            elif not self.wake.is_set():  # paused for lack of probes: this one starts it again
                self.started_at = now
                self.wake.set()

    def _loop(self) -> None:
        self.wake.set()
        while True:
            with self.done:  # the same lock as ask(): a probe arriving now is never missed
                if time.monotonic() - self.asked_at > IDLE_AFTER_SECONDS:
                    self.wake.clear()
            self.wake.wait()
            try:
                results = self.run()
            except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
                log.exception("health: the %s check failed", self.name)
                results = {name: {"ok": False, "error": f"the check failed ({type(exc).__name__})"}
                           for name in self.names}
            finally:
                close_old_connections()  # a pooled connection goes back to the pool between runs
            for name, result in results.items():
                if result["ok"]:
                    passed(name)
            with self.done:
                self.latest = (results, time.monotonic())
                self.done.notify_all()
            time.sleep(REFRESH_SECONDS)

    def results(self, now: float) -> tuple[dict, float]:
        """Its results as of `now` and their age; results older than MAX_AGE_SECONDS (or none yet)
        are replaced by "unknown". While the checker starts, waits (bounded) for its first ones."""
        with self.done:
            deadline = self.started_at + FIRST_WAIT_SECONDS
            while (self.latest is None or self.latest[1] < self.started_at) and time.monotonic() < deadline:
                self.done.wait(deadline - time.monotonic())
            latest, started = self.latest, self.started_at
        if latest is None:  # its first run has not finished: waiting since the first probe
            waited = max(0.0, time.monotonic() - started)
            return {name: {"ok": False, "error": f"unknown: no answer for {waited:.1f} s"} for name in self.names}, waited
        results, finished = latest
        age = max(0.0, time.monotonic() - finished)
        if age > MAX_AGE_SECONDS:
            return ({name: {"ok": False, "error": f"unknown: no answer for {age:.1f} s"} for name in self.names},
                    age)
        return results, age


_checkers: list[Checker] | None = None
_checkers_lock = threading.Lock()


def checkers() -> list[Checker]:
    """This process's checkers, made on first use (a process that is never probed runs none)."""
    global _checkers
    with _checkers_lock:
        if _checkers is None:
            made = [Checker("database", check_database_and_reaper, ("database", "reaper"))]
            if settings.REDIS_URL:
                made.append(Checker("redis", RedisCheck(settings.REDIS_URL), ("redis",)))
            _checkers = made
        return _checkers


def report() -> dict:
    now = time.monotonic()
    every = checkers()
    for checker in every:
        checker.ask(now)
    checks, oldest = {}, 0.0
    for checker in every:
        results, age = checker.results(now)
        checks.update(results)
        oldest = max(oldest, age)
    ok = all(check["ok"] for check in checks.values())
    return {"status": "ok" if ok else "fail", "checks": checks, "checked_seconds_ago": round(oldest, 3)}


@require_GET
@never_cache
def healthz(request):
    body = report()
    return JsonResponse(body, status=200 if body["status"] == "ok" else 503)
