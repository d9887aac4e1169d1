"""`Job`: a lease held for the duration of a ``with`` block, renewed by a heartbeat thread.

    with client.hold(ttl_seconds=30, wait_seconds=5) as job:
        if job is None:               # no task became ready within 5 s
            ...
        for step in steps_from(job.task["payload"], job.task["checkpoint"]):
            if job.lost:              # someone took the task away: stop working
                break
            do(step)
            job.checkpoint({"done": step}, progress=...)   # saved at once; LeaseLost ends the block
        job.result = {...}            # committed on exit

On leaving the block:

- normally: the task is completed with ``job.result`` (default ``{}``);
- by an exception (``Exception``): the task is failed with the exception's text and a short
  traceback, the whole traceback kept in the failure's history row (back to QUEUED after a backoff while attempts remain, else FAILED), and the
  exception propagates; by ``KeyboardInterrupt``/``SystemExit``: the lease is released (the
  attempt is not counted) and the exception propagates;
- if the lease was lost (a renewal, checkpoint or the final complete got ``LeaseLost``):
  nothing is committed -- it cannot be, the task is someone else's now. A warning is logged,
  ``job.outcome`` is ``"lost"``, and a ``LeaseLost`` raised by the job's own calls inside the
  block is swallowed by the ``with`` statement (so ``job.checkpoint()`` and
  ``job.raise_if_lost()`` are natural stopping points). Any other exception still propagates.

One round trip per task: the complete of a `Client.hold` block also claims the next ready task
(``next`` on the complete: same ttl and queue, no wait), kept for the thread's next
``client.hold()``, which then holds it without a request (see `Client.hold`).

Batches: `JobBatch` (``client.hold_batch(10, ...)``) holds the leases of one batch claim, renewed
by one thread, and completes what its block did not finish in one request (`HoldBatch`).

After the block, ``job.outcome`` says what happened: ``"completed"``, ``"failed"``,
``"released"``, ``"paused"`` or ``"lost"``. The heartbeat thread is always stopped (and
joined) before the task is completed, failed, paused or released.

Network trouble: a renewal that cannot reach the server is retried within a second (the lease
stays ours until it expires). The final complete is retried a few times while the lease lasts
(a retry that meets its own earlier, applied completion counts as completed); if it still
cannot get through, the `TransportError` propagates and the task, never completed, comes back
after its lease expires -- delivery is at least once, so make the work idempotent.
"""
from __future__ import annotations

import functools
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from .errors import (
    ApprovalClosed,
    Blocked,
    Forbidden,
    InvalidTransition,
    LeaseLost,
    NotFound,
    TaskflowError,
    Taken,
    Terminal,
    TooLarge,
    TransportError,
    ValidationFailed,
)

__all__ = ["Hold", "HoldBatch", "Job", "JobBatch", "Outcome"]

log = logging.getLogger("taskflow_client")

MAX_ERROR_CHARS = 10_000
MAX_TRACEBACK_CHARS = 64 * 1024  # the API's cap on a failure's traceback
# A renewal that could not reach the server is tried again this soon (the TTL keeps running).
RETRY_AFTER_TRANSPORT_ERROR = 1.0
# Answers to a renewal that mean the task is no longer ours.
_GONE = (LeaseLost, NotFound, Terminal, InvalidTransition, Forbidden)
_UNSET = object()


def full_traceback(exc: BaseException) -> str:
    """The whole traceback (with chained exceptions), as Python prints it, for the failure's
    history row. Over the API's 64 KiB the oldest lines go: the frames nearest the error stay."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    return "[... cut ...]\n" + text[len(text) - MAX_TRACEBACK_CHARS + 14:]


def error_summary(exc: BaseException, frames: int = 8) -> str:
    """``Type: message`` first, then the last `frames` frames of the traceback (what `fail`
    records), cut to the API's 10,000 characters."""
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    tail = "".join(traceback.format_tb(exc.__traceback__)[-frames:]) if exc.__traceback__ else ""
    text = f"{head}\n\nTraceback (most recent call last):\n{tail}" if tail else head
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 15] + "\n[... cut ...]"


class Job:
    """A lease held for the duration of a ``with`` block, renewed every `interval` seconds
    (default ttl/3) by a background thread.

    On leaving the block:

    - normally: the task is completed with ``job.result`` (default ``{}``);
    - by an ``Exception``: the task is failed with its text and a short traceback (QUEUED
      again after a backoff while attempts remain, else FAILED) and the exception propagates;
      by ``KeyboardInterrupt``/``SystemExit``: the lease is released (the attempt is not
      counted) and the exception propagates;
    - if the lease was lost (``LeaseLost`` from a renewal, a checkpoint or the final
      complete): nothing is committed, a warning is logged, ``outcome`` is "lost", and a
      ``LeaseLost`` from the job's own calls inside the block is swallowed -- so
      ``job.checkpoint()`` and ``job.raise_if_lost()`` are natural stopping points;
    - after an explicit ``pause``/``release``/``complete``/``fail`` in the block: nothing more.

    The heartbeat thread is stopped and joined before the task is completed, failed, paused
    or released. See the module documentation for network failures (at-least-once delivery).

    Attributes and properties:
        lease:    the `Lease` (token, fence, expires_at).
        task:     the task dict as last returned by the server (payload, checkpoint, ...).
        task_id, payload, fence: shortcuts.
        lost:     True once the lease is known to be lost (``if job.lost: break`` between steps).
        lost_event: the `threading.Event` behind it, to sleep on (``job.lost_event.wait(5)``).
        result:   what is committed on a normal exit (default ``{}``; set it in the block).
        outcome:  None while held; then "completed", "failed", "released", "paused" or "lost".
        renewals: how many renewals succeeded so far.
        heartbeat_error: the last error a background renewal met (kept for diagnosis), or None.

    Methods: `checkpoint`, `raise_if_lost`, `ask`, `pause`, `release`, `complete`, `fail`.

    Make one with `Client.hold`, `Client.hold_task` or `Lease.hold`; it is its own context
    manager (``with lease.hold() as job``).
    """

    def __init__(self, lease, *, heartbeat: float | None = None):
        self.lease = lease
        self.lost_event = threading.Event()
        self.result: Any = {}
        self.outcome: str | None = None
        self.renewals = 0
        self.heartbeat_error: BaseException | None = None
        self.interval = heartbeat if heartbeat is not None else max(lease.ttl_seconds / 3.0, 0.05)
        self._lock = threading.RLock()  # one request about this lease at a time, in order
        self._stop = threading.Event()
        self._pending: dict[str, Any] = {}  # checkpoint/progress for the next heartbeat
        self._thread: threading.Thread | None = None
        self._lost_reason = ""
        # (ttl_seconds, queue) of the claim the complete makes for the next hold() (Client.hold
        # sets it), or None: complete alone.
        self.claims_next: tuple[float, str | None] | None = None

    # -- what the worker reads ---------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """True once the lease is known to be lost: stop working, nothing will be committed."""
        return self.lost_event.is_set()

    @property
    def task(self) -> dict[str, Any]:
        return self.lease.task

    @property
    def task_id(self) -> str:
        return self.lease.task_id

    @property
    def payload(self) -> Any:
        return self.lease.task.get("payload")

    @property
    def fence(self) -> int:
        return self.lease.fence

    def __repr__(self) -> str:
        state = self.outcome or ("lost" if self.lost_event.is_set() else "held")
        return f"<Job task={self.task_id!r} fence={self.fence} {state}>"

    # -- heartbeat ---------------------------------------------------------------------------

    def start(self) -> Job:
        """Start the heartbeat thread (the ``with`` statement does this)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name=f"taskflow-heartbeat-{self.task_id}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the heartbeat thread and wait for it (the ``with`` statement does this)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # At most one request is in flight; it ends within the client's timeout.
            thread.join(self.lease.client.timeout + 5)
            if thread.is_alive():
                log.warning("heartbeat of task %s did not stop in time", self.task_id)

    def _beat(self) -> None:
        try:
            self._beat_until_stopped()
        finally:
            self.lease.client.close_connection()  # this thread's keep-alive connection

    def _beat_until_stopped(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            wait = self._beat_once()
            if wait is None:
                return

    def _beat_once(self) -> float | None:
        """One renewal by the heartbeat: the seconds until the next one, or None when the lease
        is gone (stop beating)."""
        wait = self.interval
        try:
            self._renew(from_heartbeat=True)
        except TransportError as exc:
            self.heartbeat_error = exc
            wait = min(self.interval, RETRY_AFTER_TRANSPORT_ERROR)
            log.warning("renewing task %s failed (%s); trying again in %.1f s", self.task_id, exc, wait)
        except _GONE:
            return None  # _renew marked the job lost
        except (ValidationFailed, TooLarge) as exc:
            # A checkpoint the server refuses: drop it (the worker sees heartbeat_error)
            # and keep the lease alive.
            self.heartbeat_error = exc
            log.error("task %s: the server refused a checkpoint: %s", self.task_id, exc)
            wait = 0
        except TaskflowError as exc:
            self.heartbeat_error = exc
            log.error("renewing task %s refused: %s", self.task_id, exc)
        except RuntimeError:
            return None  # finished meanwhile (in a batch: by the worker's own call)
        except Exception as exc:  # never let the thread die silently
            self.heartbeat_error = exc
            log.exception("heartbeat of task %s", self.task_id)
        return wait

    def _renew(self, *, from_heartbeat: bool = False, checkpoint: Any = _UNSET,
               progress: float | None = None) -> None:
        with self._lock:
            if from_heartbeat and self._stop.is_set():
                return  # the job is finishing: its own call decides now
            if self.outcome is not None:
                raise RuntimeError(f"task {self.task_id} is no longer held ({self.outcome})")
            if self.lost_event.is_set():
                raise LeaseLost(self._lost_reason or f"the lease on task {self.task_id} was lost")
            pending, self._pending = self._pending, {}
            if checkpoint is not _UNSET:
                pending["checkpoint"] = checkpoint
            if progress is not None:
                pending["progress"] = progress
            try:
                self.lease.renew(checkpoint=pending.get("checkpoint"), progress=pending.get("progress"))
            except _GONE as exc:
                self._mark_lost(exc)
                raise
            except TransportError:
                for name, value in pending.items():  # not saved: try again with the next beat
                    self._pending.setdefault(name, value)
                raise
            self.renewals += 1

    def _mark_lost(self, exc: BaseException) -> None:
        if not self.lost_event.is_set():
            self._lost_reason = str(exc)
            self.lost_event.set()
            log.warning("lost the lease on task %s: %s", self.task_id, exc)

    # -- what the worker calls ---------------------------------------------------------------

    def checkpoint(self, data: Any = None, progress: float | None = None, *, wait: bool = True) -> None:
        """Save `data` (any JSON; None leaves the saved checkpoint as it is) and/or `progress`
        (0..1) on the task, so that a resume (after a pause) can continue from it.

        ``wait=True`` (default): renew now and return once saved; raises `LeaseLost` when the
        lease is gone (the ``with`` statement swallows it and ends the block).
        ``wait=False``: just remember it; the next heartbeat saves it (the latest wins)."""
        if wait:
            self._renew(checkpoint=_UNSET if data is None else data, progress=progress)
            return
        with self._lock:
            if data is not None:
                self._pending["checkpoint"] = data
            if progress is not None:
                self._pending["progress"] = progress

    @property
    def inputs(self) -> dict[str, Any]:
        """The results of the task's dependencies, by id (see `Lease.inputs`)."""
        return self.lease.inputs

    @property
    def notes(self) -> list[dict[str, Any]]:
        """What earlier attempts and staff wrote on the task, oldest first (see `Lease.notes`)."""
        return self.lease.notes

    def note(self, text: str) -> dict[str, Any]:
        """Leave a note on the task for whoever holds it next (it stays across attempts)."""
        with self._lock:
            self.raise_if_lost()
            return self.lease.note(text)

    def ask(self, question: str, *, form: dict[str, Any] | None = None, approvers: list[str] | None = None,
            timeout_seconds: int | None = None, on_timeout: str = "fail", checkpoint: Any = None,
            poll_seconds: float = 2.0, wait_seconds: float | None = None) -> dict[str, Any]:
        """Ask a person and wait for the answer without holding the task (`Lease.ask`): the
        heartbeat stops, the lease is given up with the question (no slot or resource is held
        while a person thinks), and once answered the task is claimed back and held again (a
        new lease and fence; the heartbeat restarts). Returns the answer: the approval
        (``approved``, ``values``, ``comment``, ``answered_by``); a rejection is returned too,
        for the worker to act on (``job.fail(...)``, another path).

        When the question closes without an answer to act on (timed out with "fail" or
        "cancel", its task cancelled) or another agent took the task meanwhile, the job is lost:
        `LeaseLost`, which the ``with`` statement swallows (nothing more is committed)."""
        self.stop()
        with self._lock:
            self._refuse_unless_held()
            try:
                lease = self.lease.ask(question, form=form, approvers=approvers, timeout_seconds=timeout_seconds,
                                       on_timeout=on_timeout, checkpoint=checkpoint, poll_seconds=poll_seconds,
                                       wait_seconds=wait_seconds)
            except (ApprovalClosed, Taken, Blocked, *_GONE) as exc:
                self._mark_lost(exc)
                raise LeaseLost(str(exc)) from exc
            except BaseException:
                # Refused before asking (a bad form) or interrupted while waiting: beat again (a
                # lease given up with its question is then found lost by the first beat).
                self._beat_again()
                raise
            self.lease = lease
        self._beat_again()
        return lease.approval or {}

    def _beat_again(self) -> None:
        """A new heartbeat thread, after `stop` (for the lease held now)."""
        self._stop, self._thread = threading.Event(), None
        self.start()

    def _refuse_unless_held(self) -> None:
        if self.outcome is not None:
            raise RuntimeError(f"task {self.task_id} is no longer held ({self.outcome})")
        self.raise_if_lost()

    def raise_if_lost(self) -> None:
        """Raise `LeaseLost` if the lease is gone (the ``with`` statement swallows it)."""
        if self.lost_event.is_set():
            raise LeaseLost(self._lost_reason or f"the lease on task {self.task_id} was lost")

    def _finish(self, outcome: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self.stop()
        with self._lock:
            self._refuse_unless_held()
            try:
                task = call()
            except _GONE as exc:
                self._mark_lost(exc)
                raise
            self.outcome = outcome
            self.lease.task = task
            return task

    def pause(self, checkpoint: Any) -> dict[str, Any]:
        """Pause the task now: the lease is given up and `checkpoint` kept, so that
        ``client.hold_task(id, resume=True)`` (or ``client.resume``) continues from it.
        Leaving the block afterwards commits nothing more. Returns the PAUSED task."""
        return self._finish("paused", lambda: self.lease.pause(checkpoint))

    def release(self) -> dict[str, Any]:
        """Give the task back to the queue now, without counting the attempt."""
        return self._finish("released", self.lease.release)

    def snooze(self, seconds: float) -> dict[str, Any]:
        """Give the task back to the queue now, not claimable for `seconds`, without counting
        the attempt (outcome "released"). Leaving the block afterwards commits nothing more."""
        return self._finish("released", lambda: self.lease.snooze(seconds))

    def complete(self, result: Any = _UNSET) -> dict[str, Any]:
        """Complete now with `result` (default: ``job.result``) instead of on exit."""
        if result is not _UNSET:
            self.result = result
        if self.claims_next is None:
            return self._finish("completed", lambda: self.lease.complete(self.result))
        return self._finish("completed", lambda: self._complete_and_claim(self.result, uuid.uuid4().hex))

    def _complete_and_claim(self, result: Any, request_id: str) -> dict[str, Any]:
        """Complete, claiming the next task for the client's next hold() in the same request."""
        ttl_seconds, queue = self.claims_next
        client = self.lease.client
        task, following = client.complete_and_claim(self.task_id, self.lease.token, result, ttl_seconds=ttl_seconds,
                                                    queue=queue, request_id=request_id)
        if following is not None:
            client._keep_next(following, queue)
        return task

    def fail(self, error: str, *, retryable: bool = True, traceback: str | None = None) -> dict[str, Any]:
        """Fail now with `error` (and `traceback`, kept in the task's history); ``retryable=False``
        makes it FAILED even with attempts left (a permanent error). Leaving the block
        afterwards commits nothing more."""
        return self._finish("failed", lambda: self.lease.fail(
            error[:MAX_ERROR_CHARS], retryable=retryable,
            traceback=None if traceback is None else traceback[-MAX_TRACEBACK_CHARS:]))

    # -- the with statement ------------------------------------------------------------------

    def __enter__(self) -> Job:  # noqa: PYI034 (typing.Self is 3.11+; the client runs on older Pythons)
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Settle the lease for the block that ends; True swallows the block's exception (only
        a LeaseLost about this job's own lease, once it is known to be lost)."""
        self.stop()
        if self.outcome is not None:  # completed, failed, paused or released inside the block
            return self._is_own_lost_lease(exc)
        if isinstance(exc, LeaseLost) and (exc.task or {}).get("id") == self.task_id:
            self._mark_lost(exc)  # the worker's own call found this lease gone
        if self.lost_event.is_set():  # nothing can be committed: the task is someone else's now
            if exc is None or self._is_own_lost_lease(exc):
                self._say_lost()
                return True
            self._say_lost(f"; the block's {exc_type.__name__} could not be recorded")
            return False
        if exc is None:
            self._complete_on_exit()
        elif isinstance(exc, Exception):
            self._settle("failed", lambda: self.lease.fail(error_summary(exc), traceback=full_traceback(exc)))
        else:  # KeyboardInterrupt, SystemExit, ...: not the task's fault
            self._settle("released", self.lease.release)
        return False

    def _is_own_lost_lease(self, exc: BaseException | None) -> bool:
        """A LeaseLost about this job's lease (one that names no task counts), once lost is set."""
        return (isinstance(exc, LeaseLost) and self.lost_event.is_set()
                and (exc.task or {}).get("id", self.task_id) == self.task_id)

    def _say_lost(self, extra: str = "") -> None:
        self.outcome = "lost"
        log.warning("task %s: lease lost (%s); nothing was committed%s", self.task_id,
                    self._lost_reason or "lease_lost", extra)

    def _settle(self, outcome: str, call: Callable[[], dict[str, Any]]) -> None:
        """Fail or release on the way out of a block that raised; never masks its exception."""
        try:
            self.lease.task = call()
            self.outcome = outcome
        except _GONE as exc:
            self._mark_lost(exc)
            self._say_lost()
        except (TaskflowError, TransportError) as exc:
            log.error("task %s: could not record the outcome (%s); its lease will expire", self.task_id, exc)

    def _complete_on_exit(self) -> None:
        result = {} if self.result is None else self.result
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            self._settle("failed", functools.partial(self.lease.fail, f"the result is not JSON: {exc}",
                                                     retryable=False))
            raise
        # A complete whose answer was lost in transit may have been applied: try again while the
        # lease lasts, and recognise our own completion in the refusal that follows.
        delays = [0.2, 0.5, 1.0, 2.0]
        deadline = time.monotonic() + self.lease.ttl_seconds
        sent = False
        request_id = uuid.uuid4().hex  # the next claim's, the same in every copy of the request
        while True:
            try:
                if self.claims_next is None:
                    self.lease.task = self.lease.complete(result)
                else:
                    self.lease.task = self._complete_and_claim(result, request_id)
                self.outcome = "completed"
                return
            except LeaseLost as exc:
                done = exc.task or {}
                sent = sent or self.lease.client._http.resent()  # a copy sent on a fresh connection
                if sent and done.get("stage") == "COMPLETED" and done.get("result") == result:
                    self.lease.task = done
                    self.outcome = "completed"
                    if self.claims_next is not None:  # its claim may have been made too
                        self.lease.client._keep_request(request_id, *self.claims_next)
                    return
                self._mark_lost(exc)
                self._say_lost()
                return
            except (ValidationFailed, TooLarge) as exc:
                self._settle("failed", functools.partial(self.lease.fail, f"the result was refused: {exc}",
                                                         retryable=False))
                raise
            except _GONE as exc:
                self._mark_lost(exc)
                self._say_lost()
                return
            except TransportError:
                sent = True
                if not delays or time.monotonic() + delays[0] > deadline:
                    raise
                time.sleep(delays.pop(0))


class Hold:
    """The context manager returned by `Client.hold` / `Client.hold_task`: on entering it
    claims with `client` (the next ready task, or `task_id`, or resumes `task_id`) and wraps
    the lease in a `Job`, or gives None when `Client.hold` found no work; on exit the job
    settles the lease. `Client.hold`'s job completes with the next claim in the same request
    (`claim_next`), and its next hold() takes that lease without a request."""

    def __init__(self, client, ttl_seconds: float, *, task_id: str | None = None, resume: bool = False,
                 queue: str | None = None, wait_seconds: float = 0, heartbeat: float | None = None,
                 claim_next: bool = False):
        self.client = client
        self.ttl_seconds = ttl_seconds
        self.task_id = task_id
        self.resume = resume
        self.queue = queue
        self.wait_seconds = wait_seconds
        self.heartbeat = heartbeat
        self.claim_next = claim_next and task_id is None
        self.job: Job | None = None

    def _claim(self):
        """The lease this block holds: None only for `Client.hold` with no work ready."""
        if self.task_id is None:
            kept, request_id = self.client._take_next(self.ttl_seconds, self.queue)
            if kept is not None:
                return kept  # claimed by the last hold()'s complete: no request now
            return self.client.claim_next(self.ttl_seconds, queue=self.queue, wait_seconds=self.wait_seconds,
                                          request_id=request_id)
        if self.resume:
            return self.client.resume(self.task_id, self.ttl_seconds)
        return self.client.claim(self.task_id, self.ttl_seconds)

    def __enter__(self) -> Job | None:
        lease = self._claim()
        if lease is None:
            return None
        self.job = Job(lease, heartbeat=self.heartbeat)
        if self.claim_next:
            self.job.claims_next = (self.ttl_seconds, self.queue)
        return self.job.__enter__()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.job is None:
            return False
        return self.job.__exit__(exc_type, exc, tb)


# -- batches -----------------------------------------------------------------------------------


class Outcome:
    """One item of `Client.complete_batch`'s answer: ``task_id``; ``ok`` (True: completed);
    ``task`` (the COMPLETED task, or the task as it is when the board says so with a refusal);
    ``error`` (the `TaskflowError` a single complete would have raised, e.g. `LeaseLost`; None
    when ok)."""

    __slots__ = ("error", "ok", "task", "task_id")

    def __init__(self, task_id: str, ok: bool, task: dict[str, Any] | None, error: TaskflowError | None):
        self.task_id = task_id
        self.ok = ok
        self.task = task
        self.error = error

    def __repr__(self) -> str:
        return f"<Outcome {self.task_id!r} {'ok' if self.ok else self.error.code if self.error else 'refused'}>"


class JobBatch(list):
    """The jobs of one batch claim (`Client.hold_batch`): a list of `Job`, one lease each, all
    renewed by ONE background thread (every `interval` seconds, default ttl/3). Each job has
    the holder's methods (`checkpoint`, `complete`, `fail`, `release`, `pause`, ``lost``);
    what the block does not finish is completed with ``job.result`` in one request when the
    block ends (see `HoldBatch`).

    ``batch.run(handler)`` runs ``handler(job)`` on each job still held, in order: its return
    value becomes ``job.result`` (None: ``{}``); an exception fails that job alone (its text
    and traceback, as ``hold()`` does) and the next job runs; a `LeaseLost` of that job marks it
    lost. ``KeyboardInterrupt`` propagates (the block's end releases the rest)."""

    def __init__(self, jobs: Iterable[Job], heartbeat: float | None = None):
        super().__init__(jobs)
        ttl = min((job.lease.ttl_seconds for job in self), default=60.0)
        self.interval = heartbeat if heartbeat is not None else max(ttl / 3.0, 0.05)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> JobBatch:
        if self._thread is None and self:
            self._thread = threading.Thread(target=self._beat, name=f"taskflow-heartbeat-batch-{self[0].task_id}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self[0].lease.client.timeout * len(self) + 5)

    def _beat(self) -> None:
        try:
            wait = self.interval
            while not self._stop.wait(wait):
                wait = self.interval
                for job in self:
                    if self._stop.is_set():
                        return
                    if job.outcome is not None or job.lost:
                        continue
                    beat = job._beat_once()
                    if beat is not None:
                        wait = min(wait, beat)
        finally:
            if self:
                self[0].lease.client.close_connection()

    def held(self) -> list[Job]:
        """The jobs not finished and not lost."""
        return [job for job in self if job.outcome is None and not job.lost]

    def run(self, handler: Callable[[Job], Any]) -> None:
        for job in self.held():
            try:
                result = handler(job)
            except LeaseLost as exc:
                if (exc.task or {}).get("id", job.task_id) != job.task_id:
                    job._settle("failed", functools.partial(job.lease.fail, error_summary(exc),
                                                            traceback=full_traceback(exc)))
                else:
                    job._mark_lost(exc)
                    job._say_lost()
                continue
            except Exception as exc:
                if job.outcome is None and not job.lost:
                    job._settle("failed", functools.partial(job.lease.fail, error_summary(exc),
                                                            traceback=full_traceback(exc)))
                log.warning("task %s failed: %s", job.task_id, exc)
                continue
            if job.outcome is None and not job.lost and result is not None:
                job.result = result


class HoldBatch:
    """The context manager returned by `Client.hold_batch`: on entering it claims up to
    `max_tasks` tasks in one request and gives a `JobBatch` (empty when no work came within
    `wait_seconds`); its heartbeat thread renews them all. On leaving the block, for the jobs
    not finished inside it (not completed, failed, paused, released or lost):

    - normally: they are completed with their ``job.result`` in ONE request
      (`Client.complete_batch`); a job whose lease was lost meanwhile gets outcome "lost", one
      whose result the board refuses (or that is not JSON) is failed for good, alone;
    - by an ``Exception``: each is failed with its text and traceback, and it propagates; by
      ``KeyboardInterrupt``/``SystemExit``: each is released, and it propagates.

    A batch complete that cannot reach the board is sent again a few times while the leases
    last (an item meeting its own earlier completion counts as completed), as ``hold()`` does."""

    def __init__(self, client, max_tasks: int, ttl_seconds: float, *, queue: str | None = None,
                 wait_seconds: float = 0, heartbeat: float | None = None):
        self.client = client
        self.max_tasks = max_tasks
        self.ttl_seconds = ttl_seconds
        self.queue = queue
        self.wait_seconds = wait_seconds
        self.heartbeat = heartbeat
        self.batch: JobBatch | None = None

    def __enter__(self) -> JobBatch:
        leases = self.client.claim_batch(self.max_tasks, self.ttl_seconds, queue=self.queue,
                                         wait_seconds=self.wait_seconds)
        self.batch = JobBatch([Job(lease) for lease in leases], heartbeat=self.heartbeat)
        return self.batch.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        batch = self.batch
        if batch is None:
            return False
        batch.stop()
        for job in batch:
            job._stop.set()
            if isinstance(exc, LeaseLost) and (exc.task or {}).get("id") == job.task_id:
                job._mark_lost(exc)
        for job in batch:
            if job.lost and job.outcome is None:
                job._say_lost()
        held = batch.held()
        own_lost = isinstance(exc, LeaseLost) and any(job.lost and (exc.task or {}).get("id") == job.task_id
                                                      for job in batch)
        if exc is None or own_lost:
            self._complete(held)
            return own_lost
        if isinstance(exc, Exception):
            for job in held:
                job._settle("failed", functools.partial(job.lease.fail, error_summary(exc),
                                                        traceback=full_traceback(exc)))
        else:
            for job in held:
                job._settle("released", job.lease.release)
        return False

    def _complete(self, jobs: list[Job]) -> None:
        results: dict[str, Any] = {}
        ready = []
        for job in jobs:
            result = {} if job.result is None else job.result
            try:
                json.dumps(result, allow_nan=False)
            except (TypeError, ValueError) as exc:
                job._settle("failed", functools.partial(job.lease.fail, f"the result is not JSON: {exc}",
                                                        retryable=False))
                continue
            results[job.task_id] = result
            ready.append(job)
        delays = [0.2, 0.5, 1.0, 2.0]
        deadline = time.monotonic() + min((job.lease.ttl_seconds for job in ready), default=0)
        sent = False
        while ready:
            try:
                outcomes = self.client.complete_batch([(job, results[job.task_id]) for job in ready])
            except TransportError:
                sent = True
                if not delays or time.monotonic() + delays[0] > deadline:
                    raise
                time.sleep(delays.pop(0))
                continue
            sent = sent or self.client._http.resent()  # a copy sent on a fresh connection
            for job, outcome in zip(ready, outcomes):
                self._settle_item(job, outcome, results[job.task_id], sent)
            return

    @staticmethod
    def _settle_item(job: Job, outcome: Outcome, result: Any, sent: bool) -> None:
        if outcome.ok:
            job.lease.task = outcome.task or job.lease.task
            job.outcome = "completed"
            return
        error = outcome.error
        done = outcome.task or {}
        if isinstance(error, LeaseLost) and sent and not done:
            # A copy of a batch whose answer was lost: was this item completed by the first one?
            # (The batch's per-item refusal does not carry the task.)
            try:
                done = job.lease.client.get(job.task_id)
            except (TaskflowError, TransportError):
                done = {}
        if isinstance(error, LeaseLost) and sent and done.get("stage") == "COMPLETED" and done.get("result") == result:
            job.lease.task = done
            job.outcome = "completed"
        elif isinstance(error, (ValidationFailed, TooLarge)):
            job._settle("failed", functools.partial(job.lease.fail, f"the result was refused: {error}",
                                                    retryable=False))
        elif isinstance(error, _GONE):
            job._mark_lost(error)
            job._say_lost()
        else:
            log.error("task %s: the batch complete was refused (%s); its lease will expire", job.task_id, error)
