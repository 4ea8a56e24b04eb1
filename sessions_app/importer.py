"""Copy sessions from a chatflow-agent SQLite file (0.3.4's or ``SQLiteSessionStore``'s) into the site's database.

The file is opened read-only. Each session is copied in one transaction: its row (active agent,
metadata, timestamps) and its messages in ``id`` order, byte for byte (role, content,
message_json, created_at; the database gives them new ids, in the same order). Processed-message
ids (webhook de-duplication) are copied too, keeping their ``processed_at``.

Idempotent: a session already in the database with the same agent, metadata and messages is
skipped as *present*; one with the same id and anything different is skipped as a *conflict*
and never changed. Rows the runtime could not read either (undecodable text, no session id,
neither message_json nor role/content readable, messages of no session) are skipped as
*unreadable* and reported; the rest of their session is copied.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.db import DatabaseError, IntegrityError, connection, transaction

from chatflow_agent.core.backend import StoredRow, parse_row
from chatflow_agent.jsonsafe import json_safe
from sessions_app.models import ChatMessage, ChatSession, ProcessedMessage

__all__ = ["ImportReport", "ImportSourceError", "SourceFile", "import_session", "import_processed"]

_SESSION_COLUMNS = {"session_id", "active_agent_name", "metadata_json"}
_MESSAGE_COLUMNS = {"id", "session_id", "role", "content", "message_json"}


class ImportSourceError(Exception):
    """The file cannot be imported: missing, not SQLite, damaged, or not a chatflow database."""


@dataclass
class SourceMessage:
    id: int
    role: str
    content: str | None
    message_json: str
    created_at: datetime | None


@dataclass
class SourceSession:
    session_id: str
    agent: str
    metadata: dict[str, Any]
    created_at: datetime | None
    updated_at: datetime | None
    messages: list[SourceMessage] = field(default_factory=list)


@dataclass
class ImportReport:
    """What an import did (or, dry, would do). Lists hold session ids or ``(where, why)`` pairs."""

    imported: list[str] = field(default_factory=list)
    imported_messages: int = 0
    present: list[str] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    processed_copied: int = 0
    processed_present: int = 0


def _text(value: Any) -> str | None:
    """A text column's value: bytes decoded as strict UTF-8 (UnicodeDecodeError otherwise)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _moment(value: Any) -> datetime | None:
    """A stored timestamp (``YYYY-MM-DD HH:MM:SS[.ffffff]``, UTC unless it says otherwise), or None."""
    try:
        text = _text(value)
        moment = datetime.fromisoformat(text) if text else None
    except (UnicodeDecodeError, ValueError):
        return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


class SourceFile:
    """A chatflow-agent SQLite file opened read-only; :class:`ImportSourceError` if it cannot be used."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ImportSourceError(f"{self.path}: no such file")
        try:
            self.conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True)
            self.conn.text_factory = bytes  # decode per value: one bad row must not hide the others
            check = [r[0] for r in self.conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as err:
            raise ImportSourceError(f"{self.path}: not a readable SQLite database ({err})") from err
        if check != [b"ok"]:
            problems = "; ".join(_text(c) or "" for c in check[:3])
            raise ImportSourceError(f"{self.path}: the SQLite file is damaged (quick_check: {problems})")
        self._check_schema()

    def _check_schema(self) -> None:
        for table, needed in (("chatflow_sessions", _SESSION_COLUMNS), ("chatflow_messages", _MESSAGE_COLUMNS)):
            columns = self._columns(table)
            if not columns:
                raise ImportSourceError(f"{self.path}: no {table} table; is it a chatflow-agent database?")
            if missing := needed - columns:
                raise ImportSourceError(f"{self.path}: {table} lacks column(s) {', '.join(sorted(missing))}")
        self.session_times = {"created_at", "updated_at"} <= self._columns("chatflow_sessions")
        self.message_times = "created_at" in self._columns("chatflow_messages")
        self.has_processed = bool(self._columns("chatflow_processed_messages"))

    def _columns(self, table: str) -> set[str | None]:
        return {_text(row[1]) for row in self.conn.execute(f"PRAGMA table_info({table})")}

    def close(self) -> None:
        self.conn.close()

    def count_sessions(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM chatflow_sessions").fetchone()[0]

    def orphan_messages(self) -> list[int]:
        """Ids of message rows whose session has no row (the runtime never shows them)."""
        return [r[0] for r in self.conn.execute(
            "SELECT id FROM chatflow_messages m WHERE NOT EXISTS "
            "(SELECT 1 FROM chatflow_sessions s WHERE s.session_id = m.session_id) ORDER BY id"
        )]

    def sessions(self, report: ImportReport) -> Iterator[SourceSession]:
        """Readable sessions in insertion order; unreadable rows go to ``report.unreadable``."""
        times = "created_at, updated_at" if self.session_times else "NULL, NULL"
        rows = self.conn.execute(
            f"SELECT rowid, session_id, active_agent_name, metadata_json, {times} FROM chatflow_sessions ORDER BY rowid"
        )
        for rowid, raw_id, raw_agent, raw_metadata, created, updated in rows:
            try:
                session_id, agent = _text(raw_id), _text(raw_agent)
            except UnicodeDecodeError:
                report.unreadable.append((f"session row {rowid}", "its id or agent is not valid UTF-8"))
                continue
            if not session_id or not agent:
                report.unreadable.append((f"session row {rowid}", "it has no session id or no active agent"))
                continue
            if _refused_nul(session_id + agent):
                report.unreadable.append((f"session row {rowid}", _NUL))
                continue
            session = SourceSession(session_id, agent, self._metadata(session_id, raw_metadata, report),
                                    _moment(created), _moment(updated))
            session.messages = list(self._messages(session_id, report))
            yield session

    def _metadata(self, session_id: str, raw: Any, report: ImportReport) -> dict[str, Any]:
        try:
            value = json.loads(_text(raw) or "{}")
        except (UnicodeDecodeError, ValueError):
            value = None
        if not isinstance(value, dict):
            report.unreadable.append((f"session {session_id!r}", "metadata_json is not a JSON object; copied as {}"))
            return {}
        if _refused_nul(json.dumps(value).replace("\\u0000", "\x00")):  # (JSON writes NUL as \u0000)
            report.unreadable.append((f"session {session_id!r}", "metadata_json holds NUL characters; copied without"))
            return json_safe(value)
        return value

    def _messages(self, session_id: str, report: ImportReport) -> Iterator[SourceMessage]:
        created = "created_at" if self.message_times else "NULL"
        rows = self.conn.execute(
            f"SELECT id, role, content, message_json, {created} FROM chatflow_messages "
            "WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        for row_id, raw_role, raw_content, raw_json, raw_created in rows:
            where = f"message {row_id} of session {session_id!r}"
            try:
                role, content, message_json = _text(raw_role), _text(raw_content), _text(raw_json)
            except UnicodeDecodeError:
                report.unreadable.append((where, "not valid UTF-8"))
                continue
            if role is None or message_json is None:
                report.unreadable.append((where, "no role or no message_json"))
                continue
            if _refused_nul(role + (content or "") + message_json):
                report.unreadable.append((where, _NUL))
                continue
            if parse_row(StoredRow(row_id, role, content, message_json)) is None:
                report.unreadable.append((where, "neither message_json nor role/content is a readable message"))
                continue
            yield SourceMessage(row_id, role, content, message_json, _moment(raw_created))

    def processed(self, report: ImportReport) -> list[tuple[str, datetime | None]]:
        """The processed-message ids (and when); unreadable ones go to ``report.unreadable``."""
        if not self.has_processed:
            return []
        found = []
        for rowid, raw_id, raw_at in self.conn.execute(
            "SELECT rowid, message_id, processed_at FROM chatflow_processed_messages ORDER BY rowid"
        ):
            try:
                message_id = _text(raw_id)
            except UnicodeDecodeError:
                report.unreadable.append((f"processed message id row {rowid}", "not valid UTF-8"))
                continue
            if message_id and _refused_nul(message_id):
                report.unreadable.append((f"processed message id row {rowid}", _NUL))
            elif message_id:
                found.append((message_id, _moment(raw_at)))
        return found


_NUL = "contains a NUL character, which PostgreSQL text cannot hold"


def _refused_nul(text: str) -> bool:
    """True when ``text`` holds a NUL character and the database is PostgreSQL (its text cannot hold one)."""
    return "\x00" in text and connection.vendor == "postgresql"


def _difference(source: SourceSession, target: ChatSession) -> str | None:
    """Why the stored session differs from the file's, or None when they are the same."""
    if target.active_agent_name != source.agent:
        return f"active agent {target.active_agent_name!r} in the database, {source.agent!r} in the file"
    if (target.metadata if isinstance(target.metadata, dict) else {}) != source.metadata:
        return "different metadata"
    stored = list(
        ChatMessage.objects.filter(session=target).order_by("id").values_list("role", "content", "message_json")
    )
    copied = [(m.role, m.content, m.message_json) for m in source.messages]
    if len(stored) != len(copied):
        return f"{len(stored)} messages in the database, {len(copied)} in the file"
    for n, (mine, theirs) in enumerate(zip(stored, copied, strict=True), start=1):
        if mine != theirs:
            return f"message {n} differs"
    return None


def import_session(source: SourceSession, report: ImportReport, *, dry_run: bool, now: datetime) -> None:
    """Copy one session (unless present or conflicting), recording the outcome in ``report``."""
    target = ChatSession.objects.filter(pk=source.session_id).first()
    if target is not None:
        why = _difference(source, target)
        if why is None:
            report.present.append(source.session_id)
        else:
            report.conflicts.append((source.session_id, why))
        return
    if not dry_run:
        created = source.created_at or now
        try:
            with transaction.atomic():
                ChatSession.objects.create(
                    session_id=source.session_id, active_agent_name=source.agent, metadata=source.metadata,
                    created_at=created, updated_at=source.updated_at or created,
                )
                ChatMessage.objects.bulk_create(
                    [ChatMessage(session_id=source.session_id, role=m.role, content=m.content,
                                 message_json=m.message_json, created_at=m.created_at or created)
                     for m in source.messages],
                    batch_size=500,
                )
        except IntegrityError:
            report.conflicts.append((source.session_id, "created in the database while importing"))
            return
        except DatabaseError as err:
            report.unreadable.append((f"session {source.session_id!r}", f"the database refused it ({err})"))
            return
    report.imported.append(source.session_id)
    report.imported_messages += len(source.messages)


def import_processed(ids: list[tuple[str, datetime | None]], report: ImportReport, *, dry_run: bool,
                     now: datetime) -> None:
    """Copy processed-message ids the database does not have (an id it has keeps its own time)."""
    have: set[str] = set()
    wanted = [message_id for message_id, _ in ids]
    for start in range(0, len(wanted), 500):
        have.update(ProcessedMessage.objects.filter(pk__in=wanted[start:start + 500]).values_list("pk", flat=True))
    new = [ProcessedMessage(message_id=i, processed_at=at or now) for i, at in ids if i not in have]
    report.processed_present += len(ids) - len(new)
    if not dry_run and new:
        ProcessedMessage.objects.bulk_create(new, ignore_conflicts=True, batch_size=500)
    report.processed_copied += len(new)
