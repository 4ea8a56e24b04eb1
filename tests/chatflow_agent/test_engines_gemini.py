"""GeminiEngine against a real Gemini API server on 127.0.0.1: answers, streams and their usage.

Needs the optional ``google-genai`` SDK (skipped without it); the engine's ``client`` is an SDK client
whose ``base_url`` is the loopback server. Wire shapes: https://ai.google.dev/api/generate-content
(``GenerateContentResponse``, ``usageMetadata``; streamed as SSE by ``streamGenerateContent?alt=sse``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chatflow_agent import Agent, PriceBook, Runner
from chatflow_agent.core.engines import GeminiEngine
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.types import Message, Role
from tests.chatflow_agent.provider_server import FakeProvider

genai = pytest.importorskip("google.genai", reason="GeminiEngine runs on the optional google-genai SDK")

MODEL = "gemini-2.0-flash"
USER_ONLY = [Message(role=Role.USER, content="where is order 7?")]


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def engine_for(server: FakeProvider) -> GeminiEngine:
    engine = GeminiEngine(api_key="FAKE-gemini")
    # httpx, as the engine's own client uses (with aiohttp installed the SDK would otherwise take aiohttp)
    engine.client = genai.Client(api_key="FAKE-gemini", http_options=genai.types.HttpOptions(
        base_url=server.root, api_version="v1beta", retry_options=genai.types.HttpRetryOptions(attempts=1),
        httpx_async_client=httpx.AsyncClient()))
    return engine


def agent(server: FakeProvider) -> Agent:
    a = Agent(name="Support", instructions="Answer order questions.", model=MODEL, engine=engine_for(server))

    @a.tool
    def check_order_status(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "IN_TRANSIT"}

    return a


def response(parts: list[dict[str, Any]], finish: str | None = "STOP", **usage: int) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL}
    if usage:
        body["usageMetadata"] = usage
    return body


@pytest.mark.asyncio
async def test_it_reports_the_usage_metadata_of_a_response(server: FakeProvider) -> None:
    server.reply(response([{"text": "It is on its way."}], promptTokenCount=1200, cachedContentTokenCount=1000,
                          candidatesTokenCount=30, thoughtsTokenCount=12, totalTokenCount=1242))

    a = agent(server)
    result = await a.engine.generate_turn_async(a, USER_ONLY)  # type: ignore[union-attr]

    assert result.text == "It is on its way."
    usage = result.usage
    assert usage is not None
    assert (usage.provider, usage.model, usage.finish_reason) == ("gemini", MODEL, "STOP")
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (1200, 1000, 42)  # thoughts billed
    assert usage.latency_ms is not None and usage.ttft_ms is None and usage.retries is None
    assert server.received[0].path.endswith(f"/models/{MODEL}:generateContent")


@pytest.mark.asyncio
async def test_a_stream_reports_its_deltas_function_calls_and_the_last_chunks_usage(server: FakeProvider) -> None:
    server.reply_stream([
        response([{"text": "Let me check "}], finish=None, promptTokenCount=40, candidatesTokenCount=2),
        response([{"text": "order 7."}], finish=None, promptTokenCount=40, candidatesTokenCount=4),
        response([{"functionCall": {"name": "check_order_status", "args": {"order_id": "7"}}}],
                 promptTokenCount=40, candidatesTokenCount=9, totalTokenCount=49),
    ], done=False)
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    a = agent(server)
    result = await a.engine.stream_turn_async(a, USER_ONLY, on_delta)  # type: ignore[union-attr]

    assert ":streamGenerateContent" in server.received[0].path
    assert deltas == ["Let me check ", "order 7."]
    assert [(c.name, c.args) for c in result.tool_calls] == [("check_order_status", {"order_id": "7"})]
    usage = result.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (40, 9, None)
    assert usage.finish_reason == "STOP"
    assert usage.ttft_ms is not None and usage.latency_ms is not None and usage.ttft_ms <= usage.latency_ms


@pytest.mark.asyncio
async def test_a_turn_on_gemini_is_priced_by_genai_prices(server: FakeProvider) -> None:
    from genai_prices import Usage, calc_price

    server.reply_stream([response([{"text": "In transit."}], promptTokenCount=300, candidatesTokenCount=5)],
                        done=False)

    usage = (await Runner(agent(server), prices=PriceBook()).run_async("s1", "where is order 7?")).usage

    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (300, 5)
    assert usage.cost == calc_price(Usage(input_tokens=300, output_tokens=5), MODEL, provider_id="google").total_price


@pytest.mark.asyncio
async def test_an_api_error_becomes_provider_error(server: FakeProvider) -> None:
    server.reply({"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}, status=400)

    a = agent(server)
    with pytest.raises(ProviderError, match="HTTP 400"):
        await a.engine.generate_turn_async(a, USER_ONLY)  # type: ignore[union-attr]
