"""Audit log of operator actions and the console's custom permissions on ChatSession."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0002_sessionlease"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="chatsession",
            options={
                "permissions": [
                    ("force_handoff", "Can force a handoff to another agent"),
                    ("rollback_session", "Can roll a session back to an earlier turn"),
                    ("delete_session", "Can delete a session"),
                    ("export_transcript", "Can export transcripts"),
                ],
                "verbose_name": "chat session",
            },
        ),
        migrations.CreateModel(
            name="OperatorAction",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "actor_username",
                    models.TextField(blank=True, default="", help_text="Kept when the user is deleted."),
                ),
                (
                    "action",
                    models.CharField(
                        choices=[
                            ("force_handoff", "Force handoff"),
                            ("rollback", "Roll back"),
                            ("delete", "Delete session"),
                            ("export", "Export transcript"),
                        ],
                        max_length=32,
                    ),
                ),
                ("session_id", models.TextField(db_index=True)),
                ("before", models.JSONField(blank=True, default=dict)),
                ("after", models.JSONField(blank=True, default=dict)),
                ("created_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                (
                    "actor",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "db_table": "chatflow_operator_actions",
                "ordering": ["-created_at", "-id"],
            },
        ),
    ]
