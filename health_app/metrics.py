"""``/metrics``: Prometheus text format, computed from the database at scrape time.

Why from the database: the site runs as several processes (daphne servers, their embedded workers,
standalone ``chatflow_worker`` processes), and a turn is played by whichever process claimed it. The
turn records and deliveries already hold every number (status, duration, time to first token, tokens,
cost, queue), so one scrape of any process sees all of them, a restart loses none, and nothing is
counted twice. Only the webhook response codes are not stored (a refused webhook writes nothing): they
are a ``prometheus_client`` counter per process, aggregated across processes by prometheus-client's
multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set (see docs/operations.md).

Metrics (names as exposed):

- ``chatflow_turns_total{status}`` — ended turns by how they ended (completed, failed, cancelled,
  interrupted); a turn an operator later rolled back stays counted as completed. A counter: a turn is
  counted once it ended and never leaves its status.
- ``chatflow_turns_rolled_back_total`` — completed turns an operator's rollback removed since.
- ``chatflow_turns_running`` — a gauge: turn records still running.
- ``chatflow_turn_duration_seconds`` — histogram of finished turns' durations.
- ``chatflow_time_to_first_token_seconds`` — histogram over model calls that reported one.
- ``chatflow_tokens_total{kind}`` — the known input, output and cached tokens of every turn (a count
  nobody reported adds nothing; it is never read as 0).
- ``chatflow_turns_tokens_unknown_total`` — ended turns whose token counts are unknown (a model call
  reported none, or the turn's process never reported).
- ``chatflow_cost_usd_total`` — the known cost of every turn (turns of unknown cost add nothing).
- ``chatflow_turns_cost_unknown_total`` — ended turns whose cost is unknown (a model without a known
  price, counts not reported, or the turn's process never reported).

A turn an operator cancelled is counted as cancelled at once, and among the unknown ones only once its
process had its chance to report (``TurnRecord.awaiting_report`` cleared), so no counter goes down.
- ``chatflow_sessions_waiting{trigger}`` — a gauge: sessions waiting for a person now, by what made them wait
  (``phrase``, ``tool``, ``failures``, ``budget``: the daily budget, ``takeover_app.budget``).
- ``chatflow_budget_answered_sessions_today`` — a gauge: sessions answered with ``CHATFLOW_BUDGET_MESSAGE`` since
  the UTC day began (their ``budget_answered`` audit entries, one a session a day).
- ``chatflow_queue_depth{provider,status}`` and ``chatflow_queue_oldest_age_seconds{provider}``.
- ``chatflow_webhook_responses_total{channel,code}`` — the webhook endpoints' answers.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from sessions_app.access import VIEW, may
from sessions_app.models import OperatorAction
from takeover_app import budget
from takeover_app.models import SessionMode
from turns_app.models import TurnRecord
from webhooks_app import taskqueue
from webhooks_app.counters import WEBHOOK_RESPONSES

__all__ = ["DURATION_BUCKETS", "TTFT_BUCKETS", "WEBHOOK_RESPONSES", "DatabaseCollector",
           "metrics_view"]

#: Histogram bucket upper bounds, seconds.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


def _bucket_label(bound: float) -> str:
    return repr(float(bound))


class DatabaseCollector(Collector):
    """The metrics read from turn records and deliveries (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._turns()
        yield self._durations()
        yield self._ttft()
        yield from self._usage()
        yield from self._queue()
        yield from self._waiting()

    def _turns(self) -> Iterator[Metric]:
        Status = TurnRecord.Status
        counts = dict(TurnRecord.objects.order_by().values_list("status").annotate(n=Count("id")))
        ended = CounterMetricFamily("chatflow_turns", "Ended turns by how they ended (turn records; a turn rolled "
                                    "back later counts as completed).", labels=["status"])
        for status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.INTERRUPTED):
            n = counts.get(status, 0) + (counts.get(Status.ROLLED_BACK, 0) if status == Status.COMPLETED else 0)
            ended.add_metric([status.value], n)
        yield ended
        yield CounterMetricFamily("chatflow_turns_rolled_back", "Completed turns an operator's rollback removed.",
                                  value=counts.get(Status.ROLLED_BACK, 0))
        yield GaugeMetricFamily("chatflow_turns_running", "Turns running now (turn records).",
                                value=counts.get(Status.RUNNING, 0))

    def _durations(self) -> Metric:
        done = TurnRecord.objects.filter(duration_ms__isnull=False).exclude(status=TurnRecord.Status.RUNNING)
        agg = done.aggregate(n=Count("id"), total=Sum("duration_ms"), **{
            f"le{i}": Count("id", filter=Q(duration_ms__lte=bound * 1000)) for i, bound in enumerate(DURATION_BUCKETS)})
        buckets = [(_bucket_label(b), agg[f"le{i}"]) for i, b in enumerate(DURATION_BUCKETS)]
        return HistogramMetricFamily("chatflow_turn_duration_seconds", "Duration of finished turns.",
                                     buckets=[*buckets, ("+Inf", agg["n"])], sum_value=(agg["total"] or 0) / 1000)

    def _ttft(self) -> Metric:
        # Per model call, inside the records' JSON: one pass (no portable SQL for it on SQLite and PostgreSQL).
        counts, n, total = [0] * len(TTFT_BUCKETS), 0, 0.0
        for calls in TurnRecord.objects.order_by().values_list("calls", flat=True).iterator(chunk_size=2000):
            for call in calls or []:
                ttft = call.get("ttft_ms") if isinstance(call, dict) else None
                if not isinstance(ttft, int | float) or isinstance(ttft, bool):
                    continue
                seconds = ttft / 1000
                n, total = n + 1, total + seconds
                for i, bound in enumerate(TTFT_BUCKETS):
                    counts[i] += seconds <= bound
        buckets = [(_bucket_label(b), c) for b, c in zip(TTFT_BUCKETS, counts, strict=True)]
        return HistogramMetricFamily("chatflow_time_to_first_token_seconds",
                                     "Time to the first streamed token of model calls.",
                                     buckets=[*buckets, ("+Inf", n)], sum_value=total)

    def _usage(self) -> Iterator[Metric]:
        # Unknown figures: of ended turns whose process reported (or never will), so each is counted once.
        settled = ~Q(status=TurnRecord.Status.RUNNING) & Q(awaiting_report=False)
        tokens_unknown = Q(input_tokens__isnull=True) | Q(output_tokens__isnull=True)
        agg = TurnRecord.objects.aggregate(sum_input=Sum("input_tokens"), sum_output=Sum("output_tokens"),
                                           sum_cached=Sum("cached_tokens"), sum_cost=Sum("cost"),
                                           unknown=Count("id", filter=settled & Q(cost__isnull=True)),
                                           tokens_unknown=Count("id", filter=settled & tokens_unknown))
        tokens = CounterMetricFamily("chatflow_tokens", "Tokens of every turn by kind.", labels=["kind"])
        for kind in ("input", "output", "cached"):
            tokens.add_metric([kind], agg[f"sum_{kind}"] or 0)
        yield tokens
        yield CounterMetricFamily("chatflow_turns_tokens_unknown", "Ended turns whose token counts are unknown "
                                  "(not reported; never counted as 0 tokens).", value=agg["tokens_unknown"] or 0)
        yield CounterMetricFamily("chatflow_cost_usd", "Known cost of every turn, US dollars.",
                                  value=float(agg["sum_cost"] or 0))
        yield CounterMetricFamily("chatflow_turns_cost_unknown", "Ended turns whose cost is unknown (a model's "
                                  "price or the token counts are unknown).", value=agg["unknown"] or 0)

    def _waiting(self) -> Iterator[Metric]:
        Mode, Trigger = SessionMode.Mode, SessionMode.Trigger
        counts = dict(SessionMode.objects.filter(mode=Mode.WAITING).order_by().values_list("trigger")
                      .annotate(n=Count("pk")))
        waiting = GaugeMetricFamily("chatflow_sessions_waiting", "Sessions waiting for a person now, by what made "
                                    "them wait.", labels=["trigger"])
        for trigger in sorted({Trigger.PHRASE, Trigger.TOOL, Trigger.FAILURES, Trigger.BUDGET, *counts}):
            waiting.add_metric([str(trigger) or "unknown"], counts.get(trigger, 0))
        yield waiting
        answered = OperatorAction.objects.filter(created_at__gte=budget.day_start(), action=budget.ANSWERED).count()
        yield GaugeMetricFamily("chatflow_budget_answered_sessions_today", "Sessions answered with the budget "
                                "message since the UTC day began.", value=answered)

    def _queue(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("chatflow_queue_depth", "Webhook deliveries queued or running.",
                                  labels=["provider", "status"])
        age = GaugeMetricFamily("chatflow_queue_oldest_age_seconds", "Age of the oldest queued delivery "
                                "(0 when none is queued).", labels=["provider"])
        for row in taskqueue.depth():
            depth.add_metric([row.provider, "queued"], row.queued)
            depth.add_metric([row.provider, "running"], row.running)
            age.add_metric([row.provider], row.oldest_age or 0.0)
        yield depth
        yield age


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)  # the webhook counter of every process sharing the directory
    else:
        registry.register(WEBHOOK_RESPONSES)
    registry.register(DatabaseCollector())
    return registry


def _bearer_ok(request: HttpRequest) -> bool:
    token = settings.CHATFLOW_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _refused(request: HttpRequest, status: int, detail: str) -> HttpResponse:
    # Django's request logger writes the one line ("Unauthorized: /metrics"); no traceback.
    response = HttpResponse(detail + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics above for a staff login with the console's view permission or ``Authorization: Bearer
    <CHATFLOW_METRICS_TOKEN>``; 401 (no credentials, or a wrong token) or 403 (a login without it), plain text."""
    user: Any = request.user
    if not _bearer_ok(request):
        if "Authorization" in request.headers:
            return _refused(request, 401, "The bearer token is not this site's CHATFLOW_METRICS_TOKEN.")
        if not user.is_authenticated:
            return _refused(request, 401, "Log in as staff or send Authorization: Bearer <CHATFLOW_METRICS_TOKEN>.")
        if not may(user, VIEW):
            return _refused(request, 403, "This account may not read the metrics (it needs console access).")
    return HttpResponse(generate_latest(_registry()), content_type="text/plain; version=0.0.4; charset=utf-8")
