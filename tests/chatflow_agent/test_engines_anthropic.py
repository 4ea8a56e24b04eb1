"""AnthropicEngine against a real Messages API server on 127.0.0.1: answers, streams and their usage.

Needs the optional ``anthropic`` SDK (skipped without it). Wire shapes from
https://docs.anthropic.com/en/api/messages and https://docs.anthropic.com/en/docs/build-with-claude/streaming.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chatflow_agent import Agent, PriceBook, Runner
from chatflow_agent.core.engines import AnthropicEngine
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.types import Message, Role
from tests.chatflow_agent.provider_server import FakeProvider

pytest.importorskip("anthropic", reason="AnthropicEngine runs on the optional anthropic SDK")

MODEL = "claude-haiku-4-5"
USER_ONLY = [Message(role=Role.USER, content="where is order 7?")]


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def agent(server: FakeProvider) -> Agent:
    a = Agent(name="Support", instructions="Answer order questions.", model=MODEL,
              engine=AnthropicEngine(base_url=server.url, api_key="sk-ant-FAKE", max_retries=1))

    @a.tool
    def check_order_status(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "IN_TRANSIT"}

    return a


def message(text: str, **usage: int) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0, **usage}}


def stream_events(*, input_tokens: int, cache_read: int, output_tokens: int) -> list[dict[str, Any]]:
    start = message("", input_tokens=input_tokens, cache_read_input_tokens=cache_read, output_tokens=1)
    start["content"], start["stop_reason"] = [], None
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me check "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "order 7."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "check_order_status", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"order'}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '_id": "7"}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]


@pytest.mark.asyncio
async def test_it_reports_the_usage_of_a_message_the_whole_prompt_as_input(server: FakeProvider) -> None:
    server.reply(message("It is on its way.", input_tokens=50, cache_read_input_tokens=200,
                         cache_creation_input_tokens=30, output_tokens=12))

    a = agent(server)
    result = await a.engine.generate_turn_async(a, USER_ONLY)  # type: ignore[union-attr]

    assert result.text == "It is on its way."
    usage = result.usage
    assert usage is not None
    assert (usage.provider, usage.model, usage.finish_reason, usage.retries) == ("anthropic", MODEL, "end_turn", 0)
    assert (usage.input_tokens, usage.cached_tokens, usage.cache_write_tokens, usage.output_tokens) == (
        280, 200, 30, 12)
    assert usage.latency_ms is not None and usage.ttft_ms is None
    assert server.received[0].path == "/v1/messages"


@pytest.mark.asyncio
async def test_a_stream_reports_text_tool_calls_and_the_usage_of_its_start_and_delta_events(
    server: FakeProvider,
) -> None:
    server.reply_stream(stream_events(input_tokens=40, cache_read=0, output_tokens=25), named_events=True,
                        done=False)
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    a = agent(server)
    result = await a.engine.stream_turn_async(a, USER_ONLY, on_delta)  # type: ignore[union-attr]

    assert server.received[0].body["stream"] is True
    assert deltas == ["Let me check ", "order 7."]
    assert [(c.id, c.name, c.args) for c in result.tool_calls] == [("toolu_1", "check_order_status", {"order_id": "7"})]
    usage = result.usage
    assert usage is not None
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (40, 0, 25)
    assert usage.finish_reason == "tool_use"
    assert usage.ttft_ms is not None and usage.latency_ms is not None and usage.ttft_ms <= usage.latency_ms


@pytest.mark.asyncio
async def test_a_turn_on_claude_is_priced_by_genai_prices(server: FakeProvider) -> None:
    from genai_prices import Usage, calc_price

    server.reply_stream(stream_events(input_tokens=40, cache_read=100, output_tokens=25), named_events=True,
                        done=False)
    server.reply_stream([
        {"type": "message_start", "message": {**message("", input_tokens=90, output_tokens=1), "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "In transit."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}},
        {"type": "message_stop"},
    ], named_events=True, done=False)

    usage = (await Runner(agent(server), prices=PriceBook()).run_async("s1", "where is order 7?")).usage

    assert usage is not None
    assert [(c.input_tokens, c.output_tokens) for c in usage.calls] == [(140, 25), (90, 4)]
    expected = [calc_price(Usage(input_tokens=140, cache_read_tokens=100, output_tokens=25), MODEL,
                           provider_id="anthropic").total_price,
                calc_price(Usage(input_tokens=90, output_tokens=4), MODEL, provider_id="anthropic").total_price]
    assert [c.cost for c in usage.calls] == expected
    assert usage.cost == sum(expected)


@pytest.mark.asyncio
async def test_an_api_error_becomes_provider_error(server: FakeProvider) -> None:
    server.reply({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}, status=400)

    a = agent(server)
    with pytest.raises(ProviderError, match="HTTP 400"):
        await a.engine.generate_turn_async(a, USER_ONLY)  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_an_explicit_empty_key_sends_no_credential_header(server: FakeProvider) -> None:
    server.reply(message("Hello.", input_tokens=5, output_tokens=1))
    a = Agent(name="Support", instructions="x", model=MODEL,
              engine=AnthropicEngine(base_url=server.url, api_key="", max_retries=0))

    result = await a.engine.generate_turn_async(a, USER_ONLY)  # type: ignore[union-attr]

    assert result.text == "Hello."
    headers = {k.lower() for k in server.received[0].headers}
    assert "x-api-key" not in headers and "authorization" not in headers


@pytest.mark.asyncio
async def test_a_redirect_is_not_followed_and_says_so(server: FakeProvider) -> None:
    server.reply({}, status=307, Location=f"{server.root}/elsewhere/v1/messages")

    a = agent(server)
    with pytest.raises(ProviderError, match=r"redirected the request \(HTTP 307\)") as caught:
        await a.engine.generate_turn_async(a, USER_ONLY)  # type: ignore[union-attr]

    assert [r.path for r in server.received] == ["/v1/messages"]
    assert "sk-ant-FAKE" not in str(caught.value)
