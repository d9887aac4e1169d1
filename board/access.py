"""Who may do what on the board: the one place that says which Django permission each kind of
access needs. The API (board/api/auth.py), the board page (board/live/views.py) and the board's socket ask
here; the admin applies the same permissions to its screens (board/admin/).

Agents authenticate with a key (board/agent_keys.py) and may read, create, claim and hold
tasks; an operator key may also intervene and change queues and schedules. People authenticate with an active staff account's
session and get what their permissions say (a superuser has them all):

| to ...                                                    | a staff user needs                |
|-----------------------------------------------------------|-----------------------------------|
| read tasks, their history and problems (API GETs, board)  | board.view_task or board.change_task (Django's admin: change implies view) |
| create tasks through the API                              | board.add_task                    |
| act as an operator (admit, requeue, cancel, force-*)      | board.intervene                   |
| run, read and stop bulk jobs (board/bulk/: API, board, admin) | board.intervene                |
| change a queue's limit, pause or resume it                | board.change_queue                |
| set, raise or remove a fairness key's budget (API, admin) | board.change_queue (the admin's Fairness keys page: board.change_fairnesskey changes the weight only) |
| create, change, pause, resume or delete a schedule        | board.change_queue (the admin's Schedules page: also board.view_schedule to only look) |
| create a webhook, send it a test (API, issue 33)          | board.add_webhook (an agent key: an --operator key not limited to some queues) |
| list and read webhooks and their deliveries (API, admin)  | board.view_webhook or board.add_webhook |
| delete a webhook                                          | board.delete_webhook or board.add_webhook |
| answer an approval (board.engine.approvals; API, board, admin) | board.view_task (or change) and: named among its approvers (username or group), or board.intervene when it names none (a superuser always) |
| claim, resume, renew, complete, fail, pause, release      | nobody: these are agents' verbs (a lease belongs to an agent process, which renews it); a person uses an agent key |
"""
from __future__ import annotations

READ = ("board.view_task", "board.change_task")
CREATE = "board.add_task"
INTERVENE = "board.intervene"
CHANGE_QUEUE = "board.change_queue"


def is_board_user(user) -> bool:
    """An account the board serves at all: authenticated, active and staff."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def may_read(user) -> bool:
    return is_board_user(user) and any(user.has_perm(perm) for perm in READ)


def may_create(user) -> bool:
    return is_board_user(user) and user.has_perm(CREATE)


def may_intervene(user) -> bool:
    return is_board_user(user) and user.has_perm(INTERVENE)


def may_change_queues(user) -> bool:
    return is_board_user(user) and user.has_perm(CHANGE_QUEUE)


ADD_WEBHOOK = "board.add_webhook"
VIEW_WEBHOOK = ("board.view_webhook", "board.add_webhook", "board.change_webhook")
DELETE_WEBHOOK = ("board.delete_webhook", "board.add_webhook")


def may_add_webhooks(user) -> bool:
    return is_board_user(user) and user.has_perm(ADD_WEBHOOK)


def may_view_webhooks(user) -> bool:
    return is_board_user(user) and any(user.has_perm(perm) for perm in VIEW_WEBHOOK)


def may_delete_webhooks(user) -> bool:
    return is_board_user(user) and any(user.has_perm(perm) for perm in DELETE_WEBHOOK)


def approver(user) -> dict:
    """Who `user` is as an approver: board.engine.approvals.may_answer's inputs (username, group
    names, operator rights, superuser). The board's pages get it to disable the answer buttons of
    a question the user may not answer; the answer itself is judged by `answer_rule`."""
    return {"username": user.get_username(), "groups": sorted(user.groups.values_list("name", flat=True)),
            "operator": may_intervene(user), "superuser": bool(user.is_superuser)}


def answer_rule(user):
    """`may_answer(approval) -> bool` for a staff user (board.engine.transitions.answer's
    `may_answer`, judged on the approval as read in the answer's transaction). The admin's answer
    form and the API (board/api/routers/approvals.py) use it."""
    from board.engine import approvals

    who = approver(user)
    groups = set(who["groups"])
    return lambda approval: approvals.may_answer(approval, username=who["username"], groups=groups,
                                                 operator=who["operator"], superuser=who["superuser"])
