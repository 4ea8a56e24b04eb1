"""What a persistent session store reads and writes: stored rows, sessions and commits.

``chatflow_agent.core.memory.PersistentSessionStore`` keeps sessions, history pruning, turns and
leases; a database is plugged under it as a ``SessionBackend`` (below): blocking primitives that
exchange the types of this module. ``chatflow_agent.core.sql`` holds the lease, waiter and
de-duplication rules as SQL for backends on a DB-API database. ``parse_row`` is the one way a
stored message row becomes a ``Message``: every reader of the chatflow tables (stores, console,
export, import) goes through it.

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
from typing import Any, Protocol

from pydantic import ValidationError

from chatflow_agent.core.hooks import TurnHooks
from chatflow_agent.core.reports import TurnReport
from chatflow_agent.jsonsafe import json_safe
from chatflow_agent.types import Message, Role

logger = logging.getLogger("chatflow_agent.memory")

__all__ = [
    "Changes", "CommitResult", "SessionBackend", "StoredRow", "StoredSession", "TurnReport", "parse_row",
]


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
    report: TurnReport | None = None  # the turn this commit ends (status "completed"), if a Runner played it
    hooks: TurnHooks | None = None  # the turn's commit hooks: run first, inside the commit's transaction


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
        # The model's validator called directly: the same validation as ``Message.model_validate_json``,
        # without the wrapper's keyword handling, which costs more than parsing a short message.
        return Message.__pydantic_validator__.validate_json(row.message_json)  # type: ignore[no-any-return]
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


class SessionBackend(Protocol):
    """The blocking primitives a ``PersistentSessionStore`` is built on: one database's rows.

    Implement this to put the persistent stores' contract (identity map, FIFO turns, atomic
    commits, deletion detection, de-duplication) on another database; ``SQLiteSessionStore`` and
    the Django site's store are a backend of this shape plus a ``PersistentSessionStore``.

    **Threads.** Every method blocks and may be called from any thread: the store's pool threads
    (awaitable work; all work for one session runs on the one pool thread that session id maps
    to, so on that thread's connection), a thread of the caller (sync API, several threads at
    once), and the store's lease-keeper thread (``renew_lease`` only). A backend keeps whatever
    per-thread state it needs (for example one connection per thread). When :attr:`inline` is
    true the store never uses threads: every method runs on the calling thread, event loop
    included, so it must be cheap (an in-memory database).

    **Tables.** Sessions, their messages (``StoredRow``; ``id`` increases with every insert and
    orders a session's messages), claimed webhook message ids, leases (one per session) and
    waiters (a line per session, ordered by a ticket that increases with every insert).

    **Token and version.** ``StoredSession.token`` identifies one incarnation of the session row:
    it is the same for as long as the row exists and differs once it was deleted and created again
    (the SQL backends use the creation timestamp's text). ``StoredSession.version`` changes
    whenever the session row or any of its messages changes (the SQL backends use
    ``(updated_at text, max message id, message count)``). Both are opaque to the store, compared
    with ``==`` only, and must be values ``head`` returns again for an unchanged session.

    **Times.** Every TTL and ``ttl_seconds`` is in seconds; ``before`` and lease expiries are unix
    epoch seconds (``time.time()``).

    **Errors.** Database errors propagate unchanged; a method that fails writes nothing.
    """

    @property
    def inline(self) -> bool:
        """True: the store calls every method on the calling thread (no pool, no lease keeper)."""
        ...

    def head(self, session_id: str) -> StoredSession | None:
        """The session row without its messages (``rows`` None), or None when there is none."""
        ...

    def load(self, session_id: str) -> StoredSession | None:
        """The session row and every message row in ``id`` order, read consistently (one snapshot
        on databases that have them), or None when there is no session row."""
        ...

    def create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        """Create the session row (no messages) unless it exists; an existing row is left as it is."""
        ...

    def commit(self, changes: Changes) -> CommitResult:
        """Write ``changes`` in one transaction: all of it or nothing.

        In order: first, inside the transaction and before any row is written, the turn's commit hooks
        (``changes.hooks.committing(session_id, metadata, report)``, metadata parsed from
        ``changes.metadata_json``; see ``chatflow_agent.core.hooks``): what one raises propagates and
        nothing is written. Then, when ``changes.token`` is None, insert the session row or, if one exists, update
        its agent name and metadata; otherwise update them only on the row whose token equals
        ``changes.token`` and raise ``chatflow_agent.exceptions.SessionDeletedError`` (writing
        nothing) when there is none (deleted, or deleted and created again). Then delete the message
        rows of ``changes.delete_ids`` (ids of this session only; missing ids are not an error),
        insert one row per ``changes.inserts`` message (``role``, ``content``,
        ``message_json = msg.model_dump_json()``) in that order, and, when
        ``changes.release_owner`` is set, release that lease in the same transaction — raising
        ``chatflow_agent.exceptions.SessionBusyError`` (writing nothing) when that owner does not
        hold the session's lease any more (it expired and may belong to another turn).
        Returns the new rows' ids in ``inserts`` order and the session's token and version after
        the commit (``changes.version``, the version the store last saw, may be used to compute it
        without reading the row again when no one else can have written meanwhile).

        ``changes.report`` (a ``TurnReport``, status ``completed``, or None): a backend that keeps
        turn records closes the record ``report.owner`` opened, in the same transaction; its first
        message is the row of the first ``Role.USER`` insert. Other backends ignore it.
        """
        ...

    def delete(self, session_id: str) -> bool:
        """Delete the session row and its messages in one transaction; True if a session row was deleted."""
        ...

    def list_sessions(self) -> list[str]:
        """Every session id, most recently updated first."""
        ...

    def clear(self) -> None:
        """Delete every session and message row (de-duplication, lease and waiter rows stay)."""
        ...

    def claim_message(self, message_id: str, ttl_seconds: float) -> bool:
        """Claim a webhook message id in one atomic statement: True when it was not claimed in the
        last ``ttl_seconds`` (it then counts as claimed now), False otherwise. Concurrent claims of
        one id: exactly one gets True. May purge expired claims now and then."""
        ...

    def release_claim(self, message_id: str) -> None:
        """Delete ``message_id``'s claim in one statement, however old, so that the next
        :meth:`claim_message` of it gets True (a message whose processing failed before its turn
        committed). Claims carry no owner: the release is of the id. An id without a claim, and
        every other id's claim, are left as they are."""
        ...

    def is_message_claimed(self, message_id: str, ttl_seconds: float) -> bool:
        """True when ``message_id`` was claimed less than ``ttl_seconds`` ago."""
        ...

    def purge_claims(self, ttl_seconds: float) -> int:
        """Delete claims older than ``ttl_seconds``; how many were deleted."""
        ...

    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                      report: TurnReport | None = None) -> bool:
        """Try once to take the session's lease for ``owner`` (a string unique per turn) for
        ``ttl_seconds``; True when ``owner`` now holds it. The store calls it in a loop until True.

        The lease is free when no row holds it or its expiry has passed. FIFO rule: a free lease
        goes to ``owner`` only when no live waiter (expiry not passed) of that session is ahead of
        it; a caller that is not in the session's line is behind every live waiter. With ``queue``
        true, a caller that did not get the lease joins the line (once; it keeps its place across
        calls) and every call renews its waiter row for a few seconds, so a waiter that stops
        calling drops out; taking the lease leaves the line. With ``queue`` false the caller never
        joins the line.

        ``report`` (the turn's ``TurnReport`` or None): when the lease is taken, a backend that keeps
        turn records opens one (status ``running``) in the same transaction, and marks
        ``interrupted`` any record of this session still ``running`` under another owner (its lease
        expired: its process died). Other backends ignore it.
        """
        ...

    def leave_queue(self, session_id: str, owner: str) -> None:
        """Leave the session's line if ``owner`` is in it (a turn that stopped waiting)."""
        ...

    def renew_lease(self, session_id: str, owner: str, ttl_seconds: float) -> bool:
        """Extend ``owner``'s lease to ``ttl_seconds`` from now; False when ``owner`` does not hold it."""
        ...

    def release_lease(self, session_id: str, owner: str, report: TurnReport | None = None) -> None:
        """Give up ``owner``'s lease; nothing happens when ``owner`` does not hold it.

        ``report`` (a turn that did not commit: status ``failed`` or ``cancelled``, or None): a backend
        that keeps turn records closes ``owner``'s record in the same transaction."""
        ...

    def purge_leases(self, before: float) -> int:
        """Delete lease and waiter rows that expired before ``before`` (unix seconds); how many.
        A backend that keeps turn records marks the ``running`` records of those leases ``interrupted``."""
        ...

    def close(self) -> None:
        """Release connections and threads; the store calls it once, after its own threads stopped."""
        ...
