"""Anthropic Claude engine on the ``anthropic`` SDK (an optional extra: ``pip install anthropic``).

The SDK is imported at the first call, so the class constructs without it. Wire shapes:
Anthropic Messages API (https://docs.anthropic.com/en/api/messages): ``system`` apart, assistant
``tool_use`` blocks, ``tool_result`` blocks in a user message. Retries (429, 5xx, 529) are the SDK's.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx

from chatflow_agent.core.engines._endpoints import (
    is_official_endpoint,
    redact_url,
    resolve_api_key,
)
from chatflow_agent.core.engines._openai_format import parse_tool_arguments
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult, TextDeltaCallback, token_count
from chatflow_agent.exceptions import DependencyError, ProviderError
from chatflow_agent.types import Message, ModelCallUsage, Role, ToolCall

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["ANTHROPIC_BASE_URL", "AnthropicEngine", "usage_from_anthropic"]

ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"
_ENV_KEY = "ANTHROPIC_API_KEY"


def _to_messages(history: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system text from SYSTEM messages, Anthropic ``messages``)."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for msg in history:
        if msg.role == Role.SYSTEM and msg.content:
            system.append(msg.content)
        elif msg.role == Role.USER and msg.content:
            messages.append({"role": "user", "content": msg.content})
        elif msg.role == Role.MODEL:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": msg.content}] if msg.content else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in msg.tool_calls or []]
            if blocks:
                messages.append({"role": "assistant", "content": blocks})
        elif msg.role == Role.TOOL and msg.tool_results:
            blocks = [
                {
                    "type": "tool_result",
                    "tool_use_id": r.tool_call_id,
                    "content": r.content if isinstance(r.content, str) else json.dumps(r.content, ensure_ascii=False),
                    "is_error": r.is_error,
                }
                for r in msg.tool_results
            ]
            messages.append({"role": "user", "content": blocks})
    return "\n\n".join(system), messages


class AnthropicEngine(BaseEngine):
    """Anthropic Messages API (constructor as in 0.3.4, plus ``max_retries``).

    ``ANTHROPIC_API_KEY`` goes only to the official endpoint; proxies and local servers need an
    explicit ``api_key`` (``""`` sends no credential). ``ANTHROPIC_AUTH_TOKEN`` is never sent.
    First call without the SDK → ``DependencyError``; without a usable key → ``ProviderError``.
    ``base_url`` keeps 0.3.4's ``…/v1`` form; requests go to ``{base_url}/messages``.
    """

    provider = "anthropic"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str = ANTHROPIC_BASE_URL,
        anthropic_version: str = "2023-06-01",
        timeout: float = 60.0,
        http_client: httpx.AsyncClient | None = None,
        max_retries: int = 2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.anthropic_version = anthropic_version
        self.timeout = timeout
        self.max_retries = max_retries
        self._external_client = http_client

    @property
    def is_gateway(self) -> bool:
        """True when ``base_url`` is not Anthropic's official endpoint."""
        return not is_official_endpoint(self.base_url, ANTHROPIC_BASE_URL)

    def _client(self) -> tuple[Any, Any, dict[str, Any]]:
        """(SDK client, SDK module, headers for each request); the key is resolved here, at the call."""
        try:
            import anthropic
        except ImportError as err:
            raise DependencyError("AnthropicEngine", "anthropic", "pip install anthropic") from err
        key = resolve_api_key(self.api_key, self.base_url, official_base_url=ANTHROPIC_BASE_URL, env_key=_ENV_KEY)
        headers: dict[str, Any] = {"anthropic-version": self.anthropic_version}
        # api_key="": send no credential at all. The SDK accepts a missing key only when a request's own
        # headers omit both credential headers (its default headers do not count).
        per_request = {} if key else {"X-Api-Key": anthropic.Omit(), "Authorization": anthropic.Omit()}
        # The SDK appends /v1/messages itself.
        sdk_base = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        if self._external_client is not None:
            self._external_client.follow_redirects = False  # never replay the key to a Location
        client = anthropic.AsyncAnthropic(
            api_key=key or "no-credential",  # never None: the SDK would read ANTHROPIC_API_KEY for any host
            base_url=sdk_base,
            timeout=self.timeout,
            max_retries=self.max_retries,
            default_headers=headers,
            http_client=self._external_client
            or anthropic.DefaultAsyncHttpxClient(timeout=self.timeout, follow_redirects=False),
        )
        client.auth_token = None  # the SDK reads ANTHROPIC_AUTH_TOKEN too; it is never sent
        return client, anthropic, per_request

    def _request(self, agent: Agent, history: list[Message]) -> dict[str, Any]:
        system, messages = _to_messages(history)
        system = "\n\n".join(s for s in (agent.get_instructions(), system) if s)
        request: dict[str, Any] = {"model": agent.model, "max_tokens": 4096, "messages": messages}
        if system:
            request["system"] = system
        tools = agent.get_all_tools()
        if tools:
            request["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.json_schema} for t in tools
            ]
        return request

    @asynccontextmanager
    async def _create(self) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        """``messages.with_raw_response.create`` for one call; SDK errors leave as ``ProviderError``."""
        client, anthropic, per_request = self._client()
        label = f"Anthropic ({redact_url(self.base_url)})"
        create = client.messages.with_raw_response.create
        try:
            yield functools.partial(create, extra_headers=per_request) if per_request else create
        except anthropic.APIStatusError as err:
            if 300 <= err.status_code < 400:  # the client follows no redirect: the key never goes elsewhere
                raise ProviderError(f"{label} redirected the request (HTTP {err.status_code}); "
                                    "redirects are not followed") from err
            raise ProviderError(f"{label} API error (HTTP {err.status_code}): {str(err.message)[:500]}") from err
        except anthropic.AnthropicError as err:
            raise ProviderError(f"{label} request failed: {type(err).__name__}: {err}") from err
        except httpx.HTTPError as err:  # transport errors in the middle of a stream are not wrapped
            raise ProviderError(f"{label} connection error: {type(err).__name__}: {err}") from err
        finally:
            if self._external_client is None:
                await client.close()

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """One ``messages.create`` call; ``raw_response`` is the message as a dict; ``usage`` from its
        ``usage`` block (see :func:`usage_from_anthropic`)."""
        started = time.perf_counter()
        async with self._create() as create:
            raw = await create(**self._request(agent, history))
            response = raw.parse()
        message = response.model_dump()
        usage = usage_from_anthropic(message.get("usage"), model=response.model or agent.model,
                                     finish_reason=response.stop_reason, retries=raw.retries_taken,
                                     latency_ms=(time.perf_counter() - started) * 1000)
        text = [b.text for b in response.content if b.type == "text"]
        calls = [
            ToolCall(id=b.id, name=b.name, args=dict(b.input or {})) for b in response.content if b.type == "tool_use"
        ]
        return EngineTurnResult(text="".join(text) if text else None, tool_calls=calls, raw_response=message,
                                usage=usage)

    async def stream_turn_async(
        self, agent: Agent, history: list[Message], on_text_delta: TextDeltaCallback
    ) -> EngineTurnResult:
        """A streamed ``messages.create`` (SSE): ``on_text_delta`` per ``text_delta``; ``tool_use``
        blocks assembled from their ``input_json_delta`` fragments.

        Usage (https://docs.anthropic.com/en/docs/build-with-claude/streaming): ``message_start``
        carries the input counts, each ``message_delta`` the cumulative ``usage.output_tokens`` and
        the ``stop_reason``. ``raw_response`` is a message-shaped dict built from the events.
        Errors as in :meth:`generate_turn_async`, including a stream cut off midway.
        """
        started = time.perf_counter()
        state = _StreamState()
        async with self._create() as create:
            raw = await create(**self._request(agent, history), stream=True)
            stream = raw.parse()
            async with stream:
                async for event in stream:
                    delta = state.add(event.model_dump())
                    if delta:
                        await on_text_delta(delta)
        message = state.message(agent.model)
        usage = usage_from_anthropic(
            message["usage"], model=message["model"], finish_reason=message["stop_reason"], retries=raw.retries_taken,
            latency_ms=(time.perf_counter() - started) * 1000,
            ttft_ms=None if state.first is None else (state.first - started) * 1000,
        )
        text = "".join(b["text"] for b in state.blocks if b["type"] == "text")
        calls = [ToolCall(id=b["id"], name=b["name"], args=parse_tool_arguments(b["json"]))
                 for b in state.blocks if b["type"] == "tool_use"]
        return EngineTurnResult(text=text or None, tool_calls=calls, raw_response=message, usage=usage)


class _StreamState:
    """Joins Anthropic stream events (as dicts) into content blocks, usage and stop reason."""

    def __init__(self) -> None:
        self.start: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.blocks: list[dict[str, Any]] = []
        self.first: float | None = None

    def add(self, event: dict[str, Any]) -> str:
        """Record ``event``; returns the text it adds (``""`` for none)."""
        kind = event.get("type")
        if kind == "message_start":
            self.start = dict(event.get("message") or {})
            self.usage.update({k: v for k, v in (self.start.get("usage") or {}).items() if v is not None})
        elif kind == "message_delta":
            self.usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            self.blocks.append({"type": block.get("type"), "text": block.get("text") or "", "id": block.get("id"),
                                "name": block.get("name") or "", "json": ""})
        elif kind == "content_block_delta" and self.blocks:
            delta = event.get("delta") or {}
            if delta.get("type") in ("text_delta", "input_json_delta") and self.first is None:
                self.first = time.perf_counter()  # the first token
            if delta.get("type") == "text_delta":
                self.blocks[-1]["text"] += delta.get("text") or ""
                return str(delta.get("text") or "")
            if delta.get("type") == "input_json_delta":
                self.blocks[-1]["json"] += delta.get("partial_json") or ""
        return ""

    def message(self, model: str | None) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for b in self.blocks:
            if b["type"] == "text":
                content.append({"type": "text", "text": b["text"]})
            elif b["type"] == "tool_use":
                content.append({"type": "tool_use", "id": b["id"], "name": b["name"],
                                "input": parse_tool_arguments(b["json"])})
        return {"id": self.start.get("id"), "type": "message", "role": "assistant",
                "model": self.start.get("model") or model, "content": content,
                "stop_reason": self.stop_reason, "usage": self.usage}


def usage_from_anthropic(usage: Any, *, model: str | None, latency_ms: float | None = None,
                         ttft_ms: float | None = None, finish_reason: str | None = None,
                         retries: int | None = None) -> ModelCallUsage:
    """A :class:`ModelCallUsage` from an Anthropic message's ``usage`` dict (or ``None``).

    Source: https://docs.anthropic.com/en/api/messages (``usage.input_tokens`` — the uncached
    input only —, ``cache_read_input_tokens``, ``cache_creation_input_tokens``, ``output_tokens``).
    ``input_tokens`` here is their sum, the whole prompt, as for the other providers.
    """
    data = usage if isinstance(usage, dict) else {}
    fresh, read, written = (token_count(data.get(k)) for k in
                            ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    return ModelCallUsage(
        provider="anthropic", model=model,
        input_tokens=None if fresh is None else fresh + (read or 0) + (written or 0),
        output_tokens=token_count(data.get("output_tokens")), cached_tokens=read, cache_write_tokens=written,
        latency_ms=latency_ms, ttft_ms=ttft_ms, finish_reason=finish_reason, retries=retries,
    )
