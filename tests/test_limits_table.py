"""The documented "Limits" table (README.md, or the docs/*.md page it moved to) states every cap
with the value board.engine.limits has: a number in the table that disagrees fails here.

Each row of the table is either mapped below to the values it must state, in the order it states
them (limits' constants, and the few literal words of the rule such as "1–100"), or named as
configuration (caps set from the environment, in taskflow_site/settings.py). A new row must be
put in one of the two: an unknown row fails too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from board.engine import limits

ROOT = Path(__file__).resolve().parent.parent

# The row's "what" cell (as written, backticks and all) -> the numbers its "cap" cell states.
EXPECTED = {
    "tasks in one create request": [limits.MAX_BATCH_TASKS],
    "dependencies in one create request (all its tasks)": [limits.MAX_BATCH_DEPENDENCIES],
    "dependencies of one task": [limits.MAX_DEPENDENCIES],
    "`payload`, `result`, `checkpoint`": [limits.MAX_JSON_FIELD_BYTES],
    "`title`": [limits.MAX_TITLE_CHARS],
    "`description`": [limits.MAX_DESCRIPTION_CHARS],
    "`error` (fail)": [limits.MAX_ERROR_CHARS],
    "`traceback` (fail)": [limits.MAX_TRACEBACK_CHARS],
    "`reason` (operators' verbs)": [limits.MAX_REASON_CHARS],
    "a concurrency limit (`concurrency` of a queue, `concurrency_limit` of a key)": [1, limits.MAX_CONCURRENCY],
    "`concurrency_key`": [1, limits.MAX_CONCURRENCY_KEY_CHARS],
    "`rate_key`": [1, limits.MAX_CONCURRENCY_KEY_CHARS],
    "`retry_after_seconds` (a snooze)": [1, limits.MAX_SNOOZE_SECONDS],
    "`dedup_key`": [1, limits.MAX_DEDUP_KEY_CHARS],
    "`fairness_key` / `fairness_weight`": [1, limits.MAX_FAIRNESS_KEY_CHARS, 1, limits.MAX_FAIRNESS_WEIGHT],
    "a queue's `rate`": [1, limits.MAX_RATE_COUNT, 1, limits.MAX_RATE_PER_SECONDS],
    "a queue's or fairness key's `budget`": [1, 10, 15, 0, 10, 9],
    "`queue_timeout_seconds` / `attempt_timeout_seconds` / `progress_timeout_seconds`":
        [1, limits.MAX_DEADLINE_SECONDS],
    "task id, `queue`, agent name": [1, limits.MAX_NAME_CHARS],
    "`resources` of a task / a resource's name": [limits.MAX_TASK_RESOURCES, 1, limits.MAX_RESOURCE_NAME_CHARS],
    "a resource's `capacity` / a shared hold's `units`": [1, limits.MAX_RESOURCE_CAPACITY, 1, limits.MAX_RESOURCE_CAPACITY],
    "a schedule's `name` / `cron`": [1, limits.MAX_SCHEDULE_NAME_CHARS, 15, limits.MAX_CRON_CHARS],
    "live keys per agent name / a rotated key's grace": [1, 0, limits.MAX_ROTATION_GRACE.total_seconds()],
    "a key's queue patterns": [limits.MAX_SCOPE_PATTERNS, 1, limits.MAX_NAME_CHARS],
    "a key's `capabilities` / a capability label": [limits.MAX_CAPABILITIES, 1, limits.MAX_CAPABILITY_CHARS],
    "`requires` / `prefers` of a task / a preference's weight / the tasks a claim re-ranks by preference":
        [limits.MAX_REQUIRES, limits.MAX_PREFERS, 1, limits.MAX_PREFER_WEIGHT, limits.PREFER_WINDOW],
    "`token`": [limits.MAX_TOKEN_CHARS, 43],
    "`max_tasks` (a batch claim) / items of one batch complete": [1, limits.MAX_CLAIM_BATCH, 1, limits.MAX_COMPLETE_BATCH],
    "list filters `owner` / `text` / `queue`": [limits.MAX_OWNER_CHARS, limits.MAX_TITLE_CHARS],
    "`tags` of a task / a tag": [limits.MAX_TAGS, 1, limits.MAX_TAG_CHARS],
    "a `search` line": [limits.MAX_SEARCH_CHARS, limits.MAX_SEARCH_TERMS],
    "a note's `text` / notes of one task": [1, limits.MAX_NOTE_CHARS, limits.MAX_NOTES_PER_TASK],
    "what a claim hands over: `inputs` / `notes`": [limits.MAX_INPUTS_BYTES, limits.MAX_NOTES_IN_CLAIM],
    "an approval's `question` / `comment` / `form` / the form's fields / `approvers`":
        [1, limits.MAX_QUESTION_CHARS, limits.MAX_QUESTION_CHARS, limits.MAX_APPROVAL_FORM_BYTES,
         limits.MAX_APPROVAL_FIELDS, limits.MAX_APPROVERS],
    "an approval's `timeout_seconds` / an answered task kept for the agent that asked":
        [1, limits.MAX_APPROVAL_TIMEOUT_SECONDS, limits.APPROVAL_PREFER_SECONDS],
    "queues the admin's queue filter offers (`QUEUE_FILTER_LIMIT`, `board/admin/filters.py`)":
        [limits.QUEUE_FILTER_LIMIT],
    "queues named in `/metrics` (`QUEUE_LABEL_LIMIT`, `board/metrics.py`)": [limits.QUEUE_LABEL_LIMIT],
    "`cursor`": [limits.MAX_CURSOR_CHARS],
    "`limit` (a list page), `last` (recent events)": [1, limits.MAX_PAGE],
    "a page of `GET /api/tasks`": [limits.MAX_PAGE_BYTES, 3_000_000],
    "`ttl_seconds` / `wait_seconds` / `max_retries` / `priority`":
        [limits.MIN_TTL_SECONDS, limits.MAX_TTL_SECONDS, 0, limits.MAX_WAIT_SECONDS, 0, limits.MAX_RETRIES_LIMIT,
         32],
    "a webhook's `url` / `events` / webhooks on the board":
        [limits.MAX_WEBHOOK_URL_CHARS, 1, limits.MAX_WEBHOOK_EVENTS, limits.MAX_WEBHOOKS],
    "tasks one bulk job acts on (`POST /api/bulk`)": [limits.MAX_BULK_TASKS],
    "a webhook delivery's attempts":
        [limits.WEBHOOK_TIMEOUT_SECONDS, limits.WEBHOOK_BACKOFF_BASE_SECONDS, limits.WEBHOOK_BACKOFF_MAX_SECONDS,
         limits.WEBHOOK_MAX_ATTEMPTS, limits.WEBHOOK_KEEP_DAYS * 86400],
    "any string or JSON value": [],
    "`payload`, `result`, `checkpoint` depth": [limits.MAX_JSON_DEPTH],
}
# Rows whose caps are configuration (the environment, Django's settings) or a header's format
# (server/server_log.py), not constants of board.engine.limits.
NOT_IN_LIMITS = (
    "request head (request line + headers)",
    "request body",
    "claim body (",
    "a request head's arrival",
    "waiting claims (",
    "query parameters",
    "`X-Request-ID` header",
)

UNITS = {"KiB": 1024, "MiB": 1024 * 1024, "MB": 1_000_000, "s": 1, "h": 3600, "day": 86400, "days": 86400}
NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*)(?:\s*(KiB|MiB|MB|days|day|h|s)\b)?")


def limits_table() -> tuple[Path, list[tuple[str, str]]]:
    """The (what, cap) rows of the first table under a heading "Limits", in README.md or docs/."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = page.read_text(encoding="utf-8").splitlines()
        for at, line in enumerate(lines):
            if re.fullmatch(r"#+\s*Limits\s*", line):
                rows = []
                for row in lines[at + 1:]:
                    if row.startswith("#"):
                        break
                    if row.startswith("|") and not re.fullmatch(r"\|[-| :]+\|", row):
                        cells = [cell.strip() for cell in row.strip("|").split("|")]
                        rows.append((cells[0], cells[1]))
                    elif rows and not row.startswith("|"):
                        break  # the table ended
                return page, rows[1:]  # without the header row
    raise AssertionError("no heading 'Limits' with a table in README.md or docs/*.md")


def stated_numbers(cap: str) -> list[float]:
    """The numbers a cap cell states, in order, in bytes or seconds where it gives a unit. Code
    (`...`) and link targets are names, not numbers."""
    text = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", cap)
    return [int(digits.replace(",", "")) * UNITS.get(unit or "", 1) for digits, unit in NUMBER.findall(text)]


def test_the_table_is_found_and_every_row_is_known():
    page, rows = limits_table()
    assert len(rows) >= len(EXPECTED), f"{page}: the Limits table lost rows"
    unknown = [what for what, _ in rows if what not in EXPECTED and not what.startswith(NOT_IN_LIMITS)]
    assert not unknown, f"{page}: rows of the Limits table this test does not know; map them in EXPECTED: {unknown}"
    missing = sorted(set(EXPECTED) - {what for what, _ in rows})
    assert not missing, f"{page}: rows gone from the Limits table (or renamed): {missing}"


@pytest.mark.parametrize("what", sorted(EXPECTED))
def test_each_cap_in_the_table_is_the_one_the_code_has(what):
    page, rows = limits_table()
    cap = dict(rows)[what]
    assert stated_numbers(cap) == EXPECTED[what], f"{page}, row {what!r}: the table says {cap!r}"


def test_a_number_that_disagrees_fails():
    """The check above can fail: the table's cell with one number changed does not pass."""
    cap = dict(limits_table()[1])["`title`"]
    assert stated_numbers(cap) == [limits.MAX_TITLE_CHARS]
    wrong = cap.replace(f"{limits.MAX_TITLE_CHARS:,}", f"{limits.MAX_TITLE_CHARS + 1:,}")
    assert wrong != cap and stated_numbers(wrong) != [limits.MAX_TITLE_CHARS]
    assert stated_numbers("256 KiB of JSON each") == [256 * 1024]
    assert stated_numbers("1 s–24 h / 0–30 s") == [1, 86400, 0, 30]
