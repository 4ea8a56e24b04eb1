"""Core modules: tools, memory, agents, engines and the Runner (0.3.4's ``chatflow_agent.core``)."""

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engine import EngineTurnResult, GeminiEngine
from chatflow_agent.core.memory import SessionContext, SessionStore
from chatflow_agent.core.runner import Runner
from chatflow_agent.core.tools import Tool, tool

__all__ = ["Agent", "EngineTurnResult", "GeminiEngine", "Runner", "SessionContext", "SessionStore", "Tool", "tool"]
