"""`Client`: one method per endpoint of the TaskFlow board's JSON API, and `Lease`, what a
claim gives you. Standard library only.

Connections are kept alive, one per thread (a `Client` may be shared by threads, e.g. a worker
and its heartbeat). A request that meets a connection the server had already closed while it
was idle is sent again once on a fresh connection; every other network failure raises
`TransportError` at once, with no retry, because its outcome is unknown -- except a claim
(`claim_next`, `claim`): each call sends a fresh `request_id` (a uuid4) and, after a transport
error, sends the same request once more. The server answers a copy of a claim that already
took effect with the lease it made (same task, token and fence), so a claim whose answer was
lost does not leave its task held by nobody until the lease expires.

Every request carries a W3C `traceparent` header (`trace_headers`): the calling program's
current OpenTelemetry span when it has one, else a fresh trace; a board that traces
(docs/tracing.md) makes its spans of the request children of it.
"""
from __future__ import annotations

import atexit
import builtins
import http.client
import json
import os
import secrets
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .errors import ApprovalClosed, TaskflowError, TooManyWaiters, TransportError, ValidationFailed, error_from_body
from .hold import Hold, HoldBatch, Job, JobBatch, Outcome

__all__ = ["Client", "JobBatch", "Lease", "Outcome", "Queue", "RateKey", "Schedule"]

DEFAULT_TIMEOUT = 30.0
USER_AGENT = "taskflow-client/1"
BUSY_RETRY_SECONDS = 1.0  # the server's Retry-After for a refused wait
_ERROR_BODY_PREVIEW = 500
MAX_PAGE = 500  # the most tasks or events the server sends in one page
MAX_BATCH = 100  # the most tasks one batch claim or batch complete takes


def _new_request_id() -> str:
    """A claim's id, sent again with its retry (unguessable: while its lease lives it gets the
    lease's token back)."""
    return uuid.uuid4().hex


def _refuses_field(exc: ValidationFailed, name: str) -> bool:
    """The board refused the request because it does not know the body field `name` (a board
    older than the feature): nothing was done."""
    return any(isinstance(d, dict) and list(d.get("loc") or [])[:1] == [name] and d.get("type") == "extra_forbidden"
               for d in (exc.details or []))


def _release_at_exit(ref) -> None:
    client = ref()
    if client is not None:
        client._release_every_next()


def trace_headers() -> dict[str, str]:
    """The W3C trace context a request carries (``traceparent``, and ``tracestate`` when the
    span has one), so that the board's spans of the request join the caller's trace.

    When the calling program uses OpenTelemetry and a span is current (the MCP server's tool
    call, an agent's own span), its trace and span ids; otherwise a fresh trace of its own,
    sampled, so that a board that traces records the request. OpenTelemetry is never imported
    here: a program with a current span has already imported its API."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is not None:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            headers = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"}
            if context.trace_state:
                headers["tracestate"] = context.trace_state.to_header()
            return headers
    trace_id = secrets.randbits(128) or 1  # all zeros is invalid
    span_id = secrets.randbits(64) or 1
    return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}


def _parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 time from the API as an aware datetime ('Z' accepted on every Python 3)."""
    if not value:
        return None
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)  # noqa: UP017 (datetime.UTC is 3.11+; the client runs on older Pythons)


def _seconds(retry_after: str | None) -> float | None:
    """A Retry-After header's delay in seconds (the board sends whole seconds), or None."""
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else None
    except ValueError:
        return None


def _with_fields(task: dict[str, Any] | Sequence[dict[str, Any]],
                 fields: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
    """Copies of the task dict(s) with `fields` set (the caller's dicts are left as they were);
    ValueError when a task already names one of them with another value."""
    def one(item: dict[str, Any]) -> dict[str, Any]:
        for name, value in fields.items():
            if name in item and item[name] != value:
                raise ValueError(f"task {item.get('id', item.get('title'))!r} names {name}={item[name]!r}, "
                                 f"not {value!r} as the call does")
        return {**item, **fields}
    return one(task) if isinstance(task, dict) else [one(item) for item in task]


class Lease:
    """A lease on a task: what `Client.claim_next`, `claim`, `resume` and `renew` return.

    Attributes:
        task:        the task as the server returned it (dict: id, title, payload, checkpoint,
                     stage, attempts, ...). Refreshed by `renew`.
        task_id:     the task's id.
        token:       the lease token; proves you hold the task. Shown only to you: keep it out
                     of logs (``repr(lease)`` omits it).
        fence:       rises with every new holder of the task; pass it to downstream systems so
                     they can refuse writes from an older holder.
        expires_at:  when the lease ends unless renewed (aware datetime, the server's clock).
        ttl_seconds: the TTL it was claimed or last renewed with (the default for `renew`).
        client:      the `Client` that made it; the holder's verbs below go through it.
        inputs:      the results of the task's dependencies, by id ({} for a task without any;
                     up to 1 MiB of JSON in all: the ids of those left out are in
                     `inputs_omitted`, read them with `client.get(id)["result"]`).
        notes:       the task's newest notes, oldest first (dicts: text, author, by_holder,
                     attempt, fence, at): what earlier attempts and staff wrote. [] if none.
        approval:    the task's last answered approval (a dict: question, approved, values,
                     comment, answered_by, answered_at, ...), or None if it never asked one.

    The holder's verbs are methods: `renew`, `complete`, `fail`, `pause`, `release`, `note`;
    `hold()` wraps the lease in a `Job` that renews it in the background (see
    `taskflow_client.Job`).
    """

    def __init__(self, client: Client, data: dict[str, Any], ttl_seconds: float):
        self.client = client
        self.ttl_seconds = ttl_seconds
        self._update(data)
        # The claim's hand-offs (a renew's answer has none: they stay as the claim gave them).
        lease = data["lease"]
        self.inputs: dict[str, Any] = lease.get("inputs") or {}
        self.inputs_omitted: builtins.list[str] = lease.get("inputs_omitted") or []
        self.notes: builtins.list[dict[str, Any]] = lease.get("notes") or []
        self.approval: dict[str, Any] | None = lease.get("approval")

    def _update(self, data: dict[str, Any]) -> None:
        lease = data["lease"]
        self.task: dict[str, Any] = data["task"]
        self.token: str = lease["token"]
        self.fence: int = lease["fence"]
        self.expires_at: datetime | None = _parse_time(lease["expires_at"])
        self._raw_expires_at = lease["expires_at"]

    @property
    def task_id(self) -> str:
        return self.task["id"]

    def as_dict(self) -> dict[str, Any]:
        """The API's claim shape: ``{"task": {...}, "lease": {"token", "fence", "expires_at"}}``."""
        return {"task": self.task,
                "lease": {"token": self.token, "fence": self.fence, "expires_at": self._raw_expires_at}}

    def __repr__(self) -> str:  # never the token
        return f"<Lease task={self.task_id!r} fence={self.fence} expires_at={self._raw_expires_at}>"

    def renew(self, ttl_seconds: float | None = None, *, checkpoint: Any = None,
              progress: float | None = None) -> Lease:
        """Extend this lease to now + `ttl_seconds` (default: its current TTL), optionally
        saving `checkpoint` and/or `progress` (0..1). Updates this object and returns it.
        Raises `LeaseLost` if the lease expired or was taken over."""
        ttl = self.ttl_seconds if ttl_seconds is None else ttl_seconds
        renewed = self.client.renew(self.task_id, self.token, ttl, checkpoint=checkpoint, progress=progress)
        self.ttl_seconds = ttl
        self._update(renewed.as_dict())
        return self

    def complete(self, result: Any = None, *, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        """Commit `result` (any JSON value; None is sent as {}); returns the COMPLETED task.
        `usage`: what the attempt used since its last report (`Client.renew` says the fields)."""
        return self.client.complete(self.task_id, self.token, result, usage=usage)

    def note(self, text: str) -> dict[str, Any]:
        """Add a note to the task, as its holder: it stays with the task, and the next claim
        of it carries it (``lease.notes``). Returns the note."""
        return self.client.add_note(self.task_id, text, token=self.token)

    def request_approval(self, question: str, *, form: dict[str, Any] | None = None,
                         approvers: Sequence[str] | None = None, timeout_seconds: int | None = None,
                         on_timeout: str = "fail", checkpoint: Any = None) -> dict[str, Any]:
        """Ask a person `question` and give this lease up at once (see `Client.request_approval`);
        returns the approval. `ask` does this and waits for the answer."""
        return self.client.request_approval(self.task_id, self.token, question, form=form, approvers=approvers,
                                            timeout_seconds=timeout_seconds, on_timeout=on_timeout,
                                            checkpoint=checkpoint)["approval"]

    def ask(self, question: str, *, form: dict[str, Any] | None = None, approvers: Sequence[str] | None = None,
            timeout_seconds: int | None = None, on_timeout: str = "fail", checkpoint: Any = None,
            poll_seconds: float = 2.0, wait_seconds: float | None = None) -> Lease:
        """Ask a person and wait for the answer without holding the task: the lease is given
        up with the question (no slot or resource is held while a person thinks), the answer is
        awaited (`Client.wait_for_answer`), then the task is claimed back (it is kept 60 s for
        this agent). Returns the new Lease; its ``approval`` is the answer (``approved``,
        ``values``, ``comment``). `ApprovalClosed` when it timed out with "fail"/"cancel" or its
        task was cancelled; `Taken` when another agent claimed it first (answered long ago)."""
        approval = self.request_approval(question, form=form, approvers=approvers, timeout_seconds=timeout_seconds,
                                         on_timeout=on_timeout, checkpoint=checkpoint)
        return self.client.claim_answered(self.task_id, approval["id"], self.ttl_seconds, poll_seconds=poll_seconds,
                                          wait_seconds=wait_seconds)

    def holds(self, resource: str) -> bool:
        """Whether this lease still holds `resource` (one the task declared): False once it
        ended or was taken over. Ask before a write another holder must not race."""
        return self.client.resource_holder(resource, self.task_id, self.fence)["holds"]

    def complete_and_claim(self, result: Any = None, *, ttl_seconds: float | None = None,
                           queue: str | None = None, wait_seconds: float = 0) -> tuple[dict[str, Any], Lease | None]:
        """Commit `result` and claim the next ready task in the same request (ttl: this lease's
        by default); returns ``(the COMPLETED task, the next Lease or None)``."""
        return self.client.complete_and_claim(self.task_id, self.token, result,
                                              ttl_seconds=self.ttl_seconds if ttl_seconds is None else ttl_seconds,
                                              queue=queue, wait_seconds=wait_seconds)

    def fail(self, error: str, *, retryable: bool = True, traceback: str | None = None) -> dict[str, Any]:
        """Record a failed attempt (see `Client.fail`); returns the task."""
        return self.client.fail(self.task_id, self.token, error, retryable=retryable, traceback=traceback)

    def pause(self, checkpoint: Any) -> dict[str, Any]:
        """Give the lease up and keep `checkpoint` for a later resume; returns the PAUSED task."""
        return self.client.pause(self.task_id, self.token, checkpoint)

    def release(self) -> dict[str, Any]:
        """Give the task back to the queue without counting the attempt; returns the task."""
        return self.client.release(self.task_id, self.token)

    def snooze(self, seconds: float) -> dict[str, Any]:
        """Give the task back to the queue, not claimable for `seconds` (see `Client.snooze`)."""
        return self.client.snooze(self.task_id, self.token, seconds)

    def hold(self, *, heartbeat: float | None = None):
        """A `Job` holding this lease: ``with lease.hold() as job: ...`` renews it in the
        background and completes/fails it on exit, like `Client.hold`."""
        return Job(self, heartbeat=heartbeat)


class _Unchanged:
    """The default of `Client.change_queue`'s `concurrency`: leave the limit as it is (None is a
    value there: no limit)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()


class Queue:
    """A queue of the board, by name: what `Client.queue(name)` returns. It holds nothing but
    the name; each method asks the board (so two handles of one queue never disagree).

    Reading needs any key that may read the queue (a key limited to some queues sees only
    those: another queue is `NotFound`); changing it (`pause`, `resume`, `set_concurrency`)
    needs an operator key (``create_agent_key --operator``), else `Forbidden`. Each change
    returns the queue as it is after it, and goes to its `history` with the key's name and
    `reason`; a change that changes nothing (pausing a paused queue) is not recorded.
    """

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    def get(self) -> dict[str, Any]:
        """The queue now: ``name``, ``concurrency`` (None: no limit), ``running``, ``paused``,
        ``paused_by``, ``paused_reason``, ``paused_at``, ``depth`` (tasks per stage) and
        ``oldest_queued_seconds``. A queue nobody set and no task names is answered too: no
        limit, not paused, no tasks."""
        return self.client.get_queue(self.name)

    def pause(self, reason: str = "") -> dict[str, Any]:
        """Operator: no new claim takes a task of this queue (claim-next passes over them, a
        claim by id is `Blocked`); leases already held renew and finish as usual."""
        return self.client.change_queue(self.name, paused=True, reason=reason)

    def resume(self, reason: str = "") -> dict[str, Any]:
        """Operator: claims take this queue's tasks again."""
        return self.client.change_queue(self.name, paused=False, reason=reason)

    def set_concurrency(self, concurrency: int | None, reason: str = "") -> dict[str, Any]:
        """Operator: at most `concurrency` (1-10,000) of this queue's tasks RUNNING at once;
        None removes the limit. A limit below the running count stops new claims until there
        is room; the running tasks go on."""
        return self.client.change_queue(self.name, concurrency=concurrency, reason=reason)

    def set_rate(self, count: int | None, per_seconds: int | None = None, reason: str = "") -> dict[str, Any]:
        """Operator: at most `count` claims of this queue's tasks start in any `per_seconds`
        (1: per second, 60: per minute, 3600: per hour), spaced evenly; ``set_rate(None)``
        removes the rate. A claim finding only work the rate holds back gets None, and a
        waiting `claim_next` / `hold()` sleeps until the rate opens."""
        rate = None if count is None else {"count": count, "per_seconds": per_seconds}
        return self.client.change_queue(self.name, rate=rate, reason=reason)

    def set_budget(self, *, tokens: int | None = None, cost_usd: float | None = None, per: str | None = "day",
                   reason: str = "") -> dict[str, Any]:
        """Operator: the usage this queue's attempts may report per window (`per`: "day",
        "month" or "total"; UTC): `tokens` (input + output) and/or `cost_usd`. At it, claims of
        the queue's tasks are refused (`BudgetExhausted`) until the window ends or the budget is
        raised; ``set_budget(per=None)`` removes it. The queue's ``spent`` says the window's use."""
        budget = None if per is None else {"tokens": tokens, "cost_usd": cost_usd, "per": per}
        return self.client.change_queue(self.name, budget=budget, reason=reason)

    def history(self) -> builtins.list[dict[str, Any]]:
        """Who changed the queue's settings, newest first (the last 200): ``actor``,
        ``reason``, ``changes`` (``{setting: [before, after]}``), ``at``."""
        return self.client.queue_history(self.name)


class RateKey:
    """A rate key of the board, by name: what `Client.rate_key(name)` returns. Tasks of any
    queue that name it (``create(..., rate_key=name)``) share its rate: a provider's requests
    per minute. Like `Queue`, it holds nothing but the name; setting its rate needs an operator
    key that is not limited to some queues (`Forbidden` otherwise)."""

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"<RateKey {self.name!r}>"

    def set_rate(self, count: int | None, per_seconds: int | None = None, reason: str = "") -> dict[str, Any]:
        """Operator: at most `count` claims of the tasks naming this key start in any
        `per_seconds` (1: per second, 60: per minute, 3600: per hour), spaced evenly, whatever
        their queues; ``set_rate(None)`` removes the rate. Returns the key: ``name``, ``rate``,
        ``next_claim_at``. A claim finding only work the rate holds back gets None, and a
        waiting `claim_next` / `hold()` sleeps until the rate opens."""
        rate = None if count is None else {"count": count, "per_seconds": per_seconds}
        return self.client.change_rate_key(self.name, rate=rate, reason=reason)


class FairnessKey:
    """A fairness key of the board, by name: what `Client.fairness_key(name)` returns. Tasks of any
    queue that name it (``create(..., fairness_key=name)``: a plan, a customer) take turns with
    other keys' tasks, and may share a budget. Like `Queue`, it holds nothing but the name;
    setting its budget needs an operator key that is not limited to some queues (`Forbidden`
    otherwise)."""

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"<FairnessKey {self.name!r}>"

    def get(self) -> dict[str, Any]:
        """The key now: ``name``, ``weight``, ``budget`` (``{"tokens", "cost_usd", "per"}`` or
        None), ``spent`` (the window's ``{"tokens", "cost_usd"}``, None without a budget),
        ``budget_exhausted`` and ``budget_exhausted_until``. `NotFound` for a key the board has
        no row for (no create gave it a weight, no budget was set: weight 1, no budget)."""
        return self.client.get_fairness_key(self.name)

    def set_budget(self, *, tokens: int | None = None, cost_usd: float | None = None, per: str | None = "day",
                   reason: str = "") -> dict[str, Any]:
        """Operator: the usage the attempts of the tasks naming this key may report per window
        (`per`: "day", "month" or "total"; UTC), whatever their queues: `tokens` (input +
        output) and/or `cost_usd`. At it, claim-next passes the key's tasks by in every queue and
        a claim of one by id is refused (`BudgetExhausted`) until the window ends or the budget
        is raised; ``set_budget(per=None)`` removes it. Returns the key (see `get`)."""
        budget = None if per is None else {"tokens": tokens, "cost_usd": cost_usd, "per": per}
        return self.client.change_fairness_key(self.name, budget=budget, reason=reason)


class Schedule:
    """A schedule of the board (a periodic task), by name: what `Client.schedule(name)` returns.
    Like `Queue`, it holds nothing but the name; each method asks the board.

    At each tick of its cron (five fields, read in its time zone) the board creates one task from
    its template, with the id ``NAME:YYYYMMDDTHHMMZ`` (the tick in UTC), exactly once per tick.
    After downtime only the latest missed tick fires (the others are counted in
    ``skipped_ticks``). Reading needs any key that may read its template's queue; creating,
    changing and deleting need an operator key (`Forbidden` otherwise). Every method returns the
    schedule as a dict (see `get`), except `delete`.
    """

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"<Schedule {self.name!r}>"

    def create(self, cron: str, task: dict[str, Any], *, timezone: str = "UTC",
               paused: bool = False) -> dict[str, Any]:
        """Operator: create it. `cron`: five fields (``"0 2 * * *"``, ``"*/15 * * * MON-FRI"``);
        `task`: the template of each tick's task (``title`` required; ``description``,
        ``payload``, ``queue``, ``priority``, ``max_retries``, ``concurrency_key``,
        ``concurrency_limit``); `timezone`: an IANA name. Sent again with the same settings it
        returns the schedule; other settings under its name raise `DuplicateName`. An invalid
        cron or an unknown time zone raises `ValidationFailed` (nothing created)."""
        return self.client.create_schedule(self.name, cron, task, timezone=timezone, paused=paused)

    def get(self) -> dict[str, Any]:
        """The schedule now: ``name``, ``cron``, ``timezone``, ``task`` (the template, every
        field filled in), ``paused``, ``next_tick_at`` (None while paused), ``next_ticks`` (the
        next 5), ``last_tick_at``, ``last_task_id``, ``skipped_ticks``, ``created_by``,
        ``created_at``, ``updated_at``. `NotFound` if there is none."""
        return self.client.get_schedule(self.name)

    def update(self, *, cron: str | None = None, timezone: str | None = None,
               task: dict[str, Any] | None = None) -> dict[str, Any]:
        """Operator: change what is given (`task` replaces the whole template, from the next
        tick on). A new cron or time zone starts from its first tick after now."""
        return self.client.change_schedule(self.name, cron=cron, timezone=timezone, task=task)

    def pause(self) -> dict[str, Any]:
        """Operator: fire nothing until resumed."""
        return self.client.change_schedule(self.name, paused=True)

    def resume(self) -> dict[str, Any]:
        """Operator: fire again, from the first tick after now (the ticks of the pause are not fired)."""
        return self.client.change_schedule(self.name, paused=False)

    def delete(self) -> None:
        """Operator: delete it; the tasks it created stay. `NotFound` if there is none."""
        self.client.delete_schedule(self.name)


class _Http:
    """Keep-alive HTTP/1.1 connections, one per thread (and per process after a fork)."""

    def __init__(self, base_url: str, timeout: float):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/prefix], not {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        prefix = parts.path.rstrip("/")
        self.prefix = prefix if prefix.endswith("/api") else prefix + "/api"
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self, timeout: float):
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid != os.getpid():
            conn = None  # inherited through fork: the socket is shared with the parent
        if conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=timeout)
            self._local.conn, self._local.pid, self._local.used = conn, os.getpid(), False
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def resent(self) -> bool:
        """Whether this thread's last request was sent twice (its kept-alive connection was
        found closed): then its first copy may have been applied."""
        return getattr(self._local, "resent", False)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes | None,
                timeout: float):
        url = self.prefix + path
        for attempt in range(2):
            self._local.resent = attempt > 0  # sent again: the first copy may have taken effect
            conn = self._connection(timeout)
            reused = self._local.used
            try:
                conn.request(method, url, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if reused and attempt == 0:
                    continue  # the server closed this idle keep-alive connection: send again
                raise TransportError(f"{method} {url}: connection lost: {exc!r}") from exc
            except socket.timeout as exc:  # noqa: UP041 (not TimeoutError's subclass before 3.10)
                self.close()
                raise TransportError(f"{method} {url}: no answer within {timeout:g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise TransportError(f"{method} {url}: {exc!r}") from exc
            self._local.used = True
            if response.will_close:
                self.close()
            return response.status, response.getheader("Content-Type", ""), data, response.getheader("Retry-After")
        raise AssertionError("unreachable")


class Client:
    """A client of the TaskFlow board's JSON API.

    ``Client(base_url, key, timeout=30)``

    - `base_url`: the server, e.g. ``"http://127.0.0.1:8000"`` (the ``/api`` prefix is added
      unless the URL already ends with it).
    - `key`: an agent API key (``manage.py create_agent_key NAME``); sent as a Bearer token.
      The agent's name on the board comes from the key.
    - `timeout`: seconds to wait for the network on each request (a waiting `claim_next`
      gets `wait_seconds` on top).
    - `capabilities`: narrow every claim of this client to these of its key's capabilities
      (labels such as ``"gpu"``; default: all of the key's). A task's ``requires`` must all be
      among them; naming one the key lacks is refused (`Forbidden`).

    Every method raises a `TaskflowError` subclass when the board refuses (``NotFound``,
    ``Taken``, ``LeaseLost``, ...; nothing changed) and `TransportError` when no definitive
    answer came back. Values that are not JSON (NaN, Infinity, arbitrary objects) raise
    ValueError/TypeError before anything is sent. Methods:

    - tasks: `create`, `get`, `list` / `iter_tasks`, `events` / `iter_events`
    - claiming: `claim_next`, `claim`, `resume` -> `Lease`; `hold`, `hold_task` -> context
      managers that renew in the background and complete or fail on exit (see `Job`)
    - the holder's verbs: `renew`, `release`, `complete`, `fail`, `pause` (also on `Lease`);
      `complete_and_claim`, `fail_and_claim`, `release_and_claim`: the verb and the next claim
      in one request (``hold()`` completes that way: one round trip per task)
    - batches: `claim_batch` -> leases, `complete_batch` -> `Outcome` per item; `hold_batch`
      -> `JobBatch` (a context manager); `work(handler)`, the batch worker loop
    - operators (a key created with --operator): `admit`, `requeue`, `cancel`
    - queues: `queues`, `queue(name)` -> `Queue` (`get`, `pause`, `resume`,
      `set_concurrency`, `history`); also `get_queue`, `change_queue`, `queue_history`
    - schedules: `schedules`, `schedule(name)` -> `Schedule` (`create`, `get`, `update`,
      `pause`, `resume`, `delete`); also `create_schedule`, `get_schedule`,
      `change_schedule`, `delete_schedule`
    - health: `check`

    Example::

        client = Client("http://127.0.0.1:8000", os.environ["TASKFLOW_KEY"])
        client.create({"id": "t1", "title": "say hi", "payload": {"n": 1}})
        with client.hold(ttl_seconds=30) as job:
            if job is not None:
                job.result = {"n": job.task["payload"]["n"] + 1}
    """

    def __init__(self, base_url: str, key: str | None, timeout: float = DEFAULT_TIMEOUT, *,
                 capabilities: list[str] | None = None):
        self.base_url = base_url
        self.timeout = timeout
        # Sent with every claim (next, batch, by id, resume, a finishing move's next): {} sends
        # none, and the board takes the key's own.
        self._narrowing: dict[str, Any] = {} if capabilities is None else {"capabilities": list(capabilities)}
        self._key = key
        self._http = _Http(base_url, timeout)
        # complete-and-claim: the lease each thread's last hold() claimed for its next hold()
        self._next_lock = threading.Lock()
        self._next_leases: dict[int, tuple[Lease, str | None, float]] = {}
        self._next_requests: dict[int, tuple[str, float, str | None, float]] = {}
        self._at_exit = False
        self._next_refused = False  # a board before issue 34: no `next` on complete
        self._batches_refused = False  # ... and no batch claims

    def __repr__(self) -> str:  # never the key
        return f"<taskflow_client.Client {self.base_url}>"

    def close(self) -> None:
        """Give back the lease this thread's last ``hold()`` claimed for the next one, if any
        (`release_next`), and close this thread's keep-alive connection (others close when
        their thread ends)."""
        try:
            self.release_next()
        finally:
            self._http.close()

    def close_connection(self) -> None:
        """Close this thread's keep-alive connection only (a heartbeat thread's, at its end)."""
        self._http.close()

    def __enter__(self) -> Client:  # noqa: PYI034 (typing.Self is 3.11+; the client runs on older Pythons)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        """Send one request to ``/api{path}`` and return the decoded JSON answer (None for 204).
        Raises the `TaskflowError` subclass of an error answer, or `TransportError`."""
        return self._exchange(method, path, body, query=query, timeout=timeout)[0]

    def _exchange(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                  timeout: float | None = None) -> tuple[Any, float | None]:
        """`request`, with the answer's Retry-After (seconds; None when absent)."""
        if query:
            pairs = {k: v for k, v in query.items() if v is not None}
            if pairs:
                path = f"{path}?{urlencode(pairs, doseq=True)}"
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **trace_headers()}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        data = None
        if body is not None or method == "POST":
            data = json.dumps({} if body is None else body, separators=(",", ":"),
                              allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        status, content_type, raw, retry_after = self._http.request(method, path, headers, data,
                                                                    timeout or self.timeout)
        if status == 204:
            return None, _seconds(retry_after)
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = None
        if 200 <= status < 300 and raw and decoded is not None:
            return decoded, _seconds(retry_after)
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
            raise error_from_body(status, decoded)
        text = raw[:_ERROR_BODY_PREVIEW].decode("utf-8", "replace")
        raise TransportError(f"{method} {path}: unexpected answer {status} ({content_type or 'no content type'})",
                             status=status, body=text)

    @staticmethod
    def _path(*parts: str) -> str:
        return "/" + "/".join(quote(str(p), safe="") for p in parts)

    # -- tasks ------------------------------------------------------------------------------

    def create(self, task: dict[str, Any] | Sequence[dict[str, Any]], *, concurrency_key: str | None = None,
               concurrency_limit: int | None = None, dedup_key: str | None = None,
               run_at: datetime | str | None = None, rate_key: str | None = None,
               fairness_key: str | None = None, fairness_weight: int | None = None,
               queue_timeout_seconds: int | None = None, attempt_timeout_seconds: int | None = None,
               progress_timeout_seconds: int | None = None) -> dict[str, Any] | builtins.list[dict[str, Any]]:
        """Create one task (a dict) and return it, or a batch (a list of dicts, all or
        nothing, may form a DAG through ``deps``) and return the list.

        Fields: ``title`` (required), ``id`` (generated when omitted), ``description``,
        ``payload`` (any JSON), ``queue`` ("default"), ``priority`` (higher first), ``deps``
        (ids), ``on_hold`` (stay PENDING until an operator admits it), ``max_retries`` (3),
        ``concurrency_key`` (1-200 printable characters: at most the key's limit of RUNNING
        tasks share it), ``concurrency_limit`` (1-10,000, with a key: sets the key's limit;
        a new key's is 1), ``rate_key`` (1-200 printable characters: its claims start no
        faster than the key's rate, shared with the tasks of every queue naming it; see
        `rate_key`), ``run_at`` (not claimable before it: ISO 8601 text with its zone)
        and ``dedup_key`` (1-200 printable characters: while a live task holds it, the create
        returns that task and creates nothing), ``fairness_key`` (1-200 printable characters, a
        plan or a person: tasks of different keys take turns in the claim order) and
        ``fairness_weight`` (1-1,000, with a key: its turns for another key's one), ``tags`` (up to 20
        labels of 1-50 letters, digits and ._:/-, found by the search line ``tag:NAME``),
        ``resources`` (up to 16: a name such as ``"merge-slot"``, ``"branch:main"`` or
        ``"file:src/app/**"`` is held exclusively, ``{"name": "gpu", "units": 1}`` shares the
        resource's capacity; a claim takes them all with the task or waits, and the lease's end
        frees them: see `resources`).
        `concurrency_key`, `concurrency_limit`, `rate_key`, `fairness_key`, `fairness_weight` and
        `run_at` (an aware datetime or ISO text) given here are set on every task of the call;
        `dedup_key` only on a single task (ValueError, nothing sent, if a task names another
        value itself, or for a naive datetime).
        Deadlines beside the lease, whole seconds from 1 to 30 days, applied by the server's
        reaper: ``queue_timeout_seconds`` (QUEUED and claimable this long without starting: the
        task FAILS, "not started in time"), ``attempt_timeout_seconds`` (one attempt's limit: the
        lease is taken back, renewed or not) and ``progress_timeout_seconds`` (the lease is taken
        back unless a renew changed ``progress`` or saved a checkpoint within that time); given
        here, set on every task of the call as the concurrency fields are.

        Each returned task has ``deduplicated``: True when a live task held its dedup key
        and was returned instead. Re-sending an identical create is safe: the existing task
        comes back. Another task under the same id raises `DuplicateId`."""
        if dedup_key is not None and not isinstance(task, dict):
            raise ValueError("dedup_key= names one task; in a batch, give each task its own dedup_key field")
        if isinstance(run_at, datetime):
            if run_at.utcoffset() is None:
                raise ValueError("run_at must be an aware datetime (with its zone)")
            run_at = run_at.isoformat()
        fields = {name: value for name, value in (("concurrency_key", concurrency_key),
                                                  ("concurrency_limit", concurrency_limit),
                                                  ("rate_key", rate_key),
                                                  ("dedup_key", dedup_key), ("run_at", run_at),
                                                  ("fairness_key", fairness_key),
                                                  ("fairness_weight", fairness_weight),
                                                  ("queue_timeout_seconds", queue_timeout_seconds),
                                                  ("attempt_timeout_seconds", attempt_timeout_seconds),
                                                  ("progress_timeout_seconds", progress_timeout_seconds))
                  if value is not None}
        if fields:
            task = _with_fields(task, fields)
        if isinstance(task, dict):
            return self.request("POST", "/tasks", task)
        answer = self.request("POST", "/tasks", list(task))
        return answer["items"]

    def get(self, task_id: str) -> dict[str, Any]:
        """One task as a dict; `NotFound` if there is none."""
        return self.request("GET", self._path("tasks", task_id))

    def add_note(self, task_id: str, text: str, *, token: str | None = None) -> dict[str, Any]:
        """Add a note to a task (up to 4,000 characters; 100 notes a task): as its holder with
        the lease's `token` (``lease.note(text)`` does this), or, without one, as staff (an
        operator key). It stays with the task across attempts; the next claim carries it.
        Returns the note (``id``, ``text``, ``author``, ``by_holder``, ``attempt``, ``fence``,
        ``at``). `LeaseLost` for a lease that is no longer the task's; `NotesFull` at 100 notes."""
        body: dict[str, Any] = {"text": text}
        if token is not None:
            body["token"] = token
        return self.request("POST", self._path("tasks", task_id, "notes"), body)

    def notes(self, task_id: str) -> builtins.list[dict[str, Any]]:
        """Every note of a task, oldest first."""
        return self.request("GET", self._path("tasks", task_id, "notes"))["items"]

    # -- approval gates ------------------------------------------------------------------------

    def request_approval(self, task_id: str, token: str, question: str, *, form: dict[str, Any] | None = None,
                         approvers: Sequence[str] | None = None, timeout_seconds: int | None = None,
                         on_timeout: str = "fail", checkpoint: Any = None) -> dict[str, Any]:
        """As the holder (`token`), ask a person `question` and give the lease up: the task
        waits PAUSED (``awaiting_approval``) in the board's Needs-you lane. `form`: a JSON
        Schema of flat fields the answer's values fill; `approvers`: usernames or group names
        (none: operators); unanswered after `timeout_seconds`, `on_timeout` applies ("fail",
        "approve" or "cancel"). Returns ``{"task", "approval"}``."""
        body: dict[str, Any] = {"token": token, "question": question, "on_timeout": on_timeout}
        if form is not None:
            body["form"] = form
        if approvers is not None:
            body["approvers"] = builtins.list(approvers)
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        return self.request("POST", self._path("tasks", task_id, "request-approval"), body)

    def answer(self, task_id: str, approve: bool, *, values: dict[str, Any] | None = None, comment: str = "",
               approval_id: int | None = None) -> dict[str, Any]:
        """Answer the task's waiting approval (an --operator key). `AlreadyAnswered` when someone
        answered first. Returns ``{"task", "approval"}``."""
        body: dict[str, Any] = {"approve": approve, "comment": comment}
        if values is not None:
            body["values"] = values
        if approval_id is not None:
            body["approval_id"] = approval_id
        return self.request("POST", self._path("tasks", task_id, "answer"), body)

    def approvals(self, *, state: str = "waiting", queue: str | None = None) -> builtins.list[dict[str, Any]]:
        """Approvals (``state``: "waiting", "answered" or "all"), oldest first, every page."""
        found: builtins.list[dict[str, Any]] = []
        after = None
        while True:
            page = self.request("GET", "/approvals", query={"state": state, "queue": queue, "after": after,
                                                                "limit": 500})
            found += page["items"]
            after = page["next_after"]
            if after is None:
                return found

    def task_approvals(self, task_id: str) -> builtins.list[dict[str, Any]]:
        """Every approval the task asked for, oldest first."""
        return self.request("GET", self._path("tasks", task_id, "approvals"))["items"]

    def wait_for_answer(self, task_id: str, approval_id: int, *, poll_seconds: float = 2.0,
                        wait_seconds: float | None = None) -> dict[str, Any]:
        """The approval once it is no longer waiting (approved, rejected, timed out, cancelled),
        asking every `poll_seconds`; `TimeoutError` after `wait_seconds` (None: no limit). A
        person answers in minutes: a poll every few seconds costs the board nothing."""
        deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
        while True:
            approval = next(a for a in self.task_approvals(task_id) if a["id"] == approval_id)
            if approval["state"] != "waiting":
                return approval
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"approval {approval_id} of task {task_id} is still waiting")
            time.sleep(poll_seconds if deadline is None else max(0.0, min(poll_seconds, deadline - time.monotonic())))

    def claim_answered(self, task_id: str, approval_id: int, ttl_seconds: float, *, poll_seconds: float = 2.0,
                       wait_seconds: float | None = None) -> Lease:
        """Wait for the answer to this agent's approval, then claim the task back (it is kept for
        the agent that asked for 60 s after the answer). `ApprovalClosed` when the question was
        closed without an answer to act on (timed out with "fail" or "cancel"; task cancelled)."""
        approval = self.wait_for_answer(task_id, approval_id, poll_seconds=poll_seconds, wait_seconds=wait_seconds)
        if approval["state"] not in ("approved", "rejected"):
            raise ApprovalClosed(f"approval {approval_id} of task {task_id} was {approval['state'].replace('_', ' ')}",
                                 approval)
        return self.claim(task_id, ttl_seconds)

    def iter_tasks(self, *, stage: str | Sequence[str] | None = None, queue: str | None = None,
                   owner: str | None = None, text: str | None = None, search: str | None = None,
                   order: str | None = None, limit: int | None = None,
                   page_size: int = 100) -> Iterator[dict[str, Any]]:
        """Every matching task, oldest first, fetching pages lazily through the ``next``
        cursor. `stage`: one stage name or several (e.g. ``["QUEUED", "RUNNING"]``); `text`
        matches id or title; `search`: a search line, every term must match (``"tag:urgent
        stage:failed error:timeout"``, ``"payload.repo:acme/web created:<2h"``: the board's
        docs/api.md, "Searching tasks"). `order`: ``"created"`` (oldest first, the default) or ``"claim"``
        (the order claim_next takes tasks in: claim_rank, then id; priority with aging, fairness keys). `limit`: at most
        this many tasks, asked for in pages of that size (up to the server's 500), so that the
        first `limit` tasks of the order cost one request when they fit one page."""
        if isinstance(stage, str):
            stage = [stage]
        cursor = None
        remaining = limit
        while remaining is None or remaining > 0:
            size = page_size if remaining is None else min(remaining, MAX_PAGE)
            page = self.request("GET", "/tasks", query={
                "stage": list(stage) if stage else None, "queue": queue, "owner": owner, "text": text,
                "search": search, "order": order, "cursor": cursor, "limit": size})
            items = page["items"] if remaining is None else page["items"][:remaining]
            yield from items
            if remaining is not None:
                remaining -= len(items)
            cursor = page.get("next")
            if not cursor:
                return

    def list(self, **filters: Any) -> builtins.list[dict[str, Any]]:
        """All matching tasks (every page, or the first `limit`) as a list; filters as in
        `iter_tasks`: ``stage``, ``queue``, ``owner``, ``text``, ``search``, ``order``, ``limit``,
        ``page_size``."""
        return [task for task in self.iter_tasks(**filters)]

    def iter_events(self, task_id: str, *, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """A task's history, oldest first, one event per transition (``verb``,
        ``from_stage``, ``to_stage``, ``version``, ``fence``, ``actor``, ``at``, ``detail``)."""
        cursor = None
        while True:
            page = self.request("GET", self._path("tasks", task_id, "events"),
                                query={"cursor": cursor, "limit": page_size})
            yield from page["items"]
            cursor = page.get("next")
            if not cursor:
                return

    def events(self, task_id: str, *, last: int | None = None) -> builtins.list[dict[str, Any]]:
        """A task's whole history as a list (see `iter_events`); with `last`, only its `last`
        most recent events (1-500), oldest first, in one request."""
        if last is not None:
            return self.request("GET", self._path("tasks", task_id, "events"), query={"last": last})["items"]
        return [event for event in self.iter_events(task_id)]

    # -- claiming ---------------------------------------------------------------------------

    def claim_next(self, ttl_seconds: float, queue: str | None = None,
                   wait_seconds: float = 0, *, request_id: str | None = None) -> Lease | None:
        """Claim the best ready task (first in the claim order; only in `queue` if given)
        with a lease of `ttl_seconds` (1 s .. 24 h). With `wait_seconds` (up to 30) the server
        waits for work to become ready (woken by the board's commits). Tasks of a paused or
        full queue, or of a full concurrency key, are passed over; so are those a queue's rate
        holds back, and when the server says when the rate opens (204 with Retry-After)
        within the wait, this sleeps until then and claims again. Returns a `Lease`, or
        None when there was no work. A server that already parks all the waiting claims it
        allows answers 503; this method then tries again every second until its wait is over.
        After a transport error the claim is sent once more, with the same request id and
        what is left of the wait: if the first one took effect, this gets its lease.
        `request_id`: the claim's id (default: a fresh uuid4); give the id of a claim whose
        answer was lost to get its lease back while it lives."""
        answer = self._claim_with_retries({}, ttl_seconds, queue, wait_seconds, request_id)
        return None if answer is None else Lease(self, answer, ttl_seconds)

    def claim_batch(self, max_tasks: int, ttl_seconds: float, queue: str | None = None,
                    wait_seconds: float = 0) -> builtins.list[Lease]:
        """Claim up to `max_tasks` (1-100) ready tasks in one request, in the claim order, each
        with its own lease (token, fence, expiry) of `ttl_seconds`. Waiting, rates, 503 and
        the retry after a transport error are as in `claim_next` (``wait_seconds`` waits for the
        first task; the answer holds what was ready then). Returns the leases, an empty list
        when there was no work. A board without batch claims (before issue 34) refuses the
        field: the client then claims one task (``[lease]`` or ``[]``) and `complete_batch`
        completes one by one."""
        if not 1 <= max_tasks <= MAX_BATCH:
            raise ValueError(f"max_tasks is 1 to {MAX_BATCH}, not {max_tasks!r}")
        if self._batches_refused:
            lease = self.claim_next(ttl_seconds, queue=queue, wait_seconds=wait_seconds)
            return [] if lease is None else [lease]
        try:
            answer = self._claim_with_retries({"max_tasks": max_tasks}, ttl_seconds, queue, wait_seconds, None)
        except ValidationFailed as exc:
            if not _refuses_field(exc, "max_tasks"):
                raise
            self._batches_refused = True
            return self.claim_batch(max_tasks, ttl_seconds, queue, wait_seconds)
        if answer is None:
            return []
        return [Lease(self, item, ttl_seconds) for item in answer["leases"]]

    def _claim_with_retries(self, extra: dict[str, Any], ttl_seconds: float, queue: str | None,
                            wait_seconds: float, request_id: str | None) -> dict[str, Any] | None:
        """POST /claim with `extra` fields: the answer, or None when no work came within the wait."""
        deadline = time.monotonic() + wait_seconds
        request_id = request_id or _new_request_id()
        sent_again = False
        while True:
            body: dict[str, Any] = {"ttl_seconds": ttl_seconds, "wait_seconds": wait_seconds,
                                    "request_id": request_id, **self._narrowing, **extra}
            if queue is not None:
                body["queue"] = queue
            try:
                answer, retry_after = self._exchange("POST", "/claim", body, timeout=self.timeout + wait_seconds)
            except TooManyWaiters:
                wait_seconds = deadline - time.monotonic() - BUSY_RETRY_SECONDS
                if wait_seconds <= 0:
                    return None
                time.sleep(BUSY_RETRY_SECONDS)
                continue
            except TransportError:
                if sent_again:
                    raise
                sent_again = True
                wait_seconds = max(0.0, round(deadline - time.monotonic(), 3))
                continue
            if answer is None and retry_after is not None and deadline - time.monotonic() > retry_after:
                # Ready work waits for its queue's rate to let the next claim start: come back
                # then, with what is left of the wait (the server answered at once, not parked).
                time.sleep(retry_after)
                wait_seconds = max(0.0, round(deadline - time.monotonic(), 3))
                continue
            return answer

    def claim(self, task_id: str, ttl_seconds: float) -> Lease:
        """Claim this task. Refused with `Taken` (a live lease), `Blocked` (dependencies,
        hold, backoff; its queue paused or at its limit, or its concurrency key at its limit:
        ``exc.details["waiting"]`` says which), `Terminal`, `InvalidTransition` (PAUSED:
        resume it), `NotFound`.
        After a transport error the claim is sent once more with the same request id: if the
        first one took effect, this gets its lease (not `Taken`)."""
        path = self._path("tasks", task_id, "claim")
        body = {"ttl_seconds": ttl_seconds, "request_id": _new_request_id(), **self._narrowing}
        try:
            answer = self.request("POST", path, body)
        except TransportError:
            answer = self.request("POST", path, body)
        return Lease(self, answer, ttl_seconds)

    def resume(self, task_id: str, ttl_seconds: float) -> Lease:
        """Take a PAUSED task with a new lease; its checkpoint is in ``lease.task["checkpoint"]``."""
        return Lease(self, self.request("POST", self._path("tasks", task_id, "resume"),
                                        {"ttl_seconds": ttl_seconds, **self._narrowing}), ttl_seconds)

    def hold(self, ttl_seconds: float = 60, *, queue: str | None = None, wait_seconds: float = 0,
             heartbeat: float | None = None, claim_next: bool = True):
        """Claim the next ready task and hold it for the duration of a ``with`` block.

        ``with client.hold(ttl_seconds=30, wait_seconds=5) as job:`` gives a `Job`, or
        **None when no task became ready within `wait_seconds`** (so a worker loop ends with
        ``if job is None: break``). While the block runs, a background thread renews the
        lease every `heartbeat` seconds (default ttl/3). On leaving the block the task is
        completed with ``job.result``; an exception fails it (with the traceback summary) and
        propagates; if the lease was lost, nothing is committed. See `Job` for the details.

        One round trip per task: the complete on leaving the block also claims the next ready
        task (same `ttl_seconds` and `queue`, no wait), kept for this thread's next
        ``hold()`` with the same `ttl_seconds` and `queue`, which takes it without a request.
        Only when none was ready does that ``hold()`` claim (and wait) itself. A kept lease is
        not renewed until its ``hold()``: one older than ttl/3 by then is renewed first, one
        past its TTL is dropped; a ``hold()`` of another ttl or queue releases it, and so do
        `release_next` and `close` (a loop that stops while work is left), and the
        interpreter's exit. ``claim_next=False``: complete alone (a loop that will not hold
        again)."""
        return Hold(self, ttl_seconds, queue=queue, wait_seconds=wait_seconds, heartbeat=heartbeat,
                    claim_next=claim_next)

    def hold_task(self, task_id: str, ttl_seconds: float = 60, *, resume: bool = False,
                  heartbeat: float | None = None):
        """Like `hold`, for one named task: claims it (or, with ``resume=True``, resumes it
        from PAUSED; its checkpoint is in ``job.task["checkpoint"]``). The claim's refusal
        (`Taken`, `Blocked`, ...) is raised by the ``with`` statement; the job is never None."""
        return Hold(self, ttl_seconds, task_id=task_id, resume=resume, heartbeat=heartbeat)

    # -- the holder's verbs -----------------------------------------------------------------

    def renew(self, task_id: str, token: str, ttl_seconds: float, *, checkpoint: Any = None,
              progress: float | None = None, usage: dict[str, Any] | None = None) -> Lease:
        """Extend a live lease to now + `ttl_seconds` (same token and fence), optionally
        saving `checkpoint` (any JSON but null) and `progress` (0..1). `LeaseLost` if the
        lease has expired or is no longer the task's. `usage`: what was used since this
        lease's last report (``{"model", "input_tokens", "output_tokens", "cost_usd"?,
        "source"?}``; complete and fail take it too; `usage(task_id)` sums them)."""
        body: dict[str, Any] = {"token": token, "ttl_seconds": ttl_seconds}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        if progress is not None:
            body["progress"] = progress
        if usage is not None:
            body["usage"] = usage
        return Lease(self, self.request("POST", self._path("tasks", task_id, "renew"), body), ttl_seconds)

    def release(self, task_id: str, token: str) -> dict[str, Any]:
        """Give the task back to the queue; the attempt is not counted. Returns the task."""
        return self.request("POST", self._path("tasks", task_id, "release"), {"token": token})

    def snooze(self, task_id: str, token: str, seconds: float) -> dict[str, Any]:
        """Give the task back to the queue, not claimable for `seconds` (1 to 604,800: a week);
        the attempt is not counted. For work that cannot proceed yet (a rate limit upstream, a
        resource not ready). Returns the QUEUED task, its ``not_before`` set."""
        return self.request("POST", self._path("tasks", task_id, "release"),
                            {"token": token, "retry_after_seconds": seconds})

    def complete(self, task_id: str, token: str, result: Any = None, *,
                 usage: dict[str, Any] | None = None) -> dict[str, Any]:
        """Commit `result` (any JSON value; None is sent as ``{}``). Returns the COMPLETED
        task. `LeaseLost` if someone else holds the task now. `usage`: as for `renew`."""
        body: dict[str, Any] = {"token": token, "result": {} if result is None else result}
        if usage is not None:
            body["usage"] = usage
        return self.request("POST", self._path("tasks", task_id, "complete"), body)

    def fail(self, task_id: str, token: str, error: str, *, retryable: bool = True,
             traceback: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record a failed attempt with `error` (text, at most 10,000 characters) and, when
        given, `traceback` (at most 64 KiB), both kept in this failure's history row. With
        attempts left and `retryable` the task goes back to QUEUED after a backoff; otherwise
        it stays FAILED. Returns the task. `usage`: as for `renew`."""
        body: dict[str, Any] = {"token": token, "error": error, "retryable": retryable}
        if traceback is not None:
            body["traceback"] = traceback
        if usage is not None:
            body["usage"] = usage
        return self.request("POST", self._path("tasks", task_id, "fail"), body)

    def usage(self, task_id: str) -> dict[str, Any]:
        """What the task's attempts reported they used: ``total`` and ``attempts`` (by fence),
        each with ``input_tokens``, ``output_tokens``, ``cost_usd`` (None when a report gave
        none: ``cost_missing``) and ``reports``."""
        return self.request("GET", self._path("tasks", task_id, "usage"))

    # -- finishing and claiming the next task in one request (issue 34) -------------------------

    def complete_and_claim(self, task_id: str, token: str, result: Any = None, *, ttl_seconds: float,
                           queue: str | None = None, wait_seconds: float = 0,
                           request_id: str | None = None) -> tuple[dict[str, Any], Lease | None]:
        """`complete`, and in the same request claim the next ready task (as `claim_next` with
        `ttl_seconds`, `queue`, `wait_seconds`, `request_id` would; the wait starts once the
        completion has committed): one round trip per task. Returns ``(the COMPLETED task, the
        next Lease or None)``. Refusals are `complete`'s (no claim is made then). A board
        without it (before issue 34) refuses the field: the client then completes alone and
        returns ``(task, None)`` (the caller claims as before)."""
        body: dict[str, Any] = {"token": token, "result": {} if result is None else result}
        path = self._path("tasks", task_id, "complete")
        return self._finish_and_claim(path, body, ttl_seconds, queue, wait_seconds, request_id)

    def fail_and_claim(self, task_id: str, token: str, error: str, *, retryable: bool = True,
                       traceback: str | None = None, ttl_seconds: float, queue: str | None = None,
                       wait_seconds: float = 0, request_id: str | None = None) -> tuple[dict[str, Any], Lease | None]:
        """`fail`, and claim the next ready task in the same request (see `complete_and_claim`)."""
        body: dict[str, Any] = {"token": token, "error": error, "retryable": retryable}
        if traceback is not None:
            body["traceback"] = traceback
        path = self._path("tasks", task_id, "fail")
        return self._finish_and_claim(path, body, ttl_seconds, queue, wait_seconds, request_id)

    def release_and_claim(self, task_id: str, token: str, *, ttl_seconds: float, queue: str | None = None,
                          wait_seconds: float = 0, request_id: str | None = None) -> tuple[dict[str, Any], Lease | None]:
        """`release`, and claim the next ready task in the same request (see `complete_and_claim`).
        The released task itself may be the one claimed next, when it is first in the claim order."""
        body: dict[str, Any] = {"token": token}
        path = self._path("tasks", task_id, "release")
        return self._finish_and_claim(path, body, ttl_seconds, queue, wait_seconds, request_id)

    def _finish_and_claim(self, path: str, body: dict[str, Any], ttl_seconds: float, queue: str | None,
                          wait_seconds: float, request_id: str | None) -> tuple[dict[str, Any], Lease | None]:
        """POST a finishing move (`body` to `path`) with `next`, or without it on a board that
        refuses the field (then ``(task, None)``: the caller claims as before)."""
        if not self._next_refused:
            try:
                answer = self.request("POST", path, {**body, "next": {**self._narrowing, **self._next_fields(
                    ttl_seconds, queue, wait_seconds, request_id)}}, timeout=self.timeout + wait_seconds)
            except ValidationFailed as exc:
                self._note_next_refused(exc)
            else:
                return self._task_and_next(answer, ttl_seconds)
        return self.request("POST", path, body), None

    @staticmethod
    def _next_fields(ttl_seconds: float, queue: str | None, wait_seconds: float,
                     request_id: str | None) -> dict[str, Any]:
        """The `next` of a complete, fail or release: POST /claim's fields."""
        fields: dict[str, Any] = {"ttl_seconds": ttl_seconds, "request_id": request_id or _new_request_id()}
        if queue is not None:
            fields["queue"] = queue
        if wait_seconds:
            fields["wait_seconds"] = wait_seconds
        return fields

    def _note_next_refused(self, exc: ValidationFailed) -> None:
        """A 422 to a request with `next`: an older board that does not know the field (then
        finish without it from now on), else re-raise the refusal."""
        if not _refuses_field(exc, "next"):
            raise exc
        self._next_refused = True

    def _task_and_next(self, answer: dict[str, Any], ttl_seconds: float) -> tuple[dict[str, Any], Lease | None]:
        claimed = answer.pop("next", None)
        return answer, None if claimed is None else Lease(self, claimed, ttl_seconds)

    def complete_batch(self, items: Sequence[tuple[Any, ...]]) -> builtins.list[Outcome]:
        """Complete several held tasks in one request (``POST /api/complete``, up to 100):
        `items` are ``(lease_or_job, result)`` or ``(task_id, token, result)`` tuples, each
        optionally ending with the attempt's ``usage`` (a dict, as `complete` takes it). Each
        item is its own compare-and-swap: one refused (its lease lost, ...) does not undo the
        others. Returns one `Outcome` per item, in order: ``ok`` and the COMPLETED ``task``, or
        ``error`` (the `TaskflowError` a single `complete` would have raised, not raised here).
        A transport error raises `TransportError` (which items took effect is unknown: each
        one sent again meets its own completion as `LeaseLost` with the task COMPLETED)."""
        body_items = []
        for item in items:
            if isinstance(item[0], str):
                task_id, token, result, *rest = item
            else:
                holder, result, *rest = item
                lease = getattr(holder, "lease", holder)  # a Job or a Lease
                task_id, token = lease.task_id, lease.token
            body_item: dict[str, Any] = {"id": task_id, "token": token, "result": {} if result is None else result}
            if rest and rest[0] is not None:
                body_item["usage"] = rest[0]
            body_items.append(body_item)
        if not body_items:
            return []
        if len(body_items) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} items per batch, not {len(body_items)}")
        if self._batches_refused:
            return [self._complete_one(item) for item in body_items]
        answer = self.request("POST", "/complete", {"items": body_items})
        outcomes = []
        for item in answer["items"]:
            if item.get("ok"):
                outcomes.append(Outcome(item["id"], True, item.get("task"), None))
            else:
                error = error_from_body(int(item.get("status") or 0), {"error": item.get("error") or {}})
                outcomes.append(Outcome(item["id"], False, error.task, error))
        return outcomes

    def _complete_one(self, item: dict[str, Any]) -> Outcome:
        try:
            task = self.complete(item["id"], item["token"], item["result"], usage=item.get("usage"))
        except TaskflowError as exc:
            return Outcome(item["id"], False, exc.task, exc)
        return Outcome(item["id"], True, task, None)

    def hold_batch(self, max_tasks: int, ttl_seconds: float = 60, *, queue: str | None = None,
                   wait_seconds: float = 0, heartbeat: float | None = None):
        """Claim up to `max_tasks` ready tasks in one request and hold them for a ``with``
        block: ``with client.hold_batch(10, ttl_seconds=30, wait_seconds=5) as batch:`` gives a
        `JobBatch` (a list of `Job`; empty when no work came within `wait_seconds`). One
        background thread renews every lease of the batch; on leaving the block, the jobs not
        finished inside it are completed with their ``job.result`` in one request. See
        `JobBatch` (``batch.run(fn)`` runs `fn` on each job: its return value is the result,
        its exception fails that job alone)."""
        return HoldBatch(self, max_tasks, ttl_seconds, queue=queue, wait_seconds=wait_seconds, heartbeat=heartbeat)

    def work(self, handler, *, max_tasks: int = 10, ttl_seconds: float = 60, queue: str | None = None,
             wait_seconds: float = 3, heartbeat: float | None = None,
             stop: threading.Event | None = None) -> dict[str, int]:
        """A batch worker loop: claim up to `max_tasks` tasks in one request, run
        ``handler(job)`` on each (its return value is the task's result; an exception fails
        that task alone, with its traceback), complete the batch in one request, and again,
        until no work came within `wait_seconds` (or `stop` is set). Two round trips per
        batch. Returns the counts of the jobs' outcomes, e.g. ``{"completed": 95, "failed": 5}``."""
        counts: dict[str, int] = {}
        while stop is None or not stop.is_set():
            with self.hold_batch(max_tasks, ttl_seconds, queue=queue, wait_seconds=wait_seconds,
                                 heartbeat=heartbeat) as batch:
                if not batch:
                    break
                batch.run(handler)
            for job in batch:
                counts[job.outcome or "lost"] = counts.get(job.outcome or "lost", 0) + 1
        return counts

    # -- the lease a hold() claimed for the next hold() (complete-and-claim) -------------------

    def _keep_next(self, lease: Lease, queue: str | None) -> None:
        """Keep `lease` (claimed with a complete) for this thread's next ``hold()``."""
        with self._next_lock:
            stale = self._next_leases.pop(threading.get_ident(), None)
            self._next_leases[threading.get_ident()] = (lease, queue, time.monotonic())
            if not self._at_exit:
                self._at_exit = True
                atexit.register(_release_at_exit, weakref.ref(self))
        if stale is not None:
            self._give_back(stale[0])

    def _keep_request(self, request_id: str, ttl_seconds: float, queue: str | None) -> None:
        """A complete-and-claim whose answer was lost took effect: its claim may have too. The
        next hold() sends its claim with this request id, and so gets that lease if it lives."""
        with self._next_lock:
            self._next_requests[threading.get_ident()] = (request_id, ttl_seconds, queue, time.monotonic())

    def _take_next(self, ttl_seconds: float, queue: str | None) -> tuple[Lease | None, str | None]:
        """For ``hold()``: (the lease kept for it, or None; the request id of a claim to recover, or None)."""
        me = threading.get_ident()
        with self._next_lock:
            kept = self._next_leases.pop(me, None)
            request = self._next_requests.pop(me, None)
        request_id = None
        if request is not None and request[1:3] == (ttl_seconds, queue) and time.monotonic() - request[3] < ttl_seconds:
            request_id = request[0]
        if kept is None:
            return None, request_id
        lease, kept_queue, received = kept
        if (lease.ttl_seconds, kept_queue) != (ttl_seconds, queue):
            self._give_back(lease)  # another kind of hold(): this lease is not what it asks for
            return None, request_id
        age = time.monotonic() - received
        if age >= lease.ttl_seconds:
            return None, request_id  # expired by now: the board gives the task to others
        if age > lease.ttl_seconds / 3:  # the caller did other things meanwhile: renew first
            try:
                lease.renew()
            except (TaskflowError, TransportError):
                return None, request_id
        return lease, None

    def release_next(self) -> bool:
        """Give back the lease this thread's last ``hold()`` claimed with its complete for the
        next ``hold()`` (complete-and-claim), if one is kept: a loop that stops while work is
        left calls it (`close` does). True if a lease was released."""
        with self._next_lock:
            kept = self._next_leases.pop(threading.get_ident(), None)
        return kept is not None and self._give_back(kept[0])

    def _release_every_next(self) -> None:
        with self._next_lock:
            kept, self._next_leases = list(self._next_leases.values()), {}
        for lease, _queue, _received in kept:
            self._give_back(lease)

    @staticmethod
    def _give_back(lease: Lease) -> bool:
        try:
            lease.release()
            return True
        except (TaskflowError, TransportError):  # expired or taken meanwhile, or the board is away
            return False

    def pause(self, task_id: str, token: str, checkpoint: Any) -> dict[str, Any]:
        """Give the lease up and keep `checkpoint` (any JSON but null) so that a later
        `resume` continues from it. Returns the PAUSED task."""
        return self.request("POST", self._path("tasks", task_id, "pause"),
                            {"token": token, "checkpoint": checkpoint})

    # -- operators --------------------------------------------------------------------------

    @staticmethod
    def _operator_body(version: int | None, reason: str, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"reason": reason, **extra}
        if version is not None:
            body["version"] = version
        return body

    def admit(self, task_id: str, *, version: int | None = None, reason: str = "") -> dict[str, Any]:
        """Operator: admit a PENDING (held) task whose dependencies are complete. With
        `version`, refused with `VersionConflict` if the task moved on."""
        return self.request("POST", self._path("tasks", task_id, "admit"), self._operator_body(version, reason))

    def requeue(self, task_id: str, *, version: int | None = None, reset_attempts: bool = False,
                reason: str = "") -> dict[str, Any]:
        """Operator: put a FAILED or PAUSED task back in the queue (``reset_attempts`` when
        its attempts are spent)."""
        return self.request("POST", self._path("tasks", task_id, "requeue"),
                            self._operator_body(version, reason, reset_attempts=reset_attempts))

    def cancel(self, task_id: str, *, version: int | None = None, reason: str = "") -> dict[str, Any]:
        """Operator: cancel an unfinished task; a live lease on it is ended (its holder gets
        `LeaseLost`)."""
        return self.request("POST", self._path("tasks", task_id, "cancel"), self._operator_body(version, reason))

    def edit(self, task_id: str, *, version: int, title: str | None = None, description: str | None = None,
             payload: Any = None, priority: int | None = None, max_retries: int | None = None,
             tags: Sequence[str] | None = None) -> dict[str, Any]:
        """Operator: change what an unfinished task is (the fields given; None leaves one as it
        is), only while it is at `version` (else `VersionConflict`, nothing written). ``tags``
        replaces all of the task's tags (``[]``: none). Returns the task."""
        body: dict[str, Any] = {"version": version}
        if title is not None:
            body["title"] = title
        if description is not None:
            body["description"] = description
        if payload is not None:
            body["payload"] = payload
        if priority is not None:
            body["priority"] = priority
        if max_retries is not None:
            body["max_retries"] = max_retries
        if tags is not None:
            body["tags"] = list(tags)
        return self.request("PATCH", self._path("tasks", task_id), body)

    def replay(self, task_id: str, *, payload: Any = None, new_id: str | None = None) -> dict[str, Any]:
        """Operator: run a finished (COMPLETED, FAILED or CANCELLED) task again as a new task, a
        copy of it (its payload, dependencies and settings; `payload` instead when given) whose
        ``replay_of`` names it; ``new_id`` names the copy (else generated). Returns the new
        task. `InvalidTransition` for a task that has not finished."""
        body: dict[str, Any] = {}
        if payload is not None:
            body["payload"] = payload
        if new_id is not None:
            body["id"] = new_id
        return self.request("POST", self._path("tasks", task_id, "replay"), body)

    # -- queues (flow control) ---------------------------------------------------------------

    def queues(self) -> builtins.list[dict[str, Any]]:
        """Every queue that has settings or tasks (those this key may read), by name: each a
        dict as `Queue.get` describes it."""
        return self.request("GET", "/queues")["items"]

    def queue(self, name: str) -> Queue:
        """A handle on the queue `name` (no request is sent until one of its methods is called):
        ``client.queue("ci").pause(reason="provider outage")``."""
        return Queue(self, name)

    def get_queue(self, name: str) -> dict[str, Any]:
        """One queue's settings, running count and tasks per stage (see `Queue.get`)."""
        return self.request("GET", self._path("queues", name))

    def change_queue(self, name: str, *, concurrency: int | None = UNCHANGED, paused: bool | None = None,
                     rate: dict[str, int] | None = UNCHANGED, budget: dict[str, Any] | None = UNCHANGED,
                     reason: str = "") -> dict[str, Any]:
        """Operator: change a queue's settings; only those given change. `concurrency`: its
        limit (1-10,000; None: no limit; left out: unchanged); `paused`: True stops new claims
        of its tasks, False lets them in again; `rate`: ``{"count": C, "per_seconds": S}`` (at
        most C claims start in any S seconds; None: no rate); `reason` (at most 500 characters) goes to its
        history. Returns the queue as it is now. `Forbidden` without operator rights,
        `ValidationFailed` for a limit out of range (nothing changed)."""
        body: dict[str, Any] = {"reason": reason}
        if concurrency is not UNCHANGED:
            body["concurrency"] = concurrency
        if paused is not None:
            body["paused"] = paused
        if rate is not UNCHANGED:
            body["rate"] = rate
        if budget is not UNCHANGED:  # {"tokens"?, "cost_usd"?, "per"}, or None: no budget
            body["budget"] = budget
        return self.request("PUT", self._path("queues", name), body)

    def queue_history(self, name: str) -> builtins.list[dict[str, Any]]:
        """Who changed a queue's settings, newest first (see `Queue.history`)."""
        return self.request("GET", self._path("queues", name, "history"))["items"]

    # -- rate keys (a rate shared by the tasks of many queues) --------------------------------

    def rate_keys(self) -> builtins.list[dict[str, Any]]:
        """Every rate key (those the tasks of this key's queues name, for a key limited to some),
        by name: ``name``, ``rate`` (``{"count", "per_seconds"}`` or None), ``next_claim_at``."""
        return self.request("GET", "/rate-keys")["items"]

    def rate_key(self, name: str) -> RateKey:
        """A handle on the rate key `name` (no request is sent until one of its methods is
        called): ``client.rate_key("provider:openai").set_rate(500, per_seconds=60)``."""
        return RateKey(self, name)

    def change_rate_key(self, name: str, *, rate: dict[str, int] | None, reason: str = "") -> dict[str, Any]:
        """Operator: set a rate key's rate, ``{"count": C, "per_seconds": S}`` (None: none);
        `reason` goes to its history. `Forbidden` without operator rights (or for a key limited
        to some queues), `ValidationFailed` for a bad rate (nothing changed)."""
        return self.request("PUT", self._path("rate-keys", name), {"rate": rate, "reason": reason})

    # -- fairness keys (turns in the claim order, and a budget shared across queues) ----------

    def fairness_keys(self) -> builtins.list[dict[str, Any]]:
        """Every fairness key the board has a row for (those the tasks of this key's queues name,
        for a key limited to some), by name: each a dict as `FairnessKey.get` describes it."""
        return self.request("GET", "/fairness-keys")["items"]

    def fairness_key(self, name: str) -> FairnessKey:
        """A handle on the fairness key `name` (no request is sent until one of its methods is
        called): ``client.fairness_key("plan:42").set_budget(tokens=2_000_000, per="day")``."""
        return FairnessKey(self, name)

    def get_fairness_key(self, name: str) -> dict[str, Any]:
        """One fairness key's weight, budget and spend (see `FairnessKey.get`)."""
        return self.request("GET", self._path("fairness-keys", name))

    def change_fairness_key(self, name: str, *, budget: dict[str, Any] | None, reason: str = "") -> dict[str, Any]:
        """Operator: set a fairness key's budget, ``{"tokens"?: N, "cost_usd"?: X, "per": "day" |
        "month" | "total"}`` (None: none); `reason` (at most 500 characters) goes to its history.
        Returns the key as it is now. `Forbidden` without operator rights (or for a key limited
        to some queues), `ValidationFailed` for a bad budget (nothing changed)."""
        return self.request("PUT", self._path("fairness-keys", name), {"budget": budget, "reason": reason})

    # -- resources (what a claim takes with its task) ----------------------------------------

    def resources(self) -> builtins.list[dict[str, Any]]:
        """Every resource tasks have named (and each directory a pattern holds), by name:
        ``name``, ``capacity``, ``held`` (units, or ``"exclusive"``), ``holds_below`` and
        ``holders`` (each ``task``, ``agent``, ``fence``, ``units``, ``exclusive``,
        ``expires_at``: a hold ends with its lease). Empty for a key limited to some queues.
        Every page (500 a request)."""
        found: builtins.list[dict[str, Any]] = []
        after = None
        while True:
            page = self.request("GET", "/resources", query={"after": after, "limit": 500})
            found += page["items"]
            after = page["next_after"]
            if after is None:
                return found

    def set_resource_capacity(self, name: str, capacity: int, *, reason: str = "") -> dict[str, Any]:
        """Operator: shared holders of `name` may hold `capacity` units together (1-10,000; an
        exclusive hold takes it whole). Returns the resource as `resources` lists it."""
        return self.request("PUT", self._path("resources", name), {"capacity": capacity, "reason": reason})

    def resource_holder(self, name: str, task_id: str, fence: int) -> dict[str, Any]:
        """Whether the lease (`task_id`, `fence`) holds the resource `name` now: ``holds`` (False
        once the lease ended or was taken over: a newer fence), and the node's ``holders``. What a
        downstream system asks before it accepts a write (examples/git-hooks/pre-push);
        ``lease.holds(name)`` asks it for a lease."""
        return self.request("GET", "/resource-holder", query={"name": name, "task": task_id, "fence": fence})

    # -- schedules (periodic tasks) ---------------------------------------------------------

    def schedules(self) -> builtins.list[dict[str, Any]]:
        """Every schedule (of the queues this key may read), by name: each a dict as
        `Schedule.get` describes it."""
        return self.request("GET", "/schedules")["items"]

    def schedule(self, name: str) -> Schedule:
        """A handle on the schedule `name` (no request is sent until one of its methods is
        called): ``client.schedule("nightly").create("0 2 * * *", {"title": "report"})``."""
        return Schedule(self, name)

    def create_schedule(self, name: str, cron: str, task: dict[str, Any], *, timezone: str = "UTC",
                        paused: bool = False) -> dict[str, Any]:
        """Operator: create a schedule (see `Schedule.create`)."""
        return self.request("POST", "/schedules", {"name": name, "cron": cron, "timezone": timezone,
                                                   "task": task, "paused": paused})

    def get_schedule(self, name: str) -> dict[str, Any]:
        """One schedule (see `Schedule.get`)."""
        return self.request("GET", self._path("schedules", name))

    def change_schedule(self, name: str, *, cron: str | None = None, timezone: str | None = None,
                        task: dict[str, Any] | None = None, paused: bool | None = None) -> dict[str, Any]:
        """Operator: change a schedule; only what is given changes (see `Schedule.update`,
        `pause`, `resume`)."""
        body: dict[str, Any] = {}
        if cron is not None:
            body["cron"] = cron
        if timezone is not None:
            body["timezone"] = timezone
        if task is not None:
            body["task"] = task
        if paused is not None:
            body["paused"] = paused
        return self.request("PUT", self._path("schedules", name), body)

    def delete_schedule(self, name: str) -> None:
        """Operator: delete a schedule; the tasks it created stay."""
        self.request("DELETE", self._path("schedules", name))

    # -- health -----------------------------------------------------------------------------

    def check(self) -> builtins.list[dict[str, Any]]:
        """The board's invariant problems (``[{"task", "code", "text"}, ...]``); empty when
        the board is consistent."""
        return self.request("GET", "/check")["problems"]

    def wait_ready(self, timeout: float = 30.0, interval: float = 0.1) -> None:
        """Wait until the server answers (any API answer, even 401), up to `timeout` seconds;
        `TransportError` if it never does. For scripts that start the server themselves."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", "/tasks", query={"limit": 1})
                return
            except TaskflowError:
                return
            except TransportError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(interval)
