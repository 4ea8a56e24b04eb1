"""The index's upkeep: :func:`check` (is it in step with the chatflow tables?), :func:`rebuild` and
:func:`optimize`. What the index holds and the triggers that keep it are in search_app.schema."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections, transaction

from search_app.schema import sqlite_body, sqlite_doc, sqlite_statements, sqlite_tools

__all__ = ["BATCH", "OutOfStep", "check", "optimize", "rebuild"]

#: Rows per statement when the index is rebuilt (the progress bar moves per batch).
BATCH = 20_000


# --- Rebuild and check -------------------------------------------------------------------------------------------
@dataclass
class OutOfStep:
    """What :func:`check` found: messages and sessions missing from the index, index rows of rows that are gone,
    and index rows whose text differs from what their row says now."""

    missing_messages: int = 0
    extra_messages: int = 0
    stale_messages: int = 0
    missing_sessions: int = 0
    extra_sessions: int = 0
    stale_sessions: int = 0
    damaged: str = ""

    @property
    def in_step(self) -> bool:
        return not (self.missing_messages or self.extra_messages or self.stale_messages or self.missing_sessions
                    or self.extra_sessions or self.stale_sessions or self.damaged)

    def describe(self) -> str:
        if self.in_step:
            return "The search index is in step with the messages and sessions."
        parts = [f"{n} {what}" for n, what in (
            (self.missing_messages, "messages missing from the index"),
            (self.extra_messages, "index rows of messages that no longer exist"),
            (self.stale_messages, "messages whose index text is stale"),
            (self.missing_sessions, "sessions missing from the index"),
            (self.extra_sessions, "index rows of sessions that no longer exist"),
            (self.stale_sessions, "sessions whose index text is stale"),
        ) if n]
        if self.damaged:
            parts.append(f"a damaged full-text table ({self.damaged})")
        return "The search index is out of step: " + "; ".join(parts) + "."


def _count(cursor, sql: str) -> int:
    cursor.execute(sql)
    return int(cursor.fetchone()[0])


def check(using: str = "default") -> OutOfStep:
    """Compare the index with the chatflow tables, row by row (reads every message: a command's work)."""
    connection = connections[using]
    found = OutOfStep()
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            found.missing_messages = _count(cursor, "SELECT count(*) FROM chatflow_messages m WHERE NOT EXISTS "
                                                    "(SELECT 1 FROM search_messages s WHERE s.rowid = m.id)")
            found.extra_messages = _count(cursor, "SELECT count(*) FROM search_messages s WHERE NOT EXISTS "
                                                  "(SELECT 1 FROM chatflow_messages m WHERE m.id = s.rowid)")
            found.stale_messages = _count(
                cursor, f"SELECT count(*) FROM chatflow_messages m JOIN search_messages s ON s.rowid = m.id "
                        f"WHERE s.body IS NOT {sqlite_body('m')} OR s.tools IS NOT {sqlite_tools('m')}")
            doc = sqlite_doc("c")
            for table in ("search_sessions", "search_sessions_trigram"):
                try:
                    cursor.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
                except Exception as err:  # noqa: BLE001 - the database's own word for what is wrong
                    found.damaged = f"{table}: {err}"
        else:
            found.missing_messages = _count(cursor, "SELECT count(*) FROM chatflow_messages m WHERE NOT EXISTS "
                                                    "(SELECT 1 FROM search_messages s WHERE s.message_id = m.id)")
            found.extra_messages = _count(cursor, "SELECT count(*) FROM search_messages s WHERE NOT EXISTS "
                                                  "(SELECT 1 FROM chatflow_messages m WHERE m.id = s.message_id)")
            found.stale_messages = _count(
                cursor, "SELECT count(*) FROM chatflow_messages m JOIN search_messages s ON s.message_id = m.id "
                        "WHERE s.session_id <> m.session_id OR s.tools <> chatflow_search_tools(m.message_json)"
                        " OR s.body <> chatflow_search_body(m.content, m.message_json)")
            doc = "chatflow_search_doc(c.session_id, c.metadata_json::jsonb)"
        found.missing_sessions = _count(
            cursor, "SELECT count(*) FROM chatflow_sessions c WHERE NOT EXISTS "
                    "(SELECT 1 FROM search_session_docs d WHERE d.session_id = c.session_id)")
        found.extra_sessions = _count(cursor, "SELECT count(*) FROM search_session_docs d WHERE NOT EXISTS "
                                              "(SELECT 1 FROM chatflow_sessions c WHERE c.session_id = d.session_id)")
        found.stale_sessions = _count(cursor, "SELECT count(*) FROM chatflow_sessions c JOIN search_session_docs d "
                                              f"ON d.session_id = c.session_id WHERE d.doc <> {doc}")
    return found


def rebuild(using: str = "default", progress: Callable[[int, int], None] | None = None) -> int:
    """Write the whole index again from the chatflow tables in one transaction; the number of messages indexed.

    ``progress(done, total)`` is called after each batch of :data:`BATCH` messages."""
    connection = connections[using]
    sqlite = connection.vendor == "sqlite"
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute("SELECT count(*), coalesce(min(id), 0), coalesce(max(id), 0) FROM chatflow_messages")
        total, low, high = cursor.fetchone()
        if sqlite:  # an FTS5 table deletes row by row: dropped and created again (with its triggers) is faster
            for table in ("search_messages", "search_sessions", "search_sessions_trigram", "search_session_docs"):
                cursor.execute(f"DROP TABLE IF EXISTS {table}")
            for statement in sqlite_statements():
                cursor.execute(statement)
            cursor.execute(f"INSERT INTO search_session_docs(session_id, doc) SELECT c.session_id, {sqlite_doc('c')} "
                           "FROM chatflow_sessions c")
            insert = (f"INSERT INTO search_messages(rowid, body, tools) SELECT m.id, {sqlite_body('m')}, "
                      f"{sqlite_tools('m')} FROM chatflow_messages m WHERE m.id >= %s AND m.id < %s")
        else:
            cursor.execute("TRUNCATE search_messages, search_session_docs")
            cursor.execute("INSERT INTO search_session_docs (session_id, doc, tsv) SELECT session_id, d, "
                           "to_tsvector('simple', d) FROM (SELECT c.session_id, "
                           "chatflow_search_doc(c.session_id, c.metadata_json::jsonb) AS d FROM chatflow_sessions c) x")
            insert = ("INSERT INTO search_messages (message_id, session_id, body, tools, tsv) SELECT id, session_id, "
                      "b, chatflow_search_tools(message_json), to_tsvector('simple', chatflow_search_fold(b)) FROM "
                      "(SELECT m.id, m.session_id, m.message_json, chatflow_search_body(m.content, m.message_json) AS b"
                      " FROM chatflow_messages m WHERE m.id >= %s AND m.id < %s) x")
        done = 0
        start = low
        while start <= high and total:
            cursor.execute(insert, [start, start + BATCH])
            done += max(cursor.rowcount, 0)
            start += BATCH
            if progress is not None:
                progress(min(done, total), total)
    optimize(using)
    return done


def optimize(using: str = "default") -> None:
    """Merge the SQLite index's segments into one (FTS5 ``optimize``) (PostgreSQL: nothing to do).

    Every transaction that writes messages adds a small segment that FTS5 merges only now and then, and each
    lookup visits every segment: after a bulk load, a lookup by message id was ~7× slower with 17 segments than
    with one (``docs/performance.md`` › Search). Run it from cron as ``chatflow_search_index --optimize``."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        for table in ("search_messages", "search_sessions", "search_sessions_trigram"):
            cursor.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
