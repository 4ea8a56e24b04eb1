"""Adopt chatflow-agent's three tables.

On a database already written by chatflow-agent 0.3.4 or by chatflow_agent's SQLiteSessionStore the
tables exist and are left exactly as they are (``CREATE ... IF NOT EXISTS``); on a new database they
are created with the upstream DDL (SQLite) or its PostgreSQL equivalent. Reversing this migration
keeps the tables: they belong to the bot as much as to the site.
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

SQLITE = [
    """CREATE TABLE IF NOT EXISTS chatflow_sessions (
        session_id TEXT PRIMARY KEY,
        active_agent_name TEXT NOT NULL,
        metadata_json TEXT NOT NULL DEFAULT '{}',
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE IF NOT EXISTS chatflow_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT,
        message_json TEXT NOT NULL,
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        FOREIGN KEY(session_id) REFERENCES chatflow_sessions(session_id) ON DELETE CASCADE
    )""",
    """CREATE TABLE IF NOT EXISTS chatflow_processed_messages (
        message_id TEXT PRIMARY KEY,
        processed_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
    )""",
    "CREATE INDEX IF NOT EXISTS idx_chatflow_messages_session ON chatflow_messages(session_id, id)",
    "CREATE INDEX IF NOT EXISTS idx_chatflow_processed_at ON chatflow_processed_messages(processed_at)",
]

POSTGRESQL = [
    """CREATE TABLE IF NOT EXISTS chatflow_sessions (
        session_id TEXT PRIMARY KEY,
        active_agent_name TEXT NOT NULL,
        metadata_json JSONB NOT NULL DEFAULT '{}'::jsonb,
        created_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP,
        updated_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE IF NOT EXISTS chatflow_messages (
        id BIGSERIAL PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES chatflow_sessions(session_id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT,
        message_json TEXT NOT NULL,
        created_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE IF NOT EXISTS chatflow_processed_messages (
        message_id TEXT PRIMARY KEY,
        processed_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP
    )""",
    "CREATE INDEX IF NOT EXISTS idx_chatflow_messages_session ON chatflow_messages(session_id, id)",
    "CREATE INDEX IF NOT EXISTS idx_chatflow_processed_at ON chatflow_processed_messages(processed_at)",
]


def create_tables(apps, schema_editor):
    statements = {"sqlite": SQLITE, "postgresql": POSTGRESQL}.get(schema_editor.connection.vendor)
    if statements is None:
        raise RuntimeError(f"chatflow tables: no DDL for database vendor {schema_editor.connection.vendor!r}")
    for statement in statements:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_tables, migrations.RunPython.noop, elidable=False)],
            state_operations=[
                migrations.CreateModel(
                    name="ChatSession",
                    fields=[
                        ("session_id", models.TextField(primary_key=True, serialize=False)),
                        ("active_agent_name", models.TextField()),
                        ("metadata", models.JSONField(blank=True, db_column="metadata_json", default=dict)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                    ],
                    options={"verbose_name": "chat session", "db_table": "chatflow_sessions"},
                ),
                migrations.CreateModel(
                    name="ProcessedMessage",
                    fields=[
                        ("message_id", models.TextField(primary_key=True, serialize=False)),
                        ("processed_at", models.DateTimeField(default=django.utils.timezone.now)),
                    ],
                    options={
                        "db_table": "chatflow_processed_messages",
                        "indexes": [models.Index(fields=["processed_at"], name="idx_chatflow_processed_at")],
                    },
                ),
                migrations.CreateModel(
                    name="ChatMessage",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("role", models.TextField()),
                        ("content", models.TextField(blank=True, null=True)),
                        ("message_json", models.TextField()),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "session",
                            models.ForeignKey(
                                db_column="session_id",
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="messages",
                                to="sessions_app.chatsession",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "chatflow_messages",
                        "ordering": ["id"],
                        "indexes": [models.Index(fields=["session", "id"], name="idx_chatflow_messages_session")],
                    },
                ),
            ],
        ),
    ]
