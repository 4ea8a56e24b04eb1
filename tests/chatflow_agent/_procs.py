"""Child processes for the cross-process SQLite store tests (tests/chatflow_agent/test_sqlite_store.py).

Run as ``python -m tests.chatflow_agent._procs COMMAND ARGS...`` from the repository root:

- ``turns DB SESSION TAG N GO``: wait for the file GO, then play N turns ("U:TAG:i" → "A:TAG:i");
  prints a JSON list of what the engine was shown in each turn.
- ``claim DB N START``: from the wall-clock time START on, claim "trial-0".."trial-{N-1}", one every
  5 ms; prints a JSON list of the results.
- ``hold-lock DB SECONDS READY DONE``: hold SQLite's write lock (BEGIN IMMEDIATE) for SECONDS, then
  COMMIT and write the release time to DONE. READY is written once the lock is held.
- ``hang DB SESSION READY``: start a turn (lease TTL 1 s) whose engine writes READY and never answers.
- ``delete DB SESSION [TEXT]``: delete SESSION through a fresh store and print the result; with TEXT,
  create it again holding one user message TEXT.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import sys
import time
from pathlib import Path

from chatflow_agent import Agent, Message, Role, Runner, SQLiteSessionStore
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult


class TaggedEcho(BaseEngine):
    """Answers "U:tag:i" with "A:tag:i" after a few milliseconds; records what it was shown."""

    def __init__(self) -> None:
        self.seen: list[list[str | None]] = []

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        self.seen.append([m.content for m in history])
        await asyncio.sleep(random.uniform(0.002, 0.005))
        last = history[-1].content or ""
        return EngineTurnResult(text="A" + last[1:])


class Hang(BaseEngine):
    def __init__(self, ready: Path) -> None:
        self.ready = ready

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        self.ready.write_text("ready")
        await asyncio.Event().wait()  # forever
        raise AssertionError("unreachable")


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.005)


def turns(db: str, session_id: str, tag: str, n: str, go: str) -> None:
    store = SQLiteSessionStore(db, default_max_turns=1000)
    engine = TaggedEcho()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)

    async def main() -> None:
        for i in range(int(n)):
            await runner.run_async(session_id, f"U:{tag}:{i}")

    wait_for(Path(go))
    asyncio.run(main())
    store.close()
    print(json.dumps(engine.seen))


def claim(db: str, n: str, start: str) -> None:
    store = SQLiteSessionStore(db)
    t0 = float(start)
    results = []
    for i in range(int(n)):
        delay = t0 + i * 0.005 - time.time()
        if delay > 0:
            time.sleep(delay)
        results.append(store.record_processed_message(f"trial-{i}"))
    store.close()
    print(json.dumps(results))


def hold_lock(db: str, seconds: str, ready: str, done: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    Path(ready).write_text("held")
    time.sleep(float(seconds))
    released = time.time()
    conn.execute("COMMIT")
    conn.close()
    Path(done).write_text(repr(released))


def hang(db: str, session_id: str, ready: str) -> None:
    store = SQLiteSessionStore(db)
    store.lease_ttl_seconds = 1.0
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=Hang(Path(ready)))
    asyncio.run(runner.run_async(session_id, "U:killed"))


def delete(db: str, session_id: str, recreate: str = "") -> None:
    store = SQLiteSessionStore(db)
    print(json.dumps(store.delete(session_id)))
    if recreate:
        time.sleep(0.002)  # a new incarnation: another created_at
        session = store.get_or_create(session_id, default_agent=Agent(name="Bot", instructions="x"))
        session.add_message(Message(role=Role.USER, content=recreate))
    store.close()


COMMANDS = {"turns": turns, "claim": claim, "hold-lock": hold_lock, "hang": hang, "delete": delete}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
