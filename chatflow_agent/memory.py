"""Alias of :mod:`chatflow_agent.core.memory` (chatflow-agent 0.3.4's ``chatflow_agent.memory``)."""

from chatflow_agent.core.memory import (
    BaseSessionStore,
    SessionContext,
    SessionStore,
    SQLiteSessionContext,
    SQLiteSessionStore,
)

BaseSessionContext = SessionContext

__all__ = ["BaseSessionContext", "BaseSessionStore", "SessionContext", "SessionStore", "SQLiteSessionContext",
           "SQLiteSessionStore"]
