"""The live chat page and ``chatflow_chat`` never write into a customer's session as the customer: a session a
webhook delivers to (generic included, whatever its metadata's ``channel`` says) is read only there, and its
console page offers the takeover instead of the live chat."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from sessions_app.models import ChatMessage, OperatorAction
from takeover_app.models import SessionMode
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixtures)
    close_consumer_connections,
    connected,
    cookie_for,
    db,
    frames_until,
    fresh_channel_layer,
)
from tests.takeover_app.conftest import drain, texts
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_generic

pytestmark = pytest.mark.django_db(transaction=True)

GENERIC_REFUSAL = "Read only: a customer writes to this session through the generic webhook."


@pytest.fixture
def crm_session(client, env):
    """A generic webhook's session whose integration labels it ``web``, answered once by the bot."""
    body = p.generic("crm-1", "crm-1-m1", "hello", channel="web")
    assert post_generic(client, body).status_code == 202
    drain()
    assert [r for r, _c in texts("crm-1")] == ["user", "model"]
    return "crm-1"


def test_the_page_shows_a_generic_webhook_session_read_only(client, crm_session):
    operator = personas.operator()
    client.force_login(operator)
    html = client.get("/chat/", {"session": crm_session}).content.decode()
    assert GENERIC_REFUSAL in html and '<fieldset class="plain" disabled>' in html
    assert 'href="/sessions/crm-1/#takeover-panel">Take over this session</a>' in html
    console = client.get("/sessions/crm-1/").content.decode()
    assert "Answer this generic customer: take over</a>" in console and "Open in live chat" not in console


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_the_consumer_plays_no_turn_on_a_generic_webhook_session(crm_session):
    cookie = await db(lambda: cookie_for(personas.operator()))
    before = await db(texts, crm_session)
    async with connected("/ws/chat/", cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "I want a human", "session_id": crm_session, "channel": "web"})
        refused = await frames_until(ws, 'class="badge refused"', timeout=20)
    assert GENERIC_REFUSAL in "\n".join(refused)
    assert await db(texts, crm_session) == before  # nothing stored as the customer's message
    assert not await db(SessionMode.objects.filter(session_id=crm_session, mode="waiting").exists)
    assert not await db(OperatorAction.objects.filter(action="live_chat_turn").exists)


def test_chatflow_chat_plays_no_turn_on_a_generic_webhook_session(crm_session):
    count = ChatMessage.objects.count()
    with pytest.raises(CommandError, match=GENERIC_REFUSAL):
        call_command("chatflow_chat", session=crm_session, stdin=io.StringIO("I want a human\n"),
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert ChatMessage.objects.count() == count


def test_a_test_session_stays_open_to_the_live_chat(client, env):
    client.force_login(personas.operator())
    html = client.get("/chat/", {"session": "web-test-1"}).content.decode()
    assert 'id="chat-refusal"' not in html and '<fieldset class="plain">' in html
