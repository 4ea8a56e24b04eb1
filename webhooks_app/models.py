"""The webhook inbox: one ``InboundDelivery`` per provider message id, which is also the durable queue.

A delivery is accepted (``inbox.accept``) in the same transaction that claims its id in
``chatflow_processed_messages`` (invariant 6), is claimed by a worker with a visibility timeout
(``lease_owner`` / ``lease_expires_at``), plays one turn, and records its reply. Its life:

    queued → running → done            (reply: sending → sent | failed; none when nothing is sent;
                                        held: stored for the operator who owns the session, no turn played)
                     ↘ failed → (console retry or provider redelivery) → queued
    queued | running (turn not played yet) → cancelled    (an operator deleted the session)

Deleting a session cancels its open deliveries and redacts the texts of all of them (``settle``);
their provider ids and claims stay, so a redelivery is still suppressed as a duplicate.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class InboundDelivery(models.Model):
    """A message a channel (WhatsApp, Telegram, generic) delivered to a webhook, and what became of it."""

    class Provider(models.TextChoices):
        WHATSAPP = "whatsapp", "WhatsApp"
        TELEGRAM = "telegram", "Telegram"
        GENERIC = "generic", "Generic"

    class Kind(models.TextChoices):
        TEXT = "text", "Text (a turn)"
        UNSUPPORTED = "unsupported", "Unsupported type (polite reply)"
        RESET = "reset", "Reset (clears history)"

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled (session deleted)"

    class Reply(models.TextChoices):
        PENDING = "", "Not yet"
        NONE = "none", "Nothing to send"
        SENDING = "sending", "Sending (or lost in a crash: never re-sent)"
        SENT = "sent", "Sent"
        FAILED = "failed", "Send failed"
        HELD = "held", "Held for operator"

    id = models.BigAutoField(primary_key=True)
    provider = models.CharField(max_length=16, choices=Provider.choices)
    provider_message_id = models.TextField(help_text="wamid, Telegram update_id or the generic message_id.")
    claim_key = models.TextField(help_text="The id claimed in chatflow_processed_messages.")
    session_id = models.TextField()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TEXT)
    text = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True, help_text="Session metadata from the channel.")
    payload = models.JSONField(default=dict, blank=True, help_text="The provider's message object.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    duplicates_suppressed = models.PositiveIntegerField(default=0)
    token = models.CharField(max_length=32, help_text="Marks the turn of this delivery in the session's metadata.")
    lease_owner = models.TextField(blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    answer = models.TextField(blank=True, default="")
    reply_status = models.CharField(max_length=8, choices=Reply.choices, default=Reply.PENDING, blank=True)
    reply_error = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chatflow_inbound_deliveries"
        verbose_name = "inbound delivery"
        verbose_name_plural = "inbound deliveries"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "provider_message_id"], name="uniq_inbound_provider_message"),
        ]
        indexes = [
            models.Index(fields=["status", "id"], name="idx_inbound_status"),
            models.Index(fields=["session_id", "id"], name="idx_inbound_session"),
            # The queue's "no earlier open delivery of this session" check: two seeks, however long the
            # session's history of done deliveries is.
            models.Index(fields=["session_id", "status", "id"], name="idx_inbound_session_status"),
        ]
        permissions = [("retry_delivery", "Can retry a failed webhook delivery"),
                       ("resend_reply", "Can send a delivery's reply to the customer again")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.provider_message_id} ({self.status})"

    @property
    def marker(self) -> str:
        """The value this delivery's turn writes to the session metadata key ``webhook_delivery``."""
        return f"{self.pk}:{self.token}"


#: Providers with an API a reply is sent through (``webhooks_app.replies``): the bot's answers and an
#: operator's replies go out only on these. A generic webhook's integration reads them from the transcript.
SENDING_PROVIDERS = frozenset({InboundDelivery.Provider.WHATSAPP.value, InboundDelivery.Provider.TELEGRAM.value})


# ---- the pipeline's instrumentation: worker heartbeats, queue samples, delivery traces ---------------------------
# Written by the queue workers (``webhooks_app.heartbeat``) and the tracing of deliveries (``webhooks_app.tracing``);
# read by the health page and the dashboard (``health_app``). The tables keep the names they had in health_app.


class WorkerHeartbeat(models.Model):
    """A queue worker process: where it runs, since when, when it last beat and how many deliveries it played."""

    owner = models.TextField(primary_key=True, help_text="The worker's lease owner (worker:host:pid:…).")
    host = models.TextField()
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    last_beat = models.DateTimeField(default=timezone.now)
    processed = models.PositiveBigIntegerField(default=0, help_text="Deliveries whose turn it played.")

    class Meta:
        db_table = "chatflow_worker_heartbeats"
        ordering = ["host", "pid", "owner"]
        # Its permissions (view, cancel_turn) stay health_app's: they are declared on health_app.WorkerHeartbeat.
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.owner} ({'stale' if self.stale else 'alive'})"

    @staticmethod
    def stale_before() -> timezone.datetime:
        """A heartbeat older than this (three beat intervals ago) is stale."""
        return timezone.now() - timedelta(seconds=3 * settings.CHATFLOW_HEARTBEAT_SECONDS)

    @property
    def stale(self) -> bool:
        return self.last_beat < self.stale_before()


class DeliveryTrace(models.Model):
    """The trace context (W3C ``traceparent``) a webhook delivery carries from its acknowledgement to the
    worker that plays it: written in the inbox's transaction, only while tracing is on."""

    delivery = models.OneToOneField(InboundDelivery, on_delete=models.CASCADE, primary_key=True,
                                    related_name="+")
    traceparent = models.CharField(max_length=55)

    class Meta:
        db_table = "chatflow_delivery_traces"

    def __str__(self) -> str:
        return f"{self.delivery_id}: {self.traceparent}"


class QueueSample(models.Model):
    """The webhook queue's depth at one moment (deliveries queued and running, every provider), written
    by a queue worker's heartbeat once a minute; the dashboard draws the last day of them."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    queued = models.IntegerField(default=0)
    running = models.IntegerField(default=0)

    class Meta:
        db_table = "chatflow_queue_samples"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M}: {self.queued} queued, {self.running} running"
