"""OpenAI-compatible engine on the official ``openai`` SDK (chat completions with tools).

Serves OpenAI, xAI Grok, DeepSeek, Groq, Ollama and any server speaking ``/chat/completions``
(vLLM, LM Studio, LiteLLM …). Retries (429, 5xx, connection errors, with the provider's
``retry-after``) are the SDK's own (``max_retries``); every SDK error becomes ``ProviderError``.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import openai

from chatflow_agent.core.engines._endpoints import (
    is_local_base_url,
    is_official_endpoint,
    redact_url,
    resolve_api_key,
    unofficial_endpoint_message,
)
from chatflow_agent.core.engines._openai_format import (
    ToolCallAssembler,
    to_openai_messages,
    tool_calls_from_message,
)
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult, TextDeltaCallback, token_count
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.types import Message, ModelCallUsage

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["PROVIDER_PRESETS", "OpenAIEngine", "usage_from_openai"]

# 0.3.4's private names, kept for code that imported them from here.
_is_local_base_url = is_local_base_url
_is_official_endpoint = is_official_endpoint
_redact_url = redact_url

# Official endpoint, environment key and default model per provider (as in chatflow-agent 0.3.4).
PROVIDER_PRESETS: dict[str, dict[str, str]] = {
    "openai": {"base_url": "https://api.openai.com/v1", "env_key": "OPENAI_API_KEY", "default_model": "gpt-4o-mini"},
    "grok": {"base_url": "https://api.x.ai/v1", "env_key": "XAI_API_KEY", "default_model": "grok-2"},
    "xai": {"base_url": "https://api.x.ai/v1", "env_key": "XAI_API_KEY", "default_model": "grok-2"},
    "ollama": {"base_url": "http://localhost:11434/v1", "env_key": "OLLAMA_API_KEY", "default_model": "gemma2:9b"},
    "gemma": {"base_url": "http://localhost:11434/v1", "env_key": "OLLAMA_API_KEY", "default_model": "gemma2:9b"},
    "deepseek": {
        "base_url": "https://api.deepseek.com/v1",
        "env_key": "DEEPSEEK_API_KEY",
        "default_model": "deepseek-chat",
    },
    "groq": {
        "base_url": "https://api.groq.com/openai/v1",
        "env_key": "GROQ_API_KEY",
        "default_model": "llama-3.3-70b-versatile",
    },
}
_LOCAL_PLACEHOLDER_KEY = "ollama"  # what 0.3.4 sends to local servers that need no key


class OpenAIEngine(BaseEngine):
    """An OpenAI-compatible chat completions endpoint.

    ``base_url``: explicit, else ``<PROVIDER>_BASE_URL`` from the environment, else the preset's.
    Key rules (0.3.4, SEC-07): an explicit ``api_key`` is always used (``""`` sends none); the
    provider's environment key (``OPENAI_API_KEY`` …) is sent only to its official endpoint;
    loopback endpoints without a key get ``OLLAMA_API_KEY`` (ollama/gemma) or a placeholder.
    Construction never fails for a missing key: the first call raises ``ProviderError``.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        provider: str = "openai",
        timeout: float = 60.0,
        http_client: httpx.AsyncClient | None = None,
        max_retries: int = 2,
    ) -> None:
        self.provider = provider.lower()
        preset = PROVIDER_PRESETS.get(self.provider, PROVIDER_PRESETS["openai"])
        self.official_base_url = preset["base_url"]
        self.env_key = preset["env_key"]
        self.base_url = (base_url or os.environ.get(f"{provider.upper()}_BASE_URL") or self.official_base_url).rstrip(
            "/"
        )
        self.timeout = timeout
        self.max_retries = max_retries
        self._external_client = http_client
        self.api_key: str | None = self._key_at_construction(api_key)

    @property
    def is_gateway(self) -> bool:
        """True when ``base_url`` is not the provider's official endpoint (proxy, gateway, local server).

        Such an endpoint may serve any vendor's model names, so ``resolve_engine`` treats it as
        provider-agnostic.
        """
        return not is_official_endpoint(self.base_url, self.official_base_url)

    def _key_at_construction(self, api_key: str | None) -> str | None:
        if api_key is not None:
            return api_key
        if is_local_base_url(self.base_url):
            local_key = os.environ.get(self.env_key) if self.provider in ("ollama", "gemma") else None
            return local_key or _LOCAL_PLACEHOLDER_KEY
        if is_official_endpoint(self.base_url, self.official_base_url):
            return os.environ.get(self.env_key)
        return None  # unofficial endpoint without a key: reported at the first call

    def _credential(self) -> str:
        if self.api_key is not None:
            return self.api_key
        if not is_official_endpoint(self.base_url, self.official_base_url):
            raise ProviderError(unofficial_endpoint_message(self.base_url, self.env_key, self.official_base_url))
        return resolve_api_key(None, self.base_url, official_base_url=self.official_base_url, env_key=self.env_key)

    def _label(self) -> str:
        return f"{(self.provider or 'openai-compatible').upper()} ({redact_url(self.base_url)})"

    @asynccontextmanager
    async def _completions(self) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        """``chat.completions.create`` of an SDK client for one call; errors leave as ``ProviderError``."""
        key = self._credential()
        # Organisation/project ids from OPENAI_ORG_ID/OPENAI_PROJECT_ID belong to OpenAI only.
        headers: dict[str, Any] = (
            {}
            if not self.is_gateway and self.provider == "openai"
            else {
                "OpenAI-Organization": openai.Omit(),
                "OpenAI-Project": openai.Omit(),
            }
        )
        # api_key="" means "no credential": the SDK refuses an empty key, so it gets a
        # placeholder and each request drops the Authorization header it would make.
        per_request = {} if key else {"Authorization": openai.Omit()}
        if self._external_client is not None:
            # A redirect must never carry the key to its Location, even on an injected client
            # configured to follow redirects: the engine owns this setting.
            self._external_client.follow_redirects = False
        http_client = self._external_client or openai.DefaultAsyncHttpxClient(
            timeout=self.timeout,
            follow_redirects=False,  # a redirect must not carry the key elsewhere
        )
        client = openai.AsyncOpenAI(
            api_key=key or "no-credential",
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=http_client,
            default_headers=headers,
        )
        try:
            # The raw response says how many retries the SDK took; ``.parse()`` gives the completion.
            yield functools.partial(client.chat.completions.with_raw_response.create, extra_headers=per_request)
        except openai.APIStatusError as err:
            raise ProviderError(self._status_message(err)) from err
        except openai.APITimeoutError as err:
            raise ProviderError(f"{self._label()} request timed out after {self.timeout}s.") from err
        except openai.APIConnectionError as err:
            raise ProviderError(f"{self._label()} connection error: {err}") from err
        except openai.OpenAIError as err:
            raise ProviderError(f"{self._label()} request failed: {err}") from err
        except httpx.HTTPError as err:  # transport errors in the middle of a stream are not wrapped
            raise ProviderError(f"{self._label()} connection error: {type(err).__name__}: {err}") from err
        finally:
            if self._external_client is None:
                await client.close()

    def _status_message(self, err: openai.APIStatusError) -> str:
        status = err.status_code
        if 300 <= status < 400:
            return (
                f"{self._label()} request was redirected (HTTP {status}). "
                "Redirects are not followed; set base_url to the final endpoint."
            )
        return f"{self._label()} API request failed (HTTP {status}): {str(err.message)[:500]}"

    def _request(self, agent: Agent, history: list[Message]) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": agent.model,
            "messages": to_openai_messages(agent.get_instructions(), history),
        }
        tools = [t.to_openai_tool() for t in agent.get_all_tools()]
        if tools:
            request["tools"] = tools
            request["tool_choice"] = "auto"
        return request

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """One chat completion. ``raw_response`` is the completion as a dict (with ``usage``);
        ``usage`` is read from the completion's ``usage`` (see :func:`usage_from_openai`).

        Raises ``ProviderError`` for a missing/unscoped key, HTTP errors after retries, redirects,
        timeouts and connection errors.
        """
        started = time.perf_counter()
        async with self._completions() as create:
            response = await create(**self._request(agent, history))
            completion = response.parse()
        latency_ms = (time.perf_counter() - started) * 1000
        raw = completion.model_dump(mode="json", exclude_unset=True)
        finish = completion.choices[0].finish_reason if completion.choices else None
        usage = usage_from_openai(raw.get("usage"), provider=self.provider, model=completion.model or agent.model,
                                  latency_ms=latency_ms, finish_reason=finish, retries=response.retries_taken)
        if not completion.choices:
            return EngineTurnResult(text=None, raw_response=raw, usage=usage)
        message = completion.choices[0].message
        return EngineTurnResult(
            text=message.content, tool_calls=tool_calls_from_message(message.tool_calls), raw_response=raw,
            usage=usage,
        )

    async def stream_turn_async(
        self, agent: Agent, history: list[Message], on_text_delta: TextDeltaCallback
    ) -> EngineTurnResult:
        """A streamed chat completion (SSE): ``on_text_delta`` per content delta; tool calls assembled.

        ``raw_response`` is a completion-shaped dict built from the chunks. The request asks for
        ``stream_options={"include_usage": true}``: the server then sends the whole call's ``usage``
        in a last chunk with no choices (servers that ignore the option leave the counts ``None``).
        ``usage.ttft_ms`` is the time to the first text or tool-call fragment. Errors as in
        :meth:`generate_turn_async`, including a stream cut off midway.
        """
        text: list[str] = []
        assembler = ToolCallAssembler()
        meta: dict[str, Any] = {"finish_reason": None, "usage": None, "id": None, "model": agent.model}
        started = time.perf_counter()
        first: float | None = None
        async with self._completions() as create:
            response = await create(**self._request(agent, history), stream=True,
                                    stream_options={"include_usage": True})
            stream = response.parse()
            async with stream:
                async for chunk in stream:
                    meta["id"] = meta["id"] or chunk.id
                    meta["model"] = chunk.model or meta["model"]
                    if chunk.usage is not None:
                        meta["usage"] = chunk.usage.model_dump(mode="json")
                    if not chunk.choices:
                        continue
                    choice = chunk.choices[0]
                    meta["finish_reason"] = choice.finish_reason or meta["finish_reason"]
                    if first is None and (choice.delta.content or choice.delta.tool_calls):
                        first = time.perf_counter()
                    assembler.add(choice.delta.tool_calls)
                    if choice.delta.content:
                        text.append(choice.delta.content)
                        await on_text_delta(choice.delta.content)
        usage = usage_from_openai(
            meta["usage"], provider=self.provider, model=meta["model"], finish_reason=meta["finish_reason"],
            latency_ms=(time.perf_counter() - started) * 1000, retries=response.retries_taken,
            ttft_ms=None if first is None else (first - started) * 1000,
        )
        return _streamed_result("".join(text) if text else None, assembler, meta, usage)


def usage_from_openai(usage: Any, *, provider: str | None, model: str | None, latency_ms: float | None = None,
                      ttft_ms: float | None = None, finish_reason: str | None = None,
                      retries: int | None = None) -> ModelCallUsage:
    """A :class:`ModelCallUsage` from a chat completion's ``usage`` dict (or ``None``).

    Source: https://platform.openai.com/docs/api-reference/chat/object (``usage.prompt_tokens``,
    cached part included; ``usage.prompt_tokens_details.cached_tokens``; ``usage.completion_tokens``)
    and ``stream_options.include_usage`` in https://platform.openai.com/docs/api-reference/chat/create.
    Counts a server leaves out (or sends as non-integers) are ``None``.
    """
    data = usage if isinstance(usage, dict) else {}
    details = data.get("prompt_tokens_details")
    return ModelCallUsage(
        provider=provider, model=model, input_tokens=token_count(data.get("prompt_tokens")),
        output_tokens=token_count(data.get("completion_tokens")),
        cached_tokens=token_count(details.get("cached_tokens")) if isinstance(details, dict) else None,
        latency_ms=latency_ms, ttft_ms=ttft_ms, finish_reason=finish_reason, retries=retries,
    )


def _streamed_result(text: str | None, assembler: ToolCallAssembler, meta: dict[str, Any],
                     usage: ModelCallUsage) -> EngineTurnResult:
    calls = assembler.calls()
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args}} for c in calls
        ]
    raw = {
        "id": meta["id"],
        "object": "chat.completion",
        "model": meta["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": meta["finish_reason"]}],
        "usage": meta["usage"],
    }
    return EngineTurnResult(text=text, tool_calls=calls, raw_response=raw, usage=usage)
