"""SQLiteSessionStore: sessions in a SQLite file on chatflow-agent's three-table schema.

The file stays exchangeable with chatflow-agent 0.3.4 (same tables and columns); what is new
lives in ``chatflow_session_leases``. Schema version: ``PRAGMA user_version`` = 2 (0.3.4 writes
1; an older file is upgraded in place, a newer one is refused with ``StoreSchemaError``).
``SQLiteBackend`` is the ``SessionBackend`` on such a file; ``SQLiteSessionStore`` is that backend
plus a ``PersistentSessionStore``. File databases do their blocking work on the store's pool of
``_BLOCKING_IO_WORKERS`` threads, with one long-lived connection per thread (WAL,
``synchronous=NORMAL``, foreign keys on, a busy timeout). ``:memory:`` and in-memory URIs
(``file::memory:?cache=shared``, ``file:NAME?mode=memory&cache=shared``) use one connection and run
inline (0.4.0rc1). Leases, waiters, claims and the session reads are ``chatflow_agent.core.sql``'s.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from chatflow_agent.core._persistent import BLOCKING_IO_WORKERS, DEFAULT_LEASE_TTL_SECONDS, PersistentSessionStore
from chatflow_agent.core._session import DEFAULT_DEDUP_TTL_HOURS, SessionContext, _positive_int, _positive_number
from chatflow_agent.core.backend import Changes, CommitResult, StoredSession
from chatflow_agent.core.sql import (
    SQLITE,
    Cursor,
    SQLLeasesAndClaims,
    clear_sessions,
    create_session,
    delete_session,
    list_session_ids,
    read_head,
    read_rows,
    sqlite_transaction,
    utc_stamp,
    write_commit,
)
from chatflow_agent.exceptions import StoreSchemaError
from chatflow_agent.jsonsafe import json_object

__all__ = ["SQLiteBackend", "SQLiteSessionStore", "SQLiteSessionContext", "SCHEMA_VERSION", "is_memory_database",
           "utc_stamp"]

SCHEMA_VERSION = 2
_T = TypeVar("_T")
_BLOCKING_IO_WORKERS = BLOCKING_IO_WORKERS
BUSY_TIMEOUT_MS = 30_000

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

def is_memory_database(db_path: str) -> bool:
    """True for ``:memory:`` and SQLite in-memory URIs (``file::memory:…``, ``…?mode=memory``)."""
    if db_path in (":memory:", ""):
        return True
    if db_path.startswith("file:"):
        parts = urlsplit(db_path)
        return parts.path.startswith(":memory:") or parse_qs(parts.query).get("mode") == ["memory"]
    return False


class SQLiteBackend(SQLLeasesAndClaims):
    """The ``SessionBackend`` on a SQLite file or in-memory database (see the module docstring).

    ``SQLiteBackend(db_path)``: creates the file (and its folder) and the schema, upgrading an older
    file in place; ``StoreSchemaError`` for a file of a newer schema. One connection per calling
    thread for files; one shared connection, used under a lock, for in-memory databases
    (``inline``). Its lease and claim methods are ``SQLLeasesAndClaims``'.
    """

    def __init__(self, db_path: str | Path = "chatflow.db") -> None:
        self.db_path = str(db_path)
        self._inline = is_memory_database(self.db_path)
        super().__init__(SQLITE, self._one, self._transaction)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_mutex = threading.Lock()
        self._shared: sqlite3.Connection | None = None
        self._shared_mutex = threading.RLock()
        if not self._inline:
            parent = Path(self.db_path.removeprefix("file:").split("?")[0]).parent
            if str(parent) not in ("", "."):
                parent.mkdir(parents=True, exist_ok=True)
        self._init_schema()

    @property
    def inline(self) -> bool:
        return self._inline

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

    def _one(self, fn: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Run ``fn(cursor)`` in autocommit mode (each statement atomic on its own)."""
        with self._shared_mutex if self._inline else nullcontext():
            return fn(self._conn().cursor())

    def _write(self, fn: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Run ``fn(cursor)`` in one ``BEGIN IMMEDIATE`` transaction (``sql.sqlite_transaction``)."""
        with self._shared_mutex if self._inline else nullcontext():
            return sqlite_transaction(self._conn().cursor(), fn)

    def _transaction(self, fn: Callable[[Cursor], _T]) -> _T:
        return self._write(fn)

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read-only statement (for tools and tests that inspect the file)."""
        with self._shared_mutex if self._inline else nullcontext():
            return self._conn().execute(sql, params).fetchall()

    def close(self) -> None:
        """Close every connection (a later call opens new ones)."""
        with self._conn_mutex:
            conns, self._connections = self._connections, []
        for conn in conns:
            conn.close()
        self._shared = None
        self._local = threading.local()

    def _init_schema(self) -> None:
        def init(cur: sqlite3.Cursor) -> None:
            version = cur.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreSchemaError(
                    f"{self.db_path} has schema version {version}; this chatflow_agent understands up to "
                    f"{SCHEMA_VERSION}. Upgrade chatflow_agent to open it."
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    cur.execute(statement)
            _lease_acquired_column(cur)
            _leases_without_rowid(cur)
            cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._write(init)

    # ---- sessions -------------------------------------------------------------------------
    def head(self, session_id: str) -> StoredSession | None:
        return self._one(lambda c: read_head(c, SQLITE, session_id))

    def load(self, session_id: str) -> StoredSession | None:
        def load(cur: sqlite3.Cursor) -> StoredSession | None:
            cur.execute("BEGIN")  # one snapshot for the head and the rows
            try:
                head = read_head(cur, SQLITE, session_id)
                if head is not None:
                    head.rows = read_rows(cur, SQLITE, session_id)
            finally:
                cur.execute("COMMIT")
            return head

        return self._one(load)

    def create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        self._write(lambda c: create_session(c, SQLITE, session_id, agent_name, metadata_json))

    def commit(self, changes: Changes) -> CommitResult:
        def write(cur: sqlite3.Cursor) -> CommitResult:
            if changes.hooks is not None:  # the turn's commit hooks, in this transaction
                changes.hooks.committing(changes.session_id, json_object(changes.metadata_json), changes.report)
            return write_commit(cur, self.rules, changes)

        return self._write(write)

    def delete(self, session_id: str) -> bool:
        return self._write(lambda c: delete_session(c, SQLITE, session_id))

    def list_sessions(self) -> list[str]:
        return self._one(lambda c: list_session_ids(c, SQLITE))

    def clear(self) -> None:
        self._write(lambda c: clear_sessions(c, SQLITE))


class SQLiteSessionStore(PersistentSessionStore):
    """Persistent store on a SQLite file (or an in-memory database): a ``SQLiteBackend`` under a
    ``PersistentSessionStore``; see the module docstring.

    ``SQLiteSessionStore(db_path="chatflow.db", default_max_turns=40, dedup_ttl_hours=192,
    lease_ttl_seconds=30)``; any other keyword → ``TypeError``; non-positive numbers → ``ValueError``.
    ``lease_ttl_seconds``: how long a turn's lease lives without renewal, so how long a session stays
    blocked after the process running a turn on it died.
    """

    backend: SQLiteBackend

    def __init__(
        self,
        db_path: str | Path = "chatflow.db",
        default_max_turns: int = 40,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS,
    ) -> None:
        _positive_int("default_max_turns", default_max_turns)  # refused before a file is created
        _positive_number("dedup_ttl_hours", dedup_ttl_hours)
        _positive_number("lease_ttl_seconds", lease_ttl_seconds)
        super().__init__(SQLiteBackend(db_path), default_max_turns=default_max_turns,
                         dedup_ttl_hours=dedup_ttl_hours, lease_ttl_seconds=lease_ttl_seconds)

    @property
    def db_path(self) -> str:
        return self.backend.db_path


def _lease_acquired_column(conn: sqlite3.Cursor) -> None:
    """Add ``acquired_at`` (unix seconds the lease was taken; NULL when written by older code) to a lease
    table made without it. Older code reads and writes the table as before."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(chatflow_session_leases)")}
    if "acquired_at" not in columns:
        conn.execute("ALTER TABLE chatflow_session_leases ADD COLUMN acquired_at REAL")


def _leases_without_rowid(conn: sqlite3.Cursor) -> None:
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

