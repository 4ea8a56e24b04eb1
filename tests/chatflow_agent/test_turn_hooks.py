"""Per-turn commit hooks: the work a turn carries into its own commit, run inside it, able to refuse it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from chatflow_agent import Agent, Runner, SessionStore, SQLiteSessionStore
from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_agent.core.gate import REQUEST_HUMAN, TurnDecision, request_human_tool
from chatflow_agent.core.hooks import TurnCommit, TurnHooks
from chatflow_agent.core.memory import PersistentSessionStore
from chatflow_agent.exceptions import SessionBusyError
from chatflow_agent.types import ToolCall
from tests.chatflow_agent.test_backend_contract import DictBackend, DictDatabase


def make_agent(engine: Any, **kwargs: Any) -> Agent:
    return Agent(name="Support", instructions="You are Support.", model="test-model", engine=engine, **kwargs)


@pytest.fixture(params=["memory", "sqlite", "dict-backend"])
def store(request: Any, tmp_path: Path) -> Any:
    if request.param == "memory":
        yield SessionStore()
        return
    if request.param == "dict-backend":  # the backend written from the public contract only
        store = PersistentSessionStore(DictBackend(DictDatabase()))
    else:
        store = SQLiteSessionStore(str(tmp_path / "hooks.db"))
    yield store
    store.close()


def stored_roles(store: Any, session_id: str) -> list[str]:
    session = store.get(session_id)
    return [] if session is None else [m.role.value for m in session.history]


@pytest.mark.asyncio
async def test_a_turn_given_no_hooks_and_no_gate_carries_an_empty_hook_list(store: Any) -> None:
    hooks = TurnHooks()
    runner = Runner(make_agent(ScriptedEngine(EngineTurnResult(text="hi"))), session_store=store)
    await runner.run_async("s1", "hello", hooks=hooks)
    assert hooks.on_commit == []
    assert stored_roles(store, "s1") == ["user", "model"]


@pytest.mark.asyncio
async def test_commit_hooks_run_in_order_once_with_the_commit_and_its_report(store: Any) -> None:
    seen: list[tuple[str, str, dict[str, Any], str | None]] = []

    def first(commit: TurnCommit) -> None:
        answer = None if commit.report is None or commit.report.response is None else commit.report.response.content
        seen.append(("first", commit.session_id, commit.metadata, answer))

    def second(commit: TurnCommit) -> None:
        seen.append(("second", commit.session_id, commit.metadata, None))

    runner = Runner(make_agent(ScriptedEngine(EngineTurnResult(text="hi"))), session_store=store)
    await runner.run_async("s1", "hello", turn_metadata={"marker": "m-1"}, hooks=TurnHooks([first, second]))
    assert seen == [("first", "s1", {"marker": "m-1"}, "hi"), ("second", "s1", {"marker": "m-1"}, None)]


@pytest.mark.asyncio
async def test_a_commit_hook_that_raises_refuses_the_commit_and_the_turn_is_rolled_back(store: Any) -> None:
    runner = Runner(make_agent(ScriptedEngine(EngineTurnResult(text="one"), EngineTurnResult(text="two"))),
                    session_store=store)
    await runner.run_async("s1", "first")

    def refuse(commit: TurnCommit) -> None:
        raise SessionBusyError(commit.session_id)

    with pytest.raises(SessionBusyError):
        await runner.run_async("s1", "second", hooks=TurnHooks([refuse]))
    assert stored_roles(store, "s1") == ["user", "model"]
    assert [m.content for m in runner.session_store.get("s1").history] == ["first", "one"]


def test_a_sync_turn_runs_its_hooks_and_a_refusal_writes_nothing(store: Any) -> None:
    agent = make_agent(ScriptedEngine())
    seen: list[str] = []
    with store.sync_turn("s1", agent, hooks=TurnHooks([lambda c: seen.append(c.session_id)])) as session:
        session.metadata["k"] = "v"
    assert seen == ["s1"] and store.get("s1").metadata == {"k": "v"}

    def refuse(commit: TurnCommit) -> None:
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        with store.sync_turn("s1", agent, hooks=TurnHooks([refuse])) as session:
            session.metadata["k"] = "changed"
    assert store.get("s1").metadata == {"k": "v"}


def test_a_sqlite_hook_runs_inside_the_commits_transaction(tmp_path: Path) -> None:
    """What the hook sees of the database is the commit's own transaction: the write lock is held (BEGIN
    IMMEDIATE), so another connection cannot write until the commit ends."""
    path = str(tmp_path / "tx.db")
    store = SQLiteSessionStore(path)
    seen: list[str] = []

    def try_to_write(commit: TurnCommit) -> None:
        other = sqlite3.connect(path, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            seen.append(str(err))
        finally:
            other.close()

    try:
        with store.sync_turn("s1", make_agent(ScriptedEngine()), hooks=TurnHooks([try_to_write])) as session:
            session.metadata["k"] = "v"
    finally:
        store.close()
    assert seen == ["database is locked"]


@pytest.mark.asyncio
async def test_the_gates_decision_and_the_human_request_add_their_hooks_to_the_turn() -> None:
    engine = ScriptedEngine(EngineTurnResult(tool_calls=[ToolCall(id="c1", name=REQUEST_HUMAN, args={"reason": "r"})]))
    applied: list[str] = []

    def gate_hook(commit: TurnCommit) -> None:
        applied.append("gate")

    def request_hook(commit: TurnCommit) -> None:
        applied.append("request")

    def on_request(session: Any, reason: str) -> Any:
        return request_hook

    runner = Runner(make_agent(engine, tools=[request_human_tool()]),
                    turn_gate=lambda session, text: TurnDecision(on_commit=gate_hook), on_human_request=on_request,
                    human_request_reply="Someone will answer you here.")
    hooks = TurnHooks()
    await runner.run_async("s1", "a person please", hooks=hooks)
    assert hooks.on_commit == [gate_hook, request_hook]
    assert applied == ["gate", "request"]


@pytest.mark.asyncio
async def test_a_human_request_hook_returning_a_value_that_is_no_hook_adds_nothing(caplog) -> None:
    engine = ScriptedEngine(EngineTurnResult(tool_calls=[ToolCall(id="c1", name=REQUEST_HUMAN, args={"reason": "r"})]))
    runner = Runner(make_agent(engine, tools=[request_human_tool()]), on_human_request=lambda session, reason: True,
                    human_request_reply="Someone will answer you here.")
    hooks = TurnHooks()
    response = await runner.run_async("s1", "a person please", hooks=hooks)
    assert response.human_requested == "r" and hooks.on_commit == []
    assert "on_human_request returned bool, not a commit hook: ignored" in caplog.text
