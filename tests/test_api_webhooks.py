"""Webhooks over the API (issue 33, item 6): `POST /api/webhooks` (the secret answered once),
`GET /api/webhooks`, `GET` / `DELETE /api/webhooks/{id}`, `POST /api/webhooks/{id}/test`; who may;
bad input refused 422 with nothing written; and the admin's pages (the delivery log, never the
secret). The outbox, the retries and the SSRF rule: tests/test_webhooks.py."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.forms.models import model_to_dict
from django.test import Client

from board.engine import clock
from board.models import Webhook, WebhookDelivery
from board.webhooks import outbox, sending
from tests.support import db_state, sqlite_db_mark
from tests.test_admin import client_for, make_user
from tests.test_api import API, assert_error, auth, get, http, operator, post, used_key  # noqa: F401
from tests.test_webhooks import deliveries, fail_task, loopback_allowed, receivers, subscribe  # noqa: F401

pytestmark = sqlite_db_mark()


# ---------------------------------------------------------------------------------------------
# The API


BODY = {"url": "https://hooks.example.com/taskflow", "events": ["task.failed", "check.problem"]}


def everything() -> tuple:
    return (db_state(), [model_to_dict(w) for w in Webhook.objects.order_by("pk")],
            list(WebhookDelivery.objects.order_by("pk").values()))


def test_an_operator_creates_a_webhook_and_gets_its_secret_once(http, operator):
    made = post(http, "/webhooks", {**BODY, "filter": {"queue": "ci-*", "tags": ["urgent"]}}, operator)
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["secret"].startswith("whsec_") and len(body["secret"]) > 40
    assert (body["url"], body["events"], body["filter"], body["format"], body["active"], body["created_by"]) == (
        BODY["url"], BODY["events"], {"queue": "ci-*", "tags": ["urgent"]}, "json", True, "operator-1")
    assert Webhook.objects.get().secret == body["secret"]
    listed = get(http, "/webhooks", operator).json()["items"]
    one = get(http, f"/webhooks/{body['id']}", operator).json()
    assert "secret" not in listed[0] and "secret" not in one and body["secret"] not in json.dumps([listed, one])
    assert one["deliveries"] == []
    queued = post(http, f"/webhooks/{body['id']}/test", {}, operator)
    assert queued.status_code == 202 and queued.json()["event"] == "webhook.test"
    assert [d["event"] for d in get(http, f"/webhooks/{body['id']}", operator).json()["deliveries"]] == ["webhook.test"]
    assert http.delete(f"{API}/webhooks/{body['id']}", **auth(operator)).status_code == 204
    assert (Webhook.objects.count(), WebhookDelivery.objects.count()) == (0, 0)
    assert_error(get(http, f"/webhooks/{body['id']}", operator), 404, "not_found")


def test_the_test_delivery_reaches_the_receiver(http, operator, receivers, loopback_allowed):
    receiver = receivers()
    made = post(http, "/webhooks", {"url": receiver.url(), "events": ["task.failed"]}, operator).json()
    receiver.secret = made["secret"]
    post(http, f"/webhooks/{made['id']}/test", {}, operator)
    sending.deliver()
    [request] = receiver.accepted
    assert request.json["event"] == "webhook.test" and receiver.bad_signatures == 0


@pytest.mark.parametrize("body, field", [
    ({**BODY, "url": "ftp://hooks.example.com/x"}, "url"),
    ({**BODY, "url": "file:///etc/passwd"}, "url"),
    ({**BODY, "url": "https://" + "a" * 2000 + ".example.com/"}, "url"),
    ({**BODY, "url": "http://127.0.0.1:8000/hook"}, "url"),
    ({**BODY, "url": "http://localhost/hook"}, "url"),
    ({**BODY, "url": "http://169.254.169.254/latest/meta-data/"}, "url"),
    ({**BODY, "url": "http://[::1]/"}, "url"),
    ({**BODY, "url": "https://hooks.example.com/a b"}, "url"),
    ({**BODY, "url": "https:///no-host"}, "url"),
    ({**BODY, "events": []}, "events"),
    ({**BODY, "events": ["task.exploded"]}, "events"),
    ({**BODY, "events": "task.failed"}, "events"),
    ({**BODY, "format": "xml"}, "format"),
    ({**BODY, "filter": {"queue": "bad queue!"}}, "filter"),
    ({**BODY, "filter": {"tags": ["no spaces allowed"]}}, "filter"),
    ({**BODY, "filter": {"owner": "x"}}, "filter"),
    ({**BODY, "secret": "mine"}, "secret"),
    ({"events": ["task.failed"]}, "url"),
])
def test_bad_input_is_422_and_writes_nothing(http, operator, body, field):
    before = everything()
    error = assert_error(post(http, "/webhooks", body, operator), 422, "validation_error")
    assert field in json.dumps(error), error
    assert everything() == before


def test_who_may_manage_webhooks(http, operator):
    before = everything()
    assert_error(post(http, "/webhooks", BODY, used_key("plain-agent")), 403, "forbidden")
    scoped = post(http, "/webhooks", BODY, _scoped_operator())
    assert "not limited to some queues" in assert_error(scoped, 403, "forbidden")["message"]
    assert_error(get(http, "/webhooks", used_key("reader")), 403, "forbidden")
    assert_error(post(http, "/webhooks", BODY), 401, "unauthorized")
    watcher = client_for(make_user("watcher", ["board.view_task", "board.view_webhook"]))
    assert_error(_session_post(watcher, BODY), 403, "forbidden")
    assert everything() == before
    assert watcher.get(f"{API}/webhooks").status_code == 200
    maker = client_for(make_user("maker", ["board.add_webhook"]), enforce_csrf_checks=False)
    made = _session_post(maker, BODY)
    assert made.status_code == 201 and made.json()["created_by"] == "maker"
    assert_error(watcher.delete(f"{API}/webhooks/{made.json()['id']}"), 403, "forbidden")
    assert maker.delete(f"{API}/webhooks/{made.json()['id']}").status_code == 204


def _scoped_operator() -> str:
    from board import agent_keys

    _, key = agent_keys.create_key("scoped-op", is_operator=True, queues="ci-*")
    return key


def _session_post(client: Client, body):
    return client.post(f"{API}/webhooks", json.dumps(body), content_type="application/json")


# ---------------------------------------------------------------------------------------------
# The admin: the webhook's page shows its delivery log, never its secret


def test_the_admin_shows_the_delivery_log_and_never_the_secret(receivers, loopback_allowed):
    receiver = receivers(fail_first=1)
    webhook = subscribe(receiver)
    fail_task("t1")
    sending.deliver()
    sending.send_due(now=clock.now() + timedelta(hours=1))
    staff = client_for(make_user("watcher", ["board.view_webhook"]))
    listing = staff.get("/admin/board/webhook/")
    assert listing.status_code == 200 and receiver.url() in listing.content.decode()
    page = staff.get(f"/admin/board/webhook/{webhook.pk}/change/").content.decode()
    assert 'id="delivery-log"' in page and "✓ delivered" in page and "task.failed" in page
    for path in ("/admin/board/webhook/", f"/admin/board/webhook/{webhook.pk}/change/", "/admin/board/webhookdelivery/",
                 f"/admin/board/webhookdelivery/{deliveries()[0].pk}/change/"):
        assert receiver.secret not in staff.get(path).content.decode(), path
    outsider = client_for(make_user("outsider", ["board.view_task"]))
    assert outsider.get("/admin/board/webhook/").status_code == 403
    assert User.objects.filter(username="outsider").exists()



def test_a_webhook_made_in_the_admin_shows_its_secret_once_and_a_refusal_writes_nothing(receivers, loopback_allowed):
    receiver = receivers()
    maker = client_for(make_user("maker", ["board.add_webhook"]))
    form = {"url": receiver.url(), "event_list": ["task.failed", "approval.requested"], "filter_queue": "ci-*",
            "filter_tags": "", "format": "json", "_save": "Save"}
    before = everything()
    for bad in ({"url": "ftp://example.com/hook"}, {"event_list": []}, {"filter_queue": "not a pattern!"},
                {"filter_tags": "urgent, no spaces"}):
        page = maker.post("/admin/board/webhook/add/", {**form, **bad})
        assert page.status_code == 200 and "errorlist" in page.content.decode(), bad
    assert everything() == before
    made = maker.post("/admin/board/webhook/add/", form)
    assert made.status_code == 200, made.content[:500]
    webhook = Webhook.objects.get()
    assert (webhook.url, webhook.events, webhook.filter, webhook.created_by) == (
        receiver.url(), ["task.failed", "approval.requested"], {"queue": "ci-*"}, "maker")
    assert webhook.secret in made.content.decode() and made["Cache-Control"].startswith("max-age=0")
    # Shown once: its page, the list and the add form never show it again.
    for path in ("/admin/board/webhook/", f"/admin/board/webhook/{webhook.pk}/change/", "/admin/board/webhook/add/"):
        assert webhook.secret not in maker.get(path).content.decode(), path
    # It works: a failure is delivered, signed with that secret.
    receiver.secret = webhook.secret
    fail_task("t1", queue="ci-1")
    sending.deliver()
    assert [r.json["event"] for r in receiver.accepted] == ["task.failed"] and receiver.bad_signatures == 0
    watcher = client_for(make_user("watcher", ["board.view_webhook"]))
    assert watcher.get("/admin/board/webhook/add/").status_code == 403
    assert watcher.post("/admin/board/webhook/add/", form).status_code == 403
    assert Webhook.objects.count() == 1


def test_switching_a_webhook_off_in_the_admin_keeps_the_cursor_the_pass_moved(receivers, loopback_allowed):
    """The change form writes `active` alone: a whole-row save would put back the cursor read when
    the page opened, and the pass would collect those events again."""
    webhook = subscribe(receivers())
    staff = client_for(make_user("maker", ["board.add_webhook"]))
    page = f"/admin/board/webhook/{webhook.pk}/change/"
    assert staff.get(page).status_code == 200
    fail_task("t1")
    outbox.collect()  # meanwhile
    moved = Webhook.objects.get().cursor
    assert staff.post(page, {"_save": "Save"}).status_code == 302  # the box unticked: off
    row = Webhook.objects.get()
    assert (row.active, row.cursor) == (False, moved)
    assert len(deliveries()) == 1
    watcher = client_for(make_user("watcher", ["board.view_webhook"]))
    assert watcher.post(page, {"active": "on", "_save": "Save"}).status_code == 403
    assert Webhook.objects.get().active is False
