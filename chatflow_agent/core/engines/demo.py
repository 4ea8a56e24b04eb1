"""An offline, deterministic engine that behaves plausibly: the site's default when no model is set up.

It reads the last user message, calls the agent's tool whose name fits the words (``"where is
order 404?"`` → ``check_order_status(order_id="404")``), hands off when the user asks for another
agent's specialty (``"I have a billing question"`` → ``transfer_to_billing``), and answers in plain
words once tool results are in (``"Order 404 is IN_TRANSIT, eta Tomorrow."``). It never loops:
when the history ends with tool results it always answers with text.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import time
import weakref
from typing import TYPE_CHECKING, Any

from chatflow_agent.core.agent import handoff_tool_name
from chatflow_agent.core.engines._demo_words import HANDOFF_PREFIX, Match, best_match, fill_arguments, humanize
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult, TextDeltaCallback
from chatflow_agent.core.engines.scripted import split_words
from chatflow_agent.types import Message, ModelCallUsage, Role, ToolCall, ToolResult

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["DemoEngine", "estimate_tokens"]


class DemoEngine(BaseEngine):
    """Deterministic offline answers from the agent's tools and the last user message.

    ``delta_delay`` (seconds, default 0) is awaited between streamed words; keep it to a few ms.
    Each answer's ``usage`` is an estimate (``estimated=True``, ``provider=None``, so no cost
    unless a price override names the agent's model): one token per four characters, rounded up,
    of what a provider would have read (instructions, messages, tool calls and results) and written.
    """

    provider = None

    def __init__(self, delta_delay: float = 0.0) -> None:
        self.delta_delay = delta_delay

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """A tool call, a handoff, a summary of tool results, or a polite answer (in that spirit)."""
        started = time.perf_counter()
        result = self._answer(agent, history)
        result.usage = _estimate(agent, history, result, started)
        return result

    def _answer(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        if history and history[-1].role == Role.TOOL:
            return EngineTurnResult(text=_summarise_results(agent, history))
        text = _last_user_text(history)
        match = best_match(agent.get_all_tools(), text) if text else None
        if match is None:
            return EngineTurnResult(text=_greeting(agent, history))
        if match.is_handoff:
            return _call(history, match.tool.name, {"reason": _handoff_reason(match, text)})
        args, missing = fill_arguments(match.tool, text)
        if missing:
            needed = " and ".join(humanize(name) for name in missing)
            return EngineTurnResult(text=f"I can {humanize(match.tool.name)} for you; which {needed} should I use?")
        return _call(history, match.tool.name, args)

    async def stream_turn_async(
        self, agent: Agent, history: list[Message], on_text_delta: TextDeltaCallback
    ) -> EngineTurnResult:
        """Like :meth:`generate_turn_async`, with the answer reported word by word."""
        started = time.perf_counter()
        result = self._answer(agent, history)
        first: float | None = None
        for piece in split_words(result.text or ""):
            first = first or time.perf_counter()
            await on_text_delta(piece)
            if self.delta_delay:
                await asyncio.sleep(self.delta_delay)
        result.usage = _estimate(agent, history, result, started, first)
        return result


def estimate_tokens(text: str) -> int:
    """One token per four characters, rounded up (OpenAI's rule of thumb for English text)."""
    return math.ceil(len(text) / 4)


_dumps = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(…, ensure_ascii=False), built once
# Each message's share of the tokens read, kept while the message object lives (a history's messages are
# read again by every later model call; they are not changed once they joined a history). By id, as
# messages are not hashable; the weak reference tells a live entry from a reused id and drops it with
# the message.
_read_tokens: dict[int, tuple[weakref.ref[Message], int]] = {}


def _tokens_read(msg: Message) -> int:
    key = id(msg)
    entry = _read_tokens.get(key)
    if entry is not None and entry[0]() is msg:
        return entry[1]
    read = [msg.content or ""]
    read += [_dumps(c.args) + c.name for c in msg.tool_calls or []]
    read += [_dumps(r.content) for r in msg.tool_results or []]
    tokens = sum(estimate_tokens(t) for t in read)
    _read_tokens[key] = (weakref.ref(msg, functools.partial(_forget_read, key)), tokens)
    return tokens


def _forget_read(key: int, _ref: weakref.ref[Message]) -> None:
    _read_tokens.pop(key, None)


def _estimate(agent: Agent, history: list[Message], result: EngineTurnResult, started: float,
              first: float | None = None) -> ModelCallUsage:
    read = estimate_tokens(agent.get_instructions() or "") + sum(_tokens_read(msg) for msg in history)
    written = (result.text or "") + "".join(c.name + _dumps(c.args) for c in result.tool_calls)
    return ModelCallUsage(
        provider=None, model=agent.model, input_tokens=read,
        output_tokens=estimate_tokens(written), cached_tokens=0, estimated=True, retries=0,
        finish_reason="tool_calls" if result.tool_calls else "stop",
        latency_ms=(time.perf_counter() - started) * 1000, ttft_ms=None if first is None else (first - started) * 1000,
    )


def _last_user_text(history: list[Message]) -> str:
    for msg in reversed(history):
        if msg.role == Role.USER:
            return msg.content or ""
    return ""


def _call(history: list[Message], name: str, args: dict[str, Any]) -> EngineTurnResult:
    # Derived from the turn's user message (its timestamp makes it unique) and the history's length: the same
    # conversation gets the same id, and each call a new one, without serialising the history on every call.
    user = next((m for m in reversed(history) if m.role == Role.USER), None)
    turn = "" if user is None else f"{user.timestamp.isoformat()}:{user.content}"
    digest = hashlib.sha256(f"{len(history)}:{turn}".encode()).hexdigest()[:16]
    return EngineTurnResult(tool_calls=[ToolCall(id=f"demo_{digest}", name=name, args=args)])


def _handoff_reason(match: Match, text: str) -> str:
    snippet = text if len(text) <= 160 else text[:157] + "..."
    return f"The user asked about {', '.join(match.matched)}: {snippet}"


def _peer_name(agent: Agent, tool_name: str) -> str:
    for peer in agent.handoffs:
        if handoff_tool_name(peer.name) == tool_name:
            return peer.name
    return humanize(tool_name[len(HANDOFF_PREFIX) :]).title()


def _capabilities(agent: Agent) -> str:
    """``"I can check order status, and I can also connect you with Billing."`` or ``""``."""
    own = [humanize(t.name) for t in agent.tools]
    peers = [peer.name for peer in agent.handoffs]
    parts = []
    if own:
        parts.append("I can " + _join(own, "or"))
    if peers:
        parts.append(("and I can also" if own else "I can") + " connect you with " + _join(peers, "or"))
    return (", ".join(parts) + ".") if parts else ""


def _join(items: list[str], last: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def _greeting(agent: Agent, history: list[Message]) -> str:
    answered_before = any(m.role == Role.MODEL for m in history)
    opening = f"{agent.name} here." if answered_before else f"Hi, this is {agent.name}."
    return " ".join(p for p in (opening, _capabilities(agent), "What can I do for you?") if p)


def _summarise_results(agent: Agent, history: list[Message]) -> str:
    results: list[ToolResult] = []
    for msg in reversed(history):
        if msg.role != Role.TOOL:
            break
        results[:0] = msg.tool_results or []
    sentences = [_describe(agent, history, r) for r in results]
    return " ".join(s for s in sentences if s) or f"{agent.name} here. All done. Anything else?"


def _is_handoff(result: ToolResult) -> bool:
    content = result.content
    return result.name.startswith(HANDOFF_PREFIX) or (
        isinstance(content, dict) and ("transferred_to" in content or "target_agent_name" in content)
    )


def _describe(agent: Agent, history: list[Message], result: ToolResult) -> str:
    action = humanize(result.name)
    content = result.content
    if result.is_error:
        return f"Sorry, I couldn't {action}: {_sentence(_format(content))}"
    if _is_handoff(result) and isinstance(content, dict):
        target = content.get("transferred_to") or content.get("target_agent_name")
        if target == agent.name:
            topic = _last_user_text(history)
            about = f' with "{topic}"' if topic else ""
            intro = f"Hi, this is {agent.name}; I'll take it from here and help you{about}."
            return " ".join(p for p in (intro, _capabilities(agent)) if p)
        return f"You're being transferred to {target or _peer_name(agent, result.name)}."
    if isinstance(content, str):
        return _sentence(content)
    if isinstance(content, dict):
        return _describe_record(action, content)
    if isinstance(content, list):
        count = f"{len(content)} result{'s' if len(content) != 1 else ''}"
        return _sentence(f"{action.capitalize()}: {count}" + (f": {_format(content)}" if content else ""))
    return _sentence(f"{action.capitalize()}: {_format(content)}")


def _describe_record(action: str, record: dict[str, Any]) -> str:
    """A record in words.

    ``{"order_id": "404", "status": "IN_TRANSIT", "eta": "Tomorrow"}`` → ``Order 404 is IN_TRANSIT, eta Tomorrow.``
    """
    id_key = next((k for k in record if k == "id" or k.endswith("_id")), None)
    status_key = next((k for k in record if k in ("status", "state")), None)
    rest = [f"{humanize(k)} {_format(v)}" for k, v in record.items() if k not in (id_key, status_key)]
    if id_key is None:
        if status_key is not None:
            rest.insert(0, f"status {_format(record[status_key])}")
        return _sentence(f"{action.capitalize()}: " + (", ".join(rest) or "nothing found"))
    noun = humanize(id_key[: -len("_id")]) if id_key != "id" else action.split()[-1]
    head = f"{noun.capitalize()} {_format(record[id_key])}"
    if status_key is not None:
        head += f" is {_format(record[status_key])}"
    return _sentence(", ".join([head, *rest]))


def _format(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return "(" + ", ".join(f"{humanize(str(k))} {_format(v)}" for k, v in value.items()) + ")"
    if isinstance(value, list):
        shown = ", ".join(_format(v) for v in value[:5])
        return shown + (f" and {len(value) - 5} more" if len(value) > 5 else "")
    return str(value)


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."
