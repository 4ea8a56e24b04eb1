"""Human takeover in a real browser (Debian's chromium via Playwright, against daphne with its embedded
webhook worker and the demo team on the demo engine; the WhatsApp Cloud API is a fake server on loopback):
a WhatsApp customer asks for a person, the operator takes the session over, replies from the composer
(Enter sends), sees "sent" once the fake Graph API got it, hands back with a private note; the customer's
next message is answered by the agent again. Keyboard only where a person would use it."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import ARTIFACTS, CHROMIUM, log_in, running_site
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


@pytest.fixture
def site(graph, tmp_path):
    with running_site(tmp_path, WHATSAPP_API_BASE=graph.base, **p.SETTINGS) as base:
        yield base


def customer_writes(site: str, wamid: str, text: str) -> None:
    body = p.whatsapp(p.wa_text(wamid, text, wa_id=WA_ID), wa_id=WA_ID)
    status, answer, _seconds = s.post(f"{site}/webhooks/whatsapp/", body, s.wa_headers(body))
    assert status == 200, answer


def sent_texts(graph: FakeProviderAPI) -> list[str]:
    return [r["json"]["text"]["body"] for r in list(graph.requests) if r["path"].endswith("/messages")]


# The page's own re-read after a takeover action (static/js/takeover.js), the current box marked as the old one.
REREAD_PANEL = """() => {
  document.getElementById('reply-text').dataset.old = '1';
  const live = document.getElementById('live-session');
  htmx.ajax('GET', live.dataset.panelUrl + '&order=newest', {target: '#session-panel', swap: 'outerHTML'});
}"""


def test_an_operator_takes_over_replies_and_hands_back_to_the_agent(site, graph):
    from playwright.sync_api import expect, sync_playwright

    customer_writes(site, "wamid.T1", "My parcel is lost. I want to talk to a human")
    s.wait_until(lambda: len(sent_texts(graph)) == 1, 30, "the holding message")
    assert "a person from our team" in sent_texts(graph)[0]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=NO_NETWORK)
        try:
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
            page.wait_for_function("!document.getElementById('reply-text').dataset.old")  # the new box is in
            page.keyboard.type(" More.")
            page.wait_for_function("!document.querySelector('.htmx-settling')")  # the swap has settled
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
        finally:
            browser.close()
