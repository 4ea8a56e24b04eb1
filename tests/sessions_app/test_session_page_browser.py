"""The session page in a real browser (Debian's chromium via Playwright, against daphne): the conversation
opens at its end, long text stays bounded, exports stay out of the turns, the rollback preview is a modal
dialog in view that takes and returns focus, and a second operator's handoff and delete reach the first
operator's page (the handoff select follows the active agent; after the delete the actions are disabled
and a click does nothing harmful, never Django's debug page). Screenshots go to test-artifacts/."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import ARTIFACTS, log_in, running_site

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SEED = """
from sessions_app.actions import audit
cv.store("long-20", [m for i in range(1, 21) for m in (cv.user(f"question {i}"), cv.model(f"answer {i}"))])
big = "\\n".join("line %d of a very long pasted log, " % i + "x" * 80 for i in range(1100))  # ~100 KB
cv.store("big", [cv.user("please read my log"), cv.model(big), cv.user("and?"), cv.model("done")])
audit(u, "export", "big", {}, {"via": "session", "format": "csv", "redact": ""})
"""
DEBUG_404 = "Using the URLconf"  # Django's technical 404 page


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("session-page"), seed=SEED) as base:
        yield base


@pytest.fixture
def browser(site, chromium):
    with chromium.fresh() as browser:
        yield browser


def new_page(browser, site, width=1366, height=900):
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    log_in(page, site)
    return page


def in_viewport(page, selector: str) -> bool:
    """The element's box inside the window (to a pixel: scrollIntoView may leave a fraction outside)."""
    return page.evaluate("""s => { const r = document.querySelector(s).getBoundingClientRect();
        return r.top >= -1 && r.left >= 0 && r.bottom <= innerHeight + 1 && r.right <= innerWidth && r.height > 0; }""",
                         selector)


def test_the_conversation_opens_at_its_end_and_long_text_stays_bounded(browser, site):
    from playwright.sync_api import expect

    page = new_page(browser, site)
    page.goto(f"{site}/sessions/long-20/")
    expect(page.locator("#turns details.turn")).to_have_count(20)
    expect(page.locator("#turns details.turn").last).to_contain_text("answer 20")  # newest at the bottom
    page.wait_for_function("() => scrollY > 0")
    assert in_viewport(page, "#turn-20 .msg.model")
    assert page.locator("#turn-20 .msg.model .author").text_content() == "Support"  # labelled with its agent
    assert page.locator("#turn-20 .msg.model time").get_attribute("datetime")

    page.goto(f"{site}/sessions/big/")
    expect(page.locator("#turns details.turn")).to_have_count(2)
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 3000, height  # the ~100 KB message is collapsed
    page.locator("#turn-1 details.more > summary").click()  # "show all" opens it
    assert page.evaluate("document.documentElement.scrollHeight") > height
    page.locator("#turn-1 details.more > summary").click()

    # Exports are listed in the inspector, not inside a turn.
    expect(page.locator(".export .chips")).to_contain_text("csv")
    assert page.locator("#turns details.turn", has_text="Export transcript").count() == 0

    page.fill("#h-reason", "y" * 500)  # a 500-character unbroken reason
    page.click("text=Force handoff")
    expect(page.locator("#session-panel .note")).to_contain_text("Handed off from Support to")
    expect(page.locator("#turns .event").last).to_contain_text("y" * 100)
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")

    page.fill("#find-q", "and?")  # find in session
    expect(page.locator("#turns .msg.find-hit")).to_have_count(1)
    expect(page.locator("#find-count")).to_contain_text("1 of")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "session-detail.png"))
    assert page.dialogs == []


def test_on_a_phone_the_page_opens_at_the_newest_message_not_the_inspector_below_it(browser, site):
    page = new_page(browser, site, width=390, height=480)  # shorter than the inspector stacked below
    page.goto(f"{site}/sessions/long-20/")
    page.wait_for_function("() => scrollY > 0")
    assert in_viewport(page, "#turn-20 .msg.model")


def test_the_rollback_preview_from_the_oldest_turn_is_a_modal_dialog_in_view(browser, site):
    from playwright.sync_api import expect

    page = new_page(browser, site)
    page.goto(f"{site}/sessions/long-20/")
    link = page.locator("#turn-1-actions a")
    link.scroll_into_view_if_needed()
    link.focus()
    page.keyboard.press("Enter")
    dialog = page.locator("#action-dialog")
    expect(dialog.locator("#rollback-preview")).to_contain_text("Roll back to the end of turn 1 of 20")
    assert page.evaluate("document.getElementById('action-dialog').matches(':modal')")
    assert in_viewport(page, "#action-dialog")
    assert page.evaluate("document.getElementById('action-dialog').contains(document.activeElement)")
    for _ in range(12):  # focus stays in the dialog
        page.keyboard.press("Tab")
        assert page.evaluate("document.getElementById('action-dialog').contains(document.activeElement)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "session-rollback-dialog.png"))
    page.keyboard.press("Escape")
    expect(dialog).not_to_have_attribute("open", "")
    assert page.evaluate("document.activeElement.closest('#turn-1-actions') !== null")  # focus returned

    page.goto(f"{site}/actions/rollback-preview/long-20/?turn=1")  # without htmx: the whole page, dialog open
    expect(page.locator("#action-dialog #rollback-preview")).to_be_visible()
    assert page.dialogs == []


def test_another_operators_handoff_and_delete_reach_the_page(browser, site):
    from playwright.sync_api import expect

    first, second = new_page(browser, site), new_page(browser, site)
    first.goto(f"{site}/sessions/web-998877/")
    expect(first.locator("#live-status")).to_have_text("Live updates on.")
    options = first.locator("#h-agent option")
    expect(options).to_have_text(["Support", "Tech"])  # Billing is active

    second.goto(f"{site}/sessions/web-998877/")
    second.select_option("#h-agent", "Tech")
    second.click("text=Force handoff")
    expect(second.locator("#session-panel .note")).to_contain_text("Handed off from Billing to Tech.")
    expect(first.locator("#session-facts dd strong").first).to_have_text("Tech")
    expect(options).to_have_text(["Support", "Billing"])  # the now-active agent is not offered

    second.click("text=Delete session…")
    second.locator("#delete-confirm button.danger").click()
    second.wait_for_url(f"{site}/sessions/")

    expect(first.locator("#live-status")).to_contain_text("Deleted:")
    expect(first.locator("#h-agent")).to_be_disabled()
    expect(first.locator("#session-panel button", has_text="Force handoff")).to_be_disabled()
    expect(first.locator("#h-reason")).to_be_disabled()
    for control in first.locator("#inspector button[name=format], #inspector input[name=redact]").all():
        expect(control).to_be_disabled()  # the transcript is gone too
    url = first.url
    # A click on a turn's action link or on "Delete session…" sends nothing and does not navigate: asked
    # of the click events themselves (htmx sends synchronously in the click), not by waiting a while.
    clicks = first.evaluate("""() => {
        let sent = 0;
        document.addEventListener("htmx:beforeSend", () => { sent += 1; });
        return [...document.querySelectorAll("#turn-1-actions a, #session-panel a.danger")].map((link) => {
            const before = sent;
            const click = new MouseEvent("click", {bubbles: true, cancelable: true});
            link.dispatchEvent(click);
            return {link: link.textContent.trim(), prevented: click.defaultPrevented, sent: sent - before};
        });
    }""")
    assert len(clicks) >= 2 and all(c["prevented"] and c["sent"] == 0 for c in clicks), clicks
    assert first.url == url
    assert not first.evaluate("document.getElementById('action-dialog').open")
    assert DEBUG_404 not in first.content()

    first.goto(f"{site}/actions/rollback-preview/web-998877/?turn=1")  # the address, opened again
    expect(first.locator("h1")).to_have_text("Session not found (404)")
    assert DEBUG_404 not in first.content()
    assert first.dialogs == [] and second.dialogs == []
