"""python -m chatflow_agent.inspector: sessions of a chatflow SQLite file and its malformed histories."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from chatflow_agent import Message, Role, SQLiteSessionStore, ToolCall, ToolResult
from chatflow_agent.inspector import inspect_database, main
from tests.processes import REPO

FIXTURE = REPO / "tests" / "fixtures" / "chatflow_034.db"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fixture_db(tmp_path: Path) -> Path:
    path = tmp_path / "chatflow_034.db"
    shutil.copyfile(FIXTURE, path)
    return path


@pytest.fixture
def malformed_db(tmp_path: Path) -> Path:
    """A file on our schema with one well-formed session and one with every kind of damage."""
    path = tmp_path / "malformed.db"
    SQLiteSessionStore(str(path)).close()
    rows = [
        ("good", Message(role=Role.USER, content="hi")),
        ("good", Message(role=Role.MODEL, content="hello")),
        ("bad", Message(role=Role.MODEL, content="Welcome!")),  # a greeting before the first user message
        ("bad", Message(role=Role.USER, content="q1")),
        ("bad", Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id="ghost", name="lookup", content=1)])),
        ("bad", Message(role=Role.MODEL, content="a1")),
        ("bad", Message(role=Role.USER, content="q2")),
        ("bad", Message(role=Role.MODEL, tool_calls=[ToolCall(id="c1", name="lookup", args={}),
                                                     ToolCall(id="c2", name="weather", args={})])),
        ("bad", Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id="c1", name="lookup", content=2)])),
        ("bad", Message(role=Role.MODEL, content="a2")),
    ]
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, "
                     "updated_at) VALUES ('good', 'Support', '{\"channel\": \"web\"}', '2025-01-01', '2025-01-02')")
        conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, "
                     "updated_at) VALUES ('bad', 'Billing', '{}', '2025-01-01', '2025-01-03')")
        for sid, msg in rows:
            conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) VALUES (?, ?, ?, ?)",
                         (sid, msg.role.value, msg.content, msg.model_dump_json()))
        # message_json that does not parse: one with usable role/content columns, one without
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) "
                     "VALUES ('bad', 'user', 'q3', '{not json')")
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) "
                     "VALUES ('bad', 'robot', NULL, '[]')")
    conn.close()
    return path


def test_it_reports_every_034_session_and_no_problems(fixture_db, capsys) -> None:
    before = sha256(fixture_db)
    assert main([str(fixture_db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    summary = json.loads((REPO / "tests" / "fixtures" / "chatflow_034.md").read_text(encoding="utf-8")
                         .rsplit("```json\n", 1)[1].split("\n```", 1)[0])
    assert report["user_version"] == 1
    assert report["problem_count"] == 0
    by_id = {s["session_id"]: s for s in report["sessions"]}
    assert set(by_id) == {s["session_id"] for s in summary["sessions"]}
    for expected in summary["sessions"]:
        got = by_id[expected["session_id"]]
        assert got["active_agent"] == expected["active_agent_name"]
        assert got["metadata_keys"] == sorted(expected["metadata"])
        assert got["messages"] == expected["message_count"]
        assert got["turns"] == expected["roles"].count("user")
        assert got["updated_at"]
        assert got["problems"] == []
    assert sha256(fixture_db) == before  # read-only
    assert user_version(fixture_db) == 1  # not upgraded either


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


def test_the_text_report_lists_sessions(fixture_db, capsys) -> None:
    assert main([str(fixture_db)]) == 0
    out = capsys.readouterr().out
    assert "7 sessions, 38 messages, 0 problems" in out
    assert "session 'unicode-olá 👋'" in out
    assert "metadata keys: channel, user_id" in out
    assert "MALFORMED" not in out


def test_it_flags_malformed_histories(malformed_db, capsys) -> None:
    report = inspect_database(str(malformed_db))
    by_id = {s.session_id: s for s in report.sessions}
    assert by_id["good"].problems == []
    assert (by_id["good"].turns, by_id["good"].messages, by_id["good"].metadata_keys) == (1, 2, ["channel"])
    bad = by_id["bad"]
    assert bad.active_agent == "Billing"
    assert bad.messages == 10
    assert bad.turns == 3  # q1, q2 and q3 (read from its role/content columns)
    kinds = [(p.row_id, p.kind) for p in bad.problems]
    assert kinds == [
        (3, "before_first_user"),
        (5, "orphan_tool_result"),
        (8, "tool_call_without_result"),
        (11, "unparseable_message_json"),
        (12, "unparseable_message_json"),
    ]
    assert "'c2' (weather)" in bad.problems[2].detail
    assert "ghost" in bad.problems[1].detail

    assert main([str(malformed_db)]) == 0  # problems are reported, not an error
    out = capsys.readouterr()
    assert "MALFORMED (5):" in out.out
    assert "row 5: orphan_tool_result" in out.out
    assert out.err == ""  # parse_row's warnings are not repeated on stderr


def test_a_missing_or_unreadable_file_exits_2(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "missing.db")]) == 2
    assert "no such file" in capsys.readouterr().err
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    assert main([str(junk)]) == 2
    assert "cannot read it as a SQLite database" in capsys.readouterr().err
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    assert main([str(other)]) == 2
    assert "not a chatflow database" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.slow
def test_it_runs_as_a_module(fixture_db) -> None:
    ok = subprocess.run([sys.executable, "-m", "chatflow_agent.inspector", str(fixture_db), "--json"],
                        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["sessions"]) == 7
    missing = subprocess.run([sys.executable, "-m", "chatflow_agent.inspector", str(fixture_db) + ".nope"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert "no such file" in missing.stderr


@pytest.mark.slow
def test_the_old_module_name_still_runs_and_warns_that_it_moved(fixture_db) -> None:
    old = subprocess.run([sys.executable, "-m", "chatflow_agent.inspect", str(fixture_db), "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert old.returncode == 0, old.stderr
    assert len(json.loads(old.stdout)["sessions"]) == 7
    assert "DeprecationWarning" in old.stderr and "chatflow_agent.inspector" in old.stderr


def test_names_read_through_the_old_module_warn_and_are_the_inspectors() -> None:
    import chatflow_agent.inspect as old
    from chatflow_agent import inspector

    with pytest.warns(DeprecationWarning, match="chatflow_agent.inspector"):
        assert old.inspect_database is inspector.inspect_database
    with pytest.warns(DeprecationWarning, match="chatflow_agent.inspector"):
        assert old.DatabaseReport is inspector.DatabaseReport  # the report's type, which was never in __all__
    assert "DatabaseReport" in dir(old)
    with pytest.raises(AttributeError):
        old.nothing_here  # noqa: B018
