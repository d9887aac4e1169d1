"""The operators' actions on tasks, and how every action reports: ONE message per action (the
counts: done, skipped by reason, lost races), with each task's line in a collapsed <details>.

Every action reads the selected tasks once (`reads.action_rows`) and calls a verb of
`board.engine.transitions` for each, held to what it read: the version (a task that moved
meanwhile is reported as a lost race, never acted on blindly), or, for force release, the lease
shown on the confirmation page (holder and fence: a holder's renewals bump the version).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Self

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from board.admin import reads
from board.admin.display import LeaseState, now_is
from board.admin.forms import current
from board.engine import errors, selectors, transitions
from board.engine.lifecycle import Stage
from board.engine.limits import MAX_ACTION_ROWS, MAX_REASON_CHARS
from board.models import Task


class Report:
    """The outcome of one action, shown as ONE message (an action over 600 tasks used to give
    600 banners): the counts first — done, skipped by reason, lost races — then each task's
    line in a collapsed <details>. Used as a context manager: the message is sent on exit.

    Each line starts with the task's id exactly as it is (ids are case-sensitive): the message
    starts with the action's name, and the board's admin templates do not capitalise messages."""

    def __init__(self, model_admin: admin.ModelAdmin, request, action: str, noun: str = "task"):
        self.model_admin, self.request, self.action, self.noun = model_admin, request, action, noun
        self.lines: list[tuple[str, str]] = []  # (outcome, line), in the order the rows were met
        self.skips: Counter[str] = Counter()  # skipped rows by reason

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self.lines:
            self.model_admin.message_user(self.request, self.message(), self.level())

    def done(self, task_id: str, text: str) -> None:
        self.lines.append(("done", f"{task_id}: {text}"))

    def skipped(self, task_id: str, why: str, kind: str | None = None) -> None:
        """`kind`: the reason without what is particular to this row, for the counts."""
        self.lines.append(("skipped", f"{task_id}: skipped: {why}"))
        self.skips[kind or why] += 1

    def lost(self, task_id: str, now: Task | None, why: str = "task changed meanwhile") -> None:
        self.lines.append(("lost", f"{task_id}: lost a race: {why} (now {now_is(now)})"))

    def attempt(self, task_id: str, move: Callable[[], Task], done: Callable[[Task], str],
                lost_why: Callable[[Task | None], str] | None = None) -> None:
        """Run `move()` (an engine verb held to a version or a lease) and record its outcome:
        `done(task)` on success; on VersionConflict a lost race (`lost_why(task as it is now)`
        says why, when given); otherwise skipped with the engine's reason."""
        try:
            task = move()
        except errors.VersionConflict as exc:
            now = current(exc, task_id)
            if lost_why is None:
                self.lost(task_id, now)
            else:
                self.lost(task_id, now, lost_why(now))
        except errors.NotFound:
            self.skipped(task_id, "no such task")
        except errors.BoardError as exc:
            self.skipped(task_id, exc.message, _kind_of(exc))
        else:
            self.done(task_id, done(task))

    def count(self, outcome: str) -> int:
        return sum(1 for kind, _ in self.lines if kind == outcome)

    def summary(self) -> str:
        """'Cancel, 600 tasks: 590 done; 8 skipped (5 is COMPLETED, 3 is QUEUED); 2 lost a race.'"""
        parts = [f"{self.count('done')} done"]
        if self.skips:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.skips.items(), key=lambda kv: (-kv[1], kv[0])))
            parts.append(f"{self.count('skipped')} skipped ({reasons})")
        if self.count("lost"):
            parts.append(f"{self.count('lost')} lost a race (changed meanwhile; left alone)")
        n = len(self.lines)
        return f"{self.action}, {n} {self.noun}{'s' if n != 1 else ''}: {'; '.join(parts)}."

    def message(self) -> str:
        rows = format_html_join("", '<li class="action-{}">{}</li>', self.lines)
        return format_html(
            '{}<details class="action-rows"><summary>Each task ({})</summary><ul>{}</ul></details>',
            self.summary(), len(self.lines), rows,
        )

    def level(self) -> int:
        if self.count("lost"):
            return messages.ERROR
        return messages.WARNING if self.skips else messages.SUCCESS


def _kind_of(exc: errors.BoardError) -> str:
    """A skip's reason for the counts: the stage that refused the move, else the engine's code."""
    if exc.details.get("kind"):
        return exc.details["kind"]
    if isinstance(exc.task, Task):
        return f"is {exc.task.stage}"
    return exc.code.replace("_", " ")


def _not_running(report: Report, row: dict) -> None:
    report.skipped(row["id"], f"not RUNNING (is {row['stage']})", f"is {row['stage']}")


def action_reason(request) -> str:
    """The reason typed in the action bar whose button was pressed (there may be two bars)."""
    values = request.POST.getlist("reason")
    try:
        index = int(request.POST.get("index", 0))
    except ValueError:
        index = 0
    value = values[index] if index < len(values) else (values[0] if values else "")
    return value.strip()[:MAX_REASON_CHARS]


def _rows(model_admin, request, queryset) -> list[dict] | None:
    """The selected tasks as read now (the versions the verbs are then held to), or None, having
    said so, when there are too many."""
    rows = reads.action_rows(queryset, MAX_ACTION_ROWS)
    if len(rows) > MAX_ACTION_ROWS:
        model_admin.message_user(
            request, f"Select at most {MAX_ACTION_ROWS} tasks per action; nothing was done.", messages.ERROR
        )
        return None
    return rows


def _each(model_admin, request, queryset, action: str, act: Callable[[Report, dict], None]) -> None:
    """`act(report, row)` for every selected task (it skips the row or `report.attempt`s a
    move), reported in one message."""
    rows = _rows(model_admin, request, queryset)
    if rows is None:
        return
    with Report(model_admin, request, action) as report:
        for row in rows:
            act(report, row)


def _held_to_version(model_admin, request, queryset, action: str, verb, done) -> None:
    """`verb(task_id, actor=, version=[, reason=])` for every selected task, held to the version
    just read; `done(row, task)` words a success."""
    actor = request.user.get_username()
    reason = action_reason(request)
    extra = {"reason": reason} if reason else {}

    def act(report: Report, row: dict) -> None:
        report.attempt(row["id"], lambda: verb(row["id"], actor=actor, version=row["version"], **extra),
                       lambda task: done(row, task))

    _each(model_admin, request, queryset, action, act)


# ---------------------------------------------------------------------------------------------
# The actions. Each verb is looked up on `transitions` when the action runs (tests stand in for
# one to stage a lost race).


@admin.action(permissions=["intervene"], description="Release stale leases (expired only)")
def release_stale_leases(model_admin, request, queryset):
    rows = _rows(model_admin, request, queryset)
    if rows is None:
        return
    now = model_admin.clock()
    leases = {r["id"]: LeaseState(r["lease_expires_at"], now) for r in rows}
    expired = [r["id"] for r in rows if r["stage"] == Stage.RUNNING and leases[r["id"]].expired]
    reclaimed = {}
    if expired:
        # The store's reaper, limited to these tasks and this clock: a lease renewed
        # meanwhile is live again and is not touched (its CAS re-checks the expiry).
        reclaimed = {
            r.task_id: r.to_stage
            for r in transitions.reclaim_expired(now=now, task_ids=expired, limit=len(expired),
                                                 actor=request.user.get_username())
        }
    with Report(model_admin, request, "Release stale leases") as report:
        for row in rows:
            task_id = row["id"]
            if task_id in reclaimed:
                was = f"was held by {row['owner']}, {leases[task_id].text_when_taken()}"
                if reclaimed[task_id] == Stage.FAILED:
                    report.done(task_id, f"failed: lease expired on its last attempt ({was})")
                else:
                    report.done(task_id, f"released ({was})")
            elif task_id in expired:
                report.lost(task_id, selectors.get_task(task_id))
            elif row["stage"] != Stage.RUNNING:
                _not_running(report, row)
            else:
                report.skipped(task_id, f"lease still live (held by {row['owner']}, {leases[task_id].text()})",
                               "lease still live")


@admin.action(permissions=["intervene"], description="Force release (live leases too; asks first)")
def force_release(model_admin, request, queryset):
    if request.POST.get("post") == "yes":
        return _force_release_confirmed(model_admin, request, queryset)
    rows = _rows(model_admin, request, queryset)
    if rows is None:
        return None
    now = model_admin.clock()
    running = [r for r in rows if r["stage"] == Stage.RUNNING]
    skipped = [r for r in rows if r["stage"] != Stage.RUNNING]
    if not running:
        with Report(model_admin, request, "Force release") as report:
            for row in skipped:
                _not_running(report, row)
        return None
    for row in running:
        row["lease_text"] = LeaseState(row["lease_expires_at"], now).text()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Force release: are you sure?",
        "opts": model_admin.opts,
        "reason": action_reason(request),
        "running": running,
        "skipped": skipped,
        "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/board/task/force_release_confirmation.html", context)


def _force_release_confirmed(model_admin, request, queryset) -> None:
    """Force release held to the lease shown on the confirmation page (its holder and fence),
    not to its version: the holder's renewals while the operator read the page do not undo the
    decision, but a lease that changed hands (or a task that left RUNNING) is left alone and the
    row says why."""
    actor = request.user.get_username()
    reason = action_reason(request)
    now = model_admin.clock()

    def act(report: Report, row: dict) -> None:
        task_id = row["id"]
        holder, fence = request.POST.get(f"holder_{task_id}"), request.POST.get(f"fence_{task_id}", "")
        if holder is None or not fence.isdigit():  # it was not RUNNING on the confirmation page
            if row["stage"] != Stage.RUNNING:
                _not_running(report, row)
            else:
                report.skipped(task_id, f"was not RUNNING when you confirmed (now held by {row['owner']}); "
                                        "select it again to release it", "was not RUNNING when you confirmed")
            return
        seen = (holder, int(fence))

        def lost_why(task: Task | None) -> str:
            if task is not None and task.stage == Stage.RUNNING:
                return (f"the lease changed hands since the confirmation page (you saw {seen[0]}'s lease, "
                        f"fence {seen[1]}; now held by {task.owner}, fence {task.fence}); nothing was done")
            return "the task left RUNNING since the confirmation page; nothing was done"

        report.attempt(
            task_id, lambda: transitions.force_release(task_id, actor=actor, held_by=seen, reason=reason),
            lambda task: f"released (was held by {seen[0]}, {LeaseState(row['lease_expires_at'], now).text_when_taken()})",
            lost_why,
        )

    _each(model_admin, request, queryset, "Force release", act)


def _requeue(model_admin, request, queryset, *, reset_attempts: bool) -> None:
    def verb(task_id, *, actor, version, reason=""):
        try:
            return transitions.requeue(task_id, actor=actor, version=version, reset_attempts=reset_attempts,
                                       reason=reason)
        except errors.InvalidTransition as exc:
            task = exc.task
            if exc.field == "reset_attempts":  # the engine's "no attempt left", in the admin's words
                raise errors.InvalidTransition(
                    f"no attempt left ({task.attempts} / {task.max_retries + 1}); "
                    "use “Requeue and reset attempts”", task=task, kind="no attempt left",
                ) from None
            raise

    def done(row, task):
        attempts = f", attempts {row['attempts']} → 0" if reset_attempts else ""
        return f"requeued (was {row['stage']}{attempts})"

    label = "Requeue and reset attempts" if reset_attempts else "Requeue"
    _held_to_version(model_admin, request, queryset, label, verb, done)


@admin.action(permissions=["intervene"], description="Requeue (FAILED or PAUSED → QUEUED)")
def requeue(model_admin, request, queryset):
    _requeue(model_admin, request, queryset, reset_attempts=False)


@admin.action(permissions=["intervene"], description="Requeue and reset attempts")
def requeue_reset_attempts(model_admin, request, queryset):
    _requeue(model_admin, request, queryset, reset_attempts=True)


@admin.action(permissions=["intervene"], description="Cancel")
def cancel(model_admin, request, queryset):
    def done(row, task):
        held = f", held by {row['owner']}" if row["stage"] == Stage.RUNNING else ""
        return f"cancelled (was {row['stage']}{held})"

    _held_to_version(model_admin, request, queryset, "Cancel", transitions.cancel, done)


@admin.action(permissions=["intervene"], description="Admit held PENDING tasks")
def admit(model_admin, request, queryset):
    _held_to_version(model_admin, request, queryset, "Admit", transitions.admit,
                     lambda row, task: "admitted (PENDING → QUEUED)")


@admin.action(permissions=["intervene"], description="Pause running tasks (keep last checkpoint)")
def pause(model_admin, request, queryset):
    def done(row, task):
        # The verb was held to the version read with `has_checkpoint`, so this is exact.
        kept = "checkpoint kept" if row["has_checkpoint"] else "no checkpoint saved: a resume starts over"
        return f"paused (was held by {row['owner']}; {kept})"

    _held_to_version(model_admin, request, queryset, "Pause", transitions.force_pause, done)


@admin.action(permissions=["intervene"], description="Run again as new (finished tasks: a linked copy each)")
def replay(model_admin, request, queryset):
    """Each finished task selected runs again as a new task (transitions.replay): a copy whose
    replay_of names it; the original is not touched. An unfinished one is skipped."""
    actor = request.user.get_username()

    def act(report: Report, row: dict) -> None:
        report.attempt(row["id"], lambda: transitions.replay(row["id"], actor=actor),
                       lambda copy: f"run again as {copy.pk} ({copy.stage})")

    _each(model_admin, request, queryset, "Run again as new", act)


# ---------------------------------------------------------------------------------------------
# The task page's buttons (templates/admin/board/task/change_form.html): Retry on a FAILED task,
# Cancel on any unfinished one. The same engine verbs as the list's actions (one compare-and-swap,
# held to the version the page showed, with the reason typed beside them), the same permission
# (board.intervene: TaskAdmin.act_view checks it) and the same one-message report.

PAGE_VERBS = {
    # verb: (label, stages it is offered in, the call)
    "retry": ("Retry", {Stage.FAILED}, lambda task_id, actor, version, reason: transitions.requeue(
        task_id, actor=actor, version=version, reset_attempts=True, reason=reason)),
    "cancel": ("Cancel", {Stage.PENDING, Stage.QUEUED, Stage.RUNNING, Stage.PAUSED, Stage.FAILED},
               lambda task_id, actor, version, reason: transitions.cancel(
                   task_id, actor=actor, version=version, reason=reason)),
}


def page_verbs(stage: str) -> list[dict]:
    """The task page's buttons for a task in `stage`: [{verb, label}]."""
    return [{"verb": verb, "label": label} for verb, (label, stages, _) in PAGE_VERBS.items() if stage in stages]


def page_action(model_admin, request, task_id: str, verb: str) -> None:
    """Run the page's `verb` on `task_id`, held to the POSTed version; report it in one message
    (a task that moved since the page was read is a lost race: nothing is done)."""
    label, _, call = PAGE_VERBS[verb]
    actor = request.user.get_username()
    reason = request.POST.get("reason", "").strip()[:MAX_REASON_CHARS]
    version = request.POST.get("version", "")
    with Report(model_admin, request, label) as report:
        if not version.isdigit():
            report.skipped(task_id, "the page sent no version; reload it", "no version")
            return
        report.attempt(task_id, lambda: call(task_id, actor, int(version), reason),
                       lambda task: f"{'requeued, attempts reset' if verb == 'retry' else 'cancelled'} "
                                    f"(now {task.stage})")
