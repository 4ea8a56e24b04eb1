"""The chatflow tables' SQL, written once for every backend on a DB-API database.

A ``Dialect`` (``SQLITE``, ``POSTGRESQL``) holds every difference between the databases: the
parameter placeholder (``?`` / ``%s``), how a timestamp parameter is passed (UTC text as
chatflow-agent 0.3.4 writes it on SQLite / an aware ``datetime`` on PostgreSQL), the ``::text``
cast that renders a timestamp column as text, and how an insert reports its new key
(``lastrowid`` / ``RETURNING``). The statements below are rendered for each dialect once.

``SessionRules`` is the lease, waiter and de-duplication rule over a ``Cursor`` (what
``sqlite3.Cursor`` and psycopg's cursors both are); ``read_head`` and ``read_rows`` read a session;
``write_commit``, ``create_session``, ``delete_session``, ``list_session_ids`` and ``clear_sessions``
write and list sessions (the commit and delete inside the caller's transaction).
A backend (see ``chatflow_agent.core.backend.SessionBackend``) owns
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

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from chatflow_agent.core.backend import Changes, CommitResult, StoredRow, StoredSession, TurnReport
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.jsonsafe import json_object

__all__ = [
    "POSTGRESQL",
    "PURGE_EVERY_SECONDS",
    "SQLITE",
    "WAITER_TTL_SECONDS",
    "Autocommit",
    "Cursor",
    "Dialect",
    "LeaseRider",
    "SQLLeasesAndClaims",
    "SessionRules",
    "Transaction",
    "CHUNK_ROWS",
    "clear_sessions",
    "create_session",
    "sqlite_transaction",
    "delete_session",
    "list_session_ids",
    "read_head",
    "read_rows",
    "write_commit",
    "utc_stamp",
]

_T = TypeVar("_T")
_C = TypeVar("_C", bound="Cursor")

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


#: Turns a lease statement (the upsert or the release, rendered for the dialect, and its
#: parameters) into one statement that also writes the caller's rows and whose row count is still 1
#: exactly when the lease was taken or released (on PostgreSQL: the lease statement as a
#: data-modifying CTE, ``WITH lease AS (statement RETURNING session_id) …``).
LeaseRider = Callable[[str, Sequence[Any]], tuple[str, Sequence[Any]]]

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
_CLAIM_RELEASE = "DELETE FROM chatflow_processed_messages WHERE message_id = ?"
# Sessions and messages (``{json}``: a parameter stored in the metadata column).
_SESSION_CREATE = (
    "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, updated_at) "
    "VALUES (?, ?, {json}, ?, ?) ON CONFLICT (session_id) DO NOTHING"
)
_SESSION_UPSERT = (
    "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, updated_at) "
    "VALUES (?, ?, {json}, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "active_agent_name = EXCLUDED.active_agent_name, metadata_json = EXCLUDED.metadata_json, "
    "updated_at = EXCLUDED.updated_at RETURNING COALESCE(created_at{text}, ''), COALESCE(updated_at{text}, '')"
)
_SESSION_UPDATE = (
    "UPDATE chatflow_sessions SET active_agent_name = ?, metadata_json = {json}, updated_at = ? "
    "WHERE session_id = ? AND COALESCE(created_at{text}, '') = ? RETURNING COALESCE(updated_at{text}, '')"
)
_MESSAGES_DELETE_SOME = "DELETE FROM chatflow_messages WHERE session_id = ? AND id IN ({ids})"
_MESSAGES_INSERT = "INSERT INTO chatflow_messages (session_id, role, content, message_json, created_at) VALUES "
_MESSAGES_DELETE = "DELETE FROM chatflow_messages WHERE session_id = ?"
# RETURNING databases (PostgreSQL): a commit on a known session row as one statement. The session
# update comes first (every other part waits for its row, and writes nothing when there is none);
# each inserted row comes back with the update's ``updated_at`` text and the count of deleted ids.
_ROWS_WRITE = (
    "WITH updated AS (" + _SESSION_UPDATE + "){pruned} "
    + _MESSAGES_INSERT.removesuffix("VALUES ") + "SELECT * FROM (VALUES {rows}) AS v "
    "WHERE EXISTS (SELECT 1 FROM updated) RETURNING id, (SELECT * FROM updated), {deleted}"
)
_ROWS_PRUNED = (", pruned AS (DELETE FROM chatflow_messages WHERE session_id = ? AND id IN ({ids}) "
                "AND EXISTS (SELECT 1 FROM updated) RETURNING 1)")
_SESSION_DELETE = "DELETE FROM chatflow_sessions WHERE session_id = ?"
_SESSION_IDS = "SELECT session_id FROM chatflow_sessions ORDER BY updated_at DESC"
_CLEAR = ("DELETE FROM chatflow_messages", "DELETE FROM chatflow_sessions")
#: rows per multi-row statement (message ids per DELETE … IN, message rows per INSERT): far below
#: every database's parameter limit
CHUNK_ROWS = 500


class Dialect:
    """One database's SQL: ``SQLITE`` or ``POSTGRESQL`` (see the module docstring).

    ``render(sql)`` turns a statement written with ``?`` placeholders and ``{text}`` casts into this
    dialect's; ``stamp(at)`` is the parameter for a timestamp column at ``at`` (unix seconds);
    ``returning`` says whether inserts report their key with ``RETURNING`` (else ``lastrowid``);
    ``writing_ctes`` whether a statement's ``WITH`` may hold ``INSERT``/``UPDATE``/``DELETE``
    (PostgreSQL's may, SQLite's may not), which :meth:`write_rows` needs.
    """

    #: statement texts of varying row counts kept (``delete_some``, ``insert_messages``, ``write_rows``)
    MULTI_KEPT = 256

    def __init__(self, name: str, placeholder: str, text_cast: str, stamp: Callable[[float], Any],
                 returning: bool, json_cast: str = "", writing_ctes: bool = False) -> None:
        self.name = name
        self.placeholder = placeholder
        self.text_cast = text_cast
        self.json_cast = json_cast
        self.stamp = stamp
        self.returning = returning
        self.writing_ctes = writing_ctes
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
        self.claim_release = r(_CLAIM_RELEASE)
        self.session_create, self.session_upsert = r(_SESSION_CREATE), r(_SESSION_UPSERT)
        self.session_update, self.session_delete = r(_SESSION_UPDATE), r(_SESSION_DELETE)
        self.messages_delete, self.session_ids = r(_MESSAGES_DELETE), r(_SESSION_IDS)
        self.clear = tuple(r(sql) for sql in _CLEAR)
        self._multi: dict[tuple[str, int], str] = {}

    def delete_some(self, count: int) -> str:
        """``DELETE`` of ``count`` message ids of one session (params: session id, then the ids)."""
        return self._multi_row("delete", count, lambda: _render_ids(self, _MESSAGES_DELETE_SOME, count))

    def insert_messages(self, count: int) -> str:
        """One ``INSERT`` of ``count`` message rows (5 params each) ``RETURNING id``."""
        row = "(" + ", ".join([self.placeholder] * 5) + ")"
        return self._multi_row("insert", count,
                               lambda: _MESSAGES_INSERT + ", ".join([row] * count) + " RETURNING id")

    def write_rows(self, deletes: int, inserts: int) -> str:
        """Dialects with ``writing_ctes``: one statement that updates a session row (the ``session_update`` params),
        deletes ``deletes`` of its message ids (session id, then the ids) and inserts ``inserts`` rows (5
        params each), all only when the row is there; it returns, per inserted row, its id, the row's
        new ``updated_at`` text and how many ids were deleted (no rows: no session row, nothing written)."""
        def build() -> str:
            row = "(" + ", ".join(["?"] * 5) + ")"
            pruned = _ROWS_PRUNED.replace("{ids}", ", ".join(["?"] * deletes)) if deletes else ""
            return self.render(_ROWS_WRITE.replace("{pruned}", pruned).replace("{rows}", ", ".join([row] * inserts))
                               .replace("{deleted}", "(SELECT COUNT(*) FROM pruned)" if deletes else "0"))

        return self._multi_row(f"write, deleting {deletes}", inserts, build)

    def _multi_row(self, kind: str, count: int, build: Callable[[], str]) -> str:
        key = (kind, count)
        sql = self._multi.get(key)
        if sql is None:
            if len(self._multi) >= self.MULTI_KEPT:
                self._multi.clear()  # (atomic, unlike dropping the oldest while other threads add) the hot
                # row counts are few and built again at once
            sql = self._multi[key] = build()
        return sql

    def render(self, sql: str) -> str:
        return (sql.replace("{text}", self.text_cast).replace("{json}", "?" + self.json_cast)
                .replace("?", self.placeholder))

    def __repr__(self) -> str:
        return f"<Dialect {self.name}>"


def _render_ids(dialect: Dialect, sql: str, count: int) -> str:
    return dialect.render(sql.replace("{ids}", ", ".join(["?"] * count)))


SQLITE = Dialect("sqlite", "?", "", utc_stamp, returning=False)
POSTGRESQL = Dialect("postgresql", "%s", "::text", _aware, returning=True, json_cast="::jsonb",
                     writing_ctes=True)


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


def sqlite_transaction(cur: _C, fn: Callable[[_C], _T], begin: str = "BEGIN IMMEDIATE", *,
                       commit: bool = True) -> _T:
    """SQLite: ``fn(cur)`` in one transaction on ``cur``'s connection (a ``sqlite3`` connection in autocommit
    mode), opened with ``begin`` — ``BEGIN IMMEDIATE`` takes the write lock first, a deferred ``BEGIN`` a
    read snapshot at its first read — and ended with ``COMMIT``, or ``ROLLBACK`` when ``commit`` is False (a
    read). Returns what ``fn`` returns. Whatever fails, ``fn`` or the ``COMMIT`` itself (a deferred
    constraint, a busy or full database), the transaction is rolled back before the error propagates, so
    the connection is back in autocommit; a rollback's own error never hides the first one.
    ``RuntimeError`` when the connection is already in a transaction."""
    driver: Any = cur.connection  # type: ignore[attr-defined]  # sqlite3.Cursor.connection
    if driver.in_transaction:
        raise RuntimeError("sqlite_transaction() needs a connection in autocommit; a transaction is open on it")
    cur.execute(begin, ())
    try:
        result = fn(cur)
        if commit:
            cur.execute("COMMIT", ())
        return result
    finally:
        if driver.in_transaction:
            with contextlib.suppress(Exception):
                driver.rollback()


def create_session(cur: Cursor, dialect: Dialect, session_id: str, agent_name: str, metadata_json: str) -> None:
    """Insert the session row (no messages) unless one exists (``SessionBackend.create``)."""
    stamp = dialect.stamp(time.time())
    cur.execute(dialect.session_create, (session_id, agent_name, metadata_json, stamp, stamp))


def write_commit(cur: Cursor, rules: SessionRules, changes: Changes,
                 release_rider: Callable[[list[int]], LeaseRider | None] | None = None) -> CommitResult:
    """Write ``changes`` with ``cur``, inside the caller's transaction (``SessionBackend.commit``'s
    contract, in its order): the session row (upsert, or update on the row of ``changes.token``,
    else ``SessionDeletedError``), deletes of ``delete_ids`` and inserts of ``inserts`` in chunks of
    ``CHUNK_ROWS`` (the inserts ``RETURNING id``; on a dialect with ``writing_ctes``, an update of a known row with
    some inserts and at most ``CHUNK_ROWS`` of each is one statement, ``Dialect.write_rows``), the lease
    release (``SessionBusyError`` when ``release_owner`` no longer holds it). The caller rolls back on
    an error. ``release_rider``, given the new row ids in order, gives the ``LeaseRider`` (or None) for
    the release statement.

    A turn's commit (lease released, token known, rows inserted, ``changes.version`` a tuple)
    computes the new version from the one read when the lease was taken and the ``updated_at``
    text the update returned; other commits read the head again.
    """
    d = rules.dialect
    sid = changes.session_id
    stamp = d.stamp(time.time())
    ids, inserts = changes.delete_ids, changes.inserts
    if d.writing_ctes and changes.token is not None and 0 < len(inserts) <= CHUNK_ROWS and len(ids) <= CHUNK_ROWS:
        token = changes.token
        updated, deleted, new_ids = _write_rows(cur, d, changes, stamp)
    else:
        token, updated, deleted, new_ids = _write_rows_apart(cur, d, changes, stamp)
    rider = None if release_rider is None else release_rider(new_ids)
    if changes.release_owner and not rules.release_lease(cur, sid, changes.release_owner, rider):
        # The lease expired (its renewals stalled) and may have gone to another turn:
        # committing now could interleave with it, so this turn fails and writes nothing.
        raise SessionBusyError(sid)
    prev = changes.version
    if changes.release_owner and changes.token is not None and new_ids and isinstance(prev, tuple):
        # The version read when the lease was taken is current (nobody else ran a turn since),
        # so the new one follows without reading the head again. A non-turn write elsewhere
        # meanwhile only makes it differ, which forces a reload.
        return CommitResult(new_ids, token, (updated, new_ids[-1], prev[2] - deleted + len(new_ids)))
    head = read_head(cur, d, sid)
    assert head is not None
    return CommitResult(new_ids, head.token, head.version)


def _row_params(session_id: str, messages: Sequence[Any], stamp: Any) -> list[Any]:
    params: list[Any] = []
    for msg in messages:
        params += (session_id, msg.role.value, msg.content, msg.model_dump_json(), stamp)
    return params


def _write_rows(cur: Cursor, d: Dialect, changes: Changes, stamp: Any) -> tuple[Any, int, list[int]]:
    """``write_commit``'s rows in one statement (``Dialect.write_rows``): (updated_at text, deleted, new ids)."""
    sid, ids = changes.session_id, changes.delete_ids
    params: list[Any] = [changes.agent_name, changes.metadata_json, stamp, sid, changes.token]
    if ids:
        params += (sid, *ids)
    cur.execute(d.write_rows(len(ids), len(changes.inserts)), params + _row_params(sid, changes.inserts, stamp))
    rows = cur.fetchall()
    if not rows:
        raise SessionDeletedError(sid)  # deleted (maybe re-created) since it was loaded
    # RETURNING gives no order; one statement's ids increase in the order of its rows.
    return rows[0][1], int(rows[0][2]), sorted(int(r[0]) for r in rows)


def _write_rows_apart(cur: Cursor, d: Dialect, changes: Changes, stamp: Any) -> tuple[Any, Any, int, list[int]]:
    """``write_commit``'s rows a statement each (the session row, then chunks of deletes and inserts):
    (token, updated_at text, deleted, new ids)."""
    sid = changes.session_id
    if changes.token is None:
        cur.execute(d.session_upsert, (sid, changes.agent_name, changes.metadata_json, stamp, stamp))
        token, updated = cur.fetchone()
    else:
        cur.execute(d.session_update, (changes.agent_name, changes.metadata_json, stamp, sid, changes.token))
        row = cur.fetchone()
        if row is None:
            raise SessionDeletedError(sid)  # deleted (maybe re-created) since it was loaded
        token, updated = changes.token, row[0]
    deleted = 0
    ids = changes.delete_ids
    for start in range(0, len(ids), CHUNK_ROWS):
        chunk = ids[start : start + CHUNK_ROWS]
        cur.execute(d.delete_some(len(chunk)), (sid, *chunk))
        deleted += cur.rowcount
    new_ids: list[int] = []
    inserts = changes.inserts
    for start in range(0, len(inserts), CHUNK_ROWS):
        rows = inserts[start : start + CHUNK_ROWS]
        cur.execute(d.insert_messages(len(rows)), _row_params(sid, rows, stamp))
        # RETURNING gives no order; one statement's ids increase in the order of its rows.
        new_ids += sorted(int(r[0]) for r in cur.fetchall())
    return token, updated, deleted, new_ids


def delete_session(cur: Cursor, dialect: Dialect, session_id: str) -> bool:
    """Delete the session's messages and row, inside the caller's transaction; True if a row went."""
    cur.execute(dialect.messages_delete, (session_id,))
    cur.execute(dialect.session_delete, (session_id,))
    return cur.rowcount > 0


def list_session_ids(cur: Cursor, dialect: Dialect) -> list[str]:
    """Every session id, most recently updated first."""
    cur.execute(dialect.session_ids, ())
    return [row[0] for row in cur.fetchall()]


def clear_sessions(cur: Cursor, dialect: Dialect) -> None:
    """Delete every message and session row, inside the caller's transaction."""
    for sql in dialect.clear:
        cur.execute(sql, ())


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
                      ttl_seconds: float, queue: bool, rider: LeaseRider | None = None) -> bool:
        """One try at the lease (``SessionBackend.acquire_lease``): one upsert when ``owner`` is not
        in line yet, else (or when that failed and ``queue``) one transaction in the line. ``rider``
        (see ``LeaseRider``) makes each upsert write the caller's rows too."""
        now = time.time()
        if owner not in self._in_line:
            if self._try_lease(cur, session_id, owner, ttl_seconds, now, None, rider):
                return True
            if not queue:
                return False
            self._in_line.add(owner)
        if transaction(lambda c: self._wait_in_line(c, session_id, owner, ttl_seconds, now, rider)):
            self._in_line.discard(owner)
            return True
        return False

    def _wait_in_line(self, cur: Cursor, session_id: str, owner: str, ttl: float, now: float,
                      rider: LeaseRider | None) -> bool:
        d = self.dialect
        cur.execute(d.waiter_ticket, (owner,))
        row = cur.fetchone()
        if row is None:
            ticket = self._insert_waiter(cur, session_id, owner, now + WAITER_TTL_SECONDS)
        else:
            ticket = row[0]
            cur.execute(d.waiter_renew, (now + WAITER_TTL_SECONDS, owner))
        if self._try_lease(cur, session_id, owner, ttl, now, ticket, rider):
            cur.execute(d.waiter_delete, (owner,))
            return True
        return False

    def _insert_waiter(self, cur: Cursor, session_id: str, owner: str, expires_at: float) -> int:
        cur.execute(self.dialect.waiter_insert, (session_id, owner, expires_at))
        if self.dialect.returning:
            return int(cur.fetchone()[0])
        return int(cur.lastrowid)  # type: ignore[attr-defined]  # DB-API's optional lastrowid

    def _try_lease(self, cur: Cursor, session_id: str, owner: str, ttl: float, now: float,
                   ticket: int | None, rider: LeaseRider | None = None) -> bool:
        """One statement: insert or take over an expired lease, unless a live waiter is ahead."""
        d = self.dialect
        sql: str
        params: Sequence[Any]
        if ticket is None:
            sql, params = d.lease_free, (session_id, owner, now + ttl, now, session_id, now, owner, now)
        else:
            sql, params = d.lease_in_line, (session_id, owner, now + ttl, now, session_id, now, owner, ticket, now)
        if rider is not None:
            sql, params = rider(sql, params)
        cur.execute(sql, params)
        return cur.rowcount == 1

    def leave_queue(self, cur: Cursor, owner: str) -> None:
        self._in_line.discard(owner)
        cur.execute(self.dialect.waiter_delete, (owner,))

    def renew_lease(self, cur: Cursor, session_id: str, owner: str, ttl_seconds: float) -> bool:
        cur.execute(self.dialect.lease_renew, (time.time() + ttl_seconds, session_id, owner))
        return cur.rowcount == 1

    def release_lease(self, cur: Cursor, session_id: str, owner: str, rider: LeaseRider | None = None) -> bool:
        """Delete ``owner``'s lease; False when it held none (a commit then raises ``SessionBusyError``).
        ``rider`` (see ``LeaseRider``) makes the delete write the caller's rows too."""
        sql: str = self.dialect.lease_release
        params: Sequence[Any] = (session_id, owner)
        if rider is not None:
            sql, params = rider(sql, params)
        cur.execute(sql, params)
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

    def release_claim(self, cur: Cursor, message_id: str) -> None:
        """One statement: delete ``message_id``'s claim, whenever it was made, so the next :meth:`claim` of it
        wins; an id without a claim changes nothing."""
        cur.execute(self.dialect.claim_release, (message_id,))

    def is_claimed(self, cur: Cursor, message_id: str, ttl_seconds: float) -> bool:
        cur.execute(self.dialect.claimed, (message_id, self.dialect.stamp(time.time() - ttl_seconds)))
        return cur.fetchone() is not None

    def purge_claims(self, cur: Cursor, ttl_seconds: float) -> int:
        cur.execute(self.dialect.claim_purge, (self.dialect.stamp(time.time() - ttl_seconds),))
        return cur.rowcount


class SQLLeasesAndClaims:
    """The lease, waiter and de-duplication methods of ``SessionBackend`` (``claim_message`` …
    ``purge_leases``, contracts there) over a :class:`SessionRules`, for a backend on a DB-API database.

    ``SQLLeasesAndClaims(dialect, one, transaction)``: ``one`` (:class:`Autocommit`) runs ``fn(cursor)``
    on the calling thread's connection outside a transaction, ``transaction`` (:class:`Transaction`) in
    one transaction. Both may be called from any thread and propagate database errors. A backend either
    derives from it (calling ``super().__init__(dialect, one, transaction)``) or holds one and forwards
    those methods to it. :attr:`rules` is the :class:`SessionRules` the methods run: the backend's own
    commit releases a lease through it (``write_commit``), so one backend has one set of rules. Turn
    reports are ignored here (no turn records): a backend that keeps them runs ``rules``' methods in its
    own transaction, or passes them a ``LeaseRider`` that writes them in the lease statements themselves.
    """

    def __init__(self, dialect: Dialect, one: Autocommit, transaction: Transaction) -> None:
        self.rules = SessionRules(dialect)
        self._statement = one
        self._in_transaction = transaction

    def claim_message(self, message_id: str, ttl_seconds: float) -> bool:
        return self._statement(lambda c: self.rules.claim(c, message_id, ttl_seconds))

    def release_claim(self, message_id: str) -> None:
        self._statement(lambda c: self.rules.release_claim(c, message_id))

    def is_message_claimed(self, message_id: str, ttl_seconds: float) -> bool:
        return self._statement(lambda c: self.rules.is_claimed(c, message_id, ttl_seconds))

    def purge_claims(self, ttl_seconds: float) -> int:
        return self._statement(lambda c: self.rules.purge_claims(c, ttl_seconds))

    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                      report: TurnReport | None = None) -> bool:
        return self._statement(lambda c: self.rules.acquire_lease(c, self._in_transaction, session_id, owner,
                                                                   ttl_seconds, queue))

    def leave_queue(self, session_id: str, owner: str) -> None:
        self._statement(lambda c: self.rules.leave_queue(c, owner))

    def renew_lease(self, session_id: str, owner: str, ttl_seconds: float) -> bool:
        return self._statement(lambda c: self.rules.renew_lease(c, session_id, owner, ttl_seconds))

    def release_lease(self, session_id: str, owner: str, report: TurnReport | None = None) -> None:
        self._statement(lambda c: self.rules.release_lease(c, session_id, owner))

    def purge_leases(self, before: float) -> int:
        # Through ``one``: where the backend runs its queries (off an event loop thread, for Django).
        return self._statement(lambda _c: self.rules.purge_leases(self._in_transaction, before))
