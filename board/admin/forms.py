"""The admin's forms. Validation is the engine's and so is the write: each form calls a verb
(`transitions.edit`, `transitions.create`, `agent_keys.create_key` / `set_capabilities`, `flow.change_queue`,
`flow.change_rate_key`, `flow.change_fairness_key`, `schedules.create_schedule` / `change_schedule`) as the last
step of its validation, so that a refusal shows on the form, and Django's save() writes nothing (but a
fairness key's weight: FairnessKeyChangeForm). An engine
error is shown on the field it names (`BoardError.field`), or above the form when it names none
of the form's fields; its message is never searched for a field's name.
"""
from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.core import signing

from board import agent_keys
from board.admin import reads
from board.engine import deadlines, errors, fairness, flow, schedules, selectors, transitions
from board.engine.limits import MAX_REASON_CHARS, MAX_ROTATION_GRACE
from board.models import AgentKey, FairnessKey, Queue, RateKey, Schedule, Task

# Fields an operator may edit; the engine's list, so the two can never disagree.
EDITABLE = tuple(transitions.EDITABLE)


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _unix_newlines(text: str | None) -> str | None:
    """Browsers send a textarea's line breaks as CRLF; the stored text has what the agent sent."""
    return text.replace("\r\n", "\n") if isinstance(text, str) else text


def current(exc: errors.BoardError, task_id: str) -> Task | None:
    """The task as it is now: the row the engine's error carries, else read it."""
    if isinstance(exc.task, Task):
        return exc.task
    return selectors.get_task(task_id)


class _EngineForm(forms.ModelForm):
    """A ModelForm whose write is an engine call made as the last step of validation (so that a
    refusal shows as a form error), and whose save() only returns the row the engine wrote."""

    actor = ""  # the operator's username; set per request by the admin's get_form

    def clean_payload(self):
        # Python's json reads NaN and Infinity; JSON (and the database) does not.
        value = self.cleaned_data.get("payload")
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise forms.ValidationError("payload is not valid JSON: NaN and Infinity are not numbers in JSON")
        return value

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.written = None

    def _post_clean(self):
        super()._post_clean()
        if not self._errors:
            self.apply()

    def apply(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def refused(self, exc: errors.BoardError) -> None:
        """Show the engine's refusal on the field it names, if this form has that field."""
        self.add_error(exc.field if exc.field in self.fields else None, exc.message)

    def save(self, commit=True):
        self.save_m2m = lambda: None
        return self.written


class TaskEditForm(_EngineForm):
    """Edits a task under the version guard: `opened_version` and the sealed `opened_state` say
    what the operator saw; saving calls transitions.edit(version=opened_version)."""

    SALT = "board.admin.task-edit"

    opened_version = forms.IntegerField(widget=forms.HiddenInput)
    opened_state = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = Task
        fields = EDITABLE

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("title", "description"):
            if name in self.fields:
                # Text round-trips exactly (an untouched field is not an edit); the engine says
                # what a title must be (its message is the one shown).
                self.fields[name].strip = False
                self.fields[name].required = False
        if not self.is_bound and self.instance.pk is not None:
            self.initial["opened_version"] = self.instance.version
            self.initial["opened_state"] = self.seal(self.instance)

    def clean_title(self):
        return _unix_newlines(self.cleaned_data.get("title"))

    def clean_description(self):
        return _unix_newlines(self.cleaned_data.get("description"))

    @classmethod
    def seal(cls, task: Task) -> str:
        state = {
            "version": task.version, "stage": task.stage, "owner": task.owner,
            "fields": {name: [_digest(getattr(task, name)), _short(getattr(task, name))] for name in EDITABLE},
        }
        return signing.dumps(state, salt=cls.SALT, compress=True)

    def apply(self) -> None:
        data = self.cleaned_data
        try:
            opened = signing.loads(data["opened_state"], salt=self.SALT)
        except signing.BadSignature:
            opened = None
        if not opened or opened.get("version") != data["opened_version"]:
            self.add_error(None, "This form is damaged or was not opened here; reload the page.")
            return
        task_id = self.instance.pk
        task = selectors.get_task(task_id)
        if task is None or task.version != opened["version"]:
            self.add_error(None, what_changed(task_id, opened, task))
            return
        changes = {
            name: data[name] for name in EDITABLE
            if name in self.fields and [_digest(data[name])] != opened["fields"].get(name, [None])[:1]
        }
        if not changes:
            self.written = task
            return
        try:
            self.written = transitions.edit(task_id, actor=self.actor, version=opened["version"], **changes)
        except errors.VersionConflict as exc:
            self.add_error(None, what_changed(task_id, opened, current(exc, task_id)))
        except errors.BoardError as exc:
            self.refused(exc)


def what_changed(task_id: str, opened: dict, task: Task | None) -> str:
    """The refusal of a stale edit: what moved since the form was opened."""
    if task is None:
        return f"Not saved: task {task_id} no longer exists."
    diffs = []
    if task.stage != opened["stage"]:
        diffs.append(f"stage {opened['stage']} → {task.stage}")
    if task.owner != opened["owner"]:
        diffs.append(f"owner {opened['owner'] or '(none)'} → {task.owner or '(none)'}")
    for name in EDITABLE:
        value = getattr(task, name)
        was = opened["fields"].get(name)
        if was is not None and _digest(value) != was[0]:
            diffs.append(f"{name} {was[1]} → {_short(value)}")
    moves = reads.moves_since(task_id, opened["version"], 10)
    by = ", ".join(f"{verb} by {actor or '(unknown)'}" for verb, actor in moves)
    return (
        f"Not saved: task {task_id} changed after you opened it "
        f"(version {opened['version']} → {task.version}{': ' + by if by else ''}). "
        f"{'; '.join(diffs) + '. ' if diffs else ''}"
        "Nothing was written; reload the page to edit the current task."
    )


class TaskCreateForm(_EngineForm):
    """Creates a task through transitions.create (dependencies as ids separated by commas)."""

    deps = forms.CharField(
        required=False, label="Dependencies",
        help_text="Ids of tasks this one waits for, separated by commas or spaces.",
    )

    class Meta:
        model = Task
        fields = ("id", "title", "description", "queue", "priority", "max_retries", "on_hold", "payload",
                  *deadlines.TIMEOUTS)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["id"].required = False
        self.fields["id"].help_text = "Leave empty to have one generated."
        self.fields["title"].required = False

    def validate_unique(self):
        pass  # the engine refuses a taken id (DuplicateId), atomically

    def apply(self) -> None:
        data = self.cleaned_data
        spec = transitions.TaskSpec(
            id=data.get("id") or None, title=data.get("title") or "",
            description=data.get("description") or "", payload=data.get("payload"),
            queue=data.get("queue") or "default", priority=data.get("priority") or 0,
            max_retries=data["max_retries"] if data.get("max_retries") is not None else 3,
            on_hold=bool(data.get("on_hold")),
            deps=tuple(d for d in data.get("deps", "").replace(",", " ").split() if d),
            **{name: data.get(name) for name in deadlines.TIMEOUTS},  # the engine checks 1 s to 30 days
        )
        try:
            self.written = transitions.create(spec, actor=self.actor)[0]
        except errors.BoardError as exc:
            self.refused(exc)


class AgentKeyCreateForm(_EngineForm):
    """Mints a key. An operator key acts as an operator through the API, so making one is itself
    an intervention: without board.intervene the field is not offered, and a request that sends
    it anyway is refused (never silently turned into a plain key).

    One live key per agent name (board.agent_keys): a name that has one is refused, unless
    "rotate" is chosen, which ends the old key after `grace_seconds`. Rotating changes a key,
    so it needs board.change_agentkey; without it the fields are not offered, and a request
    that sends them anyway is refused."""

    may_mint_operator = False  # set per request by the admin's get_form
    may_rotate = False  # likewise

    rotate = forms.BooleanField(
        required=False, label="Rotate",
        help_text="This name has a live key: replace it. The old key is refused after the grace below.")
    grace_seconds = forms.IntegerField(
        required=False, min_value=0, max_value=int(MAX_ROTATION_GRACE.total_seconds()), initial=0,
        label="Grace (seconds)", help_text="How long the old key keeps working after a rotation (0: it stops now).")

    class Meta:
        model = AgentKey
        fields = ("name", "is_operator", "queues", "capabilities")
        help_texts = {"capabilities": "What the agent can do: labels, comma-separated (e.g. gpu,python,model:opus). It "
                                      "claims only tasks whose requires are all among them; empty: only tasks that "
                                      "require none. Changeable later, on the key's page."}

    def clean(self):
        cleaned = super().clean()
        if not self.may_mint_operator and self.data.get("is_operator") not in (None, "", "off", "false", "0"):
            raise forms.ValidationError(
                "Only a user with the board.intervene permission may create an operator key.")
        if not self.may_rotate and self.data.get("rotate") not in (None, "", "off", "false", "0"):
            raise forms.ValidationError(
                "Only a user with the board.change_agentkey permission may rotate a key.")
        return cleaned

    def apply(self) -> None:
        rotate = None
        if self.may_rotate and self.cleaned_data.get("rotate"):
            rotate = timedelta(seconds=self.cleaned_data.get("grace_seconds") or 0)
        try:
            row, key = agent_keys.create_key(self.cleaned_data["name"],
                                             is_operator=bool(self.cleaned_data.get("is_operator")), rotate=rotate,
                                             queues=self.cleaned_data.get("queues") or None,
                                             capabilities=self.cleaned_data.get("capabilities") or None)
        except errors.BoardError as exc:
            if exc.field in self.fields:  # the capabilities name their field
                self.refused(exc)
                return
            # The key's name and queues are what this form sends that agent_keys judges.
            self.add_error("queues" if "queue pattern" in exc.message or "patterns" in exc.message else "name",
                           exc.message)
            return
        row.minted_key = key  # in memory only, for the one response that shows it
        self.written = row


class AgentKeyCapabilitiesForm(_EngineForm):
    """A key's page: its capabilities, the one thing of a key that changes (a key's name, kind
    and queues stay as minted: rotate to change those), written by agent_keys.set_capabilities,
    which checks every label (a bad one is this field's error, and nothing is written). An
    unchanged field writes nothing."""

    class Meta:
        model = AgentKey
        fields = ("capabilities",)
        # The one editable field: what a change does, and when the agent's claims see it.
        help_texts = {"capabilities": "Labels, comma-separated (e.g. gpu,python,model:opus): the agent claims only "
                                      "tasks whose requires are all among them; empty: only tasks that require none. "
                                      "Its claims see a change within a minute."}

    def apply(self) -> None:
        if "capabilities" not in self.changed_data:
            self.written = self.instance
            return
        try:
            self.written = agent_keys.set_capabilities(self.instance.pk, self.cleaned_data.get("capabilities") or "")
        except errors.BoardError as exc:
            self.refused(exc)


class _SealedSettingsForm(_EngineForm):
    """A settings page (a queue's, a rate key's): the values the page showed are sealed into
    `opened` (signed with SALT), so that `apply` sends only what the operator changed and can
    refuse a setting someone else changed meanwhile; a rate is checked by the engine's rule."""

    SALT: str
    SETTINGS: tuple[str, ...]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial["opened"] = signing.dumps(
                {name: getattr(self.instance, name) for name in self.SETTINGS}, salt=self.SALT)

    def clean(self):
        data = super().clean()
        count, per_seconds = data.get("rate_count"), data.get("rate_per_seconds")
        if count is not None or per_seconds is not None:
            try:  # the engine's rule and words (both, each in range)
                flow.rate_setting({"count": count, "per_seconds": per_seconds})
            except errors.BoardError as exc:
                self.add_error("rate_count", exc.message)
        return data

    def opened_settings(self) -> dict | None:
        """What the page showed, or None (an error added) for a damaged or foreign form."""
        try:
            opened = signing.loads(self.cleaned_data["opened"], salt=self.SALT)
        except signing.BadSignature:
            opened = None
        if not isinstance(opened, dict) or set(opened) != set(self.SETTINGS):
            self.add_error(None, "This form is damaged or was not opened here; reload the page.")
            return None
        return opened


BUDGET_SETTINGS = ("budget_tokens", "budget_cost_usd", "budget_per")


def budget_sent(data: dict) -> dict | None:
    """The budget a settings form's three fields say, as the engine takes it: None (no budget)
    when both amounts are empty; the period defaults to a day."""
    amounts = data["budget_tokens"], data["budget_cost_usd"]
    return None if amounts == (None, None) else {"tokens": amounts[0], "cost_usd": amounts[1],
                                                 "per": data["budget_per"] or "day"}


class QueueChangeForm(_SealedSettingsForm):
    """Sets a queue's limit and pauses or resumes it through flow.change_queue, which writes the
    row and its history in one transaction. Only the settings the operator changed from what the
    page showed (`opened`, sealed) are sent: a form opened before someone else paused the queue
    does not resume it by saving a new limit. A setting changed both here and, meanwhile, by
    someone else is refused with who changed it, and nothing is written."""

    SALT = "board.admin.queue-change"
    SETTINGS = ("concurrency", "rate_count", "rate_per_seconds", "paused", "budget_tokens", "budget_cost_usd",
                "budget_per")

    concurrency = forms.IntegerField(
        required=False, label="Concurrency limit",
        help_text="At most this many RUNNING tasks of the queue at once; empty: no limit. Lowering it below "
                  "the running count stops new claims until there is room; running tasks go on.")
    rate_count = forms.IntegerField(
        required=False, label="Rate: claims",
        help_text="With the window below: at most this many claims start in any window, spaced evenly "
                  "(60 per 60 s: one a second). Both empty: no rate.")
    rate_per_seconds = forms.IntegerField(
        required=False, label="Rate: per seconds", help_text="The window: 1 (per second), 60 (per minute), 3600 (per hour).")
    budget_tokens = forms.IntegerField(
        required=False, label="Budget: tokens",
        help_text="Input + output tokens its tasks' attempts may report per window; at it no claim of the queue "
                  "starts until the window ends or the budget is raised. Empty with the cost: no budget.")
    budget_cost_usd = forms.FloatField(required=False, label="Budget: cost (USD)",
                                       help_text="The cost its tasks may report per window (reports that give one).")
    budget_per = forms.ChoiceField(required=False, label="Budget: per",
                                   choices=[("day", "day (UTC)"), ("month", "month (UTC)"), ("total", "in total")])
    reason = forms.CharField(
        required=False, max_length=MAX_REASON_CHARS, strip=True,
        help_text="Why (kept in the queue's history; needed to pause, shown on the board).")
    opened = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = Queue
        fields = ("concurrency", "rate_count", "rate_per_seconds", "paused", "budget_tokens", "budget_cost_usd",
                  "budget_per")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "paused" in self.fields:  # a viewer's page has the settings read-only, not in the form
            self.fields["paused"].help_text = ("No new claim takes a task of this queue; leases already held "
                                               "renew and complete as usual.")

    def clean_concurrency(self):
        # The engine's rule (1 to MAX_CONCURRENCY, or none) and its words, before the model's.
        try:
            return flow.concurrency_limit(self.cleaned_data.get("concurrency"))
        except errors.BoardError as exc:
            raise forms.ValidationError(exc.message)

    def apply(self) -> None:
        data = self.cleaned_data
        opened = self.opened_settings()
        if opened is None:
            return
        name = self.instance.pk
        now = Queue.objects.filter(name=name).first()  # self.instance already holds the posted values
        sent = {setting: data[setting] for setting in self.SETTINGS if data[setting] != opened[setting]}
        moved = [setting for setting, value in sent.items()
                 if now is not None and getattr(now, setting) not in (opened[setting], value)]
        if moved:
            self.add_error(None, queue_changed(name, opened, now, moved))
            return
        if sent.get("paused") and not data.get("reason"):
            self.add_error("reason", "Pausing a queue needs a reason: it is kept in the history and shown on the "
                                     "board.")
            return
        if "rate_count" in sent or "rate_per_seconds" in sent:  # one setting for the engine
            sent.pop("rate_count", None), sent.pop("rate_per_seconds", None)
            sent["rate"] = (None if data["rate_count"] is None
                            else {"count": data["rate_count"], "per_seconds": data["rate_per_seconds"]})
        if set(BUDGET_SETTINGS) & set(sent):  # one setting for the engine
            for setting in BUDGET_SETTINGS:
                sent.pop(setting, None)
            sent["budget"] = budget_sent(data)
        try:
            self.written = flow.change_queue(name, actor=self.actor, reason=data.get("reason") or "", **sent)
        except errors.BoardError as exc:
            self.refused(exc)


def queue_changed(name: str, opened: dict, now: Queue, settings: list[str]) -> str:
    """The refusal of a queue change made on a page older than a change of the same setting."""
    latest = reads.queue_history(name, 1)
    by = f" (last changed by {latest[0].actor})" if latest else ""
    diffs = "; ".join(f"{s} {_short(opened[s])} → {_short(getattr(now, s))}" for s in settings)
    return (f"Not saved: queue {name} changed after you opened it{by}: {diffs}. "
            "Nothing was written; reload the page to change the current settings.")


class RateKeyChangeForm(_SealedSettingsForm):
    """Sets a rate key's rate through flow.change_rate_key, which writes the row and its history
    in one transaction. As QueueChangeForm: a rate changed by someone else after the page was
    opened (`opened`, sealed) is refused with who changed it, and nothing is written."""

    SALT = "board.admin.rate-key-change"
    SETTINGS = ("rate_count", "rate_per_seconds")

    rate_count = forms.IntegerField(
        required=False, label="Rate: claims",
        help_text="With the window below: at most this many claims of the tasks naming this key start in any "
                  "window, whatever their queues, spaced evenly (60 per 60 s: one a second). Both empty: no rate.")
    rate_per_seconds = forms.IntegerField(
        required=False, label="Rate: per seconds", help_text="The window: 1 (per second), 60 (per minute), 3600 (per hour).")
    reason = forms.CharField(required=False, max_length=MAX_REASON_CHARS, strip=True,
                             help_text="Why (kept in the key's history).")
    opened = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = RateKey
        fields = ("rate_count", "rate_per_seconds")

    def apply(self) -> None:
        data = self.cleaned_data
        opened = self.opened_settings()
        if opened is None:
            return
        name = self.instance.pk
        now = RateKey.objects.filter(name=name).first()  # self.instance already holds the posted values
        if now is not None and (now.rate_count, now.rate_per_seconds) != (opened["rate_count"],
                                                                           opened["rate_per_seconds"]):
            latest = reads.rate_key_history(name, 1)
            by = f" (last changed by {latest[0].actor})" if latest else ""
            self.add_error(None, f"Not saved: rate key {name} changed after you opened it{by}. "
                                 "Nothing was written; reload the page to change the current rate.")
            return
        rate = None if data["rate_count"] is None else {"count": data["rate_count"],
                                                        "per_seconds": data["rate_per_seconds"]}
        try:
            self.written = flow.change_rate_key(name, actor=self.actor, reason=data.get("reason") or "", rate=rate)
        except errors.BoardError as exc:
            self.refused(exc)


class FairnessKeyChangeForm(_SealedSettingsForm):
    """A fairness key's weight, and its budget set through flow.change_fairness_key (which writes
    the row's budget columns and the key's history in one transaction; nothing else writes them).
    As QueueChangeForm: the budget the page showed is sealed into `opened`, a budget changed by
    someone else after the page was opened is refused with who changed it, and nothing is written.
    The budget's fields are in the form only for a user who may change queues (`may_budget`, set
    per request by the admin, as the API's PUT /api/fairness-keys/{name} asks), and never on the
    add page (a key's budget is set on its page once it exists). The weight is saved by the admin
    (one column: FairnessKeyAdmin.save_model), after the budget's change."""

    SALT = "board.admin.fairness-key-change"
    SETTINGS = BUDGET_SETTINGS
    may_budget = False  # set per request by the admin's get_form

    budget_tokens = forms.IntegerField(
        required=False, label="Budget: tokens",
        help_text="Input + output tokens the attempts of the tasks naming this key may report per window, whatever "
                  "their queues; at it no claim of them starts until the window ends or the budget is raised. "
                  "Empty with the cost: no budget.")
    budget_cost_usd = forms.FloatField(required=False, label="Budget: cost (USD)",
                                       help_text="The cost its tasks may report per window (reports that give one).")
    budget_per = forms.ChoiceField(required=False, label="Budget: per",
                                   choices=[("day", "day (UTC)"), ("month", "month (UTC)"), ("total", "in total")])
    reason = forms.CharField(required=False, max_length=MAX_REASON_CHARS, strip=True,
                             help_text="Why (kept in the key's history with a change of its budget).")
    opened = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = FairnessKey
        fields = ("name", "weight", "budget_tokens", "budget_cost_usd", "budget_per")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance._state.adding or not self.may_budget:
            for name in (*BUDGET_SETTINGS, "reason", "opened"):
                self.fields.pop(name, None)

    def clean_weight(self):
        # The engine's rule (1 to MAX_FAIRNESS_WEIGHT) and its words, before the model's.
        try:
            weight = fairness.fairness_weight(self.cleaned_data.get("weight"), "weight")
        except errors.BoardError as exc:
            raise forms.ValidationError(exc.message)
        if weight is None:
            raise forms.ValidationError("A weight is required.")
        return weight

    def clean_name(self):
        try:
            return fairness.fairness_key(self.cleaned_data.get("name"), "name")
        except errors.BoardError as exc:
            raise forms.ValidationError(exc.message)

    def apply(self) -> None:
        self.written = self.instance
        if "opened" not in self.fields:
            return  # no budget on this page: the weight alone, saved by the admin
        data = self.cleaned_data
        opened = self.opened_settings()
        if opened is None:
            return
        name = self.instance.pk
        before = (None if opened["budget_per"] is None else
                  {"tokens": opened["budget_tokens"], "cost_usd": opened["budget_cost_usd"], "per": opened["budget_per"]})
        if budget_sent(data) == before:
            return  # the budget left as the page showed it (the weight alone, perhaps)
        now = FairnessKey.objects.filter(name=name).first()  # self.instance already holds the posted values
        if now is not None and any(getattr(now, setting) != opened[setting] for setting in BUDGET_SETTINGS):
            latest = reads.fairness_key_history(name, 1)
            by = f" (last changed by {latest[0].actor})" if latest else ""
            self.add_error(None, f"Not saved: fairness key {name}'s budget changed after you opened it{by}. "
                                 "Nothing was written; reload the page to change the current budget.")
            return
        try:
            self.written = flow.change_fairness_key(name, actor=self.actor, reason=data.get("reason") or "",
                                                    budget=budget_sent(data))
        except errors.BoardError as exc:
            self.refused(exc)


class ScheduleForm(_EngineForm):
    """Creates a schedule through schedules.create_schedule, or changes one through
    schedules.change_schedule with only the fields the operator changed (a field someone else
    changed meanwhile and this form did not touch is left as they set it). The engine validates
    the cron, the time zone and the template; a template field's refusal shows on `task`."""

    class Meta:
        model = Schedule
        fields = ("name", "cron", "timezone", "task", "paused")
        help_texts = {"task": "The template of each tick's task, as JSON: " + ", ".join(schedules.TEMPLATE_FIELDS)
                              + " (title required). Its id is the schedule's name and the tick: NAME:20261204T1405Z."}

    def validate_unique(self):
        pass  # the engine refuses a taken name (DuplicateName), atomically

    def refused(self, exc: errors.BoardError) -> None:
        field = "task" if exc.field in schedules.TEMPLATE_FIELDS else exc.field
        self.add_error(field if field in self.fields else None, exc.message)

    def apply(self) -> None:
        data = self.cleaned_data
        try:
            if self.instance._state.adding:
                self.written, created = schedules.create_schedule(
                    data["name"], cron=data["cron"], timezone=data["timezone"], task=data["task"],
                    paused=data["paused"], actor=self.actor)
                if not created:
                    raise errors.DuplicateName(f"a schedule named {data['name']!r} already exists", field="name")
            else:
                changed = {name: data[name] for name in self.changed_data if name in ("cron", "timezone", "task", "paused")}
                self.written = schedules.change_schedule(self.instance.pk, **changed)
        except errors.BoardError as exc:
            self.refused(exc)


class QueueActionForm(admin.helpers.ActionForm):
    """The queue list's action bar, with the reason kept in each queue's history."""

    reason = forms.CharField(
        required=False, max_length=MAX_REASON_CHARS, label="Reason:",
        widget=forms.TextInput(attrs={"placeholder": "why (kept in the queue's history)", "size": 30}),
    )


class TaskActionForm(admin.helpers.ActionForm):
    """The changelist's action bar, with the reason recorded in each event's detail."""

    reason = forms.CharField(
        required=False, max_length=MAX_REASON_CHARS, label="Reason:",
        widget=forms.TextInput(attrs={"placeholder": "why (kept in the history)", "size": 30}),
    )
