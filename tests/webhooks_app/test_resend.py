"""Replies that may not have reached the customer: shown as "reply unknown" (or failed) in the ledger and on the
cross-session list, and resent by an operator (audited, live, at most one send per click)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers, get_channel_layer
from django.db import connections
from django.utils import timezone

from sessions_app.live import group_for_session
from sessions_app.models import ChatSession, OperatorAction
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_tg, post_wa
from tests.webhooks_app.test_worker import apis, drain  # noqa: F401 - apis is a fixture
from webhooks_app import replies, taskqueue
from webhooks_app.models import InboundDelivery
from webhooks_app.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

Reply = InboundDelivery.Reply


def died_while_sending(client, post, body: bytes, answer: str) -> InboundDelivery:
    """A delivery whose worker recorded ``reply_status=sending`` and was killed before the send: its lease
    has expired and no worker has claimed it again yet."""
    post(client, body)
    dead = Worker(slots=1)
    d = taskqueue.claim_next(dead.owner, 30)
    assert taskqueue.finish(d, dead.owner, answer, Reply.SENDING)
    InboundDelivery.objects.filter(pk=d.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    ChatSession.objects.get_or_create(pk=d.session_id, defaults={"active_agent_name": "Echo"})
    d.refresh_from_db()
    return d


def resend(who, d: InboundDelivery, data: dict | None = None, **extra):
    return who.post(f"/webhooks/deliveries/{d.pk}/resend/", data or {}, **extra)


@contextmanager
def click_while_held(wa, d: InboundDelivery) -> Iterator[list]:
    """Inside: another operator's Resend of ``d`` is under way, its send held by the fake provider; the
    list gets that click's response once the block ends (the send is then let through)."""
    wa.hold = threading.Event()
    first: list = []
    other = personas.client_for(personas.operator("first.operator"))

    def click() -> None:
        try:
            first.append(resend(other, d))
        finally:
            connections.close_all()

    thread = threading.Thread(target=click)
    thread.start()
    try:
        assert wa.arrived.wait(20)  # the first resend is sending now
        yield first
    finally:
        wa.hold.set()
        thread.join(20)


def test_a_reply_left_sending_by_a_dead_worker_is_unknown_and_an_operator_resends_it(client, apis):  # noqa: F811
    wa, _ = apis
    d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.R", "where is it")), "It ships today.")
    operator = personas.client_for(personas.operator())
    page = operator.get(f"/sessions/{d.session_id}/").content.decode()
    assert "Reply unknown" in page and ">Resend</button>" in page
    listing = operator.get("/webhooks/attention/")
    assert listing.status_code == 200
    html = listing.content.decode()
    assert f'id="delivery-{d.pk}"' in html and "Reply unknown" in html and ">Resend</button>" in html
    assert f'href="/sessions/{d.session_id}/"' in html
    assert 'href="/webhooks/attention/"' in operator.get("/audit/").content.decode()  # in the console's nav

    r = resend(operator, d, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and b"was sent again" in r.content and b"Reply unknown" not in r.content
    assert [b["text"]["body"] for b in wa.bodies()] == ["It ships today."]
    assert wa.requests[0]["path"] == f"/{p.PHONE_NUMBER_ID}/messages"
    d.refresh_from_db()
    assert (d.status, d.reply_status, d.reply_error) == ("done", "sent", "")
    audit = OperatorAction.objects.get(action="resend_reply")
    assert (audit.actor_username, audit.session_id) == ("olga.operator", d.session_id)
    assert audit.before["reply_status"] == "unknown" and audit.before["provider_message_id"] == "wamid.R"

    assert resend(operator, d).status_code == 409  # sent: nothing to resend
    drain()  # no worker sends it again
    assert len(wa.bodies()) == 1
    assert f'id="delivery-{d.pk}"' not in operator.get("/webhooks/attention/").content.decode()


def test_a_reply_the_reclaiming_worker_gave_up_on_is_resent_split_like_the_first(client, apis):  # noqa: F811
    _, tg = apis
    answer = "first line\n" + "y" * 5000
    d = died_while_sending(client, post_tg, p.telegram(31, "long please"), answer)
    drain()  # the worker that claims it again never sends twice: done, reply unknown
    d.refresh_from_db()
    assert (d.status, d.reply_status) == ("done", "sending") and tg.bodies() == []
    operator = personas.client_for(personas.operator())
    assert "Reply unknown" in operator.get("/webhooks/attention/").content.decode()
    r = resend(operator, d, {"next": "/webhooks/attention/"})
    assert r.status_code == 302 and r["Location"] == "/webhooks/attention/"
    sent = tg.bodies()
    assert len(sent) == 2 and all(replies.utf16_len(b["text"]) <= replies.LIMIT for b in sent)
    assert "".join(b["text"] for b in sent).replace("\n", "") == answer.replace("\n", "")
    assert {b["chat_id"] for b in sent} == {998877}
    d.refresh_from_db()
    assert d.reply_status == "sent"


def test_a_failed_send_can_be_resent_and_a_failing_resend_is_recorded(client, apis):  # noqa: F811
    wa, _ = apis
    wa.fail_status = 500
    post_wa(client, p.whatsapp(p.wa_text("wamid.X", "hello")))
    drain()
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status) == ("done", "failed")
    operator = personas.client_for(personas.operator())
    r = resend(operator, d, HTTP_HX_REQUEST="true")  # the provider still fails
    assert r.status_code == 200 and b"failed" in r.content
    d.refresh_from_db()
    assert (d.status, d.reply_status) == ("done", "failed") and "500" in d.reply_error
    wa.fail_status = None
    r = resend(operator, d)
    assert r.status_code == 302 and r["Location"] == f"/sessions/{d.session_id}/"
    d.refresh_from_db()
    assert d.reply_status == "sent"
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: hello"] * 3  # first try, failing resend, resend
    assert OperatorAction.objects.filter(action="resend_reply").count() == 2


def test_two_concurrent_resends_send_once_and_the_second_gets_409(client, apis):  # noqa: F811
    wa, _ = apis
    d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.C2", "hi")), "Hello!")
    with click_while_held(wa, d) as first:
        second = resend(personas.client_for(personas.operator()), d)
        assert second.status_code == 409 and second.json()["error"] == "resend_refused"
    assert first and first[0].status_code == 302
    assert [b["text"]["body"] for b in wa.bodies()] == ["Hello!"]
    assert OperatorAction.objects.filter(action="resend_reply").count() == 1


def test_resend_needs_a_permitted_staff_user_and_csrf(client, apis):  # noqa: F811
    wa, _ = apis
    d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.P", "hi")), "Hello!")
    viewer, operator = personas.viewer(), personas.operator()
    assert resend(personas.client_for(None), d).status_code == 302  # to the login page
    assert resend(personas.client_for(viewer), d).status_code == 403
    assert resend(personas.client_for(personas.outsider()), d).status_code == 403
    assert resend(personas.client_for(operator, csrf=True), d).status_code == 403
    assert b">Resend</button>" not in personas.client_for(viewer).get("/webhooks/attention/").content
    assert personas.client_for(operator).get(f"/webhooks/deliveries/{d.pk}/resend/").status_code == 405
    assert wa.bodies() == [] and not OperatorAction.objects.exists()
    assert resend(personas.client_for(operator), d).status_code == 302
    assert len(wa.bodies()) == 1


def test_a_resend_is_broadcast_live_to_the_session(client, apis):  # noqa: F811
    channel_layers.backends.clear()
    try:
        d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.L", "hi")), "Hello!")
        layer = get_channel_layer()
        channel = async_to_sync(layer.new_channel)()
        async_to_sync(layer.group_add)(group_for_session(d.session_id), channel)
        resend(personas.client_for(personas.operator()), d)
        message = async_to_sync(asyncio.wait_for)(layer.receive(channel), 10)  # a hang guard
        assert message["type"] == "live.action"
        assert (message["action"]["kind"], message["action"]["actor"]) == ("resend_reply", "olga.operator")
    finally:
        channel_layers.backends.clear()


def test_a_reply_being_sent_by_a_live_worker_is_not_unknown(client, apis):  # noqa: F811
    post_wa(client, p.whatsapp(p.wa_text("wamid.S", "hi")))
    alive = Worker(slots=1)
    d = taskqueue.claim_next(alive.owner, 30)
    taskqueue.finish(d, alive.owner, "Hello!", Reply.SENDING)  # its lease is live: the send is in progress
    ChatSession.objects.get_or_create(pk=d.session_id, defaults={"active_agent_name": "Echo"})
    operator = personas.client_for(personas.operator())
    assert f'id="delivery-{d.pk}"' not in operator.get("/webhooks/attention/").content.decode()
    assert resend(operator, d).status_code == 409


def test_a_deleted_sessions_unknown_reply_is_settled_and_cannot_be_resent(client, apis):  # noqa: F811
    wa, _ = apis
    d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.D", "hi")), "Hello!")
    operator = personas.client_for(personas.operator())
    assert operator.post(f"/actions/delete/{d.session_id}/").status_code == 302
    d.refresh_from_db()
    assert (d.reply_status, d.answer) == (Reply.NONE, "")
    assert f'id="delivery-{d.pk}"' not in operator.get("/webhooks/attention/").content.decode()
    assert resend(operator, d).status_code == 409
    assert wa.bodies() == [] and not OperatorAction.objects.filter(action="resend_reply").exists()


def test_resend_is_its_own_permission(client, apis):  # noqa: F811
    from django.contrib.auth.models import Permission

    wa, _ = apis
    d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.Q", "hi")), "Hello!")
    retrier = personas.viewer("rita.retrier")
    retrier.user_permissions.add(Permission.objects.get(codename="retry_delivery"))
    assert b">Resend</button>" not in personas.client_for(retrier).get("/webhooks/attention/").content
    assert resend(personas.client_for(retrier), d).status_code == 403
    retrier.user_permissions.add(Permission.objects.get(codename="resend_reply"))
    assert resend(personas.client_for(retrier), d).status_code == 302
    assert len(wa.bodies()) == 1


def test_a_resend_that_outlasts_its_lease_keeps_it_until_the_send_ends(client, apis, settings):  # noqa: F811
    """While a slow send goes out, its lease is renewed: the reply never looks unknown, so no second click
    (and no worker) can take it."""
    settings.CHATFLOW_LEASE_SECONDS = 1
    wa, _ = apis
    d = died_while_sending(client, post_wa, p.whatsapp(p.wa_text("wamid.S", "hi")), "Hello!")
    with click_while_held(wa, d) as first:
        deadline = timezone.now() + timedelta(seconds=3)  # three leases' worth
        second_operator = personas.client_for(personas.operator())
        while timezone.now() < deadline:
            assert resend(second_operator, d).status_code == 409
            assert f'id="delivery-{d.pk}"' not in second_operator.get("/webhooks/attention/").content.decode()
    assert first and first[0].status_code == 302
    d.refresh_from_db()
    assert d.reply_status == Reply.SENT and [b["text"]["body"] for b in wa.bodies()] == ["Hello!"]
