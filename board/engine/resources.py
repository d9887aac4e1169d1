"""Resource leases (issue 32, item 1): what a claim takes with its task, fenced by its lease.

A task may declare `resources`: names such as `merge-slot`, `branch:main` or `file:src/app/**`,
each exclusive (a bare name) or shared (`{"name": "gpu", "units": 1}`, against the resource's
capacity, 1 unless an operator sets it). Claiming the task takes all of them in the claim's own
transaction or takes nothing (../shared/DESIGN.md section 7); every move out of RUNNING
(complete, fail, release, pause, expiry, takeover, cancel) gives them back in its own. A hold
lasts as long as the task's lease: renewing the lease extends it, and a stale holder is told
apart by the task's fence (`holder_of`: what examples/git-hooks/pre-push asks).

Names form a hierarchy: `/` separates levels, and the first `:` ends a scheme (`file:`,
`branch:`). A name with a wildcard (`*`, `?`, `[`) stands for the whole subtree of the node
before its first wildcard (`file:src/app/**` and `file:src/app/*.py` both hold `file:src/app/`).
Two names conflict when one's node is the other's or one of its ancestors: exactly when their
patterns could match a common path, and also for some that could not (`file:src/*.py` and
`file:src/*.js` conflict: the rule is conservative, never the other way). It is enforced as a
database's multi-granularity locks are: a claim holds the node it names (`held`: units, or
EXCLUSIVE) and an intent on each node above it (`intents`), and
- an intent needs the node not held (nobody holds that whole subtree);
- a hold needs no intent on the node (nobody holds anything below it) and room: an exclusive
  one needs the node not held at all, a shared one `held + units <= capacity`.
Each task's nodes are its TaskResource rows (`needs`), written at creation; each node's counts
are a Resource row. docs/resources.md says it for users.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import F, Q

from board.engine import clock, errors
from board.engine.inputs import reason_text
from board.engine.lifecycle import Stage
from board.engine.limits import (
    MAX_RESOURCE_CAPACITY,
    MAX_RESOURCE_NAME_CHARS,
    MAX_TASK_RESOURCES,
    RESOURCE_EXCLUSIVE_UNITS,
)
from board.engine.stores import store
from board.models import Resource, Task, TaskResource

# The units an exclusive hold counts: more than any capacity (limits.RESOURCE_EXCLUSIVE_UNITS).
EXCLUSIVE = RESOURCE_EXCLUSIVE_UNITS
# A name: printable, no space, no quote or backslash (it appears in SQL-free JSON text searches
# and in a shell hook), 1 to MAX_RESOURCE_NAME_CHARS.
NAME_PATTERN = re.compile(r"[A-Za-z0-9._:/*?\[\]@+=,~#%^!-]+")
WILDCARDS = "*?["
# Ids per IN list when reading the RUNNING tasks' needs (bounded lists, however many run).
_IDS_PER_READ = 500


# ---------------------------------------------------------------------------------------------
# Inputs


def declared(value: Any) -> list | None:
    """A create's `resources`, checked and normalised: a list of names (exclusive) and
    `{"name", "units"}` objects (shared), in the order given; None for none. Refused
    (InvalidRequest, field "resources"): anything else, a name twice, more than
    MAX_TASK_RESOURCES, and names that overlap (one inside another's subtree: the task would
    wait for itself)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise _bad('resources must be a list of names and {"name": NAME, "units": N} objects')
    if len(value) > MAX_TASK_RESOURCES:
        raise _bad(f"a task declares at most {MAX_TASK_RESOURCES} resources; this one has {len(value)}")
    normal: list = []
    for item in value:
        if isinstance(item, str):
            normal.append(_name(item))
            continue
        if not isinstance(item, dict) or set(item) - {"name", "units"} or "name" not in item:
            raise _bad('each resource is a name (exclusive) or {"name": NAME, "units": N} (shared)')
        units = item.get("units", 1)
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_RESOURCE_CAPACITY:
            raise _bad(f"a resource's units must be a whole number from 1 to {MAX_RESOURCE_CAPACITY}")
        normal.append({"name": _name(item["name"]), "units": units})
    needs(normal)  # refuses duplicates and overlaps
    return normal or None


def _name(value: Any) -> str:
    if (not isinstance(value, str) or not 1 <= len(value) <= MAX_RESOURCE_NAME_CHARS
            or not NAME_PATTERN.fullmatch(value)):
        raise _bad(f"a resource name is 1 to {MAX_RESOURCE_NAME_CHARS} characters: letters, digits and "
                   "._:/*?[]@+=,~#%^!- (no space or quote)")
    return value


def _bad(message: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(message, field="resources")


def capacity_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RESOURCE_CAPACITY:
        raise errors.InvalidRequest(f"capacity must be a whole number from 1 to {MAX_RESOURCE_CAPACITY}",
                                    field="capacity")
    return value


def resource_name(value: Any, field: str = "name") -> str:
    try:
        return _name(value)
    except errors.InvalidRequest as bad:
        raise errors.InvalidRequest(str(bad), field=field) from None


# ---------------------------------------------------------------------------------------------
# The hierarchy


def node_of(name: str) -> str:
    """The node a name holds: itself, or for a pattern the directory before its first wildcard
    (`file:src/app/**` -> `file:src/app/`; `branch:feat-*` -> `branch:`; `*` -> `` the root)."""
    cut = min((name.index(c) for c in WILDCARDS if c in name), default=None)
    if cut is None:
        return name
    head = name[:cut]
    ends = [head.rfind("/") + 1, head.find(":") + 1 if ":" in head else 0]
    return head[: max(ends)]


def ancestors(node: str) -> list[str]:
    """The nodes above `node`, top first: the scheme (`file:`) and each directory
    (`file:src/`, `file:src/app/`), without the node itself. A name without `:` or `/` has none."""
    found = []
    colon = node.find(":")
    if colon >= 0 and colon + 1 < len(node):
        found.append(node[: colon + 1])
    start = colon + 1
    while True:
        slash = node.find("/", start)
        if slash < 0 or slash + 1 >= len(node):
            break
        found.append(node[: slash + 1])
        start = slash + 1
    return found


def needs(resources: Iterable) -> list[tuple[str, int]]:
    """The nodes a claim of a task with these (normalised) resources takes: (node, units) with
    units EXCLUSIVE, the shared units, or 0 for an intent; sorted by node (the order every
    store takes them in, so that two claimers never wait for each other in a circle)."""
    held: dict[str, int] = {}
    intents: set[str] = set()
    for item in resources or ():
        name, units = (item, EXCLUSIVE) if isinstance(item, str) else (item["name"], item["units"])
        node = node_of(name)
        if not node:
            raise _bad(f"{name}: a pattern needs a name before its first wildcard (e.g. file:src/**)")
        if node in held:
            raise _bad(f"resources name {node} twice")
        held[node] = units
        intents.update(ancestors(node))
    inside = sorted(node for node in held if node in intents)
    if inside:
        raise _bad(f"resources overlap: {inside[0]} holds another of this task's resources")
    return sorted([*held.items(), *((node, 0) for node in intents)])


# ---------------------------------------------------------------------------------------------
# Rows: made before the create that names them; a task's needs written with it


def ensure_rows(using: str, nodes: Iterable[str]) -> None:
    """Before a create's transaction (as flow.ensure_rows, for the same reasons): a Resource row
    (capacity 1) for each node no row has yet."""
    nodes = sorted(set(nodes))
    if not nodes:
        return
    missing = set(nodes) - set(Resource.objects.using(using).filter(name__in=nodes).values_list("name", flat=True))
    if missing:
        s = store(using)
        with s.write_transaction():
            s.insert_missing(Resource, [Resource(name=name) for name in sorted(missing)])


def insert_needs(using: str, tasks: Iterable[Task]) -> None:
    """Inside a create's transaction: the TaskResource rows of its tasks that declare any."""
    rows = [TaskResource(task_id=task.pk, name=node, units=units)
            for task in tasks if task.resources for node, units in needs(task.resources)]
    if rows:
        TaskResource.objects.using(using).bulk_create(rows)


# ---------------------------------------------------------------------------------------------
# Taking and giving back: the ORM path (transitions.cas._swap); the SQL stores' statements say
# the same in SQL (board.engine.stores)


def _open(units: int) -> Q:
    """The rows of nodes a need of `units` may take now."""
    if units == 0:
        return Q(held=0)
    if units >= EXCLUSIVE:
        return Q(held=0, intents=0)
    return Q(intents=0, held__lte=F("capacity") - units)


def take(using: str, task: Task) -> None:
    """Inside the transaction that has just moved `task` into RUNNING: take its nodes, in order,
    each with a conditional update; the first that is not free raises flow.AtLimit, which rolls
    the whole move back (nothing taken)."""
    from board.engine.flow import AtLimit

    for node, units in needs(task.resources):
        changes: dict[str, Any] = {"held": F("held") + units} if units else {"intents": F("intents") + 1}
        if not Resource.objects.using(using).filter(_open(units), name=node).update(**changes):
            raise AtLimit(task, _refusal(using, task.pk, node, units))


def give_back(using: str, task: Task) -> None:
    """`task` has just left RUNNING in this transaction: its nodes are free of its hold."""
    for node, units in needs(task.resources):
        changes: dict[str, Any] = {"held": F("held") - units} if units else {"intents": F("intents") - 1}
        Resource.objects.using(using).filter(name=node).update(**changes)


def forget_needs(using: str, task: Task) -> None:
    """`task` has just become COMPLETED or CANCELLED in this transaction: it will never take its
    nodes again, so its TaskResource rows go (the table then holds the needs of unfinished tasks
    only, which every read of it relies on to stay small; Task.resources keeps what it declared).
    A FAILED task keeps them: an operator may requeue it."""
    TaskResource.objects.using(using).filter(task_id=task.pk).delete()


# ---------------------------------------------------------------------------------------------
# Reads: who holds what, what a task waits for


def running_needs(using: str, nodes: Iterable[str] | None = None) -> list[tuple[str, int, str, str, int, Any]]:
    """(node, units, task id, owner, fence, lease expiry) of every RUNNING task's needs (of
    `nodes` when given). Found from the RUNNING tasks (the stage's index), then their needs by
    task: its cost follows what runs, not how many unfinished tasks declare resources."""
    running = {pk: (owner, fence, expires) for pk, owner, fence, expires in Task.objects.using(using).filter(
        stage=Stage.RUNNING, resources__isnull=False).values_list("pk", "owner", "fence", "lease_expires_at")}
    ids = sorted(running)
    wanted = None if nodes is None else set(nodes)
    found = []
    for start in range(0, len(ids), _IDS_PER_READ):
        for task_id, node, units in TaskResource.objects.using(using).filter(
                task_id__in=ids[start:start + _IDS_PER_READ]).values_list("task_id", "name", "units"):
            if wanted is None or node in wanted:
                found.append((node, units, task_id, *running[task_id]))
    return found


def holders(using: str = "default", names: Iterable[str] | None = None, *, after: str | None = None,
            limit: int | None = None) -> list[dict]:
    """The resource rows (of `names` when given; by name, after `after`, at most `limit`) with
    their holders: what GET /api/resources answers. A holder is a RUNNING task's lease: its task,
    agent, fence and expiry (the hold ends with the lease: renewing extends it)."""
    with store(using).read_transaction():
        resources = Resource.objects.using(using).all()
        if names is not None:
            resources = resources.filter(name__in=list(names))
        if after is not None:
            resources = resources.filter(name__gt=after)
        resources = resources.order_by("name")
        resources = list(resources if limit is None else resources[:limit])
        holds = running_needs(using, [r.name for r in resources])
    by_node: dict[str, list[dict]] = defaultdict(list)
    for hold in sorted(holds, key=lambda h: (h[0], h[2])):
        if hold[1]:
            by_node[hold[0]].append(_holder(hold))
    return [{"name": r.name, "capacity": r.capacity,
             "held": "exclusive" if r.held >= EXCLUSIVE else r.held,
             "holds_below": r.intents, "holders": by_node.get(r.name, [])} for r in resources]




def overview(limit: int, holders_each: int, *, using: str = "default") -> tuple[list[dict], int]:
    """The resources that hold something back now, at most `limit`, for the live board's "queues"
    frame (its QUEUED cards say which one they wait for): the full ones first (held exclusively or
    to capacity), then those partly held, then those with holds below them only (`holds_below`),
    each group by name; each with at most `holders_each` holders (`more_holders`: how many more),
    a holder being a RUNNING task and its agent (never its lease token, fence or expiry: a renew
    changes nothing shown). And how many more resources there are. One consistent read, found
    from the RUNNING tasks (the stage's index, then their needs and those nodes' rows by key):
    its cost follows what runs, not how many resources were ever named (rows are never deleted,
    and no index serves `held` or `intents`)."""
    with store(using).read_transaction():
        agents = dict(Task.objects.using(using).filter(stage=Stage.RUNNING).values_list("pk", "owner"))
        ids = sorted(agents)
        needs: list[tuple[str, str, int]] = []
        for start in range(0, len(ids), _IDS_PER_READ):
            needs += TaskResource.objects.using(using).filter(task_id__in=ids[start:start + _IDS_PER_READ]).values_list(
                "task_id", "name", "units")
        nodes = sorted({node for _, node, _ in needs})
        rows: list[tuple] = []
        for start in range(0, len(nodes), _IDS_PER_READ):
            rows += Resource.objects.using(using).filter(name__in=nodes[start:start + _IDS_PER_READ]).filter(
                Q(held__gt=0) | Q(intents__gt=0)).values_list("name", "capacity", "held", "intents")
    rows.sort(key=lambda r: (0 if r[2] >= r[1] else 1 if r[2] else 2, r[0]))
    by_node: dict[str, list[dict]] = defaultdict(list)
    for task_id, node, units in sorted(needs, key=lambda n: (n[1], n[0])):
        if units:
            by_node[node].append({"task": task_id, "agent": agents[task_id]})
    return [{"name": name, "capacity": capacity, "held": "exclusive" if held >= EXCLUSIVE else held,
             "holds_below": intents, "holders": by_node[name][:holders_each],
             "more_holders": max(0, len(by_node[name]) - holders_each)}
            for name, capacity, held, intents in rows[:limit]], max(0, len(rows) - limit)


def holder_of(using: str, name: str, task_id: str, fence: int) -> dict:
    """Whether the lease (task, fence) holds `name` now: the task is RUNNING under that fence
    with a live lease and declared a resource whose node is `name`'s. What a downstream system
    (examples/git-hooks/pre-push) asks before it accepts a write: a holder whose lease was taken
    over has a lower fence than the task's, and is refused."""
    node = node_of(name)
    now = clock.now(using)
    with store(using).read_transaction():
        task = Task.objects.using(using).filter(pk=task_id).values_list(
            "stage", "fence", "lease_expires_at", "owner").first()
        needed = TaskResource.objects.using(using).filter(task_id=task_id, name=node, units__gt=0).exists()
        current = [h for h in running_needs(using, [node]) if h[1] > 0]
    holds = (task is not None and needed and task[0] == Stage.RUNNING and task[1] == fence
             and task[2] is not None and task[2] > now)
    return {"name": name, "node": node, "task": task_id, "fence": fence, "holds": holds,
            "holders": [_holder(h) for h in current]}


def _holder(hold: tuple) -> dict:
    """A hold as the API shows it: the lease that holds the node (its task, agent, fence and
    expiry) and what it holds."""
    _node, units, task_id, owner, fence, expires = hold
    return {"task": task_id, "agent": owner, "fence": fence, "units": None if units >= EXCLUSIVE else units,
            "exclusive": units >= EXCLUSIVE, "expires_at": expires}


def why_waiting(using: str, task: Task) -> str | None:
    """What keeps `task` (QUEUED, with resources) from being claimed now: the first of its
    resources that is not free, and who holds it ("merge-slot held by worker-3 (task t1)"), or
    None when all are free."""
    if not task.resources:
        return None
    own = needs(task.resources)
    rows = {r.name: r for r in Resource.objects.using(using).filter(name__in=[node for node, _ in own])}
    for node, units in own:
        row = rows.get(node)
        if row is None:
            continue
        free = (row.held == 0 if units == 0 else
                row.held == 0 and row.intents == 0 if units >= EXCLUSIVE else
                row.intents == 0 and row.held + units <= row.capacity)
        if free:
            continue
        return _refusal(using, task.pk, node, units)
    return None


def _refusal(using: str, task_id: str, node: str, units: int) -> str:
    """Why a need of `units` on `node` is not free, naming a holder that keeps it: "resource
    merge-slot held by worker-3 (task t1)"."""
    blockers = [h for h in _blockers(using, node, units) if h[2] != task_id]
    capacity = Resource.objects.using(using).filter(name=node).values_list("capacity", flat=True).first()
    if 0 < units < EXCLUSIVE and capacity is not None and units > capacity:
        return f"resource {node} needs {units} units; its capacity is {capacity}"
    if not blockers:
        return f"resource {node} is held"
    node_held, _, holder_task, owner, _, _ = blockers[0]
    what = node if node_held == node else f"{node} (by {node_held})"
    more = f" and {len(blockers) - 1} more" if len(blockers) > 1 else ""
    return f"resource {what} held by {owner} (task {holder_task}){more}"


def _blockers(using: str, node: str, units: int) -> list[tuple]:
    """The RUNNING holds that keep a need of `units` on `node` waiting: holds of the node and of
    its ancestors (for any need), and of nodes below it (for a hold)."""
    above = ancestors(node)
    found = [h for h in running_needs(using, [node, *above]) if h[1] > 0]
    if units and node.endswith(("/", ":")):  # a directory's node: the holds inside it
        below = TaskResource.objects.using(using).filter(name__startswith=node, units__gt=0).exclude(name=node)
        below_nodes = sorted(set(below.values_list("name", flat=True)))
        found += [h for h in running_needs(using, below_nodes) if h[1] > 0]
    return sorted(found, key=lambda h: (h[0], h[2]))


def waiting_tasks(using: str):
    """The QUEUED tasks with a need that cannot be taken now, as the Resource rows read (a
    read in the ORM path's transaction: the take decides): a need of a full node; an intent
    under a held node; an exclusive hold of a node held or with holds inside it; a shared hold
    that does not fit. Where the store joins cheaply, a subquery; elsewhere (MongoDB) a list
    of ids. Nothing (an empty list) while no resource is held."""
    busy = list(Resource.objects.using(using).filter(Q(held__gt=0) | Q(intents__gt=0))
                .values_list("name", "capacity", "held", "intents"))
    if not busy:
        return []
    held = [name for name, _, units, _ in busy if units > 0]
    inside = [name for name, _, _, count in busy if count > 0]
    blocked = (Q(name__in=held, units=0) | Q(name__in=held, units__gte=EXCLUSIVE)
               | Q(name__in=inside, units__gt=0))
    for name, capacity, units, _ in busy:
        blocked |= Q(name=name, units__gt=max(capacity - units, 0), units__lt=EXCLUSIVE)
    needs = TaskResource.objects.using(using).filter(blocked).values("task_id")
    if store(using).joins_cheaply:
        return needs
    ids = {row["task_id"] for row in needs}
    if not ids:
        return []
    return list(Task.objects.using(using).filter(pk__in=list(ids), stage=Stage.QUEUED).values_list("pk", flat=True))


# ---------------------------------------------------------------------------------------------
# Operators


def change_capacity(name: str, capacity: Any, *, actor: str, reason: str = "", using: str = "default") -> Resource:
    """Set a resource's capacity (the units its shared holders may hold together; an exclusive
    hold takes it whole whatever it is). A lowered capacity applies to the next claims: the holds
    already taken stay until they end. A resource no task named yet gets its row. `actor` and
    `reason` are checked as a queue change's; the row keeps when it changed (`updated_at`)."""
    name = resource_name(name)
    capacity = capacity_value(capacity)
    reason_text(reason)
    s = store(using)
    with s.write_transaction():
        s.insert_missing(Resource, [Resource(name=name)])
        now = clock.now(using)
        Resource.objects.using(using).filter(name=name).exclude(capacity=capacity).update(
            capacity=capacity, updated_at=now)
        return Resource.objects.using(using).get(name=name)


# ---------------------------------------------------------------------------------------------
# check()


def counts_from_tasks(running_needs: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """(held, intents) per node, as the RUNNING tasks' needs say they must be."""
    counted: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for node, units in running_needs:
        counted[node][0 if units else 1] += units or 1
    return {node: (held, intents) for node, (held, intents) in counted.items()}

