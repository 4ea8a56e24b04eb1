"""OpenAIEngine against a real chat completions server on 127.0.0.1 (stdlib http.server in a thread).

The SDK is not patched: every behaviour goes through HTTP. All keys are fictitious.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines import OpenAIEngine
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.types import Message, Role, ToolCall, ToolResult
from tests.chatflow_agent.provider_server import FakeProvider

FakeOpenAI = FakeProvider

ENV_KEY = "sk-FAKE-env-openai-0000"
EXPLICIT_KEY = "sk-FAKE-explicit-0000"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_BASE_URL")) or name.startswith(("OPENAI_", "ANTHROPIC_")):
            monkeypatch.delenv(name)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": choices,
        **extra,
    }


def order_agent() -> Agent:
    agent = Agent(name="Support", instructions="You answer order questions.", model="gpt-4o-mini")

    @agent.tool
    def check_order_status(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "IN_TRANSIT"}

    return agent


def engine_for(server: FakeOpenAI, **kwargs: Any) -> OpenAIEngine:
    kwargs.setdefault("api_key", EXPLICIT_KEY)
    return OpenAIEngine(base_url=server.url, **kwargs)


USER_ONLY = [Message(role=Role.USER, content="where is order 404?")]


# --- Plain answers and tool calls -------------------------------------------------------------


@pytest.mark.asyncio
async def test_it_returns_the_text_answer_and_sends_the_key_as_bearer(server: FakeOpenAI) -> None:
    server.reply(completion({"content": "It is on its way."}))

    result = await engine_for(server).generate_turn_async(order_agent(), USER_ONLY)

    assert result.text == "It is on its way."
    assert result.tool_calls == []
    assert result.raw_response["usage"]["total_tokens"] == 15
    [request] = server.received
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {EXPLICIT_KEY}"
    assert request.body["model"] == "gpt-4o-mini"


@pytest.mark.asyncio
async def test_it_sends_instructions_tools_and_well_formed_history(server: FakeOpenAI) -> None:
    server.reply(completion({"content": "Anything else?"}))
    agent = order_agent()
    history = [
        Message(role=Role.USER, content="where are orders 1 and 2?"),
        Message(
            role=Role.MODEL,
            tool_calls=[
                ToolCall(id="c1", name="check_order_status", args={"order_id": "1"}),
                ToolCall(id="c2", name="check_order_status", args={"order_id": "2"}),
            ],
        ),
        Message(
            role=Role.TOOL,
            tool_results=[
                ToolResult(tool_call_id="c1", name="check_order_status", content={"status": "SHIPPED"}),
                ToolResult(tool_call_id="c2", name="check_order_status", content="not found", is_error=True),
            ],
        ),
        Message(role=Role.MODEL, content="Order 1 shipped; order 2 was not found."),
        Message(role=Role.USER, content="thanks"),
    ]

    await engine_for(server).generate_turn_async(agent, history)

    body = server.received[0].body
    assert body["messages"] == [
        {"role": "system", "content": "You answer order questions."},
        {"role": "user", "content": "where are orders 1 and 2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "check_order_status", "arguments": '{"order_id": "1"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "check_order_status", "arguments": '{"order_id": "2"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "SHIPPED"}'},
        {"role": "tool", "tool_call_id": "c2", "content": "not found"},
        {"role": "assistant", "content": "Order 1 shipped; order 2 was not found."},
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == [agent.tools[0].to_openai_tool()]
    assert body["tools"][0]["function"]["parameters"]["properties"]["order_id"]["type"] == "string"
    assert body["tool_choice"] == "auto"


@pytest.mark.asyncio
async def test_it_parses_parallel_tool_calls_and_keeps_bad_arguments_raw(server: FakeOpenAI) -> None:
    server.reply(
        completion(
            {
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "check_order_status", "arguments": '{"order_id": "7"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "check_order_status", "arguments": "{oops"},
                    },
                ],
            },
            finish_reason="tool_calls",
        )
    )

    result = await engine_for(server).generate_turn_async(order_agent(), USER_ONLY)

    assert result.text is None
    assert [(c.id, c.name, c.args) for c in result.tool_calls] == [
        ("call_a", "check_order_status", {"order_id": "7"}),
        ("call_b", "check_order_status", {"raw_input": "{oops"}),
    ]


# --- Streaming ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_it_streams_text_deltas_as_they_arrive(server: FakeOpenAI) -> None:
    server.reply_stream(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Order 404 "}),
            chunk({"content": "is on "}),
            chunk({"content": "its way."}),
            chunk({}, finish_reason="stop"),
            chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}),
        ]
    )
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    result = await engine_for(server).stream_turn_async(order_agent(), USER_ONLY, on_delta)

    assert deltas == ["Order 404 ", "is on ", "its way."]
    assert result.text == "Order 404 is on its way."
    assert result.tool_calls == []
    assert result.raw_response["usage"]["total_tokens"] == 7
    assert server.received[0].body["stream"] is True


@pytest.mark.asyncio
async def test_it_assembles_streamed_tool_call_fragments(server: FakeOpenAI) -> None:
    def call_delta(index: int, **fields: Any) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, **fields}]}

    server.reply_stream(
        [
            chunk({"role": "assistant", "content": None}),
            chunk(
                call_delta(0, id="call_a", type="function", function={"name": "check_order_status", "arguments": ""})
            ),
            chunk(call_delta(0, function={"arguments": '{"order_'})),
            chunk(
                call_delta(
                    1, id="call_b", type="function", function={"name": "check_order_status", "arguments": '{"ord'}
                )
            ),
            chunk(call_delta(0, function={"arguments": 'id": "1"}'})),
            chunk(call_delta(1, function={"arguments": 'er_id": "2"}'})),
            chunk({}, finish_reason="tool_calls"),
        ]
    )
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    result = await engine_for(server).stream_turn_async(order_agent(), USER_ONLY, on_delta)

    assert deltas == []
    assert result.text is None
    assert [(c.id, c.args) for c in result.tool_calls] == [("call_a", {"order_id": "1"}), ("call_b", {"order_id": "2"})]
    assert result.raw_response["choices"][0]["finish_reason"] == "tool_calls"


# --- Errors and the SDK's retries ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_it_retries_a_rate_limit_then_succeeds(server: FakeOpenAI) -> None:
    server.reply({"error": {"message": "slow down", "type": "rate_limit"}}, status=429, retry_after_ms="1")
    server.reply(completion({"content": "Back again."}))

    result = await engine_for(server, max_retries=2).generate_turn_async(order_agent(), USER_ONLY)

    assert result.text == "Back again."
    assert len(server.received) == 2


@pytest.mark.asyncio
async def test_a_persistent_server_error_becomes_provider_error_after_retries(server: FakeOpenAI) -> None:
    for _ in range(3):
        server.reply({"error": {"message": "boom"}}, status=500, retry_after_ms="1")

    with pytest.raises(ProviderError, match=r"HTTP 500") as exc_info:
        await engine_for(server, max_retries=2).generate_turn_async(order_agent(), USER_ONLY)

    assert len(server.received) == 3
    assert EXPLICIT_KEY not in str(exc_info.value)


@pytest.mark.asyncio
async def test_a_client_error_is_not_retried(server: FakeOpenAI) -> None:
    server.reply({"error": {"message": "bad key"}}, status=401)

    with pytest.raises(ProviderError, match=r"HTTP 401.*bad key"):
        await engine_for(server, max_retries=2).generate_turn_async(order_agent(), USER_ONLY)

    assert len(server.received) == 1


@pytest.mark.asyncio
async def test_a_refused_connection_becomes_provider_error() -> None:
    with FakeOpenAI() as closed:
        url = closed.url  # the port is free again once the server has stopped
    engine = OpenAIEngine(base_url=url, api_key=EXPLICIT_KEY, max_retries=0)

    with pytest.raises(ProviderError, match="connection error"):
        await engine.generate_turn_async(order_agent(), USER_ONLY)


@pytest.mark.asyncio
async def test_a_redirect_is_not_followed(server: FakeOpenAI) -> None:
    server.reply(status=307, Location="http://127.0.0.1:9/collect")

    with pytest.raises(ProviderError, match="redirected"):
        await engine_for(server, max_retries=0).generate_turn_async(order_agent(), USER_ONLY)

    assert len(server.received) == 1


# --- Keys: an environment key reaches only its own provider ------------------------------------


def test_it_constructs_without_any_key() -> None:
    assert OpenAIEngine().api_key is None
    assert OpenAIEngine(base_url="https://proxy.example.com/v1").api_key is None


@pytest.mark.asyncio
async def test_a_missing_key_is_reported_at_the_first_call() -> None:
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        await OpenAIEngine().generate_turn_async(order_agent(), USER_ONLY)


@pytest.mark.asyncio
async def test_the_environment_key_is_not_sent_to_a_custom_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    engine = OpenAIEngine(base_url="https://proxy.example.com/v1")

    with pytest.raises(ProviderError, match="custom or unofficial base_url") as exc_info:
        await engine.generate_turn_async(order_agent(), USER_ONLY)

    assert ENV_KEY not in str(exc_info.value)
    assert "pass api_key explicitly" in str(exc_info.value).lower()


@pytest.mark.asyncio
async def test_the_environment_key_is_not_sent_to_a_local_server(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("OPENAI_ORG_ID", "org-FAKE")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)  # the base URL may come from the environment too
    server.reply(completion({"content": "local"}))

    result = await OpenAIEngine().generate_turn_async(order_agent(), USER_ONLY)

    assert result.text == "local"
    headers = server.received[0].headers
    assert ENV_KEY not in json.dumps(headers)
    assert "openai-organization" not in headers


@pytest.mark.asyncio
async def test_an_explicit_empty_key_sends_no_credential(server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    server.reply(completion({"content": "ok"}))

    await engine_for(server, api_key="").generate_turn_async(order_agent(), USER_ONLY)

    assert "authorization" not in server.received[0].headers


def test_the_environment_key_is_used_for_the_official_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("XAI_API_KEY", "sk-FAKE-xai")

    assert OpenAIEngine().api_key == ENV_KEY
    assert OpenAIEngine(provider="grok").api_key == "sk-FAKE-xai"
    assert OpenAIEngine(provider="grok").base_url == "https://api.x.ai/v1"
    assert OpenAIEngine(provider="openai", base_url="https://api.x.ai/v1").api_key is None


# --- Usage: tokens, latency, time to first token, finish reason, retries ------------------------


@pytest.mark.asyncio
async def test_it_reports_the_usage_of_a_completion(server: FakeOpenAI) -> None:
    body = completion({"content": "It is on its way."})
    body["usage"] = {"prompt_tokens": 1200, "completion_tokens": 40, "total_tokens": 1240,
                     "prompt_tokens_details": {"cached_tokens": 1024}}
    server.reply(body)

    usage = (await engine_for(server).generate_turn_async(order_agent(), USER_ONLY)).usage

    assert usage is not None
    assert (usage.provider, usage.model) == ("openai", "gpt-4o-mini")
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (1200, 40, 1024)
    assert usage.finish_reason == "stop"
    assert usage.retries == 0
    assert usage.latency_ms is not None and usage.latency_ms > 0
    assert usage.ttft_ms is None  # not streamed
    assert usage.cost is None  # the Runner prices it, not the engine


@pytest.mark.asyncio
async def test_a_completion_without_usage_reports_unknown_counts(server: FakeOpenAI) -> None:
    body = completion({"content": "ok"})
    del body["usage"]
    server.reply(body)

    usage = (await engine_for(server).generate_turn_async(order_agent(), USER_ONLY)).usage

    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (None, None, None)


@pytest.mark.asyncio
async def test_the_usage_counts_the_sdk_retries(server: FakeOpenAI) -> None:
    server.reply({"error": {"message": "slow down"}}, status=429, retry_after_ms="1")
    server.reply(completion({"content": "Back again."}))

    usage = (await engine_for(server, max_retries=2).generate_turn_async(order_agent(), USER_ONLY)).usage

    assert usage is not None and usage.retries == 1


@pytest.mark.asyncio
async def test_a_stream_asks_for_usage_and_reports_it_with_the_time_to_first_token(server: FakeOpenAI) -> None:
    server.reply_stream(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Order 404 "}),
            chunk({"content": "is on its way."}),
            chunk({}, finish_reason="stop"),
            chunk(None, usage={"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
                               "prompt_tokens_details": {"cached_tokens": 0}}),
        ]
    )

    async def on_delta(text: str) -> None:
        pass

    usage = (await engine_for(server).stream_turn_async(order_agent(), USER_ONLY, on_delta)).usage

    assert server.received[0].body["stream_options"] == {"include_usage": True}
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (30, 7, 0)
    assert usage.finish_reason == "stop"
    assert usage.ttft_ms is not None and usage.latency_ms is not None
    assert 0 < usage.ttft_ms <= usage.latency_ms


@pytest.mark.asyncio
async def test_a_stream_without_the_usage_chunk_reports_unknown_counts(server: FakeOpenAI) -> None:
    server.reply_stream([chunk({"content": "hi"}), chunk({}, finish_reason="length")])

    async def on_delta(text: str) -> None:
        pass

    usage = (await engine_for(server).stream_turn_async(order_agent(), USER_ONLY, on_delta)).usage

    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (None, None)
    assert usage.finish_reason == "length"
