"""Anthropic Claude engine on the ``anthropic`` SDK (an optional extra: ``pip install anthropic``).

The SDK is imported at the first call, so the class constructs without it. Wire shapes:
Anthropic Messages API (https://docs.anthropic.com/en/api/messages): ``system`` apart, assistant
``tool_use`` blocks, ``tool_result`` blocks in a user message. Retries (429, 5xx, 529) are the SDK's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from chatflow_agent.core.engines._endpoints import (
    is_official_endpoint,
    redact_url,
    resolve_api_key,
)
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.exceptions import DependencyError, ProviderError
from chatflow_agent.types import Message, Role, ToolCall

if TYPE_CHECKING:
    import httpx

    from chatflow_agent.core.agent import Agent

__all__ = ["ANTHROPIC_BASE_URL", "AnthropicEngine"]

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

    def _client(self) -> tuple[Any, Any]:
        """(SDK client, SDK module); the key is resolved here, at the call."""
        try:
            import anthropic
        except ImportError as err:
            raise DependencyError("AnthropicEngine", "anthropic", "pip install anthropic") from err
        key = resolve_api_key(self.api_key, self.base_url, official_base_url=ANTHROPIC_BASE_URL, env_key=_ENV_KEY)
        headers: dict[str, Any] = {"anthropic-version": self.anthropic_version}
        if not key:  # api_key="": send no credential at all
            headers.update({"X-Api-Key": anthropic.Omit(), "Authorization": anthropic.Omit()})
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
        return client, anthropic

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """One ``messages.create`` call; ``raw_response`` is the message as a dict."""
        client, anthropic = self._client()
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
        label = f"Anthropic ({redact_url(self.base_url)})"
        try:
            response = await client.messages.create(**request)
        except anthropic.APIStatusError as err:
            raise ProviderError(f"{label} API error (HTTP {err.status_code}): {str(err.message)[:500]}") from err
        except anthropic.AnthropicError as err:
            raise ProviderError(f"{label} request failed: {type(err).__name__}: {err}") from err
        finally:
            if self._external_client is None:
                await client.close()
        text = [b.text for b in response.content if b.type == "text"]
        calls = [
            ToolCall(id=b.id, name=b.name, args=dict(b.input or {})) for b in response.content if b.type == "tool_use"
        ]
        return EngineTurnResult(
            text="".join(text) if text else None, tool_calls=calls, raw_response=response.model_dump()
        )
