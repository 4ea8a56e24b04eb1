"""What a persistent session store reads and writes: stored rows, sessions and commits.

``chatflow_agent.core.memory.PersistentSessionStore`` keeps sessions, history pruning, turns and
leases; a database is plugged under it by implementing its blocking primitives, which exchange
the types below. ``parse_row`` is the one way a stored message row becomes a ``Message``: every
reader of the chatflow tables (stores, console, export, import) goes through it.

Shapes follow the chatflow tables: ``chatflow_messages`` rows (``id`` autoincrement, ``role``,
``content``, ``message_json``) and ``chatflow_sessions`` rows (``session_id``, ``agent_name``,
``metadata_json``). ``token`` and ``version`` are opaque values a backend chooses: the token
changes when the session row is re-created (a delete then a new session of the same id), the
version whenever the session or its messages change.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from chatflow_agent.jsonsafe import json_safe
from chatflow_agent.types import Message, Role

logger = logging.getLogger("chatflow_agent.memory")

__all__ = ["Changes", "CommitResult", "StoredRow", "StoredSession", "parse_row"]


@dataclass
class StoredRow:
    """One ``chatflow_messages`` row; ``id`` orders messages (autoincrement)."""

    id: int
    role: str
    content: str | None
    message_json: str


@dataclass
class StoredSession:
    """A session row; ``rows`` is None when only the head (no messages) was read."""

    session_id: str
    agent_name: str
    metadata: dict[str, Any]
    token: Any
    version: Any
    rows: list[StoredRow] | None = None


@dataclass
class Changes:
    """What one commit writes for a session (one transaction)."""

    session_id: str
    token: Any  # None: the session row may not exist yet and is created
    agent_name: str
    metadata_json: str
    inserts: list[Message] = field(default_factory=list)
    delete_ids: list[int] = field(default_factory=list)
    release_owner: str | None = None  # release this lease in the same transaction
    version: Any = None  # the session's version when it was loaded (what the store last saw)


@dataclass
class CommitResult:
    """What a commit wrote: the new rows' ids (in ``Changes.inserts`` order), the session's token
    and version after it."""

    new_ids: list[int]
    token: Any
    version: Any


def parse_row(row: StoredRow) -> Message | None:
    """A stored row as a ``Message``; falls back to the role/content columns when the JSON is bad.

    JSON with lone surrogate escapes is read with them replaced by U+FFFD (invariant 8).

    Returns None (the row is then kept on disk but left out of memory) when neither works.
    """
    try:
        return Message.model_validate_json(row.message_json)
    except (ValidationError, ValueError):
        pass
    try:
        # Python's json accepts what pydantic's parser refuses: a lone surrogate escape ("\\ud83d"),
        # which other software writes when it splits an emoji. json_safe turns it into U+FFFD.
        data = json.loads(row.message_json)
        if isinstance(data, dict):
            return Message.model_validate(json_safe(data))
    except (ValidationError, ValueError, TypeError, RecursionError):
        pass
    try:
        msg = Message(role=Role(row.role), content=row.content)
    except (ValidationError, ValueError):
        logger.warning("Ignoring unreadable message row %s (role %r)", row.id, row.role)
        return None
    logger.warning("Message row %s has unreadable message_json; using its role and content", row.id)
    return msg
