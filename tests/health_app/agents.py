"""A test agent that calls one tool, then answers; each model call reports its usage (tokens, latency)."""

from __future__ import annotations

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.core.tools import tool
from chatflow_agent.types import ModelCallUsage, Role, ToolCall


@tool
def lookup_order(number: str) -> dict:
    """The order's state."""
    return {"order": number, "state": "shipped"}


def _usage(input_tokens: int, output_tokens: int, finish: str) -> ModelCallUsage:
    return ModelCallUsage(provider="scripted", model="clerk-1", input_tokens=input_tokens,
                          output_tokens=output_tokens, cached_tokens=0, latency_ms=3.0, finish_reason=finish)


class ToolThenAnswer(BaseEngine):
    async def generate_turn_async(self, agent, history):
        if history and history[-1].role == Role.TOOL:
            return EngineTurnResult(text="Order 404 has shipped.", usage=_usage(30, 6, "stop"))
        call = ToolCall(id=f"call-{len(history)}", name="lookup_order", args={"number": "404"})
        return EngineTurnResult(tool_calls=[call], usage=_usage(20, 4, "tool_calls"))


def build() -> Agent:
    return Agent(name="Clerk", instructions="Look orders up.", model="clerk-1", engine=ToolThenAnswer(),
                 tools=[lookup_order])
