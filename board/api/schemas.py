"""The JSON shapes of the agents' API, as the OpenAPI document shows them.

Output schemas (TaskOut, ClaimOut, EventOut...) describe what board.public builds, the one
public view of a task (no lease token field at all). Input schemas refuse unknown fields and do not
coerce types ("5" is not a number), so a client's mistake is reported rather than guessed at.
They cap every text (the limits are in `board.engine.lifecycle`) and refuse, in any string or JSON
value, what a database would refuse to store (NUL, lone surrogates), so that such input is a
422 rather than a database error.
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Optional, Union

from ninja import Schema
from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    field_validator,
    model_validator,
)

from board.engine import claim_requests
from board.engine.inputs import TASK_ID_PATTERN, json_too_deep, unstorable_text
from board.engine.capabilities import LABEL as CAPABILITY_LABEL
from board.engine.search import TAG_PATTERN
from board.engine.limits import (
    MAX_CAPABILITIES,
    MAX_CAPABILITY_CHARS,
    MAX_PREFER_WEIGHT,
    MAX_REQUIRES,
    PREFER_WINDOW,
    MAX_BATCH_TASKS,
    MAX_CLAIM_BATCH,
    MAX_COMPLETE_BATCH,
    MAX_CONCURRENCY,
    MAX_CONCURRENCY_KEY_CHARS,
    MAX_DEDUP_KEY_CHARS,
    MAX_FAIRNESS_KEY_CHARS,
    MAX_FAIRNESS_WEIGHT,
    MAX_RATE_COUNT,
    MAX_RATE_PER_SECONDS,
    MAX_CRON_CHARS,
    MAX_DEADLINE_SECONDS,
    MAX_DEPENDENCIES,
    MAX_DESCRIPTION_CHARS,
    MAX_ERROR_CHARS,
    MAX_REASON_CHARS,
    MAX_RESOURCE_CAPACITY,
    MAX_RESOURCE_NAME_CHARS,
    MAX_TASK_RESOURCES,
    MAX_REQUEST_ID_CHARS,
    MAX_RETRIES_LIMIT,
    MAX_SCHEDULE_NAME_CHARS,
    MAX_SNOOZE_SECONDS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    MAX_TOKEN_CHARS,
    MAX_NOTE_CHARS,
    MAX_APPROVAL_TIMEOUT_SECONDS,
    MAX_QUESTION_CHARS,
    MAX_NOTES_IN_CLAIM,
    MAX_NOTES_PER_TASK,
    MAX_INPUTS_BYTES,
    MAX_TRACEBACK_CHARS,
    MAX_TTL_SECONDS,
    MAX_WAIT_SECONDS,
    MIN_TTL_SECONDS,
)

# A capability label (board.engine.capabilities).
CapabilityLabel = Annotated[str, StringConstraints(min_length=1, max_length=MAX_CAPABILITY_CHARS,
                                                   pattern=CAPABILITY_LABEL.pattern)]


class StrictIn(Schema):
    """django-ninja's Schema validates a body twice when extra="forbid": once as is, then again
    through its DjangoGetter (which exists to read Django objects, never a request's JSON). Once
    is enough: the second pass was about 8% of a claim's or a complete's CPU (bench/api_cost.py).
    The validator keeps Schema's name, so it replaces Schema's rather than adding one: errors
    keep their shape (a union branch is still named `function-wrap[...]`, which the API's error
    handler drops from a location), and so does the OpenAPI document (tests/test_api_schema.py,
    tests/test_api.py's validation error tests)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(cls, values: Any, handler: ModelWrapValidatorHandler) -> Any:
        return handler(values)

    @field_validator("*")
    @classmethod
    def storable(cls, value):
        """Every string of every input (JSON values too) is one both databases can store."""
        if problem := unstorable_text(value):
            raise ValueError(problem)
        return value


def _not_too_deep(value: Any) -> Any:
    if problem := json_too_deep(value):
        raise ValueError(problem)
    return value


# A client's JSON value (payload, result, checkpoint): any JSON, nested at most MAX_JSON_DEPTH
# deep (the engine checks it too, for every caller; here it is a 422 naming the field).
JsonValue = Annotated[Any, AfterValidator(_not_too_deep)]

TTL = Field(..., ge=MIN_TTL_SECONDS, le=MAX_TTL_SECONDS, description="lease length in seconds")
TOKEN = Field(..., max_length=MAX_TOKEN_CHARS, description="the lease token the claim returned")
REQUEST_ID = Field(
    None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=claim_requests.PATTERN,
    description="your id for this claim (1-64 printable ASCII characters, unguessable: e.g. a uuid4). "
                "Sent again with the same id while the lease it made is live, the claim returns that "
                "lease (same task, token and fence) instead of claiming again: retry a claim whose "
                "answer was lost.")


def DEADLINE(description: str) -> Any:  # noqa: N802  (a Field, named as TTL and TOKEN are)
    return Field(None, ge=1, le=MAX_DEADLINE_SECONDS, strict=True, description=f"seconds; {description}")


class ResourceShareIn(StrictIn):
    name: str = Field(..., min_length=1, max_length=MAX_RESOURCE_NAME_CHARS)
    units: int = Field(1, ge=1, le=MAX_RESOURCE_CAPACITY, description="units of the resource's capacity")


class ResourceShareOut(Schema):
    name: str
    units: int


class TaskIn(StrictIn):
    id: Optional[str] = Field(None, description="client-chosen id; generated when omitted",
                              pattern=TASK_ID_PATTERN)
    title: str = Field(..., min_length=1, max_length=MAX_TITLE_CHARS)
    description: str = Field("", max_length=MAX_DESCRIPTION_CHARS)
    payload: JsonValue = None
    queue: str = Field("default", pattern=TASK_ID_PATTERN)
    priority: int = Field(0, ge=-(2**31) + 1, le=2**31 - 1, description="higher runs first")
    deps: list[str] = Field(default_factory=list, max_length=MAX_DEPENDENCIES,
                            description="ids of tasks that must be COMPLETED first")
    on_hold: bool = Field(False, description="stay PENDING until an operator admits it")
    hold: Optional[bool] = Field(None, description="on_hold's former name, still accepted (not both)",
                                 json_schema_extra={"deprecated": True})
    max_retries: int = Field(3, ge=0, le=MAX_RETRIES_LIMIT)
    concurrency_key: Optional[str] = Field(
        None, min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS,
        description="at most the key's limit of RUNNING tasks share this key (e.g. repo:acme/web)")
    concurrency_limit: Optional[int] = Field(
        None, ge=1, le=MAX_CONCURRENCY,
        description="the key's limit (needs concurrency_key; the latest create naming one sets it; a new key: 1)")
    rate_key: Optional[str] = Field(
        None, min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS,
        description="claims of the tasks sharing this key start no faster than its rate, whatever their queues "
                    "(e.g. provider:openai; the rate is set with PUT /api/rate-keys/{name})")
    run_at: Optional[AwareDatetime] = Field(
        None, strict=False, description="not claimable before this time (ISO 8601 with its zone); shown as not_before")
    dedup_key: Optional[str] = Field(
        None, min_length=1, max_length=MAX_DEDUP_KEY_CHARS,
        description="while a live task (not COMPLETED, FAILED or CANCELLED) has this key, this create returns "
                    "that task (200, deduplicated: true) and creates nothing")
    fairness_key: Optional[str] = Field(
        None, min_length=1, max_length=MAX_FAIRNESS_KEY_CHARS,
        description="tasks of different keys (a plan, a person) take turns among equal priorities: each task "
                    "a key already has waiting counts as one priority level less for its next")
    fairness_weight: Optional[int] = Field(
        None, ge=1, le=MAX_FAIRNESS_WEIGHT,
        description="the key's weight: its turns for another key's one (needs fairness_key; the latest create "
                    "naming one sets it; a new key: 1)")
    tags: Optional[list[Annotated[str, StringConstraints(pattern=TAG_PATTERN)]]] = Field(
        None, max_length=MAX_TAGS,
        description="labels to find the task by (search: tag:NAME): each 1-50 letters, digits and ._:/-")

    resources: Optional[list[Union[str, ResourceShareIn]]] = Field(
        None, max_length=MAX_TASK_RESOURCES,
        description="resources a claim takes with the task, all or none, held until the lease ends: a name is "
                    "exclusive (merge-slot, branch:main, file:src/app/**: a pattern holds its directory's "
                    "subtree), {\"name\", \"units\"} shares the resource's capacity (docs/resources.md)")
    requires: Optional[list[CapabilityLabel]] = Field(
        None, max_length=MAX_REQUIRES,
        description="capability labels a claimer must all hold (its agent key's capabilities, or the claim's "
                    "narrower `capabilities`): python, gpu, model:opus, repo:acme/web (docs/capabilities.md)")
    prefers: Optional[Union[dict[CapabilityLabel, Annotated[int, Field(ge=1, le=MAX_PREFER_WEIGHT)]],
                            list[CapabilityLabel]]] = Field(
        None, description="labels a claimer is preferred for, {label: weight} (a list: weight 1 each): to a claimer "
                          "holding them the task counts as that many priority levels higher, among the first "
                          f"{PREFER_WINDOW} tasks it could take")

    # --- deadlines beside the lease (issue 29, item 7; board.engine.deadlines)
    queue_timeout_seconds: Optional[int] = DEADLINE(
        "FAILED (reason: not started in time) when QUEUED and claimable this long without starting")
    attempt_timeout_seconds: Optional[int] = DEADLINE(
        "one attempt's wall-clock limit: past it the lease is taken back as an expired one, renewed or not")
    progress_timeout_seconds: Optional[int] = DEADLINE(
        "a renew keeps the lease only if its progress or checkpoint changed within this many seconds")

    @field_validator("run_at", mode="before")
    @classmethod
    def _run_at_is_text(cls, value: Any) -> Any:
        # Parsed from ISO 8601 text only (the lax parse would also take a number as a Unix time).
        if value is not None and not isinstance(value, str):
            raise ValueError("run_at must be an ISO 8601 time with its zone, e.g. 2026-12-04T14:05:00Z")
        return value

    @model_validator(mode="after")
    def _hold_is_on_hold(self) -> "TaskIn":
        # `hold`, the gate's name before issue 28, still sets it; with on_hold too, they must agree.
        if self.hold is not None:
            if "on_hold" in self.model_fields_set and self.on_hold != self.hold:
                raise ValueError("hold is on_hold's former name: give on_hold only")
            self.on_hold = self.hold
        return self


# Checked before any item is: a body of 70,000 tasks is refused at once (413, see api.py).
TaskBatchIn = Annotated[list[TaskIn], Field(max_length=MAX_BATCH_TASKS)]


CAPABILITIES = Field(None, max_length=MAX_CAPABILITIES,
                     description="narrow this claim to these of the agent key's capabilities (omitted: all of the "
                                 "key's); a task requiring others is not taken. Naming one the key lacks: 403")


class NextIn(StrictIn):
    """The claim a complete, fail or release is followed by (`next`): claim's own fields."""

    ttl_seconds: float = TTL
    queue: Optional[str] = Field(None, pattern=TASK_ID_PATTERN)
    wait_seconds: float = Field(0, ge=0, le=MAX_WAIT_SECONDS, description="wait up to this long for work")
    request_id: Optional[str] = REQUEST_ID
    capabilities: Optional[list[CapabilityLabel]] = CAPABILITIES


NEXT = Field(None, description="then claim the next ready task for this agent, as POST /api/claim with these fields "
                               "would; the answer's `next` holds it (null: none was ready). In one transaction with "
                               "this move on SQLite and PostgreSQL (docs/api.md)")


class ClaimNextIn(NextIn):
    max_tasks: Optional[int] = Field(
        None, ge=1, le=MAX_CLAIM_BATCH,
        description=f"claim up to this many (1-{MAX_CLAIM_BATCH}), each its own lease; the answer is then "
                    "{\"leases\": [...]} in claim order (omitted: one claim, answered as ever)")


class ClaimIn(StrictIn):
    ttl_seconds: float = TTL
    request_id: Optional[str] = REQUEST_ID
    capabilities: Optional[list[CapabilityLabel]] = CAPABILITIES


class ResumeIn(StrictIn):
    ttl_seconds: float = TTL
    capabilities: Optional[list[CapabilityLabel]] = CAPABILITIES


class UsageIn(StrictIn):
    """What the attempt used since its lease's previous report (each report is added)."""
    model: str = Field("", max_length=100, description="the model's name, e.g. claude-opus-4")
    input_tokens: int = Field(0, ge=0, le=10**12)
    output_tokens: int = Field(0, ge=0, le=10**12)
    cost_usd: Optional[float] = Field(None, ge=0, le=10**6, description="absent: not known (never read as zero)")
    source: Literal["reported", "estimated"] = "reported"


USAGE = Field(None, description="tokens and cost used since this lease's last report (GET /api/tasks/{id}/usage)")


class RenewIn(StrictIn):
    token: str = TOKEN
    ttl_seconds: float = TTL
    checkpoint: JsonValue = None
    progress: Optional[float] = Field(None, ge=0, le=1)
    usage: Optional[UsageIn] = USAGE


class TokenIn(StrictIn):
    token: str = TOKEN


class ReleaseIn(TokenIn):
    retry_after_seconds: Optional[float] = Field(
        None, ge=1, le=MAX_SNOOZE_SECONDS,
        description="snooze: back to QUEUED but not claimable for this long (attempts unchanged)")
    next: Optional[NextIn] = NEXT


class CompleteIn(StrictIn):
    token: str = TOKEN
    result: JsonValue = Field(..., description="any JSON value but null")
    next: Optional[NextIn] = NEXT
    usage: Optional[UsageIn] = USAGE


class FailIn(StrictIn):
    token: str = TOKEN
    error: str = Field(..., max_length=MAX_ERROR_CHARS)
    traceback: Optional[str] = Field(None, max_length=MAX_TRACEBACK_CHARS,
                                     description="kept with this failure in the task's history")
    retryable: bool = True
    next: Optional[NextIn] = NEXT
    usage: Optional[UsageIn] = USAGE


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("result is required (use {} for a task with no output)")
    return value


class CompleteItemIn(StrictIn):
    id: str = Field(..., pattern=TASK_ID_PATTERN)
    token: str = TOKEN
    result: Annotated[JsonValue, AfterValidator(_not_null)] = Field(..., description="any JSON value but null")
    usage: Optional[UsageIn] = USAGE


class CompleteBatchIn(StrictIn):
    items: list[CompleteItemIn] = Field(..., min_length=1, max_length=MAX_COMPLETE_BATCH,
                                        description=f"1-{MAX_COMPLETE_BATCH} completions, each a task named once")

    @field_validator("items")
    @classmethod
    def _each_task_once(cls, items: list[CompleteItemIn]) -> list[CompleteItemIn]:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise ValueError(f"task {item.id} appears twice in the batch")
            seen.add(item.id)
        return items


class PauseIn(StrictIn):
    token: str = TOKEN
    checkpoint: JsonValue = Field(..., description="what a resume needs to continue; not null")


class OperatorIn(StrictIn):
    version: Optional[int] = Field(None, description="refuse with version_conflict if the task moved on")
    reason: str = Field("", max_length=MAX_REASON_CHARS)


class TaskEditIn(StrictIn):
    version: int = Field(..., description="the version you saw: refused with version_conflict if the task moved on")
    title: Optional[str] = Field(None, min_length=1, max_length=MAX_TITLE_CHARS)
    description: Optional[str] = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    payload: JsonValue = Field(None, description="the new payload (sent as null: left as it is)")
    priority: Optional[int] = Field(None, ge=-(2**31) + 1, le=2**31 - 1)
    max_retries: Optional[int] = Field(None, ge=0, le=MAX_RETRIES_LIMIT)
    tags: Optional[list[Annotated[str, StringConstraints(pattern=TAG_PATTERN)]]] = Field(
        None, max_length=MAX_TAGS, description="the task's tags, all of them ([]: none)")


class RequeueIn(OperatorIn):
    reset_attempts: bool = False


class TaskOut(Schema):
    id: str
    title: str
    description: str
    payload: Any
    queue: str
    priority: int
    deps: list[str]
    on_hold: bool
    max_retries: int
    stage: str
    version: int
    owner: str
    fence: int
    lease_expires_at: Optional[datetime]
    attempts: int
    not_before: Optional[datetime]
    checkpoint: Any
    progress: Optional[float]
    result: Any
    error: str
    created_at: datetime
    updated_at: datetime
    stage_changed_at: datetime = Field(..., description="when the task entered its current stage")
    concurrency_key: Optional[str] = Field(None, description="the concurrency key it shares with other tasks, if any")
    rate_key: Optional[str] = Field(None, description="the rate key whose rate its claims obey, if any")
    dedup_key: Optional[str] = Field(None, description="while this task is live, a create with this key returns it")
    fairness_key: Optional[str] = Field(None, description="tasks of different keys take turns among equal priorities")
    tags: list[str] = Field(..., description="labels to find the task by (search: tag:NAME)")
    resources: Optional[list[Union[str, ResourceShareOut]]] = Field(
        None, description="resources a claim takes with it (a name: exclusive); null: none")
    requires: Optional[list[str]] = Field(None, description="capability labels a claimer must all hold; null: none")
    prefers: Optional[dict[str, int]] = Field(None, description="labels a claimer is preferred for, with weights "
                                                                "(priority levels); null: none")
    replay_of: Optional[str] = Field(None, description="the finished task this one was run again from "
                                                       "(POST /api/tasks/{id}/replay); its replays: search replay_of:ID")
    claim_rank: float = Field(..., description="the line's order: claims take the lowest first (its turn, Unix seconds, "
                                               "minus priority x 60 s; then id)")
    queue_timeout_seconds: Optional[int] = Field(None, description="FAILED when QUEUED and claimable this long")
    attempt_timeout_seconds: Optional[int] = Field(None, description="one attempt's wall-clock limit")
    progress_timeout_seconds: Optional[int] = Field(
        None, description="the lease is taken back when progress and checkpoint stay unchanged this long")
    progress_changed_at: Optional[datetime] = Field(
        None, description="when a renew last changed progress or saved a checkpoint (or a pause saved one)")
    notes_count: int = Field(0, description="notes on the task (GET /api/tasks/{id}/notes)")
    awaiting_approval: bool = Field(False, description="PAUSED waiting for the answer to its approval "
                                                       "(GET /api/tasks/{id}/approvals)")
    approvals_count: int = Field(0, description="approvals it asked for, over all its attempts")
    hold: bool = Field(..., description="on_hold's former name (the same value)", json_schema_extra={"deprecated": True})


class ReplayIn(StrictIn):
    id: Optional[str] = Field(None, pattern=TASK_ID_PATTERN, description="the new task's id (default: generated)")
    payload: JsonValue = Field(None, description="the new task's payload (default: the original's)")


class UsageTotalsOut(Schema):
    input_tokens: int
    output_tokens: int
    cost_usd: Optional[float] = Field(None, description="null when a report gave no cost (see cost_missing)")
    cost_missing: int = Field(..., description="reports without a cost")
    reports: int


class AttemptUsageOut(UsageTotalsOut):
    fence: int
    agent: Optional[str]
    models: list[str]


class TaskUsageOut(Schema):
    task: str
    total: UsageTotalsOut
    attempts: list[AttemptUsageOut] = Field(..., description="by lease (fence), in order")


class AgentUsageOut(UsageTotalsOut):
    agent: str


class QueueUsageOut(UsageTotalsOut):
    queue: str


class UsageOut(Schema):
    since: datetime
    agent: list[AgentUsageOut] = Field(..., description="by agent, most tokens first")
    queue: list[QueueUsageOut] = Field(..., description="by queue, most tokens first")


class NoteOut(Schema):
    id: int
    text: str
    author: str = Field(..., description="the agent that held the task, or the staff user")
    by_holder: bool = Field(..., description="written by the lease's holder (else by staff)")
    attempt: int = Field(..., description="the task's attempt when written (0: before its first claim)")
    fence: int = Field(..., description="the task's fence when written: which lease's attempt")
    at: datetime


class NotePage(Schema):
    items: list[NoteOut] = Field(..., description=f"every note of the task, oldest first (at most {MAX_NOTES_PER_TASK})")


class NoteIn(StrictIn):
    token: Optional[str] = Field(None, max_length=MAX_TOKEN_CHARS,
                                 description="the holder's lease token; without it, staff (operator rights) write the note")
    text: str = Field(..., min_length=1, max_length=MAX_NOTE_CHARS)


class ApprovalOut(Schema):
    id: int
    task: str
    question: str
    form: Optional[dict[str, Any]] = Field(None, description="the JSON Schema of the answer's values (flat fields)")
    approvers: list[str] = Field(..., description="usernames or group names allowed to answer; empty: operators")
    asked_by: str = Field(..., description="the agent that held the task and asked")
    asked_at: datetime
    attempt: int
    fence: int = Field(..., description="the lease it was asked under")
    due_at: Optional[datetime] = Field(None, description="when on_timeout applies; null: it waits until answered")
    on_timeout: Literal["fail", "approve", "cancel"]
    state: Literal["waiting", "approved", "rejected", "timed_out", "cancelled"]
    approved: Optional[bool] = Field(None, description="the answer; null while waiting (or timed out, cancelled)")
    values: Optional[dict[str, Any]] = None
    comment: str = ""
    answered_by: Optional[str] = Field(None, description='the approver ("system:timeout" for a timeout)')
    answered_at: Optional[datetime] = None


class ApprovalRequestIn(StrictIn):
    token: str = TOKEN
    question: str = Field(..., min_length=1, max_length=MAX_QUESTION_CHARS)
    form: Optional[dict[str, Any]] = Field(
        None, description="a JSON Schema of flat fields (string, number, integer, boolean; enum, required, "
                          "title, description, default) the answer's values must match; the board draws it")
    approvers: Optional[list[str]] = Field(
        None, description="usernames or group names who may answer; none: anyone with operator rights")
    timeout_seconds: Optional[int] = Field(None, ge=1, le=MAX_APPROVAL_TIMEOUT_SECONDS,
                                           description="unanswered this long, on_timeout applies; none: no timeout")
    on_timeout: Literal["fail", "approve", "cancel"] = Field(
        "fail", description="fail: the task FAILS; approve: approved by system:timeout; cancel: the task is CANCELLED")
    checkpoint: JsonValue = Field(None, description="saved as a pause saves it; omitted: the last one stays")


class ApprovalAnswerIn(StrictIn):
    approve: bool
    values: Optional[dict[str, Any]] = Field(None, description="valid against the approval's form when approving")
    comment: str = Field("", max_length=MAX_QUESTION_CHARS, description="words for the agent")
    approval_id: Optional[int] = Field(None, description="the approval answered: refused with already_answered "
                                                         "when it is no longer the one waiting")


class ApprovalTaskOut(Schema):
    task: TaskOut
    approval: ApprovalOut


class ApprovalPage(Schema):
    items: list[ApprovalOut] = Field(..., description="oldest first (by id)")
    next_after: Optional[int] = Field(None, description="pass as `after` for the next page; null: the last page")


class LeaseOut(Schema):
    token: str = Field(..., description="send it back on renew/complete/fail/pause/release; shown only to the holder")
    fence: int = Field(..., description="rises with every new holder; pass it to downstream systems to refuse stale writers")
    expires_at: datetime
    # Hand-offs (board.engine.handoffs): on a claim, resume or next claim, never on a renew.
    inputs: Optional[dict[str, Any]] = Field(
        None, description="the results of the task's dependencies by id (present when it has any; "
                          f"up to {MAX_INPUTS_BYTES // 1024} KiB of JSON in all)")
    inputs_omitted: Optional[list[str]] = Field(
        None, description="dependencies whose results did not fit in inputs: read them with GET /api/tasks/{id}")
    notes: Optional[list[NoteOut]] = Field(
        None, description=f"the task's newest {MAX_NOTES_IN_CLAIM} notes, oldest first (present when it has any)")
    approval: Optional[ApprovalOut] = Field(
        None, description="the task's last answered approval (present when it ever asked one)")


class ClaimOut(Schema):
    task: TaskOut
    lease: LeaseOut


class ClaimBatchOut(Schema):
    leases: list[ClaimOut] = Field(..., description="in claim order, each its own lease (token, fence, expiry)")


class TaskNextOut(TaskOut):
    next: Optional[ClaimOut] = Field(
        None, description="present when the request sent `next`: the next task claimed and its lease, or null")


class ItemErrorOut(Schema):
    code: str
    message: str


class CompleteItemOut(Schema):
    id: str
    ok: bool = Field(..., description="true: completed (task); false: refused (error), nothing written for it")
    task: Optional[TaskOut] = None
    error: Optional[ItemErrorOut] = None


class CompleteBatchOut(Schema):
    items: list[CompleteItemOut] = Field(..., description="one per item, in the request's order")


class TaskPage(Schema):
    items: list[TaskOut]
    next: Optional[str] = Field(None, description="pass back as ?cursor= for the next page")


class CreatedTaskOut(TaskOut):
    deduplicated: bool = Field(..., description="true: a live task held the create's dedup_key; it is returned "
                                                "and nothing was created")


class TaskBatchOut(Schema):
    items: list[CreatedTaskOut]


class EventOut(Schema):
    id: int
    task: str
    verb: str
    from_stage: str
    to_stage: str
    version: int
    fence: int
    actor: str
    at: datetime
    detail: Any


class EventPage(Schema):
    items: list[EventOut]
    next: Optional[str] = None


class RateIn(StrictIn):
    count: int = Field(..., ge=1, le=MAX_RATE_COUNT, description="at most this many claims start...")
    per_seconds: int = Field(..., ge=1, le=MAX_RATE_PER_SECONDS,
                             description="...in any window of this many seconds (1: per second, 60: per minute, "
                                         "3600: per hour); claims are spaced per_seconds / count apart")


class RateOut(Schema):
    count: int
    per_seconds: int


class BudgetIn(StrictIn):
    tokens: Optional[int] = Field(None, ge=1, le=10**15, description="input + output tokens per window")
    cost_usd: Optional[float] = Field(None, gt=0, le=10**9, description="cost per window (reports that give one)")
    per: Literal["day", "month", "total"] = Field(..., description="the window: a UTC day, a UTC month, or in total")


class BudgetOut(Schema):
    tokens: Optional[int]
    cost_usd: Optional[float]
    per: str


class SpentOut(Schema):
    tokens: int
    cost_usd: float


class QueueIn(StrictIn):
    concurrency: Optional[int] = Field(None, ge=1, le=MAX_CONCURRENCY,
                                       description="at most this many RUNNING at once; null: no limit; omitted: unchanged")
    rate: Optional[RateIn] = Field(None, description="a rate limit on claims; null: none; omitted: unchanged")
    paused: Optional[bool] = Field(None, description="true: no new claim takes a task of this queue; omitted: unchanged")
    budget: Optional[BudgetIn] = Field(None, description="a budget of tokens and/or cost per window; at it, claims are "
                                                         "refused (budget_exhausted); null: none; omitted: unchanged")
    reason: str = Field("", max_length=MAX_REASON_CHARS, description="kept in the queue's history (and shown while paused)")


class QueueOut(Schema):
    name: str
    concurrency: Optional[int] = Field(..., description="at most this many RUNNING at once; null: no limit")
    running: int = Field(..., description="RUNNING tasks now, as the limit counts them")
    paused: bool
    paused_by: Optional[str]
    paused_reason: Optional[str]
    paused_at: Optional[datetime]
    rate: Optional[RateOut] = Field(..., description="at most count claims start in any per_seconds; null: no rate limit")
    next_claim_at: Optional[datetime] = Field(..., description="the rate lets the next claim start at this time")
    depth: dict[str, int] = Field(..., description="tasks per stage")
    oldest_queued_seconds: Optional[float] = Field(..., description="how long the longest-waiting QUEUED task has waited")
    budget: Optional[BudgetOut] = Field(None, description="the usage its tasks may report per window; null: none")
    spent: Optional[SpentOut] = Field(None, description="what its tasks reported in the budget's current window")
    budget_exhausted: bool = Field(False, description="its budget is spent: no claim of its tasks starts")
    budget_exhausted_until: Optional[datetime] = Field(
        None, description="claims start again at this time (the window's end); null while open or for a total budget")


class QueueList(Schema):
    items: list[QueueOut]


class QueueChangeOut(Schema):
    actor: str
    reason: str
    changes: dict[str, list[Any]] = Field(..., description="{setting: [before, after]}")
    at: datetime


class QueueHistory(Schema):
    items: list[QueueChangeOut]


class RateKeyIn(StrictIn):
    rate: Optional[RateIn] = Field(..., description="a rate limit on the claims of the key's tasks; null: none")
    reason: str = Field("", max_length=MAX_REASON_CHARS, description="kept in the key's history")


class ResourceHolderOut(Schema):
    task: str
    agent: str = Field(..., description="the lease's holder")
    fence: int = Field(..., description="the lease's fence: a holder whose lease was taken over has a lower one")
    units: Optional[int] = Field(None, description="shared units held; null: held exclusively")
    exclusive: bool
    expires_at: Optional[datetime] = Field(..., description="the hold ends with the lease (renewing extends it)")


class ResourceOut(Schema):
    name: str = Field(..., description="a resource, or a directory node a pattern holds (file:src/app/)")
    capacity: int = Field(..., description="units shared holders may hold together")
    held: Union[int, str] = Field(..., description="units held now, or \"exclusive\"")
    holds_below: int = Field(..., description="holds of names inside this one (file:src/app/x.py inside file:src/)")
    holders: list[ResourceHolderOut]


class ResourceList(Schema):
    items: list[ResourceOut] = Field(..., description="by name")
    next_after: Optional[str] = Field(None, description="pass as `after` for the next page; null: the last page")


class ResourceIn(StrictIn):
    capacity: int = Field(..., ge=1, le=MAX_RESOURCE_CAPACITY,
                          description="units shared holders may hold together (an exclusive hold takes it whole)")
    reason: str = Field("", max_length=MAX_REASON_CHARS)


class ResourceCheckOut(Schema):
    name: str
    node: str = Field(..., description="the node the name holds (a pattern: its directory)")
    task: str
    fence: int
    holds: bool = Field(..., description="true when that lease (task and fence) is live and holds the name now")
    holders: list[ResourceHolderOut] = Field(..., description="the current holders of the node")


class RateKeyOut(Schema):
    name: str
    rate: Optional[RateOut] = Field(..., description="at most count claims start in any per_seconds; null: no rate limit")
    next_claim_at: Optional[datetime] = Field(..., description="the rate lets the next claim start at this time")


class RateKeyList(Schema):
    items: list[RateKeyOut]


class FairnessKeyIn(StrictIn):
    budget: Optional[BudgetIn] = Field(..., description="a budget of tokens and/or cost per window for the tasks naming "
                                                        "the key, whatever their queues; at it, claims of them are "
                                                        "refused (budget_exhausted); null: none")
    reason: str = Field("", max_length=MAX_REASON_CHARS, description="kept in the key's history")


class FairnessKeyOut(Schema):
    name: str
    weight: int = Field(..., description="the key's turns in the claim order for another key's one")
    budget: Optional[BudgetOut] = Field(..., description="the usage the key's tasks may report per window; null: none")
    spent: Optional[SpentOut] = Field(..., description="what the key's tasks reported in the budget's current window")
    budget_exhausted: bool = Field(..., description="its budget is spent: no claim of its tasks starts, in any queue")
    budget_exhausted_until: Optional[datetime] = Field(
        ..., description="claims start again at this time (the window's end); null while open or for a total budget")


class FairnessKeyList(Schema):
    items: list[FairnessKeyOut]


class ScheduleTaskIn(StrictIn):
    """The template of each tick's task (a create's fields; its id is the schedule's name and the tick)."""

    title: str = Field(..., min_length=1, max_length=MAX_TITLE_CHARS)
    description: str = Field("", max_length=MAX_DESCRIPTION_CHARS)
    payload: JsonValue = None
    queue: str = Field("default", pattern=TASK_ID_PATTERN)
    priority: int = Field(0, ge=-(2**31) + 1, le=2**31 - 1, description="higher runs first")
    max_retries: int = Field(3, ge=0, le=MAX_RETRIES_LIMIT)
    concurrency_key: Optional[str] = Field(None, min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS)
    concurrency_limit: Optional[int] = Field(None, ge=1, le=MAX_CONCURRENCY)
    fairness_key: Optional[str] = Field(None, min_length=1, max_length=MAX_FAIRNESS_KEY_CHARS,
                                        description="the ticks' tasks take turns with other keys' in the claim order")
    fairness_weight: Optional[int] = Field(None, ge=1, le=MAX_FAIRNESS_WEIGHT)
    queue_timeout_seconds: Optional[int] = DEADLINE("FAILED when QUEUED and claimable this long without starting")
    attempt_timeout_seconds: Optional[int] = DEADLINE("one attempt's wall-clock limit")
    progress_timeout_seconds: Optional[int] = DEADLINE("the lease is taken back when progress stays unchanged this long")
    rate_key: Optional[str] = Field(None, min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS)


CRON = Field(..., min_length=1, max_length=MAX_CRON_CHARS,
             description="five-field cron: minute hour day-of-month month day-of-week (e.g. '*/15 * * * *', "
                         "'0 9 * * MON-FRI')")
TIMEZONE = Field("UTC", min_length=1, max_length=64, description="the IANA time zone the cron is read in")


class ScheduleIn(StrictIn):
    name: str = Field(..., pattern=TASK_ID_PATTERN, max_length=MAX_SCHEDULE_NAME_CHARS,
                      description="each tick's task id is the name and the tick: NAME:20261204T1405Z")
    cron: str = CRON
    timezone: str = TIMEZONE
    task: ScheduleTaskIn
    paused: bool = Field(False, description="true: fires nothing until resumed")


class ScheduleChangeIn(StrictIn):
    cron: Optional[str] = Field(None, min_length=1, max_length=MAX_CRON_CHARS,
                                description="a new cron (the next tick is its first after now); omitted: unchanged")
    timezone: Optional[str] = Field(None, min_length=1, max_length=64, description="omitted: unchanged")
    task: Optional[ScheduleTaskIn] = Field(None, description="replaces the whole template, from the next tick on")
    paused: Optional[bool] = Field(None, description="true: fires nothing; false: resumes from the first tick "
                                                     "after now (the ticks of the pause are not fired)")


class ScheduleOut(Schema):
    name: str
    cron: str
    timezone: str
    task: dict[str, Any] = Field(..., description="the template, every field filled in")
    paused: bool
    next_tick_at: Optional[datetime] = Field(..., description="the next tick to fire; null while paused")
    next_ticks: list[datetime] = Field(..., description="the next 5 ticks (empty while paused)")
    last_tick_at: Optional[datetime] = Field(..., description="the tick of the last task created")
    last_task_id: Optional[str]
    skipped_ticks: int = Field(..., description="missed ticks not fired (after downtime only the latest fires)")
    created_by: str
    created_at: datetime
    updated_at: datetime


class ScheduleList(Schema):
    items: list[ScheduleOut]


class ProblemOut(Schema):
    task: str
    code: str
    text: str


class ProblemsOut(Schema):
    problems: list[ProblemOut]


class BoardAtCard(Schema):
    id: str
    stage: str
    version: int = Field(..., description="the task's version after its last history row at or before `at` "
                                          "(inside a span of renews the prune collapsed: the version at the span's start)")
    owner: str = Field(..., description="RUNNING: the agent whose claim or resume started the stint; else empty")


class BoardAtOut(Schema):
    # Its times are ISO 8601 strings to the microsecond, in UTC (Z), unlike the API's other times
    # (milliseconds): a step to `next_event_at` must land on the event, not just before it.
    at: str = Field(..., description="the moment asked for (ISO 8601, UTC, to the microsecond)")
    exact: bool = Field(..., description="false: `at` is before `exact_from`, and tasks the prune deleted may be "
                                         "missing (never guessed)")
    exact_from: Optional[str] = Field(None, description="the oldest moment the board can be rebuilt exactly "
                                                        "at; null: the prune never deleted a task")
    first_event_at: Optional[str] = Field(None, description="the oldest history row kept (null: none)")
    previous_event_at: Optional[str] = Field(None, description="the last history row before `at` (a step back)")
    next_event_at: Optional[str] = Field(None, description="the first history row after `at` (a step forward)")
    counts: dict[str, int] = Field(..., description="every stage's tasks at `at`, over the whole board")
    tasks: list[BoardAtCard] = Field(..., description="a page of the tasks that existed at `at`, in id order")
    problems: Optional[list[ProblemOut]] = Field(None, description="check() of the rebuilt board (the first page "
                                                                     "only; docs/board-at.md says which rules apply)")
    next: Optional[str] = Field(None, description="pass back as ?cursor= (with the same `at`) for the next page")


class ErrorBody(Schema):
    code: str
    message: str
    task: Optional[TaskOut] = None
    details: Any = None


class ErrorOut(Schema):
    error: ErrorBody

