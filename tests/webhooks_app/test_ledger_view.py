"""The console's ledger URL (``/webhooks/ledger/<session id>/``): a session that does not exist is a 404 with a
message, as every request on a session that is gone (docs/operator-guide.md, *Session page*), as a fragment
and as a page."""

from __future__ import annotations

import logging

import pytest

from sessions_app.models import ChatSession
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_generic

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_client():
    return personas.client_for(personas.viewer())


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_the_ledger_of_a_session_that_does_not_exist_is_a_404_with_a_message(viewer_client, htmx, caplog):
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    with caplog.at_level(logging.INFO, logger="django.request"):
        response = viewer_client.get("/webhooks/ledger/no-such-session/", **extra)

    assert response.status_code == 404
    html = response.content.decode()
    assert "no-such-session" in html and ("no longer exists" in html or "does not exist" in html)
    assert 'id="dedup-ledger"' not in html
    assert (b"<html" in response.content) is not htmx  # a page, or the fragment for the page's dialog
    records = [r for r in caplog.records if r.name == "django.request"]
    assert len(records) == 1 and records[0].exc_info is None  # one line, no traceback


def test_the_ledger_follows_the_session_not_its_deliveries(client, viewer_client):
    assert post_generic(client, p.generic("web:1", "m-1", "hi")).status_code == 202  # queued, not played yet
    assert viewer_client.get("/webhooks/ledger/web:1/", HTTP_HX_REQUEST="true").status_code == 404  # no session page

    ChatSession.objects.create(session_id="web:1", active_agent_name="Support")

    fragment = viewer_client.get("/webhooks/ledger/web:1/", HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and b'id="dedup-ledger"' in fragment.content and b"m-1" in fragment.content
