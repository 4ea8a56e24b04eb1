"""The cross-process waiting line for session leases, shared with chatflow_agent's SQLiteSessionStore."""

from django.db import migrations, models

DDL = {
    "sqlite": [
        """CREATE TABLE IF NOT EXISTS chatflow_session_waiters (
            ticket INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            owner TEXT NOT NULL UNIQUE,
            expires_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS idx_chatflow_session_waiters ON chatflow_session_waiters(session_id, ticket)",
    ],
    "postgresql": [
        """CREATE TABLE IF NOT EXISTS chatflow_session_waiters (
            ticket BIGSERIAL PRIMARY KEY,
            session_id TEXT NOT NULL,
            owner TEXT NOT NULL UNIQUE,
            expires_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS idx_chatflow_session_waiters ON chatflow_session_waiters(session_id, ticket)",
    ],
}


def create_table(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor not in DDL:
        raise RuntimeError(f"chatflow_session_waiters: no DDL for database vendor {vendor!r}")
    for statement in DDL[vendor]:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0004_operator_groups")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_table, migrations.RunPython.noop, elidable=False)],
            state_operations=[
                migrations.CreateModel(
                    name="SessionWaiter",
                    fields=[
                        ("ticket", models.BigAutoField(primary_key=True, serialize=False)),
                        ("session_id", models.TextField()),
                        ("owner", models.TextField(unique=True)),
                        ("expires_at", models.FloatField()),
                    ],
                    options={
                        "db_table": "chatflow_session_waiters",
                        "indexes": [
                            models.Index(fields=["session_id", "ticket"], name="idx_chatflow_session_waiters")
                        ],
                    },
                ),
            ],
        ),
    ]
