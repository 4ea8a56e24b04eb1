"""Every screen of the site checked with axe-core in a real browser (Debian's chromium via Playwright,
against daphne), in the light and the dark colour scheme: no serious or critical violation. Each check
also saves a screenshot to ``test-artifacts/screens/<screen>-<scheme>.png`` for review, and axe's
findings (violations of every impact, and what it could not decide) beside it as ``.axe.json``.

The site sends its Content-Security-Policy (DEBUG on as here too), so every screen is also checked to work
under it: a violation the browser reports (``securitypolicyviolation``) or an uncaught error on the page
fails the screen. axe is injected through the browser's own channel (an init script), which the policy does
not govern, never as an inline script the page would have to allow.

axe-core is vendored (``tests/vendor/axe-core/``: ``axe.min.js`` of the npm package, with its MPL-2.0
licence). A new screen is one more :data:`SCREENS` entry: its path and, if it needs one, what to do
before the check (open a dialog, wait for the websocket).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import REPO
from tests.sessions_app.test_console_browser import ARTIFACTS, PASSWORD, running_site
from tests.sessions_app.test_live_browser import NO_NETWORK

pytestmark = [pytest.mark.slow, pytest.mark.browser]

AXE = REPO / "tests" / "vendor" / "axe-core" / "axe.min.js"
SCREENS_DIR = ARTIFACTS / "screens"
#: What fails the check; axe's "moderate" and "minor" findings are listed in the failure message only.
BLOCKING = ("serious", "critical")

#: Data for the webhook screens: a failed delivery (the attention page) and a done one (the ledger).
DELIVERIES = """
from django.utils import timezone
from webhooks_app.models import InboundDelivery as D
D.objects.create(provider="whatsapp", provider_message_id="wamid.A11Y1", claim_key="wamid.A11Y1",
                 session_id="+15550100", text="hello", status="failed", attempts=3, error="ProviderError: 503",
                 token="t1", finished_at=timezone.now())
D.objects.create(provider="whatsapp", provider_message_id="wamid.A11Y2", claim_key="wamid.A11Y2",
                 session_id="+15550100", text="hi again", status="done", attempts=1, answer="hi",
                 reply_status="sent", token="t2", finished_at=timezone.now())
"""

#: Human takeover states: a session waiting for a person, one the seeded operator answers (a sent and a
#: failed reply, a held customer message, a private note), for the session page and the list's badges.
TAKEOVER = """
from django.contrib.auth.models import User
from tests.takeover_app import page_states
olga = User.objects.get(username="olga.operator")
page_states.waiting("+15550133", reason="asked for a human")
page_states.human("+15550144", olga, unread=1, note="Refund approved; confirm the amount.")
page_states.operator_reply("+15550144", olga, "Your refund is on its way.", status="sent")
page_states.operator_reply("+15550144", olga, "Anything else?", status="failed", error="ProviderError: 503")
"""

#: The dashboard's data: demo turns played through the site's Runner over the last 20 hours, a failed
#: turn's record, and the queue samples workers write.
DASHBOARD = """
from datetime import timedelta
from django.core.management import call_command
from django.utils import timezone
from webhooks_app.models import QueueSample
from turns_app.models import TurnRecord
call_command("chatflow_demo", sessions=8, seed=18, spread_hours=20, verbosity=0)
TurnRecord.objects.create(session_id="web-0100", owner="a11y:1:x:", status="failed", error="RuntimeError: down",
                          started_at=timezone.now() - timedelta(hours=3), duration_ms=40.0)
for h in range(0, 24, 2):
    QueueSample.objects.create(at=timezone.now() - timedelta(hours=h), queued=h % 5, running=h % 3)
"""


def open_tables(page) -> None:
    for summary in page.locator("details.as-table summary").all():
        summary.click()


def open_handback_dialog(page) -> None:
    page.get_by_text("Hand back to an agent…").click()
    page.locator("#handback-dialog").wait_for()


def open_rollback_preview(page) -> None:
    page.get_by_text("Roll back to the end of turn 1", exact=False).first.click()
    page.locator("#rollback-preview").wait_for()


def chat_connected(page) -> None:
    page.locator("#chat-status", has_text="Connected.").wait_for()


@dataclass(frozen=True)
class Screen:
    name: str
    path: str
    logged_in: bool = True
    width: int = 1366  # the window's width in CSS pixels (390: a phone)
    prepare: Callable[..., None] | None = None
    full_page: bool = True  # False: the window as a reader sees it (the chat opens at its newest message)


SCREENS = [
    Screen("login", "/accounts/login/", logged_in=False),
    Screen("session-list", "/sessions/"),
    Screen("session-detail", "/sessions/web-998877/"),
    Screen("rollback-dialog", "/sessions/web-998877/", prepare=open_rollback_preview),
    Screen("live-chat", "/chat/?session=web-998877", prepare=chat_connected, full_page=False),
    Screen("live-chat-new", "/chat/?session=web-a11y-new", prepare=chat_connected, full_page=False),
    Screen("live-chat-phone", "/chat/?session=web-998877", prepare=chat_connected, full_page=False, width=390),
    Screen("agents", "/agents/"),
    Screen("audit-log", "/audit/"),
    Screen("webhook-ledger", "/sessions/%2B15550100/"),  # the session page shows its dedup ledger
    Screen("takeover-waiting", "/sessions/%2B15550133/"),
    Screen("takeover-human", "/sessions/%2B15550144/"),
    Screen("takeover-human-phone", "/sessions/%2B15550144/", width=390),
    Screen("handback-dialog", "/sessions/%2B15550144/", prepare=open_handback_dialog),
    Screen("attention", "/webhooks/attention/"),
    Screen("health", "/health/"),  # the failed delivery and the failed operator reply above
    Screen("health-phone", "/health/", width=390),
    Screen("dashboard", "/dashboard/"),
    Screen("dashboard-tables", "/dashboard/?range=7d", prepare=open_tables),
    Screen("dashboard-phone", "/dashboard/?range=30d", width=390),
    Screen("docs-operator-guide", "/docs/operator-guide/"),
    Screen("docs-phone", "/docs/operations/", width=390),
    Screen("admin-index", "/admin/"),
]


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("a11y-site"), seed=DELIVERIES + TAKEOVER + DASHBOARD) as base:
        yield base


@pytest.fixture(scope="module")
def browser(site, chromium):
    with chromium.fresh(NO_NETWORK) as browser:
        yield browser


@pytest.fixture(scope="module")
def login_state(browser, site, tmp_path_factory) -> Path:
    """The storage state (session cookie) of the seeded operator, logged in once for the module."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{site}/accounts/login/")
    page.fill("#id_username", "olga.operator")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site}/sessions/")
    state = tmp_path_factory.mktemp("a11y-login") / "state.json"
    context.storage_state(path=str(state))
    context.close()
    return state


#: Records what the page's Content-Security-Policy blocked (run before the page's own scripts).
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " at " +
                              e.sourceFile + ":" + e.lineNumber + " " + (e.sample || ""));
});
"""


def watch_the_policy(page) -> list[str]:
    """From now on, ``page``'s uncaught errors are listed in the returned list, and axe is on every document."""
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(f"uncaught: {err}"))
    page.add_init_script(RECORD_VIOLATIONS)
    page.add_init_script(path=str(AXE))
    return errors


def policy_problems(page, errors: list[str]) -> list[str]:
    """The uncaught errors and the policy's violations on the page so far."""
    return [*errors, *page.evaluate("window.__cspViolations || []")]


def axe_results(page) -> dict:
    """axe-core's results on the page as it is now (every rule axe runs by default): ``violations`` and
    ``incomplete`` (what axe could not decide, e.g. text over a gradient), each a list of rule dicts."""
    return page.evaluate("""async () => {
        const r = await axe.run(document, {resultTypes: ['violations', 'incomplete']});
        return {violations: r.violations, incomplete: r.incomplete};
    }""")


def describe(violations: list[dict]) -> str:
    return json.dumps([{"rule": v["id"], "impact": v["impact"], "help": v["help"],
                        "nodes": [{"target": n["target"], "summary": n.get("failureSummary", "")[:300]}
                                  for n in v["nodes"][:4]], "count": len(v["nodes"])}
                       for v in violations], indent=1)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("screen", SCREENS, ids=[s.name for s in SCREENS])
def test_the_screen_has_no_serious_accessibility_violation(browser, site, login_state, screen, scheme):
    context = browser.new_context(viewport={"width": screen.width, "height": 900},
                                  storage_state=str(login_state) if screen.logged_in else None)
    context.set_default_timeout(30_000)
    try:
        page = context.new_page()
        errors = watch_the_policy(page)
        page.emulate_media(color_scheme=scheme)
        answer = page.goto(f"{site}{screen.path}")
        assert answer is not None and answer.status == 200, (screen.path, answer and answer.status)
        assert "script-src 'self'" in answer.headers.get("content-security-policy", "")
        if screen.prepare:
            screen.prepare(page)
        page.wait_for_load_state("networkidle")
        SCREENS_DIR.mkdir(parents=True, exist_ok=True)
        if screen.full_page:
            page.evaluate("window.scrollTo(0, 0)")  # sticky bars then sit where they belong in the picture
        page.screenshot(path=str(SCREENS_DIR / f"{screen.name}-{scheme}.png"), full_page=screen.full_page)
        results = axe_results(page)
        problems = policy_problems(page, errors)
    finally:
        context.close()
    (SCREENS_DIR / f"{screen.name}-{scheme}.axe.json").write_text(json.dumps(
        {kind: json.loads(describe(results[kind])) for kind in ("violations", "incomplete")}, indent=1))
    assert problems == [], f"{screen.name} ({scheme}) under the Content-Security-Policy"
    violations = results["violations"]
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    assert not blocking, f"{screen.name} ({scheme}): {describe(blocking)}\nothers: {describe(violations)}"


def tab_to(page, text: str, limit: int = 60) -> None:
    """Press Tab until the focused element's text starts with ``text`` (at most ``limit`` presses)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()").startswith(text):
            return
    raise AssertionError(f"{text!r} is not reachable with Tab")


def test_the_dashboard_is_reached_and_read_with_the_keyboard(browser, site, login_state):
    context = browser.new_context(viewport={"width": 1366, "height": 900}, storage_state=str(login_state))
    context.set_default_timeout(30_000)
    try:
        page = context.new_page()
        page.goto(f"{site}/sessions/")
        tab_to(page, "Dashboard")
        page.keyboard.press("Enter")
        page.wait_for_url(f"{site}/dashboard/")
        tab_to(page, "7 d")
        page.keyboard.press("Enter")
        page.wait_for_url(f"{site}/dashboard/?range=7d")
        tab_to(page, "Show “Turns per day by status” as a table")
        page.keyboard.press("Enter")
        table = page.locator("#chart-turns details.as-table table")
        table.wait_for()
        totals = [int(t) for t in table.locator("tbody tr td:last-child").all_inner_texts()]
        drawn = page.locator("#chart-turns svg rect[data-value]").evaluate_all(
            "rects => rects.map(r => Number(r.dataset.value))")
        assert sum(totals) == sum(drawn) > 0  # the table holds what the picture draws
    finally:
        context.close()


#: Counts the health page's refreshes that static/js/health.js held back (a listener on window runs after
#: the page's own listeners on document, so it sees their verdict).
COUNT_HELD_REFRESHES = """window.__held = 0;
window.addEventListener("htmx:beforeRequest", function (e) {
  if (e.detail.elt.id === "health" && e.defaultPrevented) window.__held++;
});"""


def test_the_health_page_holds_its_refresh_while_rows_are_selected(browser, site, login_state):
    """Under the policy the refresh's pause is a script of the site's (it was an evaluated trigger filter)."""
    context = browser.new_context(viewport={"width": 1366, "height": 900}, storage_state=str(login_state))
    context.set_default_timeout(30_000)
    try:
        page = context.new_page()
        errors = watch_the_policy(page)
        page.add_init_script(COUNT_HELD_REFRESHES)
        page.goto(f"{site}/health/")
        box = page.locator("#health tr.failed-delivery input[type=checkbox]").first
        box.check()
        # (A function, not an expression: Playwright evaluates an expression's text in the page, which the
        # policy forbids.)
        page.wait_for_function("() => window.__held >= 1")  # the next refresh came and was held back
        assert box.is_checked()  # (a refresh would have replaced the table, selection and all)
        box.uncheck()
        with page.expect_request(lambda r: r.url.endswith("/health/") and r.headers.get("hx-request") == "true"):
            pass  # refreshing again
        assert policy_problems(page, errors) == []
    finally:
        context.close()
