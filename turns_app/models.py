"""Turn records: one row per turn a Runner played on a session, and per-session usage totals.

A record is opened (status ``running``) by the write that takes the session's lease and closed by the
write that ends the turn: the commit (``completed``) or the lease release (``failed``, ``cancelled``).
``rolled_back`` marks the turns an operator rollback removed; ``interrupted`` a turn whose process died
(its lease expired while the record still said ``running``). Records outlive the session (no foreign
key), and the records of rolled back or failed turns stay.

``SessionTotals`` holds each session's sums (turns, tokens, cost, last error), updated in the same
transaction as the record, so the console's list can sort and page on them without aggregating.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class TurnRecord(models.Model):
    """One turn: who played it, how long it waited and ran, what it cost.

    ``calls`` is a list of model calls, each ``{"provider", "model", "input_tokens", "output_tokens",
    "cached_tokens", "latency_ms", "ttft_ms", "finish_reason", "retries", "cost", "price_source",
    "priced_as"}`` (``cost`` a decimal string in US dollars or null when unknown; ``price_source`` and
    ``priced_as``: where its price came from and the model name it matched, see ``chatflow_agent.pricing``);
    ``tools`` a list of ``{"name", "duration_ms", "outcome"}``; ``agents`` the agent trail (the agent that
    started the turn, then every handoff target). Durations are milliseconds. The token counts are NULL when
    a call did not report them, while the turn runs, and for a turn whose process never reported (never 0
    for unknown); ``cost`` is US dollars, NULL when any call's price or counts are unknown.
    """

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        ROLLED_BACK = "rolled_back", "Rolled back"
        CANCELLED = "cancelled", "Cancelled"
        INTERRUPTED = "interrupted", "Interrupted"

    class Source(models.TextChoices):
        WEBHOOK = "webhook", "Webhook"
        LIVE_CHAT = "live_chat", "Live chat"
        API = "api", "API"
        CONSOLE = "console", "Console"
        OTHER = "other", "Other"

    id = models.BigAutoField(primary_key=True)
    session_id = models.TextField()  # no FK: the record outlives the session's deletion
    owner = models.TextField(help_text="The lease owner that played the turn (host:pid:…).")
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.OTHER)
    first_message_id = models.BigIntegerField(null=True, blank=True, help_text="The turn's USER message row.")
    user_text = models.TextField(blank=True, default="", help_text="The customer's message (kept after a failure).")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    queue_wait_ms = models.FloatField(null=True, blank=True)
    lease_wait_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    agents = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    calls = models.JSONField(default=list, blank=True)
    tools = models.JSONField(default=list, blank=True)
    input_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    output_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    cached_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    cost = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True)
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # Counted in the dashboard's rollups yet (turns_app.rollups.fold sets it); a database default, so the
    # turn path's INSERT needs no change.
    folded = models.BooleanField(default=False, db_default=False)
    # Cancelled by an operator while its turn had not reported its figures yet (turns_app.records.cancel_turn);
    # cleared by the turn's own late close, or by the lease purge once that close can no longer come.
    awaiting_report = models.BooleanField(default=False, db_default=False)
    # Cancelled by an operator for good (turns_app.records.cancel_turn without replay): a webhook delivery whose
    # turn this was ends failed with ``error`` instead of being played again (turns_app.records.cancel_of). Not
    # set for a turn a takeover "now" stopped, nor for one that closed itself cancelled (its lease lost).
    cancelled_for_good = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "chatflow_turn_records"
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["session_id", "-id"], name="idx_turn_records_session"),
            # A session's ended records of one day: the daily budget's usage (takeover_app.budget). Partial, so
            # that the open-record statements (status running) cannot use it in place of idx_turn_records_open.
            models.Index(fields=["session_id", "started_at"], condition=~models.Q(status="running"),
                         name="idx_turn_records_session_day"),
            # Only the open records (running, or cancelled and waiting for the turn's figures): a turn's open
            # (the session's records left running) and close (its own, by owner) search it, the orphan sweep
            # and the health page's stuck turns scan it.
            models.Index(fields=["session_id", "owner"],
                         condition=models.Q(status="running") | models.Q(awaiting_report=True),
                         name="idx_turn_records_open"),
            # Only the records the rollups have not counted yet: small whatever the table's size.
            models.Index(fields=["id"], condition=models.Q(folded=False), name="idx_turn_records_unfolded"),
            models.Index(fields=["finished_at"], condition=models.Q(awaiting_report=True),
                         name="idx_turn_records_awaiting"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} turn #{self.id} ({self.status})"

    @property
    def total_tokens(self) -> int | None:
        """Input plus output tokens; None when either is unknown."""
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return self.input_tokens + self.output_tokens


class SessionTotals(models.Model):
    """Per-session sums over its turn records, kept in step with them (same transaction).

    The token columns and ``cost`` (US dollars) sum the counted turns' known figures and are NULL while
    none is known (SQL's ``SUM``); ``tokens_known`` / ``cost_known`` are False once a counted turn's
    tokens / cost were unknown (the sums are then lower bounds). ``last_error`` is the error of the
    newest failed or interrupted turn, cleared by a later completed one.
    """

    session_id = models.TextField(primary_key=True)  # no FK: like the records, outlives the session
    turns = models.IntegerField(default=0)
    input_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    output_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    cached_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    total_tokens = models.BigIntegerField(null=True, blank=True, default=None)
    tokens_known = models.BooleanField(default=True, db_default=True,
                                       help_text="False once a counted turn's token counts were unknown.")
    cost = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True, default=None,
                               help_text="Sum of the known costs (NULL while none is known).")
    cost_known = models.BooleanField(default=True, help_text="False once a counted turn's cost was unknown.")
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chatflow_session_totals"
        indexes = [
            models.Index(fields=["total_tokens", "session_id"], name="idx_session_totals_tokens"),
            models.Index(fields=["cost", "session_id"], name="idx_session_totals_cost"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}: {self.total_tokens if self.total_tokens is not None else 'unknown'} tokens"


class TurnRollup(models.Model):
    """The turn records of one UTC hour (``span`` hour) or day (``span`` day) with one status, summed
    (``turns_app.rollups`` writes both: a month is then read one row per day and status, not per hour).

    ``latency`` is a histogram of ``duration_ms``: ``{"<bucket>": count}``, bucket ``b`` holding the
    durations in ``(RATIO ** (b - 1), RATIO ** b]`` milliseconds (``turns_app.rollups.RATIO``); ``cost``
    sums the known costs (US dollars), ``cost_unknown`` counts the turns whose cost was unknown; the token
    columns sum the known counts (a turn whose counts are unknown adds nothing).
    """

    span = models.CharField(max_length=4, choices=[("hour", "Hour"), ("day", "Day")], default="hour")
    start = models.DateTimeField(help_text="The UTC hour (or day, at 00:00) the turns started in.")
    status = models.CharField(max_length=16, choices=TurnRecord.Status.choices)
    turns = models.IntegerField(default=0)
    latency = models.JSONField(default=dict, blank=True)
    cost = models.DecimalField(max_digits=20, decimal_places=10, default=0)
    cost_unknown = models.IntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)

    class Meta:
        db_table = "chatflow_turn_rollups"
        constraints = [models.UniqueConstraint(fields=["span", "start", "status"], name="uniq_turn_rollup")]

    def __str__(self) -> str:
        return f"{self.span} {self.start:%Y-%m-%d %H}:00 {self.status}: {self.turns}"


class HandoffRollup(models.Model):
    """How many handoffs from one agent to another the turns started in one UTC hour (or day) made."""

    span = models.CharField(max_length=4, choices=[("hour", "Hour"), ("day", "Day")], default="hour")
    start = models.DateTimeField()
    source = models.TextField()
    target = models.TextField()
    handoffs = models.IntegerField(default=0)

    class Meta:
        db_table = "chatflow_handoff_rollups"
        constraints = [models.UniqueConstraint(fields=["span", "start", "source", "target"],
                                               name="uniq_handoff_rollup")]

    def __str__(self) -> str:
        return f"{self.span} {self.start:%Y-%m-%d %H}:00 {self.source} → {self.target}: {self.handoffs}"


class RollupState(models.Model):
    """The rollups' lock row: a fold or a restatus updates it first, so they run one at a time;
    ``generation`` counts them (the update that takes the lock), ``folded_at`` is when the last one ran."""

    name = models.CharField(max_length=32, primary_key=True)
    generation = models.BigIntegerField(default=0)
    folded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chatflow_rollup_watermarks"

    def __str__(self) -> str:
        return f"{self.name}: generation {self.generation}"
