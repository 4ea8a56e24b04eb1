"""Usage and cost of model calls: the price book, and the Runner reporting each call and the turn's totals.

Costs are checked against genai-prices' own calculation for the same tokens (never a hard-coded
figure: the library's prices move). The provider is a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from chatflow_agent import Agent, ModelCallUsage, ModelPrice, PriceBook, Runner, TurnUsage
from chatflow_agent.core.engines import DemoEngine, OpenAIEngine
from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_agent.core.events import RunEvent, TurnCompleted, TurnFailed
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.pricing import PRICES_ENV
from chatflow_agent.types import ToolCall
from tests.chatflow_agent.provider_server import FakeProvider


def library_cost(model: str, provider_id: str, **tokens: int) -> Decimal:
    return Decimal(calc_price(Usage(**tokens), model, provider_id=provider_id).total_price)


def call_usage(**fields: Any) -> ModelCallUsage:
    return ModelCallUsage(**{"provider": "openai", "model": "gpt-4o-mini", "input_tokens": 1000,
                             "output_tokens": 200, **fields})


@pytest.fixture(autouse=True)
def no_price_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_ENV, raising=False)
    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_BASE_URL")):
            monkeypatch.delenv(name)


# ---- the price book ---------------------------------------------------------------------------


def test_a_known_model_costs_what_genai_prices_says() -> None:
    usage = call_usage(cached_tokens=600)

    assert PriceBook().cost(usage) == library_cost("gpt-4o-mini", "openai", input_tokens=1000, output_tokens=200,
                                                  cache_read_tokens=600)


def test_provider_names_map_to_the_librarys_ids() -> None:
    book = PriceBook()
    gemini = ModelCallUsage(provider="gemini", model="gemini-2.0-flash", input_tokens=1000, output_tokens=10)
    claude = ModelCallUsage(provider="anthropic", model="claude-3-5-haiku-latest", input_tokens=1000,
                            output_tokens=10, cached_tokens=100, cache_write_tokens=200)

    assert book.cost(gemini) == library_cost("gemini-2.0-flash", "google", input_tokens=1000, output_tokens=10)
    assert book.cost(claude) == library_cost("claude-3-5-haiku-latest", "anthropic", input_tokens=1000,
                                             output_tokens=10, cache_read_tokens=100, cache_write_tokens=200)


@pytest.mark.parametrize("usage", [
    call_usage(model="no-such-model-anywhere"),
    call_usage(provider="ollama", model="llama3.2"),  # a local server: no price to know
    call_usage(provider=None),  # a provider-agnostic engine (scripted, demo)
    call_usage(input_tokens=None),  # the provider did not say
    call_usage(estimated=True),
], ids=["unknown-model", "local-provider", "no-provider", "unknown-tokens", "estimate"])
def test_what_cannot_be_priced_has_no_cost_never_zero(usage: ModelCallUsage) -> None:
    assert PriceBook().cost(usage) is None


def test_an_override_wins_over_the_library_and_prices_cached_tokens_apart() -> None:
    book = PriceBook({"gpt-4o-mini": {"input": "2", "output": "10", "cached_input": "0.5"}})

    cost = book.cost(call_usage(cached_tokens=400))

    assert cost == (600 * Decimal(2) + 400 * Decimal("0.5") + 200 * Decimal(10)) / 1_000_000
    assert cost != PriceBook().cost(call_usage(cached_tokens=400))


def test_an_override_prices_a_model_the_library_does_not_know() -> None:
    book = PriceBook({"house-model": ModelPrice(input=Decimal(1), output=Decimal(3))})

    assert book.cost(call_usage(provider=None, model="house-model")) == Decimal("0.0016")


def test_overrides_come_from_the_environment() -> None:
    book = PriceBook.from_env({PRICES_ENV: '{"gpt-4o-mini": {"input": 1, "output": 1}}'})

    assert book.cost(call_usage()) == Decimal("0.0012")
    assert PriceBook.from_env({PRICES_ENV: " "}).overrides == {}


@pytest.mark.parametrize("raw", ["not json", "[1]", '{"m": {"input": 1}}', '{"m": {"input": "x", "output": 1}}',
                                 '{"m": {"input": 1, "output": 1, "typo": 2}}'])
def test_a_malformed_environment_override_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=PRICES_ENV):
        PriceBook.from_env({PRICES_ENV: raw})


def test_turn_totals_are_unknown_unless_every_call_reported_them() -> None:
    priced = TurnUsage(calls=[call_usage(cost=Decimal("0.1")), call_usage(cost=Decimal("0.25"))])
    partly = TurnUsage(calls=[call_usage(cost=Decimal("0.1")), call_usage(cost=None, output_tokens=None)])

    assert (priced.input_tokens, priced.output_tokens, priced.cost) == (2000, 400, Decimal("0.35"))
    assert (partly.input_tokens, partly.output_tokens, partly.cost) == (2000, None, None)
    assert TurnUsage().cost is None
    dumped = priced.model_dump(mode="json")
    assert dumped["cost"] == "0.35" and dumped["currency"] == "USD"
    assert TurnUsage.model_validate(dumped) == priced


# ---- the Runner -------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def chunk(**fields: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini", **fields}


def answer(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
           prompt: int = 100, output: int = 20) -> list[dict[str, Any]]:
    """The chunks of a streamed answer (the Runner streams), ending with the usage chunk."""
    delta: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
    finish = "tool_calls" if tool_calls else "stop"
    return [chunk(choices=[{"index": 0, "delta": delta, "finish_reason": finish}]),
            chunk(choices=[], usage={"prompt_tokens": prompt, "completion_tokens": output,
                                     "total_tokens": prompt + output})]


def order_agent(server: FakeProvider, model: str = "gpt-4o-mini") -> Agent:
    agent = Agent(name="Support", instructions="Answer order questions.", model=model,
                  engine=OpenAIEngine(base_url=server.url, api_key="sk-FAKE"))

    @agent.tool
    def check_order_status(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "IN_TRANSIT"}

    return agent


TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "check_order_status", "arguments": '{"order_id": "7"}'}}


@pytest.mark.asyncio
async def test_a_turn_reports_each_model_call_and_its_totals_priced_by_genai_prices(server: FakeProvider) -> None:
    server.reply_stream(answer(tool_calls=[TOOL_CALL], prompt=100, output=20))
    server.reply_stream(answer("Order 7 is in transit.", prompt=150, output=12))
    runner = Runner(order_agent(server), prices=PriceBook())
    events: list[RunEvent] = []
    runner.subscribe(events.append)

    response = await runner.run_async("s1", "where is order 7?")

    completed = next(e for e in events if isinstance(e, TurnCompleted))
    assert completed.usage == response.usage
    usage = completed.usage
    assert [(c.input_tokens, c.output_tokens, c.finish_reason, c.agent_name) for c in usage.calls] == [
        (100, 20, "tool_calls", "Support"), (150, 12, "stop", "Support")]
    assert [c.cost for c in usage.calls] == [
        library_cost("gpt-4o-mini", "openai", input_tokens=100, output_tokens=20),
        library_cost("gpt-4o-mini", "openai", input_tokens=150, output_tokens=12)]
    assert (usage.input_tokens, usage.output_tokens) == (250, 32)
    assert usage.cost == sum((c.cost for c in usage.calls if c.cost is not None), Decimal(0))
    assert all(c.latency_ms is not None for c in usage.calls)


@pytest.mark.asyncio
async def test_a_streamed_turn_reports_the_usage_of_the_final_chunk(server: FakeProvider) -> None:
    server.reply_stream([
        chunk(choices=[{"index": 0, "delta": {"content": "On its "}, "finish_reason": None}]),
        chunk(choices=[{"index": 0, "delta": {"content": "way."}, "finish_reason": "stop"}]),
        chunk(choices=[], usage={"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}),
    ])
    runner = Runner(order_agent(server), prices=PriceBook())

    events = [e async for e in runner.run_streamed("s1", "where is order 7?")]

    completed = events[-1]
    assert isinstance(completed, TurnCompleted)
    [call] = completed.usage.calls
    assert (call.input_tokens, call.output_tokens, call.finish_reason) == (40, 3, "stop")
    assert call.ttft_ms is not None
    assert completed.usage.cost == library_cost("gpt-4o-mini", "openai", input_tokens=40, output_tokens=3)


@pytest.mark.asyncio
async def test_an_unknown_model_gives_tokens_but_no_cost(server: FakeProvider) -> None:
    server.reply_stream([{**c, "model": "house-model-1"} for c in answer("hi", prompt=9, output=2)])
    runner = Runner(order_agent(server, model="house-model-1"), prices=PriceBook())

    usage = (await runner.run_async("s1", "hello")).usage

    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cost) == (9, 2, None)


@pytest.mark.asyncio
async def test_the_override_wins_at_turn_time(server: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRICES_ENV, '{"gpt-4o-mini": {"input": "1", "output": "2"}}')
    server.reply_stream(answer("hi", prompt=1000, output=500))
    runner = Runner(order_agent(server))  # the default price book reads the environment

    usage = (await runner.run_async("s1", "hello")).usage

    assert usage is not None and usage.cost == Decimal("0.002")


@pytest.mark.asyncio
async def test_a_failed_turn_reports_the_calls_it_made(server: FakeProvider) -> None:
    server.reply_stream(answer(tool_calls=[TOOL_CALL], prompt=100, output=20))
    server.reply({"error": {"message": "bad request"}}, status=400)
    runner = Runner(order_agent(server), prices=PriceBook())
    events: list[RunEvent] = []
    runner.subscribe(events.append)

    with pytest.raises(ProviderError):
        await runner.run_async("s1", "where is order 7?")

    failed = events[-1]
    assert isinstance(failed, TurnFailed)
    # The call that failed is recorded too: what it used nobody reported, so the turn's total is unknown.
    assert [(c.input_tokens, c.output_tokens) for c in failed.usage.calls] == [(100, 20), (None, None)]
    assert failed.usage.calls[0].cost == library_cost("gpt-4o-mini", "openai", input_tokens=100, output_tokens=20)
    assert failed.usage.calls[1].model == "gpt-4o-mini" and failed.usage.calls[1].cost is None
    assert failed.usage.cost is None and failed.usage.input_tokens is None


@pytest.mark.asyncio
async def test_the_scripted_engine_reports_what_its_script_says() -> None:
    said = ModelCallUsage(provider="openai", model="gpt-4o-mini", input_tokens=10, output_tokens=5)
    engine = ScriptedEngine(EngineTurnResult(tool_calls=[ToolCall(id="c1", name="nothing")], usage=said), "done")
    runner = Runner(Agent(name="A", instructions="", model="gpt-4o-mini", engine=engine), prices=PriceBook())

    usage = (await runner.run_async("s1", "hi")).usage

    assert usage is not None
    assert [c.input_tokens for c in usage.calls] == [10, None]  # the "done" step reported nothing: unknown
    assert usage.calls[0].cost == library_cost("gpt-4o-mini", "openai", input_tokens=10, output_tokens=5)
    assert usage.calls[1].cost is None and usage.calls[1].agent_name == "A"
    assert usage.input_tokens is None and usage.cost is None  # never a partial sum passed off as the whole


@pytest.mark.asyncio
async def test_the_demo_engine_gives_deterministic_estimates_without_cost() -> None:
    async def one_turn() -> TurnUsage:
        runner = Runner(Agent(name="Support", instructions="Be brief.", model="gpt-4o-mini", engine=DemoEngine()),
                        prices=PriceBook())
        usage = (await runner.run_async("s1", "hello there")).usage
        assert usage is not None
        return usage

    first, second = await one_turn(), await one_turn()

    [call] = first.calls
    assert call.estimated and call.provider is None and call.finish_reason == "stop"
    assert call.input_tokens == math.ceil(len("Be brief.") / 4) + math.ceil(len("hello there") / 4)
    assert call.output_tokens is not None and call.output_tokens > 0
    assert [(c.input_tokens, c.output_tokens) for c in second.calls] == [(call.input_tokens, call.output_tokens)]
    assert first.cost is None  # an estimate is not a bill


@pytest.mark.asyncio
async def test_an_override_can_price_the_demo_estimates() -> None:
    book = PriceBook({"demo-model": {"input": 1, "output": 1}})
    runner = Runner(Agent(name="Support", instructions="", model="demo-model", engine=DemoEngine()), prices=book)

    usage = (await runner.run_async("s1", "hello")).usage

    assert usage is not None and usage.cost is not None and usage.cost > 0


# ---- the two model names of a call ------------------------------------------------------------
@pytest.mark.asyncio
async def test_an_override_keyed_by_the_configured_model_prices_calls_the_provider_names_otherwise(
        server: FakeProvider) -> None:
    dated = [{**c, "model": "house-model-2026-01-01"} for c in answer("hi", prompt=1000, output=500)]
    server.reply_stream(dated)
    book = PriceBook({"house-model": {"input": "1", "output": "2"}})
    runner = Runner(order_agent(server, model="house-model"), prices=book)

    usage = (await runner.run_async("s1", "hello")).usage

    assert usage is not None
    [call] = usage.calls
    assert call.model == "house-model-2026-01-01"  # the name the provider answered with
    assert (call.cost, call.price_source, call.priced_as) == (Decimal("0.002"), "override", "house-model")


def test_the_answered_name_is_looked_up_before_the_configured_one_and_each_says_what_matched() -> None:
    book = PriceBook({"gpt-4o-mini": {"input": "1", "output": "1"},
                      "gpt-4o-mini-2024-07-18": {"input": "2", "output": "2"}})
    dated = call_usage(model="gpt-4o-mini-2024-07-18", input_tokens=1_000_000, output_tokens=0)

    assert book.price(dated, "gpt-4o-mini") == (Decimal(2), "override", "gpt-4o-mini-2024-07-18")
    library = PriceBook().priced(call_usage(model="no-such-model-anywhere"), "gpt-4o-mini")
    assert library.cost == library_cost("gpt-4o-mini", "openai", input_tokens=1000, output_tokens=200)
    assert (library.price_source, library.priced_as) == ("genai-prices", "gpt-4o-mini")
    unpriced = PriceBook().priced(call_usage(model="no-such-model-anywhere"), "nor-this-one")
    assert (unpriced.cost, unpriced.price_source, unpriced.priced_as) == (None, None, None)
    unknown_counts = book.priced(call_usage(input_tokens=None), "gpt-4o-mini")
    assert (unknown_counts.cost, unknown_counts.price_source) == (None, None)


# ---- unreported usage -------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_provider_that_reports_no_usage_leaves_the_turns_tokens_and_cost_unknown(
        server: FakeProvider) -> None:
    from chatflow_agent.core.reports import TurnReport

    server.reply_stream(answer("hi")[:1])  # a server that ignores stream_options: no usage chunk
    runner = Runner(order_agent(server), prices=PriceBook())
    report = TurnReport()  # what a store's backend records the turn from

    usage = (await runner.run_async("s1", "hello", report=report)).usage

    assert usage is not None and len(usage.calls) == 1
    assert (usage.input_tokens, usage.output_tokens, usage.cost) == (None, None, None)
    assert (report.input_tokens, report.output_tokens, report.total_tokens, report.cost) == (None, None, None, None)


@pytest.mark.asyncio
async def test_a_call_cancelled_in_flight_is_reported_as_a_call_of_unknown_usage() -> None:
    from chatflow_agent.core.reports import TurnReport

    answering = asyncio.Event()

    async def hang(agent: Agent, history: list[Any]) -> str:
        answering.set()
        await asyncio.Event().wait()  # never answers
        return "never"

    engine = ScriptedEngine(EngineTurnResult(tool_calls=[ToolCall(id="c1", name="nothing")],
                                             usage=call_usage(input_tokens=10, output_tokens=5)), hang)
    runner = Runner(Agent(name="A", instructions="", model="gpt-4o-mini", engine=engine), prices=PriceBook())
    report = TurnReport()
    task = asyncio.ensure_future(runner.run_async("s1", "hi", report=report))
    await answering.wait()  # the second model call is in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert [c.input_tokens for c in report.calls] == [10, None]
    assert (report.input_tokens, report.total_tokens, report.cost) == (None, None, None)
    assert TurnReport().cost == 0 and TurnReport().total_tokens == 0  # no model call: nothing was used
