"""The audit log records every turn played from the live chat page (``live_chat_turn``)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0005_sessionwaiter"),
    ]

    operations = [
        migrations.AlterField(
            model_name="operatoraction",
            name="action",
            field=models.CharField(
                choices=[
                    ("force_handoff", "Force handoff"),
                    ("rollback", "Roll back"),
                    ("delete", "Delete session"),
                    ("export", "Export transcript"),
                    ("live_chat_turn", "Live chat turn"),
                ],
                max_length=32,
            ),
        ),
    ]
