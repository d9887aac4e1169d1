"""``python -m taskflow_client.mcp`` -- the board as Model Context Protocol tools, over stdio.

An MCP client (Claude Desktop, an IDE assistant, an agent framework) starts this as a
subprocess; its model then plans, claims and finishes tasks through the tools below. The server
talks to the board only through `taskflow_client.Client` (``TASKFLOW_URL``, ``TASKFLOW_KEY``),
so it works against any deployment; the agent's name on the board is the key's.

The lease token never reaches the model: the server keeps one `Job` per task this session
holds, and the job's heartbeat renews the lease every ttl/3 (the same machinery as
``client.hold()``) until the model completes, fails, pauses or releases the task. When the
session ends (the client closes stdin, or SIGTERM/SIGINT/SIGHUP) every lease still held is
released, so its task goes back to the queue without counting an attempt.

A refusal comes back as a tool error (``isError``) whose text is the board's error body,
``{"error": {"code", "message", ...}}`` (``lease_lost``, ``taken``, ``blocked``, ...); the
server's own codes are ``validation_error`` (the arguments do not fit the tool's schema;
nothing was sent), ``not_held`` (this session holds no lease on the task), ``unknown_tool``
and ``transport_error`` (no definitive answer from the board).

A tool call's trace goes on into the board's: the MCP SDK runs each call under a span made from
its ``_meta.traceparent`` (recording nothing unless this process configures an OpenTelemetry
SDK, but carrying the caller's ids), the call runs in a worker thread that inherits that
context, and the client's requests send it as their ``traceparent`` (taskflow_client.client.
trace_headers; docs/tracing.md).

This module needs the ``mcp`` SDK (requirements.txt pins it); the rest of `taskflow_client`
needs only the standard library.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from jsonschema import Draft202012Validator
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .client import Client, Lease
from .errors import LeaseLost, TaskflowError, TransportError
from .hold import Job

__all__ = ["TOOLS", "Holdings", "ToolFailure", "build_server", "main"]

log = logging.getLogger("taskflow_client.mcp")

DEFAULT_TTL = 60.0  # seconds; the heartbeat renews every ttl/3, so a dead server's leases end soon
LIST_LIMIT = 20
QUEUE_LIMIT = 50  # queues list_queues shows, by name
HISTORY_EVENTS = 50  # the most recent events get_task shows (each renewal is one)
INSTRUCTIONS = (
    "TaskFlow board tools. Claiming gives you a lease that this server renews in the background "
    "(you never see a token); finish every task you claim with complete, fail, pause or release. "
    "Errors are JSON {\"error\": {\"code\", \"message\"}} with the board's codes "
    "(taken, blocked, lease_lost, ...)."
)


class ToolFailure(Exception):
    """A tool call refused before or without the board: `code` and `message` for the model."""

    def __init__(self, code: str, message: str, details: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# -- compact views for the model (every field costs tokens) ----------------------------------

_NOISE = ("version", "created_at", "updated_at", "stage_changed_at")


def brief(task: dict[str, Any]) -> dict[str, Any]:
    """The task without bookkeeping fields and without empty values (stage always kept)."""
    return {k: v for k, v in task.items()
            if k not in _NOISE and (k == "stage" or v not in (None, "", [], {}, False))}


def brief_history(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per event; a run of renewals by the same actor becomes one line with a count."""
    lines: list[dict[str, Any]] = []
    for event in events:
        last = lines[-1] if lines else None
        if (event["verb"] == "renew" and last is not None and last["verb"] == "renew"
                and last["actor"] == event["actor"]):
            last["count"] = last.get("count", 1) + 1
            last["at"] = event["at"]
            continue
        line = {"verb": event["verb"], "actor": event["actor"], "at": event["at"], "to": event["to_stage"]}
        if event.get("detail"):
            line["detail"] = event["detail"]
        lines.append(line)
    return lines


def _error_body(exc: BaseException) -> dict[str, Any]:
    """The board's error shape for any failure a tool reports."""
    if isinstance(exc, TaskflowError):
        error: dict[str, Any] = {"code": exc.code, "message": exc.message}
        if exc.task:  # the task as it is now: enough to act on (who holds it, its stage)
            error["task"] = {k: exc.task[k] for k in ("id", "stage", "owner", "not_before") if exc.task.get(k)}
        if exc.details:
            error["details"] = exc.details
        return {"error": error}
    if isinstance(exc, ToolFailure):
        error = {"code": exc.code, "message": exc.message}
        if exc.details:
            error["details"] = exc.details
        return {"error": error}
    if isinstance(exc, TransportError):
        return {"error": {"code": "transport_error", "message": exc.message}}
    raise TypeError(f"not a tool failure: {exc!r}")


# -- the leases this session holds ------------------------------------------------------------


class Holdings:
    """The tasks this MCP session holds: task id -> `Job` (its lease, token and heartbeat).
    Tool calls run in worker threads, so the map is guarded by a lock; each job orders its own
    requests."""

    def __init__(self, client: Client):
        self.client = client
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    def take(self, lease: Lease) -> Job:
        """Hold `lease` from now on: its heartbeat starts renewing it."""
        job = Job(lease).start()
        with self._lock:
            stale = self._jobs.pop(lease.task_id, None)
            self._jobs[lease.task_id] = job
        if stale is not None:  # an older lease on the same task (lost, then claimed again)
            stale.stop()
        return job

    def job(self, task_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(task_id)
        if job is None:
            raise ToolFailure("not_held", f"this session holds no lease on task {task_id!r}; "
                                          "claim (or resume) it first")
        return job

    def _drop(self, task_id: str, job: Job) -> None:
        with self._lock:
            if self._jobs.get(task_id) is job:
                del self._jobs[task_id]

    def use(self, task_id: str, call: Callable[[Job], Any]) -> Any:
        """Run `call` on the task's job. A finished job (complete/fail/pause/release) or a lost
        lease leaves the session; any other failure keeps the job, so the model may try again."""
        job = self.job(task_id)
        try:
            return call(job)
        except LeaseLost:
            job.stop()
            self._drop(task_id, job)
            raise
        finally:
            if job.outcome is not None:
                self._drop(task_id, job)

    def release_all(self) -> list[str]:
        """Release every lease still held (the session is ending); returns the task ids released."""
        with self._lock:
            jobs, self._jobs = dict(self._jobs), {}
        released = []
        for task_id, job in sorted(jobs.items()):
            try:
                job.release()
                released.append(task_id)
            except (TaskflowError, TransportError) as exc:  # lost already, or the board is away
                job.stop()
                log.warning("task %s: could not release the lease at the end of the session: %s", task_id, exc)
        return released


# -- the tools --------------------------------------------------------------------------------

_ID = {"type": "string"}  # the board says what an id may be (a 422 the model reads)
_TTL = {"type": "number"}  # the lease's seconds (default DEFAULT_TTL): the name says it
_ANY_BUT_NULL = {"not": {"type": "null"}}


def _schema(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    """A strict object schema: unknown fields are refused."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


_TASK = _schema(
    ("title",), id=_ID, title={"type": "string"}, description={"type": "string"}, payload={},
    queue={"type": "string"}, priority={"type": "integer"},
    deps={"type": "array", "items": {"type": "string"}},  # run after (the tool's description: a DAG)
    on_hold={"type": "boolean"}, max_retries={"type": "integer"},
    # The tool list stays under 5,000 characters (tests/test_mcp.py): the API's docs say the rest,
    # and the board refuses what is out of range with a validation_error the model reads.
    concurrency_key={"type": "string", "description": "caps RUNNING sharing it"},
    concurrency_limit={"type": "integer"},
    dedup_key={"type": "string", "description": "dedupes live tasks"},
    fairness_key={"type": "string", "description": "plans take turns"},
    tags={"type": "array", "items": {"type": "string"}},
    resources={"type": "array"},  # names held while RUNNING (docs/resources.md)
    requires={"type": "array"},  # capabilities its claimer must hold (docs/capabilities.md)
)


def create_tasks(holdings: Holdings, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    made = holdings.client.create(tasks)
    return {"tasks": [{k: t[k] for k in ("id", "stage", "deps", "deduplicated") if t[k]} for t in made]}


def _held(holdings: Holdings, lease: Lease) -> dict[str, Any]:
    job = holdings.take(lease)
    answer: dict[str, Any] = {"task": brief(job.task)}
    # The claim's hand-offs: the dependencies' results, what earlier attempts and staff wrote.
    if lease.inputs:
        answer["inputs"] = lease.inputs
    if lease.inputs_omitted:
        answer["inputs_omitted"] = lease.inputs_omitted
    if lease.notes:
        answer["notes"] = [{k: note[k] for k in ("text", "author", "attempt")} for note in lease.notes]
    if lease.approval:  # the last answer a person gave this task's question
        answer["approval"] = {k: lease.approval[k] for k in ("question", "approved", "values", "comment", "answered_by")}
    return answer


def claim(holdings: Holdings, task_id: str | None = None, queue: str | None = None,
          ttl_seconds: float = DEFAULT_TTL, wait_seconds: float = 0) -> dict[str, Any]:
    if task_id is not None:
        if queue is not None or wait_seconds:
            raise ToolFailure("validation_error", "task_id claims that task: leave out queue and wait_seconds")
        return _held(holdings, holdings.client.claim(task_id, ttl_seconds))
    lease = holdings.client.claim_next(ttl_seconds, queue=queue, wait_seconds=wait_seconds)
    if lease is None:
        return {"task": None, "message": "no task is ready"}
    return _held(holdings, lease)


def resume(holdings: Holdings, task_id: str, ttl_seconds: float = DEFAULT_TTL) -> dict[str, Any]:
    return _held(holdings, holdings.client.resume(task_id, ttl_seconds))


def checkpoint(holdings: Holdings, task_id: str, checkpoint: Any = None, progress: float | None = None) -> dict[str, Any]:
    def save(job: Job) -> dict[str, Any]:
        job.checkpoint(checkpoint, progress)  # renews now; the heartbeat goes on renewing
        return {"task": {k: v for k, v in brief(job.task).items()
                         if k in ("id", "stage", "checkpoint", "progress", "lease_expires_at")}}
    return holdings.use(task_id, save)


def complete(holdings: Holdings, task_id: str, result: Any = None, next: bool = False,  # noqa: A002 (the API's name)
             queue: str | None = None) -> dict[str, Any]:
    result = {} if result is None else result
    if not next:
        return {"task": brief(holdings.use(task_id, lambda job: job.complete(result)))}
    claimed: list[Lease | None] = []

    def complete_and_claim(job: Job) -> dict[str, Any]:
        # One request: the complete, and a claim of the next ready task (in `queue`) with this
        # lease's TTL, held by the session from now on as a claim's lease is.
        def call() -> dict[str, Any]:
            task, lease = holdings.client.complete_and_claim(task_id, job.lease.token, result,
                                                             ttl_seconds=job.lease.ttl_seconds, queue=queue)
            claimed.append(lease)
            return task
        return job._finish("completed", call)

    answer: dict[str, Any] = {"task": brief(holdings.use(task_id, complete_and_claim))}
    lease = claimed[0] if claimed else None
    answer["next"] = None if lease is None else _held(holdings, lease)["task"]
    return answer


def add_note(holdings: Holdings, task_id: str, text: str) -> dict[str, Any]:
    note = holdings.use(task_id, lambda job: job.note(text))
    return {"note": {k: note[k] for k in ("id", "attempt", "at")}}


def request_approval(holdings: Holdings, task_id: str, question: str, form: dict[str, Any] | None = None) -> dict[str, Any]:
    # Not a wait: a model's tool call must not hang while a person thinks. The lease is given up
    # with the question; the model claims the task again once it is answered (kept for it 60 s).
    asked: list[dict[str, Any]] = []

    def ask(job: Job) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            answer = holdings.client.request_approval(task_id, job.lease.token, question, form=form)
            asked.append(answer["approval"])
            return answer["task"]
        return job._finish("paused", call)

    task = holdings.use(task_id, ask)
    return {"task": brief(task), "approval": {k: asked[0][k] for k in ("id", "state", "due_at")},
            "message": "the lease is given up; once a person answers (get_task: awaiting_approval false), "
                       "claim task_id: the answer comes as approval"}


def fail(holdings: Holdings, task_id: str, error: str, retryable: bool = True) -> dict[str, Any]:
    return {"task": brief(holdings.use(task_id, lambda job: job.fail(error, retryable=retryable)))}


def pause(holdings: Holdings, task_id: str, checkpoint: Any) -> dict[str, Any]:
    return {"task": brief(holdings.use(task_id, lambda job: job.pause(checkpoint)))}


def release(holdings: Holdings, task_id: str) -> dict[str, Any]:
    return {"task": brief(holdings.use(task_id, lambda job: job.release()))}


def snooze(holdings: Holdings, task_id: str, seconds: float) -> dict[str, Any]:
    return {"task": brief(holdings.use(task_id, lambda job: job.snooze(seconds)))}


def get_task(holdings: Holdings, task_id: str, history: bool = True) -> dict[str, Any]:
    answer: dict[str, Any] = {"task": brief(holdings.client.get(task_id))}
    if history:
        # The recent history only, in one request (a task renewed every second for a day has
        # ~86,000 events): one more than shown tells whether earlier ones were left out.
        events = holdings.client.events(task_id, last=HISTORY_EVENTS + 1)
        answer["history"] = brief_history(events[-HISTORY_EVENTS:])
        if len(events) > HISTORY_EVENTS:
            answer["history_truncated"] = True
    return answer


def list_ready(holdings: Holdings, queue: str | None = None, limit: int = LIST_LIMIT) -> dict[str, Any]:
    # QUEUED in the board's claim order (claim_rank: priority with aging, fairness keys), sorted and cut by the board: one
    # request for `limit` + 1 tasks (the one more says whether there are more). One backing off
    # after a failure shows its not_before.
    queued = holdings.client.list(stage="QUEUED", queue=queue, order="claim", limit=limit + 1)
    fields = ("id", "title", "queue", "priority", "attempts", "not_before")
    tasks = [{k: t[k] for k in fields if t.get(k) not in (None, "")} for t in queued[:limit]]
    return {"tasks": tasks, "more": len(queued) > limit, "held_by_you": holdings.held()}


def list_queues(holdings: Holdings, limit: int = QUEUE_LIMIT) -> dict[str, Any]:
    # Each queue's brake and limit beside what waits in it, so that a model whose claims come
    # back empty can tell a paused or full queue from an empty one. Only what is set or nonzero.
    queues = holdings.client.queues()
    shown = []
    for queue in queues[:limit]:
        line: dict[str, Any] = {"name": queue["name"], "running": queue["running"]}
        if queue["concurrency"] is not None:
            line["concurrency"] = queue["concurrency"]
        if queue["paused"]:
            line.update(paused=True, paused_by=queue["paused_by"], paused_reason=queue["paused_reason"])
        line["depth"] = {stage: n for stage, n in queue["depth"].items() if n}
        if queue["oldest_queued_seconds"] is not None:
            line["oldest_queued_seconds"] = round(queue["oldest_queued_seconds"], 1)
        shown.append({k: v for k, v in line.items() if v not in (None, "")})
    return {"queues": shown, "more": len(queues) > limit}


def problems(holdings: Holdings) -> dict[str, Any]:
    return {"problems": holdings.client.check()}


class ToolSpec:
    def __init__(self, name: str, description: str, schema: dict[str, Any], run: Callable[..., dict[str, Any]]):
        self.name = name
        self.description = description
        self.schema = schema
        self.run = run
        self.validator = Draft202012Validator(schema)

    def as_tool(self) -> types.Tool:
        return types.Tool(name=self.name, description=self.description, input_schema=self.schema)


TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in (
    ToolSpec("create_tasks", "Create tasks, one or a plan (deps: a DAG); all or nothing. "
             "An identical re-send returns them.",
             _schema(("tasks",), tasks={"type": "array", "minItems": 1, "maxItems": 1000, "items": _TASK}),
             create_tasks),
    ToolSpec("claim", "Claim the next ready task (in queue, waiting up to wait_seconds) or task_id; renewed "
             "until you finish it. {\"task\": null} if none.",
             _schema(task_id=_ID, queue={"type": "string"}, ttl_seconds=_TTL,
                     wait_seconds={"type": "number", "minimum": 0, "maximum": 30}),
             claim),
    ToolSpec("checkpoint", "Save a checkpoint (for a resume) and/or progress 0..1 on a task you hold.",
             _schema(("task_id",), task_id=_ID, checkpoint=_ANY_BUT_NULL,
                     progress={"type": "number"}),
             checkpoint),
    ToolSpec("complete", "Complete a task you hold with its result (any JSON); next: true also claims your next "
             "task (in queue).",
             _schema(("task_id",), task_id=_ID, result={}, next={"type": "boolean"}, queue={"type": "string"}),
             complete),
    ToolSpec("add_note", "Note a task you hold for its next holders (a claim carries notes, and deps' "
             "results as inputs).",
             _schema(("task_id", "text"), task_id=_ID, text={"type": "string"}),
             add_note),
    # Operators answer it, and an unanswered one waits (the API's approvers and on_timeout are
    # left out: the tool list's budget).
    ToolSpec("request_approval", "Ask a person about a task you hold (lease given up); once answered, claim "
             "task_id to get the answer.",
             _schema(("task_id", "question"), task_id=_ID, question={"type": "string"},
                     form={"type": "object", "description": "JSON Schema of answer fields"}),
             request_approval),
    ToolSpec("fail", "Fail a task you hold; retryable (default true): queued again after a backoff "
             "while attempts remain.",
             _schema(("task_id", "error"), task_id=_ID, error={"type": "string", "minLength": 1},
                     retryable={"type": "boolean"}),
             fail),
    ToolSpec("pause", "Pause a task you hold, keeping a checkpoint; resume continues from it.",
             _schema(("task_id", "checkpoint"), task_id=_ID, checkpoint=_ANY_BUT_NULL), pause),
    ToolSpec("resume", "Take a PAUSED task again (its checkpoint is in the answer); renewed for you.",
             _schema(("task_id",), task_id=_ID, ttl_seconds=_TTL), resume),
    ToolSpec("release", "Give a task you hold back to the queue, no attempt counted.",
             _schema(("task_id",), task_id=_ID), release),
    ToolSpec("snooze", "Give a task you hold back, not claimable for `seconds` (up to a week); "
             "no attempt counted.",
             _schema(("task_id", "seconds"), task_id=_ID, seconds={"type": "number"}),
             snooze),
    ToolSpec("get_task", "A task and its last 50 events (history: false: none).",
             _schema(("task_id",), task_id=_ID, history={"type": "boolean"}), get_task),
    ToolSpec("list_ready", "QUEUED tasks in claim order, and the ids you hold.",
             _schema(queue={"type": "string"}, limit={"type": "integer", "minimum": 1, "maximum": 100}),
             list_ready),
    ToolSpec("list_queues", "Queues: running/limit, paused (who, why), tasks per stage, oldest wait. "
             "Claims skip paused/full.",
             _schema(limit={"type": "integer", "minimum": 1, "maximum": 200}), list_queues),
    ToolSpec("problems", "The board's problems (empty when healthy).", _schema(), problems),
)}


def _result(body: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=body, is_error=is_error)


def call_tool(holdings: Holdings, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """Validate the arguments against the tool's schema, run it, and shape the answer (blocking)."""
    spec = TOOLS.get(name)
    try:
        if spec is None:
            raise ToolFailure("unknown_tool", f"no tool named {name!r}; the tools are {', '.join(TOOLS)}")
        wrong = sorted(spec.validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if wrong:
            raise ToolFailure("validation_error", f"the arguments do not fit {name}'s schema; nothing was done",
                              details=[{"at": "/".join(map(str, e.absolute_path)) or "(arguments)",
                                        "problem": e.message[:300]} for e in wrong])
        return _result(spec.run(holdings, **arguments))
    except (TaskflowError, TransportError, ToolFailure) as exc:
        return _result(_error_body(exc), is_error=True)


def build_server(holdings: Holdings) -> Server:
    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[spec.as_tool() for spec in TOOLS.values()])

    async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        # The client is blocking (one keep-alive connection per thread): each call runs in a
        # worker thread, so a claim waiting for work does not hold up the other calls.
        work = functools.partial(call_tool, holdings, params.name, dict(params.arguments or {}))
        return await anyio.to_thread.run_sync(work)

    return Server("taskflow", version="1.0", instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=on_call_tool)


async def serve(server: Server, end_session: Callable[[], None]) -> None:
    """Serve one MCP session over stdio until the client closes stdin. On SIGTERM, SIGINT or
    SIGHUP: `end_session()`, then exit at once -- the stdin reader is a thread blocked in
    read(), which a cancellation would wait for until the client closed the pipe."""
    async with anyio.create_task_group() as group:
        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    await anyio.to_thread.run_sync(end_session)
                    sys.stderr.flush()
                    os._exit(128 + signum)

        group.start_soon(stop_on_signal)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        group.cancel_scope.cancel()


def client_config(url: str, key: str) -> dict[str, Any]:
    """The ``mcpServers`` entry that starts this server from this checkout."""
    return {"mcpServers": {"taskflow": {
        "command": sys.executable,
        "args": ["-m", "taskflow_client.mcp"],
        "env": {"PYTHONPATH": str(Path(__file__).resolve().parent.parent), "TASKFLOW_URL": url,
                "TASKFLOW_KEY": key},
    }}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taskflow_client.mcp",
        description="The TaskFlow board as MCP tools over stdio (for an MCP client to start). "
                    "Environment: TASKFLOW_URL (default http://127.0.0.1:8000), TASKFLOW_KEY (an agent key), "
                    "TASKFLOW_CAPABILITIES (optional: claim with only these of the key's capabilities, "
                    "comma-separated).")
    parser.add_argument("--print-config", action="store_true",
                        help="print the mcpServers JSON that starts this server from this checkout, and exit")
    args = parser.parse_args(argv)
    url = os.environ.get("TASKFLOW_URL", "http://127.0.0.1:8000")
    key = os.environ.get("TASKFLOW_KEY", "")
    if args.print_config:
        print(json.dumps(client_config(url, key or "tfk_..."), indent=2))
        return 0
    if not key:
        print("TASKFLOW_KEY is not set (create one: manage.py create_agent_key NAME)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="taskflow-mcp %(levelname)s %(message)s")
    # A session may claim with fewer of its key's capabilities (docs/capabilities.md): a model
    # set up for Python work on a key that also holds gpu. Set when the server starts, not per
    # tool call (the tool list stays short).
    narrowed = os.environ.get("TASKFLOW_CAPABILITIES", "").strip()
    capabilities = [label.strip() for label in narrowed.split(",") if label.strip()] if narrowed else None
    holdings = Holdings(Client(url, key, capabilities=capabilities))

    def end_session() -> None:
        released = holdings.release_all()
        if released:
            log.warning("session ended: released %s", ", ".join(released))

    try:
        anyio.run(serve, build_server(holdings), end_session)
    finally:
        end_session()  # a second call finds nothing held
    return 0


if __name__ == "__main__":
    sys.exit(main())
