"""Live consumers with WebsocketCommunicator (every one disconnected): access, a turn's events in order,
a failed turn's rollback, operator actions broadcast, reconnect replaying exactly the missed messages."""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.types import ToolCall
from sessions_app import actions
from sessions_app.live import LIST_GROUP, dom_id, group_for_session, has_receivers, publisher
from sessions_app.models import ChatMessage
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixtures)
    channel_layer,
    close_consumer_connections,
    connected,
    cookie_for,
    db,
    drain,
    frames_until,
    fresh_channel_layer,
    message_ids,
    resume,
    site_runner_with,
    unique_message_ids,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.usefixtures("close_consumer_connections")]




@pytest.fixture
def people():
    users = {"operator": personas.operator(), "viewer": personas.viewer(), "outsider": personas.outsider(),
             "customer": personas.customer()}
    return {name: cookie_for(user) for name, user in users.items()} | {"anonymous": None, "_users": users}


@pytest.fixture
def story():
    cv.store("tg:998877", cv.support_story(), metadata={"channel": "telegram"})
    return "tg:998877"


def last_id(session_id: str) -> int:
    return ChatMessage.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first() or 0


# ---- access ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/ws/sessions/", "/ws/sessions/tg:998877/", "/ws/chat/"])
@pytest.mark.parametrize(("who", "code"), [("anonymous", 4401), ("outsider", 4403), ("customer", 4403)])
async def test_it_rejects_users_without_the_view_permission(people, story, path, who, code):
    async with connected(path, people[who]) as ws:
        accepted, close_code = await ws.connect()
        assert (accepted, close_code) == (False, code)


@pytest.mark.parametrize("path", ["/ws/sessions/", "/ws/sessions/tg:998877/"])
async def test_it_accepts_a_viewer(people, story, path):
    async with connected(path, people["viewer"]) as ws:
        accepted, _ = await ws.connect()
        assert accepted


@pytest.mark.parametrize(("path", "group"), [("/ws/sessions/", LIST_GROUP),
                                             ("/ws/sessions/tg:998877/", group_for_session("tg:998877"))])
async def test_an_open_page_is_a_receiver_of_its_group_until_it_disconnects(people, story, path, group, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    assert not has_receivers(layer, [group])
    async with connected(path, people["viewer"]) as ws:
        assert (await ws.connect())[0]
        assert has_receivers(layer, [group])
        await ws.disconnect()
    assert not has_receivers(layer, [group])


@pytest.mark.parametrize("session_id", ["a/b", "olá 👋", "line1\nline2", "cr\r\nlf\n", "ends/with/slash/"])
async def test_a_viewer_follows_a_session_whatever_its_id(people, session_id):
    await database_sync_to_async(cv.store)(session_id, cv.support_story())
    # Percent-encoded as the page sends it (the communicator unquotes it into the ASGI path, as daphne does).
    async with connected(f"/ws/sessions/{quote(session_id, safe='/')}/", people["viewer"]) as ws:
        accepted, _ = await ws.connect()
        assert accepted


async def test_only_operators_may_play_turns_from_the_live_chat(people, story):
    async with connected("/ws/chat/", people["viewer"]) as ws:
        assert await ws.connect() == (False, 4403)
    async with connected("/ws/chat/", people["operator"]) as ws:
        assert (await ws.connect())[0]


async def test_it_refuses_an_unknown_session_and_a_foreign_origin(people, story):
    for path in ("/ws/sessions/nope/", "/ws/sessions/a\x00b/"):
        async with connected(path, people["viewer"]) as ws:
            # accepted, then closed with 4404 (refused before accepting, a browser would see 1006 and retry)
            assert await ws.connect() == (True, None)
            assert await ws.receive_output() == {"type": "websocket.close", "code": 4404}
    from channels.testing import WebsocketCommunicator

    from chatflow_site.asgi import application

    ws = WebsocketCommunicator(application, "/ws/sessions/", headers=[(b"origin", b"http://evil.example"),
                                                                    (b"cookie", people["viewer"])])
    try:
        accepted, _ = await ws.connect()
        assert not accepted
    finally:
        await ws.disconnect()


# ---- a turn, live ----------------------------------------------------------------------------
def turn_script():
    return [
        EngineTurnResult(tool_calls=[ToolCall(id="c9", name="check_order_status", args={"order_id": "77"})]),
        EngineTurnResult(tool_calls=[ToolCall(id="h1", name="transfer_to_billing", args={"reason": "refund"})]),
        "Your refund for order 77 is on its way.",
    ]


def in_order(text: str, *needles: str) -> None:
    at = -1
    for needle in needles:
        found = text.find(needle, at + 1)
        assert found > at, f"{needle!r} missing or out of order (after position {at})"
        at = found


@pytest.mark.usefixtures("channel_layer")
async def test_a_frame_nested_too_deep_to_parse_is_ignored_and_the_socket_stays(people, story):
    async with connected(f"/ws/sessions/{story}/", people["viewer"]) as page:
        assert (await page.connect())[0]
        await page.send_to(text_data="[" * 100_000 + "]" * 100_000)
        assert message_ids("".join(await resume(page, await db(last_id, story)))) == []  # still served


@pytest.mark.usefixtures("channel_layer")
async def test_a_turn_with_a_tool_call_and_a_handoff_streams_in_order(people, story):
    before = await db(last_id, story)
    runner = site_runner_with(*turn_script())
    async with connected(f"/ws/sessions/{story}/", people["viewer"]) as page, \
            connected("/ws/sessions/?mode=top", people["viewer"]) as listing:
        assert (await page.connect())[0] and (await listing.connect())[0]
        assert message_ids("".join(await resume(page, before))) == []  # nothing missed
        await runner.run_async(story, "Where is my refund for order 77?")
        await publisher.flush()
        frames = await frames_until(page, 'id="live-cursor"')
        rows = await drain(listing)
    text = "\n".join(frames)
    in_order(
        text,
        "turn running", "agent <strong id=\"live-agent\">Support</strong>",  # turn started
        "Where is my refund for order 77?",  # the user message
        "check_order_status", "running…",  # the model's tool call, running
        '&quot;status&quot;',  # its result (escaped JSON)
        'id="live-agent" hx-swap-oob="true">Billing',  # the handoff event
        "⇄ Handoff <strong>Support</strong> → <strong>Billing</strong>",  # the handoff's result
        "<span>Your </span>", "<span>refund </span>",  # text deltas, word by word
        "Your refund for order 77 is on its way.</div>",  # the answer message
        'hx-swap-oob="beforeend:#turns"', "Turn 4",  # the committed turn replaces the live one
    )
    new = await db(lambda: list(ChatMessage.objects.filter(session_id=story, id__gt=before)
                                .values_list("id", flat=True)))
    assert unique_message_ids(frames[-1]) == new and len(new) == 6
    assert message_ids(frames[-1]) == new  # each once
    assert '<dl class="facts" id="session-facts" hx-swap-oob="true">' in frames[-1]  # the header too:
    assert "<dt>Active agent</dt><dd><strong>Billing</strong>" in frames[-1]  # the handoff stuck
    assert "<dt>Turns</dt><dd>4</dd>" in frames[-1]
    assert 'id="no-turns"' not in text  # the page had turns: nothing to delete (no htmx oobErrorNoTarget)
    # The list: the session moved to the top twice (turn started: running; turn completed: idle), each
    # time the old row deleted in one frame and the new one inserted at the top in the next.
    assert len(rows) == 4 and "turn running" in rows[1] and "idle" in rows[3]
    assert all('hx-swap-oob="delete"' in r and "<tbody" not in r for r in rows[::2])
    assert all(r.startswith('<tbody hx-swap-oob="afterbegin:#session-rows">') for r in rows[1::2])


async def test_a_failed_turn_shows_its_rollback(people, story):
    before = await db(last_id, story)
    runner = site_runner_with(RuntimeError("provider <b>down</b>"))
    async with connected(f"/ws/sessions/{story}/", people["viewer"]) as page:
        assert (await page.connect())[0]
        await resume(page, before)
        with pytest.raises(RuntimeError):
            await runner.run_async(story, "hello?")
        await publisher.flush()
        frames = await frames_until(page, "Rolled back")
    text = "\n".join(frames)
    in_order(text, "turn running", "hello?", "Rolled back:", "RuntimeError: provider &lt;b&gt;down&lt;/b&gt;")
    assert "<b>down</b>" not in text
    assert await db(last_id, story) == before  # nothing written


# ---- the session list: what a live update targets, the page has --------------------------------
class _Elements(HTMLParser):
    """The top-level elements of an htmx fragment (tag, attributes, ids inside), and every id it holds."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.depth, self.top, self.ids = 0, [], set()
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._element(tag, dict(attrs))
        if tag not in self.VOID:
            self.depth += 1

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self._element(tag, dict(attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID:
            self.depth -= 1

    def _element(self, tag: str, attrs: dict) -> None:
        if attrs.get("id"):
            self.ids.add(attrs["id"])
            if self.depth:
                self.top[-1][2].add(attrs["id"])
        if not self.depth:
            self.top.append((tag, attrs, set()))


def swap_into(page_ids: set[str], frame: str) -> None:
    """Apply ``frame`` to the ids of a page as htmx's ws extension does (each top-level element is an out-of-band
    swap); fails on a swap whose target the page does not have (htmx: ``htmx:oobErrorNoTarget``)."""
    for _tag, attrs, inner in _Elements(frame).top:
        oob = attrs.get("hx-swap-oob") or "true"
        swap, target = oob.split(":#", 1) if ":#" in oob else (oob, attrs.get("id", ""))
        assert target in page_ids, f"the frame swaps #{target}, which the page does not have: {frame[:300]}"
        if swap == "delete":
            page_ids.discard(target)
        page_ids |= inner | ({attrs["id"]} if swap in ("true", "outerHTML") and attrs.get("id") else set())


async def list_page(user, query: str = "") -> str:
    def get() -> str:
        client = Client()
        client.force_login(user)
        response = client.get(f"/sessions/{query}")
        assert response.status_code == 200
        return response.content.decode()

    return await db(get)


@pytest.mark.usefixtures("channel_layer")
@pytest.mark.parametrize("rows", [2, 0], ids=["rows", "empty"])
async def test_a_live_list_update_only_swaps_elements_the_page_has(people, rows):
    """The list's frames (a session's turn started, then ended: moved to the top twice) target only what the page
    shows, whether it had rows or said "No sessions match." (htmx logs an out-of-band swap without a target)."""
    for i in range(rows):
        await db(cv.store, f"web:{i}", cv.support_story(), metadata={"channel": "web"})
    page = await list_page(people["_users"]["viewer"])
    ws_url = re.search(r'ws-connect="([^"]+)"', page).group(1).replace("&amp;", "&")
    page_ids = _Elements(page).ids
    assert ("No sessions match." in page) is (rows == 0)
    moved = "web:0"
    if not rows:
        await db(cv.store, moved, [], metadata={"channel": "web"})
        # Created after the page was read: the frame deleting its old row finds none (the consumer cannot know
        # which rows a page shows), a gap apart from the placeholder's.
        page_ids.add(f"row-{dom_id(moved)}")

    runner = site_runner_with("Hello!")
    async with connected(ws_url, people["viewer"]) as listing:
        assert (await listing.connect())[0] and ws_url.endswith("?mode=top")
        await runner.run_async(moved, "hi")
        await publisher.flush()
        frames = await drain(listing)

    assert len(frames) == 4  # turn started, turn completed: each the old row deleted, then the row at the top
    for frame in frames:
        swap_into(page_ids, frame)
    assert f"row-{dom_id(moved)}" in page_ids
    # "No sessions match." goes with the first row at the top (its body stays, empty, for the next update).
    assert all(f.endswith('<tbody id="no-sessions" hx-swap-oob="innerHTML"></tbody>') for f in frames[1::2])


def list_ws_url(page: str) -> str:
    return re.search(r'ws-connect="([^"]+)"', page).group(1).replace("&amp;", "&")


def row_moves(frames: list[str], session_id: str) -> list[str]:
    """What the frames do to the row of ``session_id``: ``top`` (inserted at the top), ``delete``, ``replace``."""
    row = f'id="row-{dom_id(session_id)}"'
    out = []
    for frame in frames:
        if row not in frame:
            continue
        if frame.startswith('<tbody hx-swap-oob="afterbegin:#session-rows">'):
            out.append("top")
        elif 'hx-swap-oob="delete"' in frame:
            out.append("delete")
        else:
            out.append("replace")
    return out


@pytest.mark.usefixtures("channel_layer")
async def test_a_filtered_list_moves_a_matching_session_to_the_top_and_drops_one_that_does_not_match(people):
    await db(cv.store, "+15550100", cv.support_story(), metadata={"channel": "whatsapp"})
    await db(cv.store, "web:1", cv.support_story(), metadata={"channel": "web"})
    page = await list_page(people["_users"]["viewer"], "?channel=WhatsApp")
    ws_url = list_ws_url(page)
    assert 'id="row-' + dom_id("web:1") not in page
    runner = site_runner_with("Hello!", "Hi!")

    async with connected(ws_url, people["viewer"]) as listing:
        assert (await listing.connect())[0]
        await runner.run_async("+15550100", "hi")
        await runner.run_async("web:1", "hi")
        await publisher.flush()
        frames = await drain(listing)

    # turn started, turn completed: each the old row deleted, then the row at the top
    assert row_moves(frames, "+15550100") == ["delete", "top", "delete", "top"]
    assert row_moves(frames, "web:1") == ["delete", "delete"]  # never shown on this list


@pytest.mark.usefixtures("channel_layer")
async def test_a_session_enters_a_mode_filtered_list_when_it_starts_waiting_and_leaves_it_when_taken_over(people):
    from takeover_app import service

    await db(cv.store, "+15550100", cv.support_story(), metadata={"channel": "whatsapp"})
    page = await list_page(people["_users"]["viewer"], "?mode=waiting")
    assert "No sessions match." in page

    async with connected(list_ws_url(page), people["viewer"]) as listing:
        assert (await listing.connect())[0]
        await db(service.request_human, "+15550100", "The customer wrote 'human'.", "phrase")
        waiting = await frames_until(listing, "waiting for a person")
        await db(service.take_over, people["_users"]["operator"], "+15550100")
        taken = await drain(listing)

    assert row_moves(waiting, "+15550100") == ["delete", "top"]
    assert "waiting for a person" in waiting[-1]
    assert row_moves(taken, "+15550100") == ["delete"]


@pytest.mark.parametrize(("query", "expected"), [
    ("", "/ws/sessions/?mode=top"),
    ("?channel=whatsapp&mode=waiting", "/ws/sessions/?mode=top&filters=channel%3Dwhatsapp%26mode%3Dwaiting"),
    ("?sort=agent&q=refund", "/ws/sessions/?filters=q%3Drefund"),
    ("?sort=agent", "/ws/sessions/"),
    ("?mode=nonsense", "/ws/sessions/?mode=top"),  # a refused filter (400) is not applied
])
async def test_the_lists_socket_carries_its_search_and_filters(people, query, expected):
    assert list_ws_url(await list_page_any(people["_users"]["viewer"], query)) == expected


async def list_page_any(user, query: str) -> str:
    def get() -> str:
        client = Client()
        client.force_login(user)
        return client.get(f"/sessions/{query}").content.decode()

    return await db(get)


# ---- operator actions ------------------------------------------------------------------------
@pytest.mark.usefixtures("channel_layer")
async def test_operator_actions_are_broadcast_to_open_pages(people, story):
    operator = people["_users"]["operator"]
    async with connected(f"/ws/sessions/{story}/", people["viewer"]) as page, \
            connected("/ws/sessions/", people["viewer"]) as listing:
        assert (await page.connect())[0] and (await listing.connect())[0]
        await resume(page, await db(last_id, story))

        await db(actions.force_handoff, operator, story, "Tech", "screen flickers")
        panel = "\n".join(await frames_until(page, 'id="live-status"'))
        assert "olga.operator handed the session off from Support to Tech." in panel
        assert "<dt>Active agent</dt><dd><strong>Tech</strong>" in panel
        assert 'id="session-panel"' not in panel  # the actions form is left alone
        row = await listing.receive_from(timeout=5)
        assert 'id="row-' in row and "<td class=\"agent\">Tech</td>" in row

        await db(actions.rollback, operator, story, 1, (await db(actions.plan_rollback, story, 1)).fingerprint)
        panel = "\n".join(await frames_until(page, 'id="live-status"'))
        assert "olga.operator rolled the session back to turn 1." in panel
        assert panel.count('<details class="turn"') == 1
        await listing.receive_from(timeout=5)

        await db(actions.delete_session, operator, story)
        gone = await page.receive_from(timeout=5)
        assert "Deleted:" in gone and "olga.operator deleted this session." in gone
        removed = await listing.receive_from(timeout=5)
        assert 'hx-swap-oob="delete"' in removed


# ---- reconnect -------------------------------------------------------------------------------
@pytest.mark.usefixtures("channel_layer")
async def test_a_reconnect_replays_exactly_the_missed_messages(people, story):
    runner = site_runner_with("first answer", "second answer", "third answer")
    seen = await db(last_id, story)
    await runner.run_async(story, "one")  # the page had this turn…
    seen = await db(last_id, story)
    await runner.run_async(story, "two")  # …then lost its connection for these two
    await runner.run_async(story, "three")
    await publisher.flush()
    missed = await db(lambda: list(ChatMessage.objects.filter(session_id=story, id__gt=seen)
                                   .values_list("id", flat=True)))
    async with connected(f"/ws/sessions/{story}/", people["viewer"]) as page:
        assert (await page.connect())[0]
        frames = await resume(page, seen)
        assert unique_message_ids("".join(frames)) == missed and len(missed) == 4
        assert sum(len(message_ids(f)) for f in frames) == 4  # each exactly once
        # Live again: the next turn sends only its own messages, not the replayed ones again.
        runner.engine.push("fourth answer")
        await runner.run_async(story, "four")
        await publisher.flush()
        live = await frames_until(page, 'id="live-cursor"')
        newest = await db(lambda: list(ChatMessage.objects.filter(session_id=story, id__gt=missed[-1])
                                       .values_list("id", flat=True)))
        assert unique_message_ids(live[-1]) == newest and len(newest) == 2


@pytest.mark.usefixtures("channel_layer")
async def test_events_before_the_resume_are_held_then_deduplicated(people, story):
    """A turn that commits between connect and resume is sent once (from the replay), not twice."""
    runner = site_runner_with("held answer")
    seen = await db(last_id, story)
    async with connected(f"/ws/sessions/{story}/", people["viewer"]) as page:
        assert (await page.connect())[0]
        await runner.run_async(story, "while connecting")
        await publisher.flush()
        await asyncio.sleep(0.05)
        frames = await resume(page, seen)
        frames += await drain(page)
    ids = [i for f in frames for i in message_ids(f)]
    assert len(ids) == 2 and len(set(ids)) == 2
