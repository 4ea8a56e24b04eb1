"""Engine interface: one model evaluation of a conversation (chatflow-agent 0.3.4's contract)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from chatflow_agent.types import Message, ModelCallUsage, ToolCall

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["BaseEngine", "EngineTurnResult", "TextDeltaCallback", "token_count"]

TextDeltaCallback = Callable[[str], Awaitable[None]]


def token_count(value: Any) -> int | None:
    """A token count a provider reported, for :class:`ModelCallUsage`: ``value`` when it is a
    non-negative ``int`` (not a ``bool``), else ``None`` (left out, null, a string, a float …)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class EngineTurnResult:
    """One model answer: ``text`` and/or ``tool_calls``; ``raw_response`` is the provider's payload;
    ``usage`` what the call used (tokens, latency, finish reason …) or ``None`` when the engine
    does not say. The Runner prices it and reports it with the turn."""

    def __init__(
        self,
        text: str | None = None,
        tool_calls: list[ToolCall] | None = None,
        raw_response: Any | None = None,
        usage: ModelCallUsage | None = None,
    ) -> None:
        self.text = text
        self.tool_calls = tool_calls or []
        self.raw_response = raw_response
        self.usage = usage

    @property
    def has_tool_calls(self) -> bool:
        return len(self.tool_calls) > 0

    def __repr__(self) -> str:
        return f"<EngineTurnResult text={self.text!r} tool_calls={[c.name for c in self.tool_calls]}>"


class BaseEngine(ABC):
    """A model provider. Subclasses implement :meth:`generate_turn_async`.

    ``history`` is what the Runner hands over: well-formed (SYSTEM messages first, then a USER
    message, every tool call followed by its result). Engines that can stream override
    :meth:`stream_turn_async` and call ``on_text_delta`` with each piece of text as it arrives.

    ``provider`` names the model vendor an engine talks to (``"openai"``, ``"gemini"`` …) or is
    ``None`` for provider-agnostic engines (scripted, demo, gateways); ``resolve_engine`` uses it
    so a Runner default never receives another vendor's model name.
    """

    provider: str | None = None

    @abstractmethod
    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """Evaluate ``history`` with ``agent``'s instructions and tools."""
        raise NotImplementedError

    async def stream_turn_async(
        self, agent: Agent, history: list[Message], on_text_delta: TextDeltaCallback
    ) -> EngineTurnResult:
        """Like :meth:`generate_turn_async`, reporting text deltas; the default does not stream."""
        return await self.generate_turn_async(agent, history)
