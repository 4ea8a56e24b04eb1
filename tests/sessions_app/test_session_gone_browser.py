"""A session page whose session no longer exists, in a real browser (Debian's chromium via Playwright,
against daphne): Back after deleting it, and a copy of the page shown after the delete (as a browser's
cache would show it), both say it was deleted and offer no action, instead of looking live and
"reconnecting…" for ever."""

from __future__ import annotations

import sqlite3

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RECONNECTING = "reconnecting"
#: A page fulfilled by the test (not by the server) has no address space of its own: chromium would then
#: block its websocket to the loopback server as a public page's request to the local network.
LOCAL_PAGES = ["--disable-features=LocalNetworkAccessChecks"]


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    directory = tmp_path_factory.mktemp("session-gone")
    with running_site(sites, directory) as base:
        yield base, directory / "site.db"


@pytest.fixture
def page(site, chromium):
    base, _db = site
    with chromium.fresh(LOCAL_PAGES) as browser:
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.set_default_timeout(20_000)
        log_in(page, base)
        yield page


def test_back_to_a_session_deleted_from_its_page_shows_it_is_gone(site, page):
    from playwright.sync_api import expect

    base, _db = site
    page.goto(f"{base}/sessions/web-0100/")
    expect(page.locator("#live-status")).to_have_text("Live updates on.")
    page.click("text=Delete session…")
    page.locator("#delete-confirm button.danger").click()
    page.wait_for_url(f"{base}/sessions/")

    page.go_back()

    expect(page.locator("main")).to_contain_text("does not exist. It was deleted by")
    assert page.locator("#session-panel button:enabled").count() == 0
    assert RECONNECTING not in page.locator("main").inner_text()


def test_a_stale_copy_of_a_deleted_sessions_page_says_it_was_deleted_and_disables_its_actions(site, page):
    """The page as the browser kept it (served here from a copy taken before the delete): its websocket is
    refused as the session is unknown (4404), and the page says so instead of "reconnecting…"."""
    from playwright.sync_api import expect

    base, db = site
    url = f"{base}/sessions/web-998877/"
    stale = page.goto(url).text()
    with sqlite3.connect(db) as conn:  # deleted by another process: no live notice reaches this page
        conn.execute("DELETE FROM chatflow_messages WHERE session_id = 'web-998877'")
        conn.execute("DELETE FROM chatflow_sessions WHERE session_id = 'web-998877'")
    page.route(url, lambda route: route.fulfill(status=200, content_type="text/html; charset=utf-8", body=stale))

    page.goto(url)

    expect(page.locator("#live-status")).to_contain_text("Deleted: this session no longer exists.")
    expect(page.locator("#session-panel button", has_text="Force handoff")).to_be_disabled()
    expect(page.locator("#h-agent")).to_be_disabled()
    assert RECONNECTING not in page.locator("#live-status").inner_text()
