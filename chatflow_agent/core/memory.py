"""Sessions and their stores (chatflow-agent's ``chatflow_agent.core.memory``).

``SessionContext`` holds one conversation; ``SessionStore`` keeps sessions in memory;
``SQLiteSessionStore`` persists them on the chatflow schema; ``BaseSessionStore`` is the contract
that every store — these two and the Django site's — implements. ``PersistentSessionStore`` is
that contract over a ``SessionBackend`` (``chatflow_agent.core.backend``): ``SQLiteBackend`` is one,
the Django site's ORM backend another. ``StoreSide`` (``session.store_side``) is what a store
does to the sessions it holds.
"""

from chatflow_agent.core._persistent import PersistentSessionStore
from chatflow_agent.core._pruning import engine_view, group_turns, numbered_turns, prune_history, turn_number
from chatflow_agent.core._session import (
    DEFAULT_DEDUP_TTL_HOURS,
    DEFAULT_DEDUP_TTL_SECONDS,
    BaseSessionStore,
    SessionContext,
    SessionStore,
    StoreSide,
)
from chatflow_agent.core._sqlite import _BLOCKING_IO_WORKERS, SQLiteBackend, SQLiteSessionContext, SQLiteSessionStore
from chatflow_agent.core.backend import SessionBackend

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DEFAULT_DEDUP_TTL_SECONDS",
    "BaseSessionStore",
    "PersistentSessionStore",
    "SessionBackend",
    "SessionContext",
    "SessionStore",
    "SQLiteBackend",
    "SQLiteSessionContext",
    "SQLiteSessionStore",
    "StoreSide",
    "_BLOCKING_IO_WORKERS",
    "engine_view",
    "group_turns",
    "numbered_turns",
    "prune_history",
    "turn_number",
]
