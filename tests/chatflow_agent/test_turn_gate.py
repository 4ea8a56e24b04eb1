"""The turn gate (hold a turn, one-turn instructions), the built-in request_human tool, and a turn
whose session lease is lost or taken away (stopped and rolled back)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from chatflow_agent import Agent, Runner, SessionStore, SQLiteSessionStore
from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_agent.core.gate import REQUEST_HUMAN, TurnDecision, request_human_tool
from chatflow_agent.exceptions import SessionBusyError
from chatflow_agent.types import Role, ToolCall


def make_agent(engine: Any, **kwargs: Any) -> Agent:
    return Agent(name="Support", instructions="You are Support.", model="test-model", engine=engine, **kwargs)


def roles(store: Any, session_id: str) -> list[str]:
    session = store.get(session_id)
    return [] if session is None else [m.role.value for m in session.history]


@pytest.mark.asyncio
async def test_a_held_turn_stores_the_user_message_and_calls_no_model() -> None:
    engine = ScriptedEngine()
    seen: list[tuple[int, str]] = []

    def gate(session: Any, text: str) -> TurnDecision:
        seen.append((len(session.history), text))
        return TurnDecision(hold=True)

    runner = Runner(make_agent(engine), turn_gate=gate)
    response = await runner.run_async("s1", "hello?")
    assert response.held is True and response.content == ""
    assert engine.calls == []
    assert seen == [(0, "hello?")]
    assert roles(runner.session_store, "s1") == ["user"]
    assert runner.session_store.get("s1").history[0].content == "hello?"


@pytest.mark.asyncio
async def test_a_held_turn_with_a_reply_stores_it_as_the_answer() -> None:
    engine = ScriptedEngine()

    async def gate(session: Any, text: str) -> TurnDecision:  # a coroutine gate is awaited
        return TurnDecision(hold=True, reply="A person will answer shortly.", human_requested="asked for a human")

    runner = Runner(make_agent(engine), turn_gate=gate)
    response = await runner.run_async("s1", "I want a human")
    assert (response.content, response.held, response.human_requested) == (
        "A person will answer shortly.", True, "asked for a human")
    assert engine.calls == []
    history = runner.session_store.get("s1").history
    assert [(m.role, m.content) for m in history] == [
        (Role.USER, "I want a human"), (Role.MODEL, "A person will answer shortly.")]


@pytest.mark.asyncio
async def test_a_gate_returning_none_plays_the_turn() -> None:
    engine = ScriptedEngine("hi there")
    runner = Runner(make_agent(engine), turn_gate=lambda session, text: None)
    response = await runner.run_async("s1", "hello")
    assert (response.content, response.held) == ("hi there", False)
    assert len(engine.calls) == 1


@pytest.mark.asyncio
async def test_a_gate_given_with_the_run_decides_that_turn_instead_of_the_runners() -> None:
    engine = ScriptedEngine("hi there")
    runner = Runner(make_agent(engine), turn_gate=lambda session, text: TurnDecision(hold=True))
    own = await runner.run_async("s1", "[image]", turn_gate=lambda session, text: TurnDecision(
        hold=True, reply="I can only read text."))
    assert (own.content, own.held, engine.calls) == ("I can only read text.", True, [])
    later = await runner.run_async("s1", "hello")  # the next turn has the Runner's gate again
    assert (later.content, later.held, engine.calls) == ("", True, [])
    assert roles(runner.session_store, "s1") == ["user", "model", "user"]


@pytest.mark.asyncio
async def test_instructions_reach_every_model_call_of_the_turn_and_are_never_stored(tmp_path: Path) -> None:
    def lookup(order_id: str) -> str:
        return f"order {order_id} shipped"

    engine = ScriptedEngine("first answer",
                            EngineTurnResult(tool_calls=[ToolCall(id="c1", name="lookup", args={"order_id": "7"})]),
                            "second answer", "third answer")
    notes = iter(["", "The customer was promised a refund; confirm it politely.", ""])
    store = SQLiteSessionStore(tmp_path / "s.db")
    try:
        runner = Runner(make_agent(engine, tools=[lookup]), session_store=store,
                        turn_gate=lambda session, text: TurnDecision(instructions=next(notes) or None))
        await runner.run_async("s1", "hi")
        await runner.run_async("s1", "where is order 7?")
        await runner.run_async("s1", "thanks")
    finally:
        store.close()
    note = "The customer was promised a refund; confirm it politely."
    calls = [[(m.role, m.content) for m in history] for _agent, history in engine.calls]
    assert len(calls) == 4
    assert (Role.SYSTEM, note) not in calls[0]
    # both model calls of the second turn (before and after the tool call) get it, before the history
    for call in calls[1:3]:
        assert call[0] == (Role.SYSTEM, note)
        assert call.count((Role.SYSTEM, note)) == 1
    assert (Role.SYSTEM, note) not in calls[3]
    reopened = SQLiteSessionStore(tmp_path / "s.db")
    try:
        stored = reopened.get("s1").history
    finally:
        reopened.close()
    assert all(m.content != note for m in stored)
    assert Role.SYSTEM not in [m.role for m in stored]


@pytest.mark.asyncio
async def test_a_gate_that_raises_fails_the_turn_and_leaves_the_session_as_it_was() -> None:
    engine = ScriptedEngine("one")
    calls = 0

    def gate(session: Any, text: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("mode lookup failed")

    runner = Runner(make_agent(engine), turn_gate=gate)
    await runner.run_async("s1", "hello")
    with pytest.raises(RuntimeError, match="mode lookup failed"):
        await runner.run_async("s1", "again")
    assert roles(runner.session_store, "s1") == ["user", "model"]


@pytest.mark.asyncio
async def test_request_human_calls_the_hook_and_ends_the_turn_with_the_holding_reply() -> None:
    engine = ScriptedEngine(EngineTurnResult(tool_calls=[
        ToolCall(id="c1", name=REQUEST_HUMAN, args={"reason": "wants to talk to a person"})]))
    requests: list[tuple[str, str]] = []

    async def on_request(session: Any, reason: str) -> None:
        requests.append((session.session_id, reason))

    runner = Runner(make_agent(engine, tools=[request_human_tool()]), on_human_request=on_request,
                    human_request_reply="Hold on, a colleague will answer.")
    response = await runner.run_async("s1", "let me talk to a person")
    assert requests == [("s1", "wants to talk to a person")]
    assert (response.content, response.human_requested, response.held) == (
        "Hold on, a colleague will answer.", "wants to talk to a person", False)
    assert len(engine.calls) == 1  # the turn ended after the tool: no second model call
    history = runner.session_store.get("s1").history
    assert [m.role for m in history] == [Role.USER, Role.MODEL, Role.TOOL, Role.MODEL]
    assert history[2].tool_results[0].content == {"status": "HUMAN_REQUESTED", "reason": "wants to talk to a person"}
    assert history[3].content == "Hold on, a colleague will answer."


@pytest.mark.asyncio
async def test_without_a_holding_reply_the_model_answers_after_request_human() -> None:
    engine = ScriptedEngine(
        EngineTurnResult(tool_calls=[ToolCall(id="c1", name=REQUEST_HUMAN, args={"reason": "billing dispute"})]),
        EngineTurnResult(text="A colleague will look at your bill."),
    )
    runner = Runner(make_agent(engine, tools=[request_human_tool()]), on_human_request=lambda session, reason: None)
    response = await runner.run_async("s1", "this bill is wrong")
    assert (response.content, response.human_requested) == ("A colleague will look at your bill.", "billing dispute")
    assert len(engine.calls) == 2
    assert roles(runner.session_store, "s1") == ["user", "model", "tool", "model"]


def test_request_human_tool_has_an_optional_reason_parameter() -> None:
    schema = request_human_tool().json_schema
    assert request_human_tool().name == REQUEST_HUMAN
    assert schema.get("required", []) == []  # a model (or the demo engine) may call it without one
    assert schema["properties"]["reason"]["type"] == "string"


# ---- a lost session lease stops the turn -------------------------------------------------------
def _take_lease_away(db: Path, session_id: str) -> None:
    """What another process does when it takes the session's lease (an operator's cancel)."""
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM chatflow_session_leases WHERE session_id = ?", (session_id,))


async def _blocked_turn(tmp_path: Path, lease_ttl: float) -> tuple[SQLiteSessionStore, asyncio.Task[Any],
                                                                   asyncio.Event]:
    started, never = asyncio.Event(), asyncio.Event()

    async def slow(agent: Any, history: Any) -> str:
        started.set()
        await never.wait()  # a model call that would never end: only a stopped turn returns
        return "never"

    store = SQLiteSessionStore(tmp_path / "s.db", lease_ttl_seconds=lease_ttl)
    runner = Runner(make_agent(ScriptedEngine("first", slow)), session_store=store)
    await runner.run_async("s1", "first")
    task = asyncio.ensure_future(runner.run_async("s1", "second"))
    await started.wait()
    return store, task, never


@pytest.mark.asyncio
async def test_a_turn_whose_lease_is_taken_away_stops_at_its_next_renewal_and_is_rolled_back(tmp_path: Path) -> None:
    store, task, _never = await _blocked_turn(tmp_path, lease_ttl=0.3)
    try:
        _take_lease_away(tmp_path / "s.db", "s1")
        with pytest.raises(SessionBusyError):
            await asyncio.wait_for(task, 60)  # a guard only: the renewal a tenth of a second later stops it
        assert roles(store, "s1") == ["user", "model"]
    finally:
        store.close()
    reopened = SQLiteSessionStore(tmp_path / "s.db")
    try:
        assert roles(reopened, "s1") == ["user", "model"]
    finally:
        reopened.close()


@pytest.mark.asyncio
async def test_stop_turn_stops_a_turn_of_this_process_at_once(tmp_path: Path) -> None:
    store, task, _never = await _blocked_turn(tmp_path, lease_ttl=600)  # no renewal during the test
    try:
        assert store.stop_turn("other") is False
        _take_lease_away(tmp_path / "s.db", "s1")
        assert store.stop_turn("s1", owner="host:1:a-turn-that-ended:") is False  # only the turn of that lease
        assert not task.done()
        assert store.stop_turn("s1") is True
        with pytest.raises(SessionBusyError):
            await asyncio.wait_for(task, 60)
        assert roles(store, "s1") == ["user", "model"]
        assert store.stop_turn("s1") is False  # nothing runs there any more
        async with store.turn("s1", make_agent(ScriptedEngine()), wait=False) as session:  # free again at once
            assert len(session.history) == 2
    finally:
        store.close()


@pytest.mark.asyncio
async def test_a_cancelled_task_is_still_cancelled_when_its_lease_is_intact(tmp_path: Path) -> None:
    store, task, _never = await _blocked_turn(tmp_path, lease_ttl=600)
    try:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert roles(store, "s1") == ["user", "model"]
    finally:
        store.close()


def test_the_memory_store_is_unaffected() -> None:
    runner = Runner(make_agent(ScriptedEngine("hi")), session_store=SessionStore())
    assert runner.run("s1", "hello").content == "hi"
