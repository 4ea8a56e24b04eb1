"""chatflow_agent: multi-agent chat runtime with sessions that survive concurrency and failure.

Public names and module paths follow chatflow-agent 0.3.4 (its channel adapters excepted: the
Django site replaces them), so agents, tools and engines written for it run unchanged.
"""

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines import AnthropicEngine, BaseEngine, GeminiEngine, OpenAIEngine
from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.core.events import (
    HandoffOccurred,
    MessageAppended,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)
from chatflow_agent.core.memory import (
    DEFAULT_DEDUP_TTL_HOURS,
    BaseSessionStore,
    SessionContext,
    SessionStore,
    SQLiteSessionContext,
    SQLiteSessionStore,
)
from chatflow_agent.core.runner import Runner
from chatflow_agent.core.tools import Tool, tool
from chatflow_agent.exceptions import (
    AgentHandoffError,
    ChatFlowError,
    DependencyError,
    ProviderError,
    SessionBusyError,
    SessionDeletedError,
    StoreSchemaError,
    ToolExecutionError,
)
from chatflow_agent.pricing import ModelPrice, PriceBook
from chatflow_agent.types import AgentResponse, Handoff, Message, ModelCallUsage, Role, ToolCall, ToolResult, TurnUsage

BaseSessionContext = SessionContext

__version__ = "0.4.0"
__all__ = [
    "__version__",
    "Agent",
    "AgentResponse",
    "AnthropicEngine",
    "BaseEngine",
    "EngineTurnResult",
    "GeminiEngine",
    "OpenAIEngine",
    "Handoff",
    "Message",
    "Role",
    "Runner",
    "BaseSessionContext",
    "BaseSessionStore",
    "DEFAULT_DEDUP_TTL_HOURS",
    "SessionContext",
    "SessionStore",
    "SQLiteSessionContext",
    "SQLiteSessionStore",
    "Tool",
    "tool",
    "ToolCall",
    "ToolResult",
    "ChatFlowError",
    "DependencyError",
    "ToolExecutionError",
    "AgentHandoffError",
    "ProviderError",
    "SessionBusyError",
    "SessionDeletedError",
    "StoreSchemaError",
    "RunEvent",
    "TurnStarted",
    "MessageAppended",
    "ToolCallStarted",
    "ToolCallFinished",
    "HandoffOccurred",
    "TextDelta",
    "TurnCompleted",
    "TurnFailed",
    "ModelCallUsage",
    "TurnUsage",
    "ModelPrice",
    "PriceBook",
]
