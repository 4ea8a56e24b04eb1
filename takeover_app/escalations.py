"""Escalations: a bot session that started waiting for a person, what fired it, and whether it was needed.

An escalation is the audit entry ``human_requested`` that :func:`takeover_app.service.start_waiting` writes:
its ``after`` holds the trigger (``SessionMode.Trigger``: ``phrase``, ``tool``, ``failures``, ``budget``) and
what fired (``phrase``: the configured phrase the customer's message matched; ``tool``/``tool_reason``: the agent's
``request_human`` call; ``failed_turns``; ``budget``/``budget_limit``/``budget_used``: the daily budget reached,
its limit and the figure of the day, ``takeover_app.budget``). An operator who finds one needless marks it "not needed"
(:func:`mark_not_needed`: an ``escalation_not_needed`` audit entry naming it), and :func:`counts` gives the
dashboard each trigger's escalations over a window with how many were marked so: the rate tells a team whether
its phrases (``CHATFLOW_HUMAN_PHRASES``) or its agents' ``request_human`` calls summon people for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.http import Http404

from chatflow_agent.jsonsafe import clean_text
from sessions_app.actions import InvalidAction, audit
from sessions_app.models import ChatSession, OperatorAction

__all__ = ["ESCALATED", "NOT_NEEDED", "Escalation", "TriggerCount", "counts", "latest", "mark_not_needed"]

ESCALATED = "human_requested"
NOT_NEEDED = "escalation_not_needed"


@dataclass(frozen=True)
class Escalation:
    """One escalation: its audit entry, what fired it in words, and its "not needed" mark (an entry or None)."""

    entry: OperatorAction
    not_needed: OperatorAction | None

    @property
    def trigger(self) -> str:
        return str(self.entry.after.get("trigger", ""))

    @property
    def fired(self) -> str:
        """What fired it, as the takeover panel says it."""
        after = self.entry.after
        if after.get("phrase"):
            return f"the customer's message matched the phrase \u201c{after['phrase']}\u201d"
        if after.get("tool"):
            reason = after.get("tool_reason") or after.get("reason") or "no reason given"
            return f"an agent called {after['tool']}: \u201c{reason}\u201d"
        if after.get("budget"):
            unit = " USD" if after["budget"] == "cost" else f" {after['budget']}"
            return (f"budget reached: {after.get('budget_used')}{unit} today "
                    f"(limit {after.get('budget_limit')}{unit} a day)")
        if after.get("failed_turns"):
            return f"{after['failed_turns']} turns in a row failed"
        return str(after.get("reason") or after.get("trigger") or "unknown")


def latest(session_id: str) -> Escalation | None:
    """The session's latest escalation with its "not needed" mark, or None (two queries)."""
    entry = OperatorAction.objects.filter(session_id=session_id, action=ESCALATED).order_by("-id").first()
    if entry is None:
        return None
    mark = OperatorAction.objects.filter(session_id=session_id, action=NOT_NEEDED,
                                         after__escalation=entry.pk).order_by("id").first()
    return Escalation(entry, mark)


def mark_not_needed(user: Any, session_id: str, reason: str = "") -> OperatorAction:
    """Mark the session's latest escalation "not needed" (the customer did not need a person); audited
    (``escalation_not_needed``, naming the escalation and its trigger). The session's mode is left as it is:
    taking over or handing back stays the operator's choice. ``InvalidAction`` (400): no escalation, or it is
    marked already; ``Http404``: no such session."""
    if not ChatSession.objects.filter(pk=session_id).exists():
        raise Http404("No such session.")
    with transaction.atomic():
        found = latest(session_id)
        if found is None:
            raise InvalidAction("This session has never waited for a person: there is no escalation to mark.")
        if found.not_needed is not None:
            raise InvalidAction(f"{found.not_needed.actor_username or 'An operator'} already marked this "
                                "escalation not needed.")
        return audit(user, NOT_NEEDED, session_id, {"escalation": found.entry.pk},
                     {"escalation": found.entry.pk, "trigger": found.trigger,
                      "reason": clean_text(reason or "").strip()[:2000]})


@dataclass(frozen=True)
class TriggerCount:
    trigger: str
    escalations: int
    not_needed: int

    @property
    def not_needed_rate(self) -> float | None:
        """Per cent of the escalations marked not needed (None for none)."""
        return self.not_needed / self.escalations * 100 if self.escalations else None


def counts(since: datetime, until: datetime) -> list[TriggerCount]:
    """Escalations that began in [``since``, ``until``) by trigger (most first), each with how many of them
    were marked not needed (whenever marked). Two queries; the triggers are counted in Python (a JSON key
    grouped alike on SQLite and PostgreSQL)."""
    escalated = dict(OperatorAction.objects.filter(action=ESCALATED, created_at__gte=since, created_at__lt=until)
                     .values_list("pk", "after"))
    marked = set(OperatorAction.objects.filter(action=NOT_NEEDED, after__escalation__in=list(escalated))
                 .values_list("after__escalation", flat=True)) if escalated else set()
    total: dict[str, list[int]] = {}
    for pk, after in escalated.items():
        tally = total.setdefault(str((after or {}).get("trigger") or "unknown"), [0, 0])
        tally[0] += 1
        tally[1] += pk in marked
    return sorted((TriggerCount(t, n, m) for t, (n, m) in total.items()), key=lambda c: (-c.escalations, c.trigger))
