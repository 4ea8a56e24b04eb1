"""Live takeover updates on open pages (WebsocketCommunicator, every one disconnected): a mode change
(an operator action broadcast by takeover_app) re-renders the mode badge, the takeover panel, the reply
box and the navigation's waiting badge; a reply's delivery change re-renders that message; held customer
messages arrive with the unread count."""

from __future__ import annotations

import re

import pytest

from sessions_app.live import publish_action, publish_reply
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from takeover_app.models import SessionMode
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
    resume,
)
from tests.takeover_app import page_states

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.usefixtures("close_consumer_connections", "channel_layer")]


def last_id(session_id: str) -> int:
    return ChatMessage.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first() or 0


def take_over(session_id: str, user) -> OperatorAction:
    SessionMode.objects.update_or_create(session_id=session_id, defaults={
        "mode": "human", "owner": user, "owner_username": user.username, "previous_agent": "Support",
        "since": cv.T0, "waiting_since": None})
    return OperatorAction.objects.create(actor=user, actor_username=user.username, action="take_over",
                                         session_id=session_id, before={"mode": "waiting"}, after={"mode": "human"})


async def test_a_takeover_reaches_the_owners_open_page_and_the_list():
    olga = await db(personas.operator)
    await db(page_states.waiting, "+15550111")
    async with connected("/ws/sessions/+15550111/", await db(cookie_for, olga)) as page, \
            connected("/ws/sessions/", await db(cookie_for, olga)) as listing:
        assert (await page.connect())[0] and (await listing.connect())[0]
        await resume(page, await db(last_id, "+15550111"))
        entry = await db(take_over, "+15550111", olga)
        await db(publish_action, entry)
        html = "\n".join(await frames_until(page, 'id="live-status"'))
        assert '<span id="mode-badge" class="badge mode-human" hx-swap-oob="true">Operator: olga.operator' in html
        assert '<section class="card takeover" id="takeover-panel"' in html and "You answer</strong>" in html
        assert re.search(r'<section id="reply-box" class="reply-box" data-state="human olga.operator composer" '
                         r'aria-labelledby="reply-title" hx-swap-oob="true">', html)
        assert re.search(r'<textarea id="reply-text"[^>]* hx-preserve>', html)  # a later swap keeps the live one
        assert '<span id="nav-waiting" hx-swap-oob="true"></span>' in html  # nobody waits any more
        assert "olga.operator: take over." in html
        frame = (await frames_until(listing, 'id="nav-waiting"'))[-1]
        assert 'data-mode="human"' in frame  # the row and the badge in one frame


async def test_a_replys_delivery_status_updates_in_place():
    olga = await db(personas.operator)
    await db(page_states.human, "+15550100", olga)
    reply = await db(page_states.operator_reply, "+15550100", olga, "On its way", "sending")
    async with connected("/ws/sessions/+15550100/", await db(cookie_for, olga)) as page:
        assert (await page.connect())[0]
        await resume(page, await db(last_id, "+15550100"))
        reply.status = "sent"
        await db(reply.save)
        await db(publish_reply, reply)
        frame = (await frames_until(page, f'id="reply-{reply.pk}"'))[-1]
        assert 'hx-swap-oob="true"' in frame and 'data-delivery="sent">sent</span>' in frame
        assert "Operator · olga.operator" in frame


async def test_a_held_customer_message_arrives_with_the_unread_count():
    olga = await db(personas.operator)
    await db(page_states.human, "+15550100", olga)
    async with connected("/ws/sessions/+15550100/", await db(cookie_for, olga)) as page:
        assert (await page.connect())[0]
        seen = await db(last_id, "+15550100")

        def held() -> None:
            session = ChatSession.objects.get(pk="+15550100")
            ChatMessage.objects.create(session=session, role="user", content="hello? anyone?",
                                       message_json=cv.user("hello? anyone?").model_dump_json())
            SessionMode.objects.filter(pk="+15550100").update(unread=1)

        await db(held)
        html = "\n".join(await resume(page, seen))  # what a held message's broadcast sends: the new rows
        assert "hello? anyone?" in html and "1 unread" in html


async def test_a_turn_that_starts_and_ends_updates_the_take_over_choices_on_an_open_page():
    import asyncio

    from sessions_app.live import publisher
    from tests.sessions_app.live_support import site_runner_with

    olga = await db(personas.operator)
    await db(cv.store, "+15550122", cv.support_story(), metadata={"channel": "whatsapp"})
    runner = site_runner_with("On its way.", RuntimeError("the model is down"), delay=0.6)
    async with connected("/ws/sessions/+15550122/", await db(cookie_for, olga)) as page:
        assert (await page.connect())[0]
        await resume(page, await db(last_id, "+15550122"))
        turn = asyncio.ensure_future(runner.run_async("+15550122", "where is it?"))
        started = "\n".join(await frames_until(page, 'id="takeover-panel"'))
        assert "turn running" in started and ">Stop it now and take over</button>" in started
        await turn
        await publisher.flush()
        ended = "\n".join(await frames_until(page, 'id="live-cursor"'))
        panel = ended.split('id="takeover-panel"')[1].split("</section>")[0]
        assert "Stop it now" not in panel and ">Take over</button>" in panel

        failing = asyncio.ensure_future(runner.run_async("+15550122", "and now?"))
        started = "\n".join(await frames_until(page, 'id="takeover-panel"'))
        assert ">Stop it now and take over</button>" in started
        with pytest.raises(RuntimeError):
            await failing
        await publisher.flush()
        failed = "\n".join(await frames_until(page, 'id="takeover-panel"'))
        assert "the model is down" in failed and "Stop it now" not in failed.split('id="takeover-panel"')[1]
