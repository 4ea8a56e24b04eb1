"""DjangoSessionStore's SQL path: operators' transactions, inserted row ids, the lease transaction."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from chatflow_agent import Agent, Message, Role
from chatflow_agent.core.sql import CHUNK_ROWS
from sessions_app.models import ChatMessage, ChatSession, SessionLease
from sessions_app.store import DjangoSessionStore

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = Agent(name="Support", instructions="help")


class Refused(Exception):
    pass


@pytest.fixture
def store():
    s = DjangoSessionStore()
    yield s
    s.close()


def test_a_sync_turn_inside_an_operator_transaction_rolls_back_with_it(store):
    store.get_or_create("s", AGENT)
    with pytest.raises(Refused), transaction.atomic():
        with store.sync_turn("s", AGENT) as session:
            session.add_message(Message(role=Role.USER, content="kept only if the operator commits"))
        assert ChatMessage.objects.filter(session_id="s").count() == 1  # written in the operator's transaction
        raise Refused
    assert ChatMessage.objects.filter(session_id="s").count() == 0
    assert not SessionLease.objects.filter(pk="s").exists()


def test_a_sync_create_and_delete_inside_an_operator_transaction_roll_back_with_it(store):
    store.get_or_create("kept", AGENT)
    with pytest.raises(Refused), transaction.atomic():
        store.get_or_create("new", AGENT)
        assert store.delete("kept")
        raise Refused
    assert list(ChatSession.objects.values_list("pk", flat=True)) == ["kept"]


def test_a_sync_turn_inside_an_operator_transaction_commits_with_it(store):
    with transaction.atomic():
        with store.sync_turn("s", AGENT) as session:
            session.add_message(Message(role=Role.USER, content="hello"))
    assert list(ChatMessage.objects.filter(session_id="s").values_list("content", flat=True)) == ["hello"]


def test_row_ids_follow_the_order_of_the_messages_across_insert_statements():
    count = CHUNK_ROWS + 3  # two INSERT … RETURNING statements
    store = DjangoSessionStore(default_max_turns=10 * count)  # nothing pruned
    with store.sync_turn("s", AGENT) as session:
        for i in range(count):
            session.add_message(Message(role=Role.USER, content=f"m{i}"))
    ids = [store.message_row_id(session, m) for m in session.history]
    assert ids == sorted(ids) and len(set(ids)) == count
    by_id = dict(ChatMessage.objects.filter(session_id="s").values_list("id", "content"))
    assert [by_id[i] for i in ids] == [f"m{i}" for i in range(count)]
    store.close()
    reopened = DjangoSessionStore(default_max_turns=10 * count)
    try:
        assert [m.content for m in reopened.get("s").history] == [f"m{i}" for i in range(count)]
    finally:
        reopened.close()


def test_a_lease_taken_inside_an_operator_transaction_leaves_its_durability_alone(store):
    store.get_or_create("s", AGENT)
    with transaction.atomic():
        with store.sync_turn("s", AGENT) as session:
            session.add_message(Message(role=Role.USER, content="hello"))
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SHOW synchronous_commit")
                    assert cursor.fetchone()[0] == "on"
        assert SessionLease.objects.filter(pk="s").count() == 0  # released in the commit
    assert ChatMessage.objects.filter(session_id="s").count() == 1
