"""Hourly and daily rollups of the turn records, computed incrementally by a ``folded`` flag on each record
(never on the turn path, never by a read).

:func:`fold` takes the ended records whose ``folded`` is still false (a partial index holds just those), adds
each to its UTC hour's and its UTC day's ``TurnRollup`` (by status) and ``HandoffRollup`` rows (agent pairs
of its trail) and sets their flag, in one transaction. Whatever the order records commit in, each is folded
exactly once: no id or clock decides what is "old enough". A record still ``running`` stays unfolded until
it ends. :func:`read` adds the ended unfolded records live, with the same :class:`Tally`, so what it returns
is exact at read time, and it writes nothing.

The queue workers' heartbeat folds once a minute (``webhooks_app.heartbeat``) and ``manage.py chatflow_sweep``
folds everything left. ``turns_app.usage.mark_rolled_back`` moves already-folded records to
``rolled_back`` with :func:`restatus`, in the rollback's transaction.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from chatflow_agent.core.sql import sqlite_transaction
from turns_app.models import HandoffRollup, RollupState, TurnRecord, TurnRollup

__all__ = ["RATIO", "SPANS", "Tally", "bucket_of", "floor", "fold", "handoff_pairs", "quantile",
           "read", "restatus"]

#: Width of a latency histogram bucket: each bucket's upper edge is ``RATIO`` times the one below (10 %).
RATIO = 1.1
#: Records a fold transaction takes at most (on SQLite it holds the write lock that long).
BATCH = 2000
STATE = "turns"
_FIELDS = ("id", "status", "started_at", "duration_ms", "cost", "agents", "input_tokens", "output_tokens")
_LOG_RATIO = math.log(RATIO)


def bucket_of(ms: float) -> int:
    """The latency bucket of a duration in milliseconds: the smallest ``b`` ≥ 0 with ``ms <= RATIO ** b``."""
    if ms <= 1:
        return 0
    b = math.ceil(math.log(ms) / _LOG_RATIO - 1e-9)
    return b if RATIO ** b >= ms else b + 1


def quantile(histogram: dict[str, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q ≤ 1) of a latency histogram, as its bucket's upper edge in milliseconds
    (at most 10 % above the true value; 1 ms for anything faster); None for an empty histogram."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = max(1, math.ceil(q * total)), 0
    for b in sorted(histogram, key=int):
        seen += histogram[b]
        if seen >= rank:
            return RATIO ** int(b)
    return None  # pragma: no cover - unreachable: the loop reaches total


def handoff_pairs(agents: list[Any]) -> list[tuple[str, str]]:
    """The handoffs of an agent trail (the starting agent, then each handoff target): consecutive pairs."""
    names = [str(a) for a in agents if a]
    return [(a, b) for a, b in zip(names, names[1:], strict=False) if a != b]


#: The rollups' spans: how a moment is floored to its row's ``start``.
SPANS = ("hour", "day")


def _hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _day(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def floor(moment: datetime, span: str) -> datetime:
    """``moment``'s UTC hour (``span`` "hour") or day ("day")."""
    return _day(moment) if span == "day" else _hour(moment)


@dataclass
class Cell:
    """One hour and status: the turns, their latency histogram (``{"<bucket>": count}``, as stored),
    known cost, unknown-cost count, tokens."""

    turns: int = 0
    latency: dict[str, int] = field(default_factory=dict)
    cost: Decimal = Decimal(0)
    cost_unknown: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, other: Cell, sign: int = 1) -> None:
        self.turns += sign * other.turns
        for b, n in other.latency.items():
            self.latency[b] = self.latency.get(b, 0) + sign * n
            if not self.latency[b]:
                del self.latency[b]
        self.cost += sign * other.cost
        self.cost_unknown += sign * other.cost_unknown
        self.input_tokens += sign * other.input_tokens
        self.output_tokens += sign * other.output_tokens


@dataclass
class Tally:
    """Turns summed by ``(start, status)`` and handoffs by ``(start, source, target)``, ``start`` the UTC
    hour or day (``span``) the turns started in."""

    span: str = "hour"
    cells: dict[tuple[datetime, str], Cell] = field(default_factory=lambda: defaultdict(Cell))
    handoffs: dict[tuple[datetime, str, str], int] = field(default_factory=lambda: defaultdict(int))

    def add_record(self, row: dict[str, Any], status: str | None = None, handoffs: bool = True) -> None:
        """Count one record (a dict of :data:`_FIELDS`), under ``status`` when given."""
        start = floor(row["started_at"], self.span)
        self.cells[(start, status or row["status"])].add(_cell_of(row))
        if handoffs:
            for source, target in handoff_pairs(row["agents"] or []):
                self.handoffs[(start, source, target)] += 1

    def by_day(self) -> Tally:
        """The same turns and handoffs summed by UTC day."""
        days = Tally("day")
        for (start, status), cell in self.cells.items():
            days.cells[(_day(start), status)].add(cell)
        for (start, source, target), n in self.handoffs.items():
            days.handoffs[(_day(start), source, target)] += n
        return days

    def merge(self, other: Tally) -> None:
        for key, cell in other.cells.items():
            self.cells[key].add(cell)
        for key, n in other.handoffs.items():
            self.handoffs[key] += n


def _cell_of(row: dict[str, Any]) -> Cell:
    duration = row["duration_ms"]
    return Cell(1, {} if duration is None else {str(bucket_of(duration)): 1}, row["cost"] or Decimal(0),
                1 if row["cost"] is None else 0, row["input_tokens"] or 0, row["output_tokens"] or 0)


def _lock() -> None:
    """Take the rollups' lock for the rest of the transaction (one folder or restatus at a time): an
    ``UPDATE`` of the state row, so on SQLite the write lock is taken before anything is read, and on
    PostgreSQL the row stays locked until commit. It moves ``generation`` (the update that takes the lock)."""
    bump = {"generation": F("generation") + 1, "folded_at": timezone.now()}
    if not RollupState.objects.filter(name=STATE).update(**bump):
        RollupState.objects.get_or_create(name=STATE)
        RollupState.objects.filter(name=STATE).update(**bump)


def _unfolded() -> Any:
    """The ended records not in the rollups yet (``folded`` false: the partial index's rows)."""
    return TurnRecord.objects.filter(folded=False).exclude(status="running")


def _foldable() -> Any:
    """:func:`_unfolded` but for records an operator cancelled whose turn has not reported its figures yet
    (``TurnRecord.awaiting_report``): folded now they would stay in the rollups without them. The
    turn's late close, or the lease purge once it can no longer come, ends that wait."""
    return _unfolded().exclude(awaiting_report=True)


def fold(batch: int = BATCH, batches: int | None = None) -> int:
    """Add the ended records not folded yet to the rollups and flag them ``folded``; how many were counted.
    One transaction per batch of ``batch`` records (oldest id first), at most ``batches`` batches (None: until
    none is left). Records locked by a transaction in progress are skipped on PostgreSQL (``SKIP LOCKED``)
    and taken by a later fold; a record committed after a fold read is still unfolded, so the next fold
    takes it. Two folders never count a record twice: the state row's lock serialises them and each takes
    only the records still unfolded once it holds it."""
    counted, done = 0, 0
    while batches is None or done < batches:
        if not _foldable().exists():  # the partial index: no write transaction when there is nothing to do
            break
        with transaction.atomic():
            _lock()
            rows = list(_foldable().select_for_update(skip_locked=True).order_by("id").values(*_FIELDS)[:batch])
            tally = Tally()
            for row in rows:
                tally.add_record(row)
            _store(tally)
            TurnRecord.objects.filter(id__in=[row["id"] for row in rows]).update(folded=True)
        counted, done = counted + len(rows), done + 1
        if len(rows) < batch:
            break
    if counted >= batch:
        _restat()
    return counted


def _restat() -> None:
    """After a large fold on SQLite, re-measure the partial index (cheap: it holds only the unfolded
    records). SQLite never updates its statistics by itself: had they been taken while many records were
    unfolded, the planner would keep scanning the whole table for the few left (PostgreSQL's autovacuum
    re-analyses on its own)."""
    connection = connections[TurnRecord.objects.db]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE idx_turn_records_unfolded")


_UPSERT_TURNS = (
    "INSERT INTO chatflow_turn_rollups (span, start, status, turns, latency, cost, cost_unknown, input_tokens, "
    "output_tokens) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (span, start, status) DO UPDATE SET "
    "turns = EXCLUDED.turns, latency = EXCLUDED.latency, cost = EXCLUDED.cost, "
    "cost_unknown = EXCLUDED.cost_unknown, input_tokens = EXCLUDED.input_tokens, "
    "output_tokens = EXCLUDED.output_tokens"
)
_UPSERT_HANDOFFS = (
    "INSERT INTO chatflow_handoff_rollups (span, start, source, target, handoffs) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (span, start, source, target) DO UPDATE SET handoffs = chatflow_handoff_rollups.handoffs + "
    "EXCLUDED.handoffs"
)


def _store(tally: Tally, sign: int = 1) -> None:
    """Add (``sign`` -1: take away) ``tally`` (by hour) to the hour and the day rollup rows, creating the
    missing ones: the touched rows are read, merged here (histograms are JSON) and written back in one
    batch of upserts. The caller holds the rollups' lock (``_lock``), so no one else writes them meanwhile."""
    connection = connections[TurnRollup.objects.db]
    ops, latency = connection.ops, TurnRollup._meta.get_field("latency")
    rows, pairs = [], []
    for part in (tally, tally.by_day()):
        starts = sorted({start for start, _ in part.cells})
        stored = {(_hour(r.start), r.status): _cell_of_rollup(r)
                  for r in TurnRollup.objects.filter(span=part.span, start__in=starts)} if starts else {}
        for (start, status), cell in part.cells.items():
            merged = stored.get((start, status)) or Cell()
            merged.add(cell, sign)
            histogram = dict(sorted(merged.latency.items(), key=lambda item: int(item[0])))
            rows.append((part.span, ops.adapt_datetimefield_value(start), status, merged.turns,
                         latency.get_db_prep_value(histogram, connection), ops.adapt_decimalfield_value(merged.cost),
                         merged.cost_unknown, merged.input_tokens, merged.output_tokens))
        pairs += [(part.span, ops.adapt_datetimefield_value(start), source, target, sign * n)
                  for (start, source, target), n in part.handoffs.items()]
    with connection.cursor() as cursor:
        if rows:
            cursor.executemany(_UPSERT_TURNS, rows)
        if pairs:
            cursor.executemany(_UPSERT_HANDOFFS, pairs)


def _cell_of_rollup(row: TurnRollup) -> Cell:
    return Cell(row.turns, dict(row.latency or {}), Decimal(row.cost or 0),
                row.cost_unknown, row.input_tokens, row.output_tokens)


def restatus(record_ids: list[int], old: str, new: str) -> None:
    """Records ``record_ids`` go from ``old`` to ``new`` (call it before their update, in its transaction):
    move the folded ones between their hours' status rows (the unfolded ones are counted under their new
    status by the fold that takes them). Handoffs stay (they happened)."""
    if not record_ids:
        return
    with transaction.atomic():
        _lock()
        taken, given = Tally(), Tally()
        for row in TurnRecord.objects.filter(id__in=record_ids, status=old, folded=True).values(*_FIELDS):
            taken.add_record(row, handoffs=False)
            given.add_record(row, status=new, handoffs=False)
        _store(taken, -1)
        _store(given)


def read(since: datetime, span: str = "hour") -> Tally:
    """Every ended record that started at or after ``since``, summed by UTC hour or day (``span``): the
    rollups plus the ended records not folded yet, counted live (running ones are not counted). Reads only,
    so it works on a read-only connection. Its queries share one snapshot (a read-only transaction,
    REPEATABLE READ on PostgreSQL), so a fold or restatus another process commits meanwhile is seen
    whole or not at all: no record is counted twice or missed. Inside a transaction of the caller's it
    reads in that transaction."""
    since = floor(since, span)
    if connection.in_atomic_block:
        return _read(since, span)
    if connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return _read(since, span)
    # SQLite: Django's atomic() would BEGIN IMMEDIATE (the site's transaction mode), a write a read-only
    # database refuses; a deferred BEGIN on the driver's connection takes the snapshot at the first read.
    connection.ensure_connection()
    cursor = connection.connection.cursor()
    try:
        return sqlite_transaction(cursor, lambda _: _read(since, span), "BEGIN", commit=False)
    finally:
        cursor.close()


def _read(since: datetime, span: str) -> Tally:
    tally = Tally(span)
    # Tuples, not model instances, and one Cell per row (the rows are unique by span, start and status;
    # their starts are stored floored, so they key the tally as they come).
    columns = ("start", "status", "turns", "latency", "cost", "cost_unknown", "input_tokens", "output_tokens")
    for start, status, turns, latency, cost, unknown, tokens_in, tokens_out in (
            TurnRollup.objects.filter(span=span, start__gte=since).values_list(*columns)):
        tally.cells[(start, status)] = Cell(turns, latency or {}, Decimal(cost or 0), unknown, tokens_in, tokens_out)
    for start, source, target, n in HandoffRollup.objects.filter(span=span, start__gte=since).values_list(
            "start", "source", "target", "handoffs"):
        tally.handoffs[(start, source, target)] += n
    # The range is checked here, not in SQL: only the partial index then fits the query, whatever the
    # planner's statistics say (a started_at condition let SQLite scan a month of records instead).
    for row in _unfolded().order_by().values(*_FIELDS):
        if row["started_at"] >= since:
            tally.add_record(row)
    return tally
