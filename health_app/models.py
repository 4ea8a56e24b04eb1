"""Worker heartbeats: one row per running queue worker, rewritten every few seconds.

A worker (``webhooks_app.worker.Worker``, standalone or embedded in a server) writes its row when it
starts and then every ``CHATFLOW_HEARTBEAT_SECONDS``; it deletes the row when it stops cleanly. A row
whose ``last_beat`` is older than three intervals belongs to a process that died (or hangs): the health
page shows it as stale until an operator forgets it, or it is older than a day and the next beat of any
worker deletes it.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


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
        permissions = [("cancel_turn", "Can cancel a running turn or release a stale session lease")]

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

    delivery = models.OneToOneField("webhooks_app.InboundDelivery", on_delete=models.CASCADE, primary_key=True,
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
