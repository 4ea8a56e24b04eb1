"""Human takeover's rules: a session's mode, taking over, replying as an operator, handing back.

Public functions (the views, the webhook worker, the health page and the runtime gate call these):

- :func:`mode_of` — the session's mode row (unsaved ``bot`` row when it has none).
- :func:`take_over` — an operator becomes the session's owner (mode ``human``).
- :func:`hand_back` — back to ``bot``, with the agent to answer next and a private note for it.
- :func:`send_reply` / :func:`resend` — an operator's message to the customer through the session's channel.
- :func:`request_human` — the customer or an agent asked for a person (mode ``waiting``).
- :func:`cancel_turn` — stop the turn running on a session, in whatever process it runs (rolled back).

Every change of mode runs under the session's turn lock (the site store's ``sync_turn``) and in one
database transaction with its audit entry (``OperatorAction``), which is broadcast live once committed.
Errors are :class:`sessions_app.actions.ActionError` subclasses carrying their HTTP status:
``InvalidAction`` (400, a message for the operator), ``SessionBusy`` (409), :class:`TakenOver` (409,
names the operator who owns the session); an unknown session is ``Http404``.
"""

from __future__ import annotations

from typing import Any, Literal

from sessions_app.actions import ActionError
from takeover_app.models import OperatorReply, SessionMode

__all__ = ["TakenOver", "cancel_turn", "hand_back", "mode_of", "request_human", "resend", "send_reply",
           "take_over"]


class TakenOver(ActionError):
    """Another operator owns the session (HTTP 409); ``owner`` is their username."""

    status = 409

    def __init__(self, message: str, owner: str = "") -> None:
        super().__init__(message)
        self.owner = owner


def mode_of(session_id: str) -> SessionMode:
    """The session's ``SessionMode`` row, or an unsaved one in mode ``bot`` when the session has none."""
    raise NotImplementedError


def take_over(user: Any, session_id: str, *, when: Literal["after_turn", "now"] = "after_turn") -> SessionMode:
    """Make ``user`` the owner of ``session_id`` (mode ``human``); returns the saved row.

    ``when="after_turn"``: a running turn finishes first (this call queues behind it, FIFO);
    ``"now"``: the running turn is stopped and rolled back (:func:`cancel_turn`), then the session is
    taken. Idempotent for the current owner. :class:`TakenOver` (409) when another operator owns it;
    ``Http404`` for an unknown session.
    """
    raise NotImplementedError


def hand_back(user: Any, session_id: str, *, agent_name: str | None = None, note: str = "") -> SessionMode:
    """Return the session to ``bot`` mode; ``agent_name`` (default: the agent active before the takeover)
    becomes its active agent and ``note`` (optional, private) is given to the next model call as an
    instruction the customer never sees. ``InvalidAction`` (400) for an unknown agent or a session in
    ``bot`` mode; :class:`TakenOver` (409) when another operator owns it.
    """
    raise NotImplementedError


def send_reply(user: Any, session_id: str, text: str) -> OperatorReply:
    """Store ``text`` as a MODEL message written by ``user`` and send it through the session's channel.

    The message and the ``OperatorReply`` (status ``sending``) commit before the send; the outcome
    (``sent`` / ``failed`` with the error) is recorded after it. Sent at most once: a reply whose
    sender died stays ``sending`` (shown as unknown) and is only sent again by :func:`resend`.
    ``InvalidAction`` (400): empty text, a session not owned by ``user`` in mode ``human``, or a
    WhatsApp session whose customer wrote last more than 24 hours ago (its service window is closed).
    """
    raise NotImplementedError


def resend(user: Any, reply_id: int) -> OperatorReply:
    """Send a ``failed`` (or unknown: its sender died) operator reply again; the same rules as
    :func:`send_reply` apply (owner, 24-hour window). ``InvalidAction`` (400) for a reply that was sent
    or is still being sent; ``Http404`` for an unknown reply."""
    raise NotImplementedError


def request_human(session_id: str, reason: str, trigger: str) -> SessionMode | None:
    """Put a session in ``bot`` mode into ``waiting`` (``trigger``: a ``SessionMode.Trigger`` value; audited
    without an actor). Returns the row, or None when the session already waits or is owned."""
    raise NotImplementedError


def cancel_turn(user: Any, session_id: str, reason: str) -> bool:
    """Stop the turn running on ``session_id``, in this process or another: its lease is taken away, so
    its commit is refused (nothing half-written) and the turn is rolled back at its next lease renewal
    (at once when it runs in this process). A stale lease (its holder died) is released. Audited.
    Returns True when a lease was taken away, False when no turn held the session.
    """
    raise NotImplementedError
