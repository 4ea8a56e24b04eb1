"""Types: JSON written by chatflow-agent 0.3.4 reads back and dumps to the same shape; text is clean."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from chatflow_agent import Message, Role, ToolCall, ToolResult

FIXTURE_DB = Path(__file__).resolve().parents[1] / "fixtures" / "chatflow_034.db"
MESSAGE_KEYS = ["role", "content", "tool_calls", "tool_results", "timestamp"]  # 0.3.4's Message fields, in order


def fixture_messages() -> list[str]:
    conn = sqlite3.connect(f"file:{FIXTURE_DB}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("SELECT message_json FROM chatflow_messages ORDER BY id")]
    finally:
        conn.close()


def test_the_fixture_holds_every_kind_of_message() -> None:
    roles = {json.loads(raw)["role"] for raw in fixture_messages()}
    assert roles == {"user", "model", "tool"}  # 0.3.4's Runner never stores SYSTEM messages
    assert any(json.loads(raw)["tool_calls"] for raw in fixture_messages())
    assert any(r["is_error"] for raw in fixture_messages() for r in json.loads(raw)["tool_results"] or [])


@pytest.mark.parametrize("raw", fixture_messages())
def test_every_message_written_by_0_3_4_dumps_back_to_the_same_json(raw: str) -> None:
    message = Message.model_validate_json(raw)
    dumped = json.loads(message.model_dump_json())
    assert list(dumped) == MESSAGE_KEYS
    assert dumped == json.loads(raw)  # same keys, shapes, values and timestamp format ("...Z")


def test_the_nested_tool_call_and_result_shapes_are_0_3_4s() -> None:
    message = Message(
        role=Role.MODEL,
        tool_calls=[ToolCall(id="c1", name="f", args={"x": 1})],
        tool_results=[ToolResult(tool_call_id="c1", name="f", content={"ok": True})],
        timestamp=datetime(2025, 1, 15, 10, 0, tzinfo=UTC),
    )
    dumped = json.loads(message.model_dump_json())
    assert dumped["tool_calls"] == [{"id": "c1", "name": "f", "args": {"x": 1}}]
    assert dumped["tool_results"] == [{"tool_call_id": "c1", "name": "f", "content": {"ok": True}, "is_error": False}]
    assert dumped["timestamp"] == "2025-01-15T10:00:00Z"
    assert dumped["role"] == "model"


def test_a_lone_surrogate_in_content_becomes_the_replacement_character() -> None:
    message = Message(role=Role.USER, content="broken \ud83d emoji and \udc00 tail")
    assert message.content == "broken \ufffd emoji and \ufffd tail"
    message.model_dump_json().encode("utf-8")  # always encodable


def test_surrogates_and_nul_in_tool_output_are_cleaned_too() -> None:
    result = ToolResult(tool_call_id="c1", name="f", content={"k\ud800": ["v\x00\udfff"]})
    assert result.content == {"k\ufffd": ["v\ufffd"]}


def test_valid_text_passes_unchanged() -> None:
    text = "Olá — 😀 ünïcödé"
    assert Message(role=Role.USER, content=text).content == text


def test_timestamps_are_utc_aware() -> None:
    assert Message(role=Role.USER, content="x").timestamp.tzinfo is UTC
    naive = Message(role=Role.USER, content="x", timestamp=datetime(2025, 1, 1, 12, 0))
    assert naive.timestamp == datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    lisbon_summer = timezone(timedelta(hours=1))
    shifted = Message(role=Role.USER, content="x", timestamp=datetime(2025, 7, 1, 13, 0, tzinfo=lisbon_summer))
    assert shifted.timestamp.isoformat() == "2025-07-01T12:00:00+00:00"


def test_roles_have_0_3_4s_values() -> None:
    assert {r.value for r in Role} == {"user", "model", "system", "tool"}
    assert Role("model") is Role.MODEL
