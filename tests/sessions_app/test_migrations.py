"""The initial migrations adopt existing chatflow tables and create them, with upstream DDL, on a new database."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

from tests.processes import REPO, run_manage, site_env

FIXTURE_034 = REPO / "tests" / "fixtures" / "chatflow_034.db"
SEED_TABLES = ("chatflow_sessions", "chatflow_messages", "chatflow_processed_messages")

# PRAGMA table_info rows (name, type, notnull, default, pk) of chatflow-agent 0.3.4's tables.
UPSTREAM_COLUMNS = {
    "chatflow_sessions": [
        ("session_id", "TEXT", 0, None, 1),
        ("active_agent_name", "TEXT", 1, None, 0),
        ("metadata_json", "TEXT", 1, "'{}'", 0),
        ("created_at", "TIMESTAMP", 0, "CURRENT_TIMESTAMP", 0),
        ("updated_at", "TIMESTAMP", 0, "CURRENT_TIMESTAMP", 0),
    ],
    "chatflow_messages": [
        ("id", "INTEGER", 0, None, 1),
        ("session_id", "TEXT", 1, None, 0),
        ("role", "TEXT", 1, None, 0),
        ("content", "TEXT", 0, None, 0),
        ("message_json", "TEXT", 1, None, 0),
        ("created_at", "TIMESTAMP", 0, "CURRENT_TIMESTAMP", 0),
    ],
    "chatflow_processed_messages": [
        ("message_id", "TEXT", 0, None, 1),
        ("processed_at", "TIMESTAMP", 0, "CURRENT_TIMESTAMP", 0),
    ],
}

# What the Django ORM sees, printed by a child process: session → (agent, metadata, messages, created_at).
ORM_LISTING = """
import json
from django.db.models import Count
from sessions_app.models import ChatSession, ProcessedMessage
rows = {
    s.session_id: [s.active_agent_name, s.metadata, s._n, s.created_at.isoformat(), s.updated_at.isoformat()]
    for s in ChatSession.objects.annotate(_n=Count("messages"))
}
processed = sorted(ProcessedMessage.objects.values_list("message_id", flat=True))
print(json.dumps({"sessions": rows, "processed": processed}))
"""


# After migrate: DjangoSessionStore lists every session and a Runner continues one of them.
STORE_CONTINUES = """
import asyncio, json
from chatflow_agent import Agent, Runner
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from sessions_app.store import DjangoSessionStore

class Echo(BaseEngine):
    async def generate_turn_async(self, agent, history):
        return EngineTurnResult(text="seen %d" % len(history))

async def main():
    store = DjangoSessionStore(default_max_turns=40)
    listing = {sid: [s.active_agent.name, s.metadata, len(s.history)]
               for sid in await store.alist_sessions() for s in [await store.aget(sid)]}
    billing = Agent(name="Billing", instructions="x")
    support = Agent(name="Support", instructions="x", handoffs=[billing])
    answer = await Runner(support, session_store=store, engine=Echo()).run_async("+15550100", "One more thing")
    history = [m.content for m in (await store.aget("+15550100")).history]
    store.close()
    print(json.dumps({"listing": listing, "answer": answer.content, "history": history}))

asyncio.run(main())
"""


def snapshot(db: Path) -> dict:
    """Every row of the seed tables, the AUTOINCREMENT counter and the tables' DDL (indexes may be added)."""
    with sqlite3.connect(db) as conn:
        shot = {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in SEED_TABLES}
        shot["sequence"] = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'chatflow_messages'").fetchall()
        shot["ddl"] = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?) ORDER BY name", SEED_TABLES
        ).fetchall()
    return shot


def migrate(db: Path):
    return run_manage("migrate", "--noinput", env=site_env(DATABASE_URL=f"sqlite:///{db}"))


def orm_listing(db: Path) -> dict:
    result = run_manage("shell", "-c", ORM_LISTING, env=site_env(DATABASE_URL=f"sqlite:///{db}"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # after Django's "N objects imported" line


@pytest.fixture
def db_034(tmp_path):
    if not FIXTURE_034.exists():
        pytest.skip("tests/fixtures/chatflow_034.db (written by chatflow-agent 0.3.4) is not committed yet")
    copy = tmp_path / "chatflow_034.db"
    shutil.copyfile(FIXTURE_034, copy)
    return copy


@pytest.mark.slow
def test_migrate_adopts_a_chatflow_034_database_and_loses_nothing(db_034):
    before = snapshot(db_034)

    result = migrate(db_034)

    assert result.returncode == 0, result.stderr
    assert snapshot(db_034) == before
    with sqlite3.connect(db_034) as conn:
        applied = {name for (name,) in conn.execute("SELECT name FROM django_migrations WHERE app='sessions_app'")}
        leases = conn.execute("SELECT count(*) FROM sqlite_master WHERE name='chatflow_session_leases'").fetchone()
    assert {"0001_initial", "0002_sessionlease"} <= applied
    assert leases == (1,)


@pytest.mark.slow
def test_migrating_twice_changes_nothing(db_034):
    assert migrate(db_034).returncode == 0
    before = snapshot(db_034)

    result = migrate(db_034)

    assert result.returncode == 0, result.stderr
    assert "No migrations to apply" in result.stdout
    assert snapshot(db_034) == before


@pytest.mark.slow
def test_the_orm_reads_every_034_session_with_its_agent_metadata_and_message_count(db_034):
    with sqlite3.connect(db_034) as conn:
        expected = {
            sid: [agent, json.loads(meta), n]
            for sid, agent, meta, n in conn.execute(
                "SELECT s.session_id, s.active_agent_name, s.metadata_json,"
                " (SELECT count(*) FROM chatflow_messages m WHERE m.session_id = s.session_id)"
                " FROM chatflow_sessions s"
            )
        }
        processed = sorted(mid for (mid,) in conn.execute("SELECT message_id FROM chatflow_processed_messages"))
    assert migrate(db_034).returncode == 0

    listing = orm_listing(db_034)

    assert {sid: row[:3] for sid, row in listing["sessions"].items()} == expected
    assert listing["processed"] == processed
    for *_, created_at, updated_at in listing["sessions"].values():
        # 0.3.4's CURRENT_TIMESTAMP text ('YYYY-MM-DD HH:MM:SS') reads as an aware UTC datetime.
        assert datetime.fromisoformat(created_at).utcoffset().total_seconds() == 0
        assert datetime.fromisoformat(updated_at).utcoffset().total_seconds() == 0


@pytest.mark.slow
def test_the_django_store_lists_034_sessions_and_the_runner_continues_one(db_034):
    with sqlite3.connect(db_034) as conn:
        counts = dict(conn.execute("SELECT session_id, count(*) FROM chatflow_messages GROUP BY session_id"))
    assert migrate(db_034).returncode == 0

    result = run_manage("shell", "-c", STORE_CONTINUES, env=site_env(DATABASE_URL=f"sqlite:///{db_034}"))

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert {sid: n for sid, (_, _, n) in out["listing"].items()} == counts
    assert out["listing"]["tg:998877"][:2] == ["Billing", {"channel": "telegram", "user_id": "998877"}]
    assert out["history"][-2:] == ["One more thing", "seen 7"]  # the 6 stored messages + the new one
    with sqlite3.connect(db_034) as conn:
        stored = [c for (c,) in conn.execute(
            "SELECT content FROM chatflow_messages WHERE session_id = '+15550100' ORDER BY id")]
    assert stored == out["history"]


@pytest.mark.slow
def test_migrate_adopts_a_database_written_by_the_sqlite_session_store(tmp_path):
    store_module = pytest.importorskip("chatflow_agent.core.memory")
    db = tmp_path / "bot.db"
    store = store_module.SQLiteSessionStore(db_path=db)
    from agents_app.demo_team import build

    session = store.get_or_create("+15550100", build(), metadata={"channel": "whatsapp"})
    del session
    store.record_processed_message("wamid.1")
    close = getattr(store, "close", None)
    if close is not None:
        close()
    before = snapshot(db)

    result = migrate(db)

    assert result.returncode == 0, result.stderr
    assert snapshot(db) == before
    assert orm_listing(db)["sessions"]["+15550100"][:3] == ["Support", {"channel": "whatsapp"}, 0]


@pytest.mark.django_db
def test_a_new_sqlite_database_gets_the_upstream_columns():
    if connection.vendor != "sqlite":
        pytest.skip("compares SQLite's PRAGMA table_info")
    with connection.cursor() as cursor:
        for table, columns in UPSTREAM_COLUMNS.items():
            cursor.execute(f"PRAGMA table_info({table})")
            assert [tuple(row[1:]) for row in cursor.fetchall()] == columns
        cursor.execute("PRAGMA foreign_key_list(chatflow_messages)")
        (fk,) = cursor.fetchall()
        assert (fk[2], fk[3], fk[4], fk[6]) == ("chatflow_sessions", "session_id", "session_id", "CASCADE")
        cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'chatflow_messages'")
        assert "AUTOINCREMENT" in cursor.fetchone()[0]


@pytest.mark.django_db
def test_a_new_postgresql_database_gets_the_equivalent_columns():
    if connection.vendor != "postgresql":
        pytest.skip("reads PostgreSQL's information_schema")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_name LIKE 'chatflow_%%' ORDER BY table_name, ordinal_position"
        )
        columns = {(t, c): (d, n) for t, c, d, n in cursor.fetchall()}
        cursor.execute(
            "SELECT delete_rule FROM information_schema.referential_constraints r"
            " JOIN information_schema.table_constraints t USING (constraint_name)"
            " WHERE t.table_name = 'chatflow_messages'"
        )
        assert cursor.fetchall() == [("CASCADE",)]
    assert columns[("chatflow_sessions", "metadata_json")] == ("jsonb", "NO")
    assert columns[("chatflow_messages", "id")] == ("bigint", "NO")
    assert columns[("chatflow_messages", "content")] == ("text", "YES")
    assert columns[("chatflow_messages", "created_at")][0] == "timestamp with time zone"
    assert columns[("chatflow_session_leases", "expires_at")] == ("double precision", "NO")


MIGRATE_SECOND = """
import sys
from django.conf import settings
settings.DATABASES["second"] = {**settings.DATABASES["default"], "NAME": sys.argv[1]}
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("migrate", database="second", verbosity=0)
"""


def test_migrate_database_runs_every_data_migration_on_that_database(tmp_path):
    # The default database is migrated first, so a data migration that queried it instead of the one being
    # migrated would read tables already in their final shape.
    env = site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'default.db'}", DJANGO_SETTINGS_MODULE="chatflow_site.settings")
    done = subprocess.run([sys.executable, "-c", MIGRATE_SECOND, str(tmp_path / "second.db")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(tmp_path / "second.db") as second:
        assert second.execute("SELECT COUNT(*) FROM chatflow_turn_records WHERE folded").fetchone() == (0,)
