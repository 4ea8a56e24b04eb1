"""Inspect a chatflow SQLite database: ``python -m chatflow_agent.inspector PATH [--json]``.

Prints each session (id, active agent, metadata keys, turn and message counts, updated_at) and
flags malformed histories: tool results without their call, tool calls without their result,
``message_json`` that does not parse, and messages before the first user message. Works on files
written by chatflow-agent 0.3.4 and by this package. The file is opened read-only and never
changed. Exit status: 0 when the file was read (problems or not), 2 when it is missing, unreadable
or not a chatflow database.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chatflow_agent.core._pruning import group_turns
from chatflow_agent.core.backend import StoredRow, parse_row
from chatflow_agent.types import Message, Role

__all__ = ["DatabaseReport", "InspectError", "Problem", "SessionReport", "inspect_database", "main"]


class InspectError(Exception):
    """The file is missing, unreadable or not a chatflow database."""


@dataclass
class Problem:
    row_id: int
    kind: str  # orphan_tool_result | tool_call_without_result | unparseable_message_json | before_first_user
    detail: str


@dataclass
class SessionReport:
    session_id: str
    active_agent: str
    metadata_keys: list[str]
    turns: int
    messages: int
    updated_at: str | None
    problems: list[Problem] = field(default_factory=list)


@dataclass
class DatabaseReport:
    path: str
    user_version: int
    sessions: list[SessionReport]

    @property
    def problem_count(self) -> int:
        return sum(len(s.problems) for s in self.sessions)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "user_version": self.user_version, "problem_count": self.problem_count,
                "sessions": [asdict(s) for s in self.sessions]}


@contextmanager
def _quiet_parse_warnings() -> Iterator[None]:
    """parse_row logs every unreadable row; the inspector reports them itself."""
    log = logging.getLogger("chatflow_agent.memory")

    def drop(_record: logging.LogRecord) -> bool:
        return False

    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _connect(path: str) -> sqlite3.Connection:
    file = Path(path)
    if not file.is_file():
        raise InspectError(f"{path}: no such file")
    try:
        conn = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as err:
        raise InspectError(f"{path}: cannot read it as a SQLite database ({err})") from err
    missing = {"chatflow_sessions", "chatflow_messages"} - names
    if missing:
        conn.close()
        raise InspectError(f"{path}: not a chatflow database (no {', '.join(sorted(missing))} table)")
    return conn


def _turn_problems(turn: list[tuple[Message, int]]) -> list[Problem]:
    """Tool results whose call is not open earlier in the turn; calls left without a result."""
    problems: list[Problem] = []
    open_calls: dict[str, tuple[int, str]] = {}
    for msg, rid in turn:
        if msg.role == Role.MODEL:
            for call in msg.tool_calls or []:
                open_calls[call.id] = (rid, call.name)
        elif msg.role == Role.TOOL:
            for result in msg.tool_results or []:
                if open_calls.pop(result.tool_call_id, None) is None:
                    problems.append(Problem(rid, "orphan_tool_result",
                                            f"result {result.tool_call_id!r} ({result.name}) has no call before it"))
    for call_id, (rid, name) in open_calls.items():
        problems.append(Problem(rid, "tool_call_without_result", f"call {call_id!r} ({name}) has no result"))
    return problems


def _inspect_session(conn: sqlite3.Connection, session_id: str, agent: str, metadata_json: str | None,
                     updated_at: Any) -> SessionReport:
    try:
        metadata = json.loads(metadata_json) if metadata_json else {}
    except ValueError:
        metadata = None
    rows = [StoredRow(*r) for r in conn.execute(
        "SELECT id, role, content, message_json FROM chatflow_messages WHERE session_id = ? ORDER BY id",
        (session_id,))]
    report = SessionReport(session_id, agent, sorted(metadata) if isinstance(metadata, dict) else [],
                           0, len(rows), None if updated_at is None else str(updated_at))
    if not isinstance(metadata, dict):
        report.problems.append(Problem(0, "unparseable_metadata_json", "metadata_json is not a JSON object"))
    parsed: list[tuple[Message, int]] = []
    for row in rows:
        try:
            Message.model_validate_json(row.message_json)
        except ValueError:
            msg = parse_row(row)
            report.problems.append(Problem(
                row.id, "unparseable_message_json",
                "message_json does not parse; " + ("using its role and content" if msg else "row ignored")))
        else:
            msg = parse_row(row)
        if msg is not None:
            parsed.append((msg, row.id))
    row_of = {id(m): rid for m, rid in parsed}
    _system, turns, leading = group_turns([m for m, _ in parsed])
    report.turns = len(turns)
    for msg in leading:
        report.problems.append(Problem(row_of[id(msg)], "before_first_user",
                                       f"{msg.role.value} message before the first user message"))
    for turn in turns:
        report.problems.extend(_turn_problems([(m, row_of[id(m)]) for m in turn]))
    report.problems.sort(key=lambda p: p.row_id)
    return report


def inspect_database(path: str) -> DatabaseReport:
    """Read ``path`` (read-only) and report its sessions; ``InspectError`` if it cannot be read."""
    conn = _connect(path)
    try:
        with _quiet_parse_warnings():
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            sessions = [
                _inspect_session(conn, *row)
                for row in conn.execute(
                    "SELECT session_id, active_agent_name, metadata_json, updated_at FROM chatflow_sessions "
                    "ORDER BY updated_at DESC, session_id"
                ).fetchall()
            ]
    except sqlite3.Error as err:
        raise InspectError(f"{path}: cannot read it ({err})") from err
    finally:
        conn.close()
    return DatabaseReport(path, version, sessions)


def _format(report: DatabaseReport) -> str:
    messages = sum(s.messages for s in report.sessions)
    lines = [f"{report.path}: schema version {report.user_version}, {len(report.sessions)} sessions, "
             f"{messages} messages, {report.problem_count} problems"]
    for s in report.sessions:
        lines.append("")
        lines.append(f"session {s.session_id!r}")
        lines.append(f"  active agent:  {s.active_agent}")
        lines.append(f"  metadata keys: {', '.join(s.metadata_keys) or '(none)'}")
        lines.append(f"  turns: {s.turns}, messages: {s.messages}")
        lines.append(f"  updated_at:    {s.updated_at}")
        if s.problems:
            lines.append(f"  MALFORMED ({len(s.problems)}):")
            lines.extend(f"    row {p.row_id}: {p.kind}: {p.detail}" for p in s.problems)
        else:
            lines.append("  ok")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chatflow_agent.inspector", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a chatflow SQLite database file")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    args = parser.parse_args(argv)
    try:
        report = inspect_database(args.path)
    except InspectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2))
    else:
        print(_format(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
