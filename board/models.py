"""Tables of the board. No write logic lives here: every change of stage, version or lease is
made by `board.engine.transitions`, which is the only module allowed to write those columns."""
from __future__ import annotations

from django.db import models

from board.engine.stores import rows
from board.engine.lifecycle import Stage

STAGE_CHOICES = [(stage.value, stage.value.title()) for stage in Stage]
# The stages of a live task: a dedup key is held only by these (Task.dedup_key).
LIVE_STAGES = [Stage.PENDING.value, Stage.QUEUED.value, Stage.RUNNING.value, Stage.PAUSED.value]

# `_id` on MongoDB, whose migrations are its own (board/engine/stores/rows.py says why).
_PK_COLUMN = rows.pk_column()


class Task(models.Model):
    id = models.CharField(primary_key=True, max_length=100, db_column=_PK_COLUMN)
    title = models.CharField(max_length=300)
    description = models.TextField(blank=True, default="")
    payload = models.JSONField(null=True, blank=True)
    queue = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    # The operator's gate (an approval): "hold" alone would read as a lease (the client's hold()).
    on_hold = models.BooleanField(default=False, help_text="Stay PENDING until an operator admits it.")
    max_retries = models.PositiveIntegerField(default=3)
    # Flow control (issue 29): at most ConcurrencyKey.concurrency RUNNING tasks share this key.
    concurrency_key = models.CharField(max_length=200, null=True, blank=True,
                                       help_text="At most the key's limit of RUNNING tasks share this key.")
    # Flow control (issue 29): claims of the tasks sharing this key start no faster than the
    # RateKey's rate (a provider's requests per minute, shared by tasks of many queues).
    rate_key = models.CharField(max_length=200, null=True, blank=True,
                                help_text="Claims of the tasks sharing this key start no faster than its rate.")
    # Deduplication (issue 29): while a live task (not COMPLETED, FAILED or CANCELLED) has this
    # key, a create naming it returns that task and creates nothing. Enforced by a unique index
    # over the live tasks only (Meta.constraints), so that a task that finishes frees its key
    # without any write, and two racing creators cannot both insert.
    dedup_key = models.CharField(max_length=200, null=True, blank=True,
                                 help_text="While this task is live, a create with the same key returns it.")
    # The claim order (issue 29; board.engine.fairness): claim_next takes the lowest claim_rank
    # first, ties by id. Set by the engine when the task enters the line (its creation, an
    # admission); tasks naming one fairness_key take turns with other keys' tasks.
    fairness_key = models.CharField(max_length=200, null=True, blank=True,
                                    help_text="Tasks of different keys take turns (a plan, a person).")
    # Labels to find tasks by (issue 33; board.engine.search: `tag:urgent`), set at create: a list
    # of short labels (board.engine.inputs.tags_list). On PostgreSQL a GIN index serves `tag:`
    # (board/migrations/0020_task_tags).
    # Nullable: rows written by plain SQL (the benchmarks' seeds) name no tags; read as none.
    tags = models.JSONField(default=list, blank=True, null=True, help_text="Labels to find the task by (tag:NAME).")
    # Run again as new (transitions.replay): the finished task this one copies. A plain id, not
    # a foreign key: the original may be pruned before its copy.
    replay_of = models.CharField(max_length=100, null=True, blank=True, editable=False,
                                 help_text="The finished task this one was run again from.")
    # Resource leases (issue 32; board.engine.resources): what a claim of this task takes with
    # it, in the claim's transaction, and every move out of RUNNING gives back. As the creator
    # gave them, normalised: a name (exclusive) or {"name", "units"} (shared). Null: none (the
    # hot verbs then touch no resource row). Fixed at creation; its rows: TaskResource.
    resources = models.JSONField(null=True, blank=True, editable=False,
                                 help_text="Resources a claim takes with the task (a name: exclusive).")
    # Capabilities (board.engine.capabilities): labels a claimer must all hold (None: anybody),
    # and {label: weight} preferences that re-rank the head of the line for a claimer holding them.
    requires = models.JSONField(null=True, blank=True, editable=False,
                                help_text="Capability labels a claimer must all hold (empty: anybody).")
    prefers = models.JSONField(null=True, blank=True, editable=False,
                               help_text="Capability labels a claimer is preferred for: {label: weight}.")
    claim_rank = models.FloatField(default=0.0, db_default=0.0, editable=False,
                                   help_text="Claimed lowest first: its turn (Unix seconds) minus priority x 60 s.")

    # Guarded by the compare-and-swap in board.engine.transitions.
    stage = models.CharField(max_length=16, choices=STAGE_CHOICES, default=Stage.PENDING)
    version = models.BigIntegerField(default=0)

    # The lease. The token itself is never stored: only its SHA-256, so a database dump or an
    # admin screen cannot be used to act as the holder.
    owner = models.CharField(max_length=200, blank=True, default="")
    lease_token_hash = models.CharField(max_length=64, null=True, blank=True)
    fence = models.BigIntegerField(default=0, help_text="Rises by one on every new holder.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Flow control (board.engine.flow): the number of its queue's shard (QueueShard) whose slot
    # its latest claim took, given back to that shard when it leaves RUNNING; None: its queue was
    # not counted, or it runs over a lowered limit (the queue's debt). Kept after, unread.
    slot = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # A lease claimed with a request id (board.engine.claim_requests): SHA-256 of (agent, request id)
    # and the seed its token was derived from, so that a retried claim gets the same lease.
    # Cleared with the lease.
    claim_request_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    claim_token_seed = models.CharField(max_length=64, null=True, blank=True, editable=False)

    attempts = models.PositiveIntegerField(default=0, help_text="Claims made so far.")
    not_before = models.DateTimeField(null=True, blank=True, help_text="Retry backoff.")
    checkpoint = models.JSONField(null=True, blank=True)
    progress = models.FloatField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # When the task entered its current stage (a renew or an edit keeps it): what a card's
    # "3m in RUNNING" counts from. Written by every move that changes the stage, in its own
    # UPDATE (board.engine.transitions, the SQL stores' statements). Null only for a row written outside the engine
    # (a bench's or test's bulk insert); readers then fall back to updated_at.
    stage_changed_at = models.DateTimeField(null=True, blank=True, editable=False)

    # Deadlines beside the lease (issue 29; board.engine.deadlines), set at creation, applied by
    # the reaper's pass (transitions.enforce_deadlines). Seconds; null: no such deadline.
    queue_timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="FAILED when QUEUED (and claimable) this long without starting.")
    attempt_timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="One attempt's wall-clock limit, renewals or not.")
    progress_timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="The lease is taken back when neither progress nor checkpoint changed this long.")
    # When a holder last changed its progress or saved a checkpoint (a renew, a pause): what the
    # progress deadline counts from (with stage_changed_at, the attempt's start). Engine-owned.
    progress_changed_at = models.DateTimeField(null=True, blank=True, editable=False)

    # Flags that let the hot verbs skip a query (dependencies are fixed at creation). Set by
    # transitions.create; the prune (board.engine.retention) clears has_dependents once a task's
    # dependents are gone; db_default too, so that a row inserted by plain SQL is valid.
    has_deps = models.BooleanField(
        default=False, db_default=False, editable=False,
        help_text="Depends on at least one task: rendering it needs the dependency table.")
    has_dependents = models.BooleanField(
        default=False, db_default=False, editable=False,
        help_text="Some task depends on this one: completing it must admit them.")
    # Set at creation with `requires` (board.engine.capabilities), never changed: the partial
    # index check()'s unclaimable_requirements reads (MongoDB indexes no `requires IS NOT NULL`).
    has_requires = models.BooleanField(
        default=False, db_default=False, editable=False,
        help_text="Requires capabilities of its claimer.")
    notes_count = models.PositiveIntegerField(
        default=0, db_default=0, editable=False,
        help_text="Notes on the task (board.engine.notes): at most MAX_NOTES_PER_TASK; a claim reads them only when some exist.")
    # Approval gates (board.engine.approvals): PAUSED with awaiting_approval is the waiting
    # sub-state (no lease; an Approval row in state "waiting" says what for). The count lets a
    # claim skip the read of the last answer when there never was a question.
    awaiting_approval = models.BooleanField(
        default=False, db_default=False, editable=False,
        help_text="PAUSED waiting for a person's answer to its approval (board.engine.approvals).")
    approvals_count = models.PositiveIntegerField(
        default=0, db_default=0, editable=False,
        help_text="Approvals the task asked for, over all its attempts.")

    class Meta:
        indexes = [
            # claim_next: the best ready task, with or without a queue filter.
            # Ending in id, the order claim_next sorts by, so ties need no sort.
            models.Index(fields=["stage", "queue", "claim_rank", "id"], name="task_line_in_queue"),
            models.Index(fields=["stage", "claim_rank", "id"], name="task_line_any_queue"),
            # The line of the QUEUED tasks that require no capability (board.engine.capabilities):
            # a claimer without capabilities seeks it, past any number of requiring tasks ahead.
            # Only QUEUED rows: smaller than task_line_any_queue whatever the board holds, so that
            # PostgreSQL's plan for the claim (prepared once per connection) always takes it.
            models.Index(fields=["claim_rank", "id"], name="task_line_unrequired",
                         condition=models.Q(stage="QUEUED", has_requires=False)),
            # a fairness key's last waiting task (board.engine.fairness): only keyed tasks are in
            # it. (`>= ''`, not IS NOT NULL: MongoDB's partial indexes take comparisons.)
            models.Index(fields=["fairness_key", "stage", "claim_rank"], name="task_fairness_line",
                         condition=models.Q(fairness_key__gte="")),
            # the reaper: RUNNING tasks whose lease has expired.
            models.Index(fields=["stage", "lease_expires_at"], name="task_lease_expiry"),
            # the reaper's deadline pass (selectors.overdue_deadlines): the QUEUED tasks with a
            # queue timeout, without reading the whole QUEUED backlog. Partial: a task without one
            # costs no write. (`>= 1`, not IS NOT NULL: MongoDB's partial indexes take comparisons.)
            models.Index(fields=["stage"], name="task_queue_deadline", condition=models.Q(queue_timeout_seconds__gte=1)),
            # check()'s over_rate for a rate key reads the claims of the tasks naming it. Partial:
            # a task without one costs no write (`>= ''`: every string, as MongoDB's partial
            # indexes take comparisons).
            models.Index(fields=["rate_key"], name="task_rate_key", condition=models.Q(rate_key__gte="")),
            # A task's replays (search replay_of:ID, its page's "run again as" list). Partial: a
            # task that is no replay costs no write.
            models.Index(fields=["replay_of"], name="task_replay_of", condition=models.Q(replay_of__gte="")),
            # check()'s notes_miscounted and approval_unpaired read the tasks that have notes and
            # those awaiting an answer: few of a big board. Partial: the others cost no write.
            models.Index(fields=["notes_count"], name="task_noted", condition=models.Q(notes_count__gte=1)),
            models.Index(fields=["awaiting_approval"], name="task_awaiting_approval",
                         condition=models.Q(awaiting_approval=True)),
            # check()'s approvals_miscounted reads the tasks that asked for approvals.
            models.Index(fields=["approvals_count"], name="task_asked", condition=models.Q(approvals_count__gte=1)),
            # check()'s unclaimable_requirements reads the QUEUED tasks that require capabilities.
            models.Index(fields=["stage"], name="task_requiring", condition=models.Q(has_requires=True)),
            models.Index(fields=["owner"], name="task_owner"),
            # the admin's list: most recently updated first, and its queue filter.
            models.Index(fields=["-updated_at"], name="task_recent"),
            # a finished column's pages on the live board (board.live.reads.column_order): most
            # recent first within one stage, so that a page is a seek (SQLite sorted every
            # COMPLETED task for each: 188 ms at 100,000 tasks). Not partial: SQLite uses a partial
            # index only when the query repeats its condition.
            models.Index(fields=["stage", "-updated_at", "-id"], name="task_column_recent"),
            # the task list's orders (board.engine.listing) on a big board: created (oldest
            # first, and newest read backwards) and priority, without sorting every task per page.
            # Neither column changes after a create but through an edit: claims pay nothing.
            models.Index(fields=["created_at", "id"], name="task_created"),
            models.Index(fields=["-priority", "created_at", "id"], name="task_priority"),
            models.Index(fields=["queue"], name="task_queue"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["dedup_key"], condition=models.Q(stage__in=LIVE_STAGES),
                                    name="task_live_dedup_key"),
        ]
        permissions = [("intervene", "Can act on tasks as an operator (release, requeue, cancel)")]

    def __str__(self) -> str:
        return f"{self.id} [{self.stage} v{self.version}]"


class Dependency(models.Model):
    """`task` may run only once `depends_on` is COMPLETED. Written once, at creation."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="dependencies")
    depends_on = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="dependents")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "depends_on"], name="dependency_unique"),
            models.CheckConstraint(
                condition=~models.Q(task=models.F("depends_on")), name="dependency_not_self"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} -> {self.depends_on_id}"


numbered_id = rows.numbered_id


class NumberedQuerySet(models.QuerySet):
    """Where the store has no auto-increment (MongoDB), new rows get their ids from the store's
    counter (board.engine.stores.rows.number_rows) before they are inserted."""

    def create(self, **kwargs):
        row = self.model(**kwargs)
        rows.number_rows(self.db, [row])
        row.save(force_insert=True, using=self.db)
        return row

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        rows.number_rows(self.db, objs)
        return super().bulk_create(objs, *args, **kwargs)


class TaskEvent(models.Model):
    """Append-only history: one row per transition, written in the transaction that made it.
    Only history retention (board.engine.retention) removes rows: those of old finished tasks,
    and old renews folded into the last renew of their lease.

    It never holds a lease token. Its ids also order the change feed the live board reads."""

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    verb = models.CharField(max_length=20)
    from_stage = models.CharField(max_length=16, blank=True, default="")
    to_stage = models.CharField(max_length=16)
    version = models.BigIntegerField(help_text="The task's version after this transition.")
    fence = models.BigIntegerField(default=0)
    actor = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField()
    detail = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["task", "id"], name="event_task_history"),
                   # The board at a moment (board.engine.moments): the rows next to a time.
                   models.Index(fields=["at"], name="event_at")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task_id} {self.verb} {self.from_stage}->{self.to_stage} v{self.version}"


class Budgeted(models.Model):
    """A budget (issue 32, item 5; board.engine.budgets), kept by a queue and by a fairness key:
    the usage their tasks' attempts report (TaskUsage) is added to spent_* in the report's
    transaction, per window (a UTC day, a UTC month, or in total); once spent reaches a budget no
    claim of their tasks starts until the window ends (budget_closed_until, Unix seconds) or an
    operator raises the budget."""

    budget_tokens = models.BigIntegerField(null=True, blank=True, help_text="Tokens per window; empty: none.")
    budget_cost_usd = models.FloatField(null=True, blank=True, help_text="Cost (USD) per window; empty: none.")
    budget_per = models.CharField(max_length=8, null=True, blank=True, help_text="day, month or total.")
    budget_window = models.FloatField(null=True, blank=True, editable=False,
                                      help_text="The current window's start (Unix seconds; 0 for total).")
    spent_tokens = models.BigIntegerField(default=0, editable=False, help_text="Tokens reported in the window.")
    spent_cost_usd = models.FloatField(default=0.0, editable=False, help_text="Cost reported in the window.")
    budget_closed_until = models.FloatField(null=True, blank=True, editable=False,
                                            help_text="No claim starts before this Unix time: the budget is spent.")
    budget_closed_at = models.FloatField(null=True, blank=True, editable=False,
                                         help_text="When the budget was reached (Unix seconds).")

    class Meta:
        abstract = True


class Queue(Budgeted):
    """A queue's flow control (issue 29): its settings. The counts a claim enforces them with
    live in the queue's shards (QueueShard), changed only by the engine, in the transaction of
    the move that enters or leaves RUNNING: a claim takes a shard's slot with a conditional
    update (`running < capacity`), every way out gives one back (../shared/DESIGN.md section 7).
    `check()` compares them with the tasks (`running_count_drift`).
    A row is made by the first create of a task in the queue (or by a change of its settings);
    a queue without a row has no limit and is not paused."""

    name = models.CharField(primary_key=True, max_length=100, db_column=_PK_COLUMN)
    concurrency = models.PositiveIntegerField(
        null=True, blank=True, help_text="At most this many RUNNING tasks at once; empty: no limit.")
    paused = models.BooleanField(default=False, help_text="No new claim takes a task of this queue.")
    paused_by = models.CharField(max_length=200, blank=True, default="")
    paused_reason = models.CharField(max_length=500, blank=True, default="")
    paused_at = models.DateTimeField(null=True, blank=True)
    # A rate limit: at most rate_count claims start in any rate_per_seconds (its shards space them).
    rate_count = models.PositiveIntegerField(null=True, blank=True, help_text="Claims per window; empty: no rate limit.")
    rate_per_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="The window, in seconds.")
    updated_at = models.DateTimeField(null=True, blank=True)

    # `running` (RUNNING tasks counted against the limit) and `rate_open_at` (when the rate lets
    # the next claim start, Unix seconds; None: no rate, or a claim may start now) are read from
    # the shards onto a queue by board.engine.flow.with_counts: not stored on the row, and
    # missing (AttributeError) where nobody read them, rather than a wrong 0.

    class Meta:
        ordering = ["name"]  # its settings are changed with Django's own `board.change_queue`

    def __str__(self) -> str:
        return self.name


class QueueShard(models.Model):
    """A share of a queue's concurrency limit or of its rate (issue 29; board.engine.flow): the
    counts a claim takes and a move out of RUNNING gives back, split over a few rows per queue
    (the store's queue_shards) so that on PostgreSQL the claims and completions of one limited
    queue do not take turns on one row's lock. The shares add up to the queue's setting, so no
    claim goes over it; a claim takes any shard with room.

    kind "run": `capacity` of the limit, `running` of it taken (never above `capacity`).
    kind "debt": `running` tasks over a limit lowered while they ran; a move out of RUNNING pays
    it back first, so no claim starts until the queue is under its new limit.
    kind "rate": `capacity` claims per the queue's window, spaced `spacing` seconds apart: a
    claim moves `open_at` (Unix seconds) one spacing past its own time.
    Made again from the settings and the RUNNING tasks by each change of a limit (or a rate)."""

    RUN, DEBT, RATE = "run", "debt", "rate"

    queue = models.CharField(max_length=100)
    kind = models.CharField(max_length=4, choices=[(RUN, "run"), (DEBT, "debt"), (RATE, "rate")])
    number = models.PositiveSmallIntegerField()
    capacity = models.IntegerField(default=0)
    running = models.IntegerField(default=0)
    spacing = models.FloatField(null=True, blank=True)
    open_at = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "kind", "number"], name="queue_shard_unique")]

    def __str__(self) -> str:
        return f"{self.queue} {self.kind} {self.number}"


class ConcurrencyKey(models.Model):
    """A concurrency key (issue 29; Task.concurrency_key): at most `concurrency` RUNNING tasks
    share it, enforced and counted as Queue's limit is."""

    name = models.CharField(primary_key=True, max_length=200, db_column=_PK_COLUMN)
    concurrency = models.PositiveIntegerField(default=1, help_text="At most this many RUNNING tasks share the key.")
    running = models.IntegerField(default=0, editable=False, help_text="RUNNING tasks now (kept by the engine).")
    updated_at = models.DateTimeField(null=True, blank=True, help_text="When its limit last changed.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.running}/{self.concurrency})"


class Resource(models.Model):
    """A resource tasks hold while RUNNING (issue 32; board.engine.resources): a name such as
    `merge-slot`, `branch:main` or a directory `file:src/app/` (a glob's node). Counted as a
    queue's limit is: `held` units (an exclusive hold counts resources.EXCLUSIVE) and `intents`
    (holds of names below this one), changed by the claim's transaction with a conditional
    update and given back by every move out of RUNNING. Rows are made before the create that
    first names them."""

    name = models.CharField(primary_key=True, max_length=200, db_column=_PK_COLUMN)
    capacity = models.PositiveIntegerField(default=1, help_text="Units the shared holders may hold together.")
    held = models.BigIntegerField(default=0, editable=False, help_text="Units held now (kept by the engine).")
    intents = models.IntegerField(default=0, editable=False,
                                  help_text="Holds of names below this one (kept by the engine).")
    updated_at = models.DateTimeField(null=True, blank=True, help_text="When its capacity last changed.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TaskResource(models.Model):
    """One node a task's claim takes (board.engine.resources.needs): the resource it names
    (units; resources.EXCLUSIVE for an exclusive one) or, with units 0, a name above it in the
    hierarchy (an intent: nobody may hold that whole subtree meanwhile). Written at creation."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="resource_needs")
    name = models.CharField(max_length=200)
    units = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "name"], name="task_resource_unique")]
        indexes = [models.Index(fields=["name"], name="task_resource_name")]

    def __str__(self) -> str:
        return f"{self.task_id} needs {self.name} ({self.units})"


class FairnessKey(Budgeted):
    """A fairness key's weight (issue 29; Task.fairness_key, board.engine.fairness): a key of
    weight 3 gets three turns for another key's one. A key without a row has weight 1. It may
    have a budget, as a queue may (Budgeted): its tasks are then claimed only while it is open."""

    name = models.CharField(primary_key=True, max_length=200, db_column=_PK_COLUMN)
    weight = models.PositiveIntegerField(default=1, help_text="Turns for another key's one.")
    updated_at = models.DateTimeField(null=True, blank=True, help_text="When its budget last changed.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (weight {self.weight})"


class RateKey(models.Model):
    """A rate key (issue 29; Task.rate_key): at most `rate_count` claims of the tasks naming it
    start in any `rate_per_seconds`, whatever their queues, enforced as Queue's rate is (each
    claim moves `rate_open_at` one `rate_interval` past its own time, in the claim's own
    transaction). A row is made by the first create naming the key; it holds nothing back until
    an operator sets its rate."""

    name = models.CharField(primary_key=True, max_length=200, db_column=_PK_COLUMN)
    rate_count = models.PositiveIntegerField(null=True, blank=True, help_text="Claims per window; empty: no rate limit.")
    rate_per_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="The window, in seconds.")
    rate_interval = models.FloatField(null=True, blank=True, editable=False,
                                      help_text="Seconds between two claims (per_seconds / count).")
    rate_open_at = models.FloatField(null=True, blank=True, editable=False,
                                     help_text="No claim starts before this Unix time (kept by the engine).")
    updated_at = models.DateTimeField(null=True, blank=True, help_text="When its rate last changed.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class KeyChange(models.Model):
    """The audit history of a key's settings (a rate key's rate, a fairness key's budget): who
    changed what, when and why."""

    key = models.CharField(max_length=200)
    actor = models.CharField(max_length=200)
    reason = models.CharField(max_length=500, blank=True, default="")
    changes = models.JSONField(help_text="The settings changed: {name: [before, after]}.")
    at = models.DateTimeField()

    class Meta:
        abstract = True
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.key} changed by {self.actor} at {self.at}"


class FairnessKeyChange(KeyChange):
    """The audit history of fairness keys' budgets."""

    class Meta(KeyChange.Meta):
        indexes = [models.Index(fields=["key", "-at"], name="fairness_key_change_history")]


class RateKeyChange(KeyChange):
    """The audit history of rate keys' rates."""

    class Meta(KeyChange.Meta):
        indexes = [models.Index(fields=["key", "-at"], name="rate_key_change_history")]


class QueueChange(models.Model):
    """The audit history of queue settings: who changed what, when and why."""

    queue = models.CharField(max_length=100)
    actor = models.CharField(max_length=200)
    reason = models.CharField(max_length=500, blank=True, default="")
    changes = models.JSONField(help_text="The settings changed: {name: [before, after]}.")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["queue", "-at"], name="queue_change_history")]

    def __str__(self) -> str:
        return f"{self.queue} changed by {self.actor} at {self.at}"


class Schedule(models.Model):
    """A periodic task (issue 29): at each tick of `cron` (five fields, in `timezone`) the engine
    creates a task from the template `task`, exactly once per tick across server processes and
    restarts (board.engine.schedules: the tick's task id is made from the name and the tick, and
    the create and the advance of `next_tick_at` commit together, the advance by a compare-and-
    swap). Written only by board.engine.schedules."""

    name = models.CharField(primary_key=True, max_length=85, db_column=_PK_COLUMN)
    cron = models.CharField(max_length=200, help_text="Five-field cron expression (minute hour day month weekday).")
    timezone = models.CharField(max_length=64, default="UTC", help_text="IANA time zone the cron is read in.")
    task = models.JSONField(help_text="The template of each tick's task: title, description, payload, queue, "
                                      "priority, max_retries, concurrency_key, concurrency_limit.")
    paused = models.BooleanField(default=False, help_text="Fires nothing; resuming starts from the next tick.")
    # Engine-owned: the next tick not yet fired (its compare-and-swap value), and what the last fire did.
    next_tick_at = models.DateTimeField(help_text="The next tick not yet fired.")
    last_tick_at = models.DateTimeField(null=True, blank=True, help_text="The tick of the last task created.")
    last_task_id = models.CharField(max_length=100, blank=True, default="", help_text="The last task created.")
    skipped_ticks = models.BigIntegerField(
        default=0, help_text="Ticks missed while no reaper ran and not fired (only the latest missed one fires).")
    # Rises with every change of the settings: a fire commits only if the settings it read still stand.
    version = models.BigIntegerField(default=0)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class TaskNote(models.Model):
    """A note on a task (issue 32, hand-offs): written by its holder (with the lease's token) or
    by staff, kept across attempts, and handed to the next holder with its claim. Written only
    by board.engine.notes, which counts them on the task (Task.notes_count) in the same
    transaction. Never holds a lease token."""

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="notes")
    text = models.TextField()
    author = models.CharField(max_length=200, help_text="The agent that held the task, or the staff user.")
    by_holder = models.BooleanField(default=False, help_text="Written by the lease's holder (else by staff).")
    attempt = models.PositiveIntegerField(default=0, help_text="The task's attempt when written (0: before its first claim).")
    fence = models.BigIntegerField(default=0, help_text="The task's fence when written: which lease's attempt.")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["task", "id"], name="note_task_order")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task_id} note {self.id} by {self.author}"


class Approval(models.Model):
    """A question a task's holder asked a person (issue 32, approval gates), with its answer.
    The task waits PAUSED (Task.awaiting_approval) without a lease while the approval is
    "waiting"; the answer (or its timeout) moves the task on in the same transaction that closes
    this row. Written only by board.engine.transitions.approvals. Never holds a lease token."""

    WAITING, APPROVED, REJECTED, TIMED_OUT, CANCELLED = "waiting", "approved", "rejected", "timed_out", "cancelled"
    STATES = [(WAITING, "waiting"), (APPROVED, "approved"), (REJECTED, "rejected"),
              (TIMED_OUT, "timed out (the task failed)"), (CANCELLED, "cancelled (with the task)")]

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="approvals")
    question = models.TextField()
    form = models.JSONField(null=True, blank=True, help_text="The JSON Schema of the values the answer may carry.")
    approvers = models.JSONField(default=list, blank=True,
                                 help_text="Usernames or group names allowed to answer; empty: operators.")
    asked_by = models.CharField(max_length=200, help_text="The agent that held the task and asked.")
    asked_at = models.DateTimeField()
    attempt = models.PositiveIntegerField(default=0, help_text="The task's attempt when asked.")
    fence = models.BigIntegerField(default=0, help_text="The lease (fence) it was asked under.")
    due_at = models.DateTimeField(null=True, blank=True, help_text="When its timeout applies on_timeout; null: never.")
    on_timeout = models.CharField(max_length=10, default="fail")
    state = models.CharField(max_length=10, choices=STATES, default=WAITING)
    approved = models.BooleanField(null=True, blank=True)
    values = models.JSONField(null=True, blank=True, help_text="The answer's values (valid against the form).")
    comment = models.TextField(blank=True, default="", help_text="The approver's words to the agent.")
    answered_by = models.CharField(max_length=200, blank=True, default="")
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["task", "id"], name="approval_task_order"),
            # The reaper's timeouts and the Needs-you lane: the waiting ones, by due time.
            models.Index(fields=["state", "due_at"], name="approval_state_due"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task_id} approval {self.id} ({self.state})"


class TaskUsage(models.Model):
    """What an attempt reported it used (issue 32, item 5): tokens and cost, sent with a renew,
    complete or fail of the lease (board.engine.usage). One row per report; a task's usage is
    the sum of its rows, an attempt's the sum of its fence's. Written only after the holder's
    move was accepted; a report that is missing is shown as missing, never as zero."""

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="usage_reports")
    fence = models.BigIntegerField(help_text="The lease (attempt) it was reported under.")
    agent = models.CharField(max_length=200)
    queue = models.CharField(max_length=100, help_text="The task's queue (fixed at creation): usage by queue.")
    model = models.CharField(max_length=100, blank=True, default="")
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost_usd = models.FloatField(null=True, blank=True, help_text="Empty: not reported (never read as zero).")
    source = models.CharField(max_length=10, default="reported", help_text="reported or estimated.")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["task", "id"], name="usage_task_order"),
                   models.Index(fields=["at"], name="usage_at")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task_id} usage {self.input_tokens}+{self.output_tokens} by {self.agent}"


class RemovedTask(models.Model):
    """A task the prune deleted (board.engine.retention), written in the transaction that
    deleted it: how open live boards learn that its card is gone (board.live.outbox reads these
    in id order, as it reads the history). Their ids follow commit order: the prune's batches
    run one at a time (the store's serialise_on), and on MongoDB they are numbered from the
    store's counter (number_rows). The prune deletes them once older than its shortest window."""

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    task_id = models.CharField(max_length=100)
    stage = models.CharField(max_length=16, help_text="The stage it was deleted in (its column on the board).")
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task_id} removed ({self.stage})"


class HistoryHorizon(models.Model):
    """How far back the history is whole (issue 33, item 4: the board at any moment,
    board.engine.moments; docs/board-at.md). The prune (board.engine.retention) deletes old
    finished tasks with all their rows; in the transaction that deletes a task's rows it moves
    `exact_from` up to the newest `at` among them. From that moment on every task the history
    ever had is still on the board or was finished by then, so the board at a moment at or after
    it is rebuilt exactly; before it, a deleted task may be missing. One row ("tasks"), never
    moved back; no row: nothing was ever deleted."""

    name = models.CharField(max_length=20, unique=True)
    exact_from = models.DateTimeField(help_text="The board at any moment from this one on is rebuilt exactly.")
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"history whole from {self.exact_from.isoformat()}"


class AgentKey(models.Model):
    """An API key. The key itself is shown once, at creation; only its SHA-256 is stored (a
    key is 32 random bytes, so a fast hash is enough: there is nothing to brute-force). The
    agent's name comes from its key, so no caller can act under another agent's name."""

    name = models.CharField(max_length=100, help_text="The agent name this key acts as.")
    prefix = models.CharField(max_length=12, help_text="The key's first characters, to tell keys apart.")
    key_hash = models.CharField(max_length=64, unique=True)
    is_operator = models.BooleanField(default=False, help_text="May admit, requeue and cancel tasks.")
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    # When the key stops being taken: set at once by a revoke, or ahead of time by a rotation
    # (the old key's grace). The key is live while this is NULL or still in the future.
    revoked_at = models.DateTimeField(null=True, blank=True, help_text="Refused from this time on.")
    # One live key per agent name, held by the database: the name while the key has no end
    # set, NULL from its revocation or rotation on. Unique: SQL stores allow many NULLs, and
    # on MongoDB the backend's unique index covers only string values (partialFilterExpression
    # {$type: "string"}), so a second key for a live name fails whoever writes it, concurrent
    # mints included (board.agent_keys.create_key).
    live_name = models.CharField(max_length=100, null=True, blank=True, unique=True, editable=False)
    # The queues this key may use (board.engine.scopes): comma-separated glob patterns such as
    # `ci-*,docs`; empty for every queue. Set at minting, never changed (rotate to change it).
    queues = models.CharField(max_length=2100, blank=True, default="",
                              help_text="Queue patterns this key is limited to (e.g. ci-*,docs); empty: every queue.")
    # What the agent can do (board.engine.capabilities): comma-separated labels such as
    # `gpu,python,model:opus`, sorted; a claim takes only tasks whose `requires` are all here.
    capabilities = models.CharField(max_length=2100, blank=True, default="",
                                    help_text="Capability labels, comma-separated (e.g. gpu,python,model:opus).")

    class Meta:
        ordering = ["name", "created_at"]

    def __str__(self) -> str:
        state = " (revoked)" if self.revoked_at else ""
        return f"{self.name} {self.prefix}…{state}"


class ReaperPass(models.Model):
    """The last pass of the reaper on each host (`manage.py reap --loop`, which `manage.py serve`
    starts and restarts): what /healthz reads to tell whether lost leases still come back.
    `finished_at` is the database's clock, so its age needs no synchronized hosts."""

    host = models.CharField(max_length=255, unique=True)
    pid = models.IntegerField()
    started_at = models.DateTimeField(help_text="When this reaper process started.")
    finished_at = models.DateTimeField(help_text="When its last pass finished (database clock).")
    passes = models.BigIntegerField(default=0, help_text="Passes by this process.")
    reclaimed = models.IntegerField(default=0, help_text="Leases taken back by the last pass.")
    admitted = models.IntegerField(default=0, help_text="Tasks admitted by the last pass.")

    def __str__(self) -> str:
        return f"reaper on {self.host} (pid {self.pid})"


class Webhook(models.Model):
    """A webhook subscription (issue 33, item 6; board/webhooks/): the events it wants, where to
    send them, and its own cursor in the history (the outbox). Each pass of board.webhooks.outbox
    reads the events after `cursor` (with `holes`: ids below it that may still commit, on
    PostgreSQL), inserts one WebhookDelivery per matching event and moves the cursor, in one
    transaction; board.webhooks.sending then sends what is due. Written only by board/webhooks/.

    `secret` signs every delivery (HMAC-SHA256 of the body): the board must keep it to sign, so it
    is stored as is, shown once in the create's answer and never again (the admin never displays
    it: board/admin/secret_columns.py)."""

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    url = models.CharField("URL", max_length=2000, help_text="Where deliveries are POSTed (http or https).")
    events = models.JSONField(default=list, help_text="The event names it receives (docs/webhooks.md).")
    filter = models.JSONField(default=dict, blank=True,
                              help_text='Only events of matching tasks: {"queue": "ci-*,docs", "tags": ["urgent"]}.')
    format = models.CharField(max_length=10, default="json", help_text="json (the board's payload) or slack.")
    secret = models.CharField(max_length=100, editable=False)
    active = models.BooleanField(default=True, help_text="An inactive webhook collects and sends nothing.")
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    # Engine-owned: the outbox cursor (the last history id consumed, and the ids below it that
    # may still commit, each with the transaction horizon that proves when it can be given up:
    # board.live.outbox.Cursor), and the check() problems already announced.
    cursor = models.BigIntegerField(default=0, editable=False, help_text="The last history event id consumed.")
    holes = models.JSONField(default=dict, blank=True, editable=False)
    problems_seen = models.JSONField(default=list, blank=True, editable=False)
    # Rises with every write of the three above: a collecting pass commits only if the row is
    # still the one it read (two reapers collect each event once).
    version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook {self.id} -> {self.url}"


class WebhookDelivery(models.Model):
    """One event for one webhook (the durable outbox's row): inserted by the collecting pass in
    the transaction that moves the webhook's cursor, then sent until the receiver answers 2xx or
    the attempts run out (board.webhooks.sending). `event_id` names the event (the same for every
    webhook); each retry of a delivery carries the same `id` (X-TaskFlow-Delivery), the
    receiver's key for deduplication."""

    PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.CharField(max_length=250, help_text="The event's id (the same for every webhook).")
    event = models.CharField(max_length=40, help_text="task.failed, task.deadline_missed, check.problem, ...")
    body = models.JSONField(help_text="The payload sent, as JSON (signed as sent).")
    state = models.CharField(max_length=10, default=PENDING, help_text="pending, delivered, or failed (gave up).")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, help_text="When it is sent next (pending only).")
    last_status = models.IntegerField(null=True, blank=True, help_text="The receiver's last HTTP status.")
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["webhook", "event_id"], name="webhook_delivery_once")]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="webhook_delivery_due"),
                   models.Index(fields=["created_at"], name="webhook_delivery_age")]

    def __str__(self) -> str:
        return f"{self.event} {self.event_id} -> webhook {self.webhook_id} ({self.state})"


class BulkJob(models.Model):
    """One operator action on every task a filter matches (issue 33, item 1; board/bulk/): the
    ids and versions the filter matched when it was asked (`items`, frozen at create), then one
    compare-and-swap move per task held to the version read, by whichever runner took the job
    (a thread of the server that accepted it, or the reaper's loop), with its summary. Written
    only by board/bulk/jobs.py, every write conditional on the row as read (`version`, `runner`)."""

    PENDING, RUNNING, STOPPING, STOPPED, DONE, FAILED = "pending", "running", "stopping", "stopped", "done", "failed"
    ACTIVE = (PENDING, RUNNING, STOPPING)

    id = numbered_id()
    objects = NumberedQuerySet.as_manager()
    actor = models.CharField(max_length=200, help_text="Who asked for it (the name its moves record).")
    action = models.CharField(max_length=20, help_text="retry, requeue, cancel, pause, admit, release-stale, set-priority, add-tag, replay.")
    params = models.JSONField(default=dict, blank=True, help_text='The action\'s value: {"priority": 5} or {"tag": "x"}.')
    reason = models.CharField(max_length=500, blank=True, default="")
    filter = models.JSONField(default=dict, blank=True, help_text="The filter as given (docs/bulk.md).")
    state = models.CharField(max_length=10, default=PENDING,
                             help_text="pending, running, stopping, stopped, done, failed.")
    total = models.PositiveIntegerField(default=0, help_text="The tasks it acts on (matched, in a stage the action applies to).")
    matching = models.PositiveIntegerField(default=0, help_text="Every task the filter matched, any stage.")
    done = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    lost = models.PositiveIntegerField(default=0, help_text="Tasks that changed meanwhile (left as they were).")
    skipped_reasons = models.JSONField(default=dict, blank=True, help_text="reason code -> count")
    problems = models.IntegerField(null=True, blank=True, help_text="check()'s problems after the job (null: not run).")
    error = models.TextField(blank=True, default="")
    items = models.JSONField(default=list, blank=True, editable=False, help_text="[task id, version read] per task.")
    position = models.PositiveIntegerField(default=0, editable=False, help_text="Items handled so far.")
    runner = models.CharField(max_length=100, blank=True, default="", editable=False)
    heartbeat_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-id"]
        verbose_name = "bulk job"
        indexes = [models.Index(fields=["state", "heartbeat_at"], name="bulk_job_runnable")]

    def __str__(self) -> str:
        return f"bulk {self.id}: {self.action} {self.total} tasks ({self.state})"
