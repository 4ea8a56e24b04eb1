"""Agents: instructions, a model, tools and the peers they may hand a conversation off to."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from chatflow_agent.core.tools import Tool
from chatflow_agent.types import Handoff

__all__ = ["Agent", "PlaceholderAgent", "handoff_tool_name"]


def handoff_tool_name(agent_name: str) -> str:
    """``transfer_to_<name>``: lower-cased, runs of non-alphanumerics folded to one ``_``."""
    clean = re.sub(r"[^a-zA-Z0-9_]", "_", agent_name.strip().lower())
    clean = re.sub(r"_+", "_", clean).strip("_")
    return f"transfer_to_{clean}"


# Kept under 0.3.4's private name for code that imported it.
_sanitize_tool_name = handoff_tool_name


class Agent:
    """An agent with its own instructions, model, tools and handoffs (constructor as in 0.3.4).

    ``engine`` (a ``BaseEngine``) wins over ``provider``/``base_url``/``api_key``, which win over
    the Runner's engine; see ``chatflow_agent.core.engines.resolve_engine``.
    """

    def __init__(
        self,
        name: str,
        instructions: str | Callable[[], str],
        model: str = "gemini-2.5-flash",
        tools: list[Tool | Callable[..., Any]] | None = None,
        handoffs: list[Agent] | None = None,
        provider: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        engine: Any | None = None,
    ) -> None:
        self.name = name
        self.instructions = instructions
        self.model = model
        self.provider = provider
        self.base_url = base_url
        self.api_key = api_key
        self.engine = engine
        self.tools: list[Tool] = []
        self.handoffs: list[Agent] = []
        for t in tools or []:
            self.add_tool(t)
        for h in handoffs or []:
            self.add_handoff(h)

    def get_instructions(self) -> str:
        """The system instructions (calling ``instructions`` when it is a callable)."""
        return self.instructions() if callable(self.instructions) else self.instructions

    def add_tool(self, tool_or_callable: Tool | Callable[..., Any]) -> Tool:
        """Register a tool (a later tool with the same name replaces the earlier one)."""
        t = tool_or_callable if isinstance(tool_or_callable, Tool) else Tool(tool_or_callable)
        self.tools = [existing for existing in self.tools if existing.name != t.name]
        self.tools.append(t)
        return t

    def tool(
        self,
        name_or_func: str | Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> Any:
        """Decorator registering a tool on this agent: ``@agent.tool`` or ``@agent.tool(name=...)``."""
        if callable(name_or_func):
            return self.add_tool(Tool(name_or_func))

        def decorator(fn: Callable[..., Any]) -> Tool:
            tool_name = name or (name_or_func if isinstance(name_or_func, str) else None)
            return self.add_tool(Tool(fn, name=tool_name, description=description))

        return decorator

    def add_handoff(self, target_agent: Agent) -> None:
        """Allow handing off to ``target_agent``. Handing off to itself → ``ValueError``."""
        if target_agent is self or target_agent.name == self.name:
            raise ValueError(f"Agent '{self.name}' cannot register a handoff to itself.")
        self.handoffs = [h for h in self.handoffs if h.name != target_agent.name]
        self.handoffs.append(target_agent)

    def _create_handoff_tool(self, target_agent: Agent) -> Tool:
        desc = (
            f"Hand off the dialogue to '{target_agent.name}'. "
            f"Target agent specialty: {target_agent.get_instructions()[:120]}"
        )
        # Building a Tool builds a pydantic model (~1 ms): reuse it while name and description hold.
        cache: dict[tuple[str, str], Tool] = self.__dict__.setdefault("_handoff_tools", {})
        key = (target_agent.name, desc)
        if key not in cache:
            if len(cache) > 64:  # callable instructions that change every call: stay bounded
                cache.clear()
            cache[key] = self._build_handoff_tool(target_agent, desc)
        return cache[key]

    @staticmethod
    def _build_handoff_tool(target_agent: Agent, desc: str) -> Tool:
        def handoff_executor(reason: str | None = None) -> Handoff:
            """Transfer the conversation to another specialized agent."""
            return Handoff(target_agent_name=target_agent.name, reason=reason)

        return Tool(func=handoff_executor, name=handoff_tool_name(target_agent.name), description=desc)

    def get_all_tools(self) -> list[Tool]:
        """The agent's own tools followed by one ``transfer_to_*`` tool per handoff."""
        return [*self.tools, *(self._create_handoff_tool(peer) for peer in self.handoffs)]

    def __repr__(self) -> str:
        return f"<Agent name={self.name!r} model={self.model!r} tools={len(self.tools)} handoffs={len(self.handoffs)}>"


class PlaceholderAgent(Agent):
    """Stands in for an agent a stored session names and nobody registered (a store without an agent
    resolver, or one that does not know the name): no tools. The Runner plays such a session's turn with
    its starting agent instead."""
