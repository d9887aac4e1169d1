"""Operators' screens (Django admin). Thin callers of the engine: nothing here writes a task's
stage, version or lease, or an agent key's hash. Laid out as Django's own apps are:

- `tasks.py`    TaskAdmin: the change list, the task page with its history, the add form
- `keys.py`     AgentKeyAdmin: keys minted, shown once, revoked
- `queues.py`   QueueAdmin: each queue's limit, pause and running count, its history, the pause
                and resume actions (all through `board.engine.flow.change_queue`);
                ConcurrencyKeyAdmin, read-only; RateKeyAdmin, each key's rate and its history
                (through `board.engine.flow.change_rate_key`); FairnessKeyAdmin, the fairness keys'
                weights
- `resources.py` ResourceAdmin: each resource's capacity (through
                `board.engine.resources.change_capacity`), what is held of it and its holders
- `schedules.py` ScheduleAdmin: periodic tasks, their next ticks, the pause and resume actions
                (all through `board.engine.schedules`)
- `webhooks.py` WebhookAdmin: the subscriptions (created over the API), each with its delivery
                log; WebhookDeliveryAdmin, every delivery and the "send again" action
- `approvals.py` ApprovalAdmin: the questions agents asked people (approval gates), read-only,
                each waiting one with an answer page (through `board.engine.transitions.answer`,
                judged by `board.access.answer_rule`)
- `bulk.py`     the Tasks list's "Bulk job" action (every task its filters match, in the
                background: board/bulk/) and BulkJobAdmin, each job's summary and "Stop"
- `actions.py`  the task actions (each a verb of `board.engine.transitions` per selected task,
                held to the version read, or to the lease shown for force release) and their
                report: one summary message per action, each task's line in a collapsed list
- `forms.py`    engine-backed forms (edit under the version guard, create, mint a key, change a
                queue): the engine validates and writes; its error marks the field it names
                (`exc.field`)
- `filters.py`  the change lists' filters, and no lookup on a secret-derived column (`NoHashLookups`)
- `secret_columns.py` which columns are secret-derived (hashes, a claim's seed), which only sound so
- `display.py`  wording: durations, one lease helper (`LeaseState`, by the engine's rule of an
                expired lease), a task's card on the board

- `reads.py`    its own queries (filters' choices, an action's rows, what a stale edit missed); the
                engine's reads (`board.engine.selectors`) serve the rest

Django's admin autodiscovery imports this package, which registers the ModelAdmins.
"""
from board.admin.approvals import ApprovalAdmin
from board.admin.bulk import BulkJobAdmin
from board.admin.forms import TaskEditForm
from board.admin.keys import AgentKeyAdmin
from board.admin.queues import ConcurrencyKeyAdmin, FairnessKeyAdmin, QueueAdmin, RateKeyAdmin
from board.admin.resources import ResourceAdmin
from board.admin.schedules import ScheduleAdmin
from board.admin.tasks import TaskAdmin
from board.admin.webhooks import WebhookAdmin, WebhookDeliveryAdmin

__all__ = ["AgentKeyAdmin", "ApprovalAdmin", "BulkJobAdmin", "ConcurrencyKeyAdmin", "FairnessKeyAdmin", "QueueAdmin",
           "RateKeyAdmin", "ResourceAdmin", "ScheduleAdmin", "TaskAdmin", "TaskEditForm", "WebhookAdmin",
           "WebhookDeliveryAdmin"]
