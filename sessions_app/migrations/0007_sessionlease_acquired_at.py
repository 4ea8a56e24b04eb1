"""``chatflow_session_leases.acquired_at``: when the holder took the lease (the console shows it).

The same nullable column chatflow_agent's SQLiteSessionStore adds; either may add it first.
"""

from django.db import migrations, models


def add_column(apps, schema_editor):
    conn = schema_editor.connection
    if conn.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE chatflow_session_leases ADD COLUMN IF NOT EXISTS acquired_at DOUBLE PRECISION")
    elif conn.vendor == "sqlite":
        with conn.cursor() as cursor:
            columns = {row[1] for row in cursor.execute("PRAGMA table_info(chatflow_session_leases)").fetchall()}
        if "acquired_at" not in columns:
            schema_editor.execute("ALTER TABLE chatflow_session_leases ADD COLUMN acquired_at REAL")
    else:
        raise RuntimeError(f"chatflow_session_leases: no DDL for database vendor {conn.vendor!r}")


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0006_operatoraction_live_chat_turn")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_column, migrations.RunPython.noop, elidable=False)],
            state_operations=[
                migrations.AddField(
                    model_name="sessionlease",
                    name="acquired_at",
                    field=models.FloatField(blank=True, null=True),
                ),
            ],
        ),
    ]
