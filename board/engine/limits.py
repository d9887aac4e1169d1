"""Every cap of the project, in one place: what a caller may send, and how much a page, a frame,
an admin action or a metrics scrape shows. Constants only (no Django, no I/O).

The engine enforces the caps on a task's own fields and on a batch for every caller (the API,
commands, the admin), raising `errors.InvalidRequest` / `errors.TooLarge` with the offending
`field`; the API's schemas check them as well, to answer before reading further. README's
"Limits" table states them with the error that refuses each; tests/test_limits_table.py checks
the table against this module. Caps set from the environment (request heads, bodies, timeouts,
waiting claims) are configuration: taskflow_site/settings.py.
"""
from datetime import timedelta

# --- leases and retries
MIN_TTL_SECONDS = 1
MAX_TTL_SECONDS = 24 * 3600
# The longest a claim may wait for work (the server holds it parked meanwhile).
MAX_WAIT_SECONDS = 30
MAX_RETRIES_LIMIT = 100
# One call of several moves (board.engine.transitions.batches): a claim's `max_tasks`, and the
# items of one batch complete.
MAX_CLAIM_BATCH = 100
MAX_COMPLETE_BATCH = 100

# Not a cap: one priority level is worth this many seconds of waiting in the claim order
# (board.engine.fairness), and one preference weight as much (board.engine.capabilities).
AGING_SECONDS = 60.0

# --- a task's dependencies, and one create request
MAX_DEPENDENCIES = 1000  # of one task
# One create request is one write transaction, and every other writer (a renew too) waits for
# it: these keep the largest one well under the shortest lease (tests/test_limits_batch.py).
MAX_BATCH_TASKS = 1000
MAX_BATCH_DEPENDENCIES = 10_000  # summed over the batch's tasks

# --- text, in characters
# A task id, a queue name, an agent key's name: 1-100 letters, digits and ._:- (the pattern:
# board.engine.inputs.TASK_ID_PATTERN).
MAX_NAME_CHARS = 100
# An agent's name as the engine takes it (a lease's owner, the history's actor): a key's name,
# or for a command or Python caller any name up to this; an owner may also be a staff user's.
MAX_OWNER_CHARS = 200
MAX_TITLE_CHARS = 300
MAX_DESCRIPTION_CHARS = 64 * 1024
MAX_ERROR_CHARS = 10_000
# A failure's traceback (kept in its history row, shown in the board's attempt timeline): room
# for a deep stack, small enough that a page of history stays light.
MAX_TRACEBACK_CHARS = 64 * 1024
MAX_REASON_CHARS = 500
MAX_TOKEN_CHARS = 100  # a lease token is 43; a longer one cannot match
MAX_REQUEST_ID_CHARS = 64  # a claim's request_id (board.engine.claim_requests)
MAX_CURSOR_CHARS = 1000  # the API's own cursors are under 200

# --- flow control (board.engine.flow)
MAX_CONCURRENCY = 10_000  # a queue's or a concurrency key's limit: 1 to this
MAX_CONCURRENCY_KEY_CHARS = 200  # a task's concurrency_key: 1 to this, printable
MAX_DEDUP_KEY_CHARS = 200  # a task's dedup_key: 1 to this, printable (the column's width)
MAX_FAIRNESS_KEY_CHARS = 200  # a task's fairness_key: 1 to this, printable (the column's width)
MAX_FAIRNESS_WEIGHT = 1000  # a fairness key's weight: 1 to this (turns for another key's one)
# A release's retry_after_seconds (a snooze): from 1 s to a week. Longer waits are a run_at.
MAX_SNOOZE_SECONDS = 7 * 24 * 3600
# A queue's rate: at most `count` (1 to this) claims start in any `per_seconds` (1 s to a day).
MAX_RATE_COUNT = 100_000
MAX_RATE_PER_SECONDS = 24 * 3600

# --- resource leases (board.engine.resources)
MAX_TASK_RESOURCES = 16  # resources one task declares
MAX_RESOURCE_NAME_CHARS = 200  # a resource's name: 1 to this (resources.NAME_PATTERN)
MAX_RESOURCE_CAPACITY = 10_000  # a resource's capacity, and the units a shared hold takes: 1 to this
# Not a cap: the units an exclusive hold counts, more than any capacity, so that no shared hold
# fits beside it (one number for the take's condition to read).
RESOURCE_EXCLUSIVE_UNITS = 1_000_000_000

# --- hand-offs: notes on a task (board.engine.transitions.notes) and what a claim hands over
# (board.engine.handoffs): the notes and the dependencies' results.
MAX_NOTE_CHARS = 4000  # a note's text
MAX_NOTES_PER_TASK = 100  # notes of one task, over all its attempts
MAX_NOTES_IN_CLAIM = 20  # the newest notes a claim carries (GET /api/tasks/{id}/notes has all)
MAX_INPUTS_BYTES = 1024 * 1024  # the dependencies' results a claim carries, as JSON; the rest are named

# --- approval gates (board.engine.approvals)
MAX_QUESTION_CHARS = 2000  # an approval's question
MAX_APPROVAL_FORM_BYTES = 16 * 1024  # its form (a JSON Schema), as JSON
MAX_APPROVAL_FIELDS = 20  # the form's fields (properties)
MAX_APPROVERS = 20  # usernames or groups named as its approvers
MAX_APPROVAL_TIMEOUT_SECONDS = 30 * 24 * 3600  # its timeout_seconds: 1 to this
# Not a cap: after an answer, how long the task waits for the agent that asked (a claim of it by id)
# before any agent may claim it.
APPROVAL_PREFER_SECONDS = 60

# --- tags and search (board.engine.search)
MAX_TAGS = 20  # of one task
MAX_TAG_CHARS = 50  # a tag: 1 to this, letters, digits and ._:/- (search.TAG_PATTERN)
MAX_SEARCH_CHARS = 500  # a search line
MAX_SEARCH_TERMS = 20  # its words and qualifiers

# --- schedules (board.engine.schedules)
# A schedule's tick makes the task `<name>:<tick, e.g. 20261204T1405Z>`, which must be a task id
# (MAX_NAME_CHARS): the name keeps room for the 15 characters of ":YYYYMMDDTHHMMZ".
MAX_SCHEDULE_NAME_CHARS = MAX_NAME_CHARS - len(":20261204T1405Z")
MAX_CRON_CHARS = 200  # a five-field cron expression, as text
# check()'s schedule_missed: a schedule not paused whose next tick is this far behind the store's
# clock has not been fired by any reaper (each pass, every second, fires what is due).
SCHEDULE_MISSED_GRACE = timedelta(seconds=60)
# After downtime only the latest missed tick fires; the ticks skipped before it are counted up
# to this many (a per-minute cron down for a year has 525,600: counting them all would hold the
# reaper's pass for seconds). More are reported as this many.
MAX_SKIPPED_TICKS_COUNTED = 10_000
# A task's deadlines (board.engine.deadlines): queue_timeout_seconds, attempt_timeout_seconds and
# progress_timeout_seconds, each a whole number of seconds from 1 to 30 days.
MAX_DEADLINE_SECONDS = 30 * 24 * 3600

# --- JSON values: payload, result and checkpoint
# Each at most this many bytes as compact JSON (a task's row, its history and every card of it
# stay small enough to read and send whole) ...
MAX_JSON_FIELD_BYTES = 256 * 1024
# ... and nested at most this many arrays/objects deep. Past a few hundred levels Python's JSON
# encoder (and the admin's rendering) runs out of recursion: a 500, not a refusal. 64 is room
# for any real document.
MAX_JSON_DEPTH = 64

# --- the API's pages
MAX_PAGE = 500  # tasks or events per page
MAX_PAGE_BYTES = 4 * 1024 * 1024  # of a task page's JSON; the largest task renders to under 3 MB

# --- agent keys
MAX_SCOPE_PATTERNS = 20  # queue patterns of one key (board.engine.scopes)
# Capabilities (board.engine.capabilities): labels of 1 to MAX_CAPABILITY_CHARS characters.
MAX_CAPABILITIES = 32  # labels of one key
MAX_CAPABILITY_CHARS = 60
MAX_REQUIRES = 8  # labels a task requires
MAX_PREFERS = 8  # labels a task prefers
MAX_PREFER_WEIGHT = 10  # one preferred label's weight, in priority levels
# Not a cap: a claim re-ranks by preference only the first this many tasks it could take.
PREFER_WINDOW = 16
# check()'s unclaimable_requirements: a key counts as alive while used within this long.
CAPABLE_KEY_SEEN = timedelta(hours=1)
# The longest grace a rotation may give the old key (the command's --rotate=SECONDS, the admin's
# field): a rotation is meant to end the old key, not to keep two keys alive indefinitely.
MAX_ROTATION_GRACE = timedelta(days=7)

# --- the admin
# An action reports one line per task; past this many tasks it refuses to start.
MAX_ACTION_ROWS = 1000
# How many owners the owner filter offers (the search box finds any owner).
OWNER_FILTER_LIMIT = 50
# How many queues the queue filter offers, the first by name: queue names are the clients' choice,
# and one choice per queue let 5,000 one-task queues take the list page from 30 KB to 384 KB.
# The search box finds any queue by its exact name, and ?queue= filters on any.
QUEUE_FILTER_LIMIT = 50
# The change form shows this many most recent events of a task (renewals add up).
HISTORY_LIMIT = 200

# --- the live board and metrics
# The page sends only {"type": "snapshot"}: anything much larger is not the page.
MAX_CLIENT_MESSAGE_CHARS = 4096
# An insights frame stays small (well under daphne's 1 MiB) however many agents and queues there
# are: the busiest are sent, and how many more there were.
MAX_HELD_IDS = 20  # task ids listed per agent (with the count of all it holds)
MAX_AGENTS = 200
MAX_QUEUES = 20
# Queues named in /metrics: the QUEUE_LABEL_LIMIT holding the most tasks, the rest summed into one
# label value (board.metrics.OTHER_QUEUES), so a scrape does not grow with the clients' queue names.
QUEUE_LABEL_LIMIT = 20

# --- webhooks (issue 33, item 6; board/webhooks/, docs/webhooks.md)
MAX_WEBHOOK_URL_CHARS = 2000  # a subscription's url
MAX_WEBHOOK_EVENTS = 10  # event names of one subscription (each once)
MAX_WEBHOOKS = 100  # subscriptions on the board (checked at create)
WEBHOOK_TIMEOUT_SECONDS = 5  # one delivery attempt: connect, send, and read the status line
WEBHOOK_MAX_ATTEMPTS = 12  # attempts of one delivery before it is given up (state "failed")
WEBHOOK_BACKOFF_BASE_SECONDS = 10  # the wait after attempt n: base * 2**(n-1), capped
WEBHOOK_BACKOFF_MAX_SECONDS = 3600
WEBHOOK_DELIVERIES_PER_PASS = 100  # due deliveries sent by one pass (the rest: the next pass)
WEBHOOK_PROBLEMS_PER_PASS = 100  # new check() problems announced per webhook per pass (the rest: the next)
WEBHOOK_KEEP_DAYS = 7  # delivered and given-up deliveries are deleted after this

# --- bulk actions on a filter (issue 33, item 1; board/bulk/, docs/bulk.md)
# Tasks one bulk job acts on: its ids and versions are read at once and kept in the job's row
# (about 30 bytes each). A filter that matches more is refused (413): narrow it, or run it again.
MAX_BULK_TASKS = 100_000
