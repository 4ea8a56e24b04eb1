"""The live chat and an open session page in a real browser (Debian's chromium via Playwright, against
daphne): a live turn updates the page's turn count and gives the previous turn its rollback link; a
customer's Telegram session opens read only in the live chat."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site
from tests.sessions_app.test_live_browser import browser_context  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    """One daphne for the module's tests (each works on a session of its own)."""
    with running_site(sites, tmp_path_factory.mktemp("live-turns-site")) as base:
        yield base


def test_a_live_turn_updates_the_turn_count_and_adds_the_previous_turns_rollback_link(browser_context, site):  # noqa: F811
    from playwright.sync_api import expect

    console = browser_context.new_page()
    log_in(console, site)
    console.goto(f"{site}/sessions/web-0100/")
    expect(console.locator("#live-status")).to_have_text("Live updates on.")
    count = console.locator("#history .toolbar > span")
    expect(count).to_have_text("1 turn · page 1 of 1")
    rollback = console.locator("#turn-1 .turn-actions a")
    expect(rollback).to_have_count(0)  # the last turn: nothing after it to roll back
    console.evaluate("window.__notReloaded = true")

    chat = browser_context.new_page()
    chat.goto(f"{site}/chat/?session=web-0100")
    expect(chat.locator("#chat-status")).to_have_text("Connected.")
    chat.fill("#c-message", "Where is my order 4711?")
    chat.click("#c-send")
    expect(chat.locator("#chat-1-state")).to_have_text("answered")

    expect(console.locator("#turns details.turn")).to_have_count(2)
    expect(count).to_have_text("2 turns · page 1 of 1")
    expect(rollback).to_have_text("Roll back to the end of turn 1…")
    expect(console.locator("#turn-2 .turn-actions a")).to_have_count(0)
    rollback.click()  # the link swapped in live works like the page's own
    expect(console.locator("#rollback-preview h2")).to_have_text("Roll back to the end of turn 1 of 2")
    assert console.evaluate("window.__notReloaded") is True


def test_the_live_chat_opens_a_telegram_customers_session_read_only(browser_context, site):  # noqa: F811
    from playwright.sync_api import expect

    page = browser_context.new_page()
    log_in(page, site)
    page.goto(f"{site}/sessions/tg:998877/")
    # A customer's session points to Take over, not to the live chat (which would write as the customer).
    expect(page.locator("text=Open in live chat")).to_have_count(0)
    page.click("text=Answer this telegram customer: take over")
    expect(page.locator("#takeover-panel")).to_be_in_viewport()
    page.goto(f"{site}/chat/?session=tg%3A998877")
    expect(page.locator("#chat-refusal")).to_contain_text("Read only: this is a telegram customer's session.")
    expect(page.locator("#c-message")).to_be_disabled()
    expect(page.locator("#c-send")).to_be_disabled()
    page.click("#chat-refusal >> text=Take over this session")
    expect(page.locator("#takeover-panel")).to_be_visible()


def test_find_in_session_marks_the_messages_a_live_turn_brings(browser_context, site):  # noqa: F811
    from playwright.sync_api import expect

    console = browser_context.new_page()
    log_in(console, site)
    console.goto(f"{site}/sessions/web-998877/")
    expect(console.locator("#live-status")).to_have_text("Live updates on.")
    console.fill("#find-q", "zebra crossing")
    expect(console.locator("#find-count")).to_contain_text("0 of")  # nothing said it yet

    chat = browser_context.new_page()
    chat.goto(f"{site}/chat/?session=web-998877")
    expect(chat.locator("#chat-status")).to_have_text("Connected.")
    chat.fill("#c-message", "Is the shop by the zebra crossing open?")
    chat.click("#c-send")
    expect(chat.locator("#chat-1-state")).to_have_text("answered")

    # The live turn's messages arrive after the find ran: the reader's find marks them too.
    expect(console.locator("#turns .msg.find-hit").first).to_contain_text("zebra crossing")
    expect(console.locator("#find-count")).not_to_contain_text("0 of")
