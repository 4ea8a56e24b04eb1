"""The Runner: sync/async entry points, run events and subscribers, the tool loop, agent registration."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import threading
import warnings
from typing import Any

import pytest

from chatflow_agent import Agent, Runner, SessionStore
from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_agent.core.events import RunEvent
from chatflow_agent.types import Message, Role, ToolCall


def call(name: str, call_id: str = "c1", **args: Any) -> EngineTurnResult:
    return EngineTurnResult(tool_calls=[ToolCall(id=call_id, name=name, args=args)])


def make_agent(name: str = "Support", **kwargs: Any) -> Agent:
    return Agent(name=name, instructions=f"You are {name}.", model="test-model", **kwargs)


def summary(event: RunEvent) -> str:
    """A short, comparable description of an event."""
    if event.type == "message_appended":
        return f"message_appended:{event.message.role.value}"
    if event.type == "tool_call_started":
        return f"tool_call_started:{event.call.name}"
    if event.type == "tool_call_finished":
        return f"tool_call_finished:{event.result.name}"
    if event.type == "handoff":
        return f"handoff:{event.from_agent}->{event.to_agent}"
    if event.type == "text_delta":
        return f"text_delta:{event.text}"
    return event.type


# ---- run() and run_async() -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_run_inside_a_running_loop_names_run_async_and_leaves_no_unawaited_coroutine() -> None:
    engine = ScriptedEngine("never used")
    runner = Runner(make_agent(engine=engine))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match=r"run_async"):
            runner.run("s1", "hello")
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert engine.calls == []
    assert runner.session_store.list_sessions() == []


def test_run_outside_an_event_loop_plays_a_turn() -> None:
    runner = Runner(make_agent(engine=ScriptedEngine("Hi there.")))
    response = runner.run("s1", "hello")
    assert response.content == "Hi there."
    assert response.active_agent_name == "Support"
    assert [m.content for m in runner.get_session("s1").history] == ["hello", "Hi there."]


# ---- run_streamed and subscribers ----------------------------------------------------------


def team_with_tool_and_handoff(engine: ScriptedEngine) -> Agent:
    billing = make_agent("Billing", engine=engine)
    support = make_agent("Support", handoffs=[billing], engine=engine)

    @support.tool
    def lookup_invoice(invoice_id: str) -> dict:
        """Find an invoice."""
        return {"invoice_id": invoice_id, "paid": True}

    return support


def script_with_tool_and_handoff() -> ScriptedEngine:
    return ScriptedEngine(
        EngineTurnResult(tool_calls=[
            ToolCall(id="c1", name="lookup_invoice", args={"invoice_id": "INV-7"}),
            ToolCall(id="c2", name="transfer_to_billing", args={"reason": "payment question"}),
        ]),
        "Invoice INV-7 is paid.",
        stream=True,
    )


EXPECTED_TOOL_AND_HANDOFF_EVENTS = [
    "turn_started",
    "message_appended:user",
    "message_appended:model",
    "tool_call_started:lookup_invoice",
    "tool_call_finished:lookup_invoice",
    "tool_call_started:transfer_to_billing",
    "handoff:Support->Billing",
    "tool_call_finished:transfer_to_billing",
    "message_appended:tool",
    "text_delta:Invoice ",
    "text_delta:INV-7 ",
    "text_delta:is ",
    "text_delta:paid.",
    "message_appended:model",
    "turn_completed",
]


@pytest.mark.asyncio
async def test_run_streamed_yields_the_events_of_a_turn_with_a_tool_call_and_a_handoff_in_order() -> None:
    runner = Runner(team_with_tool_and_handoff(script_with_tool_and_handoff()))
    events = [e async for e in runner.run_streamed("s1", "Is my invoice paid?")]

    assert [summary(e) for e in events] == EXPECTED_TOOL_AND_HANDOFF_EVENTS
    assert len({e.turn_id for e in events}) == 1
    assert {e.session_id for e in events} == {"s1"}
    final = events[-1]
    assert final.response.content == "Invoice INV-7 is paid."
    assert final.response.active_agent_name == "Billing"
    assert final.response.tool_calls_executed == ["lookup_invoice", "transfer_to_billing"]
    appended = [e.message for e in events if e.type == "message_appended"]
    assert appended == runner.get_session("s1").history  # the events carry the stored messages
    assert [e.index for e in events if e.type == "message_appended"] == [0, 1, 2, 3]
    deltas = [e for e in events if e.type == "text_delta"]
    assert {e.agent_name for e in deltas} == {"Billing"}


@pytest.mark.asyncio
async def test_a_failing_streamed_turn_ends_with_turn_failed_and_re_raises() -> None:
    runner = Runner(make_agent(engine=ScriptedEngine(RuntimeError("provider down"))))
    events: list[RunEvent] = []
    with pytest.raises(RuntimeError, match="provider down"):
        async for event in runner.run_streamed("s1", "hello"):
            events.append(event)
    assert [summary(e) for e in events] == ["turn_started", "message_appended:user", "turn_failed"]
    assert (events[-1].error_type, events[-1].error) == ("RuntimeError", "provider down")
    assert runner.get_session("s1") is None  # rolled back: the failed turn had created the session


@pytest.mark.asyncio
async def test_subscribers_sync_and_async_receive_every_event_of_every_run() -> None:
    engine = script_with_tool_and_handoff().push("Second answer.")
    runner = Runner(team_with_tool_and_handoff(engine))
    sync_seen: list[RunEvent] = []
    async_seen: list[RunEvent] = []

    async def async_subscriber(event: RunEvent) -> None:
        await asyncio.sleep(0)
        async_seen.append(event)

    runner.subscribe(sync_seen.append)
    runner.subscribe(async_subscriber)
    streamed = [e async for e in runner.run_streamed("s1", "Is my invoice paid?")]
    await runner.run_async("s2", "Another session")

    assert sync_seen == async_seen
    assert sync_seen[: len(streamed)] == streamed
    assert [summary(e) for e in sync_seen[len(streamed):]] == [
        "turn_started", "message_appended:user", "text_delta:Second ", "text_delta:answer.",
        "message_appended:model", "turn_completed",
    ]
    assert {e.session_id for e in sync_seen[len(streamed):]} == {"s2"}


@pytest.mark.asyncio
async def test_a_raising_subscriber_is_logged_and_does_not_fail_the_turn(caplog: pytest.LogCaptureFixture) -> None:
    runner = Runner(make_agent(engine=ScriptedEngine("Fine.")))
    seen: list[str] = []

    def broken(event: RunEvent) -> None:
        raise ValueError("subscriber bug")

    async def broken_async(event: RunEvent) -> None:
        raise ValueError("async subscriber bug")

    runner.subscribe(broken)
    runner.subscribe(broken_async)
    runner.subscribe(lambda e: seen.append(e.type))
    with caplog.at_level(logging.ERROR, logger="chatflow_agent.runner"):
        response = await runner.run_async("s1", "hello")
    assert response.content == "Fine."
    assert seen == ["turn_started", "message_appended", "message_appended", "turn_completed"]
    assert len([r for r in caplog.records if r.exc_info and "subscriber" in str(r.exc_info[1])]) == 8


@pytest.mark.asyncio
async def test_an_unsubscribed_subscriber_gets_no_more_events() -> None:
    runner = Runner(make_agent(engine=ScriptedEngine("One.", "Two.")))
    seen: list[str] = []
    unsubscribe = runner.subscribe(lambda e: seen.append(e.session_id))
    await runner.run_async("first", "hello")
    unsubscribe()
    await runner.run_async("second", "hello")
    assert set(seen) == {"first"}


@pytest.mark.asyncio
async def test_a_subscriber_added_during_a_turn_gets_the_rest_of_it_under_one_turn_id() -> None:
    # Events are only built while someone listens: one that starts listening mid-turn still
    # gets every later event of that turn, all with the same turn id.
    agent = make_agent(engine=ScriptedEngine(call("watch"), "Done."))
    runner = Runner(agent)
    seen: list[RunEvent] = []

    @agent.tool
    async def watch() -> str:
        runner.subscribe(seen.append)
        return "watching"

    await runner.run_async("s1", "go")
    assert [summary(e) for e in seen] == [
        "tool_call_finished:watch", "message_appended:tool", "message_appended:model", "turn_completed",
    ]
    assert len({e.turn_id for e in seen}) == 1
    assert [e.index for e in seen if e.type == "message_appended"] == [2, 3]
    assert seen[-1].response.content == "Done."


# ---- the tool loop -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_unknown_tool_gets_an_error_result_and_the_turn_goes_on() -> None:
    engine = ScriptedEngine(call("delete_everything"), "I cannot do that.")
    runner = Runner(make_agent(engine=engine))
    response = await runner.run_async("s1", "wipe it")
    assert response.content == "I cannot do that."
    (result,) = runner.get_session("s1").history[2].tool_results
    assert result.is_error
    assert result.tool_call_id == "c1"
    assert "delete_everything" in result.content and "not found" in result.content
    assert engine.calls[1][1][-1].tool_results == [result]  # the model saw the error


@pytest.mark.asyncio
async def test_a_raising_tool_gives_the_model_a_generic_message_and_logs_the_error_with_the_same_trace_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = make_agent(engine=ScriptedEngine(call("charge_card", amount=5), "Sorry, try later."))

    @agent.tool
    def charge_card(amount: int) -> str:
        raise ConnectionError("secret-gateway.internal:9000 refused")

    runner = Runner(agent)
    with caplog.at_level(logging.ERROR, logger="chatflow_agent.runner"):
        response = await runner.run_async("s1", "charge me")
    assert response.content == "Sorry, try later."
    (result,) = runner.get_session("s1").history[2].tool_results
    assert result.is_error
    assert "secret-gateway" not in result.content
    trace_id = re.search(r"trace_id: ([0-9a-f-]{36})", result.content).group(1)
    (record,) = [r for r in caplog.records if trace_id in r.getMessage()]
    assert "charge_card" in record.getMessage()
    assert "secret-gateway.internal:9000 refused" in record.getMessage()
    assert record.exc_info is not None


@pytest.mark.asyncio
async def test_sync_tools_run_off_the_event_loop_thread() -> None:
    threads: dict[str, int] = {}
    agent = make_agent(engine=ScriptedEngine(call("blocking_lookup"), call("async_lookup", "c2"), "Done."))

    @agent.tool
    def blocking_lookup() -> str:
        threads["sync"] = threading.get_ident()
        return "ok"

    @agent.tool
    async def async_lookup() -> str:
        threads["async"] = threading.get_ident()
        return "ok"

    await Runner(agent).run_async("s1", "look it up")
    loop_thread = threading.get_ident()
    assert threads["async"] == loop_thread
    assert threads["sync"] != loop_thread


# ---- agents ----------------------------------------------------------------------------------


class RecordingStore(SessionStore):
    def __init__(self) -> None:
        super().__init__()
        self.resolvers: list[Any] = []

    def set_agent_resolver(self, resolver: Any) -> None:
        self.resolvers.append(resolver)
        super().set_agent_resolver(resolver)


def test_the_runner_registers_every_agent_reachable_through_handoffs_and_installs_the_resolver() -> None:
    refunds = make_agent("Refunds")
    billing = make_agent("Billing", handoffs=[refunds])
    sales = make_agent("Sales")
    triage = make_agent("Triage", handoffs=[billing, sales])
    refunds.add_handoff(triage)  # a cycle back to the start
    store = RecordingStore()

    runner = Runner(triage, session_store=store)

    assert runner.agents == {"Triage": triage, "Billing": billing, "Sales": sales, "Refunds": refunds}
    (resolver,) = store.resolvers
    assert resolver("Refunds") is refunds
    assert resolver("Nobody") is None
    outsider = make_agent("Outsider", handoffs=[make_agent("Partner")])
    runner.register_agent(outsider)
    assert resolver("Partner").name == "Partner"  # the installed resolver sees later registrations


@pytest.mark.asyncio
async def test_a_handoff_makes_the_target_agent_answer_and_stay_active() -> None:
    engine = ScriptedEngine(call("transfer_to_vip"), "VIP desk here.")
    vip = make_agent("VIP", engine=engine)
    front = make_agent("Front", handoffs=[vip], engine=engine)
    runner = Runner(front)
    response = await runner.run_async("s1", "I am a VIP")
    assert response.active_agent_name == "VIP"
    assert runner.get_session("s1").active_agent is vip
    assert [m.role for m in runner.get_session("s1").history] == [Role.USER, Role.MODEL, Role.TOOL, Role.MODEL]
    assert isinstance(runner.get_session("s1").history[0], Message)


@pytest.mark.asyncio
async def test_an_engine_subclass_overriding_only_generate_turn_async_is_called_not_bypassed_by_streaming() -> None:
    # 0.3.4 custom engines subclass a provider engine and override generate_turn_async only.
    class Custom(ScriptedEngine):
        async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
            return EngineTurnResult(text="from the override")

    patched = ScriptedEngine("scripted", stream=True)

    async def patched_generate(agent: Agent, history: list[Message]) -> EngineTurnResult:
        return EngineTurnResult(text="from the patched instance")

    patched.generate_turn_async = patched_generate  # type: ignore[method-assign]

    for engine, expected in [(Custom("scripted", stream=True), "from the override"),
                             (patched, "from the patched instance")]:
        events = [e async for e in Runner(make_agent(engine=engine)).run_streamed("s1", "hi")]
        assert events[-1].response.content == expected
        assert [e for e in events if e.type == "text_delta"] == []


@pytest.mark.asyncio
async def test_a_new_session_gets_the_starting_agent_asked_for_only_when_its_first_turn_commits(
        tmp_path) -> None:
    from chatflow_agent import SQLiteSessionStore

    engine = ScriptedEngine(RuntimeError("provider down"), "Tech here.")
    tech = make_agent("Tech", engine=engine)
    store = SQLiteSessionStore(str(tmp_path / "s.db"))
    runner = Runner(make_agent("Support", handoffs=[tech], engine=engine), session_store=store)
    try:
        with pytest.raises(RuntimeError, match="provider down"):
            async for _ in runner.run_streamed("s1", "hello", {"channel": "web"}, starting_agent=tech):
                pass
        assert SQLiteSessionStore(str(tmp_path / "s.db")).get("s1") is None  # no row from a failed first turn

        response = await runner.run_async("s1", "hello", {"channel": "web"}, starting_agent=tech)
        assert (response.content, response.active_agent_name) == ("Tech here.", "Tech")
        fresh = SQLiteSessionStore(str(tmp_path / "s.db"))
        stored = fresh.get("s1")
        assert (stored.active_agent.name, stored.metadata) == ("Tech", {"channel": "web"})
        fresh.close()
    finally:
        store.close()


@pytest.mark.asyncio
async def test_a_subscriber_that_declines_an_event_type_does_not_get_it_unless_another_wants_it() -> None:
    runner = Runner(make_agent(engine=ScriptedEngine("One.", "Two.")))
    asked: list[tuple[str, str]] = []

    class OnlyEnds:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def wants(self, session_id: str, event_type: str) -> bool:
            asked.append((session_id, event_type))
            return event_type == "turn_completed"

        def __call__(self, event: RunEvent) -> None:
            self.seen.append(event.type)

    ends = OnlyEnds()
    runner.subscribe(ends)
    await runner.run_async("s1", "hello")
    assert ends.seen == ["turn_completed"]
    assert ("s1", "message_appended") in asked and ("s1", "turn_started") in asked
    everything: list[str] = []
    runner.subscribe(lambda e: everything.append(e.type))  # no wants: every event is built again
    await runner.run_async("s1", "again")
    assert everything == ["turn_started", "message_appended", "message_appended", "turn_completed"]
    assert ends.seen == ["turn_completed", *everything]  # built for the other subscriber: delivered to both
