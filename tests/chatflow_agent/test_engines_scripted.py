"""ScriptedEngine: a FIFO script of answers for tests."""

from __future__ import annotations

import pytest

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines import EngineTurnResult, ScriptedEngine
from chatflow_agent.core.engines.scripted import ScriptExhaustedError
from chatflow_agent.exceptions import ProviderError
from chatflow_agent.types import Message, Role, ToolCall

AGENT = Agent(name="Support", instructions="Help.")


def user(text: str) -> list[Message]:
    return [Message(role=Role.USER, content=text)]


@pytest.mark.asyncio
async def test_it_plays_steps_in_order() -> None:
    call = EngineTurnResult(tool_calls=[ToolCall(id="c1", name="lookup", args={"q": "x"})])
    engine = ScriptedEngine(call, "done")

    first = await engine.generate_turn_async(AGENT, user("hi"))
    second = await engine.generate_turn_async(AGENT, user("hi"))

    assert first is call
    assert second.text == "done" and second.tool_calls == []
    assert engine.remaining == 0


@pytest.mark.asyncio
async def test_it_raises_an_exception_step() -> None:
    engine = ScriptedEngine(ProviderError("rate limited"), "recovered")

    with pytest.raises(ProviderError, match="rate limited"):
        await engine.generate_turn_async(AGENT, user("hi"))
    assert (await engine.generate_turn_async(AGENT, user("hi"))).text == "recovered"


@pytest.mark.asyncio
async def test_it_calls_sync_and_async_callables_with_agent_and_history() -> None:
    def echo(agent: Agent, history: list[Message]) -> str:
        return f"{agent.name}: {history[-1].content}"

    async def shout(agent: Agent, history: list[Message]) -> EngineTurnResult:
        return EngineTurnResult(text=(history[-1].content or "").upper())

    engine = ScriptedEngine(echo, shout)

    assert (await engine.generate_turn_async(AGENT, user("hello"))).text == "Support: hello"
    assert (await engine.generate_turn_async(AGENT, user("hello"))).text == "HELLO"


@pytest.mark.asyncio
async def test_it_records_each_call_with_a_copy_of_the_history() -> None:
    engine = ScriptedEngine("a")
    history = user("first")

    await engine.generate_turn_async(AGENT, history)
    history[0].content = "changed later"
    history.append(Message(role=Role.MODEL, content="a"))

    [(agent_name, seen)] = engine.calls
    assert agent_name == "Support"
    assert [m.content for m in seen] == ["first"]


@pytest.mark.asyncio
async def test_running_out_of_steps_is_a_clear_error() -> None:
    engine = ScriptedEngine("only one")
    await engine.generate_turn_async(AGENT, user("one"))

    with pytest.raises(ScriptExhaustedError, match=r"no step left for call #2 .*'Support'.*push"):
        await engine.generate_turn_async(AGENT, user("two"))
    assert len(engine.calls) == 2


@pytest.mark.asyncio
async def test_push_adds_steps_to_the_end() -> None:
    engine = ScriptedEngine("one").push("two", "three")

    texts = [(await engine.generate_turn_async(AGENT, user("x"))).text for _ in range(3)]

    assert texts == ["one", "two", "three"]


def test_it_rejects_a_step_it_cannot_play() -> None:
    with pytest.raises(TypeError, match="script step"):
        ScriptedEngine(42)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_it_streams_word_by_word_when_asked() -> None:
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    result = await ScriptedEngine("Order 7  ships\ntomorrow.", stream=True).stream_turn_async(
        AGENT, user("x"), on_delta
    )

    assert deltas == ["Order ", "7  ", "ships\n", "tomorrow."]
    assert "".join(deltas) == result.text


@pytest.mark.asyncio
async def test_it_does_not_stream_by_default() -> None:
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    result = await ScriptedEngine("quiet answer").stream_turn_async(AGENT, user("x"), on_delta)

    assert deltas == [] and result.text == "quiet answer"


def test_it_is_provider_agnostic() -> None:
    assert ScriptedEngine().provider is None
