"""The admin shows the chatflow tables read-only; deleting a session goes through the audited store delete."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from tests.sessions_app.personas import client_for, operator, viewer

pytestmark = pytest.mark.django_db

MESSAGE_JSON = '{"role":"user","content":"hi","tool_calls":null,"tool_results":null,"timestamp":"2025-01-15T10:00:00Z"}'


@pytest.fixture
def session():
    row = ChatSession.objects.create(session_id="tg:998877", active_agent_name="Billing", metadata={"channel": "tg"})
    ChatMessage.objects.create(session=row, role="user", content="hi", message_json=MESSAGE_JSON)
    return row


def test_the_session_list_and_page_render_with_messages_inline(session):
    client = client_for(viewer())

    listing = client.get(reverse("admin:sessions_app_chatsession_changelist"), {"q": "telegram"})
    page = client.get(reverse("admin:sessions_app_chatsession_change", args=[session.pk]))

    assert listing.status_code == 200
    assert page.status_code == 200
    assert b"Billing" in page.content
    assert b"Delete" not in page.content


def test_a_viewer_cannot_delete_from_the_admin(session):
    response = client_for(viewer()).post(
        reverse("admin:sessions_app_chatsession_delete", args=[session.pk]), {"post": "yes"}
    )

    assert response.status_code == 403
    assert ChatSession.objects.filter(pk=session.pk).exists()


def test_an_operator_deletes_through_the_store_and_the_audit_log(session):
    user = operator()
    client = client_for(user)

    confirm = client.get(reverse("admin:sessions_app_chatsession_delete", args=[session.pk]))
    done = client.post(reverse("admin:sessions_app_chatsession_delete", args=[session.pk]), {"post": "yes"})

    assert confirm.status_code == 200
    assert b"tg:998877 (1 message)" in confirm.content
    assert done.status_code == 302
    assert not ChatSession.objects.filter(pk=session.pk).exists()
    assert not ChatMessage.objects.exists()
    entry = OperatorAction.objects.get()
    assert (entry.actor, entry.action, entry.session_id) == (user, "delete", "tg:998877")
