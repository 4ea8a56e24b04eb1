"""Read a JSON transcript (``console_app.export``, format version 1) back into a session, through the session store.

The messages go through :class:`DjangoSessionStore` in one turn (its lease, one commit), exactly as a bot
turn writes them; the store's window is widened to the transcript's turn count so nothing is pruned.
Then the session's ``created_at``/``updated_at`` and each row's ``created_at`` (the message's own
timestamp) are set back with the ORM, and agents operators set between turns (the turns' ``agents``)
are written back to the audit log, so exporting the imported session gives the same JSON again.

What the runtime itself never keeps does not come back: messages before the first USER message other
than SYSTEM ones (pruning drops them), and rows that were unreadable when exported (skipped, counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.dateparse import parse_datetime

from chatflow_agent.core.agent import Agent
from chatflow_agent.types import Message, Role
from console_app import export
from console_app.export import FORMAT_VERSION
from sessions_app import actions, registry
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from sessions_app.store import DjangoSessionStore
from sessions_app.timeline import turn_bounds

__all__ = ["RestoreError", "Restored", "restore"]


class RestoreError(Exception):
    """The document is not a transcript this version reads, or the session exists (without ``replace``)."""


@dataclass
class Restored:
    session_id: str
    messages: int
    skipped: int


def _stamp(value: Any, name: str):
    moment = parse_datetime(value) if isinstance(value, str) else None
    if moment is None or moment.tzinfo is None:
        raise RestoreError(f"session.{name} must be an ISO-8601 datetime with a timezone; got {value!r}")
    return moment


def _restore_agent_changes(session: ChatSession, turns: list[dict[str, Any]]) -> None:
    """Agents an operator set between turns are not in the messages but in the audit log, which a transcript
    does not carry: where the transcript's turns' ``agents`` say the agent changed between two turns and the
    restored session does not, write that change to the audit log (no actor, marked ``restored``) at the
    start of the turn before it, so the console and the next export show each turn's agent again."""
    wanted = [t.get("agents") for t in turns]
    if not all(isinstance(a, list) and a and all(isinstance(x, str) for x in a) for a in wanted):
        return  # an older or hand-written transcript without agents: nothing to compare with
    if export.turn_agents(session) == wanted:
        return
    starts = turn_bounds(session.session_id)
    for k in range(1, min(len(wanted), len(starts))):
        if wanted[k][0] != wanted[k - 1][-1]:
            entry = actions.audit(None, OperatorAction.Kind.FORCE_HANDOFF, session.session_id,
                                  {"active_agent": wanted[k - 1][-1]},
                                  {"active_agent": wanted[k][0], "reason": "restored from a transcript",
                                   "restored": True})
            OperatorAction.objects.filter(pk=entry.pk).update(created_at=starts[k - 1][1])


def restore(doc: Any, *, replace: bool = False) -> Restored:
    """Write the transcript ``doc`` (a parsed JSON export) as its session; see the module docstring."""
    if not isinstance(doc, dict) or doc.get("format") != "chatflow-transcript" or doc.get("version") != FORMAT_VERSION:
        raise RestoreError(f"Not a chatflow transcript, version {FORMAT_VERSION}.")
    if doc.get("redacted"):
        raise RestoreError("A redacted export (?redact=contacts) cannot be restored: its contacts, and perhaps "
                           "its session id, are masked. Restore an export made without redact.")
    try:
        info = doc["session"]
        sid, agent_name = str(info["session_id"]), str(info["active_agent"])
        records = list(doc["preamble"]) + [m for turn in doc["turns"] for m in turn["messages"]]
        messages = [Message.model_validate(r) for r in records if not r.get("unreadable")]
        created, updated = _stamp(info["created_at"], "created_at"), _stamp(info["updated_at"], "updated_at")
    except (KeyError, TypeError, ValueError) as exc:
        raise RestoreError(f"Malformed transcript: {exc}") from exc
    turns = sum(1 for m in messages if m.role == Role.USER)
    store = DjangoSessionStore(default_max_turns=max(settings.CHATFLOW_MAX_TURNS, turns, 1))
    store.set_agent_resolver(registry.get_agent)
    agent = registry.get_agent(agent_name) or Agent(name=agent_name, instructions="")
    try:
        with transaction.atomic():
            if ChatSession.objects.filter(pk=sid).exists():
                if not replace:
                    raise RestoreError(f"Session {sid!r} already exists (use --replace to overwrite it).")
                # The store's delete: what every app held of the replaced session goes with it.
                store.delete(sid)
            with store.sync_turn(sid, agent, metadata=info.get("metadata") or {}) as session:
                for message in messages:
                    session.add_message(message)
                history = list(session.history)
            ChatSession.objects.filter(pk=sid).update(created_at=created, updated_at=updated)
            rows = list(ChatMessage.objects.filter(session_id=sid).order_by("id"))
            for row, message in zip(rows, history, strict=True):
                row.created_at = message.timestamp
            ChatMessage.objects.bulk_update(rows, ["created_at"], batch_size=500)
            _restore_agent_changes(ChatSession.objects.get(pk=sid), doc["turns"])
    finally:
        store.close()
    return Restored(sid, len(history), len(records) - len(messages))
