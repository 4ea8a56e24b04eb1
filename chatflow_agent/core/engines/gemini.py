"""Google Gemini engine on the ``google-genai`` SDK (an optional extra: ``pip install google-genai``).

The SDK is imported at the first call, so the class constructs (and can be subclassed, as
0.3.4's tests do) without it. Source for the wire shapes: google-genai ``Client.aio.models.
generate_content`` (contents with user/model roles, function_call / function_response parts).
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any

from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.exceptions import DependencyError, ProviderError
from chatflow_agent.types import Message, Role, ToolCall

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["GeminiEngine"]


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
        options = types.HttpOptions(timeout=int(self.timeout_seconds * 1000), retry_options=retry)
        self.client = genai.Client(api_key=key, http_options=options)
        return self.client

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        """One ``generate_content`` call with the agent's instructions and tools."""
        genai, types, errors = _import_sdk()
        client = self._ensure_client(genai, types)
        tools = agent.get_all_tools()
        config = types.GenerateContentConfig(
            system_instruction=agent.get_instructions() or None,
            tools=[types.Tool(function_declarations=[t.to_gemini_declaration() for t in tools])] if tools else None,
        )
        try:
            response = await client.aio.models.generate_content(
                model=agent.model, contents=_to_contents(types, history), config=config
            )
        except errors.APIError as err:
            raise ProviderError(f"Gemini API request failed (HTTP {err.code}): {err.message}") from err
        except Exception as err:  # transport errors come from httpx/aiohttp underneath the SDK
            raise ProviderError(f"Gemini API request failed: {type(err).__name__}: {err}") from err
        return _result(response)


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
