"""SQLiteSessionStore: sessions in a SQLite file on chatflow-agent's three-table schema.

The file stays exchangeable with chatflow-agent 0.3.4 (same tables and columns); what is new
lives in ``chatflow_session_leases``. Schema version: ``PRAGMA user_version`` = 2 (0.3.4 writes
1; an older file is upgraded in place, a newer one is refused with ``StoreSchemaError``).
File databases do their blocking work on a private pool of ``_BLOCKING_IO_WORKERS`` threads,
with one long-lived connection per thread (WAL, ``synchronous=NORMAL``, foreign keys on, a busy
timeout). ``:memory:`` and in-memory URIs (``file::memory:?cache=shared``,
``file:NAME?mode=memory&cache=shared``) use one connection and run inline (0.4.0rc1).
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from chatflow_agent.core._persistent import DEFAULT_LEASE_TTL_SECONDS, PersistentSessionStore
from chatflow_agent.core._session import DEFAULT_DEDUP_TTL_HOURS, SessionContext
from chatflow_agent.core.backend import Changes, CommitResult, StoredRow, StoredSession
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError, StoreSchemaError
from chatflow_agent.jsonsafe import json_object

__all__ = ["SQLiteSessionStore", "SQLiteSessionContext", "SCHEMA_VERSION", "is_memory_database", "utc_stamp"]

SCHEMA_VERSION = 2
_T = TypeVar("_T")
_BLOCKING_IO_WORKERS = PersistentSessionStore._BLOCKING_IO_WORKERS
BUSY_TIMEOUT_MS = 30_000
_WAITER_TTL = 5.0  # seconds a queued waiter stays in line without polling

# A 0.3.4 session object type; ours are plain SessionContext objects bound to a store.
SQLiteSessionContext = SessionContext

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chatflow_sessions (
    session_id TEXT PRIMARY KEY,
    active_agent_name TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}',
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE IF NOT EXISTS chatflow_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT,
    message_json TEXT NOT NULL,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY(session_id) REFERENCES chatflow_sessions(session_id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS chatflow_processed_messages (
    message_id TEXT PRIMARY KEY,
    processed_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);
CREATE INDEX IF NOT EXISTS idx_chatflow_messages_session ON chatflow_messages(session_id, id);
CREATE INDEX IF NOT EXISTS idx_chatflow_processed_at ON chatflow_processed_messages(processed_at);
CREATE TABLE IF NOT EXISTS chatflow_session_leases (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL,
    acquired_at REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chatflow_session_waiters (
    ticket INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    owner TEXT NOT NULL UNIQUE,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_chatflow_session_waiters ON chatflow_session_waiters(session_id, ticket);
CREATE INDEX IF NOT EXISTS idx_chatflow_sessions_updated ON chatflow_sessions(updated_at, session_id);
"""

_HEAD = """
SELECT s.active_agent_name, s.metadata_json, COALESCE(s.created_at, ''), s.updated_at,
       (SELECT COALESCE(MAX(id), 0) FROM chatflow_messages m WHERE m.session_id = s.session_id),
       (SELECT COUNT(*) FROM chatflow_messages m WHERE m.session_id = s.session_id)
FROM chatflow_sessions s WHERE s.session_id = ?
"""


_second_text: tuple[int, str] = (0, "1970-01-01 00:00:00")


def utc_stamp(at: float | None = None) -> str:
    """UTC time as ``YYYY-MM-DD HH:MM:SS.ffffff`` — sorts with 0.3.4's ``CURRENT_TIMESTAMP`` text.

    The text of the whole second is kept from the previous call (a turn commit makes one stamp;
    building it through ``datetime`` and ``strftime`` every time cost ~2 µs).
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


def is_memory_database(db_path: str) -> bool:
    """True for ``:memory:`` and SQLite in-memory URIs (``file::memory:…``, ``…?mode=memory``)."""
    if db_path in (":memory:", ""):
        return True
    if db_path.startswith("file:"):
        parts = urlsplit(db_path)
        return parts.path.startswith(":memory:") or parse_qs(parts.query).get("mode") == ["memory"]
    return False


class SQLiteSessionStore(PersistentSessionStore):
    """Persistent store on a SQLite file (or an in-memory database); see the module docstring.

    ``SQLiteSessionStore(db_path="chatflow.db", default_max_turns=40, dedup_ttl_hours=192,
    lease_ttl_seconds=30)``; any other keyword → ``TypeError``; non-positive numbers → ``ValueError``.
    ``lease_ttl_seconds``: how long a turn's lease lives without renewal, so how long a session stays
    blocked after the process running a turn on it died.
    """

    def __init__(
        self,
        db_path: str | Path = "chatflow.db",
        default_max_turns: int = 40,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS,
    ) -> None:
        super().__init__(default_max_turns=default_max_turns, dedup_ttl_hours=dedup_ttl_hours,
                         lease_ttl_seconds=lease_ttl_seconds)
        self.db_path = str(db_path)
        self._inline = is_memory_database(self.db_path)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_mutex = threading.Lock()
        self._shared: sqlite3.Connection | None = None
        self._shared_mutex = threading.RLock()
        self._last_purge = 0.0
        self._in_line: set[str] = set()  # lease owners of this store waiting in a session's line
        if not self._inline:
            parent = Path(self.db_path.removeprefix("file:").split("?")[0]).parent
            if str(parent) not in ("", "."):
                parent.mkdir(parents=True, exist_ok=True)
        self._init_schema()

    # ---- connections ----------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.db_path, uri=self.db_path.startswith("file:"), isolation_level=None,
            check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000,
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        if not self._inline:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        with self._conn_mutex:
            self._connections.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._inline:
            if self._shared is None:
                self._shared = self._open()
            return self._shared
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._open()
        return conn

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._shared_mutex if self._inline else nullcontext():
            return self._conn().execute(sql, params).fetchall()

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction."""
        with self._shared_mutex if self._inline else nullcontext():
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

    def _write1(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        """One write statement in autocommit mode (atomic on its own)."""
        with self._shared_mutex if self._inline else nullcontext():
            return self._conn().execute(sql, params)

    def close(self) -> None:
        """Close every connection and the thread pool."""
        super().close()
        with self._conn_mutex:
            conns, self._connections = self._connections, []
        for conn in conns:
            conn.close()
        self._shared = None
        self._local = threading.local()

    def _init_schema(self) -> None:
        def init(conn: sqlite3.Connection) -> None:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreSchemaError(
                    f"{self.db_path} has schema version {version}; this chatflow_agent understands up to "
                    f"{SCHEMA_VERSION}. Upgrade chatflow_agent to open it."
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            _lease_acquired_column(conn)
            _leases_without_rowid(conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._write(init)

    # ---- primitives -----------------------------------------------------------------------
    def _db_head(self, session_id: str) -> StoredSession | None:
        rows = self._read(_HEAD, (session_id,))
        if not rows:
            return None
        agent, meta, created, updated, max_id, count = rows[0]
        return StoredSession(session_id, agent, json_object(meta), created, (updated, max_id, count))

    def _db_load(self, session_id: str) -> StoredSession | None:
        with self._shared_mutex if self._inline else nullcontext():
            conn = self._conn()
            conn.execute("BEGIN")
            try:
                head = self._db_head(session_id)
                if head is not None:
                    head.rows = [
                        StoredRow(*r)
                        for r in conn.execute(
                            "SELECT id, role, content, message_json FROM chatflow_messages "
                            "WHERE session_id = ? ORDER BY id",
                            (session_id,),
                        )
                    ]
            finally:
                conn.execute("COMMIT")
        return head

    def _db_create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        now = utc_stamp()
        self._write(lambda c: c.execute(
            "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(session_id) DO NOTHING",
            (session_id, agent_name, metadata_json, now, now),
        ))

    def _db_commit(self, changes: Changes) -> CommitResult:
        def commit(conn: sqlite3.Connection) -> CommitResult:
            now = utc_stamp()
            sid = changes.session_id
            if changes.token is None:
                conn.execute(
                    "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, "
                    "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET "
                    "active_agent_name = excluded.active_agent_name, metadata_json = excluded.metadata_json, "
                    "updated_at = excluded.updated_at",
                    (sid, changes.agent_name, changes.metadata_json, now, now),
                )
            elif conn.execute(
                "UPDATE chatflow_sessions SET active_agent_name = ?, metadata_json = ?, updated_at = ? "
                "WHERE session_id = ? AND COALESCE(created_at, '') = ?",
                (changes.agent_name, changes.metadata_json, now, sid, changes.token),
            ).rowcount == 0:
                raise SessionDeletedError(sid)  # deleted (maybe re-created) since it was loaded
            deleted = 0
            if changes.delete_ids:
                deleted = conn.executemany(
                    "DELETE FROM chatflow_messages WHERE id = ? AND session_id = ?",
                    [(i, sid) for i in changes.delete_ids],
                ).rowcount
            new_ids: list[int] = [
                conn.execute(  # type: ignore[misc]  # lastrowid of an INSERT is an int
                    "INSERT INTO chatflow_messages (session_id, role, content, message_json, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (sid, msg.role.value, msg.content, msg.model_dump_json(), now),
                ).lastrowid
                for msg in changes.inserts
            ]
            if changes.release_owner and conn.execute(
                "DELETE FROM chatflow_session_leases WHERE session_id = ? AND owner = ?",
                (sid, changes.release_owner),
            ).rowcount == 0:
                # The lease expired (its renewals stalled) and may have gone to another turn:
                # committing now could interleave with it, so this turn fails and writes nothing.
                raise SessionBusyError(sid)
            prev = changes.version
            if changes.release_owner and changes.token is not None and new_ids and isinstance(prev, tuple):
                # A turn's commit: the version read when its lease was taken is current (nobody else
                # ran a turn since), so the new one follows without reading the head again. A
                # non-turn write elsewhere meanwhile only makes it differ, which forces a reload.
                return CommitResult(new_ids, changes.token, (now, new_ids[-1], prev[2] - deleted + len(new_ids)))
            head = self._db_head(sid)
            assert head is not None
            return CommitResult(new_ids, head.token, head.version)

        return self._write(commit)

    def _db_delete(self, session_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM chatflow_messages WHERE session_id = ?", (session_id,))
            return conn.execute("DELETE FROM chatflow_sessions WHERE session_id = ?", (session_id,)).rowcount > 0

        return self._write(delete)

    def _db_list(self) -> list[str]:
        return [r[0] for r in self._read("SELECT session_id FROM chatflow_sessions ORDER BY updated_at DESC")]

    def _db_clear(self) -> None:
        self._write(lambda c: (c.execute("DELETE FROM chatflow_messages"), c.execute("DELETE FROM chatflow_sessions")))

    def _db_claim(self, message_id: str, ttl_seconds: float) -> bool:
        now = time.time()
        if now - self._last_purge > 300:
            self._last_purge = now
            self._db_purge_processed(ttl_seconds)
        cur = self._write1((
            "INSERT INTO chatflow_processed_messages (message_id, processed_at) VALUES (?, ?) "
            "ON CONFLICT(message_id) DO UPDATE SET processed_at = excluded.processed_at "
            "WHERE chatflow_processed_messages.processed_at < ?"),
            (message_id, utc_stamp(now), utc_stamp(now - ttl_seconds)),
        )
        return cur.rowcount == 1

    def _db_is_processed(self, message_id: str, ttl_seconds: float) -> bool:
        return bool(self._read(
            "SELECT 1 FROM chatflow_processed_messages WHERE message_id = ? AND processed_at >= ?",
            (message_id, utc_stamp(time.time() - ttl_seconds)),
        ))

    def _db_purge_processed(self, ttl_seconds: float) -> int:
        cutoff = utc_stamp(time.time() - ttl_seconds)
        return self._write(
            lambda c: c.execute("DELETE FROM chatflow_processed_messages WHERE processed_at < ?", (cutoff,))
        ).rowcount

    def _db_acquire_lease(self, session_id: str, owner: str, ttl: float, queue: bool = True) -> bool:
        """Take the session's lease if it is free and no other process queued for it earlier.

        Fast path (nobody waiting): one upsert. Otherwise the caller joins the session's waiting
        line (``chatflow_session_waiters``, ordered by ticket, kept alive by each poll) and gets
        the lease only when it is first in line — FIFO across processes (invariant 2).
        """
        now = time.time()
        if owner not in self._in_line:
            if self._db_try_lease(self._conn(), session_id, owner, ttl, now, None):
                return True
            if not queue:
                return False
            self._in_line.add(owner)

        def wait_in_line(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT ticket FROM chatflow_session_waiters WHERE owner = ?", (owner,)).fetchone()
            if row is None:
                ticket = conn.execute(
                    "INSERT INTO chatflow_session_waiters (session_id, owner, expires_at) VALUES (?, ?, ?)",
                    (session_id, owner, now + _WAITER_TTL),
                ).lastrowid
            else:
                ticket = row[0]
                conn.execute("UPDATE chatflow_session_waiters SET expires_at = ? WHERE owner = ?",
                             (now + _WAITER_TTL, owner))
            if self._db_try_lease(conn, session_id, owner, ttl, now, ticket):
                conn.execute("DELETE FROM chatflow_session_waiters WHERE owner = ?", (owner,))
                return True
            return False

        if self._write(wait_in_line):
            self._in_line.discard(owner)
            return True
        return False

    @staticmethod
    def _db_try_lease(conn: sqlite3.Connection, session_id: str, owner: str, ttl: float, now: float,
                      ticket: int | None) -> bool:
        cur = conn.execute(
            "INSERT INTO chatflow_session_leases (session_id, owner, expires_at, acquired_at) SELECT ?, ?, ?, ? "
            "WHERE NOT EXISTS (SELECT 1 FROM chatflow_session_waiters w WHERE w.session_id = ? "
            "AND w.expires_at >= ? AND w.owner != ? AND (? IS NULL OR w.ticket < ?)) "
            "ON CONFLICT(session_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, "
            "acquired_at = excluded.acquired_at WHERE chatflow_session_leases.expires_at < ?",
            (session_id, owner, now + ttl, now, session_id, now, owner, ticket, ticket, now),
        )
        return cur.rowcount == 1

    def _db_leave_queue(self, session_id: str, owner: str) -> None:
        self._in_line.discard(owner)
        self._write1("DELETE FROM chatflow_session_waiters WHERE owner = ?", (owner,))

    def _db_renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        return self._write1(
            "UPDATE chatflow_session_leases SET expires_at = ? WHERE session_id = ? AND owner = ?",
            (time.time() + ttl, session_id, owner),
        ).rowcount == 1

    def _db_release_lease(self, session_id: str, owner: str) -> None:
        self._write1("DELETE FROM chatflow_session_leases WHERE session_id = ? AND owner = ?", (session_id, owner))

    def _db_purge_leases(self, before: float) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            leases = conn.execute("DELETE FROM chatflow_session_leases WHERE expires_at < ?", (before,)).rowcount
            return leases + conn.execute("DELETE FROM chatflow_session_waiters WHERE expires_at < ?",
                                         (before,)).rowcount

        return self._write(purge)


def _lease_acquired_column(conn: sqlite3.Connection) -> None:
    """Add ``acquired_at`` (unix seconds the lease was taken; NULL when written by older code) to a lease
    table made without it. Older code reads and writes the table as before."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(chatflow_session_leases)")}
    if "acquired_at" not in columns:
        conn.execute("ALTER TABLE chatflow_session_leases ADD COLUMN acquired_at REAL")


def _leases_without_rowid(conn: sqlite3.Connection) -> None:
    """Rebuild a lease table made with a rowid (by this store before, or by the Django migration).

    Without a rowid a lease is one b-tree entry instead of a row plus its primary-key index: each
    turn's lease write and release touches half the pages (about a tenth of a turn's database
    time). Same columns, so older code reads and writes it as before; runs inside the schema
    transaction, leases in it are kept.
    """
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'chatflow_session_leases'").fetchone()
    if row is None or "WITHOUT ROWID" in row[0].upper():
        return
    conn.execute("CREATE TABLE chatflow_session_leases_new (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                 "expires_at REAL NOT NULL, acquired_at REAL) WITHOUT ROWID")
    conn.execute("INSERT INTO chatflow_session_leases_new "
                 "SELECT session_id, owner, expires_at, acquired_at FROM chatflow_session_leases")
    conn.execute("DROP TABLE chatflow_session_leases")
    conn.execute("ALTER TABLE chatflow_session_leases_new RENAME TO chatflow_session_leases")

