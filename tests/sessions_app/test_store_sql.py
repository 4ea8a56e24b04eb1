"""DjangoSessionStore's SQL path: operators' transactions, inserted row ids, the lease transaction."""

from __future__ import annotations

import sqlite3

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


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the BEGIN IMMEDIATE path is SQLite's")
def test_a_commit_that_fails_leaves_the_connection_in_autocommit_and_raises_its_error():
    from chatflow_agent.core.sql import sqlite_transaction as immediate

    connection.ensure_connection()
    driver = connection.connection
    setup = driver.cursor()
    setup.execute("CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY)")
    setup.execute("CREATE TEMP TABLE child (parent_id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)")
    cursor = driver.cursor()

    # A deferred foreign key fails at COMMIT, which leaves SQLite's transaction open.
    with pytest.raises(sqlite3.IntegrityError):
        immediate(cursor, lambda c: c.execute("INSERT INTO child VALUES (99)", ()))

    assert not driver.in_transaction
    assert immediate(cursor, lambda c: c.execute("INSERT INTO parent VALUES (1)", ()).rowcount) == 1
    assert not driver.in_transaction  # committed, not joined to a forgotten transaction
    assert ChatSession.objects.count() == 0  # Django's autocommit queries run as before


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the BEGIN IMMEDIATE path is SQLite's")
def test_immediate_refuses_a_connection_already_in_a_transaction():
    from chatflow_agent.core.sql import sqlite_transaction as immediate

    connection.ensure_connection()
    cursor = connection.connection.cursor()
    cursor.execute("BEGIN", ())
    try:
        with pytest.raises(RuntimeError, match="autocommit"):
            immediate(cursor, lambda c: None)
    finally:
        cursor.execute("ROLLBACK", ())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
def test_a_turn_s_statements_are_prepared_on_the_connection_after_a_few_turns(store):
    for n in range(8):
        with store.sync_turn("s", AGENT) as session:
            session.add_message(Message(role=Role.USER, content=f"hello {n}"))

    with connection.cursor() as cursor:  # this thread's connection: the one the sync turns ran on
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("chatflow_session_leases" in sql and "INSERT" in sql for sql in prepared), prepared
    assert any("INSERT INTO chatflow_messages" in sql for sql in prepared), prepared
    assert ChatMessage.objects.filter(session_id="s").count() == 8


def test_a_turn_that_prunes_knows_the_new_version_so_the_next_turn_reads_only_the_head():
    from sessions_app.roundtrips import Counts, count_connections

    store = DjangoSessionStore(default_max_turns=2)
    counts = Counts()
    stop = count_connections(counts)
    try:
        for n in range(5):  # turns 3 to 5 delete the oldest turn's rows in their commit
            with store.sync_turn("v", AGENT) as session:
                session.add_message(Message(role=Role.USER, content=f"u{n}"))
                session.add_message(Message(role=Role.MODEL, content=f"a{n}"))
            memory = [m.content for m in session.history]
            if n == 0:
                counts.reset()  # the first turn also swept expired leases and read the new session's head
    finally:
        stop()
        store.close()

    assert counts.statements["SELECT"] == 4  # one head read per later turn; none read the rows again
    assert memory == ["u3", "a3", "u4", "a4"]
    stored = list(ChatMessage.objects.filter(session_id="v").order_by("id").values_list("content", flat=True))
    assert stored == memory
