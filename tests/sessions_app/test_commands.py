"""`chatflow_import` (a chatflow-agent SQLite file into the site's database) and `chatflow_purge_dedup`."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command

from agents_app.demo_team import build
from chatflow_agent import Runner, SQLiteSessionStore
from chatflow_agent.core.engines import DemoEngine
from sessions_app import runtime
from sessions_app.models import ChatMessage, ChatSession, ProcessedMessage
from tests.processes import REPO, run_manage, site_env

FIXTURE = REPO / "tests" / "fixtures" / "chatflow_034.db"


def run(*args: str, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def fixture_sessions() -> list[dict]:
    """The fixture's sessions as the file holds them (insertion order), with their messages in id order."""
    with sqlite3.connect(f"file:{FIXTURE}?mode=ro", uri=True) as conn:
        sessions = []
        for sid, agent, metadata, created in conn.execute(
            "SELECT session_id, active_agent_name, metadata_json, created_at FROM chatflow_sessions ORDER BY rowid"
        ):
            rows = list(conn.execute(
                "SELECT role, content, message_json FROM chatflow_messages WHERE session_id = ? ORDER BY id", (sid,)
            ))
            sessions.append({"id": sid, "agent": agent, "metadata": metadata, "created": created, "rows": rows})
    return sessions


def stored_rows(session_id: str) -> list[tuple]:
    rows = ChatMessage.objects.filter(session_id=session_id).order_by("id")
    return list(rows.values_list("role", "content", "message_json"))


@pytest.mark.django_db
def test_it_imports_every_034_session_with_its_messages_in_order():
    out = run("chatflow_import", str(FIXTURE))

    expected = fixture_sessions()
    assert "Imported 7 sessions (38 messages) and 3 processed-message ids" in out
    assert ChatSession.objects.count() == len(expected) == 7
    for session in expected:
        row = ChatSession.objects.get(pk=session["id"])
        assert row.active_agent_name == session["agent"]
        assert row.metadata == json.loads(session["metadata"])
        assert row.created_at == datetime.fromisoformat(session["created"]).replace(tzinfo=UTC)
        assert stored_rows(session["id"]) == session["rows"]
    assert ChatMessage.objects.count() == 38
    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == {
        "wamid.HBgLMTU1NTAxMDAVAgASGBQzRUIwMDAwMDAwMDAwMDAwMDAwMQA=",
        "wamid.HBgLMTU1NTAxMDAVAgASGBQzRUIwMDAwMDAwMDAwMDAwMDAwMgA=",
        "tg:update:700000001",
    }


@pytest.mark.django_db
def test_a_second_import_copies_nothing_and_says_why():
    run("chatflow_import", str(FIXTURE))
    last_id = ChatMessage.objects.order_by("-id").values_list("id", flat=True).first()

    out = run("chatflow_import", str(FIXTURE))

    assert "Imported 0 sessions (0 messages) and 0 processed-message ids" in out
    assert "already present with the same content: 7" in out
    assert "'unicode-olá 👋'" in out
    assert "processed-message ids already present: 3" in out
    assert ChatSession.objects.count() == 7
    assert ChatMessage.objects.order_by("-id").values_list("id", flat=True).first() == last_id


@pytest.mark.django_db
def test_it_imports_a_file_a_running_sqlite_session_store_writes(tmp_path):
    bot_file = tmp_path / "bot.db"
    store = SQLiteSessionStore(str(bot_file))  # left open: its last commits are still in the WAL
    try:
        runner = Runner(build(), session_store=store, engine=DemoEngine())
        runner.run("tg:555", "Where is order Z-9?", metadata={"channel": "telegram"})
        runner.run("tg:555", "I need a refund")
        store.record_processed_message("tg:update:1")

        out = run("chatflow_import", str(bot_file))
    finally:
        store.close()

    assert "Imported 1 session (8 messages) and 1 processed-message id from" in out
    session = ChatSession.objects.get(pk="tg:555")
    assert (session.active_agent_name, session.metadata) == ("Billing", {"channel": "telegram"})
    with sqlite3.connect(bot_file) as conn:
        expected = conn.execute("SELECT role, content, message_json FROM chatflow_messages ORDER BY id").fetchall()
    assert stored_rows("tg:555") == expected


@pytest.mark.django_db
def test_a_dry_run_writes_nothing():
    out = run("chatflow_import", str(FIXTURE), dry_run=True)

    assert "Would import 7 sessions (38 messages) and 3 processed-message ids" in out
    assert "dry run: nothing was written" in out
    assert not ChatSession.objects.exists()
    assert not ChatMessage.objects.exists()
    assert not ProcessedMessage.objects.exists()


@pytest.mark.django_db
def test_a_session_with_the_same_id_and_other_content_is_left_alone_and_reported():
    ChatSession.objects.create(session_id="tg:998877", active_agent_name="Support", metadata={"channel": "telegram"})

    out = run("chatflow_import", str(FIXTURE))

    assert "Imported 6 sessions (32 messages)" in out
    assert "conflicting id with different content (left as they are): 1" in out
    assert "'tg:998877': active agent 'Support' in the database, 'Billing' in the file" in out
    assert ChatSession.objects.get(pk="tg:998877").active_agent_name == "Support"
    assert not ChatMessage.objects.filter(session_id="tg:998877").exists()


@pytest.mark.django_db
def test_unreadable_rows_are_skipped_and_reported_and_the_rest_is_imported(tmp_path):
    damaged = tmp_path / "damaged.db"
    shutil.copy(FIXTURE, damaged)
    with sqlite3.connect(damaged) as conn:
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) "
                     "VALUES ('meta-only', 'wizard', 'hi', 'not json')")
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) "
                     "VALUES ('meta-only', CAST(x'ff' AS TEXT), 'hi', '{}')")
        conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name) "
                     "VALUES (CAST(x'c3' AS TEXT), 'Support')")
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) "
                     "VALUES ('nobody', 'user', 'lost', '{}')")
        conn.execute("UPDATE chatflow_sessions SET metadata_json = '[1, 2' WHERE session_id = 'pruned'")

    out = run("chatflow_import", str(damaged))

    assert "Imported 7 sessions (38 messages)" in out
    assert "Unreadable rows skipped or repaired: 5" in out
    assert "of session 'meta-only': neither message_json nor role/content is a readable message" in out
    assert "of session 'meta-only': not valid UTF-8" in out
    assert "session row 8: its id or agent is not valid UTF-8" in out
    assert "they belong to no session" in out
    assert "session 'pruned': metadata_json is not a JSON object; copied as {}" in out
    assert len(stored_rows("meta-only")) == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00" * 10 + b"this is not a database" * 300, "not a readable SQLite database"),
        (None, "no such file"),
    ],
)
def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "broken.db"
    if content is not None:
        path.write_bytes(content)

    with pytest.raises(CommandError, match=message):
        run("chatflow_import", str(path))
    assert not ChatSession.objects.exists()


@pytest.mark.django_db
def test_a_sqlite_file_without_the_chatflow_tables_is_a_clear_error(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")

    with pytest.raises(CommandError, match="no chatflow_sessions table; is it a chatflow-agent database"):
        run("chatflow_import", str(other))


@pytest.mark.django_db
def test_a_damaged_sqlite_file_is_a_clear_error(tmp_path):
    damaged = tmp_path / "damaged.db"
    data = bytearray(FIXTURE.read_bytes())
    data[4096 * 3 : 4096 * 6] = b"\xa5" * (4096 * 3)  # trash some pages, keep the header
    damaged.write_bytes(bytes(data))

    with pytest.raises(CommandError, match="damaged|not a readable SQLite database|reading the file failed"):
        run("chatflow_import", str(damaged))


def test_a_bad_file_exits_with_status_1_and_the_reason_on_stderr(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage" * 1000)

    result = run_manage("chatflow_import", str(corrupt), env=site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}"))

    assert result.returncode == 1
    assert "not a readable SQLite database" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.django_db(transaction=True)
def test_the_site_runner_continues_an_imported_session():
    run("chatflow_import", str(FIXTURE))

    answer = runtime.site_runner().run("+15550100", "Where is order A-1001 now?")

    assert answer.tool_calls_executed == ["check_order_status"]
    rows = stored_rows("+15550100")
    assert rows[:6] == fixture_sessions()[0]["rows"]
    assert [r[0] for r in rows[6:]] == ["user", "model", "tool", "model"]


@pytest.mark.django_db
def test_purge_deletes_expired_processed_messages_and_prints_the_count(settings):
    settings.CHATFLOW_DEDUP_TTL_HOURS = 24
    now = datetime.now(UTC)
    for n, age in enumerate((timedelta(hours=30), timedelta(days=9), timedelta(hours=1), timedelta(0))):
        ProcessedMessage.objects.create(message_id=f"wamid.{n}", processed_at=now - age)

    out = run("chatflow_purge_dedup")

    assert out.splitlines()[0] == "Purged 2 expired processed-message ids (older than 24 h)."
    assert sorted(ProcessedMessage.objects.values_list("pk", flat=True)) == ["wamid.2", "wamid.3"]
    assert run("chatflow_purge_dedup").splitlines()[0] == "Purged 0 expired processed-message ids (older than 24 h)."



@pytest.mark.django_db
def test_nul_characters_postgresql_cannot_hold_are_reported_not_a_stopped_import(tmp_path):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's text cannot hold NUL; SQLite's can (and keeps it)")
    source = tmp_path / "nul.db"
    shutil.copy(FIXTURE, source)
    with sqlite3.connect(source) as conn:
        conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name) VALUES (?, 'Support')",
                     ("imp-nul\x00id",))
        conn.execute("UPDATE chatflow_sessions SET metadata_json = ? WHERE session_id = 'pruned'",
                     (json.dumps({"note": "a\x00b"}),))
        conn.execute("INSERT INTO chatflow_processed_messages (message_id) VALUES (?)", ("pm\x00nul",))

    dry = run("chatflow_import", str(source), "--dry-run")
    out = run("chatflow_import", str(source))

    for said in (dry, out):
        assert "7 sessions (38 messages) and 3 processed-message ids" in said.splitlines()[0]
        assert "contains a NUL character, which PostgreSQL text cannot hold" in said
        assert "session 'pruned': metadata_json holds NUL characters; copied without" in said
    assert ChatSession.objects.get(pk="pruned").metadata == {"note": "ab"}
    assert not ChatSession.objects.filter(session_id__startswith="imp-nul").exists()
    assert not ProcessedMessage.objects.filter(pk__startswith="pm").exists()
