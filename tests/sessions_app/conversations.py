"""Stored conversations for console tests, written as the runtime writes them (one row per Message)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chatflow_agent.types import Message, Role, ToolCall, ToolResult
from sessions_app import actions
from sessions_app.models import ChatMessage, ChatSession

T0 = datetime(2026, 1, 10, 9, 0, tzinfo=UTC)


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def model(text: str | None = None, calls: list[ToolCall] | None = None) -> Message:
    return Message(role=Role.MODEL, content=text, tool_calls=calls)


def call(call_id: str, name: str, **args: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, args=args)


def results(*items: ToolResult) -> Message:
    return Message(role=Role.TOOL, tool_results=list(items))


def result(call_id: str, name: str, content: Any, error: bool = False) -> ToolResult:
    return ToolResult(tool_call_id=call_id, name=name, content=content, is_error=error)


def handoff_result(call_id: str, source: str, target: str, reason: str = "Specialist routing") -> ToolResult:
    return result(call_id, f"transfer_to_{target.lower()}", {
        "status": "HANDOFF_SUCCESS", "transferred_from": source, "transferred_to": target, "reason": reason,
    })


def store(session_id: str, messages: list[Message], *, agent: str = "Support",
          metadata: dict | None = None, updated: datetime | None = None) -> ChatSession:
    """Write the session row and one message row per message (ids in order, created_at a minute apart)."""
    when = updated or T0
    session = ChatSession.objects.create(session_id=session_id, active_agent_name=agent,
                                         metadata=metadata or {}, created_at=T0, updated_at=when)
    ChatMessage.objects.bulk_create([
        ChatMessage(session=session, role=m.role.value, content=m.content, message_json=m.model_dump_json(),
                    created_at=T0 + timedelta(minutes=i))
        for i, m in enumerate(messages)
    ])
    return session


def support_story() -> list[Message]:
    """Three turns: an order lookup; a handoff to Billing and a refund; a question Billing answers."""
    return [
        Message(role=Role.SYSTEM, content="Be kind."),
        user("Where is order 42?"),
        model(None, [call("c1", "check_order_status", order_id="42")]),
        results(result("c1", "check_order_status", {"order_id": "42", "status": "shipped"})),
        model("Order 42 has shipped."),
        user("I want a refund"),
        model(None, [call("c2", "transfer_to_billing", reason="refund")]),
        results(handoff_result("c2", "Support", "Billing", "refund")),
        model(None, [call("c3", "refund_order", order_id="42")]),
        results(result("c3", "refund_order", {"refunded": True, "amount": 19.5})),
        model("Refunded 19.50 EUR."),
        user("And my invoice?"),
        model(None, [call("c4", "get_invoice", invoice_id="INV-1")]),
        results(result("c4", "get_invoice", "backend timeout", error=True)),
        model("Sorry, the invoice service is down."),
    ]


def rollback_form(session_id: str, turn: int | str) -> dict[str, str]:
    """The rollback confirmation's form fields as the preview renders them (turn and the session's fingerprint)."""
    return {"turn": str(turn), "fingerprint": actions.plan_rollback(session_id, int(turn)).fingerprint}
