"""Bulk jobs: an operator action on every task a filter matches (issue 33, item 1).

    check_request   the filter, the action and its value, the reason: checked as client input
                    (InvalidRequest naming the first bad part; nothing read)
    count           how many tasks it would act on (the board's "cancel 12,408 tasks in queue
                    ci-*" before the operator confirms); nothing written
    create          the job's row, with the ids and versions of the tasks it acts on read at
                    once (`items`: frozen then; a task that appears later is not in it)
    run             take the job (a compare-and-swap on its row) and move each task with the
                    engine's operator verb held to the version read: a task that changed since
                    is refused by the verb (version_conflict) and counted `lost`, never
                    overwritten; one the action does not apply to (no attempt left, blocked,
                    unchanged, gone) is counted `skipped` with its reason. Progress is written
                    to the row every PROGRESS_TASKS tasks or PROGRESS_SECONDS; a stop asked
                    meanwhile is seen there. check() runs after, its problem count kept.
    stop            pending: stopped at once; running: stopping, and its runner stops at its
                    next progress write
    start_in_thread the server that accepted a job starts it at once in a thread of its own
    run_due         the reaper's loop (manage.py reap --loop) runs pending jobs nobody took, and
                    takes over a job whose runner stopped writing its heartbeat (a crashed
                    process) for RUNNER_STALE_SECONDS: it goes on from the last progress written

Job states, each move one conditional update of the job's row (the `-- from -> to` comments):

    pending -> running -> done            (stop) running -> stopping -> stopped
    pending -> stopped                    running -> failed (an error that is not the store's)

Which tasks an action applies to is decided when the ids are read (ACTIONS' stages): cancelling
"queue:ci-*" acts on the unfinished ones, and says how many more matched (`matching`). A task
that changes stage afterwards is a lost race like any change. Every move records the actor as
"NAME (bulk ID)", so a runner that takes over a job counts a move its crashed predecessor made
but did not write down as done, not as lost.
"""
from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import F

from board.engine import clock, errors, listing, scopes, search, selectors, transitions
from board.engine.inputs import is_valid_task_id, reason_text
from board.engine.lifecycle import Stage
from board.engine.limits import MAX_BULK_TASKS, MAX_NAME_CHARS, MAX_OWNER_CHARS, MAX_TITLE_CHARS
from board.engine.stores import TransactionConflict, store
from board.models import BulkJob, Task, TaskEvent

log = logging.getLogger("board.bulk")

PAGE_TASKS = 50  # items read and moved together (their versions read in one query)
WORKERS = 4  # threads moving a page's tasks, each one verb call at a time (PostgreSQL commits them in parallel)
PROGRESS_TASKS = 200  # a progress write (and a look for a stop) at least every this many tasks
PROGRESS_SECONDS = 0.5  # and at least this often (between pages)
RUNNER_STALE_SECONDS = 30.0  # a running job whose heartbeat is older is taken over
FINISHED_SHOWN_SECONDS = 60.0  # the live board's tailer reports a job this long after it finished

DONE, SKIPPED, LOST = "done", "skipped", "lost"


@dataclass(frozen=True)
class Action:
    verb: str  # the history's verb its moves write
    stages: tuple[str, ...]  # the stages it applies to (the others are left out of `total`)
    words: str  # how the board says it: "cancel 12 tasks"


_LIVE = (Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED, Stage.FAILED)
ACTIONS: dict[str, Action] = {
    "retry": Action("requeue", (Stage.FAILED,), "retry"),  # requeue with reset_attempts
    "requeue": Action("requeue", (Stage.FAILED, Stage.PAUSED), "requeue"),
    "cancel": Action("cancel", _LIVE, "cancel"),
    "pause": Action("force_pause", (Stage.RUNNING,), "pause"),
    "admit": Action("admit", (Stage.PENDING,), "admit"),
    "release-stale": Action("force_release", (Stage.RUNNING,), "release the expired leases of"),
    "set-priority": Action("edit", _LIVE, "set the priority of"),
    "add-tag": Action("edit", _LIVE, "tag"),
    # A copy of each finished task, linked by replay_of (transitions.replay); the original is
    # not touched, so nothing is held to its version: a copy is made once per job and task (its
    # id is derived from both, and a runner resuming a crashed job finds it made).
    "replay": Action("create", (Stage.COMPLETED, Stage.FAILED, Stage.CANCELLED), "run again as new"),
}
FILTER_KEYS = ("search", "text", "owner", "queue", "stage", "tags")
_QUEUE_GLOB = "^[A-Za-z0-9*?][A-Za-z0-9._:*?-]{0,99}$"


@dataclass(frozen=True)
class Request:
    """A checked bulk request."""
    action: str
    filter: dict  # as given, without empty parts
    filters: listing.Filters
    stages: tuple[str, ...]  # the stages it acts on: the action's, narrowed by the filter's
    params: dict
    reason: str


def check_request(filter: Any, action: Any, reason: Any = "", priority: Any = None, tag: Any = None) -> Request:
    if action not in ACTIONS:
        raise errors.InvalidRequest(f"unknown action {action!r}; one of {', '.join(ACTIONS)}", field="action")
    reason_text(reason)
    params: dict = {}
    if action == "set-priority":
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31 - 1:
            raise errors.InvalidRequest("set-priority needs priority, a 32-bit integer", field="priority")
        params["priority"] = priority
    elif priority is not None:
        raise errors.InvalidRequest("priority is given with set-priority only", field="priority")
    if action == "add-tag":
        if not isinstance(tag, str) or not search.TAG_RE.fullmatch(tag):
            raise errors.InvalidRequest("add-tag needs tag (1-50 letters, digits and ._:/- starting with a letter or "
                                        "digit)", field="tag")
        params["tag"] = tag
    elif tag is not None:
        raise errors.InvalidRequest("tag is given with add-tag only", field="tag")
    given, filters = check_filter(filter)
    stages = tuple(s for s in ACTIONS[action].stages if not filters.stages or s in filters.stages)
    return Request(action, given, filters, stages, params, reason)


def check_filter(raw: Any) -> tuple[dict, listing.Filters]:
    """The filter as given (its empty parts dropped) and as listing's Filters. A queue with `*`
    or `?` is a pattern (`ci-*`), tags must all be carried, stage is one stage or a list."""
    if not isinstance(raw, dict):
        raise errors.InvalidRequest("filter must be an object", field="filter")
    unknown = sorted(set(raw) - set(FILTER_KEYS))
    if unknown:
        raise errors.InvalidRequest(f"filter: unknown part {unknown[0]!r}; known: {', '.join(FILTER_KEYS)}",
                                    field="filter")
    given = {k: v for k, v in raw.items() if v not in (None, "", [])}
    for name in ("search", "text", "owner", "queue"):
        if name in given and not isinstance(given[name], str):
            raise errors.InvalidRequest(f"filter.{name} must be text", field="filter")
    stages = given.get("stage", [])
    stages = [stages] if isinstance(stages, str) else stages
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise errors.InvalidRequest("filter.stage must be a stage or a list of stages", field="filter")
    stages = [s.upper() for s in stages]
    tags = search.tags_list(given.get("tags"), "filter.tags")
    queue = given.get("queue", "").strip()
    terms = [given.get("search", "").strip()] + [f"tag:{t}" for t in tags]
    if queue and any(c in queue for c in "*?"):
        if not re.fullmatch(_QUEUE_GLOB, queue):
            raise errors.InvalidRequest(f"invalid queue pattern {queue!r}", field="filter")
        terms.append(f"queue:{queue}")
        queue = ""
    text, owner = given.get("text", "").strip(), given.get("owner", "").strip()
    if len(text) > MAX_TITLE_CHARS or len(owner) > MAX_OWNER_CHARS:
        raise errors.InvalidRequest("filter.text or filter.owner is too long", field="filter")
    if queue and not is_valid_task_id(queue):
        raise errors.InvalidRequest(f"invalid queue name {queue!r}", field="filter")
    line = " ".join(t for t in terms if t)
    try:
        filters = listing.check_filters(stages, queue or None, None, text or None, owner.lower() or None,
                                        search=line or None)
    except errors.InvalidRequest as exc:
        raise errors.InvalidRequest(f"filter: {exc}", field="filter") from None
    if not (filters.stages or filters.queue or filters.text or filters.owner_part or filters.search):
        raise errors.InvalidRequest('a bulk action needs a filter (every task: {"search": "id:*"})', field="filter")
    return given, filters


def _rows(request: Request, scope: scopes.Scope, using: str):
    """The tasks the request acts on (a queryset): matching, in a stage its action applies to,
    and for release-stale with an expired lease (by the store's clock)."""
    return applicable(listing.matching(request.filters, scope=scope, using=using), request.action, request.stages,
                      using)


def applicable(rows, action: str, stages: tuple[str, ...] | None = None, using: str = "default"):
    """Of the tasks `rows` (a queryset), those `action` applies to (its stages, or `stages`)."""
    rows = rows.filter(stage__in=ACTIONS[action].stages if stages is None else stages)
    if action == "release-stale":
        rows = rows.filter(lease_expires_at__lte=clock.now(using))
    return rows


def describe_request(request: Request, total: int) -> str:
    """What the board asks the operator to confirm: "cancel 12,408 tasks in queue ci-*"."""
    f = request.filter
    value = (f" to {request.params['priority']}" if "priority" in request.params
             else f" with {request.params['tag']}" if "tag" in request.params else "")
    words = [f"{ACTIONS[request.action].words} {total:,} task{'' if total == 1 else 's'}{value}"]
    if f.get("queue"):
        words.append(f"in queue {f['queue']}")
    if f.get("stage"):
        stage = f["stage"]
        words.append(f"in stage {stage if isinstance(stage, str) else ' or '.join(stage)}")
    if f.get("owner"):
        words.append(f"held by *{f['owner']}*")
    if f.get("tags"):
        words.append(f"tagged {', '.join(f['tags'])}")
    if f.get("text"):
        words.append(f"whose id or title contains {f['text']!r}")
    if f.get("search"):
        only_queue = re.fullmatch(r"\s*queue:(\S+)\s*", f["search"])
        words.append(f"in queue {only_queue.group(1)}" if only_queue and not f.get("queue")
                     else f"matching {f['search']}")
    return " ".join(words)


def count(request: Request, *, scope: scopes.Scope = None, using: str = "default") -> dict:
    """How many tasks `request` would act on, and how many the filter matches in any stage."""
    total = _rows(request, scope, using).count()
    matching = listing.count_tasks(request.filters, scope=scope, using=using)
    return {"action": request.action, "total": total, "matching": matching,
            "description": describe_request(request, total)}


def create(request: Request, *, actor: str, scope: scopes.Scope = None, using: str = "default") -> BulkJob:
    """The job's row (pending), its tasks' ids and versions read in one query; TooLarge when they
    are more than MAX_BULK_TASKS (nothing written)."""
    matching = listing.count_tasks(request.filters, scope=scope, using=using)
    return _create(_rows(request, scope, using), request.action, request.params, request.reason, request.filter,
                   matching, actor, using)


def create_for_rows(rows, action: str, *, reason: str = "", priority: Any = None, tag: Any = None,
                    described: str, actor: str, using: str = "default") -> BulkJob:
    """A job on the tasks of a queryset (the admin's selection, or every task its changelist's
    filters match), those `action` applies to; `described`: the filter in words, for the job."""
    request = check_request({"search": "id:*"}, action, reason, priority, tag)  # the action's parts checked
    return _create(applicable(rows, action, using=using), action, request.params, reason, {"admin": described},
                   rows.count(), actor, using)


def _create(rows, action, params, reason, filter, matching, actor, using) -> BulkJob:
    items = [[pk, version] for pk, version in rows.order_by("pk").values_list("pk", "version")[:MAX_BULK_TASKS + 1]]
    if len(items) > MAX_BULK_TASKS:
        raise errors.TooLarge(f"the filter matches more than {MAX_BULK_TASKS:,} tasks the action applies to: narrow it")
    with store(using).write_transaction():
        return BulkJob.objects.using(using).create(
            actor=actor, action=action, params=params, reason=reason, filter=filter, state=BulkJob.PENDING,
            total=len(items), matching=max(matching, len(items)), items=items, created_at=clock.now(using))


def get(job_id: int, using: str = "default") -> BulkJob:
    job = BulkJob.objects.using(using).filter(pk=job_id).defer("items").first()
    if job is None:
        raise errors.NotFound(f"no bulk job with id {job_id}")
    return job


def summary(job: BulkJob) -> dict:
    """The job as the API and the live board's "bulk" frame tell it."""
    return {"id": job.pk, "action": job.action, "params": job.params, "reason": job.reason, "filter": job.filter,
            "actor": job.actor, "state": job.state, "total": job.total, "matching": job.matching, "done": job.done,
            "skipped": job.skipped, "lost": job.lost, "skipped_reasons": job.skipped_reasons or {},
            "problems": job.problems, "error": job.error, "created_at": job.created_at,
            "started_at": job.started_at, "finished_at": job.finished_at}


def stop(job_id: int, using: str = "default") -> BulkJob:
    """Ask a job to stop: a pending one stops at once, a running one at its next progress write.
    A job that has finished is answered as it is."""
    with store(using).write_transaction():
        # -- pending -> stopped
        BulkJob.objects.using(using).filter(pk=job_id, state=BulkJob.PENDING).update(
            state=BulkJob.STOPPED, finished_at=clock.now(using), version=F("version") + 1)
        # -- running -> stopping
        BulkJob.objects.using(using).filter(pk=job_id, state=BulkJob.RUNNING).update(
            state=BulkJob.STOPPING, version=F("version") + 1)
    return get(job_id, using)


# -- running a job ------------------------------------------------------------------------------


def runner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _update(using: str, match: dict, **values) -> int:
    """One conditional update of a job's row (0: it was not as `match` says)."""
    try:
        with store(using).write_transaction():
            return BulkJob.objects.using(using).filter(**match).update(version=F("version") + 1, **values)
    except TransactionConflict:
        return 0


def take(job_id: int, runner: str, using: str = "default") -> BulkJob | None:
    """The job, now this runner's: a pending one, or an active one whose runner's heartbeat is
    older than RUNNER_STALE_SECONDS; None when it is neither or another runner took it first."""
    now = clock.now(using)
    job = BulkJob.objects.using(using).filter(pk=job_id).first()
    if job is None or not _takeable(job, now):
        return None
    state = BulkJob.STOPPING if job.state == BulkJob.STOPPING else BulkJob.RUNNING
    # -- pending -> running, or a stale runner's running/stopping -> the same, this runner's
    if not _update(using, {"pk": job_id, "version": job.version}, state=state, runner=runner, heartbeat_at=now,
                   started_at=job.started_at or now):
        return None
    # A job another runner started: its moves past the last progress it wrote may be made.
    job.resumed = job.started_at is not None
    job.state, job.runner, job.heartbeat_at, job.started_at = state, runner, now, job.started_at or now
    return job


def _takeable(job: BulkJob, now) -> bool:
    if job.state == BulkJob.PENDING:
        return True
    stale = job.heartbeat_at is None or job.heartbeat_at < now - timedelta(seconds=RUNNER_STALE_SECONDS)
    return job.state in (BulkJob.RUNNING, BulkJob.STOPPING) and stale


def run(job_id: int, *, runner: str | None = None, using: str = "default") -> BulkJob | None:
    """Take the job and run it to its end (done, or stopped when asked); None when another runner
    has it. A store error leaves it to be taken over (its heartbeat ages).

    The items go a page (PAGE_TASKS) at a time: the page's current versions are read in one
    query, a task already changed is lost without a call (its verb would refuse it: nothing is
    written either way), and the others are moved by WORKERS threads, each task one verb call
    held to its version. The progress is written (and a stop looked for) between pages."""
    runner = runner or runner_name()
    job = take(job_id, runner, using)
    if job is None:
        return None
    actor = f"{job.actor} (bulk {job.pk})"
    counts = {"done": job.done, "skipped": job.skipped, "lost": job.lost,
              "skipped_reasons": dict(job.skipped_reasons or {})}
    position = job.position
    state = job.state
    written_at, unwritten = time.monotonic(), 0
    workers = _Workers(lambda item: act(job, actor, item[0], item[1], using, resumed=job.resumed), using)
    try:
        while state == BulkJob.RUNNING and position < len(job.items):
            page = job.items[position:position + PAGE_TASKS]
            now_at = dict(Task.objects.using(using).filter(pk__in=[t for t, _ in page]).values_list("pk", "version"))
            moving = [(t, v) for t, v in page if now_at.get(t) == v]
            outcomes = workers.map(moving)
            for task_id, version in page:
                if now_at.get(task_id) == version:
                    continue
                if task_id not in now_at:
                    outcomes.append((SKIPPED, "not_found"))
                elif job.resumed and _moved_by(actor, task_id, version, using):
                    outcomes.append((DONE, None))
                else:
                    outcomes.append((LOST, None))
            for outcome, why in outcomes:
                counts[outcome] += 1
                if why:
                    counts["skipped_reasons"][why] = counts["skipped_reasons"].get(why, 0) + 1
            position += len(page)
            unwritten += len(page)
            if unwritten >= PROGRESS_TASKS or time.monotonic() - written_at >= PROGRESS_SECONDS:
                state = _progress(job, runner, position, counts, using)
                written_at, unwritten = time.monotonic(), 0
        if state == "lost":
            return None
        return _finish(job, runner, position, counts, using)
    except Exception as exc:
        if isinstance(exc, DatabaseError):
            log.warning("bulk job %s: the store failed at task %d; it is taken over later: %s", job_id, position, exc)
            return None
        log.exception("bulk job %s failed", job_id)
        # -- running/stopping -> failed (this runner's)
        _update(using, {"pk": job_id, "runner": runner, "state__in": BulkJob.ACTIVE}, state=BulkJob.FAILED,
                error=f"{type(exc).__name__}: {exc}"[:2000], position=position, finished_at=clock.now(using),
                **counts)
        return get(job_id, using)
    finally:
        workers.close()


class _Workers:
    """WORKERS threads (each with its own connection, closed when they end) that apply `call` to
    the items of a page; `map` returns the results in the items' order, or raises the first
    exception one of them raised (the page is then not counted: it is done again on takeover)."""

    def __init__(self, call, using: str):
        self.call, self.using = call, using
        self.tasks: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._work, name="bulk-worker", daemon=True) for _ in range(WORKERS)]
        for thread in self.threads:
            thread.start()

    def _work(self):
        try:
            while True:
                task = self.tasks.get()
                if task is None:
                    return
                index, item, results, done = task
                try:
                    results[index] = self.call(item)
                except BaseException as exc:  # handed to map's caller
                    results[index] = exc
                done.release()
        finally:
            connections[self.using].close()

    def map(self, items: list) -> list:
        results: list = [None] * len(items)
        done = threading.Semaphore(0)
        for index, item in enumerate(items):
            self.tasks.put((index, item, results, done))
        for _ in items:
            done.acquire()
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def close(self):
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join()


def _progress(job: BulkJob, runner: str, position: int, counts: dict, using: str) -> str:
    """Write the progress if the job is still this runner's and running: RUNNING; STOPPING when a
    stop was asked (the progress is then written by _finish); "lost" when another runner has it."""
    now = clock.now(using)
    # -- running -> running (progress, heartbeat)
    if _update(using, {"pk": job.pk, "runner": runner, "state": BulkJob.RUNNING}, position=position,
               heartbeat_at=now, **counts):
        return BulkJob.RUNNING
    current = BulkJob.objects.using(using).filter(pk=job.pk).values("state", "runner").first()
    if current and current["runner"] == runner and current["state"] == BulkJob.STOPPING:
        return BulkJob.STOPPING
    log.warning("bulk job %s: another runner took it over", job.pk)
    return "lost"


def _finish(job: BulkJob, runner: str, position: int, counts: dict, using: str) -> BulkJob | None:
    finished = position >= len(job.items)
    problems = len(selectors.problems(using=using))
    ended = {"position": position, "problems": problems, "finished_at": clock.now(using), **counts}
    # -- running -> done, or stopping -> stopped (or done, when the stop came after the last task)
    if finished and _update(using, {"pk": job.pk, "runner": runner, "state__in": BulkJob.ACTIVE[1:]},
                            state=BulkJob.DONE, **ended):
        return get(job.pk, using)
    if _update(using, {"pk": job.pk, "runner": runner, "state": BulkJob.STOPPING}, state=BulkJob.STOPPED, **ended):
        return get(job.pk, using)
    if _update(using, {"pk": job.pk, "runner": runner, "state": BulkJob.RUNNING}, state=BulkJob.STOPPED, **ended):
        return get(job.pk, using)  # (a runner that took over a stopping job with nothing left)
    return None


def act(job: BulkJob, actor: str, task_id: str, version: int, using: str,
        resumed: bool = True) -> tuple[str, str | None]:
    """One task: the action's verb held to `version`. (DONE, None), (LOST, None) or (SKIPPED, why).
    `resumed`: the job was started by another runner, which may have moved this task already."""
    try:
        moved = _move(job, actor, task_id, version, using)
    except errors.VersionConflict:
        # Changed since it was read: by someone else (lost), or by this job before a crash.
        return (DONE, None) if resumed and _moved_by(actor, task_id, version, using) else (LOST, None)
    except errors.NotFound:
        return SKIPPED, "not_found"
    except errors.InvalidTransition as exc:
        return SKIPPED, {"reset_attempts": "no_attempt_left", "dedup_key": "dedup_key_held"}.get(
            exc.field, exc.code)
    except errors.BoardError as exc:
        return SKIPPED, exc.code
    if moved is None or (job.action != "replay" and moved.version == version):
        return SKIPPED, "unchanged"
    return DONE, None


def _moved_by(actor: str, task_id: str, version: int, using: str) -> bool:
    """Whether this job's actor made the task's move from `version` (before a runner's crash)."""
    return TaskEvent.objects.using(using).filter(task_id=task_id, version=version + 1, actor=actor).exists()


def _move(job: BulkJob, actor: str, task_id: str, version: int, using: str):
    common = {"actor": actor, "version": version, "using": using}
    reason = {"reason": job.reason}
    match job.action:
        case "retry":
            return transitions.requeue(task_id, reset_attempts=True, **common, **reason)
        case "requeue":
            return transitions.requeue(task_id, **common, **reason)
        case "cancel":
            return transitions.cancel(task_id, **common, **reason)
        case "pause":
            return transitions.force_pause(task_id, **common, **reason)
        case "admit":
            return transitions.admit(task_id, **common, **reason)
        case "release-stale":
            return transitions.force_release(task_id, **common, **reason)
        case "set-priority":
            return transitions.edit(task_id, priority=job.params["priority"], **common)
        case "add-tag":
            tag = job.params["tag"]
            task = Task.objects.using(using).only("pk", "version", "tags").filter(pk=task_id).first()
            if task is None:
                raise errors.NotFound(f"no task with id {task_id!r}")
            if task.version != version:
                raise errors.VersionConflict(f"task {task_id} is at version {task.version}, not {version}")
            if tag in (task.tags or []):
                return None
            # Held to the version whose tags were read: the list written is that one plus the tag.
            return transitions.edit(task_id, tags=[*(task.tags or []), tag], **common)
        case "replay":
            return _replay(job, actor, task_id, using)
    raise AssertionError(job.action)


def replay_id(job: BulkJob, task_id: str) -> str:
    """The id of the copy this job makes of `task_id`: `<id>.r<job>` (an id too long for that
    keeps its start and a digest of the whole, so that two originals never share a copy)."""
    suffix = f".r{job.pk}"
    if len(task_id) + len(suffix) <= MAX_NAME_CHARS:
        return task_id + suffix
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:16]
    return f"{task_id[:MAX_NAME_CHARS - len(suffix) - 17]}-{digest}{suffix}"


def _replay(job: BulkJob, actor: str, task_id: str, using: str):
    new_id = replay_id(job, task_id)
    try:
        return transitions.replay(task_id, actor=actor, new_id=new_id, using=using)
    except errors.DuplicateId:
        made = Task.objects.using(using).filter(pk=new_id, replay_of=task_id).first()
        if made is None:
            raise
        return made  # made by this job before its runner stopped


# -- where jobs run ---------------------------------------------------------------------------


def start_in_thread(job_id: int, using: str = "default") -> threading.Thread:
    """Run the job now in a thread of this process (the server that accepted it). If the reaper's
    loop took it first, this thread finds it taken and ends."""
    def work():
        try:
            run(job_id, using=using)
        except Exception:
            log.exception("bulk job %s: its thread failed", job_id)
        finally:
            connections[using].close()

    thread = threading.Thread(target=work, name=f"bulk-{job_id}", daemon=True)
    thread.start()
    return thread


def run_due(*, using: str = "default") -> list[int]:
    """The reaper's pass: run every pending job, and every active one whose runner went quiet, one
    after the other. The ids of the jobs this pass ran."""
    now = clock.now(using)
    stale = now - timedelta(seconds=RUNNER_STALE_SECONDS)
    candidates = list(BulkJob.objects.using(using).filter(state__in=BulkJob.ACTIVE).order_by("pk")
                      .values_list("pk", "state", "heartbeat_at"))
    ran = []
    for pk, state, heartbeat in candidates:
        if state == BulkJob.PENDING or heartbeat is None or heartbeat < stale:
            if run(pk, using=using) is not None:
                ran.append(pk)
    return ran


def recent(using: str = "default", seconds: float = FINISHED_SHOWN_SECONDS) -> list[BulkJob]:
    """The jobs the live board reports: active ones, and those finished in the last `seconds`."""
    since = clock.now(using) - timedelta(seconds=seconds)
    active = BulkJob.objects.using(using).filter(state__in=BulkJob.ACTIVE)
    finished = BulkJob.objects.using(using).filter(finished_at__gte=since)
    return sorted({job.pk: job for job in [*active.defer("items"), *finished.defer("items")]}.values(),
                  key=lambda job: job.pk)


def latest(count: int, *, actor: str | None = None, using: str = "default") -> list[BulkJob]:
    """The `count` most recent jobs (of `actor` when given), newest first."""
    rows = BulkJob.objects.using(using).defer("items").order_by("-pk")
    return list((rows.filter(actor=actor) if actor is not None else rows)[:count])
