"""Google Gemini engine on the ``google-genai`` SDK (an optional extra: ``pip install google-genai``).

The SDK is imported at the first call, so the class constructs (and can be subclassed, as
0.3.4's tests do) without it. Source for the wire shapes: google-genai ``Client.aio.models.
generate_content`` (contents with user/model roles, function_call / function_response parts).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING, Any

import httpx

from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult, TextDeltaCallback, token_count
from chatflow_agent.exceptions import DependencyError, ProviderError
from chatflow_agent.types import Message, ModelCallUsage, Role, ToolCall

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["GeminiEngine", "usage_from_gemini"]


def _import_sdk() -> tuple[Any, Any, Any]:
    try:
        from google import genai
        from google.genai import errors, types
    except ImportError as err:
        raise DependencyError("GeminiEngine", "google-genai", "pip install google-genai") from err
    return genai, types, errors


def _to_contents(types: Any, history: list[Message]) -> list[Any]:
    """Gemini ``Content`` list: USER → user text, MODEL → model text/function calls, TOOL → user responses."""
    contents: list[Any] = []
    for msg in history:
        parts: list[Any] = []
        role = "user"
        if msg.role == Role.USER and msg.content:
            parts.append(types.Part.from_text(text=msg.content))
        elif msg.role == Role.MODEL:
            role = "model"
            if msg.content:
                parts.append(types.Part.from_text(text=msg.content))
            parts.extend(types.Part.from_function_call(name=c.name, args=c.args) for c in msg.tool_calls or [])
        elif msg.role == Role.TOOL:
            for res in msg.tool_results or []:
                payload = res.content if isinstance(res.content, dict) else {"output": res.content}
                parts.append(types.Part.from_function_response(name=res.name, response=payload))
        if parts:
            contents.append(types.Content(role=role, parts=parts))
    return contents


class GeminiEngine(BaseEngine):
    """Google Gemini (constructor as in 0.3.4).

    Key: ``api_key``, else ``GEMINI_API_KEY`` / ``GOOGLE_API_KEY``, read at the first call.
    Retries are the SDK's (``HttpRetryOptions``: ``max_retries`` retries, ``base_delay`` …
    ``max_delay`` seconds). First call without the SDK → ``DependencyError``; without a key →
    ``ProviderError``; SDK errors → ``ProviderError``. A test may set ``engine.client``.
    """

    provider = "gemini"

    def __init__(
        self,
        api_key: str | None = None,
        timeout_seconds: float = 30.0,
        max_retries: int = 3,
        base_delay: float = 1.0,
        max_delay: float = 10.0,
    ) -> None:
        self.api_key = api_key
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.client: Any | None = None

    def _ensure_client(self, genai: Any, types: Any) -> Any:
        if self.client is not None:
            return self.client
        key = self.api_key or os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY")
        if not key:
            raise ProviderError(
                "Gemini API key is not configured. Set the GEMINI_API_KEY environment variable "
                "or pass api_key to GeminiEngine (or to the Agent)."
            )
        retry = types.HttpRetryOptions(
            attempts=self.max_retries + 1, initial_delay=self.base_delay, max_delay=self.max_delay
        )
        # The SDK's own httpx client, explicitly: with aiohttp installed (the site sends replies with it) the SDK
        # would switch its async calls to a ClientSession subclass that aiohttp deprecates.
        options = types.HttpOptions(timeout=int(self.timeout_seconds * 1000), retry_options=retry,
                                    httpx_async_client=httpx.AsyncClient(timeout=self.timeout_seconds))
        self.client = genai.Client(api_key=key, http_options=options)
        return self.client

    def _call(self, agent: Agent, history: list[Message]) -> tuple[Any, Any, dict[str, Any]]:
        """(client, SDK errors module, ``generate_content`` keyword arguments)."""
        genai, types, errors = _import_sdk()
        client = self._ensure_client(genai, types)
        tools = agent.get_all_tools()
        config = types.GenerateContentConfig(
            system_instruction=agent.get_instructions() or None,
            tools=[types.Tool(function_declarations=[t.to_gemini_declaration() for t in tools])] if tools else None,
        )
        return client, errors, {"model": agent.model, "contents": _to_contents(types, history), "config": config}

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """One ``generate_content`` call with the agent's instructions and tools; ``usage`` from the
        response's ``usageMetadata`` (see :func:`usage_from_gemini`)."""
        client, errors, request = self._call(agent, history)
        started = time.perf_counter()
        try:
            response = await client.aio.models.generate_content(**request)
        except errors.APIError as err:
            raise ProviderError(f"Gemini API request failed (HTTP {err.code}): {err.message}") from err
        except Exception as err:  # transport errors come from httpx/aiohttp underneath the SDK
            raise ProviderError(f"Gemini API request failed: {type(err).__name__}: {err}") from err
        result = _result(response)
        result.usage = usage_from_gemini(response, model=agent.model, latency_ms=(time.perf_counter() - started) * 1000)
        return result

    async def stream_turn_async(
        self, agent: Agent, history: list[Message], on_text_delta: TextDeltaCallback
    ) -> EngineTurnResult:
        """A streamed ``generate_content_stream`` call: ``on_text_delta`` per text part as it arrives;
        function calls and the last chunk's ``usageMetadata`` kept. ``raw_response`` is the list of
        chunks. Errors as in :meth:`generate_turn_async`, including a stream cut off midway.

        A ``client`` set by a test that is not the SDK's ``genai.Client`` (0.3.4 tests mock
        ``aio.models.generate_content`` alone) is not streamed: the call is :meth:`generate_turn_async`.
        """
        genai, _types, _errors = _import_sdk()
        if self.client is not None and not isinstance(self.client, genai.Client):
            return await self.generate_turn_async(agent, history)
        client, errors, request = self._call(agent, history)
        started = time.perf_counter()
        first: float | None = None
        chunks: list[Any] = []
        text: list[str] = []
        calls: list[ToolCall] = []
        try:
            async for chunk in await client.aio.models.generate_content_stream(**request):
                chunks.append(chunk)
                piece = _result(chunk)
                if first is None and (piece.text or piece.tool_calls):
                    first = time.perf_counter()
                calls.extend(piece.tool_calls)
                if piece.text:
                    text.append(piece.text)
                    await on_text_delta(piece.text)
        except errors.APIError as err:
            raise ProviderError(f"Gemini API request failed (HTTP {err.code}): {err.message}") from err
        except ProviderError:
            raise
        except Exception as err:  # transport errors come from httpx/aiohttp underneath the SDK
            raise ProviderError(f"Gemini API request failed: {type(err).__name__}: {err}") from err
        usage = usage_from_gemini(
            chunks[-1] if chunks else None, model=agent.model, latency_ms=(time.perf_counter() - started) * 1000,
            ttft_ms=None if first is None else (first - started) * 1000,
            finish_reason=next((r for c in reversed(chunks) if (r := _finish_reason(c))), None),
        )
        return EngineTurnResult(text="".join(text) or None, tool_calls=calls, raw_response=chunks, usage=usage)


def _finish_reason(response: Any) -> str | None:
    candidate = response.candidates[0] if getattr(response, "candidates", None) else None
    reason = getattr(candidate, "finish_reason", None)
    return None if reason is None else str(getattr(reason, "value", reason))


def usage_from_gemini(response: Any, *, model: str | None, latency_ms: float | None = None,
                      ttft_ms: float | None = None, finish_reason: str | None = None) -> ModelCallUsage:
    """A :class:`ModelCallUsage` from a ``GenerateContentResponse`` (or the last streamed chunk).

    Source: https://ai.google.dev/api/generate-content#UsageMetadata — ``promptTokenCount`` (the
    cached content included) plus ``toolUsePromptTokenCount`` is the input; ``candidatesTokenCount``
    plus ``thoughtsTokenCount`` (billed as output) the output; ``cachedContentTokenCount`` the
    cached part. The SDK's ``HttpRetryOptions`` retries do not report their count: ``retries`` is
    ``None``. ``finish_reason`` defaults to the first candidate's (``"STOP"``, ``"MAX_TOKENS"`` …).
    """
    meta = getattr(response, "usage_metadata", None)

    def count(name: str) -> int | None:
        return token_count(getattr(meta, name, None))

    prompt, tool_prompt = count("prompt_token_count"), count("tool_use_prompt_token_count")
    candidates, thoughts = count("candidates_token_count"), count("thoughts_token_count")
    return ModelCallUsage(
        provider="gemini", model=getattr(response, "model_version", None) or model,
        input_tokens=None if prompt is None else prompt + (tool_prompt or 0),
        output_tokens=None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0),
        cached_tokens=count("cached_content_token_count"), latency_ms=latency_ms, ttft_ms=ttft_ms,
        finish_reason=finish_reason or (_finish_reason(response) if response is not None else None),
    )


def _result(response: Any) -> EngineTurnResult:
    text: list[str] = []
    calls: list[ToolCall] = []
    candidate = response.candidates[0] if response.candidates else None
    parts = candidate.content.parts if candidate and candidate.content and candidate.content.parts else []
    for part in parts:
        if part.text:
            text.append(part.text)
        if part.function_call:
            fc = part.function_call
            # Gemini ids are optional; a unique one keeps each call paired with its own result.
            call_id = getattr(fc, "id", None) or f"call_{uuid.uuid4().hex[:24]}"
            calls.append(ToolCall(id=call_id, name=str(fc.name or ""), args=dict(fc.args or {})))
    return EngineTurnResult(text="".join(text) if text else None, tool_calls=calls, raw_response=response)
