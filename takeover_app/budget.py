"""The per-session daily budget: turns, tokens and cost a session may use in one UTC day.

Settings (each 0 or unset: no limit): ``CHATFLOW_BUDGET_TURNS_PER_DAY`` (turns that called a model),
``CHATFLOW_BUDGET_TOKENS_PER_DAY`` (input plus output tokens), ``CHATFLOW_BUDGET_COST_PER_DAY`` (US dollars,
a ``Decimal``). ``CHATFLOW_BUDGET_ACTION`` says what a turn past the budget gets: ``wait`` (held with the
holding message; the session waits for a person, an escalation with trigger ``budget``) or ``answer``
(held with ``CHATFLOW_BUDGET_MESSAGE`` as its answer: no model call; audited once a day as
``budget_answered``).

The usage is read from the session's turn records that started since the UTC day began (:data:`clock`):
one statement on the store's thread, under the session's turn lock (the takeover gate's decision,
``takeover_app.gate``), on an index of ``(session_id, started_at)``. What counts: the ended turns that called
a model, whatever their status (a failed or rolled back turn was paid for); their known tokens and cost
(unknown figures add nothing). A turn is held once the figure has reached its limit: the turn that crosses
a tokens or cost limit plays, the ones after it are held. With no limit set nothing is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from sessions_app.actions import audit
from sessions_app.models import OperatorAction
from sessions_app.store import driver_cursor
from turns_app.models import TurnRecord

__all__ = ["ANSWERED", "Crossed", "Usage", "clock", "crossed", "day_start", "limited", "note_answered", "usage_today"]

#: The audit action of a turn answered with ``CHATFLOW_BUDGET_MESSAGE`` (the first of a session's day).
ANSWERED = "budget_answered"

#: The clock the budget's day is read from: a callable returning an aware datetime. Replace it to move the
#: day (a test plays "tomorrow" by setting it a day on).
clock: Callable[[], datetime] = timezone.now

_USAGE = (f"SELECT COUNT(*), SUM(COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0)), SUM(cost) "
          f"FROM {TurnRecord._meta.db_table} WHERE session_id = ? AND started_at >= ? "
          f"AND NOT (status = 'running') AND calls <> '[]'")  # (the index's condition, as written: it applies)


@dataclass(frozen=True)
class Usage:
    """A session's usage of one day: ``turns`` (that called a model), ``tokens``, ``cost`` (US dollars)."""

    turns: int
    tokens: int
    cost: Decimal


@dataclass(frozen=True)
class Crossed:
    """The budget a session reached: ``budget`` (``turns``, ``tokens`` or ``cost``), its ``limit`` and the
    figure ``used`` today (as text: ``"20"``, ``"0.5012"``)."""

    budget: str
    limit: str
    used: str

    @property
    def reason(self) -> str:
        unit = " USD" if self.budget == "cost" else f" {self.budget}"
        return f"{self.used}{unit} today (limit {self.limit}{unit} a day)."

    @property
    def detail(self) -> dict[str, str]:
        """For the audit entry."""
        return {"budget": self.budget, "budget_limit": self.limit, "budget_used": self.used}


def day_start(now: datetime | None = None) -> datetime:
    """Midnight UTC of ``now``'s day (default :data:`clock`)."""
    now = (now or clock()).astimezone(UTC)
    return datetime.combine(now.date(), time(0), tzinfo=UTC)


def limited() -> bool:
    """True when any daily limit is set."""
    return bool(settings.CHATFLOW_BUDGET_TURNS_PER_DAY or settings.CHATFLOW_BUDGET_TOKENS_PER_DAY
                or settings.CHATFLOW_BUDGET_COST_PER_DAY)


def usage_today(session_id: str, using: str = "default") -> Usage:
    """The session's :class:`Usage` since :func:`day_start` (one statement; call it on the store's thread)."""
    with driver_cursor(using) as (cursor, dialect):
        cursor.execute(dialect.render(_USAGE), (session_id, dialect.stamp(day_start().timestamp())))
        turns, tokens, cost = cursor.fetchone()
    return Usage(int(turns or 0), int(tokens or 0), Decimal(str(cost)) if cost is not None else Decimal(0))


def crossed(session_id: str, using: str = "default") -> Crossed | None:
    """The first limit (turns, tokens, cost) the session's usage today has reached, or None; reads
    nothing when no limit is set."""
    if not limited():
        return None
    used = usage_today(session_id, using)
    turns, tokens, cost = (settings.CHATFLOW_BUDGET_TURNS_PER_DAY, settings.CHATFLOW_BUDGET_TOKENS_PER_DAY,
                           settings.CHATFLOW_BUDGET_COST_PER_DAY)
    if turns and used.turns >= turns:
        return Crossed("turns", str(turns), str(used.turns))
    if tokens and used.tokens >= tokens:
        return Crossed("tokens", str(tokens), str(used.tokens))
    if cost and used.cost >= cost:
        return Crossed("cost", str(cost), str(used.cost.normalize()))
    return None


def note_answered(session_id: str, over: Crossed, using: str = "default") -> Any:
    """A polite answer's commit hook work: audit ``budget_answered`` (no actor) for the first such turn of the
    session's UTC day; later ones write nothing."""
    entries = OperatorAction.objects.using(using).filter(session_id=session_id, action=ANSWERED,
                                                         created_at__gte=day_start())
    if entries.exists():
        return None
    return audit(None, ANSWERED, session_id, {}, over.detail)
