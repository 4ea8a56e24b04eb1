"""Which session the live chat page (``/chat/``, ``ws/chat/``) plays a turn on, and when it refuses to: a
failed first turn leaves no session; ids up to the store's limit are used whole, longer ones refused;
customers' channel sessions are read only; every turn is in the audit log."""

from __future__ import annotations

import pytest

from sessions_app.models import SESSION_ID_MAX_LENGTH, ChatMessage, ChatSession, OperatorAction
from tests.chatflow_agent.test_engines_openai import FakeOpenAI
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixture)
    close_consumer_connections,
    connected,
    cookie_for,
    db,
    frames_until,
    fresh_channel_layer,
)

pytestmark = [pytest.mark.django_db(transaction=True)]




@pytest.fixture
def operator():
    return personas.operator()


@pytest.fixture
def operator_cookie(operator):
    return cookie_for(operator)


@pytest.fixture
def refusing_provider(settings):
    """The site's engine is OpenAI's, on a loopback server that refuses every request (400)."""
    with FakeOpenAI() as server:
        for _ in range(5):
            server.reply({"error": {"message": "the model is unavailable", "type": "invalid_request_error"}},
                         status=400)
        settings.CHATFLOW_ENGINE = "openai"
        settings.OPENAI_API_KEY = "sk-test-not-real"
        settings.OPENAI_BASE_URL = server.url
        yield server


def entries(session_id: str) -> list[OperatorAction]:
    return list(OperatorAction.objects.filter(session_id=session_id, action="live_chat_turn").order_by("id"))


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_a_failed_first_turn_leaves_no_session(operator_cookie, refusing_provider):
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "hello?", "session_id": "web-failed-1", "agent": "Tech",
                               "channel": "web"})
        frames = await frames_until(ws, 'class="badge failed"', timeout=20)
    assert "nothing of it was saved" in "\n".join(frames)
    assert refusing_provider.received  # the turn reached the provider and failed there
    assert not await db(ChatSession.objects.filter(pk="web-failed-1").exists)
    assert not await db(ChatMessage.objects.filter(session_id="web-failed-1").exists)
    [entry] = await db(entries, "web-failed-1")  # the attempt is audited all the same
    assert entry.after["status"] == "failed" and entry.after["error_type"] == "ProviderError"


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_a_new_session_gets_its_agent_and_channel_with_its_first_turn(operator_cookie, operator):
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "my screen flickers", "session_id": "web-new-1", "agent": "Tech",
                               "channel": "web"})
        await frames_until(ws, 'class="badge answered"', timeout=20)
    session = await db(ChatSession.objects.get, pk="web-new-1")
    assert (session.active_agent_name, session.metadata) == ("Tech", {"channel": "web"})
    [entry] = await db(entries, "web-new-1")
    stored = await db(lambda: list(ChatMessage.objects.filter(session_id="web-new-1").values_list("id", flat=True)))
    assert entry.actor_id == operator.pk and entry.before == {"active_agent": "Tech"}
    assert entry.after["status"] == "completed" and entry.after["message_ids"] == stored


def test_the_audit_log_filters_live_chat_turns(client, operator):
    cv.store("web-a", [cv.user("hi"), cv.model("hello")])
    OperatorAction.objects.create(actor=operator, actor_username=operator.username, action="live_chat_turn",
                                  session_id="web-a", after={"status": "completed"})
    OperatorAction.objects.create(actor=operator, actor_username=operator.username, action="export",
                                  session_id="web-b")
    client.force_login(operator)
    html = client.get("/audit/", {"action": "live_chat_turn"}).content.decode()
    assert '<option value="live_chat_turn" selected>Live chat turn</option>' in html
    assert "web-a" in html and "web-b" not in html


def test_the_page_keeps_a_session_id_of_the_longest_length_whole_and_refuses_a_longer_one(client, operator):
    longest = "w" * (SESSION_ID_MAX_LENGTH - 1) + "!"
    cv.store(longest, [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    client.force_login(operator)
    page = client.get("/chat/", {"session": longest})
    html = page.content.decode()
    assert page.status_code == 200
    assert f'value="{longest}"' in html and f'maxlength="{SESSION_ID_MAX_LENGTH}"' in html
    assert 'id="chat-refusal"' not in html
    assert f'href="/sessions/{longest}/"' in html  # the console link of that very session

    page = client.get("/chat/", {"session": longest + "x"})
    html = page.content.decode()
    assert page.status_code == 400
    assert f"Session ids have at most {SESSION_ID_MAX_LENGTH} characters; this one has 256." in html
    assert "<fieldset class=\"plain\" disabled>" in html


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_the_consumer_plays_on_a_session_id_of_the_longest_length_and_refuses_a_longer_one(operator_cookie):
    longest = "w" * (SESSION_ID_MAX_LENGTH - 1) + "!"
    await db(cv.store, longest, [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "too long", "session_id": longest + "x"})
        refused = await ws.receive_from(timeout=5)
        await ws.send_json_to({"message": "again", "session_id": longest})
        await frames_until(ws, 'class="badge answered"', timeout=20)
    assert f"Session ids have at most {SESSION_ID_MAX_LENGTH} characters; this one has 256." in refused
    users = await db(lambda: list(ChatMessage.objects.filter(role="user").values_list("session_id", "content")))
    assert users == [(longest, "hi"), (longest, "again")]
    assert await db(lambda: list(ChatSession.objects.values_list("pk", flat=True))) == [longest]


@pytest.mark.parametrize("channel", ["telegram", "whatsapp"])
def test_the_page_shows_a_customers_channel_session_read_only(client, operator, channel):
    cv.store("cust-1", [cv.user("hi"), cv.model("hello")], metadata={"channel": channel})
    client.force_login(operator)
    html = client.get("/chat/", {"session": "cust-1"}).content.decode()
    assert f"Read only: this is a {channel} customer&#x27;s session." in html
    assert "<fieldset class=\"plain\" disabled>" in html
    html = client.get("/chat/", {"session": "web-1"}).content.decode()  # a new session: it may chat
    assert 'id="chat-refusal"' not in html and "<fieldset class=\"plain\">" in html


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_the_consumer_refuses_to_play_a_turn_on_a_customers_channel_session(operator_cookie):
    await db(cv.store, "tg:777", [cv.user("where is my parcel"), cv.model("on its way")],
             metadata={"channel": "telegram", "chat_id": 777})
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"message": "injected", "session_id": "tg:777", "channel": "web"})
        first = await frames_until(ws, 'class="badge refused"', timeout=20)
        await ws.send_json_to({"message": "posing", "session_id": "wa-new", "channel": "whatsapp"})
        second = await frames_until(ws, 'class="badge refused"', timeout=20)
    assert "Not sent:</strong> Read only: this is a telegram customer" in "\n".join(first)
    assert "Read only: this is a whatsapp customer" in "\n".join(second)
    contents = await db(lambda: list(ChatMessage.objects.values_list("content", flat=True)))
    assert contents == ["where is my parcel", "on its way"]
    assert not await db(ChatSession.objects.filter(pk="wa-new").exists)
    assert not await db(OperatorAction.objects.exists)  # no turn was played

UNSTORABLE = "This session id holds a control, bidi control, unpaired surrogate or replacement (U+FFFD: invalid UTF-8)"


@pytest.mark.parametrize("session_id", ["a\x00b", "ctl-a\n# injected", "spoof\u202efdp.exe", "bell\x07"])
def test_the_page_refuses_a_session_id_it_cannot_store_as_typed(client, operator, session_id):
    client.force_login(operator)
    page = client.get("/chat/", {"session": session_id})
    assert page.status_code == 400
    assert UNSTORABLE in page.content.decode()
    assert "<fieldset class=\"plain\" disabled>" in page.content.decode()


def test_invalid_utf8_in_the_address_is_refused_not_cleaned_into_another_id(client, operator):
    client.force_login(operator)
    page = client.get("/chat/?session=%ED%A0%80")  # a UTF-8-encoded surrogate: not valid UTF-8
    assert page.status_code == 400
    assert "replacement (U+FFFD: invalid UTF-8)" in page.content.decode()
    assert not ChatSession.objects.exists()


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_the_consumer_never_cleans_a_session_id_into_another_one(operator_cookie):
    await db(cv.store, "ab", [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        for session_id in ("a\x00b", "ctl-a\n# injected\u202eb", "a\ud83db", "a\ufffdb"):
            await ws.send_json_to({"message": "hello", "session_id": session_id})
            refused = await ws.receive_from(timeout=5)
            assert UNSTORABLE in refused
    users = await db(lambda: list(ChatMessage.objects.filter(role="user").values_list("session_id", "content")))
    assert users == [("ab", "hi")]
    assert await db(lambda: list(ChatSession.objects.values_list("pk", flat=True))) == ["ab"]


def test_a_customer_channel_is_read_only_whatever_its_case(client, operator):
    cv.store("cust-2", [cv.user("hi"), cv.model("hello")], metadata={"channel": "WhatsApp"})
    client.force_login(operator)
    assert "<fieldset class=\"plain\" disabled>" in client.get("/chat/", {"session": "cust-2"}).content.decode()


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_a_message_held_for_an_operator_says_so_not_answered(operator_cookie):
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        # A phrase asking for a person: the takeover gate holds the turn and the session waits.
        await ws.send_json_to({"message": "I want a human please", "session_id": "web-held-1", "channel": "web"})
        frames = "\n".join(await frames_until(ws, 'id="chat-1-state" class="badge held"', timeout=20))
    assert 'class="badge held" hx-swap-oob="true">held for the operator</span>' in frames
    assert 'class="badge answered"' not in frames
    users = await db(lambda: list(ChatMessage.objects.filter(role="user").values_list("session_id", "content")))
    assert users == [("web-held-1", "I want a human please")]


@pytest.mark.parametrize("session_id", [" padded", "padded ", "\tpadded"])
def test_the_page_refuses_a_padded_session_id_instead_of_trimming_it(client, operator, session_id):
    cv.store("padded", [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    client.force_login(operator)
    page = client.get("/chat/", {"session": session_id})
    assert page.status_code == 400
    assert "This session id must not start or end with white space." in page.content.decode()
    assert "<fieldset class=\"plain\" disabled>" in page.content.decode()
    assert client.get("/chat/", {"session": " "}).status_code == 200  # blank: a new session, as no id


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_consumer_connections")
async def test_the_consumer_refuses_a_padded_session_id_instead_of_trimming_it(operator_cookie):
    await db(cv.store, "padded", [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    async with connected("/ws/chat/", operator_cookie) as ws:
        assert (await ws.connect())[0]
        for session_id in (" padded", "padded\t"):
            await ws.send_json_to({"message": "hello", "session_id": session_id})
            refused = await ws.receive_from(timeout=5)
            assert "This session id must not start or end with white space." in refused
    users = await db(lambda: list(ChatMessage.objects.filter(role="user").values_list("session_id", "content")))
    assert users == [("padded", "hi")]
