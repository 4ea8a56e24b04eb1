"""Human takeover in a real browser (Debian's chromium via Playwright, against daphne with its embedded
webhook worker and the demo team on the demo engine; the WhatsApp Cloud API is a fake server on loopback):
a WhatsApp customer asks for a person, the operator takes the session over, replies from the composer
(Enter sends), sees "sent" once the fake Graph API got it, hands back with a private note; the customer's
next message is answered by the agent again. Keyboard only where a person would use it. The reply composer
is the same textarea (its text, caret and focus) through every re-render of the workspace while the operator
types: a sent reply's answer and re-read, a customer's message arriving live."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.processes import BROWSER_REDIS_URL, redis_up
from tests.sessions_app.test_console_browser import ARTIFACTS, log_in, running_site
from tests.sessions_app.test_live_browser import NO_NETWORK
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers as s
from tests.webhooks_app.fakes import FakeProviderAPI

pytestmark = [pytest.mark.slow, pytest.mark.browser]

WA_ID = "15550177"


@pytest.fixture
def graph():
    with FakeProviderAPI() as wa:
        yield wa


@pytest.fixture(params=["memory"])
def site(request, sites, graph, tmp_path):
    """daphne with the in-memory channel layer, or (``redis``) the Redis one."""
    variables = dict(p.SETTINGS, WHATSAPP_API_BASE=graph.base)
    if request.param == "redis":
        if not redis_up():
            pytest.skip("no Redis server on 127.0.0.1:6379")
        variables["REDIS_URL"] = BROWSER_REDIS_URL
    with running_site(sites, tmp_path, **variables) as base:
        yield base


@pytest.fixture
def browser(site, chromium):
    """The operator's browser (only loopback reachable); what a test opens in it is closed after the test."""
    with chromium.fresh(NO_NETWORK) as browser:
        yield browser


def customer_writes(site: str, wamid: str, text: str) -> None:
    body = p.whatsapp(p.wa_text(wamid, text, wa_id=WA_ID), wa_id=WA_ID)
    status, answer, _seconds = s.post(f"{site}/webhooks/whatsapp/", body, s.wa_headers(body))
    assert status == 200, answer


def sent_texts(graph: FakeProviderAPI) -> list[str]:
    return [r["json"]["text"]["body"] for r in list(graph.requests) if r["path"].endswith("/messages")]


# The page's own re-read after a takeover action (static/js/takeover.js), twice as after two actions in quick
# succession (htmx runs the second after the first), the current workspace marked as the old one.
REREAD_PANEL = """() => {
  document.getElementById('session-panel').dataset.old = '1';
  const url = document.getElementById('live-session').dataset.panelUrl + '&order=newest';
  const reread = () => htmx.ajax('GET', url, {target: '#session-panel', swap: 'outerHTML'});
  window.__rereads = Promise.all([reread(), reread()]);
}"""


def test_an_operator_takes_over_replies_and_hands_back_to_the_agent(site, graph, browser):
    from playwright.sync_api import expect

    customer_writes(site, "wamid.T1", "My parcel is lost. I want to talk to a human")
    s.wait_until(lambda: len(sent_texts(graph)) == 1, 30, "the holding message")
    assert "a person from our team" in sent_texts(graph)[0]

    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.set_default_timeout(15_000)
    log_in(page, site)
    expect(page.locator("#nav-waiting")).to_have_text("1 waiting")
    page.goto(f"{site}/sessions/{WA_ID}/")
    expect(page.locator("#mode-badge")).to_have_text("Waiting for a person")
    expect(page.locator("#live-status")).to_have_text("Live updates on.")

    take = page.get_by_role("button", name="Take over", exact=True)
    take.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#mode-badge")).to_contain_text("Operator: olga.operator since")
    box = page.get_by_role("textbox", name="Reply to the customer on whatsapp")
    # A workspace re-read while a reply is typed keeps every word, the keys typed between the swap and
    # its settle too (a wide settle delay makes that window certain here).
    page.evaluate("htmx.config.defaultSettleDelay = 400")
    box.fill("Draft line one.")
    page.evaluate(REREAD_PANEL)
    page.wait_for_function("() => !document.getElementById('session-panel').dataset.old")  # the new one is in
    page.keyboard.type(" More.")
    page.evaluate("window.__rereads")  # both are in
    page.wait_for_function("() => !document.querySelector('.htmx-settling')")  # the swaps have settled
    expect(box).to_have_value("Draft line one. More.")
    page.evaluate("htmx.config.defaultSettleDelay = 20")
    box.fill("Hello Ana, I am Olga.")
    box.press("Shift+Enter")  # a new line, not a send
    box.press_sequentially("Your parcel is found.")
    box.press("Enter")
    operator = page.locator("article.msg.operator").last
    expect(operator.locator(".author")).to_have_text("Operator · olga.operator")
    expect(operator.locator("[data-delivery]")).to_have_text("sent")
    assert sent_texts(graph)[-1] == "Hello Ana, I am Olga.\nYour parcel is found."
    expect(page.locator("#reply-text")).to_have_value("")
    page.screenshot(path=str(ARTIFACTS / "takeover-human.png"), full_page=True)

    page.get_by_role("link", name="Hand back to an agent…").click()
    dialog = page.locator("#handback-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#hb-agent")).to_have_value("Support")
    page.fill("#hb-note", "Parcel found by the courier; confirm the new delivery date.")
    dialog.get_by_role("button", name="Hand back").click()
    expect(page.locator("#mode-badge")).to_have_text("Bot")
    expect(page.locator("#takeover-panel .private-note")).to_contain_text("Parcel found by the courier")
    assert "data-composer" not in page.content()

    before = len(sent_texts(graph))
    customer_writes(site, "wamid.T2", "Thanks! Where is my order A-1234?")
    s.wait_until(lambda: len(sent_texts(graph)) == before + 1, 30, "the agent's answer")
    answer = sent_texts(graph)[-1]
    assert "A-1234" in answer and "Parcel found" not in answer  # the note is private
    expect(page.locator("#turns .msg.model.answer").last).to_contain_text("A-1234")


# A browser without Element.moveBefore (htmx then moves a preserved element through a detached fragment).
NO_MOVE_BEFORE = "delete Element.prototype.moveBefore;"
# The composer as the test found it, and the workspace marked as the one shown before a re-read.
MARK = """() => { window.__box = document.getElementById('reply-text');
                  document.getElementById('session-panel').dataset.old = '1'; }"""
SAME_BOX = """() => { const box = document.getElementById('reply-text');
  return {same: box === window.__box, focused: document.activeElement === box,
          start: box.selectionStart, end: box.selectionEnd}; }"""


@contextlib.contextmanager
def waiting_session_page(browser: Any, site: str, graph: FakeProviderAPI, wamid: str,
                         init_script: str = "") -> Iterator[Any]:
    """A customer asked for a person (the holding message went out); yields the operator's page in
    ``browser`` on that session, its live updates on. ``init_script``: run in the page before its own scripts."""
    from playwright.sync_api import expect

    customer_writes(site, wamid, "My parcel is lost. I want to talk to a human")
    s.wait_until(lambda: len(sent_texts(graph)) == 1, 30, "the holding message")
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    if init_script:
        page.add_init_script(init_script)
    page.set_default_timeout(30_000)
    log_in(page, site)
    page.goto(f"{site}/sessions/{WA_ID}/")
    expect(page.locator("#live-status")).to_have_text("Live updates on.")
    yield page


def take_over_on(page: Any) -> None:
    """Click Take over; returns once the takeover answered 200 and the page re-read its workspace."""
    page.evaluate("document.getElementById('session-panel').dataset.old = '1'")
    with page.expect_response(lambda r: "/actions/takeover/" in r.url) as taken:
        page.get_by_role("button", name="Take over", exact=True).click()
    assert taken.value.status == 200, (taken.value.status, taken.value.text())
    page.wait_for_function("() => !document.getElementById('session-panel').dataset.old")  # re-read after it


@pytest.mark.parametrize(("site", "move_before"), [("memory", True), ("redis", True), ("memory", False)],
                         ids=["memory", "redis", "memory-no-moveBefore"], indirect=["site"])
def test_the_composer_keeps_what_is_typed_while_the_workspace_is_re_rendered(site, graph, move_before, browser):
    """The operator sends a reply with Enter and types the next one while the first is on its way (the fake
    Graph API holds it) and a customer message arrives live; the sent reply's answer and the workspace's
    re-read swap the panel meanwhile. Every key typed stays in the box, in order, at the caret, and the box
    keeps the focus: it is the same textarea throughout. The CPU is throttled (CDP) so that the swaps and
    the keys interleave the way they do on a loaded machine."""
    from playwright.sync_api import expect

    with waiting_session_page(browser, site, graph, "wamid.K1", "" if move_before else NO_MOVE_BEFORE) as page:
        take_over_on(page)
        box = page.get_by_role("textbox", name="Reply to the customer on whatsapp")
        page.context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 6})

        # A customer message arrives live while a reply is typed: the caret stays where it was.
        box.press_sequentially("Hello Ana.")
        page.evaluate(MARK)
        customer_writes(site, "wamid.K2", "Are you still there?")
        page.keyboard.type(" I am")
        expect(page.locator("#turns .msg.user").last).to_contain_text("Are you still there?")
        page.keyboard.type(" Olga.")
        page.keyboard.press("Home")
        page.keyboard.type(">")
        assert page.evaluate(SAME_BOX) == {"same": True, "focused": True, "start": 1, "end": 1}
        page.keyboard.press("End")
        expect(box).to_have_value(">Hello Ana. I am Olga.")

        # Sent with Enter; the next reply is typed while the first is on its way and its answer re-reads
        # the workspace.
        graph.hold, graph.arrived = threading.Event(), threading.Event()
        page.keyboard.press("Enter")
        assert graph.arrived.wait(30), "the reply did not reach the Graph API"
        page.keyboard.type("Your parcel")
        page.evaluate(MARK)
        graph.hold.set()
        page.keyboard.type(" is found")
        page.wait_for_function("() => !document.getElementById('session-panel').dataset.old")  # re-read
        expect(page.locator("article.msg.operator [data-delivery]").last).to_have_text("sent")
        page.keyboard.type(", at the depot.")
        assert sent_texts(graph)[-1] == ">Hello Ana. I am Olga."
        expect(box).to_have_value("Your parcel is found, at the depot.")
        end = len("Your parcel is found, at the depot.")
        state = page.evaluate(SAME_BOX)
        assert state == {"same": True, "focused": True, "start": end, "end": end}, state


# A live update replacing the takeover panel while its form's action is on its way (the action's own live
# message can come before its answer): done as the request leaves, so the answer always finds it replaced.
REPLACE_PANEL_ON_SEND = """() => { let done = false;
  document.addEventListener('htmx:beforeRequest', (e) => {
    const panel = document.getElementById('takeover-panel');
    if (done || !panel || !panel.contains(e.detail.elt)) return;
    done = true;
    panel.replaceWith(panel.cloneNode(true));
  }); }"""


def test_an_actions_answer_after_a_live_update_replaced_its_form_still_re_reads_the_workspace(site, graph, browser):
    """htmx looks for the answer's target from the form that was sent; once a live update has replaced that
    form it finds none and drops the answer. The page re-reads the workspace all the same: the operator sees
    the session taken over and gets the composer."""
    from playwright.sync_api import expect

    with waiting_session_page(browser, site, graph, "wamid.R1") as page:
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.evaluate(REPLACE_PANEL_ON_SEND)
        take_over_on(page)
        expect(page.locator("#mode-badge")).to_contain_text("Operator: olga.operator since")
        expect(page.get_by_role("textbox", name="Reply to the customer on whatsapp")).to_be_visible()
        assert errors == []  # htmx was told to leave the detached form's answer alone, not left to throw


# A live update replacing the takeover panel while "Hand back to an agent…" asks for its dialog (the reply's
# own live update, right after a reply): done as the request leaves, so the answer always finds it replaced.
REPLACE_PANEL_ON_DIALOG = """() => { let done = false;
  document.addEventListener('htmx:beforeRequest', (e) => {
    const panel = document.getElementById('takeover-panel');
    if (done || !panel || !panel.contains(e.detail.elt) || e.detail.elt.getAttribute('hx-target') !== '#dialog') return;
    done = true;
    panel.replaceWith(panel.cloneNode(true));
  }); }"""


def test_hand_back_opens_its_dialog_when_a_live_update_replaced_its_link_meanwhile(site, graph, browser):
    """htmx looks for the dialog's answer's target from the link that was clicked; once a live update has
    replaced that link it finds none ("Invalid re-target #dialog") and the click did nothing. The dialog
    opens all the same, and hands the session back."""
    from playwright.sync_api import expect

    with waiting_session_page(browser, site, graph, "wamid.D1") as page:
        take_over_on(page)
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.evaluate(REPLACE_PANEL_ON_DIALOG)
        page.get_by_role("link", name="Hand back to an agent…").click()
        dialog = page.locator("#handback-dialog")
        expect(dialog).to_be_visible()
        assert page.evaluate("document.getElementById('action-dialog').matches(':modal')")
        page.fill("#hb-note", "Parcel found.")
        dialog.get_by_role("button", name="Hand back").click()
        expect(page.locator("#mode-badge")).to_have_text("Bot")
        assert errors == []


def test_a_dialog_opened_while_the_workspace_is_re_read_stays_open_with_what_was_typed(site, graph, browser):
    """A reply's answer makes the page re-read its workspace; "Hand back…" clicked before that re-read came
    back opens its dialog, and the re-read's new workspace keeps it open, the note typed in it and all."""
    from playwright.sync_api import expect

    with waiting_session_page(browser, site, graph, "wamid.D2") as page:
        take_over_on(page)
        held: list = []
        holding = [True]

        def hold(route) -> None:  # the re-reads of the workspace: held until they are let go
            if holding[0]:
                held.append(route)
            else:
                route.continue_()

        page.route(lambda url: "panel=1" in url, hold)
        page.evaluate("document.getElementById('session-panel').dataset.old = '1'")
        box = page.get_by_role("textbox", name="Reply to the customer on whatsapp")
        box.fill("Your parcel is found.")
        box.press("Enter")
        expect(page.locator("article.msg.operator").last).to_contain_text("Your parcel is found.")
        assert held, "the re-read after the reply was not asked for"

        page.get_by_role("link", name="Hand back to an agent…").click()
        expect(page.locator("#handback-dialog")).to_be_visible()
        page.fill("#hb-note", "Confirm the new delivery date.")
        holding[0] = False
        for route in held:
            route.continue_()
        page.wait_for_function("() => !document.getElementById('session-panel').dataset.old")  # the re-read is in

        expect(page.locator("#handback-dialog")).to_be_visible()
        expect(page.locator("#hb-note")).to_have_value("Confirm the new delivery date.")
        assert page.evaluate("document.getElementById('action-dialog').matches(':modal')")
        page.locator("#handback-dialog").get_by_role("button", name="Hand back").click()
        expect(page.locator("#mode-badge")).to_have_text("Bot")
        expect(page.locator("#takeover-panel .private-note")).to_contain_text("Confirm the new delivery date.")


def test_an_operator_marks_an_escalation_not_needed_and_lets_the_bot_answer_the_held_message(site, graph, browser):
    from playwright.sync_api import expect

    customer_writes(site, "wamid.H1", "I want to talk to a human")
    s.wait_until(lambda: len(sent_texts(graph)) == 1, 30, "the holding message")
    customer_writes(site, "wamid.H2", "Where is my order A-1234?")
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.set_default_timeout(15_000)
    log_in(page, site)
    page.goto(f"{site}/sessions/{WA_ID}/")
    expect(page.locator("#escalation-line")).to_contain_text("matched the phrase \u201ctalk to a human\u201d")
    page.get_by_role("button", name="Escalation not needed").click()
    expect(page.locator("#escalation-line .badge")).to_have_text("not needed")
    s.wait_until(lambda: "A-1234" in page.content(), 30, "the held message on the page")
    page.get_by_role("link", name="Back to the bot…").click()
    dialog = page.locator("#handback-dialog")
    expect(dialog.locator(".held-messages li")).to_have_text(["Where is my order A-1234?"])
    dialog.get_by_role("button", name="Let the bot answer it now").click()
    expect(page.locator("#mode-badge")).to_have_text("Bot")
    s.wait_until(lambda: len(sent_texts(graph)) == 2, 30, "the bot's one answer to the held message")
    # The page is read again: the held message is in the conversation once, as the bot's turn's message.
    expect(page.locator(".flash")).to_contain_text("The bot answered the held messages")
    expect(page.locator("#turns article.msg.user[data-message-id]", has_text="A-1234")).to_have_count(1)
    expect(page.locator("#turns .msg.model.answer").last).to_contain_text("A-1234")
    page.screenshot(path=str(ARTIFACTS / "takeover-held-answered.png"), full_page=True)
    assert len(sent_texts(graph)) == 2
