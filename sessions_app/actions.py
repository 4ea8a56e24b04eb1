"""Operator actions on a session: force a handoff, roll back to a turn (planned first), delete.

Every action goes through the site's session store (the same turn lock, lease and commit a bot turn
uses; never raw SQL), runs in one database transaction together with its audit entry, and refuses
with :class:`SessionBusy` (HTTP 409) when a turn holds the session. Permission checks are the
views' job; these functions take the acting user only to write the audit entry.

Rollback is one operation on the live session, in one turn of the store: its preview
(:func:`plan_rollback`) and its confirmation (:func:`rollback`) plan it with the same function, under
the same locks, from the stored rows numbered as the page numbers them and the live history they must
match; the preview leaves the turn before its commit, the confirmation applies the plan and commits it,
if the session is still the one the preview was made from (its *fingerprint*, mandatory; checked
before the turn number, so a confirmation that lost a race says "changed since the preview"). So what
the preview shows is what happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.http import Http404

from chatflow_agent.core.backend import StoredRow, parse_row
from chatflow_agent.exceptions import SessionBusyError
from chatflow_agent.jsonsafe import json_safe
from chatflow_agent.types import Message, Role
from sessions_app import holdings, registry, runtime
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from sessions_app.timeline import handoff_of, pretty_json, row_turns
from turns_app.usage import mark_rolled_back

__all__ = [
    "ActionError", "InvalidAction", "SessionBusy", "StalePlan", "RollbackPlan",
    "audit", "delete_session", "force_handoff", "plan_rollback", "redact_audit", "rollback", "session_counts",
    "site_store",
]


class ActionError(Exception):
    """An action refused with a message for the operator; ``status`` is the HTTP status."""

    status = 400


class InvalidAction(ActionError):
    status = 400


class SessionBusy(ActionError):
    status = 409


class StalePlan(ActionError):
    status = 409


# The site's DjangoSessionStore, one per process and shared with the site's Runner (sessions_app.runtime):
# the in-process turn lock that makes an action answer 409 belongs to that one store instance.
site_store = runtime.site_store


def _busy(session_id: str) -> SessionBusy:
    return SessionBusy(f"A turn is running on session {session_id!r}; try again when it has finished.")


def _locked_session(session_id: str) -> ChatSession:
    """The session row, locked until the current transaction ends (actions on one session queue here), or 404.

    On SQLite the transaction's ``BEGIN IMMEDIATE`` already serialises writers; PostgreSQL takes the row lock.
    """
    row = ChatSession.objects.select_for_update().filter(pk=session_id).first()
    if row is None:
        raise Http404("No such session.")
    return row


def audit(user: Any, action: str, session_id: str, before: dict, after: dict) -> OperatorAction:
    """Write one audit log entry (call it inside the action's transaction); saving it broadcasts it live.

    ``action`` is an ``OperatorAction.Kind`` value; ``before``/``after`` are made JSON-safe (an operator's free
    text, e.g. a handoff reason, may hold NUL, which PostgreSQL's jsonb refuses). An anonymous ``user`` is
    recorded without an actor.
    """
    return OperatorAction.objects.create(
        actor=user if getattr(user, "pk", None) else None,
        actor_username=getattr(user, "username", "") or "",
        action=action,
        session_id=session_id,
        before=json_safe(before),
        after=json_safe(after),
    )


def session_counts(session_id: str) -> dict[str, int]:
    """Messages and turns (USER rows) stored for the session."""
    messages = ChatMessage.objects.filter(session_id=session_id)
    return {"messages": messages.count(), "turns": messages.filter(role=Role.USER.value).count()}


# ---- force handoff ---------------------------------------------------------------------------
def force_handoff(user: Any, session_id: str, agent_name: str, reason: str = "") -> OperatorAction:
    """Make ``agent_name`` (a registered agent) the session's active agent. No chat message is written."""
    agent = registry.get_agent(agent_name)
    if agent is None:
        known = ", ".join(registry.agents())
        raise InvalidAction(f"Unknown agent {agent_name!r}; registered agents: {known}.")
    store = site_store()
    with transaction.atomic():
        _locked_session(session_id)
        try:
            with store.sync_turn(session_id, registry.starting_agent(), wait=False) as session:
                before = session.active_agent.name
                if before == agent.name:
                    raise InvalidAction(f"{agent.name} is already the active agent of this session.")
                session.set_active_agent(agent)
        except SessionBusyError:
            raise _busy(session_id) from None
        return audit(user, OperatorAction.Kind.FORCE_HANDOFF, session_id,
                      {"active_agent": before}, {"active_agent": agent.name, "reason": reason})


# ---- rollback --------------------------------------------------------------------------------
@dataclass
class RemovedCall:
    turn: int
    name: str
    args: str
    outcome: str  # "ok", "error", "no result"


@dataclass
class RollbackPlan:
    """What rolling ``session_id`` back to ``turn`` does (turn 0: remove every turn)."""

    session_id: str
    turn: int
    turn_count: int
    fingerprint: str
    agent_before: str
    agent_after: str
    agent_after_registered: bool
    removed_turns: list[int]
    removed_ids: list[int]
    kept_ids: list[int]
    pruned_turns: list[int] = field(default_factory=list)
    leading_ids: list[int] = field(default_factory=list)
    side_effects: list[RemovedCall] = field(default_factory=list)
    handoffs_undone: list[dict[str, Any]] = field(default_factory=list)
    window: int = 0
    turn_first_ids: list[int] = field(default_factory=list)  # each stored turn's USER row id, turn 1 first

    def first_message_id(self, turn: int) -> int | None:
        """The row id of turn ``turn``'s USER message (None for turn 0): unlike the turn number, it never shifts."""
        return self.turn_first_ids[turn - 1] if 1 <= turn <= len(self.turn_first_ids) else None

    @property
    def removed_first_ids(self) -> list[int]:
        """The row id of each removed turn's USER message, in ``removed_turns`` order."""
        return [i for n in self.removed_turns if (i := self.first_message_id(n)) is not None]

    def summary(self) -> dict[str, Any]:
        """JSON-safe description (for the audit log).

        Turn numbers count the stored turns (1 = oldest) and shift once the runtime prunes older turns,
        so each turn is also named by the row id of its first (USER) message: ``turn_first_message_id``
        for the target (None for turn 0), ``removed_turn_first_message_ids`` in ``removed_turns`` order.
        """
        return {
            "turn": self.turn,
            "turn_first_message_id": self.first_message_id(self.turn),
            "removed_turns": self.removed_turns,
            "removed_turn_first_message_ids": [self.first_message_id(n) for n in self.removed_turns],
            "removed_message_ids": self.removed_ids,
            "pruned_turns": self.pruned_turns,
            "agent_after": self.agent_after,
            "tool_calls_not_undone": [c.__dict__ for c in self.side_effects],
            "handoffs_undone": self.handoffs_undone,
        }


def _stored_rows(session_id: str) -> tuple[list[tuple[int, str, str | None, str]], str]:
    """The session's rows, oldest first, and their fingerprint (the last row id and the row count)."""
    rows = list(
        ChatMessage.objects.filter(session_id=session_id).order_by("id")
        .values_list("id", "role", "content", "message_json")
    )
    return rows, f"{rows[-1][0] if rows else 0}-{len(rows)}"


def _agent_after(turns: list[list[Message]], n: int, current: str) -> str:
    """The agent that ended turn ``n``, from the handoff results in the history."""
    handoffs = [[h for m in t if m.role == Role.TOOL for r in m.tool_results or [] if (h := handoff_of(r))]
                for t in turns]
    for hs in reversed(handoffs[:n]):
        if hs:
            return hs[-1]["to"]
    for hs in handoffs[n:]:
        if hs:
            # The agent active before the first later handoff; 0.3.4 did not record it, and then
            # no earlier handoff happened, so it is the agent the session started with.
            return hs[0]["from"] or registry.starting_agent().name
    return current


class _Previewed(Exception):
    """Leaves the rollback's turn without its commit: the preview's way out, carrying its plan."""

    def __init__(self, plan: RollbackPlan) -> None:
        super().__init__(plan.session_id)
        self.plan = plan


def _plan(store: Any, session: Any, row: ChatSession, turn: int, fingerprint: str | None) -> RollbackPlan:
    """Inside the session's turn: the plan for rolling the live ``session`` back to ``turn``.

    The stored rows are numbered into turns (``sessions_app.timeline.row_turns``, the page's and the
    exports' numbering); the live history holds the newest of them (the runtime's window), each of its
    messages the object of one of those rows (``store.message_row_id``). :class:`StalePlan` when
    ``fingerprint`` is not the rows', or when the live history is not exactly the rows' SYSTEM rows and
    newest turns (then the store would not remove what the plan says); :class:`InvalidAction` for a turn
    it cannot go to.
    """
    rows, current = _stored_rows(row.session_id)
    if fingerprint is not None and fingerprint != current:
        raise StalePlan("The session changed since the preview was shown; review the new preview.")
    # A row that does not parse is kept on disk, never in memory: it is numbered, but no rollback removes it.
    parsed = {r[0]: parse_row(StoredRow(*r)) for r in rows}
    system = [r for r in rows if r[1] == Role.SYSTEM.value]
    numbered = list(row_turns(r for r in rows if r[1] != Role.SYSTEM.value))
    leading = [r for n, chunk in numbered if n == 0 for r in chunk if parsed[r[0]] is not None]
    turns = [chunk for n, chunk in numbered if n]
    total, window, live = len(turns), session.max_turns, session.turns
    offset = total - len(live)
    in_memory = [store.message_row_id(session, m) for m in session.history]
    expected = [r[0] for r in (*system, *(r for t in turns[offset:] for r in t)) if parsed[r[0]] is not None]
    if offset < 0 or None in in_memory or sorted(in_memory) != sorted(expected):  # (SYSTEM first in memory)
        raise StalePlan("The session's history in the store differs from the stored rows; reload and retry.")
    low = 0 if offset == 0 else offset + 1
    if not (low <= turn < total):
        raise InvalidAction(f"Cannot roll back to turn {turn}: choose a turn from {low} to {total - 1} "
                            f"(the session has {total} turns, the runtime keeps the newest {window}).")
    removed_turns = list(range(1, offset + 1)) + list(range(turn + 1, total + 1))
    messages = [[m for r in t if (m := parsed[r[0]]) is not None] for t in turns]
    removed_ids = sorted([r[0] for n in removed_turns for r in turns[n - 1] if parsed[r[0]] is not None]
                         + [r[0] for r in leading])
    gone = set(removed_ids)
    agent_after = _agent_after(messages, turn, row.active_agent_name)
    plan = RollbackPlan(
        session_id=row.session_id, turn=turn, turn_count=total, fingerprint=current,
        agent_before=row.active_agent_name, agent_after=agent_after,
        agent_after_registered=registry.get_agent(agent_after) is not None,
        removed_turns=removed_turns, removed_ids=removed_ids,
        kept_ids=[r[0] for r in rows if r[0] not in gone],
        pruned_turns=list(range(1, offset + 1)), leading_ids=[r[0] for r in leading], window=window,
        turn_first_ids=[t[0][0] for t in turns],
    )
    for n in range(turn + 1, total + 1):
        results = {r.tool_call_id: r for m in messages[n - 1] if m.role == Role.TOOL for r in m.tool_results or []}
        for m in messages[n - 1]:
            for call in m.tool_calls or []:
                result = results.get(call.id)
                handoff = handoff_of(result) if result is not None else None
                if handoff:
                    plan.handoffs_undone.append({"turn": n, **handoff})
                    continue
                outcome = "no result" if result is None else ("error" if result.is_error else "ok")
                plan.side_effects.append(RemovedCall(n, call.name, pretty_json(call.args), outcome))
    return plan


def _apply(store: Any, session: Any, plan: RollbackPlan) -> str:
    """Inside the turn: keep the messages whose rows ``plan`` keeps, in their rows' order (so the store's
    commit removes exactly the other rows, by identity, and rewrites none); set the agent that ended turn
    ``plan.turn``. Returns the active agent's name."""
    kept = set(plan.kept_ids)
    by_row = {store.message_row_id(session, m): m for m in session.history}
    session.history = [by_row[rid] for rid in sorted(by_row) if rid in kept]
    agent = registry.get_agent(plan.agent_after)
    if agent is not None and agent.name != session.active_agent.name:
        session.set_active_agent(agent)
    return session.active_agent.name


def _rollback(user: Any, session_id: str, turn: int, fingerprint: str | None,
              commit: bool) -> tuple[RollbackPlan, OperatorAction | None]:
    """The rollback, planned and (with ``commit``) applied in one turn of the site's store on the live session.

    Under the session's row lock and turn lock (``wait=False``: :class:`SessionBusy` while a turn runs) the
    plan is made by :func:`_plan`; without ``commit`` the turn is left before its commit (nothing is
    written) and ``(plan, None)`` returned; with it, the plan is applied in memory, the store commits it
    and the audit entry is written in the same transaction: ``(plan, entry)``. ``Http404`` for no session.
    """
    store = site_store()
    with transaction.atomic():
        row = _locked_session(session_id)
        try:
            with store.sync_turn(session_id, registry.starting_agent(), wait=False) as session:
                plan = _plan(store, session, row, turn, fingerprint)
                if not commit:
                    raise _Previewed(plan)
                agent_now = _apply(store, session, plan)
        except SessionBusyError:
            raise _busy(session_id) from None
        except _Previewed as previewed:
            return previewed.plan, None
        mark_rolled_back(session_id, plan.removed_first_ids)
        before = {"turn_count": plan.turn_count, "active_agent": plan.agent_before, "fingerprint": plan.fingerprint}
        after = {**plan.summary(), "turn_count": plan.turn, "active_agent": agent_now}
        return plan, audit(user, OperatorAction.Kind.ROLLBACK, session_id, before, after)


def plan_rollback(session_id: str, turn: int, fingerprint: str | None = None) -> RollbackPlan:
    """The preview: what :func:`rollback` to ``turn`` would do now, planned as it plans, nothing committed.

    :class:`InvalidAction` for a turn it cannot go to; :class:`SessionBusy` while a turn runs;
    with ``fingerprint`` (a preview's), :class:`StalePlan` first when the stored rows are no longer
    those the preview was made from, whatever ``turn`` is. The store keeps the newest
    ``default_max_turns`` turns in memory and removes older rows with its next commit, so those
    ("pruned") turns are removed too and cannot be a rollback target.
    """
    return _rollback(None, session_id, turn, fingerprint, commit=False)[0]


def rollback(user: Any, session_id: str, turn: int, fingerprint: str) -> tuple[RollbackPlan, OperatorAction]:
    """Roll back to ``turn`` as :func:`plan_rollback` describes, if the session still has ``fingerprint``.

    ``fingerprint`` is the preview's (:attr:`RollbackPlan.fingerprint`) and is required
    (:class:`InvalidAction` without it). It is compared under the session's row lock and turn lock,
    before the turn number: a session changed since the preview (another operator's rollback
    included) is :class:`StalePlan` (409); a running turn is :class:`SessionBusy` (409).
    """
    if not fingerprint:
        raise InvalidAction("The rollback needs the fingerprint of its preview: open the preview "
                            "(Roll back to the end of turn N) and confirm it there.")
    plan, entry = _rollback(user, session_id, turn, fingerprint, commit=True)
    assert entry is not None
    return plan, entry


# ---- delete ----------------------------------------------------------------------------------
def redact_audit(session_id: str) -> dict[str, int]:
    """The session's audit entries keep who did what and when; their texts (a reason, a note, a reply, tool
    arguments) are redacted (:func:`sessions_app.holdings.redacted`). Returns ``{"audit_entries_redacted": n}``."""
    changed = []
    for entry in OperatorAction.objects.filter(session_id=session_id).only("id", "before", "after"):
        before, after = holdings.redacted(entry.before), holdings.redacted(entry.after)
        if (before, after) != (entry.before, entry.after):
            entry.before, entry.after = before, after
            changed.append(entry)
    OperatorAction.objects.bulk_update(changed, ["before", "after"])
    return {"audit_entries_redacted": len(changed)}


def delete_session(user: Any, session_id: str) -> OperatorAction:
    """Delete the session through the store (a running turn then gets SessionDeletedError), and in the same
    transaction everything every app holds of it (``sessions_app.holdings.erase``: deleted, or redacted where
    rows stay). The audit entry's ``after`` is ``{"deleted": True, **their counts}``; its ``before`` says what
    was deleted, with the metadata's texts redacted. ``Http404`` for a session that does not exist."""
    if not ChatSession.objects.filter(pk=session_id).exists():
        raise Http404("No such session.")  # a first turn still running is not deleted by a refused delete
    with transaction.atomic():
        erased = site_store().erase(session_id)
        if not erased.existed:  # deleted meanwhile: what this erase forgot is rolled back with the 404
            raise Http404("No such session.")
        return audit(user, OperatorAction.Kind.DELETE, session_id, erased.before,
                     {"deleted": True, **erased.counts})
