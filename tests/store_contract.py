"""The store contract: one suite that defines what a session store is.

Modules under tests/ import these tests and provide a ``kit`` fixture (a ``StoreKit``) for
their store: memory, SQLite file, SQLite in-memory URIs, Django on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from datetime import time as dtime
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from chatflow_agent import Agent, Message, Role, Runner, SessionDeletedError, ToolCall, ToolResult
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.exceptions import ProviderError


@dataclass
class StoreKit:
    """How the contract suite makes stores of one kind."""

    make: Callable[..., Any]  # make(default_max_turns=40, dedup_ttl_hours=192) -> store
    reopen: Callable[[Any], Any] | None  # a fresh store on the same database (None: not persistent)
    # Rounds of the threaded-writes scenarios; stores whose every write is a durable database commit
    # run fewer to keep the suite's time in bounds (the races show within a few rounds).
    thread_rounds: int = 100
    # Rounds of the scenarios where reads and creations race writes (a new session each): enough that
    # the races they look for showed on every persistent store before the store took a session's lock
    # for them, few enough to keep a store's run of them to a few seconds.
    race_rounds: int = 30


class EchoEngine(BaseEngine):
    """Answers "A<n>" to "U<n>" after yielding to the loop; records what it was shown."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.gate: asyncio.Event | None = None  # when set by a test: each answer waits for it
        self.waiting = asyncio.Event()  # set while an answer waits for the gate
        self.seen: list[list[str]] = []

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        self.seen.append([m.content or "" for m in history])
        await asyncio.sleep(self.pause)
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        last = history[-1].content or ""
        return EngineTurnResult(text="A" + last[1:] if last.startswith("U") else "ok")


class FailingEngine(BaseEngine):
    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        raise ProviderError("provider down")


class StepsEngine(BaseEngine):
    """Plays the given steps in order (EngineTurnResult, exception, or callable(history))."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.seen: list[list[Message]] = []

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        self.seen.append(list(history))
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            step = step(history)
            if asyncio.iscoroutine(step):
                step = await step
        return step if isinstance(step, EngineTurnResult) else EngineTurnResult(text=step)


def contents(history: list[Message]) -> list[str | None]:
    return [m.content for m in history]


def dumped(history: list[Message]) -> list[str]:
    return [m.model_dump_json() for m in history]


def assert_reload_equals(kit: StoreKit, store: Any, session_id: str, live: Any) -> None:
    """Invariant 4: what a fresh store loads equals what the live session holds."""
    if kit.reopen is None:
        return
    fresh = kit.reopen(store).get(session_id)
    assert fresh is not None
    assert dumped(fresh.history) == dumped(live.history)
    assert fresh.active_agent.name == live.active_agent.name
    assert fresh.metadata == live.metadata


def team() -> tuple[Agent, Agent]:
    billing = Agent(name="Billing", instructions="Billing specialist")
    support = Agent(name="Support", instructions="Support", handoffs=[billing])
    return support, billing


def test_it_returns_the_same_session_and_keeps_metadata(kit: StoreKit) -> None:
    store = kit.make()
    agent = Agent(name="Bot", instructions="x")
    s1 = store.get_or_create("s-1", default_agent=agent, metadata={"channel": "whatsapp"})
    s1.add_message(Message(role=Role.USER, content="Ping"))
    s2 = store.get_or_create("s-1", default_agent=agent)
    assert [m.content for m in s2.history] == ["Ping"]
    assert s2.metadata == {"channel": "whatsapp"}
    assert "s-1" in store.list_sessions()
    assert store.get("missing") is None
    assert store.delete("s-1") is True
    assert store.delete("s-1") is False
    assert store.get("s-1") is None
    assert "s-1" not in store.list_sessions()


def test_it_prunes_whole_turns_keeping_tool_pairs(kit: StoreKit) -> None:
    store = kit.make(default_max_turns=2)
    agent = Agent(name="Bot", instructions="x")
    s = store.get_or_create("prune", default_agent=agent)
    calls2 = [ToolCall(id="c1", name="a", args={}), ToolCall(id="c2", name="b", args={})]
    msgs = [
        Message(role=Role.SYSTEM, content="sys"),
        Message(role=Role.USER, content="u1"),
        Message(role=Role.MODEL, tool_calls=calls2),
        Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id="c1", name="a", content=1),
                                              ToolResult(tool_call_id="c2", name="b", content=2)]),
        Message(role=Role.MODEL, content="a1"),
        Message(role=Role.USER, content="u2"),
        Message(role=Role.MODEL, tool_calls=[ToolCall(id="c3", name="a", args={})]),
        Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id="c3", name="a", content=3)]),
        Message(role=Role.MODEL, content="a2"),
        Message(role=Role.USER, content="u3"),
        Message(role=Role.MODEL, content="a3"),
    ]
    for m in msgs:
        s.add_message(m)
    assert [m.role.value for m in s.history] == ["system", "user", "model", "tool", "model", "user", "model"]
    assert contents(s.history) == ["sys", "u2", None, None, "a2", "u3", "a3"]
    assert_reload_equals(kit, store, "prune", s)


@pytest.mark.asyncio
async def test_a_failed_turn_at_max_turns_leaves_the_session_as_it_was(kit: StoreKit) -> None:
    store = kit.make(default_max_turns=1)
    engine = StepsEngine("A1", ProviderError("boom"))
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    await runner.run_async("full", "U1")
    with pytest.raises(ProviderError):
        await runner.run_async("full", "U2")
    live = store.get("full")
    assert contents(live.history) == ["U1", "A1"]
    assert_reload_equals(kit, store, "full", live)


@pytest.mark.asyncio
async def test_a_cancelled_or_timed_out_turn_is_rolled_back(kit: StoreKit) -> None:
    store = kit.make()
    engine = EchoEngine()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    await runner.run_async("cancel", "U1")
    engine.pause = 5
    task = asyncio.ensure_future(runner.run_async("cancel", "U2"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(runner.run_async("cancel", "U3"), timeout=0.1)
    engine.pause = 0
    await runner.run_async("cancel", "U4")
    live = store.get("cancel")
    assert contents(live.history) == ["U1", "A1", "U4", "A4"]
    assert_reload_equals(kit, store, "cancel", live)


@pytest.mark.asyncio
async def test_a_turn_that_hands_off_then_fails_keeps_the_previous_agent(kit: StoreKit) -> None:
    store = kit.make()
    support, _billing = team()
    engine = StepsEngine(
        "hello",
        EngineTurnResult(tool_calls=[ToolCall(id="h1", name="transfer_to_billing", args={"reason": "refund"})]),
        ProviderError("down after handoff"),
    )
    runner = Runner(support, session_store=store, engine=engine)
    await runner.run_async("ho", "hi")
    with pytest.raises(ProviderError):
        await runner.run_async("ho", "I want a refund")
    live = store.get("ho")
    assert live.active_agent.name == "Support"
    assert contents(live.history) == ["hi", "hello"]
    assert_reload_equals(kit, store, "ho", live)


@pytest.mark.asyncio
async def test_exceeding_max_handoffs_keeps_every_tool_call_answered(kit: StoreKit) -> None:
    store = kit.make()
    support, billing = team()
    billing.add_handoff(support)
    calls = [ToolCall(id="h1", name="transfer_to_billing", args={}),
             ToolCall(id="h2", name="transfer_to_billing", args={}),
             ToolCall(id="x3", name="transfer_to_billing", args={})]
    engine = StepsEngine(EngineTurnResult(tool_calls=calls), "done")
    runner = Runner(support, session_store=store, engine=engine, max_handoffs_per_turn=1)
    response = await runner.run_async("limit", "go")
    live = store.get("limit")
    tool_msg = live.history[2]
    assert [r.tool_call_id for r in tool_msg.tool_results] == ["h1", "h2", "x3"]
    assert [r.is_error for r in tool_msg.tool_results] == [False, True, True]
    assert response.active_agent_name == "Billing"  # the first handoff happened, the second did not
    assert_reload_equals(kit, store, "limit", live)


@pytest.mark.asyncio
@pytest.mark.parametrize("n", [3, 50])
async def test_concurrent_turns_on_one_session_are_serialised_in_order(kit: StoreKit, n: int) -> None:
    store = kit.make(default_max_turns=100)
    engine = EchoEngine(pause=0.001)
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    tasks = []
    for i in range(1, n + 1):
        tasks.append(asyncio.ensure_future(runner.run_async("conc", f"U{i}")))
        await asyncio.sleep(0)  # start them in order
    await asyncio.gather(*tasks)
    expected = [x for i in range(1, n + 1) for x in (f"U{i}", f"A{i}")]
    live = store.get("conc")
    assert contents(live.history) == expected
    for i, seen in enumerate(engine.seen):
        assert seen == expected[: 2 * i] + [f"U{i + 1}"]
    assert_reload_equals(kit, store, "conc", live)


def _turn_in_thread(store: Any, name: str, order: list[str], **kwargs: Any) -> threading.Thread:
    """A thread that plays one sync turn on session "line" adding the user message ``name``."""
    def play() -> None:
        with store.sync_turn("line", Agent(name="Bot", instructions="x"), **kwargs) as session:
            order.append(name)
            session.add_message(Message(role=Role.USER, content=name))
    thread = threading.Thread(target=play)
    thread.start()
    return thread


def test_a_sync_turn_keeps_its_place_in_line_while_queued_runs(kit: StoreKit) -> None:
    """``sync_turn(queued=...)`` calls it with the turn's place in the line taken: a turn that joins the
    line from inside it (as a stopped turn's replay would) comes after, not before."""
    store = kit.make()
    order: list[str] = []
    running, release = threading.Event(), threading.Event()

    def first() -> None:
        with store.sync_turn("line", Agent(name="Bot", instructions="x")) as session:
            order.append("A")
            session.add_message(Message(role=Role.USER, content="A"))
            running.set()
            assert release.wait(10)
    a = threading.Thread(target=first)
    a.start()
    assert running.wait(10)
    later: list[threading.Thread] = []

    def queued() -> None:
        later.append(_turn_in_thread(store, "C", order))
        time.sleep(0.3)  # C is waiting now, behind this turn
        release.set()
    b = _turn_in_thread(store, "B", order, queued=queued)
    for thread in (a, b):
        thread.join(10)
    later[0].join(10)
    assert order == ["A", "B", "C"]
    assert contents(store.get("line").history) == ["A", "B", "C"]


@pytest.mark.parametrize("wait", [True, False])
def test_a_sync_turn_whose_queued_raises_gives_up_its_place(kit: StoreKit, wait: bool) -> None:
    store = kit.make()
    order: list[str] = []

    def queued() -> None:
        raise RuntimeError("no")
    with pytest.raises(RuntimeError, match="no"):
        with store.sync_turn("line", Agent(name="Bot", instructions="x"), wait=wait, queued=queued):
            order.append("never")
    _turn_in_thread(store, "A", order, wait=False).join(10)  # the line is free again
    assert order == ["A"]
    assert contents(store.get("line").history) == ["A"]


@pytest.mark.asyncio
async def test_deleting_during_a_turn_raises_and_resurrects_nothing(kit: StoreKit) -> None:
    store = kit.make()
    engine = EchoEngine()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    await runner.run_async("del", "U1")
    engine.pause = 0.3
    task = asyncio.ensure_future(runner.run_async("del", "U2"))
    await asyncio.sleep(0.1)
    assert await store.adelete("del") is True
    with pytest.raises(SessionDeletedError):
        await task
    assert "del" not in store.list_sessions()
    assert store.get("del") is None
    fresh = store.get_or_create("del", default_agent=Agent(name="Bot", instructions="x"))
    assert fresh.history == []


@pytest.mark.asyncio
async def test_deleting_from_another_store_during_a_pruning_turn_resurrects_nothing(kit: StoreKit) -> None:
    """The deletion lands while a turn runs whose commit would prune (and, on PostgreSQL, write its rows
    in one statement): the commit is refused and nothing of the session comes back."""
    if kit.reopen is None:
        pytest.skip("not persistent: there is no other store on the same data")
    store = kit.make(default_max_turns=2)
    engine = EchoEngine()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    for text in ("U1", "U2"):
        await runner.run_async("prune-del", text)
    engine.gate = asyncio.Event()
    task = asyncio.ensure_future(runner.run_async("prune-del", "U3"))
    await asyncio.wait_for(engine.waiting.wait(), 30)  # the turn holds the session and waits on its model
    other = kit.reopen(store)
    assert await asyncio.to_thread(other.delete, "prune-del") is True
    engine.gate.set()  # the model answers only after the deletion, however long it took
    with pytest.raises(SessionDeletedError):
        await task
    assert "prune-del" not in store.list_sessions()
    assert kit.reopen(store).get("prune-del") is None


@pytest.mark.asyncio
async def test_a_failed_first_turn_leaves_no_session_and_a_retry_starts_afresh(kit: StoreKit) -> None:
    """Invariant 3 for a session the turn creates: before it there was none, so after it fails there is
    none, in memory as in storage; the retry gets the agent and metadata it asks for."""
    store = kit.make()
    support, billing = team()
    runner = Runner(support, session_store=store, engine=StepsEngine(ProviderError("down"), "A1"))
    with pytest.raises(ProviderError):
        await runner.run_async("fresh", "U1", starting_agent=support, metadata={"try": 1})
    assert "fresh" not in store.list_sessions()  # (``get`` here would hide a stale cached session)
    await runner.run_async("fresh", "U1", starting_agent=billing, metadata={"try": 2})
    live = store.get("fresh")
    assert (live.active_agent.name, live.metadata, contents(live.history)) == ("Billing", {"try": 2}, ["U1", "A1"])
    assert_reload_equals(kit, store, "fresh", live)


def test_a_persistent_store_keeps_a_bounded_history_alive_and_loads_the_rest_again(kit: StoreKit) -> None:
    """Between turns a persistent store keeps the recently used sessions alive, bounded by the messages
    their histories hold between them (a few thousand), not by the number of sessions alone: a handful
    of long conversations push the least recently used session out of memory, and it loads again whole."""
    if kit.reopen is None:
        pytest.skip("not persistent: the store is its memory")
    store = kit.make()
    agent = Agent(name="Bot", instructions="x")

    def play(session_id: str, messages: int) -> None:
        with store.sync_turn(session_id, agent) as session:
            session.add_message(Message(role=Role.USER, content=f"{session_id} asks"))
            for i in range(messages - 1):
                session.add_message(Message(role=Role.MODEL, content=f"{session_id} {i}"))

    play("short", 10)
    short = weakref.ref(store.get("short"))
    play("another", 10)
    gc.collect()
    assert short() is not None  # kept alive by the store: nothing else holds it
    for k in range(9):
        play(f"long-{k}", 1000)
    gc.collect()
    assert short() is None  # nine sessions, 9,000 messages: pushed out
    again = store.get("short")
    assert contents(again.history) == ["short asks"] + [f"short {i}" for i in range(9)]
    assert len(store.get("long-0").history) == 1000


def test_deleting_a_session_another_store_deleted_answers_false(kit: StoreKit) -> None:
    if kit.reopen is None:
        pytest.skip("not persistent: there is no other store on the same data")
    store = kit.make()
    live = store.get_or_create("gone", default_agent=Agent(name="Bot", instructions="x"))
    assert kit.reopen(store).delete("gone") is True
    assert store.delete("gone") is False  # its cached copy was stored: nothing is left to delete
    with pytest.raises(SessionDeletedError):
        live.add_message(Message(role=Role.USER, content="ghost"))


@pytest.mark.asyncio
async def test_turn_metadata_is_stored_with_its_turn_or_not_at_all(kit: StoreKit) -> None:
    store = kit.make()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store,
                    engine=StepsEngine("A1", ProviderError("down")))
    await runner.run_async("tm", "U1", {"channel": "web"}, turn_metadata={"delivery": "d1"})
    with pytest.raises(ProviderError):
        await runner.run_async("tm", "U2", turn_metadata={"delivery": "d2"})
    live = store.get("tm")
    assert (live.metadata, contents(live.history)) == ({"channel": "web", "delivery": "d1"}, ["U1", "A1"])
    assert_reload_equals(kit, store, "tm", live)


def test_a_stale_session_object_raises_after_delete(kit: StoreKit) -> None:
    store = kit.make()
    s = store.get_or_create("stale", default_agent=Agent(name="Bot", instructions="x"))
    store.delete("stale")
    with pytest.raises(SessionDeletedError):
        s.add_message(Message(role=Role.USER, content="ghost"))
    with pytest.raises(SessionDeletedError):
        _ = s.history
    assert "stale" not in store.list_sessions()


def _add_from_threads(store: Any, session_ids: list[str], threads: int, per_thread: int) -> dict[str, Any]:
    """``threads`` threads each add ``per_thread`` messages with the sync API, spread over the sessions."""
    bot = Agent(name="Bot", instructions="x")
    sessions = {sid: store.get_or_create(sid, default_agent=bot) for sid in session_ids}
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        barrier.wait()
        try:
            session = sessions[session_ids[t % len(session_ids)]]
            for i in range(per_thread):
                session.add_message(Message(role=Role.USER, content=f"T{t}-{i}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    return sessions


@pytest.mark.parametrize(("threads", "n_sessions", "per_thread"), [(15, 3, 10), (8, 1, 50)])
def test_sync_writes_from_many_threads_keep_memory_and_storage_equal(
    kit: StoreKit, threads: int, n_sessions: int, per_thread: int
) -> None:
    """Invariant 4 under threads: every message is kept once, in memory and in storage."""
    store = kit.make(default_max_turns=10_000)
    for r in range(kit.thread_rounds):
        ids = [f"threads-{r}-{k}" for k in range(n_sessions)]
        sessions = _add_from_threads(store, ids, threads, per_thread)
        for k, sid in enumerate(ids):
            writers = len(range(k, threads, n_sessions))
            live = sessions[sid]
            assert len(live.history) == writers * per_thread, (r, sid)
            assert len({m.content for m in live.history}) == writers * per_thread, (r, sid)
            # A fresh store loads every row (max_turns is above the message count), so equal
            # histories mean equal row counts too.
            assert_reload_equals(kit, store, sid, live)
            store.delete(sid)


# ---- reads and creations racing writes (invariants 4 and 11) -----------------------------------
# Pruning on: fewer turns kept than written, so most writes also delete the rows of the oldest turn.
PRUNING = pytest.mark.parametrize("max_turns", [10_000, 3], ids=["pruning-off", "pruning-on"])


def _exchange(prefix: str, turns: int) -> list[Message]:
    """``turns`` turns of a user message and its answer."""
    out: list[Message] = []
    for i in range(turns):
        out += [Message(role=Role.USER, content=f"{prefix}U{i}"), Message(role=Role.MODEL, content=f"{prefix}A{i}")]
    return out


def _kept(messages: list[Message], max_turns: int) -> list[str | None]:
    """The contents a history keeps of ``messages`` (whole turns of a user message and its answer)."""
    return contents(messages[-2 * max_turns:])


@pytest.fixture
def switch_often():
    """Threads swap the interpreter lock far more often than by default, so a race between two
    threads shows within a few rounds even where one side's critical step takes microseconds."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class _Reader:
    """A thread calling ``store.get(session_id)`` in a loop until stopped; collects what it got
    other than ``expected`` (invariant 11: one live object per session) and its errors."""

    def __init__(self, store: Any, session_id: str, expected: Any) -> None:
        self.strangers: list[Any] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        reading = threading.Event()

        def read() -> None:
            try:
                while not self._stop.is_set():
                    got = store.get(session_id)
                    reading.set()
                    if got is not expected:
                        self.strangers.append(got)
            except BaseException as exc:  # noqa: BLE001 - reported by stop()
                self.errors.append(exc)
            finally:
                reading.set()

        self._thread = threading.Thread(target=read)
        self._thread.start()
        reading.wait()  # the writes start once the reads have

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        assert self.errors == []
        assert self.strangers == []


def _fresh_loads(kit: StoreKit, store: Any) -> Callable[[str, Any], None]:
    """Invariant 4 for many sessions, on one fresh store (each id loaded from storage once)."""
    if kit.reopen is None:
        return lambda session_id, live: None
    fresh = kit.reopen(store)

    def check(session_id: str, live: Any) -> None:
        loaded = fresh.get(session_id)
        assert loaded is not None, session_id
        assert dumped(loaded.history) == dumped(live.history), session_id

    return check


@PRUNING
def test_reads_racing_sync_writes_lose_nothing(kit: StoreKit, max_turns: int, switch_often: None) -> None:
    """One thread adds messages while another reads the session again and again: every message
    whose ``add_message`` returned is kept, in the one live object and in storage."""
    store = kit.make(default_max_turns=max_turns)
    check = _fresh_loads(kit, store)
    bot = Agent(name="Bot", instructions="x")
    for r in range(kit.race_rounds):
        sid = f"sync-race-{max_turns}-{r}"
        session = store.get_or_create(sid, default_agent=bot)
        messages = _exchange(f"R{r}", 25)
        reader = _Reader(store, sid, session)
        try:
            for m in messages:
                session.add_message(m)
        finally:
            reader.stop()
        assert contents(session.history) == _kept(messages, max_turns), r
        check(sid, session)


@pytest.mark.asyncio
@PRUNING
async def test_reads_racing_async_writes_lose_nothing(kit: StoreKit, max_turns: int, switch_often: None) -> None:
    """The awaitable twin: ``aadd_message`` on the loop while a thread reads the session."""
    store = kit.make(default_max_turns=max_turns)
    check = _fresh_loads(kit, store)
    bot = Agent(name="Bot", instructions="x")
    for r in range(kit.race_rounds):
        sid = f"async-race-{max_turns}-{r}"
        session = await store.aget_or_create(sid, default_agent=bot)
        messages = _exchange(f"R{r}", 25)
        reader = _Reader(store, sid, session)
        try:
            for m in messages:
                await session.aadd_message(m)
        finally:
            reader.stop()
        assert contents(session.history) == _kept(messages, max_turns), r
        check(sid, session)


def _create_from_threads(store: Any, session_id: str, threads: int, turns: int) -> list[Any]:
    """``threads`` threads each ``get_or_create`` the new ``session_id`` at once and add ``turns`` turns
    to what they got; what each got."""
    bot = Agent(name="Bot", instructions="x")
    barrier = threading.Barrier(threads)
    got: list[Any] = [None] * threads
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            got[t] = session = store.get_or_create(session_id, default_agent=bot)
            for m in _exchange(f"T{t}-", turns):
                session.add_message(m)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    return got


@PRUNING
def test_threads_creating_one_new_session_get_one_object(kit: StoreKit, max_turns: int, switch_often: None) -> None:
    """Threads that each ``get_or_create`` the same new session id and write to it share one live
    object, and a fresh store loads what that object holds."""
    store = kit.make(default_max_turns=max_turns)
    check = _fresh_loads(kit, store)
    threads, turns = 8, 2
    written = sorted(c for t in range(threads) for c in contents(_exchange(f"T{t}-", turns)))
    for r in range(kit.race_rounds):
        sid = f"created-{max_turns}-{r}"
        got = _create_from_threads(store, sid, threads, turns)
        live = got[0]
        assert all(s is live for s in got), r
        users = [m for m in live.history if m.role == Role.USER]
        assert len(users) == min(max_turns, threads * turns), r
        if max_turns > threads * turns:
            assert sorted(contents(live.history)) == written, r
        check(sid, live)


@pytest.mark.asyncio
async def test_reads_during_a_first_turn_leave_the_turn_its_session(kit: StoreKit) -> None:
    """While a new session's first turn runs, a ``get`` and a ``get_or_create`` from other threads
    leave the turn's object the session's one live object (invariant 11)."""
    store = kit.make()
    bot = Agent(name="Bot", instructions="x")
    async with store.turn("first-reads", bot) as session:
        session.add_message(Message(role=Role.USER, content="U1"))
        seen = await asyncio.to_thread(store.get, "first-reads")
        assert seen is None or seen is session  # not stored yet (a persistent store) or the turn's own object
        assert await asyncio.to_thread(store.get_or_create, "first-reads", bot) is session
        session.add_message(Message(role=Role.MODEL, content="A1"))
    assert store.get("first-reads") is session
    assert contents(session.history) == ["U1", "A1"]
    assert_reload_equals(kit, store, "first-reads", session)


@pytest.mark.asyncio
async def test_delete_during_the_first_turn_of_a_new_session_reports_a_deletion(kit: StoreKit) -> None:
    """One answer on every store: the running first turn is stopped, so something was deleted."""
    store = kit.make()
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(history: list[Message]) -> EngineTurnResult:
        entered.set()
        await release.wait()
        return EngineTurnResult(text="late")

    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=StepsEngine(slow))
    turn = asyncio.ensure_future(runner.run_async("first-turn", "hello"))
    await asyncio.wait_for(entered.wait(), 5)
    assert await store.adelete("first-turn") is True
    release.set()
    with pytest.raises(SessionDeletedError):
        await turn
    assert "first-turn" not in await store.alist_sessions()
    assert await store.adelete("first-turn") is False


def test_a_webhook_id_is_claimed_exactly_once_across_threads(kit: StoreKit) -> None:
    store = kit.make()
    for trial in range(200):
        wins: list[bool] = []
        barrier = threading.Barrier(4)

        def claim(mid: str = f"wamid.{trial}", barrier: threading.Barrier = barrier, wins: list[bool] = wins) -> None:
            barrier.wait()
            wins.append(store.record_processed_message(mid))

        threads = [threading.Thread(target=claim) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(wins) == [False, False, False, True], trial
    assert store.is_message_processed("wamid.0") is True
    assert store.is_message_processed("never") is False


def test_the_dedup_ttl_runs_from_the_first_claim(kit: StoreKit) -> None:
    store = kit.make(dedup_ttl_hours=0.6 / 3600)
    assert store.record_processed_message("m") is True
    time.sleep(0.35)
    assert store.record_processed_message("m") is False  # a repeat inside the window...
    time.sleep(0.35)
    assert store.is_message_processed("m") is False  # ...did not extend it
    results = [store.record_processed_message("m") for _ in range(3)]
    assert results == [True, False, False]


def test_a_released_webhook_id_can_be_claimed_again_and_only_that_one(kit: StoreKit) -> None:
    store = kit.make()
    assert store.record_processed_message("failed") is True
    assert store.record_processed_message("kept") is True
    store.release_processed_message("failed")
    assert store.is_message_processed("failed") is False
    assert store.is_message_processed("kept") is True  # another id's claim stays
    assert store.record_processed_message("failed") is True  # claim -> release -> claim again wins
    assert store.record_processed_message("failed") is False  # ...once
    store.release_processed_message("never-claimed")  # an id without a claim: nothing changes
    assert store.is_message_processed("never-claimed") is False
    assert [store.is_message_processed(m) for m in ("failed", "kept")] == [True, True]
    assert store.record_processed_message("kept") is False


@pytest.mark.asyncio
async def test_the_awaitable_release_releases_the_claim(kit: StoreKit) -> None:
    store = kit.make()
    assert await store.arecord_processed_message("m") is True
    await store.arelease_processed_message("m")
    assert await store.arecord_processed_message("m") is True
    assert await store.arecord_processed_message("m") is False


class Receipt(BaseModel):
    total: Decimal
    at: datetime


@dataclass
class Parcel:
    weight: float
    tags: set[str]


@pytest.mark.asyncio
async def test_tool_results_are_stored_json_safe_and_the_next_turn_works(kit: StoreKit) -> None:
    store = kit.make()
    agent = Agent(name="Bot", instructions="x")

    @agent.tool
    def odd() -> dict:
        """Returns values JSON cannot encode directly."""
        return {"at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "amount": Decimal("1.10"),
                "id": uuid.UUID(int=7), "t": dtime(14, 5), "raw": b"\x00", "receipt": Receipt(total=Decimal("2.5"),
                at=datetime(2026, 1, 1, tzinfo=UTC)), "parcel": Parcel(1.5, {"b", "a"}), "set": {3, 1}}

    engine = StepsEngine(EngineTurnResult(tool_calls=[ToolCall(id="o1", name="odd", args={})]), "stored", "again")
    runner = Runner(agent, session_store=store, engine=engine)
    await runner.run_async("json", "go")
    await runner.run_async("json", "next")
    live = store.get("json")
    content = live.history[2].tool_results[0].content
    assert content["amount"] == "1.10" and content["t"] == "14:05:00" and content["set"] == [1, 3]
    assert content["at"] == "2026-01-02T03:04:05+00:00" and content["parcel"]["tags"] == ["a", "b"]
    assert contents(live.history)[-2:] == ["next", "again"]
    assert_reload_equals(kit, store, "json", live)


@pytest.mark.asyncio
async def test_the_engine_never_sees_an_orphan_tool_result(kit: StoreKit) -> None:
    store = kit.make()
    agent = Agent(name="Bot", instructions="x")
    s = store.get_or_create("orphan", default_agent=agent)
    orphan = Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id="gone", name="x", content="?")])
    for m in [Message(role=Role.USER, content="u1"), orphan, Message(role=Role.MODEL, content="a1")]:
        s.add_message(m)
    engine = StepsEngine("a2")
    runner = Runner(agent, session_store=store, engine=engine)
    await runner.run_async("orphan", "u2")
    assert [m.role for m in engine.seen[0]] == [Role.USER, Role.MODEL, Role.USER]
    live = store.get("orphan")
    assert [m.role for m in live.history] == [Role.USER, Role.TOOL, Role.MODEL, Role.USER, Role.MODEL]
    assert_reload_equals(kit, store, "orphan", live)


def test_memory_and_storage_agree_on_greetings_and_late_system_messages(kit: StoreKit) -> None:
    store = kit.make(default_max_turns=2)
    s = store.get_or_create("agree", default_agent=Agent(name="Bot", instructions="x"))
    s.add_message(Message(role=Role.MODEL, content="greeting"))  # before any user message: pruned
    s.add_message(Message(role=Role.USER, content="u1"))
    s.add_message(Message(role=Role.SYSTEM, content="late system"))
    s.add_message(Message(role=Role.MODEL, content="a1"))
    assert contents(s.history) == ["late system", "u1", "a1"]
    assert_reload_equals(kit, store, "agree", s)
    s.rollback_to(2)
    assert contents(s.history) == ["late system", "u1"]
    assert_reload_equals(kit, store, "agree", s)


def test_one_message_object_added_twice_is_stored_twice_and_pruned_as_two(kit: StoreKit) -> None:
    store = kit.make(default_max_turns=2)
    s = store.get_or_create("twice", default_agent=Agent(name="Bot", instructions="x"))
    ping = Message(role=Role.USER, content="ping")
    for _ in range(2):
        s.add_message(ping)
        s.add_message(Message(role=Role.MODEL, content="pong"))
    assert contents(s.history) == ["ping", "pong", "ping", "pong"]
    assert_reload_equals(kit, store, "twice", s)
    s.add_message(Message(role=Role.USER, content="third"))  # prunes the first "ping" turn only
    assert contents(s.history) == ["ping", "pong", "third"]
    assert_reload_equals(kit, store, "twice", s)


@pytest.mark.asyncio
async def test_the_runner_resolves_stored_agent_names(kit: StoreKit) -> None:
    store = kit.make()
    support, _ = team()
    handoff = EngineTurnResult(tool_calls=[ToolCall(id="h", name="transfer_to_billing", args={})])
    engine = StepsEngine(handoff, "billing here")
    await Runner(support, session_store=store, engine=engine).run_async("resolve", "refund please")
    if kit.reopen is None:
        return
    store2 = kit.reopen(store)
    support2, billing2 = team()
    Runner(support2, session_store=store2, engine=EchoEngine())
    assert store2.get("resolve").active_agent is billing2


class _Boom(Exception):
    pass


def _random_change(rnd: Any, store: Any, s: Any, agent: Agent, n: int) -> None:
    """One random change to session ``s``: messages of every role, a message object added again,
    rollback, clearing, replacing the history, or a turn that commits or fails."""
    op = rnd.choice(["user", "user", "model", "model", "tool_pair", "system", "again", "rollback",
                     "clear", "replace", "turn", "turn", "failed_turn"])
    if op in ("user", "model", "system"):
        s.add_message(Message(role=Role(op), content=f"{op}{n}"))
    elif op == "tool_pair":
        s.add_message(Message(role=Role.MODEL, tool_calls=[ToolCall(id=f"c{n}", name="t", args={})]))
        s.add_message(Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id=f"c{n}", name="t", content=n)]))
    elif op == "again" and s.history:
        s.add_message(rnd.choice(s.history))
    elif op == "rollback":
        s.rollback_to(rnd.randint(0, len(s.history)))
    elif op == "clear" and rnd.random() < 0.3:
        s.clear_history()
    elif op == "replace":
        s.history = [m for m in s.history if rnd.random() < 0.7]  # not pruned nor written until the next add
        s.add_message(Message(role=Role.USER, content=f"replaced{n}"))
    elif op in ("turn", "failed_turn"):
        try:
            with store.sync_turn(s.session_id, agent) as t:
                t.add_message(Message(role=Role.USER, content=f"turn{n}"))
                if rnd.random() < 0.5 and t.history:
                    t.add_message(rnd.choice(t.history))
                t.add_message(Message(role=Role.MODEL, content=f"answer{n}"))
                if op == "failed_turn":
                    raise _Boom()
        except _Boom:
            pass


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_memory_and_storage_agree_after_any_sequence_of_changes(kit: StoreKit, seed: int) -> None:
    # Invariant 4 under a random mix of the ways a history changes: whatever path a commit takes
    # to find the rows it writes and deletes, a fresh store must load exactly the live history.
    import random

    rnd = random.Random(seed)
    store = kit.make(default_max_turns=rnd.choice([1, 2, 3]))
    agent = Agent(name="Bot", instructions="x")
    s = store.get_or_create(f"random-{seed}", default_agent=agent)
    for n in range(40):
        _random_change(rnd, store, s, agent, n)
        assert_reload_equals(kit, store, s.session_id, s)
