"""The agents page's "would this escalate?" tester in a real browser (Debian's chromium via Playwright, against
daphne), used from the keyboard only: the answer is swapped in by htmx, a refusal explained in the page."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("escalation-tester")) as base:
        yield base


def test_an_operator_checks_sentences_from_the_keyboard(site, chromium):
    from playwright.sync_api import expect

    with chromium.fresh() as browser:
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.set_default_timeout(20_000)
        log_in(page, site)
        page.goto(f"{site}/agents/")
        box = page.get_by_label("Would this escalate? A customer's message")
        box.focus()
        page.keyboard.type("My travel agent booked order A-1001, where is it?")
        page.keyboard.press("Tab")
        expect(page.get_by_role("button", name="Check")).to_be_focused()
        page.keyboard.press("Enter")
        result = page.locator("#escalation-result")
        expect(result).to_contain_text("Does not escalate")
        box.fill("quero falar com um atendente")
        box.focus()
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")
        expect(result).to_contain_text("Escalates")
        expect(result.locator("q")).to_have_text("falar com um atendente")
        assert page.url == f"{site}/agents/"  # swapped in, not a page load
