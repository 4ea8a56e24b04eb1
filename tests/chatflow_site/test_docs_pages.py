"""The documentation pages served in the console: login and console access required, linked from the
navigation, the session page and the takeover panel; Markdown rendered with every raw HTML tag escaped."""

from __future__ import annotations

import re

import pytest

from chatflow_site.docs import PAGES, heading_id, render_markdown
from tests.processes import REPO
from tests.sessions_app import conversations, personas

pytestmark = pytest.mark.django_db


def test_every_page_renders_for_a_console_user_with_its_title():
    client = personas.client_for(personas.viewer())
    index = client.get("/docs/")
    assert index.status_code == 200
    for page in PAGES:
        response = client.get(f"/docs/{page}/")
        assert response.status_code == 200, page
        title = (REPO / "docs" / f"{page}.md").read_text(encoding="utf-8").split("\n", 1)[0].removeprefix("# ")
        html = response.content.decode()
        assert f'<h1 id="{heading_id(title)}">' in html
        assert f'href="/docs/{page}/"' in index.content.decode()


def test_every_file_in_docs_is_a_served_page():
    assert sorted(path.stem for path in (REPO / "docs").glob("*.md")) == sorted(PAGES)


@pytest.mark.parametrize("url", ["/docs/", "/docs/operator-guide/"])
def test_it_sends_anonymous_visitors_to_the_login_page(url):
    response = personas.client_for(None).get(url)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def test_it_refuses_a_login_without_console_access():
    client = personas.client_for(personas.outsider())
    assert client.get("/docs/operator-guide/").status_code == 403


@pytest.mark.parametrize("name", ["no-such-page", "README", "..", "operator-guide.md"])
def test_a_name_that_is_not_a_page_is_404(name):
    client = personas.client_for(personas.viewer())
    assert client.get(f"/docs/{name}/").status_code == 404


def test_the_navigation_links_the_docs_and_the_guide_links_its_sections():
    client = personas.client_for(personas.viewer())
    nav = re.search(r'<nav aria-label="Site">(.*?)</nav>', client.get("/sessions/").content.decode(), re.S).group(1)
    assert '<a href="/docs/">Help</a>' in nav
    guide = client.get("/docs/operator-guide/").content.decode()
    assert '<h2 id="session-page">Session page</h2>' in guide
    assert '<h2 id="human-takeover">Human takeover</h2>' in guide
    assert 'href="/docs/configuration/"' in guide  # a link to configuration.md, as a console URL
    assert 'href="/docs/operations/#dashboard"' in guide


def test_the_session_page_and_the_takeover_panel_link_the_operator_guide():
    conversations.store("+15550100", conversations.support_story())
    client = personas.client_for(personas.operator())
    html = client.get("/sessions/+15550100/").content.decode()
    assert 'href="/docs/operator-guide/#session-page"' in html
    assert 'href="/docs/operator-guide/#human-takeover"' in html


def test_raw_html_and_unsafe_links_in_markdown_are_not_rendered():
    html = str(render_markdown('<script>alert(1)</script>\n\n[x](javascript:alert(1)) <img src=x onerror=alert(1)>\n\n'
                               '| a |\n| --- |\n| <b>b</b> |\n'))
    assert "<script" not in html and "<img" not in html and "<b>" not in html
    assert "&lt;script&gt;" in html and "&lt;b&gt;b&lt;/b&gt;" in html
    assert 'href="javascript' not in html
    assert "<table" in html and "<td>" in html


def test_headings_get_the_anchors_the_repository_pages_use():
    assert heading_id("The runtime (`chatflow_agent`)") == "the-runtime-chatflow_agent"
    assert heading_id("Health, metrics and traces") == "health-metrics-and-traces"
    html = str(render_markdown("## The runtime (`chatflow_agent`)\n"))
    assert '<h2 id="the-runtime-chatflow_agent">' in html
