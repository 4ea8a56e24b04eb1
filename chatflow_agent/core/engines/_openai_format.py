"""Conversion between chatflow messages and the OpenAI chat completions wire format.

Source: https://platform.openai.com/docs/api-reference/chat/create (messages, tool_calls,
``tool`` role messages) and the streaming chunk format (``choices[].delta``, tool-call deltas
keyed by ``index`` whose ``function.arguments`` arrive in fragments).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from chatflow_agent.types import Message, Role, ToolCall

__all__ = ["ToolCallAssembler", "parse_tool_arguments", "to_openai_messages", "tool_calls_from_message"]


def _tool_content(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _assistant_message(msg: Message) -> dict[str, Any] | None:
    if not msg.tool_calls:
        return {"role": "assistant", "content": msg.content} if msg.content else None
    return {
        "role": "assistant",
        "content": msg.content or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.args, ensure_ascii=False)},
            }
            for call in msg.tool_calls
        ],
    }


def to_openai_messages(instructions: str | None, history: list[Message]) -> list[dict[str, Any]]:
    """``[{"role": "system" | "user" | "assistant" | "tool", ...}]`` for ``history``.

    The agent's instructions come first as a system message; SYSTEM messages in the history
    stay system messages; a MODEL message with tool calls becomes an assistant message with
    ``tool_calls`` (arguments JSON-encoded); a TOOL message becomes one ``tool`` message per
    result (content JSON-encoded unless it is a str). Empty messages are dropped.
    """
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for msg in history:
        if msg.role in (Role.SYSTEM, Role.USER) and msg.content:
            out.append({"role": msg.role.value, "content": msg.content})
        elif msg.role == Role.MODEL:
            assistant = _assistant_message(msg)
            if assistant is not None:
                out.append(assistant)
        elif msg.role == Role.TOOL:
            for res in msg.tool_results or []:
                out.append({"role": "tool", "tool_call_id": res.tool_call_id, "content": _tool_content(res.content)})
    return out


def parse_tool_arguments(raw: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` (a JSON string) as a dict; unparsable text → ``{"raw_input": raw}``."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"raw_input": raw}
    return value if isinstance(value, dict) else {"raw_input": raw}


def _call_id(raw_id: Any) -> str:
    return raw_id if isinstance(raw_id, str) and raw_id else f"call_{uuid.uuid4().hex[:24]}"


def tool_calls_from_message(raw_calls: list[Any] | None) -> list[ToolCall]:
    """``ToolCall``s from an SDK ``message.tool_calls`` list (missing ids get a unique one)."""
    calls: list[ToolCall] = []
    for tc in raw_calls or []:
        function = getattr(tc, "function", None)
        if function is None:  # custom (non-function) tool calls are not ours
            continue
        calls.append(
            ToolCall(id=_call_id(tc.id), name=function.name or "", args=parse_tool_arguments(function.arguments))
        )
    return calls


class ToolCallAssembler:
    """Joins streamed tool-call deltas (``choices[0].delta.tool_calls``) into whole calls, by index."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, Any]] = {}

    def add(self, deltas: list[Any] | None) -> None:
        for position, delta in enumerate(deltas or []):
            index = getattr(delta, "index", None)
            part = self._parts.setdefault(position if index is None else index, {"id": None, "name": "", "args": ""})
            if getattr(delta, "id", None):
                part["id"] = delta.id
            function = getattr(delta, "function", None)
            if function is not None:
                # Names arrive whole in the first fragment; some servers repeat them later.
                part["name"] = part["name"] or function.name or ""
                part["args"] += function.arguments or ""

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(id=_call_id(p["id"]), name=p["name"], args=parse_tool_arguments(p["args"]))
            for _, p in sorted(self._parts.items())
        ]
