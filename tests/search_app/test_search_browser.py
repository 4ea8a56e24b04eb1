"""Search in a real browser (Debian's chromium via Playwright, against daphne): a hit in the session list opens
the session at its turn, on an older page, with the message highlighted and in view; *Find in session* lists the
matches of every page and jumps to one."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site
from tests.sessions_app.test_session_page_browser import in_viewport

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SEED = """
msgs = []
for i in range(1, 61):
    msgs += [cv.user(f"question {i}" + (" about the <b>quokkarefund</b> of order QX-98123" if i == 7 else "")),
             cv.model(f"answer {i}")]
cv.store("long-60", msgs)
"""


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("search"), seed=SEED) as base:
        yield base


@pytest.fixture
def page(site, chromium):
    with chromium.fresh() as browser:
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        context.set_default_timeout(20_000)
        page = context.new_page()
        log_in(page, site)
        yield page


def test_a_hit_opens_the_session_at_its_turn_with_the_message_highlighted(site, page):
    from playwright.sync_api import expect

    page.goto(f"{site}/sessions/?q=quokkarefund")
    hit = page.locator("tr.search-hits a.hit-turn")
    expect(hit).to_have_text("Turn 7")
    expect(page.locator("tr.search-hits mark")).to_have_text("quokkarefund")
    expect(page.locator("tr.search-hits .snippet")).to_contain_text("<b>quokkarefund</b>")  # shown as text
    hit.click()
    expect(page.locator(".search-hit")).to_have_count(1)
    expect(page.locator(".search-hit")).to_contain_text("<b>quokkarefund</b> of order QX-98123")
    assert in_viewport(page, ".search-hit")


def test_find_in_session_lists_every_pages_matches_and_jumps(site, page):
    from playwright.sync_api import expect

    page.goto(f"{site}/sessions/long-60/")  # the newest page: turn 7 is two pages back
    page.fill("#find-q", "QX-98123")
    page.press("#find-q", "Enter")
    link = page.locator("#find-results a.hit-turn")
    expect(link).to_have_text("Turn 7")
    link.click()
    expect(page.locator(".search-hit")).to_contain_text("<b>quokkarefund</b> of order QX-98123")
    assert in_viewport(page, ".search-hit")
