"""A stable API: board/api/openapi.json is the committed contract of /api/ (docs/api.md, "API stability").

The committed file must be what the API generates now. A difference that could break a client
written against the committed file fails with the list of breaking changes (they belong under a
new version prefix); an additive one fails until the file is regenerated, and says the command.
`compare()` itself is tested on hand-made documents, one per kind of change.
"""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from board.management.commands.api_schema import (
    REGENERATE,
    SCHEMA_FILE,
    build_schema,
    check_message,
    compare,
    error_codes,
    render,
)

ROOT = Path(__file__).resolve().parent.parent


# -- the committed schema ----------------------------------------------------------------------


def test_the_committed_schema_is_what_the_api_generates():
    committed_text = SCHEMA_FILE.read_text()
    current = build_schema()
    problem = check_message(json.loads(committed_text), current)
    assert problem is None, problem
    # Byte for byte too (sorted keys, fixed indent), so that a regenerated file has no noise.
    assert committed_text == render(current), f"board/api/openapi.json is not formatted as written by: {REGENERATE}"


def test_the_committed_schema_is_the_one_the_api_serves_plus_its_error_codes():
    served = Client().get("/api/openapi.json")
    assert served.status_code == 200
    committed = json.loads(SCHEMA_FILE.read_text())
    assert committed.pop("x-error-codes") == error_codes()
    assert committed == served.json()


def test_the_error_codes_are_those_the_readme_lists():
    """The collected codes (engine classes, middleware, the API's literal codes) and docs/api.md's
    list of every error code agree: neither misses one."""
    readme = (ROOT / "docs" / "api.md").read_text()
    paragraph = readme[readme.index("Every error is `{\"error\""):]
    paragraph = paragraph[: paragraph.index("\n\n")]
    listed = set(re.findall(r"`([a-z]+(?:_[a-z]+)*)`", paragraph))
    assert listed == set(error_codes())


def test_the_command_writes_and_checks_a_schema_file(tmp_path):
    target = tmp_path / "openapi.json"
    out = io.StringIO()
    call_command("api_schema", "--write", "--file", str(target), stdout=out)
    assert target.read_text() == SCHEMA_FILE.read_text()
    call_command("api_schema", "--check", "--file", str(target), stdout=out)
    assert "is current" in out.getvalue()

    # An older file that lacks a path: the current API only adds one, which needs the file updated.
    older = json.loads(target.read_text())
    del older["paths"]["/api/check"]
    target.write_text(render(older))
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("api_schema", "--check", "--file", str(target), stderr=err)
    assert exited.value.code == 1
    assert "/api/check: new path" in err.getvalue() and REGENERATE in err.getvalue()

    # A file that promises more than the API has: a field the API no longer answers is breaking.
    newer = json.loads(SCHEMA_FILE.read_text())
    newer["components"]["schemas"]["TaskOut"]["properties"]["owner_email"] = {"type": "string"}
    target.write_text(render(newer))
    err = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("api_schema", "--check", "--file", str(target), stderr=err)
    assert ".owner_email: response field removed" in err.getvalue()
    assert "new version prefix" in err.getvalue() and REGENERATE not in err.getvalue()


# -- compare(), on hand-made documents ----------------------------------------------------------


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


BASE = {
    "openapi": "3.1.0",
    "info": {"title": "board", "version": "1"},
    "paths": {
        "/api/tasks": {
            "get": {
                "summary": "List tasks",
                "parameters": [
                    {"in": "query", "name": "limit", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                    {"in": "query", "name": "stage", "required": False,
                     "schema": {"type": "array", "items": {"type": "string", "enum": ["QUEUED", "RUNNING"]}}},
                ],
                "responses": {"200": json_body(ref("TaskPage")), "422": json_body(ref("ErrorOut"))},
            },
        },
        "/api/tasks/{task_id}/renew": {
            "post": {
                "parameters": [{"in": "path", "name": "task_id", "required": True, "schema": {"type": "string"}}],
                "requestBody": {"required": True, **json_body(ref("RenewIn"))},
                "responses": {"200": json_body(ref("ClaimOut")), "409": json_body(ref("ErrorOut"))},
            },
        },
    },
    "components": {"schemas": {
        "RenewIn": {
            "type": "object", "additionalProperties": False, "required": ["token", "ttl_seconds"],
            "properties": {
                "token": {"type": "string", "maxLength": 100},
                "ttl_seconds": {"type": "number", "minimum": 1, "maximum": 86400},
                "progress": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]},
                "mode": {"type": "string", "enum": ["soft", "hard"]},
                "note": {"type": "string"},
                "checkpoint": {},
            },
        },
        "TaskOut": {
            "type": "object", "required": ["id", "stage", "fence", "lease_expires_at"],
            "properties": {
                "id": {"type": "string"},
                "stage": {"type": "string", "enum": ["QUEUED", "RUNNING"]},
                "fence": {"type": "integer"},
                "lease_expires_at": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
            },
        },
        "LeaseOut": {"type": "object", "required": ["token", "fence"],
                     "properties": {"token": {"type": "string"}, "fence": {"type": "integer"}}},
        "ClaimOut": {"type": "object", "required": ["task", "lease"],
                     "properties": {"task": ref("TaskOut"), "lease": ref("LeaseOut")}},
        "TaskPage": {"type": "object", "required": ["items"],
                     "properties": {"items": {"type": "array", "items": ref("TaskOut")},
                                    "next": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
        "ErrorOut": {"type": "object", "required": ["error"],
                     "properties": {"error": {"type": "object", "required": ["code", "message"],
                                              "properties": {"code": {"type": "string"},
                                                             "message": {"type": "string"}}}}},
    }},
    "x-error-codes": ["lease_lost", "taken", "validation_error"],
}
RENEW = "/api/tasks/{task_id}/renew"


def changed(mutate) -> tuple[list[str], list[str]]:
    new = copy.deepcopy(BASE)
    mutate(new)
    changes = compare(BASE, new)
    return changes.breaking, changes.additive


def schemas(doc: dict) -> dict:
    return doc["components"]["schemas"]


def renew_in(doc: dict) -> dict:
    return schemas(doc)["RenewIn"]["properties"]


def task_out(doc: dict) -> dict:
    return schemas(doc)["TaskOut"]


def list_params(doc: dict) -> list:
    return doc["paths"]["/api/tasks"]["get"]["parameters"]


BREAKING = {
    "removed path": (lambda d: d["paths"].pop(RENEW), f"{RENEW}: path removed"),
    "removed method": (lambda d: d["paths"]["/api/tasks"].pop("get"), "GET /api/tasks: method removed"),
    "removed success status": (lambda d: d["paths"][RENEW]["post"]["responses"].pop("200"), "response 200 removed"),
    "new success status": (lambda d: d["paths"][RENEW]["post"]["responses"].update({"202": {}}),
                           "new success status 202"),
    "removed response field": (lambda d: task_out(d)["properties"].pop("fence"), ".fence: response field removed"),
    "response field no longer required": (lambda d: task_out(d)["required"].remove("fence"),
                                          ".fence: response field may now be missing"),
    "response type changed": (lambda d: task_out(d)["properties"]["fence"].update(type="string"),
                              ".fence: may now be string"),
    "response integer widened to number": (lambda d: task_out(d)["properties"]["fence"].update(type="number"),
                                           ".fence: may now be number"),
    "response may now be null": (
        lambda d: task_out(d)["properties"].update(id={"anyOf": [{"type": "string"}, {"type": "null"}]}),
        ".id: may now be null"),
    "response enum value removed": (lambda d: task_out(d)["properties"]["stage"].update(enum=["QUEUED"]),
                                    ".stage: enum value 'RUNNING' removed"),
    "response enum dropped": (lambda d: task_out(d)["properties"]["stage"].pop("enum"),
                              ".stage: no longer limited to"),
    "error response field removed": (
        lambda d: schemas(d)["ErrorOut"]["properties"]["error"]["properties"].pop("message"),
        ".error.message: response field removed"),
    "removed error code": (lambda d: d["x-error-codes"].remove("taken"), "error code 'taken' removed"),
    "new required request field": (
        lambda d: (renew_in(d).update(agent={"type": "string"}), schemas(d)["RenewIn"]["required"].append("agent")),
        "request body.agent: new required request field"),
    "request field became required": (lambda d: schemas(d)["RenewIn"]["required"].append("note"),
                                      "request body.note: request field now required"),
    "removed request field": (lambda d: renew_in(d).pop("note"), "request body.note: request field removed"),
    "request type changed": (lambda d: renew_in(d)["token"].update(type="integer"),
                             "request body.token: string is no longer accepted"),
    "request number narrowed to integer": (lambda d: renew_in(d)["ttl_seconds"].update(type="integer"),
                                           "request body.ttl_seconds: number is no longer accepted"),
    "request no longer nullable": (lambda d: renew_in(d).update(progress={"type": "number", "minimum": 0, "maximum": 1}),
                                   "request body.progress: null is no longer accepted"),
    "request any value typed": (lambda d: renew_in(d)["checkpoint"].update(type="object"),
                                "request body.checkpoint: any value is no longer accepted"),
    "maximum lowered": (lambda d: renew_in(d)["ttl_seconds"].update(maximum=3600),
                        "request body.ttl_seconds: maximum lowered from 86400 to 3600"),
    "maximum added": (lambda d: renew_in(d)["note"].update(maxLength=10), "request body.note: maxLength added to 10"),
    "minimum raised": (lambda d: renew_in(d)["ttl_seconds"].update(minimum=5),
                       "request body.ttl_seconds: minimum raised from 1 to 5"),
    "maxLength lowered": (lambda d: renew_in(d)["token"].update(maxLength=43),
                          "request body.token: maxLength lowered from 100 to 43"),
    "nested bound lowered": (lambda d: renew_in(d)["progress"]["anyOf"][0].update(maximum=0.5),
                             "request body.progress: maximum lowered from 1 to 0.5"),
    "pattern added": (lambda d: renew_in(d)["note"].update(pattern="^[a-z]+$"), "request body.note: pattern added"),
    "format added": (lambda d: renew_in(d)["note"].update(format="uuid"), "request body.note: format added"),
    "request enum value removed": (lambda d: renew_in(d)["mode"].update(enum=["soft"]),
                                   "request body.mode: enum value 'hard' removed"),
    "request enum added": (lambda d: renew_in(d)["note"].update(enum=["a", "b"]),
                           "request body.note: only ['a', 'b'] accepted now"),
    "query enum value removed": (lambda d: list_params(d)[1]["schema"]["items"].update(enum=["QUEUED"]),
                                 "query parameter stage[]: enum value 'RUNNING' removed"),
    "parameter maximum lowered": (lambda d: list_params(d)[0]["schema"].update(maximum=100),
                                  "query parameter limit: maximum lowered from 500 to 100"),
    "removed parameter": (lambda d: list_params(d).pop(0), "query parameter limit: removed"),
    "parameter became required": (lambda d: list_params(d)[0].update(required=True),
                                  "query parameter limit: now required"),
    "new required parameter": (
        lambda d: list_params(d).append({"in": "query", "name": "queue", "required": True, "schema": {"type": "string"}}),
        "query parameter queue: new required parameter"),
    "request body no longer taken": (lambda d: d["paths"][RENEW]["post"].pop("requestBody"),
                                     "request body no longer taken"),
    "request body became required": (
        lambda d: d["paths"]["/api/tasks"]["get"].update(requestBody={"required": True, **json_body({"type": "object"})}),
        "GET /api/tasks: request body now required"),
}


@pytest.mark.parametrize("kind", sorted(BREAKING))
def test_each_kind_of_breaking_change_is_named(kind):
    mutate, expected = BREAKING[kind]
    breaking, _ = changed(mutate)
    assert breaking, f"{kind}: not seen as breaking"
    assert all(expected in text for text in breaking), (kind, breaking)


def test_a_request_schema_that_starts_refusing_unknown_fields_is_breaking():
    old = copy.deepcopy(BASE)
    del schemas(old)["RenewIn"]["additionalProperties"]  # unknown fields were ignored
    changes = compare(old, BASE)
    assert changes.breaking == [f"POST {RENEW} request body: unknown request fields now refused"]


ADDITIVE = {
    "new path": (lambda d: d["paths"].update({"/api/check": {"get": {"responses": {}}}}), "/api/check: new path"),
    "new method": (lambda d: d["paths"]["/api/tasks"].update(post={"responses": {}}), "POST /api/tasks: new method"),
    "new optional request field": (lambda d: renew_in(d).update(reason={"type": "string"}),
                                   "request body.reason: new optional request field"),
    "new response field": (lambda d: task_out(d)["properties"].update(queue={"type": "string"}),
                           ".task.queue: new response field"),
    "new optional parameter": (
        lambda d: list_params(d).append({"in": "query", "name": "queue", "required": False, "schema": {"type": "string"}}),
        "query parameter queue: new optional parameter"),
    "new error code": (lambda d: d["x-error-codes"].append("too_many_waiters"), "new error code 'too_many_waiters'"),
    "new response enum value": (lambda d: task_out(d)["properties"]["stage"]["enum"].append("PAUSED"),
                                ".task.stage: new enum value 'PAUSED'"),
    "new request enum value": (lambda d: renew_in(d)["mode"]["enum"].append("gentle"),
                               "request body.mode: new enum value 'gentle'"),
    "maximum raised": (lambda d: renew_in(d)["ttl_seconds"].update(maximum=172800),
                       "request body.ttl_seconds: maximum raised or removed"),
    "minimum removed": (lambda d: renew_in(d)["ttl_seconds"].pop("minimum"),
                        "request body.ttl_seconds: minimum lowered or removed"),
    "request integer widened to number": (lambda d: list_params(d)[0]["schema"].update(type="number"),
                                          "query parameter limit: integer widened to number"),
    "request now nullable": (
        lambda d: renew_in(d).update(note={"anyOf": [{"type": "string"}, {"type": "null"}]}),
        "request body.note: now also accepts null"),
    "new error response": (lambda d: d["paths"][RENEW]["post"]["responses"].update({"413": json_body(ref("ErrorOut"))}),
                           "new response 413"),
    "response no longer null": (lambda d: task_out(d)["properties"].update(lease_expires_at={"type": "string"}), None),
    "path parameter renamed": (
        lambda d: d["paths"].update({"/api/tasks/{id}/renew": d["paths"].pop(RENEW)}), None),
}


@pytest.mark.parametrize("kind", sorted(ADDITIVE))
def test_each_kind_of_additive_change_is_not_breaking(kind):
    mutate, expected = ADDITIVE[kind]
    breaking, additive = changed(mutate)
    assert breaking == [], (kind, breaking)
    if expected is not None:
        assert any(expected in text for text in additive), (kind, additive)


def test_wording_is_neither_and_an_unchanged_document_has_no_changes():
    assert changed(lambda d: None) == ([], [])
    breaking, additive = changed(lambda d: (d["paths"]["/api/tasks"]["get"].update(summary="Every task"),
                                            d["info"].update(description="new words")))
    assert (breaking, additive) == ([], [])


def test_the_message_says_what_to_do():
    new = copy.deepcopy(BASE)
    renew_in(new).update(reason={"type": "string"})
    assert check_message(BASE, copy.deepcopy(BASE)) is None
    additive = check_message(BASE, new)
    assert "request body.reason: new optional request field" in additive and REGENERATE in additive
    breaking = check_message(new, BASE)
    assert "request body.reason: request field removed" in breaking
    assert "new version prefix" in breaking and REGENERATE not in breaking
    assert REGENERATE in check_message(None, BASE)


def test_union_alternatives_are_matched_by_shape_not_by_order():
    """POST /api/tasks answers one task or a batch: two objects. Each is compared with the
    alternative it is, whichever comes first."""
    def with_union(order):
        doc = copy.deepcopy(BASE)
        schemas(doc)["TaskBatchOut"] = {"type": "object", "required": ["items"],
                                        "properties": {"items": {"type": "array", "items": ref("TaskOut")}}}
        answer = {"anyOf": [ref(name) for name in order]}
        doc["paths"]["/api/tasks"]["post"] = {"responses": {"200": json_body(answer)}}
        return doc

    one_first = with_union(["TaskOut", "TaskBatchOut"])
    assert compare(one_first, with_union(["TaskBatchOut", "TaskOut"])).breaking == []
    assert compare(one_first, copy.deepcopy(one_first)).additive == []
    fewer = with_union(["TaskOut", "TaskBatchOut"])
    task_out(fewer)["properties"].pop("fence")
    assert compare(one_first, fewer).breaking == [
        "GET /api/tasks response 200.items[].fence: response field removed",
        "POST /api/tasks response 200.fence: response field removed",
        "POST /api/tasks response 200.items[].fence: response field removed",
        f"POST {RENEW} response 200.task.fence: response field removed",
    ]


def test_the_committed_schema_compared_with_itself_has_no_changes():
    committed = json.loads(SCHEMA_FILE.read_text())
    changes = compare(committed, copy.deepcopy(committed))
    assert (changes.breaking, changes.additive) == ([], [])


# -- the docs' groups --------------------------------------------------------------------------

API_TAGS = ("tasks", "leases", "notes", "approvals", "operators", "queues", "rate keys", "fairness keys", "resources",
            "schedules", "check", "webhooks", "bulk", "board at")


def test_every_operation_is_in_one_named_group_of_the_docs():
    """/api/docs groups operations by their tag: each has exactly one of the areas (none falls into
    Swagger's "default" group), every area is used, and the document describes each group once."""
    served = Client().get("/api/openapi.json").json()
    used = set()
    for path, operations in served["paths"].items():
        for method, operation in operations.items():
            tags = operation.get("tags")
            assert tags is not None and len(tags) == 1 and tags[0] in API_TAGS, (method, path, tags)
            used.add(tags[0])
    assert used == set(API_TAGS)
    assert [tag["name"] for tag in served["tags"]] == list(API_TAGS)
    assert all(tag["description"] for tag in served["tags"])
