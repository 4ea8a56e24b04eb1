"""A test agent whose engine records what each model call received (in this process)."""

from __future__ import annotations

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.types import Message, Role

#: One entry per model call: the (role, content) pairs the engine was given.
CALLS: list[list[tuple[str, str]]] = []


class RecordingEngine(BaseEngine):
    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        CALLS.append([(m.role.value, m.content or "") for m in history])
        text = next((m.content or "" for m in reversed(history) if m.role == Role.USER), "")
        if "[fail]" in text:
            raise RuntimeError("the model provider is down (test)")
        return EngineTurnResult(text=f"answer to {text}")


def build() -> Agent:
    support = Agent(name="Support", instructions="You are Support.", model="rec", engine=RecordingEngine())
    billing = Agent(name="Billing", instructions="You are Billing.", model="rec", engine=RecordingEngine())
    support.add_handoff(billing)
    billing.add_handoff(support)
    return support


class MeteredEngine(RecordingEngine):
    """:class:`RecordingEngine` that reports 100 input and 50 output tokens a call."""

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        from chatflow_agent.types import ModelCallUsage

        result = await super().generate_turn_async(agent, history)
        result.usage = ModelCallUsage(provider="test", model="rec", input_tokens=100, output_tokens=50)
        return result


def build_metered() -> Agent:
    return Agent(name="Support", instructions="You are Support.", model="rec", engine=MeteredEngine())
