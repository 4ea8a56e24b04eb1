"""The live chat page as a chat, in a real browser (Debian's chromium via Playwright, against daphne on the
in-memory channel layer): Enter sends and Shift+Enter starts a new line, the newest answer stays in view
over ten turns, a reader who scrolled up is not moved but shown a "New messages" pill, a refused text stays
in the box, a message goes to the session id the field shows (typed without "Open" too), an existing
session opens with its history, and without JavaScript the page says why it cannot send (the form posts to
a page that keeps the text)."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site
from tests.sessions_app.test_live_browser import NO_NETWORK

pytestmark = [pytest.mark.slow, pytest.mark.browser]

#: Whether an element lies fully inside the window and above the sticky composer (not covered by it).
IN_VIEW = """el => { const r = el.getBoundingClientRect();
  const composer = document.getElementById('chat-form').getBoundingClientRect();
  return r.top >= 0 && r.bottom <= composer.top + 1 && composer.bottom <= window.innerHeight + 1; }"""


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("chat-site"),
                      CHATFLOW_AGENTS="tests.sessions_app._slow_demo.build") as base:
        yield base


@pytest.fixture
def browser(site, chromium):
    with chromium.fresh(NO_NETWORK) as browser:
        yield browser


def chat_page(browser, site: str, session: str, width: int = 1366, height: int = 900, **options):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": width, "height": height}, **options)
    context.set_default_timeout(15_000)
    page = context.new_page()
    log_in(page, site)
    page.goto(f"{site}/chat/?session={session}")
    if options.get("java_script_enabled", True):
        expect(page.locator("#chat-status")).to_have_text("Connected.")
    return page


def test_ten_turns_sent_with_enter_keep_the_newest_answer_in_view(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "web-ten")
    box = page.locator("#c-message")
    expect(box).to_be_focused()
    for n in range(1, 11):
        box.press_sequentially(f"Where is order A-{n}?")
        box.press("Enter")
        expect(page.locator(f"#chat-{n}-state")).to_have_text("answered")
        expect(box).to_have_value("")  # accepted: the box is ready for the next message
        answer = page.locator(f"#chat-{n} .msg.model.answer")
        expect(answer).to_have_count(1)
        assert answer.evaluate(IN_VIEW), f"turn {n}'s answer is out of view"
    assert page.evaluate("document.documentElement.scrollHeight") > 2 * 900  # the page did grow past the window
    assert page.locator("#chat-new-messages").is_hidden()


def test_shift_enter_starts_a_new_line_and_enter_sends_both(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "web-lines")
    box = page.locator("#c-message")
    box.press_sequentially("first line")
    box.press("Shift+Enter")
    box.press_sequentially("second line")
    expect(box).to_have_value("first line\nsecond line")
    expect(page.locator("#chat-1")).to_have_count(0)  # nothing was sent
    box.press("Enter")
    expect(page.locator("#chat-1-state")).to_have_text("answered")
    assert page.locator("#chat-1 .msg.user .text").inner_text() == "first line\nsecond line"


def test_a_refused_message_stays_in_the_box(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "wa-new-customer")
    page.fill("#c-channel", "whatsapp")  # a customer's channel: the live chat never sends as the customer
    box = page.locator("#c-message")
    box.fill("Your parcel is on its way")
    box.press("Enter")
    expect(page.locator("#chat-1-state")).to_have_text("refused")
    expect(page.locator("#chat-1-note")).to_contain_text("Read only: this is a whatsapp customer's session.")
    expect(box).to_have_value("Your parcel is on its way")
    expect(box).to_be_focused()

    page.fill("#c-channel", "web")  # corrected, the same text goes out
    box.press("Enter")
    expect(page.locator("#chat-2-state")).to_have_text("answered")
    expect(box).to_have_value("")


def test_a_session_id_typed_without_open_is_where_the_message_goes(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "web-opened")
    page.fill("#c-session", "typed-42")  # typed, not opened: the field shows typed-42
    box = page.locator("#c-message")
    box.fill("Where is order A-42?")
    box.press("Enter")
    expect(page.locator("#chat-1-state")).to_have_text("answered")
    expect(page.locator("#chat-1 .msg.user .who code")).to_have_text("typed-42")
    expect(page.locator("#chat-console-link")).to_have_text("Open typed-42 in the console")
    assert page.goto(f"{site}/sessions/typed-42/").status == 200
    expect(page.locator("main")).to_contain_text("Where is order A-42?")
    assert page.goto(f"{site}/sessions/web-opened/").status == 404  # the id the page was opened with: unused


def test_a_reader_who_scrolled_up_gets_a_pill_not_a_jump(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "web-reader", width=390, height=700)  # a phone
    box = page.locator("#c-message")
    for n in range(1, 5):
        box.fill(f"Where is order B-{n}?")
        box.press("Enter")
        expect(page.locator(f"#chat-{n}-state")).to_have_text("answered")
    assert page.evaluate("document.documentElement.scrollHeight") > 700 * 1.5
    # The chat itself fits the phone's width: nothing of it needs a sideways scroll.
    assert page.evaluate("Math.max(...[...document.querySelectorAll('#chat *')]"
                         ".map(e => e.getBoundingClientRect().right))") <= 390
    box.fill("[slow 3] is anybody there?")
    box.press("Enter")
    expect(page.locator("#chat-5-state")).to_have_text("running")
    page.mouse.wheel(0, -5000)  # the reader goes back up to read an older turn while the model thinks
    page.wait_for_function("() => window.scrollY === 0")
    expect(page.locator("#chat-5-state")).to_have_text("answered", timeout=15_000)
    pill = page.locator("#chat-new-messages")
    expect(pill).to_be_visible()
    assert page.evaluate("window.scrollY") == 0  # not moved
    pill.click()
    expect(pill).to_be_hidden()
    assert page.locator("#chat-5 .msg.model.answer").evaluate(IN_VIEW)


def test_an_existing_session_opens_with_its_history_and_its_own_agent(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "web-998877")
    past = page.locator("#chat-log .chat-turn.past")
    expect(past).to_have_count(3)
    expect(past.first).to_contain_text("Where is order 42?")
    expect(past.last).to_contain_text("Sorry, the invoice service is down.")
    assert past.last.locator(".msg.model").last.evaluate(IN_VIEW)  # opened at the newest message
    expect(page.locator("label[for=c-agent]")).to_have_text("Active agent")
    expect(page.locator("#c-agent")).to_be_disabled()
    expect(page.locator("#c-agent")).to_have_value("Billing")
    expect(page.locator("#c-channel")).to_be_disabled()

    fresh = chat_page(browser, site, "web-brand-new")  # a new session: the starting agent is a choice…
    expect(fresh.locator("label[for=c-agent]")).to_have_text("Starting agent")
    fresh.select_option("#c-agent", "Tech")
    fresh.fill("#c-message", "my screen flickers")
    fresh.press("#c-message", "Enter")
    expect(fresh.locator("#chat-1-state")).to_have_text("answered")
    expect(fresh.locator("#c-agent")).to_be_disabled()  # …until its first turn stored it
    expect(fresh.locator("label[for=c-agent]")).to_have_text("Active agent")
    expect(fresh.locator("#c-channel")).to_be_disabled()


def test_without_javascript_the_page_explains_and_keeps_the_text(browser, site):
    from playwright.sync_api import expect

    page = chat_page(browser, site, "web-noscript", java_script_enabled=False)
    notice = page.locator("noscript .noscript, .noscript")
    expect(notice.first).to_be_visible()
    expect(notice.first).to_contain_text("The live chat needs JavaScript.")
    page.fill("#c-message", "hello without scripts")
    with page.expect_response(lambda r: r.url.endswith("/chat/send/")) as answer:
        page.click("#c-send")
    assert answer.value.status == 400
    expect(page.locator("#chat-not-sent")).to_contain_text("Not sent:")
    expect(page.locator("#c-message")).to_have_value("hello without scripts")
    assert page.input_value("#c-session") == "web-noscript"
    assert "message=" not in page.url  # never dropped into a GET query
