"""The models on the chatflow tables read what the runtime writes with raw SQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from sessions_app.models import ChatMessage, ChatSession, OperatorAction

pytestmark = pytest.mark.django_db

MESSAGE_JSON = '{"role":"user","content":"hi","tool_calls":null,"tool_results":null,"timestamp":"2025-01-15T10:00:00Z"}'


def raw(sql: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_it_reads_both_timestamp_forms_the_runtime_writes_on_sqlite():
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL stores timestamptz, not text")
    raw(
        "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s)",
        ["s1", "Support", "{}", "2025-01-15 10:00:00", "2025-01-15 10:00:01.250000"],
    )

    session = ChatSession.objects.get(pk="s1")

    assert session.created_at == datetime(2025, 1, 15, 10, 0, 0, tzinfo=UTC)
    assert session.updated_at == datetime(2025, 1, 15, 10, 0, 1, 250000, tzinfo=UTC)


def test_metadata_written_as_json_text_reads_as_a_dict():
    raw(
        "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json) VALUES (%s, %s, %s)",
        ["tg:998877", "Billing", '{"channel": "telegram", "user_id": "998877"}'],
    )

    session = ChatSession.objects.get(pk="tg:998877")

    assert session.metadata == {"channel": "telegram", "user_id": "998877"}
    assert ChatSession.objects.filter(metadata__channel="telegram").count() == 1


def test_a_row_written_without_timestamps_gets_the_database_defaults():
    raw("INSERT INTO chatflow_sessions (session_id, active_agent_name) VALUES (%s, %s)", ["bare", "Support"])

    session = ChatSession.objects.get(pk="bare")

    assert session.metadata == {}
    assert session.created_at.tzinfo is not None


def test_deleting_a_session_with_raw_sql_cascades_to_its_messages():
    session = ChatSession.objects.create(session_id="olá 👋", active_agent_name="Support")
    ChatMessage.objects.create(session=session, role="user", content="hi", message_json=MESSAGE_JSON)

    raw("DELETE FROM chatflow_sessions WHERE session_id = %s", ["olá 👋"])

    assert not ChatMessage.objects.exists()


def test_messages_come_back_in_id_order():
    session = ChatSession.objects.create(session_id="+15550100", active_agent_name="Support")
    ids = [
        ChatMessage.objects.create(session=session, role=role, message_json=MESSAGE_JSON).id
        for role in ("user", "model", "tool", "model")
    ]

    assert list(session.messages.values_list("id", flat=True)) == ids


def test_an_audit_entry_survives_the_deletion_of_its_session():
    ChatSession.objects.create(session_id="gone", active_agent_name="Support")
    OperatorAction.objects.create(action="delete", session_id="gone", before={"messages": 3}, after={})

    ChatSession.objects.filter(pk="gone").delete()

    assert OperatorAction.objects.get().session_id == "gone"


def test_operators_hold_every_console_permission_and_viewers_only_view():
    operators = set(Group.objects.get(name="Operators").permissions.values_list("codename", flat=True))
    viewers = set(Group.objects.get(name="Viewers").permissions.values_list("codename", flat=True))

    assert {"force_handoff", "rollback_session", "delete_session", "export_transcript"} <= operators
    assert {"view_chatsession", "view_chatmessage", "view_operatoraction"} <= operators
    assert viewers and all(codename.startswith("view_") for codename in viewers)
    assert viewers < operators


@pytest.mark.django_db(transaction=True)
def test_the_groups_come_back_after_a_flush():
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)

    assert set(Group.objects.values_list("name", flat=True)) == {"Operators", "Viewers"}
    assert Group.objects.get(name="Operators").permissions.filter(codename="delete_session").exists()
