"""The search grammar (issue 33, item 2): one line of words and qualifiers, the same for
`GET /api/tasks?search=`, the all-tasks table, and the board's filter. `parse()` checks it as
client input (InvalidRequest naming the first bad term, nothing read); `Search.q()` is the ORM
filter it means on a store. Every term must match (AND); a stage: term repeated means any of them.

    deploy "two words"        free words: each in the id or the title, in any case
    tag:urgent                the task carries that tag (Task.tags)
    queue:ci-*  owner:w-3     a queue, holder or id: exact, `*` any run of characters, `?` one
    id:plan-7-*
    stage:failed              one of the stages, in any case
    error:timeout             its last error contains the words, in any case
    payload.repo:acme/web     a payload (or result) value at a path of keys: equal to the text, or
    result.status:error       to the number, true, false or null it spells
    created:<2h  updated:>1d  age under / over s, m, h, d (created in the last 2 hours; last
                              changed over a day ago)
    created:>2026-12-04T10:00Z   after / before a moment (ISO 8601, with its zone)

A value with spaces is quoted: `error:"connection reset"`. How each term is answered, and what is
indexed on which store: docs/api.md, "Searching tasks".
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.db.models.lookups import Contains

from board.engine import clock, errors, scopes
from board.engine.lifecycle import Stage
from board.engine.limits import MAX_SEARCH_CHARS, MAX_SEARCH_TERMS, MAX_TAG_CHARS, MAX_TAGS
from board.engine.stores import store

# A tag: 1-50 letters, digits and ._:/- (no quote, space or backslash: the SQLite search finds
# `"tag"` in the list's JSON text, which these characters cannot fake).
TAG_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:/-]{{0,{MAX_TAG_CHARS - 1}}}$"
TAG_RE = re.compile(TAG_PATTERN)
GLOB_FIELDS = {"queue": "queue", "owner": "owner", "id": "id", "replay_of": "replay_of"}
AGES = {"created": "created_at", "updated": "updated_at"}
JSON_FIELDS = ("payload", "result")
QUALIFIERS = ("tag", "queue", "owner", "id", "replay_of", "stage", "error", "created", "updated", "payload.PATH", "result.PATH")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TOKEN = re.compile(r'\s*(?:([A-Za-z][A-Za-z0-9_.-]*):)?("([^"]*)"|[^\s"]+)')
_PATH_KEY = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def tags_list(value: Any, field_name: str = "tags") -> list[str]:
    """A task's tags as given at create: a list of at most MAX_TAGS tags (TAG_PATTERN), kept in
    their order with repeats dropped; None is no tag."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TAGS:
        raise errors.InvalidRequest(f"{field_name} must be a list of at most {MAX_TAGS} tags", field=field_name)
    for tag in value:
        if not isinstance(tag, str) or not TAG_RE.fullmatch(tag):
            raise errors.InvalidRequest(f"{field_name}: {tag!r} is not a tag (1-50 letters, digits and ._:/- starting "
                                        "with a letter or digit)", field=field_name)
    return list(dict.fromkeys(value))


@dataclass
class Search:
    """A parsed search line: what each kind of term asks (every one must hold)."""
    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    globs: list[tuple[str, str]] = field(default_factory=list)  # (column, pattern)
    stages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    json_values: list[tuple[str, list[str], Any]] = field(default_factory=list)  # (column, path, value text)
    ages: list[tuple[str, str, Any]] = field(default_factory=list)  # (column, "<" or ">", timedelta or datetime)

    def q(self, using: str = "default") -> Q:
        """The tasks this search matches, as a filter for `using`'s store."""
        json_search = store(using).json_search
        match = Q()
        for word in self.words:
            match &= Q(id__icontains=word) | Q(title__icontains=word)
        for tag in self.tags:
            match &= _has_tag(tag, json_search)
        for column, pattern in self.globs:
            has_wildcard = any(c in pattern for c in "*?")
            match &= Q(**{f"{column}__regex": scopes.as_regex(pattern)}) if has_wildcard else Q(**{column: pattern})
        if self.stages:
            match &= Q(stage__in=self.stages)
        for text in self.errors:
            match &= Q(last_error__icontains=text)
        for column, path, text in self.json_values:
            match &= _json_equals(column, path, text, json_search)
        now = clock.now(using) if any(isinstance(v, timedelta) for _, _, v in self.ages) else None
        for column, sign, value in self.ages:
            if isinstance(value, timedelta):  # an age: "<2h" is newer than 2 hours ago
                moment, newer = now - value, sign == "<"
            else:  # a moment: ">T" is after it
                moment, newer = value, sign == ">"
            match &= Q(**{f"{column}__{'gt' if newer else 'lte'}": moment})
        return match


def parse(text: str | None) -> Search | None:
    """The search in `text`, or None for an empty one; InvalidRequest for anything else."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_SEARCH_CHARS:
        raise errors.InvalidRequest(f"search is at most {MAX_SEARCH_CHARS} characters", field="search")
    search = Search()
    position, terms = 0, 0
    while position < len(text) and text[position:].strip():
        found = _TOKEN.match(text, position)
        if found is None or found.end() == position:
            raise errors.InvalidRequest(f"search: cannot read {text[position:].strip()[:40]!r} (an unclosed quote?)",
                                        field="search")
        position = found.end()
        terms += 1
        if terms > MAX_SEARCH_TERMS:
            raise errors.InvalidRequest(f"search has at most {MAX_SEARCH_TERMS} terms", field="search")
        qualifier, value = found.group(1), found.group(3) if found.group(3) is not None else found.group(2)
        _add(search, qualifier, value)
    return search


def _bad(message: str):
    raise errors.InvalidRequest(f"search: {message}", field="search")


def _add(search: Search, qualifier: str | None, value: str) -> None:
    if not value.strip() or (qualifier is None and value.endswith(":") and value[:-1].isidentifier()):
        _bad(f"{qualifier or value[:-1]}: has no value")
    if qualifier is None:
        search.words.append(value)
    elif qualifier == "tag":
        if not TAG_RE.fullmatch(value):
            _bad(f"tag:{value} is not a tag (1-50 letters, digits and ._:/- starting with a letter or digit)")
        search.tags.append(value)
    elif qualifier in GLOB_FIELDS:
        if len(value) > 200:
            _bad(f"{qualifier}: is at most 200 characters")
        search.globs.append((GLOB_FIELDS[qualifier], value))
    elif qualifier == "stage":
        if value.upper() not in Stage.__members__:
            _bad(f"stage:{value} is not a stage; one of {', '.join(s.lower() for s in Stage)}")
        search.stages.append(value.upper())
    elif qualifier == "error":
        search.errors.append(value)
    elif qualifier in AGES:
        search.ages.append((AGES[qualifier], *_when(qualifier, value)))
    elif qualifier.split(".", 1)[0] in JSON_FIELDS and "." in qualifier:
        column, *path = qualifier.split(".")
        if not all(_PATH_KEY.fullmatch(key) for key in path):
            _bad(f"{qualifier}: a path is keys of letters, digits, _ and - joined by dots")
        search.json_values.append((column, path, value))
    else:
        _bad(f"unknown qualifier {qualifier!r}; known: {', '.join(QUALIFIERS)} (quote a word with a colon)")


def _when(qualifier: str, value: str) -> tuple[str, Any]:
    if value[:1] not in "<>":
        _bad(f"{qualifier}: starts with < or > (e.g. {qualifier}:<2h, {qualifier}:>2026-12-04T10:00Z)")
    sign, rest = value[0], value[1:]
    age = re.fullmatch(r"(\d{1,6})([smhd])", rest)
    if age:
        return sign, timedelta(seconds=int(age.group(1)) * _UNITS[age.group(2)])
    try:
        moment = datetime.fromisoformat(rest)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        _bad(f"{qualifier}:{value}: an age (30m, 2h, 7d) or an ISO 8601 moment with its zone")
    return sign, moment


def _literal(text: str) -> tuple[bool, Any]:
    """The JSON number, true, false or null `text` spells: (True, value), or (False, None)."""
    if text in ("true", "false", "null"):
        return True, {"true": True, "false": False, "null": None}[text]
    if re.fullmatch(r"-?\d{1,15}", text):
        return True, int(text)
    if re.fullmatch(r"-?\d{1,15}\.\d{1,15}", text):
        return True, float(text)
    return False, None


def _nested(path: list[str], value: Any) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def _json_equals(column: str, path: list[str], text: str, json_search: str) -> Q:
    """The value at `path` in `column` equals `text`, or the literal it spells. PostgreSQL: as
    containment (`@>`), which the GIN index on payload serves; elsewhere the key's value."""
    is_literal, literal = _literal(text)
    values = [text, literal] if is_literal else [text]
    match = Q(pk__in=[])
    for value in values:
        if json_search == "containment":
            match |= Q(**{f"{column}__contains": _nested(path, value)})
        elif value is None:
            match |= Q(**{f"{column}__{'__'.join(path)}__isnull": False, f"{column}__{'__'.join(path)}": None})
        else:
            match |= Q(**{f"{column}__{'__'.join(path)}": value})
    return match


def _has_tag(tag: str, json_search: str) -> Q:
    """The task carries `tag`. PostgreSQL: `tags @> '["tag"]'` (its GIN index); SQLite: the
    quoted tag in the list's JSON text (a tag holds no quote: TAG_PATTERN); MongoDB: an array
    element equal to it."""
    if json_search == "containment":
        return Q(tags__contains=[tag])
    if json_search == "text":
        return Q(Contains(Cast("tags", TextField()), f'"{tag}"'))
    return Q(tags=tag)  # MongoDB: a query on an array field matches any element
