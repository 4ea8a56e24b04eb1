"""Turn records as the console shows them: on each turn's header, as entries for turns that left no
messages, in the session's totals and in the rollback preview.

A committed turn's record is found by its first message id (the turn's USER row). A turn that ended
without messages in the conversation — ``failed``, ``cancelled``, ``interrupted``, or ``rolled_back``
by an operator — is placed after the last turn stored before it started (the same rule that places
operator actions, ``sessions_app.timeline.turns_before``).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Count,
    DecimalField,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
    TextField,
    Value,
)
from django.db.models.functions import Coalesce

from turns_app.models import SessionTotals, TurnRecord
from turns_app.rollups import restatus

__all__ = ["ENDED_WITHOUT_MESSAGES", "Usage", "attach_records", "discarded_usage", "mark_rolled_back", "totals_of",
           "totals_for", "usage_block", "usage_by_first_message", "usage_by_first_message_for", "session_usage",
           "usage_columns", "usage_sort_key"]

#: Statuses whose turn shows as its own entry in the history (its messages are not in the conversation).
ENDED_WITHOUT_MESSAGES = ("failed", "cancelled", "interrupted", "rolled_back")
_MAX_ENDED = 500  # ended-turn entries read per page (newest first)
_COMMITTED = ("completed", "rolled_back")  # statuses of records whose turn's messages were committed


def attach_records(session_id: str, turns: list[Any], bounds: list[tuple[int, datetime]],
                   early: list[Any] | None = None) -> None:
    """Set ``turn.record`` (its ``TurnRecord`` or None) and ``turn.ended`` (records of turns that left no
    messages and started after it, before the next turn) for each of ``turns`` (objects with ``number``
    and ``message_ids``; ``bounds`` as ``turn_bounds``). Entries before the first turn go to ``early``
    when given (the oldest page). Two queries."""
    for turn in turns:
        turn.record, turn.ended = None, []
    firsts = {t.message_ids[0]: t for t in turns if t.message_ids}
    if firsts:
        for record in TurnRecord.objects.filter(session_id=session_id, first_message_id__in=list(firsts),
                                                status="completed"):
            firsts[record.first_message_id].record = record
    numbers = {t.number: t for t in turns}
    if not numbers and early is None:
        return
    starts = [at for _rid, at in bounds]
    query = Q(session_id=session_id, status__in=ENDED_WITHOUT_MESSAGES)
    if numbers:  # only those after the page's first turn and before the turn after its last one
        lo, hi = min(numbers), max(numbers)
        if early is None:
            query &= Q(started_at__gte=starts[lo - 1])
        if hi < len(starts):
            query &= Q(started_at__lt=starts[hi])
    ended = list(TurnRecord.objects.filter(query).order_by("-started_at", "-id")[:_MAX_ENDED])
    for record in reversed(ended):
        n = bisect_right(starts, record.started_at)
        if n in numbers:
            numbers[n].ended.append(record)
        elif n == 0 and early is not None:
            early.append(record)


@dataclass(frozen=True)
class Usage:
    """Tokens and cost (US dollars) of some turns, as ``SessionTotals`` holds them: sums of the known figures
    (None while none is known); ``tokens_known`` / ``cost_known`` False when some turn's were unknown."""

    turns: int
    total_tokens: int | None
    tokens_known: bool
    cost: Decimal | None
    cost_known: bool


def totals_of(session_id: str) -> SessionTotals | None:
    """The session's totals row (None before its first recorded turn)."""
    return SessionTotals.objects.filter(pk=session_id).first()


def totals_for(session_ids: list[str]) -> dict[str, SessionTotals]:
    """The totals rows of ``session_ids`` by session id (one query; sessions without one are missing)."""
    return SessionTotals.objects.in_bulk(session_ids)


def discarded_usage(session_id: str, first_message_ids: list[int]) -> Usage:
    """What the completed turns starting at ``first_message_ids`` used (a rollback's preview)."""
    qs = TurnRecord.objects.filter(session_id=session_id, first_message_id__in=first_message_ids,
                                   status="completed")
    unknown_tokens = Q(input_tokens__isnull=True) | Q(output_tokens__isnull=True)
    sums = qs.aggregate(n=Count("id"), t=Sum(F("input_tokens") + F("output_tokens")), c=Sum("cost"),
                        unknown_tokens=Count("id", filter=unknown_tokens),
                        unknown_cost=Count("id", filter=Q(cost__isnull=True)))
    return Usage(sums["n"], sums["t"], not sums["unknown_tokens"], sums["c"], not sums["unknown_cost"])


def mark_rolled_back(session_id: str, first_message_ids: list[int]) -> int:
    """Mark ``rolled_back`` the completed records of the turns a rollback removed (call it in the rollback's
    transaction); how many. Totals keep counting them: their tokens were spent; the dashboard's rollups
    count them as rolled back from then on."""
    records = TurnRecord.objects.filter(session_id=session_id, first_message_id__in=first_message_ids,
                                        status="completed")
    with transaction.atomic():  # the rollups' lock is held until the status change commits with it
        restatus(list(records.values_list("id", flat=True)), "completed", "rolled_back")
        return records.update(status="rolled_back")


def _total(column: str, output_field: Any = None) -> Subquery:
    """The session's ``SessionTotals`` column (a primary-key lookup), for a ``ChatSession`` queryset."""
    return Subquery(SessionTotals.objects.filter(session_id=OuterRef("pk")).values(column)[:1],
                    output_field=output_field)


def usage_columns() -> dict[str, Any]:
    """Annotations for a ``ChatSession`` queryset: ``usage_turns`` (recorded turns, None before any),
    ``usage_tokens`` (int, None while no turn's tokens are known), ``usage_tokens_known`` (bool),
    ``usage_cost`` (Decimal dollars, None while no turn's cost is known), ``usage_cost_known`` (bool) and
    ``usage_error`` (the last turn's error, '' when it completed); each a primary-key lookup in
    ``chatflow_session_totals``."""
    return {
        "usage_turns": _total("turns"),
        "usage_tokens": _total("total_tokens"),
        "usage_tokens_known": _total("tokens_known", BooleanField()),
        "usage_cost": _total("cost", DecimalField(max_digits=20, decimal_places=10)),
        "usage_cost_known": _total("cost_known", BooleanField()),
        "usage_error": Coalesce(_total("last_error"), Value(""), output_field=TextField()),
    }


#: What a session whose total is unknown (no turn recorded, or no figure known) sorts as, by column and
#: direction (descending?): after every possible known total either way (the cost column holds less than
#: 10**10 dollars; the list's cursors take numbers below 10**18 in magnitude).
UNKNOWN_LAST = {"sort_tokens": {False: 10**18 - 1, True: -1}, "sort_cost": {False: 10**10 - 1, True: -1}}


def usage_sort_key(column: str, descending: bool) -> Any:
    """The list's sort expression ``sort_tokens`` or ``sort_cost`` for a sort in that direction: the session's
    total, or :data:`UNKNOWN_LAST` when it is unknown, so unknown totals come last, never as 0."""
    unknown = UNKNOWN_LAST[column][descending]
    if column == "sort_tokens":
        return Coalesce(_total("total_tokens"), Value(unknown), output_field=BigIntegerField())
    money = DecimalField(max_digits=20, decimal_places=10)
    return Coalesce(_total("cost"), Value(Decimal(unknown)), output_field=money)


def usage_block(record: TurnRecord | None) -> dict[str, Any] | None:
    """A turn's ``usage`` block in exports and the API (None when the turn has no record)::

        {"status", "source", "started_at", "finished_at" (ISO-8601), "duration_ms", "queue_wait_ms",
         "lease_wait_ms", "agents", "input_tokens", "output_tokens", "cached_tokens", "total_tokens",
         (each null when unknown), "cost" (US dollars as a decimal string, null when unknown), "currency": "USD",
         "model_calls": [{provider, model, input_tokens, output_tokens, cached_tokens, latency_ms, ttft_ms,
                          finish_reason, retries, estimated, agent_name, cost, price_source, priced_as}],
         "tool_calls": [{name, duration_ms, outcome}], "error", "trace_id"}
    """
    if record is None:
        return None
    return {
        "status": record.status, "source": record.source,
        "started_at": record.started_at.isoformat() if record.started_at else None,
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "duration_ms": record.duration_ms, "queue_wait_ms": record.queue_wait_ms,
        "lease_wait_ms": record.lease_wait_ms, "agents": record.agents,
        "input_tokens": record.input_tokens, "output_tokens": record.output_tokens,
        "cached_tokens": record.cached_tokens, "total_tokens": record.total_tokens,
        "cost": None if record.cost is None else str(record.cost.normalize()), "currency": "USD",
        "model_calls": record.calls, "tool_calls": record.tools, "error": record.error, "trace_id": record.trace_id,
    }


def usage_by_first_message(session_id: str, first_message_ids: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """The ``usage`` block (:func:`usage_block`) of each committed turn of the session (only those starting at
    ``first_message_ids`` when given), by the row id of its first (USER) message (one query)."""
    if first_message_ids is None:
        return usage_by_first_message_for([session_id]).get(session_id, {})
    return {r.first_message_id: block for r in TurnRecord.objects.filter(
        session_id=session_id, first_message_id__in=first_message_ids, status__in=_COMMITTED)
        if (block := usage_block(r)) is not None}


def usage_by_first_message_for(session_ids: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """:func:`usage_by_first_message` of each of ``session_ids`` by session id, in one query (a session
    without a committed turn record is missing)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in TurnRecord.objects.filter(session_id__in=session_ids, first_message_id__isnull=False,
                                       status__in=_COMMITTED):
        if (block := usage_block(r)) is not None:
            out.setdefault(r.session_id, {})[r.first_message_id] = block
    return out


def session_usage(totals: SessionTotals | None) -> dict[str, Any] | None:
    """A session's totals as the API and exports give them: ``{"turns", "input_tokens", "output_tokens",
    "cached_tokens", "total_tokens" (each null while no counted turn's is known; a lower bound when
    ``tokens_known`` is false), "tokens_known", "cost" (decimal string, null while no counted turn's cost is
    known; a lower bound when ``cost_known`` is false), "cost_known", "currency": "USD", "last_error"}``;
    None before its first recorded turn."""
    if totals is None:
        return None
    return {"turns": totals.turns, "input_tokens": totals.input_tokens, "output_tokens": totals.output_tokens,
            "cached_tokens": totals.cached_tokens, "total_tokens": totals.total_tokens,
            "tokens_known": totals.tokens_known,
            "cost": None if totals.cost is None else str(Decimal(totals.cost).normalize()),
            "cost_known": totals.cost_known, "currency": "USD", "last_error": totals.last_error}
