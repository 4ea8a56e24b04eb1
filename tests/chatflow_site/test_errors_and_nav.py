"""The site's 403/404 pages (layout, reason, a way out, log-out by POST), log-out for every user, the
navigation by permission and the favicon."""

from __future__ import annotations

import logging
import re

import pytest
from django.test import override_settings

from tests.sessions_app import personas

pytestmark = pytest.mark.django_db


def nav_links(html: str) -> list[str]:
    nav = re.search(r'<nav aria-label="Site">(.*?)</nav>', html, re.S).group(1)
    return re.findall(r'<a href="([^"]*)"', nav)


@pytest.mark.parametrize("persona", ["viewer", "operator", "outsider", "customer"])
def test_every_navigation_link_opens_for_the_user_who_sees_it(persona):
    user = getattr(personas, persona)()
    client = personas.client_for(user)
    page = client.get("/sessions/") if user.is_staff else client.get("/accounts/logout/")
    links = nav_links(page.content.decode())
    for url in links:
        assert client.get(url, follow=True).status_code == 200, url
    if persona == "viewer":
        assert "/chat/" not in links and "/api/v1/docs" not in links and "/sessions/" in links
    if persona == "operator":
        assert "/chat/" in links and "/api/v1/docs" in links
    if persona == "customer":
        assert links == []


def test_the_403_page_has_the_layout_the_reason_and_a_post_log_out():
    client = personas.client_for(personas.viewer())
    response = client.get("/chat/")
    assert response.status_code == 403
    html = response.content.decode()
    assert '<header class="topbar">' in html and "Not allowed (403)" in html
    assert "You do not have permission to do this: it needs the &#x27;add_chatmessage&#x27; permission." in html
    assert len(re.findall(r'<form method="post" action="/accounts/logout/"', html)) == 2  # nav and page
    fragment = client.get("/chat/", HTTP_HX_REQUEST="true")
    assert fragment.status_code == 403 and b"<html" not in fragment.content and b"permission" in fragment.content


def test_a_refusal_is_logged_in_one_line(caplog):
    client = personas.client_for(personas.viewer())
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get("/chat/").status_code == 403
    records = [r for r in caplog.records if r.name == "django.request"]
    assert len(records) == 1 and records[0].exc_info is None and records[0].exc_text is None
    assert "\n" not in records[0].getMessage()


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("url", ["/no-such-page/", "/sessions/no-such-session/"])
def test_404s_are_the_site_page_even_with_debug_on(url, debug):
    client = personas.client_for(personas.operator())
    with override_settings(DEBUG=debug):
        response = client.get(url)
    assert response.status_code == 404
    html = response.content.decode()
    assert "not found (404)" in html.lower() and '<header class="topbar">' in html and "/sessions/" in html
    assert "DEBUG = True" not in html and "URLconf" not in html


def test_a_non_staff_user_can_log_out():
    client = personas.client_for(personas.customer())
    page = client.get("/accounts/logout/")
    assert page.status_code == 200 and b'<form method="post" action="/accounts/logout/"' in page.content
    forbidden = client.get("/sessions/")
    assert forbidden.status_code == 403 and b'action="/accounts/logout/"' in forbidden.content
    assert b"not a console (staff) account" in forbidden.content
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/sessions/").status_code == 302  # logged out: sent to the login page


def test_log_out_needs_the_csrf_token():
    client = personas.client_for(personas.customer(), csrf=True)
    assert client.post("/accounts/logout/").status_code == 403


def test_the_favicon_is_served():
    response = personas.client_for(None).get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] == "image/svg+xml"
    assert response.content.startswith(b"<svg")


def test_dates_have_one_format_with_the_time_zone():
    from datetime import UTC, datetime

    from sessions_app.templatetags import when

    moment = datetime(2026, 1, 10, 9, 0, tzinfo=UTC)
    assert when.stamp(moment) == "2026-01-10 09:00 UTC"
    assert 'title="2026-01-10 09:00:00 UTC"' in when.ago(moment)
    assert when.relative(moment, datetime(2026, 1, 10, 9, 5, tzinfo=UTC)) == "5 min ago"
    assert when.relative(moment, datetime(2026, 1, 10, 12, 0, tzinfo=UTC)) == "3 h ago"
    assert when.relative(moment, datetime(2026, 3, 10, 12, 0, tzinfo=UTC)) == "2026-01-10"
    assert when.stamp(None) == "—"
    # What moves fast (a running turn, a lease, a heartbeat) counts seconds under a minute.
    assert when.relative(moment, datetime(2026, 1, 10, 9, 0, 32, tzinfo=UTC)) == "just now"
    assert when.relative(moment, datetime(2026, 1, 10, 9, 0, 32, tzinfo=UTC), seconds_under_a_minute=True) == "32 s ago"
    assert when.relative(moment, datetime(2026, 1, 10, 8, 59, 52, tzinfo=UTC), seconds_under_a_minute=True) == "in 8 s"
    assert when.relative(moment, datetime(2026, 1, 10, 9, 5, tzinfo=UTC), seconds_under_a_minute=True) == "5 min ago"
    assert when.stamp_seconds(moment) == '<time datetime="2026-01-10T09:00:00+00:00">2026-01-10 09:00:00 UTC</time>'


@pytest.mark.parametrize("debug", [True, False])
def test_a_stale_csrf_token_gets_the_site_page_saying_to_reload(debug):
    client = personas.client_for(personas.operator(), csrf=True)
    with override_settings(DEBUG=debug):
        page = client.post("/accounts/logout/", {"csrfmiddlewaretoken": "stale"}, HTTP_ACCEPT="text/html")
        fragment = client.post("/accounts/logout/", {}, HTTP_HX_REQUEST="true")
        api = client.post("/accounts/logout/", {})
    html = page.content.decode()
    assert page.status_code == 403 and '<header class="topbar">' in html
    assert "security token is missing or out of date" in html and "CSRF verification failed" not in html
    assert fragment.status_code == 403 and "<header" not in fragment.content.decode()
    assert api.status_code == 403 and api.json()["error"] == "csrf_failed"


@pytest.mark.parametrize("debug", [True, False])
def test_a_form_too_large_to_parse_gets_a_400_page_and_one_log_line(debug, settings, caplog):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    client = personas.client_for(personas.operator())
    with override_settings(DEBUG=debug), caplog.at_level("WARNING"):
        page = client.post("/chat/send/", {"session_id": "web-big", "message": "x" * 20_000},
                           HTTP_ACCEPT="text/html")
    html = page.content.decode()
    assert page.status_code == 400 and '<header class="topbar">' in html
    assert "The form sent is too large" in html and "RequestDataTooBig" not in html
    refusals = [r for r in caplog.records if r.name == "chatflow_site.errors"]
    assert len(refusals) == 1 and refusals[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info]
