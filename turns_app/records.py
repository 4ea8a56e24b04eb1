"""Writing turn records inside the transactions a turn already makes (raw SQL on the caller's cursor).

``DjangoBackend`` calls :func:`open_turn` in the transaction that takes a session's lease,
:func:`close_turn` in the commit's transaction (``completed``) or in the one that releases the lease
of a turn that did not commit (``failed`` / ``cancelled``), and :func:`mark_interrupted` when it
purges expired leases. Each statement is a plain insert or update by an indexed key, written for
SQLite and PostgreSQL alike; no function here opens a transaction of its own.

Records are keyed by the lease owner (unique per turn). ``chatflow_session_totals`` is kept in step:
a closed turn adds its tokens and cost (what was spent, whatever the status), and sets
``last_error`` (cleared by a completed turn).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from chatflow_agent.core.reports import TURN_SOURCES, TurnReport
from chatflow_agent.types import ModelCallUsage

__all__ = ["INTERRUPTED_ERROR", "call_json", "close_turn", "forget_session", "mark_interrupted", "open_turn"]

#: The error text of a record marked ``interrupted``.
INTERRUPTED_ERROR = "Interrupted: the process running this turn stopped (its session lease expired)."

_CALL_FIELDS = ("provider", "model", "input_tokens", "output_tokens", "cached_tokens", "latency_ms", "ttft_ms",
                "finish_reason", "retries", "estimated", "agent_name")

_INTERRUPT_SESSION = (
    "UPDATE chatflow_turn_records SET status = 'interrupted', finished_at = %s, error = %s "
    "WHERE status = 'running' AND session_id = %s AND owner <> %s"
)
_INSERT = (
    "INSERT INTO chatflow_turn_records (session_id, owner, source, first_message_id, user_text, status, "
    "started_at, finished_at, queue_wait_ms, lease_wait_ms, duration_ms, agents, error, calls, tools, "
    "input_tokens, output_tokens, cached_tokens, cost, trace_id) "
    "VALUES (%s, %s, %s, NULL, %s, 'running', %s, NULL, %s, %s, NULL, {json}, '', {json}, {json}, 0, 0, 0, NULL, %s)"
)
_CLOSE = (
    "UPDATE chatflow_turn_records SET status = %s, finished_at = %s, duration_ms = %s, first_message_id = %s, "
    "agents = {json}, error = %s, calls = {json}, tools = {json}, input_tokens = %s, output_tokens = %s, "
    "cached_tokens = %s, cost = %s, user_text = %s WHERE owner = %s AND status = 'running'"
)
_TOTALS = (
    "INSERT INTO chatflow_session_totals AS t (session_id, turns, input_tokens, output_tokens, cached_tokens, "
    "total_tokens, cost, cost_known, last_error, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (session_id) DO UPDATE SET turns = t.turns + EXCLUDED.turns, "
    "input_tokens = t.input_tokens + EXCLUDED.input_tokens, output_tokens = t.output_tokens + EXCLUDED.output_tokens, "
    "cached_tokens = t.cached_tokens + EXCLUDED.cached_tokens, total_tokens = t.total_tokens + EXCLUDED.total_tokens, "
    "cost = t.cost + EXCLUDED.cost, cost_known = (t.cost_known AND EXCLUDED.cost_known), "
    "last_error = EXCLUDED.last_error, updated_at = EXCLUDED.updated_at"
)
_ORPHANS = (
    "SELECT r.id, r.session_id FROM chatflow_turn_records r WHERE r.status = 'running' AND NOT EXISTS "
    "(SELECT 1 FROM chatflow_session_leases l WHERE l.session_id = r.session_id AND l.owner = r.owner "
    "AND l.expires_at >= %s)"
)


def _sql(cursor: Any, template: str) -> str:
    """``template`` with ``{json}`` placeholders for the cursor's database (PostgreSQL casts to jsonb)."""
    vendor = cursor.db.vendor
    return template.format(json="CAST(%s AS jsonb)" if vendor == "postgresql" else "%s")


def _stamp(cursor: Any, at: float | None) -> Any:
    return None if at is None else cursor.db.ops.adapt_datetimefield_value(datetime.fromtimestamp(at, UTC))


def call_json(call: ModelCallUsage) -> dict[str, Any]:
    """One model call as stored in ``TurnRecord.calls``: its usage fields, ``cost`` a decimal string
    (US dollars) or None when the price is unknown."""
    data: dict[str, Any] = {name: getattr(call, name) for name in _CALL_FIELDS}
    data["cost"] = None if call.cost is None else str(call.cost)
    return data


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def open_turn(cursor: Any, session_id: str, report: TurnReport) -> None:
    """The turn got its lease: insert its record (``running``) and mark ``interrupted`` the records of
    this session still ``running`` under another owner (they lost the lease: their process died)."""
    now = report.started_at
    cursor.execute(_INTERRUPT_SESSION, (_stamp(cursor, now), INTERRUPTED_ERROR, session_id, report.owner))
    if cursor.rowcount:
        _add_totals(cursor, session_id, None, INTERRUPTED_ERROR, now)
    source = report.source if report.source in TURN_SOURCES else "other"
    cursor.execute(_sql(cursor, _INSERT), (
        session_id, report.owner, source, report.user_text, _stamp(cursor, now),
        report.queue_wait_ms, report.lease_wait_ms, _dumps(report.agents), "[]", "[]", report.trace_id[:32],
    ))


def close_turn(cursor: Any, session_id: str, report: TurnReport, first_message_id: int | None = None) -> None:
    """End the record ``report.owner`` opened with ``report``'s status, calls, tools and times, and add the
    turn to the session's totals. A record no longer ``running`` (marked interrupted meanwhile) stays."""
    cost = report.cost
    cursor.execute(_sql(cursor, _CLOSE), (
        report.status, _stamp(cursor, report.finished_at), report.duration_ms, first_message_id,
        _dumps(report.agents), report.error, _dumps([call_json(c) for c in report.calls]),
        _dumps([{"name": t.name, "duration_ms": t.duration_ms, "outcome": t.outcome} for t in report.tools]),
        report.input_tokens, report.output_tokens, report.cached_tokens, cost, report.user_text, report.owner,
    ))
    if cursor.rowcount:
        _add_totals(cursor, session_id, report, "" if report.status == "completed" else report.error,
                    report.finished_at)


def _add_totals(cursor: Any, session_id: str, report: TurnReport | None, last_error: str, at: float | None) -> None:
    if report is None:
        counts: tuple[Any, ...] = (0, 0, 0, 0, 0, Decimal(0), True)
    else:
        cost = report.cost
        counts = (1, report.input_tokens, report.output_tokens, report.cached_tokens,
                  report.input_tokens + report.output_tokens, cost or Decimal(0), cost is not None)
    cursor.execute(_TOTALS, (session_id, *counts, last_error, _stamp(cursor, at)))


def mark_interrupted(cursor: Any, now: float) -> int:
    """Mark ``interrupted`` every ``running`` record whose lease is gone or expired at ``now`` (unix
    seconds); how many."""
    cursor.execute(_ORPHANS, (now,))
    found = cursor.fetchall()
    for record_id, session_id in found:
        cursor.execute(
            "UPDATE chatflow_turn_records SET status = 'interrupted', finished_at = %s, error = %s "
            "WHERE id = %s AND status = 'running'", (_stamp(cursor, now), INTERRUPTED_ERROR, record_id))
        if cursor.rowcount:
            _add_totals(cursor, session_id, None, INTERRUPTED_ERROR, now)
    return len(found)



def forget_session(sender: Any, session_id: str, **kwargs: Any) -> dict[str, int]:
    """``sessions_app.actions.session_deleting`` receiver, inside the delete's transaction: the session's
    records keep their figures (metrics count them) but lose the customer's text, and its totals row
    goes, so a new session of the same id starts from nothing. Returns ``{"turn_records_redacted": n}``."""
    from turns_app.models import SessionTotals, TurnRecord

    redacted = TurnRecord.objects.filter(session_id=session_id).exclude(user_text="").update(user_text="")
    SessionTotals.objects.filter(session_id=session_id).delete()
    return {"turn_records_redacted": redacted}
