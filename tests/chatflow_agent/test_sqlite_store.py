"""SQLiteSessionStore beyond the shared contract (issue 3): the 0.3.4 fixture, the constructor,
the schema version, cross-process turns, claims, leases and deletes, the event loop while
another process holds the write lock, the agent placeholder and the in-memory URI forms.

The contract suite (tests/store_contract.py) already runs on the file and in-memory forms.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import chatflow_agent
import chatflow_agent.core.memory as core_memory
from chatflow_agent import Agent, Message, Role, Runner, SessionBusyError, SessionDeletedError, SQLiteSessionStore
from chatflow_agent.core._pruning import engine_view
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.exceptions import StoreSchemaError
from tests.processes import REPO

FIXTURES = REPO / "tests" / "fixtures"
SEED_TABLES = ("chatflow_sessions", "chatflow_messages", "chatflow_processed_messages")


def fixture_summary() -> dict:
    text = (FIXTURES / "chatflow_034.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)\n```", text, re.S)
    return json.loads(blocks[-1])


def columns(path: Path) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(path)
    try:
        return {t: conn.execute(f"PRAGMA table_info({t})").fetchall() for t in SEED_TABLES}
    finally:
        conn.close()


def raw_rows(path: Path, session_id: str) -> list[tuple[int, str, str | None, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT id, role, content, message_json FROM chatflow_messages WHERE session_id = ? ORDER BY id",
            (session_id,),
        ).fetchall()
    finally:
        conn.close()


def count(path: Path, sql: str, *params) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()


def user_version(path: Path) -> int:
    return count(path, "PRAGMA user_version")


class Recorder(BaseEngine):
    """Answers "re: <last user text>"; records the agent and what it was shown."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None  # when set: wait for it before answering
        self.waiting = asyncio.Event()  # set once a call waits at the gate
        self.calls: list[tuple[str, list[Message]]] = []

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        self.calls.append((agent.name, list(history)))
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        return EngineTurnResult(text=f"re: {history[-1].content}")


@pytest.fixture
def store_factory():
    opened: list[SQLiteSessionStore] = []

    def make(*args, **kwargs) -> SQLiteSessionStore:
        store = SQLiteSessionStore(*args, **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def fixture_db(tmp_path: Path) -> Path:
    path = tmp_path / "chatflow_034.db"
    shutil.copyfile(FIXTURES / "chatflow_034.db", path)
    return path


def child(*args: str, **kwargs) -> subprocess.Popen[str]:
    """``python -m tests.chatflow_agent._procs *args`` with this interpreter, from the repository root."""
    env = dict(os.environ, PYTHONWARNINGS="error")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.chatflow_agent._procs", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 15) -> None:
    """Polls for ``path`` (written by the child ``proc``); blocking, so async tests run it in a thread."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def team() -> tuple[Agent, Agent]:
    billing = Agent(name="Billing", instructions="Billing")
    support = Agent(name="Support", instructions="Support", handoffs=[billing])
    return support, billing


# ---- the 0.3.4 compatibility fixture ------------------------------------------------------

def test_the_034_fixture_opens_with_the_same_sessions_agents_metadata_and_messages(fixture_db, store_factory) -> None:
    summary = fixture_summary()
    store = store_factory(fixture_db)
    support, _billing = team()
    Runner(support, session_store=store)  # installs the agent resolver
    assert sorted(store.list_sessions()) == sorted(s["session_id"] for s in summary["sessions"])
    for expected in summary["sessions"]:
        sid = expected["session_id"]
        session = store.get(sid)
        assert session is not None, sid
        assert session.active_agent.name == expected["active_agent_name"]
        assert session.metadata == expected["metadata"]
        rows = raw_rows(fixture_db, sid)
        assert [r[0] for r in rows] == expected["message_ids"]
        assert [m.role.value for m in session.history] == expected["roles"]
        # byte for byte what 0.3.4 wrote, in order
        assert [m.model_dump_json() for m in session.history] == [r[3] for r in rows]
    for mid in summary["processed_message_ids"]:
        assert store.record_processed_message(mid) in (True, False)  # readable; expiry depends on the build date

    unicode = store.get("unicode-olá 👋")
    long = unicode.history[6]
    assert len(long.content) == 20_000
    assert long.content == raw_rows(fixture_db, "unicode-olá 👋")[6][2]
    assert "👋🏽🚀" in long.content and "こんにちは世界" in long.content
    assert unicode.history[1].content == "Tudo ótimo, obrigado! Como posso ajudar? 🇧🇷"
    calls = store.get("parallel-tools").history[1].tool_calls
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_par_1", "check_order_status", {"order_id": "B-2002"}),
        ("call_par_2", "get_store_hours", {"city": "Lisbon"}),
    ]
    failing = store.get("web-failing-tool").history[2].tool_results[0]
    assert failing.is_error is True and failing.content.startswith("Tool execution failed")


@pytest.mark.asyncio
async def test_a_new_turn_continues_every_034_session(fixture_db, store_factory) -> None:
    summary = fixture_summary()
    before_columns = columns(fixture_db)
    store = store_factory(fixture_db)
    engine = Recorder()
    support, _billing = team()
    runner = Runner(support, session_store=store, engine=engine)
    for expected in summary["sessions"]:
        sid = expected["session_id"]
        old = [r[3] for r in raw_rows(fixture_db, sid)]
        previous = store.get(sid)
        shown_before = engine_view(previous.history)
        response = await runner.run_async(sid, f"next for {sid} ✅")
        agent_name, shown = engine.calls[-1]
        assert agent_name == expected["active_agent_name"]  # the Billing session stays with Billing
        assert [m.model_dump_json() for m in shown[:-1]] == [m.model_dump_json() for m in shown_before]
        assert shown[-1].content == f"next for {sid} ✅"
        assert response.content == f"re: next for {sid} ✅"
        rows = raw_rows(fixture_db, sid)
        assert [r[3] for r in rows[: len(old)]] == old  # nothing rewritten or lost
        assert [(r[1], r[2]) for r in rows[len(old):]] == [("user", f"next for {sid} ✅"),
                                                           ("model", f"re: next for {sid} ✅")]
        assert rows[len(old)][0] > 46
        assert store.get(sid).metadata == expected["metadata"]
    store.close()

    # a fresh store sees the same, and plain sqlite3 still reads the file with the same columns
    assert columns(fixture_db) == before_columns
    fresh = store_factory(fixture_db)
    for expected in summary["sessions"]:
        s = fresh.get(expected["session_id"])
        assert len(s.history) == expected["message_count"] + 2
    conn = sqlite3.connect(fixture_db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        for (mj,) in conn.execute("SELECT message_json FROM chatflow_messages WHERE id > 46"):
            assert set(json.loads(mj)) == {"role", "content", "tool_calls", "tool_results", "timestamp"}
        assert conn.execute("SELECT COUNT(*) FROM chatflow_messages").fetchone() == (38 + 2 * 7,)
    finally:
        conn.close()


# ---- constructor and exports ---------------------------------------------------------------

def test_the_constructor_rejects_unknown_keywords_and_non_positive_numbers(tmp_path) -> None:
    with pytest.raises(TypeError):
        SQLiteSessionStore(str(tmp_path / "a.db"), busy_timeout=5000)  # type: ignore[call-arg]
    for kwargs in ({"default_max_turns": 0}, {"default_max_turns": -1}, {"dedup_ttl_hours": 0}):
        with pytest.raises(ValueError):
            SQLiteSessionStore(str(tmp_path / "b.db"), **kwargs)
    store = SQLiteSessionStore(db_path=str(tmp_path / "c.db"), default_max_turns=3, dedup_ttl_hours=1)
    assert (store.default_max_turns, store.dedup_ttl_hours) == (3, 1)
    store.close()


def test_it_is_exported_and_uses_four_blocking_workers() -> None:
    assert chatflow_agent.SQLiteSessionStore is core_memory.SQLiteSessionStore
    assert "SQLiteSessionStore" in chatflow_agent.__all__
    assert core_memory._BLOCKING_IO_WORKERS == 4


# ---- schema version ------------------------------------------------------------------------

def test_a_new_file_gets_schema_version_2(tmp_path, store_factory) -> None:
    path = tmp_path / "new.db"
    store_factory(str(path))
    assert user_version(path) == 2
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {*SEED_TABLES, "chatflow_session_leases"} <= tables


def test_a_newer_schema_version_is_refused_clearly(tmp_path) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreSchemaError, match=r"schema version 99.*up to 2"):
        SQLiteSessionStore(str(path))
    assert user_version(path) == 99  # left alone


def test_a_lease_table_with_a_rowid_is_rebuilt_without_one_keeping_its_leases(tmp_path, store_factory) -> None:
    path = tmp_path / "django-made.db"
    store_factory(str(path)).close()
    conn = sqlite3.connect(path)  # the lease table as Django's migration 0002 creates it, one lease held
    conn.execute("DROP TABLE chatflow_session_leases")
    conn.execute("CREATE TABLE chatflow_session_leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                 "expires_at REAL NOT NULL)")
    conn.execute("INSERT INTO chatflow_session_leases VALUES ('held', 'other-process', 9e99)")
    conn.commit()
    conn.close()
    store = store_factory(str(path))
    ddl = sqlite3.connect(path).execute(
        "SELECT sql FROM sqlite_master WHERE name = 'chatflow_session_leases'").fetchone()[0]
    assert "WITHOUT ROWID" in ddl.upper()
    assert count(path, "SELECT COUNT(*) FROM chatflow_session_leases WHERE owner = 'other-process'") == 1
    agent = Agent(name="Bot", instructions="x")
    with pytest.raises(SessionBusyError):  # the lease it held still holds
        with store.sync_turn("held", agent, wait=False):
            pass
    with store.sync_turn("free", agent) as session:
        session.add_message(Message(role=Role.USER, content="hi"))
    assert [m.content for m in store.get("free").history] == ["hi"]


def test_a_034_file_is_upgraded_in_place(fixture_db, store_factory) -> None:
    assert user_version(fixture_db) == 1
    assert count(fixture_db, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'chatflow_session_leases'") == 0
    before = columns(fixture_db)
    store_factory(str(fixture_db)).close()
    assert user_version(fixture_db) == 2
    assert count(fixture_db, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'chatflow_session_leases'") == 1
    assert columns(fixture_db) == before
    assert count(fixture_db, "SELECT COUNT(*) FROM chatflow_messages") == 38


# ---- across processes ------------------------------------------------------------------------

@pytest.mark.slow
def test_two_processes_running_turns_on_one_session_alternate_strictly(tmp_path, store_factory) -> None:
    db = str(tmp_path / "two.db")
    store_factory(db).close()  # schema first, so the children race on turns only
    go = tmp_path / "go"
    procs = [child("turns", db, "shared", tag, "25", str(go)) for tag in ("p1", "p2")]
    time.sleep(0.3)
    go.write_text("go")
    seen = [view for proc in procs for view in json.loads(finish(proc, timeout=60))]
    contents = [c for _id, _role, c, _json in raw_rows(Path(db), "shared")]
    assert len(contents) == 100
    for i in range(0, 100, 2):
        assert contents[i].startswith("U:"), (i, contents[i - 2: i + 2])
        assert contents[i + 1] == "A" + contents[i][1:], (i, contents[i: i + 2])
    for tag in ("p1", "p2"):
        assert [c for c in contents[::2] if c.startswith(f"U:{tag}:")] == [f"U:{tag}:{i}" for i in range(25)]
    # serialised, not merely committed together: every turn saw all turns committed before it
    assert len(seen) == 50
    for view in seen:
        k = contents.index(view[-1])
        assert view == contents[: k + 1], view[-1]
    live = store_factory(db, default_max_turns=1000).get("shared")
    assert [m.content for m in live.history] == contents


@pytest.mark.slow
def test_four_threads_and_two_processes_claim_each_id_exactly_once(tmp_path, store_factory) -> None:
    db = str(tmp_path / "claims.db")
    store = store_factory(db)
    n = 200
    start = time.time() + 1.5  # children import chatflow_agent meanwhile
    procs = [child("claim", db, str(n), repr(start)) for _ in range(2)]
    local: list[list[bool]] = [[] for _ in range(4)]

    def claim(results: list[bool]) -> None:
        for i in range(n):
            delay = start + i * 0.005 - time.time()
            if delay > 0:
                time.sleep(delay)
            results.append(store.record_processed_message(f"trial-{i}"))

    threads = [threading.Thread(target=claim, args=(r,)) for r in local]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    remote = [json.loads(finish(p)) for p in procs]
    for i in range(n):
        wins = [r[i] for r in local + remote]
        assert wins.count(True) == 1, (i, wins)
    assert store.is_message_processed("trial-0") and store.is_message_processed(f"trial-{n - 1}")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_event_loop_keeps_ticking_while_another_process_holds_the_write_lock(tmp_path, store_factory) -> None:
    db = str(tmp_path / "locked.db")
    store = store_factory(db)
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Recorder())
    await runner.run_async("s", "warm up")  # pool threads and their connections exist
    ready, done = tmp_path / "ready", tmp_path / "done"
    holder = child("hold-lock", db, "1.5", str(ready), str(done))
    try:
        await asyncio.to_thread(wait_for_file, ready, holder)
        gaps: list[float] = []
        stop = False

        async def heartbeat() -> None:
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last - 0.01)
                last = now

        beat = asyncio.ensure_future(heartbeat())
        started = time.time()
        response = await runner.run_async("s", "while locked")
        finished = time.time()
        stop = True
        await beat
    finally:
        finish(holder)
    released = float(done.read_text())
    assert response.content == "re: while locked"
    assert finished >= released  # the turn waited for the lock...
    assert finished - started > 1.0
    assert max(gaps) < 0.05, max(gaps)  # ...without stalling the loop
    assert len(gaps) > 50


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_process_lease_expires_and_the_next_turn_proceeds(tmp_path, store_factory) -> None:
    db = str(tmp_path / "lease.db")
    store = store_factory(db)
    store.lease_ttl_seconds = 1.0
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Recorder())
    await runner.run_async("s", "U1")
    ready = tmp_path / "ready"
    proc = child("hang", db, "s", str(ready))
    try:
        await asyncio.to_thread(wait_for_file, ready, proc)
        assert count(Path(db), "SELECT COUNT(*) FROM chatflow_session_leases WHERE session_id = 's'") == 1
        async with asyncio.timeout(5):
            with pytest.raises(SessionBusyError):  # the child's lease holds the session
                async with store.turn("s", runner.starting_agent, wait=False):
                    pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    async with asyncio.timeout(10):  # a hang guard: the dead child's lease expires after 1 s
        await runner.run_async("s", "U3")
    history = [m.content for m in store_factory(db).get("s").history]
    assert history == ["U1", "re: U1", "U3", "re: U3"]
    assert count(Path(db), "SELECT COUNT(*) FROM chatflow_messages WHERE content LIKE '%killed%'") == 0
    assert count(Path(db), "SELECT COUNT(*) FROM chatflow_session_leases") == 0


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_delete_from_another_process_during_a_turn_raises_and_leaves_nothing(tmp_path, store_factory) -> None:
    db = str(tmp_path / "delete.db")
    store = store_factory(db)
    engine = Recorder()
    agent = Agent(name="Bot", instructions="x")
    runner = Runner(agent, session_store=store, engine=engine)
    await runner.run_async("doomed", "U1")
    engine.gate = asyncio.Event()  # the turn below waits in the engine until the gate opens
    turn = asyncio.ensure_future(runner.run_async("doomed", "U2"))
    async with asyncio.timeout(15):
        await engine.waiting.wait()
    out = await asyncio.to_thread(finish, child("delete", db, "doomed"))
    assert json.loads(out) is True
    engine.gate.set()
    with pytest.raises(SessionDeletedError):
        await turn
    for table in ("chatflow_sessions", "chatflow_messages", "chatflow_session_leases"):
        assert count(Path(db), f"SELECT COUNT(*) FROM {table} WHERE session_id = ?", "doomed") == 0
    assert store.get("doomed") is None
    fresh = store.get_or_create("doomed", default_agent=agent)
    assert fresh.history == []
    await runner.run_async("doomed", "again")
    assert [m.content for m in store_factory(db).get("doomed").history] == ["again", "re: again"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_delete_and_recreate_from_another_process_fails_the_turn_and_keeps_the_new_session(
    tmp_path, store_factory
) -> None:
    db = str(tmp_path / "recreate.db")
    store = store_factory(db)
    engine = Recorder()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    await runner.run_async("s", "U1")
    engine.gate = asyncio.Event()
    turn = asyncio.ensure_future(runner.run_async("s", "U2"))
    async with asyncio.timeout(15):
        await engine.waiting.wait()
    await asyncio.to_thread(finish, child("delete", db, "s", "new life"))
    engine.gate.set()
    with pytest.raises(SessionDeletedError):  # the incarnation token changed
        await turn
    assert [r[2] for r in raw_rows(Path(db), "s")] == ["new life"]
    assert [m.content for m in store.get("s").history] == ["new life"]


# ---- leases within one file, without subprocesses ---------------------------------------------

def test_a_sync_turn_longer_than_the_lease_ttl_keeps_its_lease(tmp_path, store_factory) -> None:
    db = str(tmp_path / "sync.db")
    first, second = store_factory(db), store_factory(db)  # two stores: no shared in-process lock
    first.lease_ttl_seconds = second.lease_ttl_seconds = 0.3
    agent = Agent(name="Bot", instructions="x")
    order: list[str] = []
    inside = threading.Event()

    def long_turn() -> None:
        with first.sync_turn("s", agent) as session:
            inside.set()
            session.add_message(Message(role=Role.USER, content="first"))
            time.sleep(1.0)  # more than three lease lifetimes
            order.append("first done")

    worker = threading.Thread(target=long_turn)
    worker.start()
    assert inside.wait(5)
    with second.sync_turn("s", agent) as session:
        order.append("second in")
        session.add_message(Message(role=Role.USER, content="second"))
    worker.join()
    assert order == ["first done", "second in"]
    assert [r[2] for r in raw_rows(Path(db), "s")] == ["first", "second"]


@pytest.mark.asyncio
async def test_a_turn_that_lost_its_lease_fails_and_writes_nothing(tmp_path, store_factory) -> None:
    db = str(tmp_path / "lost.db")
    store = store_factory(db)
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Recorder())
    await runner.run_async("s", "U1")

    def steal(_event) -> None:  # as if our renewals stalled past expiry and another turn took it
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("UPDATE chatflow_session_leases SET owner = 'someone-else', expires_at = ?", (time.time() + 60,))
        conn.close()

    runner.subscribe(lambda e: steal(e) if e.type == "turn_started" else None)
    with pytest.raises(SessionBusyError):
        await runner.run_async("s", "U2")
    assert [r[2] for r in raw_rows(Path(db), "s")] == ["U1", "re: U1"]
    assert [m.content for m in store.get("s").history] == ["U1", "re: U1"]


# ---- agents without a resolver --------------------------------------------------------------

def test_without_a_resolver_get_returns_a_placeholder_agent_and_warns_once(tmp_path, store_factory, caplog) -> None:
    from chatflow_agent import tool

    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return order_id

    db = str(tmp_path / "ghost.db")
    writer = store_factory(db)
    ghost = Agent(name="Ghost", instructions="x", tools=[lookup])
    for sid in ("g1", "g2"):
        s = writer.get_or_create(sid, default_agent=ghost, metadata={"k": sid})
        s.add_message(Message(role=Role.USER, content=f"hi {sid}"))
    reader = store_factory(db)
    with caplog.at_level(logging.WARNING, logger="chatflow_agent.memory"):
        s1 = reader.get("g1")
        s2 = reader.get("g2")
        again = reader.get("g1")
    assert s1.active_agent.name == s2.active_agent.name == "Ghost"
    assert s1.active_agent is not ghost
    assert s1.active_agent.tools == [] and s1.active_agent.get_all_tools() == []
    assert [m.content for m in again.history] == ["hi g1"] and again.metadata == {"k": "g1"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "Ghost" in r.getMessage()]
    assert len(warnings) == 1


# ---- in-memory URI forms ----------------------------------------------------------------------

@pytest.mark.asyncio
@pytest.mark.parametrize("form", [":memory:", "file::memory:?cache=shared", "file:{name}?mode=memory&cache=shared"])
async def test_in_memory_forms_work_end_to_end(form, store_factory) -> None:
    db = form.format(name=f"chatflow-{uuid.uuid4().hex}")
    sid = f"mem-{uuid.uuid4().hex}"
    store = store_factory(db)
    engine = Recorder()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    for i in range(3):
        await runner.run_async(sid, f"U{i}")
    expected = [x for i in range(3) for x in (f"U{i}", f"re: U{i}")]
    assert [m.content for m in store.get(sid).history] == expected
    assert engine.calls[-1][1][-1].content == "U2" and len(engine.calls[-1][1]) == 5
    assert store.backend.inline  # ran inline, never on the pool
    if form == ":memory:":
        other = store_factory(db)
        assert other.get(sid) is None  # a private database per connection
        return
    reloaded = store_factory(db)
    again = reloaded.get(sid)
    assert again is not None
    assert [m.content for m in again.history] == expected
    assert again.active_agent.name == "Bot"
    await Runner(Agent(name="Bot", instructions="x"), session_store=reloaded, engine=engine).run_async(sid, "U3")
    assert [m.content for m in store.get(sid).history] == [*expected, "U3", "re: U3"]


def test_the_lease_goes_to_waiters_in_arrival_order(tmp_path, store_factory) -> None:
    """FIFO across processes (invariant 2): a released lease goes to the first in line, not to
    whoever polls first. Lease owners here stand for turns of different processes."""
    store = store_factory(str(tmp_path / "fifo.db"))
    assert store.backend.acquire_lease("s", "p1-turn1", 30, queue=True) is True
    assert store.backend.acquire_lease("s", "p2-turn1", 30, queue=True) is False  # p2 joins the line
    store.backend.release_lease("s", "p1-turn1")
    assert store.backend.acquire_lease("s", "p1-turn2", 30, queue=True) is False  # p1 comes back: behind p2
    assert store.backend.acquire_lease("s", "p3-turn1", 30, queue=True) is False  # p3 arrives: behind p1
    assert store.backend.acquire_lease("s", "p3-turn1", 30, queue=True) is False
    assert store.backend.acquire_lease("s", "p2-turn1", 30, queue=True) is True
    store.backend.release_lease("s", "p2-turn1")
    assert store.backend.acquire_lease("s", "p3-turn1", 30, queue=True) is False
    assert store.backend.acquire_lease("s", "p1-turn2", 30, queue=True) is True
    store.backend.release_lease("s", "p1-turn2")
    assert store.backend.acquire_lease("s", "p3-turn1", 30, queue=True) is True


def test_a_waiter_that_gives_up_does_not_block_the_line(tmp_path, store_factory) -> None:
    store = store_factory(str(tmp_path / "fifo.db"))
    assert store.backend.acquire_lease("s", "a", 30, queue=True) is True
    assert store.backend.acquire_lease("s", "b", 30, queue=True) is False
    store.backend.leave_queue("s", "b")  # b's turn was cancelled while waiting
    store.backend.release_lease("s", "a")
    assert store.backend.acquire_lease("s", "c", 30, queue=True) is True
    assert store.backend.acquire_lease("s", "d", 30, queue=False) is False  # no-wait callers never queue
    assert not store.backend.read("SELECT 1 FROM chatflow_session_waiters WHERE owner = 'd'")


@pytest.mark.asyncio
async def test_a_turn_commit_knows_the_new_version_so_the_next_turn_does_not_reload(tmp_path, store_factory):
    from chatflow_agent import Agent, Runner
    from chatflow_agent.core.engines import ScriptedEngine

    store = store_factory(str(tmp_path / "version.db"), default_max_turns=2)
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store,
                    engine=ScriptedEngine("a1", "a2", "a3", "a4"))
    loads = []
    original = store.backend.load
    store.backend.load = lambda sid: loads.append(sid) or original(sid)
    for n in range(1, 5):  # turns 3 and 4 also prune (delete) rows
        await runner.run_async("v", f"u{n}")
    assert loads == []  # the session was loaded once (by nobody: it was new) and kept current since


async def cancel_while_locked(task: asyncio.Task, writer: sqlite3.Connection, wait: float = 0.2) -> None:
    """Cancel ``task`` while ``writer`` holds the file's write lock, then let go of the lock;
    ``task`` must have waited for the database work it had started, and end cancelled."""
    try:
        await asyncio.sleep(wait)
        task.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()
    finally:
        writer.close()  # rolls back its BEGIN IMMEDIATE: the waiting write proceeds
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.asyncio
async def test_a_turn_cancelled_while_its_commit_is_written_keeps_memory_equal_to_the_file(tmp_path, store_factory):
    """Cancellation cannot stop a commit already running on a pool thread: the turn waits for
    it, keeps what was written (memory equals the file, invariant 4) and then re-raises."""
    db = tmp_path / "cancel.db"
    store = store_factory(str(db))
    agent = Agent(name="Bot", instructions="x")
    async with store.turn("s", agent) as session:
        await session.aadd_message(Message(role=Role.USER, content="U1"))

    writer = sqlite3.connect(db, isolation_level=None)  # another connection, holding the write lock
    writing = asyncio.Event()

    async def second_turn() -> None:
        async with store.turn("s", agent) as session:
            await session.aadd_message(Message(role=Role.USER, content="U2"))
            writer.execute("BEGIN IMMEDIATE")
            writing.set()
        # the commit now waits for the lock on a pool thread

    task = asyncio.create_task(second_turn())
    await writing.wait()
    await cancel_while_locked(task, writer)

    on_file = [r[2] for r in raw_rows(db, "s")]
    assert on_file == ["U1", "U2"]
    assert [m.content for m in store.get("s").history] == on_file
    async with store.turn("s", agent) as session:
        await session.aadd_message(Message(role=Role.USER, content="U3"))
    fresh = store_factory(str(db))
    assert [r[2] for r in raw_rows(db, "s")] == ["U1", "U2", "U3"]
    assert [m.content for m in fresh.get("s").history] == ["U1", "U2", "U3"]
    assert [m.content for m in store.get("s").history] == ["U1", "U2", "U3"]


@pytest.mark.asyncio
async def test_a_turn_cancelled_while_taking_the_lease_leaves_no_lease_behind(tmp_path, store_factory):
    """The lease may be won on the pool thread after the waiting task was cancelled; it is
    released then, instead of blocking the session until its TTL runs out."""
    db = tmp_path / "lease.db"
    store = store_factory(str(db))
    agent = Agent(name="Bot", instructions="x")
    async with store.turn("s", agent) as session:
        await session.aadd_message(Message(role=Role.USER, content="U1"))

    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # the turn's lease write waits for this lock

    async def turn() -> None:
        async with store.turn("s", agent) as session:
            await session.aadd_message(Message(role=Role.USER, content="never"))

    await cancel_while_locked(asyncio.create_task(turn()), writer, wait=0.3)
    assert count(db, "SELECT count(*) FROM chatflow_session_leases") == 0
    other = store_factory(str(db))  # another owner gets the session at once
    async with asyncio.timeout(5):
        async with other.turn("s", agent) as session:
            await session.aadd_message(Message(role=Role.USER, content="U2"))
    assert [r[2] for r in raw_rows(db, "s")] == ["U1", "U2"]


@pytest.mark.asyncio
async def test_a_runner_turn_cancelled_while_its_commit_is_written_reports_it_completed(tmp_path, store_factory):
    db = tmp_path / "events.db"
    store = store_factory(str(db))
    writer = sqlite3.connect(db, isolation_level=None)
    answered = asyncio.Event()

    class LockingEngine(BaseEngine):
        """Answers, then has another connection take the write lock, so the commit must wait."""

        async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
            writer.execute("BEGIN IMMEDIATE")
            answered.set()
            return EngineTurnResult(text="A1")

    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=LockingEngine())
    events: list[str] = []
    runner.subscribe(lambda e: events.append(e.type))
    task = asyncio.create_task(runner.run_async("s", "U1"))
    await answered.wait()
    await cancel_while_locked(task, writer)
    assert [r[2] for r in raw_rows(db, "s")] == ["U1", "A1"]
    assert [m.content for m in store.get("s").history] == ["U1", "A1"]
    assert events[0] == "turn_started" and events[-1] == "turn_completed" and "turn_failed" not in events


@pytest.mark.asyncio
async def test_sessions_kept_between_turns_hold_a_bounded_number_of_messages(tmp_path, store_factory):
    """A long-running process (a queue worker) plays turns for many growing conversations: the sessions
    the store keeps alive between turns hold at most a few thousand messages, not every history it saw."""
    import gc
    import weakref

    store = store_factory(str(tmp_path / "many.db"))
    agent = Agent(name="Bot", instructions="x")
    kept: list[weakref.ref] = []
    for i in range(300):
        async with store.turn(f"s{i}", agent) as session:
            for k in range(10):
                await session.aadd_message(Message(role=Role.USER, content=f"q{k}"))
                await session.aadd_message(Message(role=Role.MODEL, content=f"a{k}"))
        kept.append(weakref.ref(session))
    gc.collect()
    alive = [s for s in (ref() for ref in kept) if s is not None]
    # the bound is applied when a session is taken for a turn: the last turn's 20 messages came after it
    assert sum(len(s.history) for s in alive) <= 4096 + 20  # 300 sessions of 20 messages: 6,000 without it
    assert kept[-1]() is not None  # the newest sessions stay cached: their next turn reads only the head
    async with store.turn("s0", agent) as session:  # one pushed out is loaded again, whole
        assert [m.content for m in session.history][:2] == ["q0", "a0"] and len(session.history) == 20
