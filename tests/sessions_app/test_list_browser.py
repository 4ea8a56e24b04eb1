"""The session list, keyboard shortcuts, roles and small screens in a real browser (Debian's chromium via
Playwright against daphne) on demo data (``manage.py chatflow_demo``, as ``dev.py serve`` makes it; 60
sessions: more than a page)."""

from __future__ import annotations

import re

import pytest

from tests.processes import REPO

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = REPO / "test-artifacts"
PASSWORD = "correct horse battery staple 42"
SEED = f"""
from django.contrib.auth.models import Group, User
from django.core.management import call_command
call_command("chatflow_demo", seed=7, sessions=60)
for name, group, staff in (("olga.operator", "Operators", True), ("victor.viewer", "Viewers", True),
                           ("carla.customer", None, False)):
    u = User.objects.create_user(name, password={PASSWORD!r}, is_staff=staff)
    if group:
        u.groups.add(Group.objects.get(name=group))
"""


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    """daphne on demo data (``chatflow_demo``'s 60 sessions, as ``dev.py serve`` makes them) and three users."""
    with sites.running(tmp_path_factory.mktemp("list-site"), SEED, seed_variables={"CHATFLOW_ENGINE": "demo"}) as base:
        yield base


@pytest.fixture
def browser(chromium):
    with chromium.fresh() as b:
        yield b


def open_as(browser, site: str, username: str, width: int = 1366, height: int = 900):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(20_000)
    page.goto(f"{site}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_load_state()
    return page


def visible_rows(page) -> int:
    return page.evaluate("""() => [...document.querySelectorAll('#session-rows tr[data-row]')].filter(r => {
        const b = r.getBoundingClientRect(); return b.top >= 0 && b.bottom <= window.innerHeight; }).length""")


def test_the_list_shows_25_one_line_rows_at_1366x900(browser, site):
    page = open_as(browser, site, "olga.operator")
    page.wait_for_url(f"{site}/sessions/")
    assert visible_rows(page) >= 25
    heights = page.evaluate("[...document.querySelectorAll('#session-rows tr')].map(r => r.offsetHeight)")
    assert max(heights) == min(heights)  # one line each
    assert page.locator("#session-rows .customer").count() >= 25
    assert page.locator("#session-rows time[title$=' UTC']").count() >= 50
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "list-dense.png"))


def test_sorting_filtering_and_pages(browser, site):
    from playwright.sync_api import expect

    page = open_as(browser, site, "olga.operator")
    page.select_option("#f-channel", "telegram")
    expect(page.locator(".result-count")).not_to_have_text("60 sessions")
    assert "channel=telegram" in page.url
    page.click("th.sid a")
    page.wait_for_url("**sort=session**")
    assert "channel=telegram" in page.url
    ids = page.locator("#session-rows td.sid .id").all_inner_texts()
    assert ids == sorted(ids) and all(i.startswith("tg:") for i in ids)
    page.locator("#f-q").press_sequentially("tg:")  # keyup: search as you type
    page.wait_for_url("**q=tg**")  # search as you type, the URL kept shareable
    expect(page.locator("#session-rows tr[data-row]")).to_have_count(len(ids))
    assert "sort=session" in page.url and "channel=telegram" in page.url

    page.goto(f"{site}/sessions/?updated_from=yesterday")
    expect(page.locator("#filter-errors")).to_contain_text("is not a date")


def test_previous_and_next_pages_in_the_browser(browser, site):
    from playwright.sync_api import expect

    page = open_as(browser, site, "olga.operator")
    page.goto(f"{site}/sessions/?sort=session")
    expect(page.locator(".result-count")).to_have_text("60 sessions")
    first = page.locator("#session-rows td.sid .id").all_inner_texts()
    assert len(first) == 50 and page.locator("text=‹ Previous page").count() == 0
    page.click("text=Next page ›")
    page.wait_for_url("**after=**")
    rows = page.locator("#session-rows td.sid .id")
    expect(rows).to_have_count(10)
    second = rows.all_inner_texts()
    assert second[0] > first[-1] and "sort=session" in page.url
    page.click("text=‹ Previous page")
    page.wait_for_url("**before=**")
    expect(rows).to_have_count(50)
    assert rows.all_inner_texts() == first


def test_keyboard_shortcuts(browser, site):
    from playwright.sync_api import expect

    page = open_as(browser, site, "olga.operator")
    page.keyboard.press("/")
    expect(page.locator("#f-q")).to_be_focused()
    page.keyboard.type("j")  # typing in the search box is not a shortcut
    expect(page.locator("#f-q")).to_have_value("j")
    page.wait_for_url("**q=j**")  # the list searched as typed…
    page.fill("#f-q", "")
    page.wait_for_url(re.compile(r"[?&]q=(&|$)"))  # …and again when emptied: j/k below move through that list
    page.keyboard.press("Escape")
    page.evaluate("document.activeElement.blur()")
    links = page.locator("#session-rows td.sid a")
    expect(links).to_have_count(50)
    page.keyboard.press("j")
    expect(links.nth(0)).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    expect(links.nth(1)).to_be_focused()
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"
    target = links.nth(1).get_attribute("href")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**{target}")
    page.keyboard.press("?")
    dialog = page.locator("dialog#shortcuts")
    expect(dialog).to_be_visible()
    assert page.evaluate("document.getElementById('shortcuts').open")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.keyboard.press("g")
    page.keyboard.press("s")
    page.wait_for_url(f"{site}/sessions/")


def test_a_viewer_sees_no_link_that_answers_403(browser, site):
    page = open_as(browser, site, "victor.viewer")
    hrefs = page.eval_on_selector_all("header nav a", "els => els.map(e => e.getAttribute('href'))")
    assert "/chat/" not in hrefs and hrefs
    for href in hrefs:
        response = page.goto(f"{site}{href}")
        assert response.status == 200, href
        page.go_back()


def test_a_non_staff_user_can_log_out_from_the_403_page(browser, site):
    page = open_as(browser, site, "carla.customer")
    response = page.goto(f"{site}/sessions/")
    assert response.status == 403
    assert page.locator("h1").inner_text() == "Not allowed (403)"
    page.click("main form[action='/accounts/logout/'] button")
    page.wait_for_url("**/accounts/login/**")
    assert page.goto(f"{site}/accounts/logout/").status == 200


def test_404_and_favicon(browser, site):
    page = open_as(browser, site, "olga.operator")
    response = page.goto(f"{site}/sessions/no-such-session/")
    assert response.status == 404 and page.locator("h1").inner_text().lower().endswith("not found (404)")
    assert page.locator("header.topbar").count() == 1
    assert page.goto(f"{site}/favicon.ico").status == 200


def test_log_out_is_reachable_at_390px(browser, site):
    page = open_as(browser, site, "olga.operator", width=390, height=844)
    button = page.locator("header form.logout button")
    assert button.is_visible()
    box = button.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    admin = page.locator("header nav a", has_text="Admin")
    admin_box = admin.bounding_box()
    assert admin.is_visible() and admin_box["x"] + admin_box["width"] <= 390
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # every session id is shown whole (wrapped, not cut with an ellipsis), so rows can be told apart
    assert page.evaluate("[...document.querySelectorAll('td.sid')].every(td => td.scrollWidth <= td.clientWidth)")
    page.screenshot(path=str(ARTIFACTS / "list-390.png"))
    button.click()
    page.wait_for_url("**/accounts/login/**")
