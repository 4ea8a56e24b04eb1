"""The live chat page's websocket (``ws/chat/``): a new session with the chosen starting agent and channel,
the answer streaming, messages sent while a turn runs queued in order; the page itself."""

from __future__ import annotations

import logging
import re

import pytest

from sessions_app.models import ChatMessage, ChatSession
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixtures)
    channel_layer,
    close_consumer_connections,
    connected,
    cookie_for,
    db,
    frames_until,
    fresh_channel_layer,
)

pytestmark = [pytest.mark.django_db(transaction=True)]




@pytest.fixture
def viewer_cookie():
    """An operator's: playing turns needs sessions_app.add_chatmessage (Operators), not only the view."""
    return cookie_for(personas.operator())


def states(frames: list[str]) -> list[tuple[int, str]]:
    return [(int(n), s) for f in frames for n, s in re.findall(r'id="chat-(\d+)-state" class="badge (\w+)"', f)]


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections", "channel_layer")
@pytest.mark.parametrize("frame", ["not json", "[1, 2]", "[" * 100_000 + "]" * 100_000])
async def test_a_frame_that_is_not_a_message_is_refused_in_the_page_and_the_socket_stays(viewer_cookie, frame):
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_to(text_data=frame)
        refused = await ws.receive_from(timeout=5)
        assert 'id="chat-composer-error"' in refused and "not a chat message" in refused
        await ws.send_json_to({"message": "", "session_id": "web:x"})  # still served
        assert "are needed" in await ws.receive_from(timeout=5)


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections", "channel_layer")
async def test_messages_sent_while_a_turn_runs_queue_in_order(viewer_cookie):
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        for text in ("Where is order A-1?", "Please refund order A-1", "thanks"):
            await ws.send_json_to({"message": text, "session_id": "web:chat:1", "agent": "Billing",
                                   "channel": "web"})
        frames = await frames_until(ws, 'id="chat-3-state" class="badge answered"', timeout=20)
    seen = states(frames)
    assert [s for s in seen if s[1] == "queued"] == [(1, "queued"), (2, "queued"), (3, "queued")]
    assert all(seen.index((n, "queued")) < seen.index((n, "running")) for n in (1, 2, 3))  # shown before its turn
    order = [s for s in seen if s[1] in ("running", "answered")]
    assert order == [(1, "running"), (1, "answered"), (2, "running"), (2, "answered"), (3, "running"),
                     (3, "answered")]
    text = "\n".join(frames)
    assert "<span>" in text  # the answer streamed word by word
    assert 'class="msg model answer"' in text
    session = await db(ChatSession.objects.get, pk="web:chat:1")
    assert session.metadata == {"channel": "web"}
    users = await db(lambda: list(ChatMessage.objects.filter(session_id="web:chat:1", role="user")
                                  .values_list("content", flat=True)))
    assert users == ["Where is order A-1?", "Please refund order A-1", "thanks"]


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections", "channel_layer")
async def test_a_new_session_starts_with_the_chosen_agent_and_bad_input_is_refused(viewer_cookie):
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "", "session_id": "x"})
        assert "A message" in await ws.receive_from(timeout=5)
        await ws.send_to(text_data="not json")
        await ws.send_json_to({"message": "<b>hi</b>\x00", "session_id": "web:chat:2", "agent": "Tech",
                               "channel": "\ud800"})
        frames = await frames_until(ws, "badge answered", timeout=20)
    text = "\n".join(frames)
    assert "&lt;b&gt;hi&lt;/b&gt;" in text and "<b>hi</b>" not in text
    assert 'id="chat-1-agent" hx-swap-oob="true">Tech' in text
    first = await db(lambda: ChatSession.objects.get(pk="web:chat:2").messages.order_by("id").first())
    assert first.content == "<b>hi</b>"


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_one_page_cannot_queue_more_than_the_cap(viewer_cookie, monkeypatch, settings):
    from agents_app import consumers

    settings.CHATFLOW_AGENTS = "tests.webhooks_app.agents.build"  # "[slow N]": the first turn runs while two arrive
    monkeypatch.setattr(consumers, "MAX_QUEUED", 2)
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        for text in ("one [slow 2]", "two", "three"):
            await ws.send_json_to({"message": text, "session_id": "web:chat:cap"})
        frames = await frames_until(ws, "already waiting", timeout=20)
        await frames_until(ws, 'id="chat-2-state" class="badge answered"', timeout=20)
    assert "2 messages are already waiting" in "\n".join(frames)
    users = await db(lambda: list(ChatMessage.objects.filter(session_id="web:chat:cap", role="user")
                                  .values_list("content", flat=True)))
    assert users == ["one [slow 2]", "two"]


def test_the_chat_page_opens_for_an_existing_session(client):
    user = personas.operator()
    cv.store("tg:1", [cv.user("hi"), cv.model("hello")], agent="Billing", metadata={"channel": "telegram"})
    client.force_login(user)
    page = client.get("/chat/", {"session": "tg:1"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'ws-connect="/ws/chat/"' in html and 'value="tg:1"' in html and 'value="telegram"' in html
    assert '<option value="Billing" selected>' in html
    detail = client.get("/sessions/tg:1/").content.decode()
    # a Telegram customer's session points to Take over, not to the live chat (which would write as them)
    assert 'href="/chat/?session=tg%3A1"' not in detail and 'href="#takeover-panel"' in detail
    assert 'ws-connect="/ws/sessions/tg%3A1/"' in detail
    cv.store("web-1", [cv.user("hi")], metadata={"channel": "web"})
    assert 'href="/chat/?session=web-1">Open in live chat' in client.get("/sessions/web-1/").content.decode()
    client.force_login(personas.viewer())  # read only: may watch, may not play turns
    assert client.get("/chat/").status_code == 403
    assert "Open in live chat" not in client.get("/sessions/web-1/").content.decode()
    client.logout()
    assert client.get("/chat/").status_code == 302


def usage_line(frames: list[str]) -> str:
    [line] = [m for f in frames for m in re.findall(r"<p class=\"muted small\" data-usage>(.*?)</p>", f)]
    return line


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections", "channel_layer")
async def test_an_answered_turn_shows_its_tokens_and_that_estimates_have_no_cost(viewer_cookie):
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "hello", "session_id": "web:chat:usage", "agent": "Tech"})
        frames = await frames_until(ws, "data-usage", timeout=20)
    line = usage_line(frames)
    assert re.fullmatch(r"1 model call · \d+ in / \d+ out tokens \(estimated\) · cost unknown", line), line


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections", "channel_layer")
async def test_an_answered_turn_shows_the_cost_a_price_override_gives(viewer_cookie, settings):
    settings.CHATFLOW_MODEL_PRICES = {"demo": {"input": "1000000", "output": "1000000"}}  # a dollar a token
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "hello", "session_id": "web:chat:cost", "agent": "Tech"})
        frames = await frames_until(ws, "data-usage", timeout=20)
    tokens_in, tokens_out, cost = re.fullmatch(
        r"1 model call · (\d+) in / (\d+) out tokens \(estimated\) · (\d+) USD", usage_line(frames)).groups()
    assert int(cost) == int(tokens_in) + int(tokens_out)


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_each_numbered_message_is_acknowledged_as_a_turn_or_refused_before_it_queues(viewer_cookie):
    await db(cv.store, "wa:1", [cv.user("hi"), cv.model("hello")], metadata={"channel": "whatsapp"})
    async with connected("/ws/chat/", viewer_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "as the customer", "session_id": "wa:1", "seq": "7"})
        refused = await ws.receive_from(timeout=5)  # one frame: the refused turn and its acknowledgement
        await ws.send_json_to({"message": "hello", "session_id": "web:ack", "channel": "web", "seq": "8"})
        accepted = await ws.receive_from(timeout=5)
        await ws.send_json_to({"message": "", "session_id": "web:ack", "seq": "<9>"})
        # The refusal comes next on the page's own frames; turn 2's state frames may come before it.
        after = await frames_until(ws, 'id="chat-composer-error"', timeout=5)
        error = after[-1]
        answered = 'id="chat-2-state" class="badge answered"'
        if not any(answered in frame for frame in after):
            await frames_until(ws, answered, timeout=20)
    assert 'id="chat-ack" hidden data-seq="7" data-outcome="refused"' in refused
    assert 'class="badge refused"' in refused and "Read only: this is a whatsapp customer" in refused
    assert 'id="chat-ack" hidden data-seq="8" data-outcome="accepted"' in accepted
    assert 'id="chat-2-state" class="badge queued"' in accepted
    assert 'id="chat-composer-error"' in error and 'data-seq="" data-outcome="refused"' in error  # bad seq: dropped
    users = await db(lambda: list(ChatMessage.objects.filter(role="user").values_list("session_id", "content")))
    assert users == [("wa:1", "hi"), ("web:ack", "hello")]


def test_an_existing_session_opens_with_its_history_and_a_noscript_notice(client):
    cv.store("web-h", [cv.user("<i>where</i> is A-1?"), cv.model("on its way")], agent="Tech",
             metadata={"channel": "web"})
    client.force_login(personas.operator())
    html = client.get("/chat/", {"session": "web-h"}).content.decode()
    assert 'id="chat-past-1"' in html and "&lt;i&gt;where&lt;/i&gt; is A-1?" in html and "on its way" in html
    assert '<label for="c-agent">Active agent</label>' in html
    assert re.search(r'<select id="c-agent"[^>]* disabled>', html)
    assert re.search(r'<input id="c-channel"[^>]* disabled>', html)
    assert "<noscript>" in html and "The live chat needs JavaScript." in html
    assert 'method="post" action="/chat/send/"' in html
    new = client.get("/chat/", {"session": "web-not-yet"}).content.decode()
    assert '<label for="c-agent">Starting agent</label>' in new and "chat-past-" not in new


def test_the_form_posted_without_javascript_sends_nothing_and_keeps_the_text(client):
    client.force_login(personas.operator())
    page = client.post("/chat/send/", {"session_id": "web-nojs", "message": "hello <b>there</b>", "channel": "web"})
    assert page.status_code == 400
    html = page.content.decode()
    assert "<strong>Not sent:</strong> the live chat plays turns over its websocket" in html
    assert ">hello &lt;b&gt;there&lt;/b&gt;</textarea>" in html and 'value="web-nojs"' in html
    assert not ChatSession.objects.filter(pk="web-nojs").exists()
    assert client.get("/chat/send/").status_code == 405
    client.force_login(personas.viewer())
    assert client.post("/chat/send/", {"session_id": "x", "message": "m"}).status_code == 403


def test_the_form_posted_without_javascript_is_logged_in_one_line(client, caplog):
    client.force_login(personas.operator())
    with caplog.at_level(logging.INFO):
        assert client.post("/chat/send/", {"session_id": "web-nojs", "message": "hi"}).status_code == 400
    records = [r for r in caplog.records if r.name != "asyncio"]
    assert [(r.name, r.getMessage()) for r in records] == [("django.request", "Bad Request: /chat/send/")]
    assert records[0].exc_info is None
