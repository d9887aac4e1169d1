"""Which columns hold a secret or something derived from one, and the rule that no admin list
is filtered on them.

Django's admin applies any lookup named in a change list's query string (`?field__gte=`,
`__startswith`, `__regex`, through relations too) unless `lookup_allowed` says no. A lookup on a
secret-derived column lets whoever may see the list recover the value a few characters at a
time, by watching the list narrow: the issue 27 review took a live lease's claim seed (from
which, with the request id, its token is computed) in 258 `?claim_token_seed__gte=` requests.

Every column of the project's models whose name sounds secret (`SECRET_SOUNDING`) is declared
here, as a secret or as harmless with the reason; tests/test_access_admin.py walks every model's
fields and fails on one that is neither, so a new secret column cannot be missed.
"""
from __future__ import annotations

import re

from django.db.models.constants import LOOKUP_SEP

# (model label, field name) -> what secret it holds or derives from.
SECRET_COLUMNS: dict[tuple[str, str], str] = {
    ("board.Task", "lease_token_hash"): "SHA-256 of the live lease's token",
    ("board.Task", "claim_token_seed"): "the seed a claim request's token is computed from (with the request id)",
    ("board.Task", "claim_request_hash"): "SHA-256 of (agent, claim request id)",
    ("board.AgentKey", "key_hash"): "SHA-256 of the agent key",
    ("board.Webhook", "secret"): "the key every delivery of the webhook is signed with (HMAC-SHA256): the board "
                                 "must keep it to sign, so it is stored as is, shown once at creation and never again",
    # Not ours, declared so the walk covers them: Django's UserAdmin refuses lookups on
    # `password` itself; sessions have no admin.
    ("auth.User", "password"): "the password's salted hash",
    ("sessions.Session", "session_key"): "a logged-in browser's session cookie",
}

# (model label, field name) -> why a column whose name sounds secret may be filtered on.
HARMLESS_COLUMNS: dict[tuple[str, str], str] = {
    ("board.AgentKey", "prefix"): "the key's label and first 6 of its 43 random characters, shown in the "
                                  "key list on purpose to tell keys apart; the rest stays unguessable",
    ("board.Task", "concurrency_key"): "a label chosen by the task's creator (e.g. repo:acme/web) that tasks "
                                       "share to be limited together (board.engine.flow); it grants nothing",
    ("board.Task", "rate_key"): "a label chosen by the task's creator (e.g. provider:openai) that tasks share "
                                "to be paced together by the key's rate (board.engine.flow); it grants nothing",
    ("board.RateKeyChange", "key"): "the name of the rate key whose rate changed (a Task.rate_key label)",
    ("board.Task", "dedup_key"): "a label chosen by the task's creator (e.g. nightly:2026-12-04) that makes a "
                                 "second create of the same work return the live task; it grants nothing",
    ("board.Task", "fairness_key"): "a label chosen by the task's creator (a plan, a person) whose tasks take "
                                    "turns with other keys' in the claim order (board.engine.fairness); it "
                                    "grants nothing",
    ("board.Queue", "budget_tokens"): "a count of LLM tokens a queue's tasks may report per window "
                                      "(board.engine.budgets), not a credential",
    ("board.Queue", "spent_tokens"): "a count of LLM tokens a queue's tasks reported in the budget's window "
                                     "(board.engine.budgets), not a credential",
    ("board.FairnessKey", "budget_tokens"): "a count of LLM tokens the tasks naming a fairness key may report "
                                            "per window (board.engine.budgets), not a credential",
    ("board.FairnessKey", "spent_tokens"): "a count of LLM tokens the tasks naming a fairness key reported in the "
                                           "budget's window (board.engine.budgets), not a credential",
    ("board.FairnessKeyChange", "key"): "the name of the fairness key whose budget changed (a Task.fairness_key "
                                        "label)",
    ("board.TaskUsage", "input_tokens"): "a count of an LLM's tokens a holder reported using (board.engine.usage), "
                                         "not a credential",
    ("board.TaskUsage", "output_tokens"): "a count of an LLM's tokens a holder reported using (board.engine.usage), "
                                          "not a credential",
}

# A field name with one of these in it is declared above, one way or the other.
SECRET_SOUNDING = re.compile(r"token|seed|hash|key|secret|password|prefix|salt|nonce|digest", re.IGNORECASE)

SECRET_NAMES = frozenset(name for _, name in SECRET_COLUMNS)
HARMLESS_NAMES = frozenset(name for _, name in HARMLESS_COLUMNS) - SECRET_NAMES


def names_a_secret(lookup: str) -> bool:
    """Whether a lookup path (`claim_token_seed__gte`, `dependencies__depends_on__key_hash`)
    names a secret column at any step. Judged by name, on every model: a path that reaches the
    column through any relation names it. Fails closed: a step whose name sounds secret and is
    not declared harmless counts as secret too, declared or not."""
    for part in lookup.split(LOOKUP_SEP):
        if part in SECRET_NAMES:
            return True
        if SECRET_SOUNDING.search(part) and part not in HARMLESS_NAMES:
            return True
    return False
