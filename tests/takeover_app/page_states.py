"""Sessions in each takeover state, written as takeover_app stores them (its tables, the MODEL row with
the operator as ``author``), for the console's presentation tests."""

from __future__ import annotations

from datetime import timedelta

from chatflow_agent.types import Message, Role
from sessions_app.models import ChatMessage, ChatSession
from takeover_app.models import OperatorReply, SessionMode
from tests.sessions_app import conversations as cv


def waiting(session_id: str, *, reason: str = "The customer asked for a person", channel: str = "whatsapp",
            minutes: int = 0) -> SessionMode:
    """A session waiting for a person since ``minutes`` after T0."""
    cv.store(session_id, [cv.user("I want to talk to a human"), cv.model("A person will answer you here soon.")],
             metadata={"channel": channel})
    at = cv.T0 + timedelta(minutes=minutes)
    return SessionMode.objects.create(session_id=session_id, mode="waiting", trigger="phrase", reason=reason,
                                      since=at, waiting_since=at, previous_agent="Support")


def human(session_id: str, owner, *, channel: str = "whatsapp", unread: int = 0, note: str = "") -> SessionMode:
    """A session owned by ``owner`` (mode ``human``), before any reply."""
    cv.store(session_id, [cv.user("where is my refund?"), cv.model("Let me check.")],
             agent="Billing", metadata={"channel": channel, "wa_id": "15550100", "phone_number_id": "1098"})
    return SessionMode.objects.create(session_id=session_id, mode="human", owner=owner,
                                      owner_username=owner.username, since=cv.T0, previous_agent="Support",
                                      trigger="operator", unread=unread, last_note=note)


def operator_reply(session_id: str, owner, text: str, status: str = "sent", error: str = "") -> OperatorReply:
    """An operator's reply: its MODEL row (``author`` set) and its ``OperatorReply`` with ``status``."""
    session = ChatSession.objects.get(pk=session_id)
    message = Message(role=Role.MODEL, content=text, author=owner.username)
    row = ChatMessage.objects.create(session=session, role=Role.MODEL.value, content=text,
                                     message_json=message.model_dump_json(), created_at=cv.T0)
    return OperatorReply.objects.create(session_id=session_id, message_row_id=row.pk, text=text, author=owner,
                                        author_username=owner.username, provider="whatsapp", status=status,
                                        error=error, attempts=1)
