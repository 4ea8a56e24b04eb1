"""Domain types shared by the runtime, the stores and the Django site.

Field names and shapes are those of chatflow-agent 0.3.4, so ``Message.model_dump_json()``
written by either library into ``chatflow_messages.message_json`` is readable by the other.
Two deliberate differences, both invisible to 0.3.4 readers: tool-result content is coerced to
JSON-safe values when a ``ToolResult`` is built (so memory equals what a store reloads), and
text has lone surrogates replaced by U+FFFD (so it can always be encoded as UTF-8).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

from chatflow_agent.jsonsafe import clean_text, json_safe

__all__ = [
    "AgentResponse", "Handoff", "Message", "ModelCallUsage", "Role", "ToolCall", "ToolResult", "TurnUsage",
]


class Role(str, Enum):  # noqa: UP042  # 0.3.4: str(Role.USER) is "Role.USER", not "user"
    """Who wrote a message."""

    USER = "user"
    MODEL = "model"
    SYSTEM = "system"
    TOOL = "tool"


class ToolCall(BaseModel):
    """A tool invocation requested by the model: ``id`` pairs it with its :class:`ToolResult`."""

    id: str = Field(description="Unique identifier for the tool call")
    name: str = Field(description="Name of the function to invoke")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments passed to the tool")

    @field_validator("args", mode="before")
    @classmethod
    def _safe_args(cls, v: Any) -> Any:
        return json_safe(v) if isinstance(v, dict) else v


class ToolResult(BaseModel):
    """The result of one tool call; ``content`` is JSON-safe (see ``json_safe``)."""

    tool_call_id: str = Field(description="ID of the tool call this result corresponds to")
    name: str = Field(description="Name of the tool executed")
    content: Any = Field(description="Returned content or payload from the tool execution")
    is_error: bool = Field(default=False, description="Whether the tool execution failed")

    @field_validator("content", mode="before")
    @classmethod
    def _safe_content(cls, v: Any) -> Any:
        return json_safe(v)


class Handoff(BaseModel):
    """A transfer of the conversation from the active agent to ``target_agent_name``."""

    target_agent_name: str = Field(description="Name of the target agent to hand off to")
    reason: str | None = Field(default=None, description="Reason or intent for transferring the dialogue")
    context_updates: dict[str, Any] = Field(default_factory=dict, description="Variables or state to pass forward")


class Message(BaseModel):
    """One message of a conversation. ``timestamp`` is timezone-aware UTC."""

    role: Role = Field(description="The role of the message participant")
    content: str | None = Field(default=None, description="Textual body of the message")
    tool_calls: list[ToolCall] | None = Field(default=None, description="Tools invoked in this turn")
    tool_results: list[ToolResult] | None = Field(default=None, description="Tool results returned in this turn")
    timestamp: datetime = Field(
        default_factory=lambda: datetime.now(UTC),
        description="UTC timestamp of creation",
    )
    # Left out of the JSON when None, so a message without it is stored exactly as chatflow-agent 0.3.4
    # writes it; 0.3.4 ignores the key when it loads a row that has it.
    author: str | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="Who wrote a MODEL message instead of the model: the operator's username (a takeover reply)",
    )

    @field_validator("content", mode="before")
    @classmethod
    def _clean_content(cls, v: Any) -> Any:
        return clean_text(v) if isinstance(v, str) else v

    @field_validator("timestamp")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)


class ModelCallUsage(BaseModel):
    """What one model call used, as its engine reported it; ``None`` means "the provider did not say".

    Tokens: ``input_tokens`` is the whole prompt, cached part included; ``cached_tokens`` the part
    of it read from the provider's prompt cache; ``cache_write_tokens`` the part written to it
    (Anthropic); ``output_tokens`` what the model generated (reasoning included where billed).
    Times in milliseconds: ``latency_ms`` from the request to the complete answer (the SDK's retries
    included), ``ttft_ms`` from the request to the first streamed text or tool-call fragment
    (streamed calls only). ``finish_reason`` is the provider's own word (``"stop"``, ``"tool_calls"``,
    ``"end_turn"``, ``"STOP"`` …); ``retries`` how many times the SDK retried the request.
    ``estimated`` is true when the counts are an engine's estimate (the demo engine), not a bill.
    ``cost`` is the call's price in ``currency`` (always ``"USD"``), set by the Runner's price book
    when the turn runs; ``None`` when the model's price is not known. ``price_source`` says where
    that price came from (``"override"``: the price book's overrides, ``"genai-prices"``: the
    library) and ``priced_as`` the model name it was found under: the name the provider answered
    with (``model``) or the model the agent was configured with, when only that one is priced.
    ``agent_name``: the agent whose turn step made the call (set by the Runner).
    """

    model_config = ConfigDict(frozen=True)

    provider: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    finish_reason: str | None = None
    retries: int | None = None
    estimated: bool = False
    cost: Decimal | None = None
    currency: Literal["USD"] = "USD"
    price_source: Literal["override", "genai-prices"] | None = None
    priced_as: str | None = None
    agent_name: str | None = None


_N = TypeVar("_N", int, float, Decimal)


def _total(calls: list[ModelCallUsage], value: Callable[[ModelCallUsage], _N | None]) -> _N | None:
    """The sum over ``calls``, or ``None`` when there are none or any call lacks the value."""
    values = [value(c) for c in calls]
    if not values or any(v is None for v in values):
        return None
    known = [v for v in values if v is not None]
    return sum(known[1:], known[0])


class TurnUsage(BaseModel):
    """A turn's model calls (in order) and their totals.

    A total is ``None`` unless every call reported that value (a partial sum would pass for a
    whole one): one call of an unpriced model makes the turn's ``cost`` unknown, never ``0``.
    The totals are computed fields: they appear in ``model_dump()`` / JSON and are recomputed from
    ``calls`` when a dump is validated back.
    """

    model_config = ConfigDict(frozen=True)

    calls: list[ModelCallUsage] = Field(default_factory=list)
    currency: Literal["USD"] = "USD"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def input_tokens(self) -> int | None:
        return _total(self.calls, lambda c: c.input_tokens)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def output_tokens(self) -> int | None:
        return _total(self.calls, lambda c: c.output_tokens)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cached_tokens(self) -> int | None:
        return _total(self.calls, lambda c: c.cached_tokens)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def latency_ms(self) -> float | None:
        return _total(self.calls, lambda c: c.latency_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost(self) -> Decimal | None:
        return _total(self.calls, lambda c: c.cost)


class AgentResponse(BaseModel):
    """What a turn returns: the final answer and the agent active after the turn."""

    content: str = Field(description="Final textual answer generated by the agent")
    active_agent_name: str = Field(description="Name of the agent currently handling the conversation")
    tool_calls_executed: list[str] = Field(default_factory=list, description="Names of tools executed during this turn")
    handoff: Handoff | None = Field(default=None, description="Handoff details if a transfer occurred")
    usage: TurnUsage | None = Field(default=None, description="The turn's model calls, tokens and cost (Runner)")
    held: bool = Field(default=False, description="True when a turn gate held the turn: no model was called")
    human_requested: str | None = Field(default=None, description="Why a person was asked for during the turn")
