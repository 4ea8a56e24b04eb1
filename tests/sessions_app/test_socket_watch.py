"""An open websocket serves only while the login it connected with lasts: logging out, deactivation,
a password change or the loss of the permission closes it (4401 / 4403) — on the next frame the page sends,
and within the watch's period while the page only listens. Every communicator is disconnected."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from sessions_app import actions, sockets
from sessions_app.models import ChatMessage, OperatorAction
from sessions_app.sockets import CLOSE_FORBIDDEN, CLOSE_LOGGED_OUT, login_refusal
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixtures)
    channel_layer,
    close_consumer_connections,
    connected,
    db,
    fresh_channel_layer,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


def socket_test(test):
    """An async test with websockets on each channel layer (their consumers' database connections closed
    afterwards)."""
    return pytest.mark.asyncio(pytest.mark.usefixtures("channel_layer", "close_consumer_connections")(test))

SID = "tg:4111"
CARD = "my card is 4111 1111 1111 1111"


@pytest.fixture
def quick_watch(monkeypatch):
    """The watch looks every 0.5 s (the page's wait is bounded by the receive timeouts below, not timed; a
    channel layer probe has that long to come back, on a machine running the other pass besides)."""
    monkeypatch.setattr(sockets, "WATCH_SECONDS", 0.5)


@pytest.fixture
def story():
    cv.store(SID, [*cv.support_story(), cv.user(CARD), cv.model("Noted.")], metadata={"channel": "telegram"})
    return SID


def logged_in(user: User) -> tuple[Client, bytes]:
    """A browser's client logged in as ``user`` and its session cookie (the same login)."""
    client = Client()
    client.force_login(user)
    return client, f"sessionid={client.cookies['sessionid'].value}".encode()


async def closed_with(ws) -> int:
    """The close code of the next output (failing on a frame: nothing is served any more)."""
    output = await ws.receive_output(timeout=10)
    assert output["type"] == "websocket.close", output
    return output["code"]


# ---- who is still logged in ------------------------------------------------------------------
def test_a_login_holds_until_it_is_gone():
    olga = personas.operator()
    client, _ = logged_in(olga)
    key = client.session.session_key
    assert login_refusal(key, olga.pk, "sessions_app.view_chatsession") == 0
    olga.groups.clear()
    assert login_refusal(key, olga.pk, "sessions_app.view_chatsession") == CLOSE_FORBIDDEN
    olga.groups.add(Group.objects.get(name="Operators"))
    olga.set_password("a new password for olga 77")
    olga.save()
    assert login_refusal(key, olga.pk, "sessions_app.view_chatsession") == CLOSE_LOGGED_OUT
    client, _ = logged_in(olga)
    client.logout()
    assert login_refusal(client.session.session_key or key, olga.pk, "sessions_app.view_chatsession") == 4401
    assert login_refusal(None, olga.pk, "sessions_app.view_chatsession") == CLOSE_LOGGED_OUT


# ---- the session page ------------------------------------------------------------------------
@socket_test
async def test_after_logout_the_session_socket_replays_nothing(story):
    client, cookie = await db(logged_in, await db(personas.viewer))
    async with connected(f"/ws/sessions/{SID}/", cookie) as ws:
        assert (await ws.connect())[0]
        await db(client.logout)
        await ws.send_json_to({"type": "resume", "after": 0})
        assert await closed_with(ws) == CLOSE_LOGGED_OUT


@socket_test
async def test_after_logout_the_session_socket_streams_nothing(story, quick_watch):
    client, cookie = await db(logged_in, await db(personas.viewer))
    olga = await db(personas.operator)
    async with connected(f"/ws/sessions/{SID}/", cookie) as ws:
        assert (await ws.connect())[0]
        await ws.send_json_to({"type": "resume", "after": 0})
        assert 'id="live-status"' in await ws.receive_from(timeout=10)
        await db(client.logout)
        assert await closed_with(ws) == CLOSE_LOGGED_OUT  # while the page only listens
        await db(actions.force_handoff, olga, SID, "Billing", reason=CARD)
        assert await ws.receive_nothing(timeout=0.5)


# ---- the session list ------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "code"), [("deactivate", CLOSE_LOGGED_OUT), ("leave_operators", CLOSE_FORBIDDEN),
                                              ("not_staff", CLOSE_FORBIDDEN), ("password", CLOSE_LOGGED_OUT)])
@socket_test
async def test_the_list_socket_closes_once_the_user_changes(story, quick_watch, change, code):
    olga = await db(personas.operator)
    _client, cookie = await db(logged_in, olga)

    def apply() -> None:
        user = User.objects.get(pk=olga.pk)
        if change == "leave_operators":
            user.groups.clear()
            return
        if change == "deactivate":
            user.is_active = False
        elif change == "not_staff":
            user.is_staff = False
        else:
            user.set_password("another password for olga 78")
        user.save()

    async with connected("/ws/sessions/", cookie) as ws:
        assert (await ws.connect())[0]
        await db(apply)
        assert await closed_with(ws) == code


@socket_test
async def test_a_socket_whose_login_cannot_be_checked_closes_instead_of_serving_unchecked(story, quick_watch,
                                                                                         monkeypatch):
    from django.db import OperationalError

    _client, cookie = await db(logged_in, await db(personas.operator))

    def database_away(*args, **kwargs):
        raise OperationalError("terminating connection due to administrator command")

    async with connected("/ws/sessions/", cookie) as ws:
        assert (await ws.connect())[0]
        monkeypatch.setattr(sockets, "login_refusal", database_away)
        assert await closed_with(ws) == sockets.CLOSE_UNCHECKED


@socket_test
async def test_a_list_socket_whose_login_holds_stays_open(story, quick_watch):
    _client, cookie = await db(logged_in, await db(personas.viewer))
    olga = await db(personas.operator)
    async with connected("/ws/sessions/", cookie) as ws:
        assert (await ws.connect())[0]
        assert await ws.receive_nothing(timeout=2)  # several watch periods: still open
        await db(actions.force_handoff, olga, SID, "Billing")
        assert "row-" in await ws.receive_from(timeout=10)


# ---- the live chat ---------------------------------------------------------------------------
@socket_test
async def test_after_logout_the_chat_socket_plays_no_turn():
    olga = await db(personas.operator)
    client, cookie = await db(logged_in, olga)
    async with connected("/ws/chat/", cookie) as ws:
        assert (await ws.connect())[0]
        await db(client.logout)
        await ws.send_json_to({"message": CARD, "session_id": "web-after-logout", "seq": "1"})
        assert await closed_with(ws) == CLOSE_LOGGED_OUT
    assert not await db(OperatorAction.objects.filter(action="live_chat_turn").exists)
    assert not await db(ChatMessage.objects.filter(session_id="web-after-logout").exists)
