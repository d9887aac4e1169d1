"""The admin's reads: its filters' choices, the rows an action is held to, what a stale edit
missed, a task's dependencies and latest history, the queues' waiting tasks and history. Its
change lists are Django's own querysets; the engine's reads (board.engine.selectors) serve the
rest."""
from __future__ import annotations

from django.db.models import BooleanField, Count, ExpressionWrapper, Q

from board.engine.lifecycle import Stage
from board.models import Dependency, FairnessKeyChange, QueueChange, RateKeyChange, Task, TaskEvent


def queue_names(limit: int | None = None, *, using: str = "default") -> list[str]:
    """The queues that hold a task, by name, at most `limit` of them (one DISTINCT, served by
    the queue index)."""
    names = Task.objects.using(using).order_by("queue").values_list("queue", flat=True).distinct()
    return list(names if limit is None else names[:limit])


def running_owners(limit: int, *, using: str = "default") -> list[str]:
    """The agents holding leases now (only RUNNING tasks have an owner), by name, at most `limit`."""
    return list(
        Task.objects.using(using).filter(stage=Stage.RUNNING).exclude(owner="")
        .order_by("owner").values_list("owner", flat=True).distinct()[:limit]
    )


def lease_filter(state: str, now) -> Q | None:
    """Tasks whose lease is `state` at `now` (a datetime or the store's clock as an expression,
    `clock.in_query()`): "live", "expired" (a RUNNING task's lease from its expiry on, the rule
    of lifecycle.lease_expired that the reaper applies), "none"; None for any other state."""
    if state == "live":
        return Q(stage=Stage.RUNNING, lease_expires_at__gt=now)
    if state == "expired":
        return Q(stage=Stage.RUNNING, lease_expires_at__lte=now)
    if state == "none":
        return Q(lease_expires_at__isnull=True)
    return None


# What an operator's action reads of each selected task: the version (or lease) its verb is held
# to, and what its report says of the task.
ACTION_ROW_FIELDS = (
    "id", "title", "stage", "version", "owner", "lease_expires_at", "fence", "attempts", "max_retries",
    "has_checkpoint",
)


def action_rows(tasks, limit: int) -> list[dict]:
    """The tasks of the queryset `tasks` as they are now, by id, as dicts of ACTION_ROW_FIELDS
    (`has_checkpoint`: whether one is saved, without reading it); at most `limit` + 1, so that
    the caller can tell a selection over its limit."""
    return list(
        tasks.annotate(has_checkpoint=ExpressionWrapper(Q(checkpoint__isnull=False), BooleanField()))
        .order_by("pk").values(*ACTION_ROW_FIELDS)[: limit + 1]
    )


def moves_since(task_id: str, version: int, limit: int, *, using: str = "default") -> list[tuple[str, str]]:
    """(verb, actor) of the task's moves after `version`, oldest first, at most `limit`."""
    return list(
        TaskEvent.objects.using(using).filter(task_id=task_id, version__gt=version)
        .order_by("id").values_list("verb", "actor")[:limit]
    )


def dependencies_with_stages(task_id: str, *, using: str = "default") -> list[tuple[str, str]]:
    """(id, stage) of each task `task_id` depends on, by id."""
    return list(
        Dependency.objects.using(using).filter(task_id=task_id)
        .order_by("depends_on_id").values_list("depends_on_id", "depends_on__stage")
    )


def latest_event_ids(task_id: str, limit: int, *, using: str = "default") -> list[int]:
    """The ids of the task's `limit` most recent history rows. Ids, not a sliced Subquery to
    filter by: MongoDB's backend drops a subquery's slice."""
    return list(
        TaskEvent.objects.using(using).filter(task_id=task_id).order_by("-id").values_list("id", flat=True)[:limit]
    )


def waiting_and_running(queues: list[str], *, using: str = "default") -> dict[str, dict[str, int]]:
    """{queue: {"QUEUED": n, "RUNNING": n}} for `queues` (absent: none), in one grouped query for
    a page of the queue list (served by the queue index). The RUNNING count is the tasks', for a
    queue without a limit, whose row does not count them (board.engine.flow)."""
    counts: dict[str, dict[str, int]] = {name: {Stage.QUEUED: 0, Stage.RUNNING: 0} for name in queues}
    if queues:
        for queue, stage, n in (Task.objects.using(using).filter(queue__in=queues,
                                                                 stage__in=(Stage.QUEUED, Stage.RUNNING))
                                .values_list("queue", "stage").annotate(n=Count("pk")).order_by()):
            counts[queue][stage] = n
    return counts


def rate_key_history(key: str, limit: int, *, using: str = "default") -> list[RateKeyChange]:
    """The rate key's `limit` most recent rate changes, newest first."""
    return list(RateKeyChange.objects.using(using).filter(key=key).order_by("-at", "-pk")[:limit])


def fairness_key_history(key: str, limit: int, *, using: str = "default") -> list[FairnessKeyChange]:
    """The fairness key's `limit` most recent budget changes, newest first."""
    return list(FairnessKeyChange.objects.using(using).filter(key=key).order_by("-at", "-pk")[:limit])


def queue_history(queue: str, limit: int, *, using: str = "default") -> list[QueueChange]:
    """The queue's `limit` most recent setting changes, newest first."""
    return list(QueueChange.objects.using(using).filter(queue=queue).order_by("-at", "-pk")[:limit])
