"""Read-only queries: snapshots for `check`, task lists and histories. Nothing here writes."""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import connections
from django.db.models import BooleanField, Count, ExpressionWrapper, Q
from django.utils import timezone

from . import clock
from .db import write_transaction
from .invariants import Problem, TaskSnapshot, check
from .lifecycle import TERMINAL, Stage
from .models import Dependency, Task, TaskEvent


def snapshot(*, using: str = "default") -> list[TaskSnapshot]:
    """All tasks with their dependencies, read as one consistent snapshot.

    The two reads run in one transaction (on SQLite every transaction takes the write lock,
    hence write_transaction) so that a task created between them cannot appear
    without its dependencies (on SQLite the IMMEDIATE transaction excludes writers; on
    PostgreSQL it is a repeatable-read snapshot)."""
    with write_transaction(using):
        _repeatable_read(using)
        deps: dict[str, list[str]] = defaultdict(list)
        for task_id, dep in Dependency.objects.using(using).values_list("task_id", "depends_on_id"):
            deps[task_id].append(dep)
        rows = (
            Task.objects.using(using)
            # Presence only: a checkpoint or result may be large, and check() needs no content.
            .annotate(
                has_checkpoint=ExpressionWrapper(Q(checkpoint__isnull=False), BooleanField()),
                has_result=ExpressionWrapper(Q(result__isnull=False), BooleanField()),
            )
            .values_list(
                "id", "stage", "owner", "lease_token_hash", "lease_expires_at", "attempts",
                "max_retries", "has_checkpoint", "has_result",
            )
        )
        return [
            TaskSnapshot(
                id=task_id, stage=stage, deps=tuple(deps.get(task_id, ())), owner=owner,
                has_token=bool(token_hash), lease_expires_at=expires, attempts=attempts,
                max_retries=max_retries, has_checkpoint=bool(has_checkpoint), has_result=bool(has_result),
            )
            for (task_id, stage, owner, token_hash, expires, attempts, max_retries, has_checkpoint, has_result) in rows
        ]


def _repeatable_read(using: str) -> None:
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def problems(*, now: datetime | None = None, using: str = "default") -> list[Problem]:
    """`check()` over the current board, at the store's clock (board.clock) unless `now` is given."""
    return check(snapshot(using=using), now or clock.now(using))


def deps_of(task_ids: list[str], *, using: str = "default") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {task_id: [] for task_id in task_ids}
    for task_id, dep in Dependency.objects.using(using).filter(task_id__in=task_ids).values_list(
        "task_id", "depends_on_id"
    ):
        out[task_id].append(dep)
    return out


def deps_of_task(task: Task, *, using: str = "default") -> list[str]:
    """Ids of the tasks `task` depends on; no query for a task without any (Task.has_deps,
    set at creation with the dependency rows, which never change)."""
    return deps_of([task.pk], using=using)[task.pk] if task.has_deps else []


def get_task(task_id: str, *, using: str = "default") -> Task | None:
    return Task.objects.using(using).filter(pk=task_id).first()


def board_tasks(*, terminal_limit: int = 200, using: str = "default") -> dict:
    """The board as one consistent read: every unfinished task, the `terminal_limit` most
    recently finished per terminal stage (the page asks for more on demand), the count per
    stage, dependencies, and the id of the last event the read includes."""
    with write_transaction(using):
        _repeatable_read(using)
        last_event_id = TaskEvent.objects.using(using).order_by("-id").values_list("id", flat=True).first() or 0
        counts = {stage.value: 0 for stage in Stage}
        for stage, n in Task.objects.using(using).values_list("stage").annotate(n=Count("id")).order_by():
            counts[stage] = n
        tasks = list(Task.objects.using(using).exclude(stage__in=list(TERMINAL)).order_by("-priority", "created_at", "id"))
        for stage in sorted(TERMINAL):
            tasks += list(Task.objects.using(using).filter(stage=stage).order_by("-updated_at", "-id")[:terminal_limit])
        deps: dict[str, list[str]] = {t.pk: [] for t in tasks}
        wanted = set(deps)
        for task_id, dep in Dependency.objects.using(using).values_list("task_id", "depends_on_id"):
            if task_id in wanted:
                deps[task_id].append(dep)
    return {"tasks": tasks, "deps": deps, "counts": counts, "last_event_id": last_event_id}


def ready_tasks(now: datetime, queue: str | None = None, *, using: str = "default"):
    """QUEUED tasks past their retry backoff (in `queue` when given), best first: highest
    priority, then oldest. The order claim_next takes them in."""
    rows = Task.objects.using(using).filter(stage=Stage.QUEUED).filter(
        Q(not_before__isnull=True) | Q(not_before__lte=now))
    if queue is not None:
        rows = rows.filter(queue=queue)
    return rows.order_by("-priority", "created_at", "pk")


def has_ready_task(queue: str | None = None, *, using: str = "default") -> bool:
    """Whether some task is ready to claim, read without a transaction: a waiting claim asks
    this first, so that idle agents do not take SQLite's write lock several times a second."""
    return ready_tasks(timezone.now(), queue, using=using).exists()
