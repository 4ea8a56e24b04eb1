"""What the dashboard draws: turn, latency, failure, cost and handoff series over a time range, and the
queue depth over the last day, read from the hourly and daily rollups (``turns_app.rollups``) and the
queue samples.

:func:`build` only reads (it works on a read-only connection): one rollup row per bucket (hour for 24 h, day
for 7 and 30 days) and status plus one per bucket and agent pair, whatever the number of sessions, the ended
records not folded yet (``turns_app.rollups.read``), the days the range touches for the cost chart, and the
last day's queue samples.
Hours and days are UTC. Each chart is a :class:`Chart`: the rows of its accessible table and the SVG
drawn from the same rows (``health_app.charts``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from health_app import charts
from takeover_app import escalations
from takeover_app.models import SessionMode
from turns_app import rollups
from webhooks_app.models import QueueSample

__all__ = ["RANGES", "STATUSES", "FAILED", "Chart", "Dashboard", "RangeError", "build", "parse_range"]

#: The time ranges offered: name → (label, length, bucket length).
RANGES = {
    "24h": ("24 h", timedelta(hours=24), timedelta(hours=1)),
    "7d": ("7 d", timedelta(days=7), timedelta(days=1)),
    "30d": ("30 d", timedelta(days=30), timedelta(days=1)),
}
DEFAULT_RANGE = "24h"
#: Ended statuses in the order the turns chart stacks them.
STATUSES = ("completed", "failed", "interrupted", "cancelled", "rolled_back")
#: The statuses counted as failures in the failure rate (over every ended turn).
FAILED = ("failed", "interrupted")
_LABELS = {"completed": "Completed", "failed": "Failed", "interrupted": "Interrupted", "cancelled": "Cancelled",
           "rolled_back": "Rolled back"}


class RangeError(ValueError):
    """A ``range`` that is not one of :data:`RANGES`."""


def parse_range(value: str | None) -> str:
    """The range name for a ``?range=`` value (absent or empty: the default); :class:`RangeError` otherwise."""
    if not value:
        return DEFAULT_RANGE
    if value not in RANGES:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise RangeError(f"Unknown time range {shown!r}: choose one of {', '.join(RANGES)}.")
    return value


@dataclass(frozen=True)
class Chart:
    """One chart: ``columns`` heads its table, ``rows`` are ``(label, *cells)`` (cells as shown), ``svg`` the
    picture drawn from the same numbers."""

    key: str
    title: str
    description: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    svg: str
    legend: list[tuple[str, str]] = field(default_factory=list)  # (css class, label)
    empty: bool = False
    note: str = ""


@dataclass(frozen=True)
class Dashboard:
    range: str
    label: str
    since: datetime
    until: datetime
    turns: int
    failure_rate: float | None
    p95_ms: float | None
    cost: Decimal
    cost_unknown: int
    charts: list[Chart]


def _floor(moment: datetime, step: timedelta) -> datetime:
    return rollups.floor(moment, "day" if step >= timedelta(days=1) else "hour")


def _buckets(now: datetime, length: timedelta, step: timedelta) -> list[datetime]:
    last = _floor(now, step)
    return [last - step * i for i in range(int(length / step) - 1, -1, -1)]


def _label(moment: datetime, step: timedelta) -> str:
    return moment.strftime("%b %d") if step >= timedelta(days=1) else moment.strftime("%H:00")


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f} ms" if value < 10_000 else f"{value / 1000:,.1f} s"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} %"


def _usd(value: Decimal) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def build(range_name: str, now: datetime | None = None) -> Dashboard:
    """The dashboard for ``range_name`` (one of :data:`RANGES`) ending ``now`` (default: now)."""
    now = now or timezone.now()
    label, length, step = RANGES[range_name]
    buckets = _buckets(now, length, step)
    day = timedelta(days=1)
    days = [_floor(buckets[0], day) + day * i for i in range((_floor(now, day) - _floor(buckets[0], day)) // day + 1)]
    hourly = step < day
    # One read (one snapshot) for every chart, keyed by the buckets' own starts; for hours it starts with the
    # range's first whole day, which the daily cost chart covers.
    tally = rollups.read(days[0] if hourly else buckets[0], "hour" if hourly else "day")
    per: dict[datetime, dict[str, rollups.Cell]] = defaultdict(lambda: defaultdict(rollups.Cell))
    for (start, status), cell in tally.cells.items():
        if start >= buckets[0]:
            per[start][status] = cell
    daily: dict[datetime, rollups.Cell] = defaultdict(rollups.Cell)
    if hourly:  # the cost chart is daily: whole days, the range's first one included
        for (start, _), cell in tally.by_day().cells.items():
            daily[start].add(cell)
    total = rollups.Cell()
    counts: dict[str, int] = defaultdict(int)
    for bucket in buckets:
        for status, cell in per[bucket].items():
            total.add(cell)
            counts[status] += cell.turns
            if not hourly:
                daily[bucket].add(cell)
    pairs: dict[tuple[str, str], int] = defaultdict(int)
    for (start, source, target), n in tally.handoffs.items():
        if start >= buckets[0]:
            pairs[(source, target)] += n
    latency = rollups.Cell()
    for b in buckets:
        latency.add(per[b]["completed"])
    ended = sum(counts.values())
    charts_ = [
        _turns_chart(buckets, step, per), _latency_chart(buckets, step, per), _failure_chart(buckets, step, per),
        _cost_chart(days, daily), _handoff_chart(pairs), _escalation_chart(buckets[0], now), _queue_chart(now),
    ]
    return Dashboard(range_name, label, buckets[0], now, ended,
                     sum(counts[s] for s in FAILED) / ended * 100 if ended else None,
                     rollups.quantile(latency.latency, 0.95), total.cost, total.cost_unknown, charts_)


def _turns_chart(buckets: list[datetime], step: timedelta, per: Any) -> Chart:
    labels = [_label(b, step) for b in buckets]
    series = [(f"status-{s}", _LABELS[s], [per[b][s].turns for b in buckets]) for s in STATUSES]
    rows = [(labels[i], *(str(v[i]) for _, _, v in series), str(sum(v[i] for _, _, v in series)))
            for i in range(len(buckets))]
    unit = "hour" if step < timedelta(days=1) else "day"
    return Chart("turns", f"Turns per {unit} by status", f"Ended turns per {unit} (UTC), stacked by how they ended.",
                 ("Time (UTC)", *(_LABELS[s] for s in STATUSES), "Total"), rows,
                 charts.bars(labels, series, title=f"Turns per {unit} by status", integer=True),
                 [(c, name) for c, name, _ in series], empty=not any(sum(v) for _, _, v in series))


def _latency_chart(buckets: list[datetime], step: timedelta, per: Any) -> Chart:
    labels = [_label(b, step) for b in buckets]
    p50 = [rollups.quantile(per[b]["completed"].latency, 0.5) for b in buckets]
    p95 = [rollups.quantile(per[b]["completed"].latency, 0.95) for b in buckets]
    rows = [(labels[i], _ms(p50[i]), _ms(p95[i]), str(per[b]["completed"].turns)) for i, b in enumerate(buckets)]
    series = [("line-p50", "p50", p50), ("line-p95", "p95", p95)]
    return Chart("latency", "Turn latency p50 / p95",
                 "Duration of completed turns (lease taken to commit), median and 95th percentile; "
                 "each figure is at most 10 % above the true one.",
                 ("Time (UTC)", "p50", "p95", "Completed turns"), rows,
                 charts.lines(labels, series, title="Turn latency p50 / p95", unit="ms"),
                 [(c, name) for c, name, _ in series], empty=all(v is None for v in p95))


def _failure_chart(buckets: list[datetime], step: timedelta, per: Any) -> Chart:
    labels = [_label(b, step) for b in buckets]
    rates: list[float | None] = []
    rows = []
    for i, b in enumerate(buckets):
        ended = sum(per[b][s].turns for s in STATUSES)
        failed = sum(per[b][s].turns for s in FAILED)
        rates.append(failed / ended * 100 if ended else None)
        rows.append((labels[i], _pct(rates[-1]), str(failed), str(ended)))
    return Chart("failures", "Failure rate",
                 "Failed and interrupted turns as a share of every ended turn.",
                 ("Time (UTC)", "Failure rate", "Failed or interrupted", "Ended turns"), rows,
                 charts.lines(labels, [("line-failure", "Failure rate", rates)], title="Failure rate", unit="%",
                              top=100.0),
                 [("line-failure", "Failure rate")], empty=all(r is None for r in rates))


def _cost_chart(days: list[datetime], daily: dict[datetime, rollups.Cell]) -> Chart:
    labels = [_label(d, timedelta(days=1)) for d in days]
    costs = [float(daily[d].cost) for d in days]
    rows = [(labels[i], _usd(daily[d].cost), str(daily[d].cost_unknown)) for i, d in enumerate(days)]
    return Chart("cost", "Cost per day",
                 "Known cost (US dollars) of the turns started each day (UTC), whatever their end; turns of a "
                 "model without a known price are counted apart.",
                 ("Day (UTC)", "Cost", "Turns without a known price"), rows,
                 charts.bars(labels, [("bar-cost", "Cost", costs)], title="Cost per day", unit="$"),
                 [("bar-cost", "Cost (US dollars)")],
                 empty=not any(daily[d].turns for d in days), note=_unpriced(sum(daily[d].cost_unknown for d in days)))


def _unpriced(turns: int) -> str:
    if not turns:
        return ""
    return (f"{turns} turn{'s' if turns != 1 else ''} without a known cost (a model without a known price, or "
            "usage its provider never reported): not counted here (prices come from genai-prices and "
            "CHATFLOW_MODEL_PRICES). This chart covers whole UTC days, so it may count more turns than the range "
            "above.")


def _handoff_chart(pairs: dict[tuple[str, str], int]) -> Chart:
    ranked = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
    labels = [f"{s} → {t}" for (s, t), _ in ranked]
    rows = [(s, t, str(n)) for (s, t), n in ranked]
    return Chart("handoffs", "Handoffs between agents",
                 "Handoffs made by the turns in the range, by agent pair (from → to), whatever the turn's end.",
                 ("From", "To", "Handoffs"), rows, charts.hbars(labels, [n for _, n in ranked],
                                                                 title="Handoffs between agents"),
                 [("bar-handoff", "Handoffs")], empty=not ranked)


def _escalation_chart(since: datetime, now: datetime) -> Chart:
    """Sessions that started waiting for a person in the range, by trigger, with the share operators marked
    "not needed" (``takeover_app.escalations``)."""
    labels = dict(SessionMode.Trigger.choices)
    counted = escalations.counts(since, now)
    names = [labels.get(c.trigger, c.trigger) for c in counted]
    rows = [(name, str(c.escalations), str(c.not_needed), _pct(c.not_needed_rate)) for name, c in zip(
        names, counted, strict=True)]
    total, needless = sum(c.escalations for c in counted), sum(c.not_needed for c in counted)
    if counted:
        rows.append(("All triggers", str(total), str(needless), _pct(needless / total * 100)))
    return Chart("escalations", "Escalations to a person",
                 "Bot sessions that started waiting for a person in the range, by what fired it (a phrase the "
                 "customer wrote, an agent's request_human call, failed turns), and how many of them operators "
                 "marked not needed.",
                 ("Trigger", "Escalations", "Not needed", "Not needed rate"), rows,
                 charts.hbars(names, [c.escalations for c in counted], title="Escalations to a person"),
                 [("bar-handoff", "Escalations")], empty=not counted)


def _queue_chart(now: datetime) -> Chart:
    step = timedelta(hours=1)
    buckets = _buckets(now, timedelta(hours=24), step)
    queued: dict[datetime, int] = {}
    running: dict[datetime, int] = {}
    for at, q, r in QueueSample.objects.filter(at__gte=buckets[0]).values_list("at", "queued", "running"):
        hour = _floor(at, step)
        queued[hour] = max(queued.get(hour, 0), q)
        running[hour] = max(running.get(hour, 0), r)
    labels = [_label(b, step) for b in buckets]
    q_series = [float(queued[b]) if b in queued else None for b in buckets]
    r_series = [float(running[b]) if b in running else None for b in buckets]
    rows = [(labels[i], str(queued.get(b, "—")), str(running.get(b, "—"))) for i, b in enumerate(buckets)]
    series = [("line-queued", "Queued (max)", q_series), ("line-running", "Running (max)", r_series)]
    return Chart("queue", "Queue depth, last 24 h",
                 "Webhook deliveries queued and running, the highest sample of each hour (UTC); queue workers "
                 "sample the queue once a minute. An hour without a sample shows no point.",
                 ("Hour (UTC)", "Queued (max)", "Running (max)"), rows,
                 charts.lines(labels, series, title="Queue depth, last 24 h", integer=True),
                 [(c, name) for c, name, _ in series], empty=not queued)
