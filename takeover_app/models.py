"""Human takeover's tables: the mode of each session and the replies operators wrote.

``session_id`` is plain text (no foreign key), like ``OperatorAction``: a mode row is written under
the session's turn lock before the session row may exist. Deleting the session deletes both (registered
with ``sessions_app.holdings`` in ``TakeoverAppConfig.ready``).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from webhooks_app.models import SENDING_PROVIDERS


class SessionMode(models.Model):
    """Who answers a session: the bot (default, no row needed), nobody yet (``waiting``) or an operator.

    One row per session that is not in ``bot`` mode or has been once (the row then keeps its history
    fields). ``unread`` counts the customer messages stored since the owner last replied or looked.
    ``pending_note`` is the hand-back note not yet given to a model call (cleared by the turn that
    received it); ``last_note`` keeps the latest one for operators.
    """

    class Mode(models.TextChoices):
        BOT = "bot", "Bot"
        WAITING = "waiting", "Waiting for an operator"
        HUMAN = "human", "Operator"

    class Trigger(models.TextChoices):
        OPERATOR = "operator", "An operator took over"
        PHRASE = "phrase", "The customer asked for a person"
        TOOL = "tool", "An agent called request_human"
        FAILURES = "failures", "Consecutive failed turns"
        BUDGET = "budget", "Daily budget reached"
        IDLE = "idle", "Idle timeout"
        HANDBACK = "handback", "Handed back"

    session_id = models.TextField(primary_key=True)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.BOT)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    owner_username = models.TextField(blank=True, default="", help_text="Kept when the user is deleted.")
    since = models.DateTimeField(default=timezone.now, help_text="When the session entered this mode.")
    trigger = models.CharField(max_length=16, choices=Trigger.choices, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    previous_agent = models.TextField(blank=True, default="", help_text="The active agent before the takeover.")
    pending_note = models.TextField(blank=True, default="", help_text="For the next model call only.")
    last_note = models.TextField(blank=True, default="")
    unread = models.PositiveIntegerField(default=0)
    waiting_since = models.DateTimeField(null=True, blank=True)
    customer_last_at = models.DateTimeField(null=True, blank=True, help_text="The customer's last message.")
    failed_turns = models.PositiveIntegerField(default=0, help_text="Consecutive failed turns (bot mode).")
    held_unanswered = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Customer messages held for an operator and handed back unanswered "
                                           "(the list's flag); 0 again at the next takeover or hand-back.")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chatflow_session_modes"
        indexes = [models.Index(fields=["mode", "waiting_since"], name="idx_session_modes_mode")]
        permissions = [("take_over", "Can take over a session and hand it back"),
                       ("reply_as_operator", "Can reply to a customer as an operator")]

    def __str__(self) -> str:
        return f"{self.session_id}: {self.mode}"


class OperatorReply(models.Model):
    """A message an operator wrote to the customer: its stored MODEL row and its delivery on the channel.

    ``status`` is ``sending`` (committed before the send), then ``sent`` or ``failed``. A ``sending``
    row whose sender died is shown as unknown (:attr:`unknown`): it may have gone out, so it is never
    sent again by itself; an operator may resend it.
    """

    class Status(models.TextChoices):
        SENDING = "sending", "Sending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    id = models.BigAutoField(primary_key=True)
    session_id = models.TextField()
    message_row_id = models.BigIntegerField(null=True, blank=True, help_text="Its chatflow_messages row.")
    text = models.TextField()
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    author_username = models.TextField(blank=True, default="")
    provider = models.CharField(max_length=16, blank=True, default="", help_text="whatsapp, telegram, web, …")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.SENDING)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    sender = models.TextField(blank=True, default="", help_text="The process sending it (host:pid:…).")
    created_at = models.DateTimeField(default=timezone.now)
    attempted_at = models.DateTimeField(null=True, blank=True, help_text="When the last send began.")
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chatflow_operator_replies"
        ordering = ["id"]
        indexes = [models.Index(fields=["session_id", "id"], name="idx_operator_replies_session")]

    def __str__(self) -> str:
        return f"{self.session_id} #{self.pk} ({self.status})"

    #: A send that began longer ago than this (seconds) and is still ``sending`` lost its sender.
    SEND_DEADLINE = 120.0

    @property
    def unknown(self) -> bool:
        """True for a ``sending`` reply whose sender stopped (crashed) before recording the outcome."""
        if self.status != self.Status.SENDING:
            return False
        began = self.attempted_at or self.created_at
        return (timezone.now() - began).total_seconds() > self.SEND_DEADLINE

    @classmethod
    def transcript_only(cls, provider: str) -> bool:
        """True when a reply recorded with ``provider`` (the webhook its session arrived through, '' for none)
        goes nowhere but the transcript: any provider without an API to send with
        (``webhooks_app.models.SENDING_PROVIDERS``)."""
        return provider.lower() not in SENDING_PROVIDERS

    @property
    def shown_status(self) -> str:
        """``sending``, ``sent``, ``failed``, ``unknown`` (a dead sender's ``sending``) or ``in_transcript``
        (a ``sent`` reply on a :meth:`transcript_only` channel: nothing went out)."""
        if self.status == self.Status.SENT and self.transcript_only(self.provider):
            return "in_transcript"
        return "unknown" if self.unknown else self.status

    @property
    def shown_status_text(self) -> str:
        """:attr:`shown_status` in words, as the console shows it."""
        status = self.shown_status
        return "in the transcript (the channel sends nothing out)" if status == "in_transcript" else status

    @property
    def resendable(self) -> bool:
        return self.status == self.Status.FAILED or self.unknown

    @classmethod
    def needing_resend(cls) -> models.QuerySet[OperatorReply]:
        """Every session's replies that :attr:`resendable` holds for, as a queryset: ``failed``, or ``sending``
        with its last send begun more than ``SEND_DEADLINE`` seconds ago (unknown)."""
        before = timezone.now() - timedelta(seconds=cls.SEND_DEADLINE)
        began_long_ago = Q(attempted_at__lt=before) | Q(attempted_at__isnull=True, created_at__lt=before)
        return cls.objects.filter(Q(status=cls.Status.FAILED) | Q(began_long_ago, status=cls.Status.SENDING))
