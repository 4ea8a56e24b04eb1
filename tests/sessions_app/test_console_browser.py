"""The console in a real browser: Debian's chromium driven by Playwright against daphne serving the site.

Log in, filter the list, open a session, roll back with a preview, force a handoff, delete; XSS payloads
stored in a session do not run (no dialog, the page title is unchanged). Screenshots of the list and the
detail are saved under test-artifacts/.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import pytest

from tests.browser_sites import Sites
from tests.processes import REPO

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = REPO / "test-artifacts"
PASSWORD = "correct horse battery staple 42"

SEED = f"""
from django.contrib.auth.models import Group, User
from tests.sessions_app import conversations as cv
u = User.objects.create_user("olga.operator", password={PASSWORD!r}, is_staff=True)
u.groups.add(Group.objects.get(name="Operators"))
cv.store("tg:998877", cv.support_story(), agent="Billing", metadata={{"channel": "telegram"}})
cv.store("+15550100", [cv.user("hello"), cv.model("hi")], metadata={{"channel": "whatsapp"}})
cv.store("web-998877", cv.support_story(), agent="Billing", metadata={{"channel": "web"}})
cv.store("web-0100", [cv.user("hello"), cv.model("hi")], metadata={{"channel": "web"}})
payloads = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[x](javascript:alert(1))",
            "<iframe srcdoc=\\"<script>parent.document.title='pwned'</script>\\">"]
story = []
for p in payloads:
    story += [cv.user(p), cv.model(None, [cv.call("c" + str(len(story)), "check_order_status", order_id=p)]),
              cv.results(cv.result("c" + str(len(story)), "check_order_status", {{"note": p}})), cv.model(p)]
cv.store("xss", story, metadata={{"channel": payloads[0], payloads[1]: payloads[3]}})
"""


def running_site(sites: Sites, directory: Path, seed: str = "",
                 **variables: str) -> contextlib.AbstractContextManager[str]:
    """daphne serving the site on a copy of the database ``SEED`` (and ``seed``: more Python for the shell)
    makes, in ``directory``; ``variables`` added to its environment, e.g. ``REDIS_URL``. Yields its base URL."""
    return sites.running(directory, SEED + seed, **variables)


@pytest.fixture
def site(sites, tmp_path):
    with running_site(sites, tmp_path) as base:
        yield base


@pytest.fixture
def page(site, chromium):
    with chromium.fresh() as browser:
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.dialogs = []
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.set_default_timeout(20_000)
        yield page


def log_in(page, site: str) -> None:
    page.goto(f"{site}/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", "olga.operator")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site}/sessions/")


def focus_by_keyboard(page, text: str, presses: int = 60) -> None:
    """Tab through the page until the link or button labelled ``text`` has the focus (keyboard reachable)."""
    page.evaluate("document.activeElement && document.activeElement.blur()")
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == text:
            return
    raise AssertionError(f"{text!r} is not reachable with the keyboard")


def test_an_operator_works_through_the_console_in_a_browser(page, site, tmp_path):
    from playwright.sync_api import expect

    log_in(page, site)
    rows = page.locator("#session-table tbody tr[data-row]")  # (a search adds a row of hits under each)
    expect(rows).to_have_count(5)

    # Typed as a person types: the list asks once, after the last key (Enter would also submit the form, and the
    # second answer could replace the rows under the click below).
    page.locator("#f-q").press_sequentially("tg:998877")
    page.wait_for_url("**q=tg%3A998877**")  # htmx pushed the filtered URL
    expect(rows).to_have_count(1)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console-list.png"), full_page=True)

    page.click("text=tg:998877")
    page.wait_for_url(f"{site}/sessions/tg:998877/")
    expect(page.locator("details.turn")).to_have_count(3)
    page.screenshot(path=str(ARTIFACTS / "console-detail.png"), full_page=True)

    focus_by_keyboard(page, "Roll back to the end of turn 1…")
    page.keyboard.press("Enter")
    preview = page.locator("#rollback-preview")
    expect(preview).to_contain_text("Messages removed: 10")
    expect(preview).to_contain_text("Active agent afterwards: Support")
    preview.locator("button.danger").click()
    expect(page.locator("#session-panel .note")).to_contain_text("Rolled back to turn 1: 10 messages removed")
    expect(page.locator("details.turn")).to_have_count(1)

    page.select_option("#h-agent", "Tech")
    page.fill("#h-reason", "screen flickers")
    with sqlite3.connect(tmp_path / "site.db") as db:  # a bot process starts a turn on the session
        db.execute("INSERT INTO chatflow_session_leases (session_id, owner, expires_at) "
                   "VALUES ('tg:998877', 'bot:1:x', ?)", (time.time() + 60,))
    page.click("text=Force handoff")
    expect(page.locator("#handoff-error [role=alert]")).to_contain_text("A turn is running on session 'tg:998877'")
    expect(page.locator("#session-panel dd strong").first).to_have_text("Support")
    with sqlite3.connect(tmp_path / "site.db") as db:  # the turn ends
        db.execute("DELETE FROM chatflow_session_leases")
    page.click("text=Force handoff")
    expect(page.locator("#session-panel .note")).to_contain_text("Handed off from Support to Tech.")
    expect(page.locator(".event").last).to_contain_text("screen flickers")

    page.click("text=Delete session…")
    expect(page.locator("#delete-confirm")).to_contain_text("5 messages in 1 turn")
    page.locator("#delete-confirm button.danger").click()
    page.wait_for_url(f"{site}/sessions/")
    expect(page.locator(".flash")).to_contain_text("Deleted session tg:998877.")
    expect(page.locator("#session-table >> text=tg:998877")).to_have_count(0)

    page.goto(f"{site}/audit/")
    expect(page.locator("#audit-table tbody tr")).to_have_count(3)
    assert page.dialogs == []


def test_stored_xss_payloads_do_not_run_in_the_browser(page, site):
    from playwright.sync_api import expect

    log_in(page, site)
    for path in ("/sessions/", "/sessions/xss/", "/sessions/xss/?order=oldest", "/actions/rollback-preview/xss/?turn=1",
                 "/audit/"):
        page.goto(f"{site}{path}")
        page.wait_for_load_state("networkidle")
        assert "pwned" not in page.title()
        assert page.locator("iframe, img").count() == 0
    page.goto(f"{site}/sessions/xss/")
    expect(page.locator("#history")).to_contain_text("<script>alert(1)</script>")
    expect(page.locator("#history")).to_contain_text("[x](javascript:alert(1))")
    expect(page.locator(".metadata")).to_contain_text("<img src=x onerror=alert(1)>")
    assert page.title() == "Session xss · Chatflow Console"
    assert page.evaluate("document.querySelectorAll('a[href^=\"javascript\"]').length") == 0
    assert page.dialogs == []
