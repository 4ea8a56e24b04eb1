"""Django models on the chatflow tables.

``ChatSession``, ``ChatMessage`` and ``ProcessedMessage`` map chatflow-agent 0.3.4's three tables with
their exact names and columns, and ``SessionLease`` the lease table the runtime's SQLiteSessionStore
creates: other software (a bot process on SQLiteSessionStore, 0.3.4 itself) writes the same rows with
raw SQL. The database side of these tables is therefore written by hand in the migrations
(``CREATE TABLE IF NOT EXISTS``, per vendor) and never by Django's schema editor: a change to one of
these models needs a ``SeparateDatabaseAndState`` migration, never a plain ``AlterField`` (on SQLite
that rebuilds the table from Django's state and drops AUTOINCREMENT, defaults and the cascade).

Timestamps: the runtime writes UTC text ``YYYY-MM-DD HH:MM:SS[.ffffff]`` on SQLite; Django reads both
forms as aware UTC datetimes.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

#: The longest session id the console and the live chat accept (characters). The column is unbounded
#: text; every channel caps the ids it derives to this length, so a longer one is refused, never cut.
SESSION_ID_MAX_LENGTH = 255


class ChatSession(models.Model):
    """One conversation: its active agent and free-form metadata (channel, user ids, …)."""

    session_id = models.TextField(primary_key=True)
    active_agent_name = models.TextField()
    metadata = models.JSONField(db_column="metadata_json", default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chatflow_sessions"
        verbose_name = "chat session"
        indexes = [models.Index(fields=["updated_at", "session_id"], name="idx_chatflow_sessions_updated")]
        permissions = [
            ("force_handoff", "Can force a handoff to another agent"),
            ("rollback_session", "Can roll a session back to an earlier turn"),
            ("delete_session", "Can delete a session"),
            ("export_transcript", "Can export transcripts"),
        ]

    def __str__(self) -> str:
        return self.session_id


class ChatMessage(models.Model):
    """One message; ``message_json`` is ``chatflow_agent.types.Message.model_dump_json()``. Order is ``id``."""

    id = models.BigAutoField(primary_key=True)
    session = models.ForeignKey(
        ChatSession,
        on_delete=models.CASCADE,  # the table's FK also says ON DELETE CASCADE: the runtime deletes with raw SQL
        db_column="session_id",
        db_index=False,  # covered by idx_chatflow_messages_session (session_id, id)
        related_name="messages",
    )
    role = models.TextField()
    content = models.TextField(null=True, blank=True)
    message_json = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chatflow_messages"
        ordering = ["id"]
        indexes = [models.Index(fields=["session", "id"], name="idx_chatflow_messages_session")]

    def __str__(self) -> str:
        return f"{self.role} #{self.id}"


class ProcessedMessage(models.Model):
    """A claimed webhook message id (de-duplication); the TTL runs from ``processed_at``."""

    message_id = models.TextField(primary_key=True)
    processed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chatflow_processed_messages"
        indexes = [models.Index(fields=["processed_at"], name="idx_chatflow_processed_at")]

    def __str__(self) -> str:
        return self.message_id


class SessionLease(models.Model):
    """Cross-process turn lock on one session: held by ``owner`` (``host:pid:…``) since ``acquired_at`` until
    ``expires_at`` (unix epoch seconds; ``acquired_at`` is NULL when older code wrote the row).

    No foreign key: a lease is taken before the session row may exist, and outlives its deletion.
    """

    session_id = models.TextField(primary_key=True)
    owner = models.TextField()
    expires_at = models.FloatField()
    acquired_at = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "chatflow_session_leases"

    def __str__(self) -> str:
        return f"{self.session_id} → {self.owner}"

    @property
    def acquired(self) -> datetime | None:
        """``acquired_at`` as an aware UTC datetime (None when unknown)."""
        return None if self.acquired_at is None else datetime.fromtimestamp(self.acquired_at, UTC)

    @property
    def expires(self) -> datetime:
        """``expires_at`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.expires_at, UTC)

    @property
    def expired(self) -> bool:
        """True once the lease may be taken over (its holder stopped renewing it: it ended or died)."""
        return self.expires_at < time.time()


class SessionWaiter(models.Model):
    """A turn waiting for a session's lease: the lease goes to the lowest ``ticket`` in line (FIFO across
    processes). A waiter whose ``expires_at`` (unix epoch seconds) passed has stopped polling and is skipped.
    """

    ticket = models.BigAutoField(primary_key=True)
    session_id = models.TextField()
    owner = models.TextField(unique=True)
    expires_at = models.FloatField()

    class Meta:
        db_table = "chatflow_session_waiters"
        indexes = [models.Index(fields=["session_id", "ticket"], name="idx_chatflow_session_waiters")]

    def __str__(self) -> str:
        return f"{self.session_id} #{self.ticket} ({self.owner})"


class OperatorAction(models.Model):
    """Audit log of operator actions. ``session_id`` is plain text so the entry survives the session's deletion."""

    class Kind(models.TextChoices):
        FORCE_HANDOFF = "force_handoff", "Force handoff"
        ROLLBACK = "rollback", "Roll back"
        DELETE = "delete", "Delete session"
        EXPORT = "export", "Export transcript"
        LIVE_CHAT_TURN = "live_chat_turn", "Live chat turn"

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_username = models.TextField(blank=True, default="", help_text="Kept when the user is deleted.")
    action = models.CharField(max_length=32, choices=Kind.choices)
    session_id = models.TextField(db_index=True)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "chatflow_operator_actions"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.actor_username or 'system'}: {self.action} {self.session_id}"

    @staticmethod
    def label_of(action: str) -> str:
        """Its ``Kind`` label, else the value made readable (``retry_delivery`` → "Retry delivery")."""
        return dict(OperatorAction.Kind.choices).get(action) or action.replace("_", " ").capitalize()

    @classmethod
    def action_choices(cls) -> list[tuple[str, str]]:
        """``(value, label)`` of every action the log can be filtered by: each ``Kind``, then every other value
        recorded (actions written by other apps, e.g. ``retry_delivery``), in value order."""
        declared = dict(cls.Kind.choices)
        recorded = cls.objects.order_by("action").values_list("action", flat=True).distinct()
        return [*declared.items(), *((value, cls.label_of(value)) for value in recorded if value not in declared)]

    @property
    def action_label(self) -> str:
        return self.label_of(self.action)
