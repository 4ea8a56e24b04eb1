"""The site's Content-Security-Policy: every page carries it (DEBUG on or off), it allows no inline script,
no inline style and no eval, and the templates hold nothing it would block. The browser side (every screen
working under it, no violation reported) is in tests/sessions_app/test_accessibility_browser.py."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from tests.processes import REPO
from tests.sessions_app import personas

TEMPLATES = sorted((REPO / "templates").rglob("*.html"))


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {name: values for name, *values in (part.split() for part in header.split(";") if part.strip())}


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/accounts/login/", "/sessions/", "/health/", "/chat/", "/admin/"])
def test_every_page_carries_a_strict_policy(client, settings, debug, path):
    settings.DEBUG = debug
    client.force_login(personas.operator())
    answer = client.get(path, follow=True)
    assert answer.status_code == 200
    csp = policy(answer)
    assert csp["script-src"] == ["'self'"] and csp["style-src"] == ["'self'"]
    assert csp["object-src"] == ["'none'"] and csp["frame-ancestors"] == ["'none'"]
    assert not any("unsafe" in value for values in csp.values() for value in values)


@pytest.mark.django_db
def test_the_site_s_own_error_pages_carry_it_too(client):
    assert "script-src 'self'" in client.get("/no-such-page/")["Content-Security-Policy"]


@pytest.mark.django_db
def test_htmx_is_configured_for_the_policy(client):
    page = client.get("/accounts/login/").content.decode()
    meta = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)
    assert meta is not None
    config = json.loads(meta[1])
    # No <style> element for its indicators, no eval of trigger filters or hx-on, no scripts from swaps.
    assert config["includeIndicatorStyles"] is False and config["allowEval"] is False
    assert config["allowScriptTags"] is False


class _Blocked(HTMLParser):
    """What the policy blocks in a template: inline scripts, event-handler attributes, style attributes and
    elements, ``javascript:`` URLs, htmx attributes that evaluate JavaScript."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and "src" not in names and names.get("type") not in ("application/json",):
            self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style>")
        for name, value in attrs:
            if name.startswith("on") or name.startswith("hx-on") or name == "style":
                self.found.append(f"{tag} {name}=")
            if value and value.strip().lower().startswith("javascript:"):
                self.found.append(f"{tag} {name}=javascript:")
            if name in ("hx-trigger", "hx-vals", "hx-vars") and value and _evaluated(value):
                self.found.append(f"{tag} {name}={value!r} (evaluated)")


def _evaluated(value: str) -> bool:
    """An htmx attribute value with JavaScript in it: a trigger filter (``every 5s [expr]``; a CSS selector
    after ``from:`` is not one) or a ``js:`` value."""
    return "[" in re.sub(r"from:\S+", "", value) or "js:" in value


@pytest.mark.parametrize("template", TEMPLATES, ids=[str(t.relative_to(REPO / "templates")) for t in TEMPLATES])
def test_no_template_holds_what_the_policy_blocks(template):
    parser = _Blocked()
    parser.feed(template.read_text())
    assert parser.found == []
