"""Approval gates' reads on MongoDB (issue 32, item 2), through the API with Django's test client:
the list by state and by queue (a filter through the task, which MongoDB answers with a
$lookup), a scoped key's view, a task's approvals, and the partial index of the tasks awaiting an
answer. The moves themselves, with the 16-answerer race, are in the contract suite
(tests/mongodb/test_contract_mongodb.py)."""
import json

import pytest
from django.db import connections
from django.test import Client

from board import agent_keys
from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import Task

pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]


def ask(task_id: str, queue: str) -> None:
    transitions.create(TaskSpec(id=task_id, title=task_id, queue=queue), actor="test")
    held = transitions.claim(task_id, "agent-1", 60)
    transitions.request_approval(task_id, held.lease.token, f"may {task_id} go?")


def get(path: str, key: str) -> dict:
    response = Client().get(f"/api{path}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def test_the_lists_by_state_queue_and_scope():
    ask("ci-1", "ci")
    ask("docs-1", "docs")
    transitions.answer("docs-1", False, actor="op", comment="not now")
    _, key = agent_keys.create_key("reader")
    _, scoped = agent_keys.create_key("ci-reader", queues="ci")
    assert [a["task"] for a in get("/approvals", key)["items"]] == ["ci-1"]
    assert [(a["task"], a["state"]) for a in get("/approvals?state=answered", key)["items"]] == [("docs-1", "rejected")]
    assert [a["task"] for a in get("/approvals?state=all&queue=docs", key)["items"]] == ["docs-1"]
    assert [a["task"] for a in get("/approvals?state=all", scoped)["items"]] == ["ci-1"]
    assert [a["comment"] for a in get("/tasks/docs-1/approvals", key)["items"]] == ["not now"]
    assert Task.objects.get(pk="ci-1").awaiting_approval is True


def test_the_tasks_awaiting_an_answer_have_a_partial_index():
    connection = connections["default"]
    connection.ensure_connection()
    indexes = connection.database[Task._meta.db_table].index_information()
    [index] = [i for i in indexes.values() if i["key"] == [("awaiting_approval", 1)]]
    assert index["partialFilterExpression"] == {"awaiting_approval": {"$eq": True}}
