"""Writing turn records inside the statements a turn already makes (raw SQL on the driver's cursor).

``DjangoBackend`` writes a turn's record with the lease and the commit it makes anyway:

- taking the lease opens the record (``running``) and marks ``interrupted`` the records of the
  session still ``running`` under another owner (their process died). On PostgreSQL
  :func:`lease_opening_turn` turns the lease upsert into one statement that does all of it
  (data-modifying CTEs); on SQLite, which has none, :func:`open_turn` runs after the upsert in its
  transaction.
- the commit's lease release (``completed``) or the release of the lease of a turn that did not
  commit (``failed`` / ``cancelled``) closes it and adds it to the session's totals: on PostgreSQL
  in the release statement itself (:func:`lease_closing_turn`), on SQLite with :func:`close_turn`
  in the release's transaction.
- :func:`mark_interrupted` runs when expired leases are purged (and from ``chatflow_sweep``).
- :func:`cancel_turn` runs when an operator takes a turn's lease away, in that transaction: the
  record ends ``cancelled`` at once, so a turn that takes the lease before the cancelled one has
  rolled back does not mark it ``interrupted``. The cancelled turn's own close, when its process gets
  to it, still fills in its figures (status kept) and counts it in the totals, as any close does. It is
  also how that turn's process learns it was cancelled, and by whom (:func:`cancel_of`).

Every function that writes takes a DB-API cursor of the driver's connection and the connection's
``chatflow_agent.core.sql.Dialect`` (statements are written with ``?`` and rendered by it); none
opens a transaction of its own (:func:`cancel_of`, a read, uses the ORM). Records are keyed by the
lease owner (unique per turn).
``chatflow_session_totals`` is kept in step: a closed turn adds its tokens and cost (what was spent,
whatever the status), and sets ``last_error`` (cleared by a completed turn); an interrupted turn counts
as a turn whose spend is unknown (the session's cost is then known only as "at least"). Unknown figures
stay unknown: a record's tokens are NULL from its open until a close reports them (and stay NULL when a
call did not report them); the totals sum the known figures (NULL while there is none, as SQL's ``SUM``)
and say with ``tokens_known`` / ``cost_known`` whether every counted turn's were known.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from chatflow_agent.core.reports import TurnReport
from chatflow_agent.core.sql import Dialect, LeaseRider
from chatflow_agent.types import ModelCallUsage
from turns_app.models import SessionTotals, TurnRecord

__all__ = ["CANCELLED_ERROR", "CANCELLED_UNREPORTED_ERROR", "DELETED_ERROR", "INTERRUPTED_ERROR", "call_json",
           "cancel_of", "cancel_turn", "close_turn", "forget_session", "lease_closing_turn", "lease_opening_turn",
           "mark_interrupted", "open_turn"]

#: The error text of a record marked ``interrupted``.
INTERRUPTED_ERROR = "Interrupted: the process running this turn stopped (its session lease expired)."

_CALL_FIELDS = ("provider", "model", "input_tokens", "output_tokens", "cached_tokens", "latency_ms", "ttft_ms",
                "finish_reason", "retries", "estimated", "agent_name", "price_source", "priced_as")

#: What ``TurnReport.source`` may say (``TurnRecord.Source``); anything else is stored as ``other``.
_SOURCES = frozenset(TurnRecord.Source.values)

#: The default error text of a record an operator cancelled (the turn's lease taken away); the console's cancel
#: names who and why instead (``takeover_app.service.cancel_turn``).
CANCELLED_ERROR = "Cancelled by an operator: the turn's session lease was taken away."

#: Added to the error of a cancelled record whose process never reported the turn's figures (it died).
CANCELLED_UNREPORTED_ERROR = "(The turn's process stopped before it reported its usage.)"

_UNREPORTED = ("UPDATE chatflow_turn_records SET error = error || ' ' || ?, awaiting_report = FALSE "
               "WHERE awaiting_report AND finished_at < ? RETURNING session_id, error")
_CANCEL = ("UPDATE chatflow_turn_records SET status = 'cancelled', finished_at = ?, error = ?, "
           "awaiting_report = TRUE, cancelled_for_good = ? "
           "WHERE session_id = ? AND owner = ? AND status = 'running'")
_INTERRUPT = "UPDATE chatflow_turn_records SET status = 'interrupted', finished_at = ?, error = ? "
_INTERRUPT_SESSION = _INTERRUPT + "WHERE status = 'running' AND session_id = ? AND owner <> ?"
_INTERRUPT_ONE = _INTERRUPT + "WHERE id = ? AND status = 'running'"
_RECORD_COLUMNS = (
    "INSERT INTO chatflow_turn_records (session_id, owner, source, first_message_id, user_text, status, "
    "started_at, finished_at, queue_wait_ms, lease_wait_ms, duration_ms, agents, error, calls, tools, "
    "input_tokens, output_tokens, cached_tokens, cost, trace_id) "
)
_RECORD_VALUES = (
    "?, ?, ?, NULL, ?, 'running', ?, NULL, ?, ?, NULL, {json}, '', '[]'{cast}, '[]'{cast}, NULL, NULL, NULL, NULL, ?"
)
_INSERT = _RECORD_COLUMNS + "VALUES (" + _RECORD_VALUES + ")"
_CLOSE = (
    "UPDATE chatflow_turn_records SET status = CASE WHEN status = 'running' THEN ? ELSE status END, "
    "finished_at = ?, duration_ms = ?, first_message_id = ?, "
    "agents = {json}, error = CASE WHEN status = 'cancelled' THEN error ELSE ? END, calls = {json}, "
    "tools = {json}, input_tokens = ?, output_tokens = ?, "
    "cached_tokens = ?, cost = ?, user_text = ?, awaiting_report = FALSE "
    "WHERE session_id = ? AND owner = ? AND (status = 'running' OR awaiting_report) RETURNING status, error"
)
_TOTALS_COLUMNS = (
    "INSERT INTO chatflow_session_totals AS t (session_id, turns, input_tokens, output_tokens, cached_tokens, "
    "total_tokens, cost, cost_known, tokens_known, last_error, updated_at) "
)


def _known_sum(column: str) -> str:
    """The merge of a summed column: the known figures added, NULL while neither side knows one."""
    return f"{column} = COALESCE(t.{column} + EXCLUDED.{column}, t.{column}, EXCLUDED.{column})"


_TOTALS_MERGE = (
    " ON CONFLICT (session_id) DO UPDATE SET turns = t.turns + EXCLUDED.turns, "
    + ", ".join(_known_sum(c) for c in ("input_tokens", "output_tokens", "cached_tokens", "total_tokens", "cost"))
    + ", cost_known = (t.cost_known AND EXCLUDED.cost_known), "
    "tokens_known = (t.tokens_known AND EXCLUDED.tokens_known), last_error = EXCLUDED.last_error, "
    "updated_at = EXCLUDED.updated_at"
)
_TOTALS_VALUES = "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
_TOTALS = _TOTALS_COLUMNS + "VALUES (" + _TOTALS_VALUES + ")" + _TOTALS_MERGE
# PostgreSQL: the lease release (rendered by chatflow_agent.core.sql) as the first CTE, then the
# close and the totals (one row per session); the statement returns the released lease's row.
_CLOSE_WITH_RELEASE = (
    "WITH released AS ({lease} RETURNING session_id), closed AS (" + _CLOSE + ", session_id), "
    "totals AS (" + _TOTALS_COLUMNS + "SELECT DISTINCT session_id, ?, ?::bigint, ?::bigint, ?::bigint, ?::bigint, "
    "?::numeric, ?, ?, "
    "CASE WHEN status = 'cancelled' THEN error ELSE ? END, ?::timestamptz FROM closed" + _TOTALS_MERGE
    + " RETURNING 1) SELECT 1 FROM released"
)
# PostgreSQL: the lease upsert (rendered by chatflow_agent.core.sql) as the first CTE; ``{lease}``
# and ``{condition}`` are filled in by lease_opening_turn.
_OPEN_WITH_LEASE = (
    "WITH lease AS ({lease} RETURNING session_id), "
    "interrupted AS (" + _INTERRUPT_SESSION + " AND EXISTS (SELECT 1 FROM lease) RETURNING session_id), "
    "marked AS (" + _TOTALS_COLUMNS + "SELECT session_id, COUNT(*), NULL::bigint, NULL::bigint, NULL::bigint, "
    "NULL::bigint, NULL::numeric, FALSE, FALSE, ?, ?::timestamptz "
    "FROM interrupted GROUP BY session_id" + _TOTALS_MERGE + " RETURNING 1) "
    + _RECORD_COLUMNS + "SELECT " + _RECORD_VALUES + " FROM lease{condition}"
)
_ORPHANS = (
    "SELECT r.id, r.session_id FROM chatflow_turn_records r WHERE r.status = 'running' AND NOT EXISTS "
    "(SELECT 1 FROM chatflow_session_leases l WHERE l.session_id = r.session_id AND l.owner = r.owner "
    "AND l.expires_at >= ?)"
)
_rendered: dict[tuple[str, str], str] = {}


def _sql(dialect: Dialect, template: str) -> str:
    """``template`` rendered for ``dialect`` (cached: the hot statements are rendered once)."""
    key = (dialect.name, template)
    sql = _rendered.get(key)
    if sql is None:
        cast = dialect.json_cast
        sql = _rendered[key] = dialect.render(template.replace("{cast}", cast))
    return sql


def _stamp(dialect: Dialect, at: float | None) -> Any:
    return None if at is None else dialect.stamp(at)


def call_json(call: ModelCallUsage) -> dict[str, Any]:
    """One model call as stored in ``TurnRecord.calls``: its usage fields (a count nobody reported is None),
    ``cost`` a decimal string (US dollars) or None when unknown, with where its price came from
    (``price_source``) and the model name it matched (``priced_as``)."""
    data: dict[str, Any] = {name: getattr(call, name) for name in _CALL_FIELDS}
    data["cost"] = None if call.cost is None else str(call.cost)
    return data


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _record_params(dialect: Dialect, session_id: str, report: TurnReport) -> tuple[Any, ...]:
    source = report.source if report.source in _SOURCES else TurnRecord.Source.OTHER
    return (session_id, report.owner, source, report.user_text, _stamp(dialect, report.started_at),
            report.queue_wait_ms, report.lease_wait_ms, _dumps(report.agents), report.trace_id[:32])


def open_turn(cursor: Any, dialect: Dialect, session_id: str, report: TurnReport) -> None:
    """The turn got its lease (in this transaction): insert its record (``running``) and mark
    ``interrupted`` the records of this session still ``running`` under another owner."""
    now = _stamp(dialect, report.started_at)
    cursor.execute(_sql(dialect, _INTERRUPT_SESSION), (now, INTERRUPTED_ERROR, session_id, report.owner))
    if cursor.rowcount:
        _add_totals(cursor, dialect, session_id, None, INTERRUPTED_ERROR, report.started_at,
                    interrupted=cursor.rowcount)
    cursor.execute(_sql(dialect, _INSERT), _record_params(dialect, session_id, report))


def lease_opening_turn(dialect: Dialect, session_id: str, report: TurnReport, condition: str = "") -> LeaseRider:
    """PostgreSQL: a rider for ``chatflow_agent.core.sql.SessionRules.acquire_lease`` that makes the
    lease upsert one statement with what :func:`open_turn` writes (data-modifying CTEs): the lease,
    the interrupted marks and their totals, and the new record, whose insert's row count (1 or 0)
    says whether the lease was taken. ``condition``: an SQL boolean without parameters that the
    insert also evaluates once the lease is taken (the caller's, e.g. a ``set_config`` call)."""
    now = _stamp(dialect, report.started_at)
    tail = _sql(dialect, _OPEN_WITH_LEASE.replace("{condition}", f" WHERE {condition}" if condition else ""))
    params = (now, INTERRUPTED_ERROR, session_id, report.owner, INTERRUPTED_ERROR, now,
              *_record_params(dialect, session_id, report))

    def ride(lease_sql: str, lease_params: Sequence[Any]) -> tuple[str, Sequence[Any]]:
        return tail.replace("{lease}", lease_sql), (*lease_params, *params)

    return ride


def _close_params(dialect: Dialect, session_id: str, report: TurnReport,
                  first_message_id: int | None) -> tuple[Any, ...]:
    return (
        report.status, _stamp(dialect, report.finished_at), report.duration_ms, first_message_id,
        _dumps(report.agents), report.error, _dumps([call_json(c) for c in report.calls]),
        _dumps([{"name": t.name, "duration_ms": t.duration_ms, "outcome": t.outcome} for t in report.tools]),
        report.input_tokens, report.output_tokens, report.cached_tokens, report.cost, report.user_text, session_id,
        report.owner,
    )


def _last_error(report: TurnReport) -> str:
    return "" if report.status == "completed" else report.error


def close_turn(cursor: Any, dialect: Dialect, session_id: str, report: TurnReport,
               first_message_id: int | None = None) -> None:
    """End the record ``report.owner`` opened with ``report``'s status, calls, tools and times, and add the
    turn to the session's totals. A record no longer ``running`` (marked interrupted meanwhile) stays; one an
    operator cancelled (:func:`cancel_turn`) gets the figures and stays ``cancelled``, with the cancel's
    error (also the session's ``last_error``)."""
    cursor.execute(_sql(dialect, _CLOSE), _close_params(dialect, session_id, report, first_message_id))
    closed = cursor.fetchall()  # (one row: owners are unique per turn; fetched to the end, the statement is done)
    if closed:
        status, error = closed[0]
        _add_totals(cursor, dialect, session_id, report, error if status == "cancelled" else _last_error(report),
                    report.finished_at)


def lease_closing_turn(dialect: Dialect, session_id: str, report: TurnReport,
                       first_message_id: int | None = None) -> LeaseRider:
    """PostgreSQL: a rider for ``chatflow_agent.core.sql.SessionRules.release_lease`` that makes the
    lease release one statement with what :func:`close_turn` writes (data-modifying CTEs); its row
    count (1 or 0) still says whether the lease was released."""
    tail = _sql(dialect, _CLOSE_WITH_RELEASE)
    params = (*_close_params(dialect, session_id, report, first_message_id), *_counts(report), _last_error(report),
              _stamp(dialect, report.finished_at))

    def ride(lease_sql: str, lease_params: Sequence[Any]) -> tuple[str, Sequence[Any]]:
        return tail.replace("{lease}", lease_sql), (*lease_params, *params)

    return ride


def _counts(report: TurnReport | None, interrupted: int = 0) -> tuple[Any, ...]:
    """The totals a closed ``report`` adds (turns, the four token counts, cost, cost known, tokens known; an
    unknown figure is None and adds nothing); None: only ``last_error``, or ``interrupted`` turns, each
    counted as a turn whose tokens and spend are unknown (its process died before it could say)."""
    if report is None:
        return (interrupted, None, None, None, None, None, not interrupted, not interrupted)
    cost, total = report.cost, report.total_tokens
    return (1, report.input_tokens, report.output_tokens, report.cached_tokens, total, cost, cost is not None,
            total is not None)


def _add_totals(cursor: Any, dialect: Dialect, session_id: str, report: TurnReport | None, last_error: str,
                at: float | None, interrupted: int = 0) -> None:
    cursor.execute(_sql(dialect, _TOTALS), (session_id, *_counts(report, interrupted), last_error,
                                            _stamp(dialect, at)))


def cancel_turn(cursor: Any, dialect: Dialect, session_id: str, owner: str, now: float,
                error: str = CANCELLED_ERROR, replay: bool = False) -> bool:
    """End ``owner``'s ``running`` record of ``session_id`` as ``cancelled`` with ``error`` (who cancelled it
    and why; :data:`CANCELLED_ERROR` by default), finished at ``now`` (unix seconds), and set the session's
    ``last_error`` to it; the turn's own close keeps that error. ``replay``: the turn's message is to be played
    again (a takeover "now"), so :func:`cancel_of` does not report it. Call it in the transaction that
    takes the turn's lease away. The turn's own close (:func:`close_turn`, :func:`lease_closing_turn`), if
    its process gets to it, then writes its figures (the status stays ``cancelled``) and counts it in the
    totals once; a turn whose process died is counted by :func:`mark_interrupted` (``cancelled_before``),
    as an ``interrupted`` one is: a turn of unknown spend.
    True when a record was running; False (nothing written) otherwise."""
    cursor.execute(_sql(dialect, _CANCEL), (_stamp(dialect, now), error, not replay, session_id, owner))
    if not cursor.rowcount:
        return False
    _add_totals(cursor, dialect, session_id, None, error, now)
    return True


def cancel_of(session_id: str, owner: str, using: str = "default") -> str | None:
    """The error :func:`cancel_turn` wrote (who cancelled it and why) when an operator cancelled ``owner``'s turn
    of ``session_id`` for good (not to play its message again); None when none did (a takeover "now", a lease
    lost otherwise: the turn's own close says ``cancelled`` too, but not for good). What the stopped turn's
    process reads to learn it was cancelled: the record is keyed by the lease owner, so a turn that took the
    session's lease since changes nothing, and a deleted session's records (no session id any more) say nothing."""
    if not owner:
        return None
    return (TurnRecord.objects.using(using)
            .filter(session_id=session_id, owner=owner, status=TurnRecord.Status.CANCELLED, cancelled_for_good=True)
            .values_list("error", flat=True).first())


def mark_interrupted(cursor: Any, dialect: Dialect, now: float, cancelled_before: float | None = None) -> int:
    """Mark ``interrupted`` every ``running`` record whose lease is gone or expired at ``now`` (unix
    seconds); how many. With ``cancelled_before`` (unix seconds: later than any close of a cancelled turn
    could still come, e.g. a lease TTL ago), the records an operator cancelled before then whose turn
    never reported its figures get :data:`CANCELLED_UNREPORTED_ERROR` after their error (who cancelled
    them and why) and are counted in the totals as
    turns of unknown spend (not in the returned count)."""
    cursor.execute(_sql(dialect, _ORPHANS), (now,))
    found = cursor.fetchall()
    for record_id, session_id in found:
        cursor.execute(_sql(dialect, _INTERRUPT_ONE), (_stamp(dialect, now), INTERRUPTED_ERROR, record_id))
        if cursor.rowcount:
            _add_totals(cursor, dialect, session_id, None, INTERRUPTED_ERROR, now, interrupted=1)
    if cancelled_before is not None:
        cursor.execute(_sql(dialect, _UNREPORTED), (CANCELLED_UNREPORTED_ERROR, _stamp(dialect, cancelled_before)))
        ended = cursor.fetchall()
        errors = {session_id: error for session_id, error in ended}  # (a session's last one, if several)
        for session_id, n in Counter(row[0] for row in ended).items():
            _add_totals(cursor, dialect, session_id, None, errors[session_id], now, interrupted=n)
    return len(found)


#: The error of a record whose turn was still running when an operator deleted its session.
DELETED_ERROR = "Cancelled: the session was deleted during this turn."


def forget_session(session_id: str) -> dict[str, int]:
    """A delete of ``session_id`` (inside its transaction, after the session row is locked): the session's records
    keep their figures (metrics and the dashboard count them) but lose the customer's text and the session id,
    so no later session of the same id shows them; a record still running ends ``cancelled`` with
    :data:`DELETED_ERROR`, and the close its turn may still make finds nothing to write (closes are keyed by
    session id and owner). The session's totals row goes: a new session of the id starts from nothing.
    Returns ``{"turn_records_redacted": n}``."""
    records = TurnRecord.objects.filter(session_id=session_id)
    records.filter(status=TurnRecord.Status.RUNNING).update(
        status=TurnRecord.Status.CANCELLED, finished_at=timezone.now(), error=DELETED_ERROR)
    redacted = records.update(session_id="", user_text="", awaiting_report=False)
    SessionTotals.objects.filter(session_id=session_id).delete()
    return {"turn_records_redacted": redacted}
