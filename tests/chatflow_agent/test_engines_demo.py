"""DemoEngine: offline, deterministic answers from the agent's tools and the user's words."""

from __future__ import annotations

from typing import Any

import pytest

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines import DemoEngine, EngineTurnResult
from chatflow_agent.types import Message, Role, ToolCall, ToolResult


def support_desk() -> tuple[Agent, Agent]:
    billing = Agent(name="Billing", instructions="You handle invoices, refunds and payments.")
    support = Agent(name="Support", instructions="Front desk for a web shop.", handoffs=[billing])

    @support.tool
    def check_order_status(order_id: str) -> dict[str, str]:
        """Look up where an order is."""
        return {"order_id": order_id, "status": "IN_TRANSIT", "eta": "Tomorrow"}

    @support.tool
    def get_weather(city: str, days: int = 1) -> str:
        """Weather forecast for a city."""
        return "sunny"

    return support, billing


def user(text: str) -> list[Message]:
    return [Message(role=Role.USER, content=text)]


async def answer(agent: Agent, history: list[Message]) -> EngineTurnResult:
    return await DemoEngine().generate_turn_async(agent, history)


def the_call(result: EngineTurnResult) -> tuple[str, dict[str, Any]]:
    assert result.text is None
    [call] = result.tool_calls
    return call.name, call.args


@pytest.mark.asyncio
async def test_it_calls_the_order_tool_for_an_order_question() -> None:
    support, _ = support_desk()

    result = await answer(support, user("where is order 404?"))

    assert the_call(result) == ("check_order_status", {"order_id": "404"})


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("text", "order_id"),
    [("Where's my order #A-77", "A-77"), ("order status for 'XJ9' please", "XJ9"), ("my orders: 12", "12")],
)
async def test_it_takes_ids_from_the_message(text: str, order_id: str) -> None:
    support, _ = support_desk()

    assert the_call(await answer(support, user(text))) == ("check_order_status", {"order_id": order_id})


@pytest.mark.asyncio
async def test_it_fills_a_proper_noun_and_a_mentioned_optional_integer() -> None:
    support, _ = support_desk()

    result = await answer(support, user("What's the weather in Paris for the next 3 days?"))

    assert the_call(result) == ("get_weather", {"city": "Paris", "days": 3})


@pytest.mark.asyncio
async def test_it_asks_for_a_required_value_it_cannot_find() -> None:
    support, _ = support_desk()

    result = await answer(support, user("can you check my order?"))

    assert result.tool_calls == []
    assert result.text == "I can check order status for you; which order id should I use?"


@pytest.mark.asyncio
@pytest.mark.parametrize("text", ["I have a billing question", "I want a refund for last month"])
async def test_it_hands_off_for_another_agents_specialty(text: str) -> None:
    support, _ = support_desk()

    name, args = the_call(await answer(support, user(text)))

    assert name == "transfer_to_billing"
    assert text in args["reason"]


@pytest.mark.asyncio
async def test_it_summarises_tool_results_in_plain_words() -> None:
    support, _ = support_desk()
    history = [
        *user("where is order 404?"),
        Message(role=Role.MODEL, tool_calls=[ToolCall(id="c1", name="check_order_status", args={"order_id": "404"})]),
        Message(
            role=Role.TOOL,
            tool_results=[
                ToolResult(
                    tool_call_id="c1",
                    name="check_order_status",
                    content={"order_id": "404", "status": "IN_TRANSIT", "eta": "Tomorrow"},
                ),
            ],
        ),
    ]

    result = await answer(support, history)

    assert result.tool_calls == []
    assert result.text == "Order 404 is IN_TRANSIT, eta Tomorrow."


@pytest.mark.asyncio
async def test_it_answers_in_text_after_tool_results_even_if_the_words_fit_a_tool() -> None:
    support, _ = support_desk()
    history = [
        *user("where is order 404? and what about order 405?"),
        Message(role=Role.MODEL, tool_calls=[ToolCall(id="c1", name="check_order_status", args={"order_id": "404"})]),
        Message(
            role=Role.TOOL,
            tool_results=[
                ToolResult(tool_call_id="c1", name="check_order_status", content="Order 404 was delivered"),
                ToolResult(tool_call_id="c2", name="get_weather", content="db down", is_error=True),
            ],
        ),
    ]

    result = await answer(support, history)

    assert result.tool_calls == []
    assert result.text == "Order 404 was delivered. Sorry, I couldn't get weather: db down."


@pytest.mark.asyncio
async def test_the_new_agent_introduces_itself_after_a_handoff() -> None:
    _, billing = support_desk()
    history = [
        *user("I have a billing question"),
        Message(role=Role.MODEL, tool_calls=[ToolCall(id="h1", name="transfer_to_billing", args={})]),
        Message(
            role=Role.TOOL,
            tool_results=[
                ToolResult(
                    tool_call_id="h1",
                    name="transfer_to_billing",
                    content={"status": "HANDOFF_SUCCESS", "transferred_to": "Billing", "reason": "billing"},
                ),
            ],
        ),
    ]

    result = await answer(billing, history)

    assert result.tool_calls == []
    assert result.text is not None and result.text.startswith("Hi, this is Billing")


@pytest.mark.asyncio
async def test_it_answers_politely_and_names_the_agent_when_nothing_fits() -> None:
    support, _ = support_desk()

    result = await answer(support, user("hello there"))

    assert result.tool_calls == []
    assert result.text == (
        "Hi, this is Support. I can check order status or get weather, and I can also connect you with "
        "Billing. What can I do for you?"
    )


@pytest.mark.asyncio
async def test_it_is_deterministic() -> None:
    support, _ = support_desk()
    history = user("where is order 404?")

    first, second = await answer(support, history), await answer(support, history)

    assert [(c.id, c.name, c.args) for c in first.tool_calls] == [(c.id, c.name, c.args) for c in second.tool_calls]


@pytest.mark.asyncio
async def test_it_streams_the_answer_word_by_word() -> None:
    support, _ = support_desk()
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    result = await DemoEngine().stream_turn_async(support, user("hello"), on_delta)

    assert len(deltas) > 5
    assert "".join(deltas) == result.text


@pytest.mark.asyncio
async def test_it_streams_nothing_for_a_tool_call() -> None:
    support, _ = support_desk()
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    result = await DemoEngine().stream_turn_async(support, user("where is order 404?"), on_delta)

    assert deltas == [] and result.has_tool_calls


def test_it_is_provider_agnostic() -> None:
    assert DemoEngine().provider is None
