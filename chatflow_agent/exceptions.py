"""Exception hierarchy for chatflow_agent (names and constructors as in chatflow-agent 0.3.4)."""

from __future__ import annotations


class ChatFlowError(Exception):
    """Base exception for all chatflow_agent errors."""


class DependencyError(ChatFlowError):
    """An optional feature needs a package that is not installed.

    The default install hint names the distribution's extra (``pip install "chatflow-agent[<extra_package>]"``),
    as chatflow-agent 0.3.4's does; ``install_command`` replaces it.
    """

    def __init__(self, feature: str, extra_package: str, install_command: str | None = None) -> None:
        cmd = install_command or f'pip install "chatflow-agent[{extra_package}]"'
        super().__init__(
            f"The feature '{feature}' requires the optional package '{extra_package}'. Install it with: {cmd}"
        )
        self.feature = feature
        self.extra_package = extra_package


class ToolExecutionError(ChatFlowError):
    """A registered tool raised while it ran."""

    def __init__(self, tool_name: str, original_error: Exception) -> None:
        super().__init__(f"Error executing tool '{tool_name}': {original_error}")
        self.tool_name = tool_name
        self.original_error = original_error


class AgentHandoffError(ChatFlowError):
    """A handoff names an agent that is not registered with the Runner."""


class ProviderError(ChatFlowError):
    """Talking to the model provider failed (missing key, HTTP error, malformed answer)."""


class SessionDeletedError(ChatFlowError):
    """The session was deleted (through ``store.delete``) while this session object was in use.

    Raised by reads and writes through the stale session object and by a turn running on it;
    nothing is written and the session is not resurrected (chatflow-agent 0.4.0rc1).
    """

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id!r} was deleted")
        self.session_id = session_id


class SessionBusyError(ChatFlowError):
    """An operation needs the session's turn lock and a turn is running on it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"A turn is running on session {session_id!r}")
        self.session_id = session_id


class StoreSchemaError(ChatFlowError):
    """A database's schema version is newer than this version of chatflow_agent understands."""
