"""Live updates in a real browser (Debian's chromium via Playwright, against daphne serving the site).

One tab shows a session in the console; a second tab sends a message from the live chat page; the
first tab shows the new turn without a reload. Each test runs on the in-memory channel layer and on
the Redis one (daphne with ``REDIS_URL``), where open sockets also sit idle and wait for a slow turn.
The browser reaches nothing but 127.0.0.1.
"""

from __future__ import annotations

import pytest

from tests.processes import BROWSER_REDIS_URL, redis_up
from tests.sessions_app.test_console_browser import ARTIFACTS, log_in, running_site

pytestmark = [pytest.mark.slow, pytest.mark.browser]

NO_NETWORK = [
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-domain-reliability",
    "--disable-sync",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
#: Counts each page's websocket opens and closes (htmx's ws extension reconnects after an abnormal close).
COUNT_SOCKETS = """window.__sockets = {open: 0, close: 0};
document.addEventListener("htmx:wsOpen", () => window.__sockets.open++);
document.addEventListener("htmx:wsClose", () => window.__sockets.close++);"""


@pytest.fixture(scope="module", params=["memory", "redis"])
def site(request, sites, tmp_path_factory):
    """One daphne per channel layer for the module's tests (they use sessions of their own)."""
    variables = {"CHATFLOW_AGENTS": "tests.sessions_app._slow_demo.build"}
    if request.param == "redis":
        if not redis_up():
            pytest.skip("no Redis server on 127.0.0.1:6379")
        variables["REDIS_URL"] = BROWSER_REDIS_URL
    with running_site(sites, tmp_path_factory.mktemp(f"site-{request.param}"), **variables) as base:
        yield base


@pytest.fixture
def browser_context(site, chromium):
    with chromium.fresh(NO_NETWORK) as browser:
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        context.set_default_timeout(15_000)
        context.add_init_script(COUNT_SOCKETS)
        yield context


def test_a_message_sent_from_the_live_chat_shows_up_in_an_open_session_page(browser_context, site):
    from playwright.sync_api import expect

    console = browser_context.new_page()
    dialogs: list[str] = []
    console.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    log_in(console, site)
    console.goto(f"{site}/sessions/web-998877/")
    expect(console.locator("#live-status")).to_have_text("Live updates on.")
    expect(console.locator("#turns details.turn")).to_have_count(3)
    console.evaluate("window.__notReloaded = true")

    listing = browser_context.new_page()
    listing.goto(f"{site}/sessions/")
    expect(listing.locator("body")).to_have_attribute("data-live", "open")
    expect(listing.locator("#session-rows tr").first).to_contain_text("xss")

    chat = browser_context.new_page()  # same browser, so the same login
    chat.goto(f"{site}/sessions/web-998877/")
    chat.click("text=Open in live chat")
    chat.wait_for_url(f"{site}/chat/?session=web-998877")
    expect(chat.locator("#chat-status")).to_have_text("Connected.")
    assert chat.input_value("#c-session") == "web-998877"
    chat.fill("#c-message", "Where is my order 4711?")
    chat.click("#c-send")
    chat.fill("#c-message", "And can I get a refund?")  # sent while the first turn may still run: queued
    chat.click("#c-send")
    expect(chat.locator("#chat-1-state")).to_have_text("answered")
    expect(chat.locator("#chat-2-state")).to_have_text("answered")
    expect(chat.locator("#chat-1 .msg.model.answer")).to_have_count(1)

    new_turns = console.locator("#turns details.turn")
    expect(new_turns).to_have_count(5)
    expect(new_turns.last).to_contain_text("And can I get a refund?")  # chronological: the newest at the bottom
    expect(new_turns.nth(3)).to_contain_text("Where is my order 4711?")
    expect(console.locator("#live-turn")).to_be_empty()
    expect(console.locator("#session-facts dt:text-is('Turns') + dd")).to_have_text("5")  # the header's turn count too
    assert console.evaluate("window.__notReloaded") is True
    expect(listing.locator("#session-rows tr").first).to_contain_text("web-998877")  # moved to the top
    expect(listing.locator("#session-rows tr")).to_have_count(5)
    ARTIFACTS.mkdir(exist_ok=True)
    console.screenshot(path=str(ARTIFACTS / "live-session.png"), full_page=True)
    chat.screenshot(path=str(ARTIFACTS / "live-chat.png"), full_page=True)
    assert dialogs == []


def test_a_live_update_of_the_focused_row_keeps_the_focus_on_its_session(browser_context, site):
    """An operator moving through the list with the keyboard keeps their place when a turn re-renders the row
    they are on: the session's link has the focus again, and Enter opens that session."""
    from playwright.sync_api import expect

    chat = browser_context.new_page()
    log_in(chat, site)
    chat.goto(f"{site}/chat/?session=web-focus")
    expect(chat.locator("#chat-status")).to_have_text("Connected.")
    chat.fill("#c-message", "first line")
    chat.click("#c-send")
    expect(chat.locator("#chat-1-state")).to_have_text("answered")

    listing = browser_context.new_page()
    listing.goto(f"{site}/sessions/")
    expect(listing.locator("body")).to_have_attribute("data-live", "open")
    link = listing.locator("#session-rows td.sid a[href$='/sessions/web-focus/']")
    link.focus()
    expect(link).to_be_focused()
    row = listing.locator("#session-rows tr[data-row]", has=listing.locator("td.sid a[href$='/sessions/web-focus/']"))
    before = row.inner_text()

    chat.fill("#c-message", "second line")
    chat.click("#c-send")
    expect(chat.locator("#chat-2-state")).to_have_text("answered")
    expect(row).not_to_have_text(before)  # the row was rendered again
    expect(link).to_be_focused()
    listing.keyboard.press("Enter")
    listing.wait_for_url("**/sessions/web-focus/")


def test_a_page_that_reconnects_gets_exactly_the_turns_it_missed(browser_context, site):
    from playwright.sync_api import expect

    console = browser_context.new_page()
    log_in(console, site)
    console.goto(f"{site}/sessions/web-0100/")
    expect(console.locator("#live-status")).to_have_text("Live updates on.")
    expect(console.locator("#turns details.turn")).to_have_count(1)
    # The connection drops (a clean close: htmx's extension does not reconnect by itself then).
    console.evaluate("document.getElementById('live-session')['htmx-internal-data'].webSocket.socket.close()")
    expect(console.locator("body")).to_have_attribute("data-live", "closed")

    chat = browser_context.new_page()
    chat.goto(f"{site}/chat/?session=web-0100")
    expect(chat.locator("#chat-status")).to_have_text("Connected.")
    for text in ("missed one", "missed two"):
        chat.fill("#c-message", text)
        chat.click("#c-send")
    expect(chat.locator("#chat-2-state")).to_have_text("answered")
    expect(console.locator("#turns details.turn")).to_have_count(1)  # nothing arrives while disconnected

    console.evaluate("document.getElementById('live-session')['htmx-internal-data'].webSocket.init()")
    turns = console.locator("#turns details.turn")
    expect(turns).to_have_count(3)  # the two missed turns, replayed from the database…
    expect(turns.last).to_contain_text("missed two")
    expect(turns.nth(1)).to_contain_text("missed one")
    chat.fill("#c-message", "live again")  # …then live events, each turn once
    chat.click("#c-send")
    expect(turns).to_have_count(4)
    expect(turns.last).to_contain_text("live again")
    ids = console.evaluate("[...document.querySelectorAll('#turns details.turn')]"
                           ".flatMap(t => t.dataset.messageIds.split(' '))")
    assert len(ids) == len(set(ids)) == 2 + 3 * 2


@pytest.mark.parametrize("site", ["redis"], indirect=True)
def test_sockets_idle_for_half_a_minute_stay_open_and_a_slow_turn_arrives(browser_context, site):
    """The list's, the session page's and the live chat's sockets sit idle, then a turn waits on its model
    for longer than channels-redis's blocking receive: nothing closes, the answer arrives."""
    from playwright.sync_api import expect

    chat = browser_context.new_page()
    log_in(chat, site)
    chat.goto(f"{site}/chat/?session=web%3Aidle")
    expect(chat.locator("#chat-status")).to_have_text("Connected.")
    chat.fill("#c-message", "hello")
    chat.click("#c-send")
    expect(chat.locator("#chat-1-state")).to_have_text("answered")
    console = browser_context.new_page()
    console.goto(f"{site}/sessions/web:idle/")
    expect(console.locator("#live-status")).to_have_text("Live updates on.")
    expect(console.locator("#turns details.turn")).to_have_count(1)
    listing = browser_context.new_page()
    listing.goto(f"{site}/sessions/")
    expect(listing.locator("body")).to_have_attribute("data-live", "open")
    pages = (chat, console, listing)

    chat.wait_for_timeout(30_000)  # idle: nothing is sent on any socket
    assert [p.evaluate("window.__sockets") for p in pages] == [{"open": 1, "close": 0}] * 3

    chat.fill("#c-message", "[slow 11] are you still there?")
    chat.click("#c-send")
    expect(chat.locator("#chat-2-state")).to_have_text("running")
    expect(chat.locator("#chat-2-state")).to_have_text("answered", timeout=45_000)
    expect(chat.locator("#chat-2 .msg.model.answer")).to_have_count(1)
    turns = console.locator("#turns details.turn")
    # The other pages hear of the turn through Redis after the chat does: a bound for a loaded machine, not a time.
    expect(turns).to_have_count(2, timeout=30_000)
    expect(turns.last).to_contain_text("are you still there?")
    expect(listing.locator("#session-rows tr").first).to_contain_text("web:idle", timeout=30_000)
    assert [p.evaluate("window.__sockets") for p in pages] == [{"open": 1, "close": 0}] * 3
