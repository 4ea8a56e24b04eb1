"""Logging out in one tab stops the live updates of the others (Debian's chromium via Playwright, against
daphne on the in-memory channel layer): the session page, the list and the live chat each say why, and none
of them reconnects."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site
from tests.sessions_app.test_live_browser import COUNT_SOCKETS, NO_NETWORK

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("socket-watch-site")) as base:
        yield base


def test_logging_out_in_another_tab_stops_every_open_page(site, chromium):
    with chromium.fresh(NO_NETWORK) as browser:
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        context.set_default_timeout(30_000)  # (the sockets check their login every few seconds)
        context.add_init_script(COUNT_SOCKETS)
        session, listing, chat = context.new_page(), context.new_page(), context.new_page()
        log_in(session, site)
        session.goto(f"{site}/sessions/web-998877/")
        session.locator("#live-status", has_text="Live updates on.").wait_for()
        listing.goto(f"{site}/sessions/")
        listing.wait_for_function("() => window.__sockets.open === 1")  # (a function: no eval under the CSP)
        chat.goto(f"{site}/chat/?session=web-998877")
        chat.locator("#chat-status", has_text="Connected.").wait_for()

        tab = context.new_page()
        tab.goto(f"{site}/accounts/logout/")
        tab.get_by_role("button", name="Log out", exact=True).click()
        tab.wait_for_url(f"{site}/accounts/login/")

        session.locator("#live-status", has_text="Live updates stopped: you are logged out.").wait_for()
        listing.locator("#live-stopped", has_text="Live updates stopped: you are logged out.").wait_for()
        chat.locator("#chat-status", has_text="Disconnected: you are logged out.").wait_for()
        for page in (session, listing, chat):
            assert page.evaluate("window.__sockets") == {"open": 1, "close": 1}  # closed, not reconnecting
