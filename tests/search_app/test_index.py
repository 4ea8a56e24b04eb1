"""The full-text index is kept in step by the database itself: a committed turn is findable at once, a failed
turn, a rollback, a delete and an import leave the index as the messages are (the index tables are read too)."""

from __future__ import annotations

import asyncio
import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection

from chatflow_agent import Agent, Runner
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from search_app import index, schema
from search_app.query import parse
from search_app.search import find_in_session, hits, session_filter
from sessions_app import actions, runtime
from sessions_app.models import ChatMessage, ChatSession
from tests.processes import REPO

FIXTURE = REPO / "tests" / "fixtures" / "chatflow_034.db"


def found(q: str) -> list[str]:
    return sorted(ChatSession.objects.filter(session_filter(parse(q))).values_list("pk", flat=True))


def indexed_bodies(session_id: str) -> list[str]:
    """The index table's own rows for the session's messages (read directly, not through the search)."""
    ids = list(ChatMessage.objects.filter(session_id=session_id).values_list("id", flat=True))
    return indexed_rows(ids)


def indexed_rows(ids: list[int]) -> list[str]:
    if not ids:
        return []
    marks = ", ".join(["%s"] * len(ids))
    key = "rowid" if connection.vendor == "sqlite" else "message_id"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT body FROM search_messages WHERE {key} IN ({marks})", ids)  # noqa: S608
        return [row[0] for row in cursor.fetchall()]


def index_holds(word: str) -> int:
    """How many rows of the message index hold ``word`` (a query on the index table itself)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT count(*) FROM search_messages WHERE search_messages MATCH %s", [f'"{word}"'])
        else:
            cursor.execute("SELECT count(*) FROM search_messages WHERE tsv @@ phraseto_tsquery('simple', %s)",
                           [word])
        return cursor.fetchone()[0]


class Failing(BaseEngine):
    async def generate_turn_async(self, agent, history):
        raise RuntimeError("the model is down")


class Echo(BaseEngine):
    async def generate_turn_async(self, agent, history):
        return EngineTurnResult(text="echo " + (history[-1].content or ""))


@pytest.mark.django_db(transaction=True)
def test_a_turns_messages_are_findable_right_after_its_commit():
    answer = runtime.site_runner().run("+15550177", "Where is order A-1001 now? Quero reembolso da ação")

    assert answer.tool_calls_executed == ["check_order_status"]
    assert found("reembolso") == ["+15550177"]
    assert found("acao") == ["+15550177"]  # accents folded
    assert found("tool:check_order_status") == ["+15550177"]
    assert found("check_order_status") == ["+15550177"]  # the tool's name is in the text too
    assert found('"order A-1001"') == ["+15550177"]
    assert found("5550177") == ["+15550177"]  # a fragment of the session id
    group = hits(parse("reembolso"), ["+15550177"])["+15550177"]
    assert [(h.turn, h.role) for h in group.hits] == [(1, "user")]
    assert "<mark>reembolso</mark>" in group.hits[0].snippet


@pytest.mark.django_db(transaction=True)
def test_a_failed_turns_text_is_neither_stored_nor_indexed():
    store = runtime.site_store()
    Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Echo()).run("s-fail", "first hello")
    with pytest.raises(Exception, match="model is down"):
        Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Failing()).run(
            "s-fail", "xylophonic secret")

    assert found("xylophonic") == []
    assert index_holds("xylophonic") == 0
    assert found("hello") == ["s-fail"]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_turn_and_a_deleted_session_leave_the_index():
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=runtime.site_store(), engine=Echo())
    runner.run("s-roll", "first zebrafinch")
    runner.run("s-roll", "second quokkaland")
    runner.run("s-gone", "unrepeatable marmosetish")
    operator = User.objects.create_user("olga", is_staff=True, is_superuser=True)
    plan = actions.plan_rollback("s-roll", 1)

    actions.rollback(operator, "s-roll", 1, plan.fingerprint)
    gone_ids = list(ChatMessage.objects.filter(session_id="s-gone").values_list("id", flat=True))
    actions.delete_session(operator, "s-gone")

    assert found("quokkaland") == [] and index_holds("quokkaland") == 0
    assert found("zebrafinch") == ["s-roll"]
    assert found("marmosetish") == [] and index_holds("marmosetish") == 0
    assert indexed_rows(gone_ids) == []
    assert found("s-gone") == []
    assert index.check().in_step


@pytest.mark.django_db(transaction=True)
def test_an_imported_034_database_is_searchable():
    call_command("chatflow_import", str(FIXTURE), stdout=io.StringIO())

    assert found("A-1001") == ["+15550100"]
    assert "+15550100" in found("tool:check_order_status")
    assert indexed_bodies("+15550100")
    assert index.check().in_step


@pytest.mark.django_db(transaction=True)
def test_the_rebuild_puts_an_index_out_of_step_back_in_step():
    asyncio.run(Runner(Agent(name="Bot", instructions="x"), session_store=runtime.site_store(),
                       engine=Echo()).run_async("s-step", "pangolin hello"))
    key = "rowid" if connection.vendor == "sqlite" else "message_id"
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM search_messages WHERE {key} IN (SELECT id FROM chatflow_messages)")  # noqa: S608
    assert found("pangolin") == []
    assert index.check().missing_messages == 2
    with pytest.raises(SystemExit) as exited:
        call_command("chatflow_search_index", "--check", stdout=io.StringIO())
    assert exited.value.code == 1

    out = io.StringIO()
    call_command("chatflow_search_index", stdout=out)

    assert "out of step" in out.getvalue()
    assert found("pangolin") == ["s-step"]
    assert index.check().in_step
    out = io.StringIO()
    call_command("chatflow_search_index", "--check", stdout=out)
    assert "in step" in out.getvalue()
    out = io.StringIO()
    call_command("chatflow_search_index", "--optimize", stdout=out)
    assert "merged" in out.getvalue() and found("pangolin") == ["s-step"]


@pytest.mark.django_db(transaction=True)
def test_find_in_session_reads_every_page_of_the_session():
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=runtime.site_store(), engine=Echo())
    for n in range(1, 31):
        runner.run("s-long", f"turn {n} {'needlework' if n in (2, 29) else 'hay'}")

    found_hits = find_in_session(parse("needlework"), "s-long")

    assert found_hits.total == 4  # each customer message and its echo
    assert sorted({h.turn for h in found_hits.hits}) == [2, 29]


def test_without_unaccent_postgresql_folds_latin_accents_with_a_fixed_map():
    accented, plain = schema._latin_fold_map()
    assert len(accented) == len(plain)
    folded = "ação señor über façade".translate(str.maketrans(accented, plain))
    assert folded == "acao senor uber facade"
    assert "translate($1" in schema._pg_fold(None) and "unaccent" in schema._pg_fold("public")


@pytest.mark.django_db(transaction=True)
def test_a_bot_on_the_runtimes_sqlite_store_writes_the_index_too():
    if connection.vendor != "sqlite":
        pytest.skip("the runtime's SQLiteSessionStore writes SQLite files")
    from chatflow_agent import SQLiteSessionStore

    store = SQLiteSessionStore(connection.settings_dict["NAME"])
    try:
        Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Echo()).run("bot-1", "capybaric hi")
    finally:
        store.close()

    assert found("capybaric") == ["bot-1"]
    assert index.check().in_step
