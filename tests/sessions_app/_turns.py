"""Child process for the shared-file test: ``python -m tests.sessions_app._turns STORE DB SESSION TAG N GO``.

Writes the file GO + "." + TAG once its store is open.

STORE is ``django`` (DjangoSessionStore; DB is a DATABASE_URL, or a SQLite file path) or ``sqlite``
(chatflow_agent's SQLiteSessionStore on the file DB, as a bot process would run it). Waits for the
file GO, plays N turns "U:TAG:i" → "A:TAG:i" on SESSION and prints, as JSON, what the engine was
shown in each turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path

from chatflow_agent import Agent, Message, Runner
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult


class TaggedEcho(BaseEngine):
    def __init__(self) -> None:
        self.seen: list[list[str | None]] = []

    async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
        self.seen.append([m.content for m in history])
        await asyncio.sleep(random.uniform(0.002, 0.006))
        return EngineTurnResult(text="A" + (history[-1].content or "")[1:])


def make_store(kind: str, db: str):
    if kind == "sqlite":
        from chatflow_agent import SQLiteSessionStore

        return SQLiteSessionStore(db, default_max_turns=1000)
    os.environ["DATABASE_URL"] = db if "://" in db else f"sqlite:///{db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatflow_site.settings")
    import django

    django.setup()
    from sessions_app.store import DjangoSessionStore

    return DjangoSessionStore(default_max_turns=1000)


async def main(kind: str, db: str, session_id: str, tag: str, n: int, go: str) -> None:
    store = make_store(kind, db)
    engine = TaggedEcho()
    runner = Runner(Agent(name="Bot", instructions="x"), session_store=store, engine=engine)
    Path(f"{go}.{tag}").touch()  # noqa: ASYNC240 - before any turn starts
    while not Path(go).exists():  # noqa: ASYNC110, ASYNC240 - another process creates the file
        await asyncio.sleep(0.005)
    for i in range(n):
        await runner.run_async(session_id, f"U:{tag}:{i}")
    store.close()
    print(json.dumps(engine.seen))


if __name__ == "__main__":
    kind, db, session_id, tag, n, go = sys.argv[1:7]
    asyncio.run(main(kind, db, session_id, tag, int(n), go))
