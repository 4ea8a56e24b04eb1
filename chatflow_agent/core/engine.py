"""Backward-compatible alias module (chatflow-agent 0.3.4's ``chatflow_agent.core.engine``)."""

from __future__ import annotations

from chatflow_agent.core.engines import BaseEngine, EngineTurnResult, GeminiEngine

__all__ = ["BaseEngine", "EngineTurnResult", "GeminiEngine"]
