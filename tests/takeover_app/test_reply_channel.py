"""Where an operator's reply goes is decided by how the session arrived (the webhook delivery whose turn
last reached it), never by the ``channel`` its metadata names: a generic webhook's label, the demo's
``web`` sessions and sessions no webhook delivered to send nothing out, and say so."""

from __future__ import annotations

import pytest

from sessions_app import registry
from sessions_app.actions import site_store
from sessions_app.models import ChatSession
from takeover_app import service
from takeover_app.models import OperatorReply
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.takeover_app.conftest import drain, texts, wa_message
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_generic
from webhooks_app.taskqueue import MARKER_KEY

pytestmark = pytest.mark.django_db(transaction=True)

TRANSCRIPT_ONLY = "Reply in the transcript (the channel sends nothing out)."
SENT_OUT = "Sent as you, through the customer's channel."


def generic_session(client, session_id: str, **metadata) -> None:
    assert post_generic(client, p.generic(session_id, f"{session_id}-m1", "hello", **metadata)).status_code == 202
    drain()
    assert texts(session_id)[0] == ("user", "hello")


def reply_as_owner(session_id: str, text: str) -> tuple[str, str, OperatorReply]:
    """(the session page before the reply, the reply's answer, the reply) for an operator who took it over."""
    olga = personas.operator()
    service.take_over(olga, session_id)
    c = personas.client_for(olga)
    page = c.get(f"/sessions/{session_id}/").content.decode()
    answer = c.post(f"/actions/reply/{session_id}/", {"text": text}, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    return page, answer.content.decode(), OperatorReply.objects.get(session_id=session_id, text=text)


def test_a_generic_session_labelled_web_keeps_the_reply_in_the_transcript(client, env):
    generic_session(client, "crm-web-1", channel="web")
    page, answer, reply = reply_as_owner("crm-web-1", "Olga here.")
    assert "Reply to the customer on generic" in page
    assert "the generic channel sends nothing out" in page and SENT_OUT not in page
    assert TRANSCRIPT_ONLY in answer
    assert (reply.provider, reply.shown_status) == ("generic", "in_transcript")
    assert texts("crm-web-1")[-1] == ("model", "Olga here.")


def test_a_generic_session_labelled_whatsapp_sends_nothing_to_whatsapp(client, env):
    generic_session(client, "crm-wa-1", channel="whatsapp", wa_id="15550100", phone_number_id=p.PHONE_NUMBER_ID)
    env.wa.requests.clear()
    page, answer, reply = reply_as_owner("crm-wa-1", "Olga here.")
    assert env.wa.requests == [] and env.tg.requests == []
    assert SENT_OUT not in page and TRANSCRIPT_ONLY in answer
    assert (reply.provider, reply.shown_status) == ("generic", "in_transcript")


@pytest.mark.parametrize("metadata", [{"channel": "web", "demo": True},
                                      {"channel": "whatsapp", "wa_id": "15550100", "phone_number_id": "1098"}])
def test_a_session_no_webhook_delivered_to_keeps_the_reply_in_the_transcript(client, env, metadata):
    cv.store("web-demo-1", [cv.user("hi"), cv.model("hello")], metadata=metadata)
    page, answer, reply = reply_as_owner("web-demo-1", "Olga here.")
    assert env.wa.requests == [] and env.tg.requests == []
    assert "no webhook delivered this session's messages, so nothing is sent out" in page
    assert SENT_OUT not in page and "Reply to the customer on" not in page
    assert TRANSCRIPT_ONLY in answer and (reply.provider, reply.shown_status) == ("", "in_transcript")


def test_a_marker_copied_into_another_session_names_no_delivery(client, env):
    wa_message(client, "wamid.first", "hello")
    drain()
    marker = ChatSession.objects.get(pk="15550100").metadata[MARKER_KEY]
    cv.store("copied-1", [cv.user("hi"), cv.model("hello")], metadata={"channel": "web", MARKER_KEY: marker})
    env.wa.requests.clear()
    _page, answer, reply = reply_as_owner("copied-1", "Olga here.")
    assert env.wa.requests == [] and TRANSCRIPT_ONLY in answer and reply.provider == ""


def test_a_whatsapp_session_sends_to_whom_its_customer_wrote_from(client, env):
    wa_message(client, "wamid.first", "hello")
    drain()
    # A label written later (through the store, as any writer would) changes nothing: the delivery says
    # where the customer is.
    with site_store().sync_turn("15550100", registry.starting_agent()) as session:
        session.metadata.update({"channel": "web", "wa_id": "15559999"})
    assert ChatSession.objects.get(pk="15550100").metadata["channel"] == "web"
    env.wa.requests.clear()
    page, _answer, reply = reply_as_owner("15550100", "Olga here.")
    assert "Reply to the customer on whatsapp" in page and SENT_OUT in page
    assert (reply.provider, reply.shown_status) == ("whatsapp", "sent")
    assert [(b["to"], b["text"]["body"]) for b in env.wa.bodies()] == [("15550100", "Olga here.")]


def test_a_generic_message_on_a_whatsapp_session_leaves_the_replies_on_whatsapp(client, env):
    wa_message(client, "wamid.first", "hello")
    drain()
    # A signed generic message on the same session (a CRM writing into the conversation) arrives after it.
    assert post_generic(client, p.generic("15550100", "crm-1", "note from the CRM")).status_code == 202
    drain()
    assert texts("15550100")[-2] == ("user", "note from the CRM")
    env.wa.requests.clear()
    page, answer, reply = reply_as_owner("15550100", "Olga here.")
    assert "Reply to the customer on whatsapp" in page and SENT_OUT in page and TRANSCRIPT_ONLY not in answer
    assert (reply.provider, reply.shown_status) == ("whatsapp", "sent")
    assert [(b["to"], b["text"]["body"]) for b in env.wa.bodies()] == [("15550100", "Olga here.")]

