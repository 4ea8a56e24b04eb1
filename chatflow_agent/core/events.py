"""Run events: what happens during a turn, as small frozen dataclasses joined in ``RunEvent``.

Every event carries ``session_id`` and ``turn_id`` (a hex id shared by the events of one turn)
and a ``type`` literal, so consumers can dispatch on ``event.type``. ``TurnCompleted`` is emitted
after the turn was committed, ``TurnFailed`` after it was rolled back; both carry the turn's
``usage`` (:class:`~chatflow_agent.types.TurnUsage`: each model call's tokens, latency and cost,
and the totals) — a failed turn's calls were made and billed too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from chatflow_agent.types import AgentResponse, Handoff, Message, ToolCall, ToolResult, TurnUsage

__all__ = [
    "RunEvent", "TurnStarted", "MessageAppended", "ToolCallStarted", "ToolCallFinished",
    "HandoffOccurred", "TextDelta", "TurnCompleted", "TurnFailed",
]


@dataclass(frozen=True, kw_only=True)
class _Event:
    session_id: str
    turn_id: str


@dataclass(frozen=True, kw_only=True)
class TurnStarted(_Event):
    agent_name: str
    user_message: str
    type: Literal["turn_started"] = "turn_started"


@dataclass(frozen=True, kw_only=True)
class MessageAppended(_Event):
    """A message joined the turn (not committed yet: the turn may still roll back)."""

    message: Message
    agent_name: str
    index: int  # position in the turn, 0 = the user message
    type: Literal["message_appended"] = "message_appended"


@dataclass(frozen=True, kw_only=True)
class ToolCallStarted(_Event):
    call: ToolCall
    agent_name: str
    type: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True, kw_only=True)
class ToolCallFinished(_Event):
    result: ToolResult
    agent_name: str
    duration_ms: float
    type: Literal["tool_call_finished"] = "tool_call_finished"


@dataclass(frozen=True, kw_only=True)
class HandoffOccurred(_Event):
    from_agent: str
    to_agent: str
    handoff: Handoff
    type: Literal["handoff"] = "handoff"


@dataclass(frozen=True, kw_only=True)
class TextDelta(_Event):
    text: str
    agent_name: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, kw_only=True)
class TurnCompleted(_Event):
    response: AgentResponse
    duration_ms: float
    message_ids: tuple[int, ...] = field(default=())  # row ids of the turn's messages (persistent stores)
    usage: TurnUsage = field(default_factory=TurnUsage)
    type: Literal["turn_completed"] = "turn_completed"


@dataclass(frozen=True, kw_only=True)
class TurnFailed(_Event):
    """The turn raised (or was cancelled) and was rolled back: nothing of it was written."""

    error_type: str
    error: str
    usage: TurnUsage = field(default_factory=TurnUsage)  # the model calls made before it failed
    type: Literal["turn_failed"] = "turn_failed"


RunEvent = (
    TurnStarted | MessageAppended | ToolCallStarted | ToolCallFinished | HandoffOccurred | TextDelta
    | TurnCompleted | TurnFailed
)
