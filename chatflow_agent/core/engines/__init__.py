"""Model engines: the provider SDK engines, the offline demo engine and the scripted test engine."""

from __future__ import annotations

from chatflow_agent.core.engines.anthropic import AnthropicEngine
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.core.engines.demo import DemoEngine
from chatflow_agent.core.engines.factory import resolve_engine
from chatflow_agent.core.engines.gemini import GeminiEngine
from chatflow_agent.core.engines.openai_compatible import OpenAIEngine
from chatflow_agent.core.engines.scripted import ScriptedEngine

__all__ = [
    "AnthropicEngine",
    "BaseEngine",
    "DemoEngine",
    "EngineTurnResult",
    "GeminiEngine",
    "OpenAIEngine",
    "ScriptedEngine",
    "resolve_engine",
]
