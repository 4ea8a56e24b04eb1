"""What the session page shows of a human takeover: the session's mode, who owns it, what the viewing
user may do, where a reply goes, and each operator-written message's delivery.

Here, above ``webhooks_app``, because where a reply goes is the session's arrival (``webhooks_app.arrival``);
the console's session page and its live fragments call it.

Read only: the rules (who may take over, reply, hand back; the 24-hour window) are
``takeover_app.service``'s, which the page's forms post to. This module only decides which forms a
user sees (``takeover_app.take_over`` and ``takeover_app.reply_as_operator`` permissions, checked again
by the endpoints).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sessions_app.access import may
from sessions_app.timeline import Item
from takeover_app import escalations
from takeover_app.access import REPLY, TAKE_OVER
from takeover_app.models import OperatorReply, SessionMode
from webhooks_app.arrival import arrival_of, customer_channel

__all__ = ["attach_replies", "takeover_ctx"]


def takeover_ctx(user: Any, session: Any, lease: Any, agent_names: list[str]) -> dict[str, Any]:
    """The ``takeover`` context of the session page for ``user``.

    Keys: ``row`` (the ``SessionMode`` row or None), ``mode`` (``bot`` / ``waiting`` / ``human``),
    ``mine`` (``user`` owns it), ``customer`` (a customer's session: ``webhooks_app.arrival.customer_channel``),
    ``can_take_over``, ``composer`` (``user`` may reply now: owner in ``human`` mode with the reply
    permission), ``turn_running`` (a live lease: the take-over form offers "after this turn" / "stop it
    now"), ``handback_agent`` (the hand-back select's default: the agent active before the takeover when
    still registered, else the active agent), ``channel`` (the webhook the session's messages arrive
    through, '' for none) and ``transcript_only`` (a reply goes nowhere but the transcript:
    ``OperatorReply.transcript_only``), ``escalation`` (the latest ``takeover_app.escalations.Escalation``:
    what made the session wait for a person and its "not needed" mark; None for a session that never waited).
    """
    row = SessionMode.objects.filter(pk=session.session_id).first()
    mode = row.mode if row is not None else SessionMode.Mode.BOT.value
    mine = (mode == SessionMode.Mode.HUMAN and row is not None and row.owner_id is not None
            and row.owner_id == getattr(user, "pk", None))
    previous = row.previous_agent if row is not None else ""
    arrival = arrival_of(session.session_id, session.metadata)
    channel = arrival.provider if arrival is not None else ""
    return {
        "row": row,
        "mode": mode,
        "mine": mine,
        "can_take_over": may(user, TAKE_OVER),
        "composer": mine and may(user, REPLY),
        "turn_running": lease is not None and not lease.expired,
        "handback_agent": previous if previous in agent_names else session.active_agent_name,
        "channel": channel,
        # A customer's session: the live chat page would write as the customer; taking over answers them.
        "customer": customer_channel(arrival, session.metadata),
        "transcript_only": OperatorReply.transcript_only(channel),
        # Only a session with a mode row ever waited (start_waiting writes one): no queries for the others.
        "escalation": escalations.latest(session.session_id) if row is not None else None,
    }


def attach_replies(session_id: str, items: Iterable[Item]) -> None:
    """Set ``item.reply`` (its ``OperatorReply``: delivery status, error, whether it may be resent) on
    every operator-written message among ``items`` (one query)."""
    wanted = [i for i in items if i.kind == "model" and i.author and i.row_id]
    if not wanted:
        return
    replies = {r.message_row_id: r for r in OperatorReply.objects.filter(
        session_id=session_id, message_row_id__in=[i.row_id for i in wanted])}
    for item in wanted:
        item.reply = replies.get(item.row_id)
