"""Tables and indexes chatflow_agent's SQLiteSessionStore (schema version 2) adds to 0.3.4's schema.

The session lease table (cross-process turn lock) and an index on chatflow_sessions(updated_at,
session_id) for newest-first listing; same DDL as the store's, so either may create them first.
"""

from django.db import migrations, models

UPDATED_INDEX = "CREATE INDEX IF NOT EXISTS idx_chatflow_sessions_updated ON chatflow_sessions(updated_at, session_id)"

DDL = {
    "sqlite": """CREATE TABLE IF NOT EXISTS chatflow_session_leases (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        expires_at REAL NOT NULL
    )""",
    "postgresql": """CREATE TABLE IF NOT EXISTS chatflow_session_leases (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )""",
}


def create_table(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor not in DDL:
        raise RuntimeError(f"chatflow_session_leases: no DDL for database vendor {vendor!r}")
    schema_editor.execute(DDL[vendor])
    schema_editor.execute(UPDATED_INDEX)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0001_initial")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_table, migrations.RunPython.noop, elidable=False)],
            state_operations=[
                migrations.CreateModel(
                    name="SessionLease",
                    fields=[
                        ("session_id", models.TextField(primary_key=True, serialize=False)),
                        ("owner", models.TextField()),
                        ("expires_at", models.FloatField()),
                    ],
                    options={"db_table": "chatflow_session_leases"},
                ),
                migrations.AddIndex(
                    model_name="chatsession",
                    index=models.Index(fields=["updated_at", "session_id"], name="idx_chatflow_sessions_updated"),
                ),
            ],
        ),
    ]
