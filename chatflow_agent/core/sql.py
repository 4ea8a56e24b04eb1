"""The chatflow tables' SQL, written once for every backend on a DB-API database.

A ``Dialect`` (``SQLITE``, ``POSTGRESQL``) holds every difference between the databases: the
parameter placeholder (``?`` / ``%s``), how a timestamp parameter is passed (UTC text as
chatflow-agent 0.3.4 writes it on SQLite / an aware ``datetime`` on PostgreSQL), the ``::text``
cast that renders a timestamp column as text, and how an insert reports its new key
(``lastrowid`` / ``RETURNING``). The statements below are rendered for each dialect once.

``SessionRules`` is the lease, waiter and de-duplication rule over a ``Cursor`` (what
``sqlite3.Cursor`` and Django's ``connections[alias].cursor()`` both are); ``read_head`` and
``read_rows`` read a session. A backend (see ``chatflow_agent.core.backend.SessionBackend``) owns
its connections and transactions and calls these with a cursor; ``SQLLeasesAndClaims`` gives it the
backend contract's lease and claim methods over those rules, once for every such backend.

The lease rule (invariant 2, FIFO across processes): a session's lease row
(``chatflow_session_leases``: owner, ``expires_at`` and ``acquired_at`` in unix seconds) is taken
by one ``INSERT … ON CONFLICT … DO UPDATE … WHERE expires_at < now`` statement, atomic on its own,
unless a live waiter of the session is ahead. A caller that did not get it joins the session's line
(``chatflow_session_waiters``, ordered by ``ticket``) and, in one transaction per poll, renews its
waiter row for ``WAITER_TTL_SECONDS`` and takes the lease only when no live waiter has a lower
ticket. A waiter that stops polling is skipped once its row expires.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from chatflow_agent.core.backend import StoredRow, StoredSession, TurnReport
from chatflow_agent.jsonsafe import json_object

__all__ = [
    "POSTGRESQL",
    "PURGE_EVERY_SECONDS",
    "SQLITE",
    "WAITER_TTL_SECONDS",
    "Autocommit",
    "Cursor",
    "Dialect",
    "SQLLeasesAndClaims",
    "SessionRules",
    "Transaction",
    "read_head",
    "read_rows",
    "utc_stamp",
]

_T = TypeVar("_T")

#: seconds a queued waiter stays in line without polling (each poll renews it)
WAITER_TTL_SECONDS = 5.0
#: seconds between two purges of expired rows made in passing: de-duplication claims (by
#: ``SessionRules.claim``), expired leases and waiters (by the stores' turns)
PURGE_EVERY_SECONDS = 300.0


class Cursor(Protocol):
    """The part of a DB-API cursor the rules use."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any], /) -> object: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...


class Transaction(Protocol):
    """Runs ``fn(cursor)`` in one transaction (a savepoint inside an open one) and returns its result;
    an exception rolls it back and propagates."""

    def __call__(self, fn: Callable[[Cursor], _T], /) -> _T: ...


class Autocommit(Protocol):
    """Runs ``fn(cursor)`` outside a transaction (each statement atomic on its own) and returns its
    result; errors propagate."""

    def __call__(self, fn: Callable[[Cursor], _T], /) -> _T: ...


_second_text: tuple[int, str] = (0, "1970-01-01 00:00:00")


def utc_stamp(at: float | None = None) -> str:
    """UTC time (unix seconds, default now) as ``YYYY-MM-DD HH:MM:SS.ffffff``: sorts with SQLite's
    ``CURRENT_TIMESTAMP`` text, which chatflow-agent 0.3.4 writes.

    The text of the whole second is kept from the previous call (a turn commit makes one stamp, and
    building it through ``datetime`` and ``strftime`` every time is a visible part of a commit).
    """
    global _second_text
    fraction, whole = math.modf(time.time() if at is None else at)
    second, micro = int(whole), round(fraction * 1e6)  # datetime.fromtimestamp's rounding
    if not 0 <= micro < 1_000_000:
        second, micro = second + micro // 1_000_000, micro % 1_000_000
    cached = _second_text
    if cached[0] != second:
        cached = _second_text = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second)))
    return f"{cached[1]}.{micro:06d}"


def _aware(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


# Statements in the SQLite form (``?`` placeholders, ``{text}`` where a timestamp column is read as
# text); ``Dialect`` renders them.
_HEAD = (
    "SELECT s.active_agent_name, s.metadata_json, COALESCE(s.created_at{text}, ''), "
    "COALESCE(s.updated_at{text}, ''), "
    "(SELECT COALESCE(MAX(m.id), 0) FROM chatflow_messages m WHERE m.session_id = s.session_id), "
    "(SELECT COUNT(*) FROM chatflow_messages m WHERE m.session_id = s.session_id) "
    "FROM chatflow_sessions s WHERE s.session_id = ?"
)
_ROWS = "SELECT id, role, content, message_json FROM chatflow_messages WHERE session_id = ? ORDER BY id"
_LEASE_UPSERT = (
    "INSERT INTO chatflow_session_leases (session_id, owner, expires_at, acquired_at) SELECT ?, ?, ?, ? "
    "WHERE NOT EXISTS (SELECT 1 FROM chatflow_session_waiters w WHERE w.session_id = ? "
    "AND w.expires_at >= ? AND w.owner <> ?{ahead}) "
    "ON CONFLICT (session_id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, "
    "acquired_at = EXCLUDED.acquired_at WHERE chatflow_session_leases.expires_at < ?"
)
_WAITER_TICKET = "SELECT ticket FROM chatflow_session_waiters WHERE owner = ?"
_WAITER_INSERT = "INSERT INTO chatflow_session_waiters (session_id, owner, expires_at) VALUES (?, ?, ?)"
_WAITER_RENEW = "UPDATE chatflow_session_waiters SET expires_at = ? WHERE owner = ?"
_WAITER_DELETE = "DELETE FROM chatflow_session_waiters WHERE owner = ?"
_LEASE_RENEW = "UPDATE chatflow_session_leases SET expires_at = ? WHERE session_id = ? AND owner = ?"
_LEASE_RELEASE = "DELETE FROM chatflow_session_leases WHERE session_id = ? AND owner = ?"
_LEASE_PURGE = "DELETE FROM chatflow_session_leases WHERE expires_at < ?"
_WAITER_PURGE = "DELETE FROM chatflow_session_waiters WHERE expires_at < ?"
_CLAIM = (
    "INSERT INTO chatflow_processed_messages (message_id, processed_at) VALUES (?, ?) "
    "ON CONFLICT (message_id) DO UPDATE SET processed_at = EXCLUDED.processed_at "
    "WHERE chatflow_processed_messages.processed_at < ?"
)
_CLAIMED = "SELECT 1 FROM chatflow_processed_messages WHERE message_id = ? AND processed_at >= ?"
_CLAIM_PURGE = "DELETE FROM chatflow_processed_messages WHERE processed_at < ?"


class Dialect:
    """One database's SQL: ``SQLITE`` or ``POSTGRESQL`` (see the module docstring).

    ``render(sql)`` turns a statement written with ``?`` placeholders and ``{text}`` casts into this
    dialect's; ``stamp(at)`` is the parameter for a timestamp column at ``at`` (unix seconds);
    ``returning`` says whether inserts report their key with ``RETURNING`` (else ``lastrowid``).
    """

    def __init__(self, name: str, placeholder: str, text_cast: str, stamp: Callable[[float], Any],
                 returning: bool) -> None:
        self.name = name
        self.placeholder = placeholder
        self.text_cast = text_cast
        self.stamp = stamp
        self.returning = returning
        r = self.render
        self.head, self.rows = r(_HEAD), r(_ROWS)
        self.lease_free = r(_LEASE_UPSERT.replace("{ahead}", ""))
        self.lease_in_line = r(_LEASE_UPSERT.replace("{ahead}", " AND w.ticket < ?"))
        self.waiter_ticket, self.waiter_renew, self.waiter_delete = r(_WAITER_TICKET), r(_WAITER_RENEW), r(
            _WAITER_DELETE)
        self.waiter_insert = r(_WAITER_INSERT + (" RETURNING ticket" if returning else ""))
        self.lease_renew, self.lease_release = r(_LEASE_RENEW), r(_LEASE_RELEASE)
        self.lease_purge, self.waiter_purge = r(_LEASE_PURGE), r(_WAITER_PURGE)
        self.claim, self.claimed, self.claim_purge = r(_CLAIM), r(_CLAIMED), r(_CLAIM_PURGE)

    def with_placeholder(self, placeholder: str) -> Dialect:
        """This dialect for a driver interface with another placeholder (Django's cursors take ``%s``
        on every database)."""
        return Dialect(self.name, placeholder, self.text_cast, self.stamp, self.returning)

    def render(self, sql: str) -> str:
        return sql.replace("{text}", self.text_cast).replace("?", self.placeholder)

    def __repr__(self) -> str:
        return f"<Dialect {self.name}>"


SQLITE = Dialect("sqlite", "?", "", utc_stamp, returning=False)
POSTGRESQL = Dialect("postgresql", "%s", "::text", _aware, returning=True)


def read_head(cur: Cursor, dialect: Dialect, session_id: str) -> StoredSession | None:
    """The session row with its token (creation time's text) and version
    (``(updated_at text, max message id, message count)``), without rows; None if absent."""
    cur.execute(dialect.head, (session_id,))
    row = cur.fetchone()
    if row is None:
        return None
    agent, metadata, token, stamp, max_id, count = row
    return StoredSession(session_id, agent, json_object(metadata), token, (stamp, max_id, count))


def read_rows(cur: Cursor, dialect: Dialect, session_id: str) -> list[StoredRow]:
    """The session's message rows in id order."""
    cur.execute(dialect.rows, (session_id,))
    return [StoredRow(*row) for row in cur.fetchall()]


class SessionRules:
    """The lease, waiter and claim rules for one backend (``SessionBackend``'s lease and claim methods).

    It remembers which lease owners of its backend are in a line (so a caller in line is only
    served by the line's rule: a fast-path win would leave its waiter row behind, holding up every
    later waiter until it expired) and when it last purged expired claims. Methods that take a
    ``Transaction`` run several statements in it; the others run one statement, atomic on its own.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._in_line: set[str] = set()
        self._last_claim_purge = 0.0

    # ---- leases -----------------------------------------------------------------------------
    def acquire_lease(self, cur: Cursor, transaction: Transaction, session_id: str, owner: str,
                      ttl_seconds: float, queue: bool) -> bool:
        """One try at the lease (``SessionBackend.acquire_lease``): one upsert when ``owner`` is not
        in line yet, else (or when that failed and ``queue``) one transaction in the line."""
        now = time.time()
        if owner not in self._in_line:
            if self._try_lease(cur, session_id, owner, ttl_seconds, now, None):
                return True
            if not queue:
                return False
            self._in_line.add(owner)
        if transaction(lambda c: self._wait_in_line(c, session_id, owner, ttl_seconds, now)):
            self._in_line.discard(owner)
            return True
        return False

    def _wait_in_line(self, cur: Cursor, session_id: str, owner: str, ttl: float, now: float) -> bool:
        d = self.dialect
        cur.execute(d.waiter_ticket, (owner,))
        row = cur.fetchone()
        if row is None:
            ticket = self._insert_waiter(cur, session_id, owner, now + WAITER_TTL_SECONDS)
        else:
            ticket = row[0]
            cur.execute(d.waiter_renew, (now + WAITER_TTL_SECONDS, owner))
        if self._try_lease(cur, session_id, owner, ttl, now, ticket):
            cur.execute(d.waiter_delete, (owner,))
            return True
        return False

    def _insert_waiter(self, cur: Cursor, session_id: str, owner: str, expires_at: float) -> int:
        cur.execute(self.dialect.waiter_insert, (session_id, owner, expires_at))
        if self.dialect.returning:
            return int(cur.fetchone()[0])
        return int(cur.lastrowid)  # type: ignore[attr-defined]  # DB-API's optional lastrowid

    def _try_lease(self, cur: Cursor, session_id: str, owner: str, ttl: float, now: float,
                   ticket: int | None) -> bool:
        """One statement: insert or take over an expired lease, unless a live waiter is ahead."""
        d = self.dialect
        if ticket is None:
            cur.execute(d.lease_free, (session_id, owner, now + ttl, now, session_id, now, owner, now))
        else:
            cur.execute(d.lease_in_line, (session_id, owner, now + ttl, now, session_id, now, owner, ticket, now))
        return cur.rowcount == 1

    def leave_queue(self, cur: Cursor, owner: str) -> None:
        self._in_line.discard(owner)
        cur.execute(self.dialect.waiter_delete, (owner,))

    def renew_lease(self, cur: Cursor, session_id: str, owner: str, ttl_seconds: float) -> bool:
        cur.execute(self.dialect.lease_renew, (time.time() + ttl_seconds, session_id, owner))
        return cur.rowcount == 1

    def release_lease(self, cur: Cursor, session_id: str, owner: str) -> bool:
        """Delete ``owner``'s lease; False when it held none (a commit then raises ``SessionBusyError``)."""
        cur.execute(self.dialect.lease_release, (session_id, owner))
        return cur.rowcount == 1

    def purge_leases(self, transaction: Transaction, before: float) -> int:
        def purge(c: Cursor) -> int:
            c.execute(self.dialect.lease_purge, (before,))
            leases = c.rowcount
            c.execute(self.dialect.waiter_purge, (before,))
            return leases + c.rowcount

        return transaction(purge)

    # ---- de-duplication ---------------------------------------------------------------------
    def claim(self, cur: Cursor, message_id: str, ttl_seconds: float) -> bool:
        """One statement: a new id inserts, an id claimed longer than ``ttl_seconds`` ago is claimed
        again, else nothing (False). Purges expired claims at most every ``PURGE_EVERY_SECONDS``."""
        now = time.time()
        if now - self._last_claim_purge > PURGE_EVERY_SECONDS:
            self._last_claim_purge = now
            self.purge_claims(cur, ttl_seconds)
        stamp = self.dialect.stamp
        cur.execute(self.dialect.claim, (message_id, stamp(now), stamp(now - ttl_seconds)))
        return cur.rowcount == 1

    def is_claimed(self, cur: Cursor, message_id: str, ttl_seconds: float) -> bool:
        cur.execute(self.dialect.claimed, (message_id, self.dialect.stamp(time.time() - ttl_seconds)))
        return cur.fetchone() is not None

    def purge_claims(self, cur: Cursor, ttl_seconds: float) -> int:
        cur.execute(self.dialect.claim_purge, (self.dialect.stamp(time.time() - ttl_seconds),))
        return cur.rowcount


class SQLLeasesAndClaims:
    """The lease, waiter and de-duplication methods of ``SessionBackend`` (``claim_message`` …
    ``purge_leases``, contracts there) over a :class:`SessionRules`, for a backend on a DB-API database.

    A backend class derives from it and calls ``super().__init__(dialect, one, transaction)``:
    ``one`` (:class:`Autocommit`) runs ``fn(cursor)`` on the calling thread's connection outside a
    transaction, ``transaction`` (:class:`Transaction`) in one transaction. Both may be called from
    any thread and propagate database errors. The backend's own commit releases a lease through
    ``self._rules`` (the same rules). Turn reports are ignored here (no turn records): a backend that
    keeps them overrides ``acquire_lease`` / ``release_lease`` and calls the rules in its transaction.
    """

    def __init__(self, dialect: Dialect, one: Autocommit, transaction: Transaction) -> None:
        self._rules = SessionRules(dialect)
        self._statement = one
        self._in_transaction = transaction

    def claim_message(self, message_id: str, ttl_seconds: float) -> bool:
        return self._statement(lambda c: self._rules.claim(c, message_id, ttl_seconds))

    def is_message_claimed(self, message_id: str, ttl_seconds: float) -> bool:
        return self._statement(lambda c: self._rules.is_claimed(c, message_id, ttl_seconds))

    def purge_claims(self, ttl_seconds: float) -> int:
        return self._statement(lambda c: self._rules.purge_claims(c, ttl_seconds))

    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                      report: TurnReport | None = None) -> bool:
        return self._statement(lambda c: self._rules.acquire_lease(c, self._in_transaction, session_id, owner,
                                                                   ttl_seconds, queue))

    def leave_queue(self, session_id: str, owner: str) -> None:
        self._statement(lambda c: self._rules.leave_queue(c, owner))

    def renew_lease(self, session_id: str, owner: str, ttl_seconds: float) -> bool:
        return self._statement(lambda c: self._rules.renew_lease(c, session_id, owner, ttl_seconds))

    def release_lease(self, session_id: str, owner: str, report: TurnReport | None = None) -> None:
        self._statement(lambda c: self._rules.release_lease(c, session_id, owner))

    def purge_leases(self, before: float) -> int:
        # Through ``one``: where the backend runs its queries (off an event loop thread, for Django).
        return self._statement(lambda _c: self._rules.purge_leases(self._in_transaction, before))
