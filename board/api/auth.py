"""Who is calling the API, and what it may do: an agent key (`Authorization: Bearer`) or a staff
user's session becomes a `Principal`; each endpoint's first line asks one of the `require_*`
checks (board/access.py decides what a session may do), and the scope checks make a task outside
a scoped key's queues absent to it (board.engine.scopes).
"""
from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from ninja.security import HttpBearer, SessionAuth

from board import access, agent_keys
from board.engine import errors, scopes, selectors
from board.engine.transitions import TaskSpec
from board.models import Task


@dataclass(frozen=True)
class Principal:
    """Who is calling: the name every verb records, and what it may do (board/access.py)."""

    name: str
    operator: bool
    agent: bool = True  # an agent key; False for a person's session
    can_read: bool = True
    can_create: bool = True
    # May change a queue's settings (board.engine.flow): operator keys, or board.change_queue.
    can_change_queues: bool = False
    # Set by AgentKeyAuth(deferred=True), whose key may not have been looked up for this
    # request: the verb must check it in its move (transitions' key_hash).
    key_hash: str | None = None
    # The queues an agent key is limited to (board.engine.scopes); None: every queue.
    scope: scopes.Scope = None
    # What the agent can do (board.engine.capabilities): its key's labels; () for a session.
    capabilities: tuple[str, ...] = ()


class AgentKeyAuth(HttpBearer):
    """An agent key in `Authorization: Bearer`. `deferred=True` (the hot verbs only: claim_next,
    renew, complete): a key this process verified in the last minute is taken without a query,
    and the Principal carries its hash for the verb to check in its own statement (the endpoint
    passes `request.auth.key_hash` on). Every other endpoint looks the key up."""

    def __init__(self, *, deferred: bool = False):
        super().__init__()
        self.deferred = deferred

    def __call__(self, request):
        # django-ninja's own parsing logs a header without "Bearer" (the whole key) when DEBUG
        # is on; this one never logs it. Read from META: `request.headers` would first copy every
        # header of the request into a new dict, for this one.
        scheme, _, credential = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != self.openapi_scheme or not credential:
            return None
        return self.authenticate(request, credential.strip())

    def authenticate(self, request, token):
        if self.deferred:
            known = agent_keys.authenticate_deferred(token)
            return Principal(known.name, known.is_operator, key_hash=known.key_hash, scope=known.scope,
                             capabilities=known.capabilities, can_change_queues=known.is_operator) if known else None
        key = agent_keys.authenticate(token)
        return Principal(key.name, key.is_operator, scope=agent_keys.scope_of(key),
                         capabilities=agent_keys.capabilities_of(key),
                         can_change_queues=key.is_operator) if key else None


class StaffSessionAuth(SessionAuth):
    """A staff user's session, CSRF-checked. Without a session cookie the CSRF check is skipped
    so that a request with no credentials at all gets 401, not 403."""

    def _get_key(self, request):
        if settings.SESSION_COOKIE_NAME not in request.COOKIES:
            return None
        return super()._get_key(request)

    def authenticate(self, request, key):
        user = request.user
        if access.is_board_user(user):
            return Principal(user.get_username(), access.may_intervene(user), agent=False,
                             can_read=access.may_read(user), can_create=access.may_create(user),
                             can_change_queues=access.may_change_queues(user))
        return None


# Every endpoint's authentication (board/api/main.py gives it to the NinjaAPI).
AUTH = [AgentKeyAuth(), StaffSessionAuth()]

# The hot verbs' authentication: a key verified in the last minute is checked by the move itself.
HOT_AUTH = [AgentKeyAuth(deferred=True), StaffSessionAuth()]


# Permission checks, one per endpoint, first thing in its body (before anything is read or
# written). Agent keys pass all but the operator check; sessions get what board/access.py says.


def _require(request, right: str, refusal: str) -> Principal:
    """The caller, if its Principal has `right`; otherwise 403 `forbidden` with `refusal`."""
    principal: Principal = request.auth
    if not getattr(principal, right):
        raise errors.Forbidden(refusal)
    return principal


def require_operator(request) -> Principal:
    return _require(request, "operator", "this needs operator rights (a key created with --operator, "
                                         "or the board.intervene permission)")


def require_queue_changer(request) -> Principal:
    return _require(request, "can_change_queues", "changing a queue needs operator rights (a key created with "
                                                  "--operator, or the board.change_queue permission)")


def require_reader(request) -> Principal:
    return _require(request, "can_read", "reading tasks needs the board.view_task permission")


def require_creator(request) -> Principal:
    return _require(request, "can_create", "creating tasks needs the board.add_task permission")


def require_agent(request) -> Principal:
    return _require(request, "agent", "claiming and holding tasks is for agents: send an agent key "
                                      "('Authorization: Bearer <key>'), not a browser session")


# Queue scopes (issue 27; board.engine.scopes): a scoped agent key sees and acts only on tasks
# of its queues. Every other task is absent to it: the very 404 an id that exists nowhere gets.
# Claim-next filters in its own statement (transitions.claim_next's `scope`); the reads filter
# in their query; a verb on one task reads the task's queue first, which cannot go stale before
# the verb's move: a task's queue is fixed at creation (transitions.EDITABLE leaves it out).


def _absent(task_id: str) -> errors.NotFound:
    return errors.NotFound(f"no task with id {task_id!r}")


def visible(request, task: Task) -> Task:
    """`task`, if the caller's scope covers its queue; else 404 as if absent."""
    if not scopes.allows(request.auth.scope, task.queue):
        raise _absent(task.pk)
    return task


def in_scope(request, task_id: str) -> None:
    """Before a verb on `task_id`: 404 as if absent unless the caller's scope covers its queue.
    One indexed read, for scoped keys only."""
    scope = request.auth.scope
    if scope is None:
        return
    queue = selectors.queues_of([task_id]).get(task_id)
    if queue is None or not scopes.allows(scope, queue):
        raise _absent(task_id)


def may_create_in(principal: Principal, specs: list[TaskSpec]) -> None:
    """A scoped key creates only in its queues (403: its own scope is no secret to it), and a
    dependency on a task it cannot see is unknown to it, as an absent one is."""
    scope = principal.scope
    if scope is None:
        return
    foreign = sorted({spec.queue for spec in specs if not scopes.allows(scope, spec.queue)})
    if foreign:
        raise errors.Forbidden(f"this key may create tasks only in queues matching {scopes.stored(scope)}; "
                               f"not in {', '.join(foreign)}")
    batch = {spec.id for spec in specs if spec.id is not None}
    external = sorted({dep for spec in specs for dep in spec.deps} - batch)
    if external:
        queues = selectors.queues_of(external)
        hidden = [dep for dep in external if dep in queues and not scopes.allows(scope, queues[dep])]
        if hidden:  # reported as the engine reports absent ones, together with them
            unknown = sorted(set(hidden) | {dep for dep in external if dep not in queues})
            raise errors.InvalidRequest(f"unknown dependencies: {', '.join(unknown)}", field="deps", unknown=unknown)
