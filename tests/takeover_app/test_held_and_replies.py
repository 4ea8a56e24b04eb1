"""Inbound while an operator owns the session (held: stored, no engine call, no bot reply); operator replies
through the session's channel (split as bot replies, at most once, resend, WhatsApp's 24-hour window)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from chatflow_agent.core.backend import StoredRow, parse_row
from sessions_app.models import ChatMessage, OperatorAction
from takeover_app import service
from takeover_app.models import OperatorReply, SessionMode
from tests.processes import REPO
from tests.sessions_app import personas
from tests.takeover_app.conftest import drain, texts, wa_message
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers
from tests.webhooks_app.test_endpoints import post_tg, post_wa
from webhooks_app import replies
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"


@pytest.fixture
def owned(client, env):
    """A WhatsApp session the bot answered once, then taken over by Olga."""
    wa_message(client, "wamid.first", "hello")
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    env.wa.requests.clear()
    return olga


def user_texts(session_id: str) -> list[str]:
    return [c for r, c in texts(session_id) if r == "user"]


def test_fifty_deliveries_and_twenty_duplicates_while_human_are_stored_in_order_and_never_answered(
        client, env, owned, settings):
    settings.CHATFLOW_MAX_TURNS = 100  # the store keeps the newest N turns; held turns are turns too
    for i in range(50):
        wa_message(client, f"wamid.h{i}", f"message {i}")
        if i % 2 == 1 and i < 40:  # 20 redeliveries of earlier ids, interleaved
            wa_message(client, f"wamid.h{i - 1}", f"message {i - 1}")
    assert InboundDelivery.objects.filter(provider_message_id__startswith="wamid.h").count() == 50
    drain(slots=4)
    assert user_texts(SID) == ["hello"] + [f"message {i}" for i in range(50)]
    assert [r for r, _c in texts(SID)][2:] == ["user"] * 50  # no model message after the takeover
    assert env.engine_calls() == ["hello"]  # the one bot turn before the takeover
    assert env.wa.requests == [] and env.tg.requests == []
    held = InboundDelivery.objects.filter(provider_message_id__startswith="wamid.h")
    assert set(held.values_list("status", "reply_status")) == {("done", "held")}
    assert sum(held.values_list("duplicates_suppressed", flat=True)) == 20
    assert SessionMode.objects.get(pk=SID).unread == 50


def test_a_telegram_message_while_waiting_is_held_too(client, env):
    post_tg(client, p.telegram(1, "hi"))
    drain()
    sid = ChatMessage.objects.values_list("session_id", flat=True).first()
    service.request_human(sid, "test", SessionMode.Trigger.OPERATOR)
    env.tg.requests.clear()
    post_tg(client, p.telegram(2, "anyone there?"))
    drain()
    assert user_texts(sid) == ["hi", "anyone there?"]
    assert env.tg.requests == [] and env.engine_calls() == ["hi"]
    assert InboundDelivery.objects.order_by("-id").first().reply_status == "held"


def test_an_image_to_a_session_an_operator_owns_is_held_like_a_text(client, env, owned):
    from sessions_app import runtime

    events: list = []
    runtime.site_runner().subscribe(events.append)
    image = {"from": SID, "id": "wamid.img", "type": "image",
             "image": {"id": "media1", "mime_type": "image/jpeg", "caption": "the box"}}
    assert post_wa(client, p.whatsapp(image)).status_code == 200
    drain()
    assert texts(SID)[2:] == [("user", "[image] the box")]  # no bot answer after it
    assert env.wa.requests == [] and env.engine_calls() == ["hello"]
    mode = SessionMode.objects.get(pk=SID)
    assert (mode.mode, mode.unread) == ("human", 1)
    delivery = InboundDelivery.objects.get(provider_message_id="wamid.img")
    assert (delivery.status, delivery.reply_status) == ("done", "held")
    done = [e for e in events if e.type == "turn_completed"]  # what the open pages are told
    assert [(e.session_id, e.response.held, e.response.content) for e in done] == [(SID, True, "")]


def test_a_voice_message_while_waiting_is_held_and_counted(client, env):
    post_tg(client, p.telegram(1, "hi"))
    drain()
    sid = ChatMessage.objects.values_list("session_id", flat=True).first()
    service.request_human(sid, "test", SessionMode.Trigger.OPERATOR)
    env.tg.requests.clear()
    post_tg(client, p.telegram(2, None, voice={"file_id": "v1", "duration": 3}))
    drain()
    assert user_texts(sid) == ["hi", "[voice message]"] and texts(sid)[-1] == ("user", "[voice message]")
    assert env.tg.requests == [] and SessionMode.objects.get(pk=sid).unread == 1


def test_an_operator_reply_reaches_whatsapp_once_split_as_a_bot_reply_and_is_stored_with_its_author(env, owned):
    text = "Olá 👋 " + "word " * 1200  # longer than one WhatsApp message
    reply = service.send_reply(owned, SID, text)
    assert (reply.status, reply.attempts, reply.provider) == ("sent", 1, "whatsapp")
    expected = [replies.split_message(part) for part in [text.strip()]][0]
    assert len(expected) == 2
    assert [b["text"]["body"] for b in env.wa.bodies()] == expected
    assert {r["path"] for r in env.wa.requests} == {f"/{p.PHONE_NUMBER_ID}/messages"}
    assert {b["to"] for b in env.wa.bodies()} == {"15550100"}
    row = ChatMessage.objects.get(pk=reply.message_row_id)
    assert (row.role, row.content) == ("model", text.strip())
    assert json.loads(row.message_json)["author"] == "olga.operator"
    assert parse_row(StoredRow(row.id, row.role, row.content, row.message_json)).author == "olga.operator"
    assert OperatorAction.objects.filter(action="operator_reply").count() == 1
    assert env.engine_calls() == ["hello"]


def test_the_reply_view_sends_and_returns_the_panel_with_sent(env, owned):
    c = personas.client_for(owned)
    r = c.post(f"/actions/reply/{SID}/", {"text": "Hi, Olga here."}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and b"Hi, Olga here." in r.content and b"sent" in r.content
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["Hi, Olga here."]


def test_a_failed_send_is_recorded_and_can_be_resent_once(env, owned):
    env.wa.fail_status = 500
    reply = service.send_reply(owned, SID, "Your refund is on its way.")
    assert reply.status == "failed" and "500" in reply.error and reply.resendable
    env.wa.fail_status = None
    c = personas.client_for(owned)
    r = c.post(f"/actions/reply-resend/{reply.pk}/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    reply.refresh_from_db()
    assert (reply.status, reply.attempts) == ("sent", 2)
    assert c.post(f"/actions/reply-resend/{reply.pk}/", HTTP_HX_REQUEST="true").status_code == 400  # sent
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["Your refund is on its way."] * 2
    assert ChatMessage.objects.filter(content="Your refund is on its way.").count() == 1  # one stored message


def test_a_reply_more_than_24_hours_after_the_customers_last_message_is_refused(env, owned):
    ChatMessage.objects.filter(session_id=SID, role="user").update(created_at=timezone.now() - timedelta(hours=25))
    r = personas.client_for(owned).post(f"/actions/reply/{SID}/", {"text": "Still there?"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and b"24 hours" in r.content
    assert env.wa.requests == [] and not OperatorReply.objects.exists()
    assert not ChatMessage.objects.filter(content="Still there?").exists()
    ChatMessage.objects.filter(session_id=SID, role="user").update(created_at=timezone.now() - timedelta(hours=23))
    assert service.send_reply(owned, SID, "Still there?").status == "sent"


def test_a_reply_needs_the_session_taken_over(env, client):
    wa_message(client, "wamid.first", "hello")
    drain()
    r = personas.client_for(personas.operator()).post(f"/actions/reply/{SID}/", {"text": "hi"},
                                                      HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and b"Take the session over" in r.content


@pytest.mark.slow
def test_a_sender_killed_during_the_send_never_sends_twice(env, owned, tmp_path):
    env.wa.hold = threading.Event()  # the fake API records the POST, then does not answer
    env.wa.arrived.clear()
    child_env = servers.child_env(env.wa.base, env.tg.base, tmp_path)
    code = ("from django.contrib.auth.models import User; from takeover_app import service; "
            f"service.send_reply(User.objects.get(username='olga.operator'), {SID!r}, 'Sent once')")
    proc = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO, env=child_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert env.wa.arrived.wait(60), "the child never sent"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        env.wa.hold.set()
        if proc.poll() is None:
            proc.kill()
    reply = OperatorReply.objects.get()
    assert reply.status == "sending" and not reply.unknown  # its sender may still be sending, for all we know
    OperatorReply.objects.filter(pk=reply.pk).update(
        attempted_at=timezone.now() - timedelta(seconds=OperatorReply.SEND_DEADLINE + 1))
    reply.refresh_from_db()
    assert reply.shown_status == "unknown" and reply.resendable
    drain()  # nothing in the site sends it again by itself
    service.idle_sweep()
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["Sent once"]
    env.wa.hold = None
    assert service.resend(owned, reply.pk).status == "sent"  # only an operator's resend sends it again
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["Sent once", "Sent once"]


def test_a_send_never_outlasts_the_time_after_which_it_could_be_resent(env, owned, monkeypatch):
    # A reply still ``sending`` after SEND_DEADLINE counts as its sender's crash and may be resent: a live
    # sender stops at half of it, so a resend can never overlap the first send.
    monkeypatch.setattr(OperatorReply, "SEND_DEADLINE", 2.0)
    env.wa.hold = threading.Event()  # the fake API records the POST, then does not answer
    try:
        reply = service.send_reply(owned, SID, "Are you still there?")
    finally:
        env.wa.hold.set()
    assert reply.status == "failed" and "TimeoutError" in reply.error and reply.resendable
    env.wa.hold = None
    assert service.resend(owned, reply.pk).status == "sent"
    reply.refresh_from_db()
    assert (reply.status, reply.attempts, reply.error) == ("sent", 2, "")


def test_a_reply_on_a_generic_webhook_session_says_it_is_only_in_the_transcript(client, env):
    from tests.webhooks_app.test_endpoints import post_generic
    from tests.webhooks_app.test_worker import drain

    assert post_generic(client, p.generic("crm-1", "c-1", "hello")).status_code == 202
    assert drain() == 1
    olga = personas.operator()
    service.take_over(olga, "crm-1")
    c = personas.client_for(olga)
    page = c.get("/sessions/crm-1/").content.decode()
    assert "the generic channel sends nothing out" in page and "through the customer's channel" not in page
    r = c.post("/actions/reply/crm-1/", {"text": "Olga here."}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "Reply in the transcript (the channel sends nothing out)." in r.content.decode()
    assert 'data-delivery="in_transcript">in the transcript' in c.get("/sessions/crm-1/").content.decode()
    reply = OperatorReply.objects.get()
    assert (reply.provider, reply.status, reply.shown_status) == ("generic", "sent", "in_transcript")
    assert env.wa.requests == [] and env.tg.requests == []
    assert texts("crm-1")[-1] == ("model", "Olga here.")
