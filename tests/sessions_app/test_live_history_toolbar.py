"""A turn committed while a session page is open refreshes what depends on the number of turns: the history
toolbar (turn count, page count, page links) and the rollback link of the turn that was the last one."""

from __future__ import annotations

import re

import pytest

from sessions_app.live import publisher
from sessions_app.models import ChatMessage
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixture)
    close_consumer_connections,
    connected,
    cookie_for,
    db,
    frames_until,
    fresh_channel_layer,
    resume,
    site_runner_with,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.usefixtures("close_consumer_connections")]




@pytest.fixture
def cookies():
    return {"operator": cookie_for(personas.operator()), "viewer": cookie_for(personas.viewer())}


def turns(n: int) -> list:
    return [m for i in range(1, n + 1) for m in (cv.user(f"question {i}"), cv.model(f"answer {i}"))]


def last_id(session_id: str) -> int:
    return ChatMessage.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first()


def toolbar(html: str) -> str:
    found = re.search(r'<div class="toolbar" id="history-toolbar" hx-swap-oob="true">(.*?)</div>', html, re.S)
    assert found, "no history toolbar sent"
    return " ".join(found.group(1).split())


async def committed_turn(cookie: bytes, session_id: str, answer: str) -> str:
    """What an open page of ``session_id`` receives when a turn is committed on it."""
    async with connected(f"/ws/sessions/{session_id}/", cookie) as page:
        assert (await page.connect())[0]
        await resume(page, await db(last_id, session_id))
        await site_runner_with(answer).run_async(session_id, "one more question")
        await publisher.flush()
        return (await frames_until(page, 'id="live-cursor"'))[-1]


async def test_a_live_turn_refreshes_the_toolbar_and_the_previous_turns_rollback_link(cookies):
    await db(cv.store, "web-1", turns(1))
    html = await committed_turn(cookies["operator"], "web-1", "the second answer")
    assert toolbar(html).startswith("<span>2 turns · page 1 of 1</span>")
    assert ('<p class="turn-actions" id="turn-1-actions" hx-swap-oob="true"><a class="button secondary small" '
            'href="/actions/rollback-preview/web-1/?turn=1" hx-get="/actions/rollback-preview/web-1/?turn=1" '
            'hx-target="#dialog">Roll back to the end of turn 1…</a></p>') in html
    assert '<p class="turn-actions" id="turn-2-actions"></p>' in html  # the new last turn: nothing to roll back


async def test_a_live_turn_that_fills_a_new_page_links_to_it(cookies):
    await db(cv.store, "web-20", turns(20))  # a full first page
    html = await committed_turn(cookies["operator"], "web-20", "the 21st answer")
    assert toolbar(html) == ('<span>21 turns · page 1 of 2</span> <a href="/sessions/web-20/?order=oldest&amp;page=1" '
                             'hx-get="/sessions/web-20/?order=oldest&amp;page=1" hx-target="#history" '
                             'hx-swap="outerHTML" hx-push-url="true">Start from the oldest turn</a>')
    assert 'id="turn-20-actions" hx-swap-oob="true"><a' in html


async def test_a_viewer_gets_the_toolbar_but_no_rollback_link(cookies):
    await db(cv.store, "web-1", turns(1))
    html = await committed_turn(cookies["viewer"], "web-1", "the second answer")
    assert toolbar(html).startswith("<span>2 turns · page 1 of 1</span>")
    assert "Roll back" not in html and 'id="turn-1-actions"' not in html
